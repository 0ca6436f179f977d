"""The trainer: the run around the step. One model, or a pair co-trained on the same prompt batches, each with its
own learner, optimizer and tokenizer; the step itself (generate, score, theta_old, exchange, update, weight sync) is
graftzoo.training.learning.step, read top to bottom. Here: the run directory (its lock, identity, resume), the models and
learners built, the prompts that fit, the models' threads, evaluation, checkpoints, summaries and the mapping of a
full disk to one error. It never branches on an algorithm's name.

With a backend whose models live apart (``concurrent_models``: Ray, each model in its own worker group) the step's
first and last phases run for the models at once, one driver thread per model (``run_per_model``); the exchange
between them, which needs every model's groups, stays on the trainer's thread. What the models' threads share is
kept in model order, so a seeded run's metrics are those of the sequential step: the engines are seeded in model
order before the threads start, a refill from the prompt sampler waits for the models before it (``InTurn``), the
store is written in model order after the phase, and the driver's global RNGs must not be drawn from by the
threads (checked: ``driver_rng_state``). The in-process backend runs every phase model by model, except that
models sharing a GPU in the resident layout, each generating through a vLLM engine of its own process, collect
at once (``placement.collect_at_once``); their updates stay one at a time.
"""
from __future__ import annotations

import errno
import logging
import queue
import random
import shutil
import threading
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from graftzoo.algos.base import StepContext
from graftzoo.training.learning.ahead import Ahead, overlaps
from graftzoo.training.run.checkpoint import load_checkpoint, one_line, save_checkpoint
from graftzoo.contract.config import LearnerFacts, RunConfig, as_dict, read_yaml, trained_ids, with_values
from graftzoo.contract.errors import ConfigError, NonFiniteError
from graftzoo.contract.layout import CONFIG, holds_run
from graftzoo.training.run.preemption import Interrupted, StopRequest
from graftzoo.training.run.rundir import (LOCK_FILE, STORE, RunDirError, RunDirUsageError, RunLock, check_peer_path,
                                     default_run_name, keep_final_evaluation, move_aside, rerun_plan,
                                     name_note, resume_checkpoint)
from graftzoo.envs.task import Task
from graftzoo.eval.artifacts import make_summary, stored_peers_cost, write_config, write_summary
from graftzoo.eval.evaluate import eval_metrics, evaluate_and_write, evaluate_benchmarks, heldout_request
from graftzoo.eval.compute import ComputeMeter
from graftzoo.training.engines.engine import fitting_prompts
from graftzoo.training.eval_runner import evaluating
from graftzoo.training.planner.build import InProcess, check_models, make_eval_engine, prompt_limits
from graftzoo.training.planner import placement
from graftzoo.peers.sources import make_peer_source
from graftzoo.peers.store import TrajectoryStore
from graftzoo.contract.peer_sources import peer_source_kind, source_label
from graftzoo.contract.registry import get_algo
from graftzoo.training.learning.sampler import PromptSampler
from graftzoo.training.run.tracking import Tracker
from graftzoo.training.learning.step import StepState, train_step


log = logging.getLogger("graftzoo")

DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "not permitted"}


def _disk_error(e: BaseException) -> Optional[str]:
    """Why a write failed when the disk or the directory is the cause (full, quota, read-only, permissions), else
    None. torch.save reports a full disk as a RuntimeError of its stream writer."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            where = f" ({e.filename})" if e.filename else ""
            return DISK_ERRNOS[e.errno] + where
        if isinstance(e, RuntimeError) and "file write failed" in str(e):
            return "a write failed (disk full?)"
        e = e.__cause__ or e.__context__
    return None


def warn_frozen(cfg: RunConfig, model_ids: list) -> None:
    """A trained model whose learning rate is 0 (``optim.lr`` or ``pair.models[i].lr``) never changes: said once."""
    for spec in cfg.pair.models:
        if spec.id in model_ids and float(spec.lr) == 0:
            log.warning("model %r: %s is 0: its weights never change, this run trains nothing for it", spec.id,
                        spec.key_of("lr"))


def summary_peers(peers: list):
    """A model's entry of the summary's ``peers``: None without a peer, the peer's id for one, the list of them for
    a population's several (docs/algorithms.md#populations)."""
    return None if not peers else peers[0] if len(peers) == 1 else list(peers)


def derive_seed(*parts) -> int:
    return random.Random(":".join(str(p) for p in parts)).randrange(2**31)


def run_per_model(tasks: dict) -> dict:
    """model id -> ``tasks[m]()``, each task run in a thread of its own (``graftzoo-<model>``), all at once; the
    results in the order of ``tasks``. The first failure ends the wait and is re-raised as itself (a
    ``WorkerError`` naming the model and the rank, a ``NonFiniteError``, ...). The other threads are daemons: each
    is then blocked in a call to its own model's group at most, which ends when the run closes its backend (the
    groups' actors are killed), and never keeps the process alive."""
    finished: queue.Queue = queue.Queue()

    def body(m: str, fn: Callable):
        try:
            finished.put((m, fn(), None))
        except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread, which raises it
            finished.put((m, None, e))

    for m, fn in tasks.items():
        threading.Thread(target=body, args=(m, fn), name=f"graftzoo-{m}", daemon=True).start()
    results = {}
    for _ in tasks:
        m, value, error = finished.get()
        if error is not None:
            raise error
        results[m] = value
    return {m: results[m] for m in tasks}


def _signalled(phase: Callable, ctx, done: threading.Event):
    """``phase(ctx)``, setting ``done`` when it ends, also by a failure (``InTurn`` waits on it)."""
    try:
        return phase(ctx)
    finally:
        done.set()


class InTurn:
    """The prompt sampler as one model's phase sees it while the models' phases run at once: a refill (``extra``,
    DAPO's dynamic sampling) waits until every model before this one has ended its phase (``earlier``: their
    events), so the refills are drawn in model order and are the sequential step's, whatever the timing."""

    def __init__(self, sampler: PromptSampler, earlier: list):
        self._sampler, self._earlier = sampler, earlier

    def extra(self, step: int, k: int) -> list:
        for done in self._earlier:
            done.wait()
        return self._sampler.extra(step, k)

    def __getattr__(self, name: str):
        return getattr(self._sampler, name)


def driver_rng_state() -> tuple:
    """The trainer process's global RNG states (python, numpy, torch), as a checkpoint saves them."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return random.getstate(), (name, keys.tobytes(), pos, has_gauss, cached), torch.get_rng_state()


def same_rng_state(a: tuple, b: tuple) -> bool:
    return a[:2] == b[:2] and torch.equal(a[2], b[2])


def remove_if_empty(folders) -> None:
    """Remove ``folders`` (a new run directory and the parents made for it, innermost first) when they hold nothing
    but empty folders and the released lock file: a start refused while the models were built leaves no trace."""
    for d in folders:
        if not d.is_dir() or any(f.is_file() and f.name != LOCK_FILE or f.is_symlink() for f in d.rglob("*")):
            return
        shutil.rmtree(d)


class Trainer:
    finished = False  # a rerun that has nothing to do (rundir.rerun_plan): run does nothing, saying why
    finished_reason = ""
    extends = False  # a rerun that continues a finished run (more steps, or the final evaluation it lacks)
    prompts_too_long = 0  # training prompts dropped at start-up for their length (_fitting): rollout/prompts_too_long

    def __init__(self, cfg: RunConfig, run_dir: Optional[str] = None, resume: bool = True, progress=None,
                 overwrite: bool = False, allow_config_change=()):
        """Everything that can be checked without building a model is checked first (ids, the task's datasets,
        that every ``kind: hf`` model can be loaded, a stored peer, then the run directory's lock, identity and
        checkpoint to resume from; nothing is moved aside before the rest is checked), then the models are built.
        ``resume``: continue the run directory's run from its newest intact checkpoint (refused when the config
        changed on a key that changes the trajectory, unless ``allow_config_change`` names it, and when every
        checkpoint failed its check);
        ``resume=False`` in a directory that holds a run is refused unless ``overwrite`` (the old run is moved
        aside)."""
        torch.set_num_threads(cfg.run.threads)
        self.seed = cfg.run.seed
        name = cfg.run.name or default_run_name(cfg)  # tells configurations apart: algo, models, pair, peer, seed
        note = None if cfg.run.name else name_note(name, cfg)
        if note:  # the name's hash: what it stands for, once
            log.info("%s", note)
        # the report's row label; a stored or mixed peer source is a method of its own (not the live run's seed)
        source = source_label(cfg.peer.source)
        self._variant_given = bool(cfg.run.variant)  # else a rerun keeps the run's stored label
        variant = cfg.run.variant or f"{cfg.algo.name} (n={cfg.rollout.n}{source})"
        # the resolved config (what config.yaml holds): the given one with its run name and report label
        self.cfg = cfg = with_values(cfg, {"run.name": name, "run.variant": variant})
        # run.device auto, one vLLM engine per process, run.layout: resolved here, a GPU-sized config refused on CPU
        self.cfg = cfg = placement.resolve(cfg)
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.run.out_dir) / name
        self.resume = resume
        self.progress = progress

        specs = cfg.pair.models  # ids unique and pair.train known: checked by load_config (check_run)
        train_ids = trained_ids(cfg)
        self.model_ids = list(train_ids)
        self.config_changes: dict = {}
        self.task = Task(cfg).check()  # the datasets a run trains, evaluates and selects on: before anything else
        check_models(cfg)  # every kind: hf model resolvable (folder or hub cache), before the run directory exists
        warn_frozen(cfg, self.model_ids)
        self._peer_source(cfg)  # a stored peer is read before the run directory is touched (--overwrite moves it)
        self.resume_from = None
        made = [d for d in (self.run_dir, *self.run_dir.parents) if not d.exists()]  # what this start creates
        self.lock = self._open_run_dir(overwrite, allow_config_change)
        if self.finished:  # nothing to train or evaluate: no model is built, no file rewritten (run says so)
            return
        try:
            self._build(cfg, specs, train_ids)
        except BaseException:
            self.close()
            remove_if_empty(made)  # a refused start leaves nothing behind
            raise

    def _open_run_dir(self, overwrite: bool, allow_config_change) -> RunLock:
        """Lock the run directory; start over (moving an old run aside) or check the resumed run's identity."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock(self.run_dir).acquire()
        try:
            if holds_run(self.run_dir) and (overwrite or not self.resume):
                if not overwrite:
                    raise RunDirUsageError(
                        f"{self.run_dir}: holds a run; --no-resume would mix the new run with it: pass --overwrite "
                        f"to move the old run aside and start over, drop --no-resume to resume it, or choose "
                        f"another run.name (--set run.name=NAME)")
                old = move_aside(self.run_dir)
                log.warning("%s: moved the old run aside to %s", self.run_dir, old)
                self.run_dir.mkdir(parents=True)
                lock.release()
                lock = RunLock(self.run_dir).acquire()
                self.resume = False
            elif self.resume:
                self._keep_stored_label()
                plan = rerun_plan(self.run_dir, self.cfg, self._total_of, allow_config_change)
                self.config_changes, self.extends = plan.changes, plan.extends
                self.finished, self.finished_reason = plan.action == "nothing", plan.reason
                if not self.finished:  # refuses when every checkpoint failed its check
                    self.resume_from = resume_checkpoint(self.run_dir)
        except BaseException:
            lock.release()
            raise
        return lock

    def _keep_stored_label(self) -> None:
        """A rerun that does not name ``run.variant`` keeps the label the run was stored with (the default one it
        would get now may read otherwise, e.g. after ``--allow-config-change rollout.n``)."""
        if self._variant_given or not (self.run_dir / CONFIG).is_file():
            return
        try:
            stored = (read_yaml(self.run_dir / CONFIG).get("run") or {}).get("variant")
        except (ConfigError, AttributeError):
            return  # an unreadable config.yaml is named by rerun_plan's checks
        if stored:
            self.cfg = with_values(self.cfg, {"run.variant": stored})

    def _total_of(self, flat: dict) -> int:
        """The steps a (flattened) config trains: ``run.steps``, or ``run.epochs`` times an epoch's steps."""
        epochs = flat.get("run.epochs")
        return int(epochs) * self.sampler.steps_per_epoch if epochs else int(flat.get("run.steps") or 0)

    def _peer_source(self, cfg: RunConfig):
        """The prompt sampler and the peer source: a stored peer's store is read (and checked) here."""
        self.env = self.task.train_env
        data = self.task.train_dataset
        if data is not None:  # a finite set: only the prompts that fit every trained model
            data = self._fitting(cfg, [p for p in data if p.id not in self.task.reserved_ids])
        self.sampler = PromptSampler(cfg, data, self.task.reserved_ids,
                                     stream=self.task.train_env.generate if self.task.stream else None)
        self.dataset_id = self.task.dataset_id
        self.total_steps = cfg.run.steps
        if cfg.run.epochs:
            self.total_steps = cfg.run.epochs * self.sampler.steps_per_epoch
        planned, plan = None, None
        kind = peer_source_kind(cfg.peer.source)
        if kind is not None and kind.reads_run:  # an earlier run's groups: checked to cover every step of this one
            check_peer_path(self.run_dir, cfg.peer.path)
            planned = {p.id for s in range(min(self.total_steps, 50)) for p in self.sampler.batch(s)[0]}
            plan = ((s, *reversed(self.sampler.batch(s))) for s in range(self.total_steps))  # (step, epoch, prompts)
        self.peers = make_peer_source(cfg, self.model_ids, self.dataset_id, planned, plan)

    def _prompt_limits(self, cfg: RunConfig) -> dict:
        """model id -> (tokenizer, template, prompt budget) of every trained model (``prompt_limits``)."""
        return {s.id: prompt_limits(s, cfg) for s in cfg.pair.models if s.id in self.model_ids}

    def _fitting(self, cfg: RunConfig, prompts: list) -> list:
        """The training prompts whose rendering leaves room for max_new_tokens in every trained model's context and
        is within ``rollout.max_prompt_tokens``; the others are dropped, and said so in one line; none: refused."""
        limits = self._prompt_limits(cfg)
        kept, dropped = fitting_prompts(prompts, limits)
        self.prompts_too_long = len(prompts) - len(kept)
        if len(kept) == len(prompts):
            return kept
        name = cfg.task.dataset or self.task.train_dataset.name
        why = "; ".join(f"model {m!r}: {dropped[m]} over its {b} prompt tokens" for m, (_, _, b) in limits.items()
                        if dropped[m])
        budget = ("the prompt budget is the context window less max_new_tokens, at most "
                  "rollout.max_prompt_tokens")
        if not kept:
            raise ConfigError(f"config key 'task.dataset' ({name!r}): none of its {len(prompts)} training prompts fit "
                              f"({why}; {budget})")
        log.warning("%s: dropped %d of %d training prompts that do not fit (%s; %s)", name,
                    len(prompts) - len(kept), len(prompts), why, budget)
        return kept

    def _build(self, cfg: RunConfig, specs: list, train_ids: list):
        self.backend = make_backend(cfg)
        self.policies, self.engines, self.refs = self.backend.build(cfg, specs, train_ids, self.seed,
                                                                    run_dir=self.run_dir)
        algo_cls = get_algo(cfg.algo.name)
        facts = LearnerFacts.of(cfg)  # the learner's own section was checked once, by load_config
        self.learners = {m: algo_cls(cfg.algo, facts) for m in self.model_ids}
        self.store = TrajectoryStore(self.run_dir / STORE, dataset=self.dataset_id) if cfg.store.enabled else None
        if self.store is not None:
            self.store.remove_partial_writes()  # this process holds the run directory: no other writer is alive
        # the models' phases run at once, in threads of their own, where the backend allows it (``train_step``)
        self.concurrent = bool(getattr(self.backend, "concurrent_models", False)) and len(self.model_ids) > 1
        # phase 1 also at once in this process where the models share a GPU, resident, generating through vLLM
        self.concurrent_collect = self.concurrent or placement.collect_at_once(cfg, self.model_ids)
        # rollout.max_staleness: the next batches collected during the update, in a thread of their own where every
        # engine decodes apart from the training model (graftzoo.training.learning.ahead)
        k = int(cfg.rollout.max_staleness)
        overlap = overlaps(k, cfg.run.layout, all(e.decodes_apart for e in self.engines.values()),
                           any(lr.collect_reads_policy for lr in self.learners.values()))
        self.ahead = Ahead(k, overlap)
        # each model's phases synchronise its own device (a worker group's: its ranks measure, the driver holds CPU)
        self.meter = ComputeMeter(per_thread=self.concurrent_collect or overlap,
                                  devices={m: p.device for m, p in self.policies.items()})
        # run.layout offload: one model's training state on the device at a time (graftzoo.training.planner.placement)
        self.residency = placement.Residency(self.policies, self.meter, cfg.run.layout == "offload")
        self.placement = placement.describe(cfg, self.policies)
        for line in placement.placement_lines(self.placement):
            log.info("%s", line)
        self._heldout_lock = threading.Lock()
        self._heldout: Optional[list] = None  # the fitting held-out prompts, read on first use
        self.tracker: Optional[Tracker] = None
        self.step_slots: dict = {}  # model id -> the last step's slots (own and peer groups after the exchange)

    def close(self):
        """Close the rollout engines and the worker groups, release the run directory (``run`` does it when it
        ends)."""
        backend, self.backend, self.engines = getattr(self, "backend", None), None, {}
        try:
            if backend is not None:
                backend.close()
        finally:
            self._release_lock()

    def _release_lock(self):
        if getattr(self, "lock", None) is not None:
            self.lock.release()
            self.lock = None

    # ------------------------------------------------------------------------------------------
    def context(self, step: int, epoch: int, m: str, mi: int) -> StepContext:
        heldout = self._heldout_prompts if self.cfg.algo.trains_on_heldout() else None
        return StepContext(step=step, epoch=epoch, run=self.learners[m].run, policy=self.policies[m],
                           engine=self.engines[m], env=self.env, sampler=self.sampler, ref_policy=self.refs.get(m),
                           rng=random.Random(derive_seed(self.seed, step, m, "learner")), meter=self.meter,
                           model_index=mi, heldout=heldout)

    def _heldout_prompts(self) -> list:
        """The held-out prompts (a learner that ``trains_on_heldout``) that fit every model's prompt budget, as the
        training prompts (``_fitting``: never cut); read once, also when two models ask at once."""
        with self._heldout_lock:
            if self._heldout is None:
                self._heldout, dropped = fitting_prompts(list(self.task.heldout().prompts),
                                                         self._prompt_limits(self.cfg))
                if any(dropped.values()):
                    log.warning("held-out prompts for test-time training: dropped %s that do not fit the prompt "
                                "budget", ", ".join(f"{n} for model {m!r}" for m, n in dropped.items() if n))
            return list(self._heldout)

    def phase_wall(self, m: str) -> dict:
        phases = self.meter.summary()["models"].get(m, {}).get("phases", {})
        return {k: v["wall_s"] for k, v in phases.items()}

    def step_state(self) -> StepState:
        """What a step reads (graftzoo.training.learning.step.StepState), from this run."""
        return StepState(cfg=self.cfg, model_ids=self.model_ids, policies=self.policies, learners=self.learners,
                         engines=self.engines, sampler=self.sampler, peers=self.peers, task=self.task, ahead=self.ahead,
                         residency=self.residency, context=self.context, collect_each=self.collect_each,
                         each_model=self.each_model, phase_wall=self.phase_wall,
                         prompts_too_long=self.prompts_too_long)

    def train_step(self, step: int) -> dict:
        """One step of every model (graftzoo.training.learning.step); model id -> its metrics (``step_slots``: what each
        trained on)."""
        result = train_step(self.step_state(), step)
        self.step_slots = result.slots
        return result.metrics

    def collect_each(self, ctxs: dict, phase: Callable, seed: bool = True, store: bool = True) -> dict:
        """Phase 1 (``phase(ctx)``, graftzoo.training.learning.step.rollouts) of every model, each model's groups written to
        the store (model order; not with ``store=False``, a collect ahead of its step). Model by model; or, with
        ``concurrent_collect``, the engines seeded in model order here, then every model's phase at once, its
        refills from the sampler in model order (``InTurn``), then the store's writes. ``seed``: the engines are
        seeded for the step first (not for rollouts collected ahead, whose collect seeded them)."""
        if not self.concurrent_collect:
            groups = {}
            for m, ctx in ctxs.items():
                if seed:  # where the engine samples
                    self.engines[m].seed(derive_seed(self.seed, ctx.step, m, "generate"))
                with self.residency.active(m):
                    groups[m] = phase(ctx)
                if store:
                    self._store_write(ctx, groups[m])
            return groups
        for m, ctx in ctxs.items():
            if seed:
                self.engines[m].seed(derive_seed(self.seed, ctx.step, m, "generate"))
        done = {m: threading.Event() for m in ctxs}
        for i, (m, ctx) in enumerate(ctxs.items()):
            ctx.sampler = InTurn(self.sampler, [done[e] for e in list(ctxs)[:i]])
        groups = self.each_model({m: partial(_signalled, phase, ctx, done[m]) for m, ctx in ctxs.items()},
                                 at_once=True)
        for m, ctx in ctxs.items():
            if store:
                self._store_write(ctx, groups[m])
        return groups

    def _store_write(self, ctx: StepContext, groups: list) -> None:
        if self.store is not None:
            self.store.write(ctx.step, ctx.epoch, groups, tokenizer_id=self.policies[ctx.model_id].tokenizer_id)

    def each_model(self, tasks: dict, at_once: Optional[bool] = None) -> dict:
        """model id -> ``tasks[m]()``: model by model, or with ``at_once`` (default ``concurrent``) all at once
        (``run_per_model``), the driver's global RNGs checked untouched by the threads (their draws' order would
        depend on timing)."""
        if not (self.concurrent if at_once is None else at_once):
            return {m: fn() for m, fn in tasks.items()}
        rng = driver_rng_state()
        out = run_per_model(tasks)
        if not same_rng_state(rng, driver_rng_state()):
            raise RuntimeError(f"models {list(tasks)}: a step's phase drew from the trainer process's global random "
                               f"number generators (random, numpy, torch) while the models ran at once: the draws' "
                               f"order depends on timing, so the seeded run would not repeat; draw from the step "
                               f"context's rng (ctx.rng), or set ray.concurrent_models=false")
        return out

    # ------------------------------------------------------------------------------------------
    def evaluate(self, step: int, final: bool = False, when: Optional[str] = None) -> dict:
        """Every trained model on the task's held-out split through ``graftzoo eval``'s path
        (``graftzoo.eval.evaluate``, ``eval.*`` settings); the final evaluation is written to
        ``RUN/eval/<model>.json``. model id -> payload (its ``eval_metrics`` are logged). ``when``: the wait's
        words for it (graftzoo.contract.output; default: after which step)."""
        req = heldout_request(self.cfg)
        kw = dict(task=self.task, step=step, group_by=self.task.group_field)
        res = {}
        when = when or ("after training" if final else f"after step {step + 1}")
        for m in self.model_ids:
            engine = make_eval_engine(self.policies[m], self.cfg, req["top_p"], engine=self.engines[m])
            with self.residency.active(m), self.meter.phase(m, "eval"), \
                    evaluating(f"evaluating {m} on the held-out split {when}", engine, req,
                               len(self.task.heldout().prompts)) as engine:
                if final:
                    res[m], _ = evaluate_and_write(self.policies[m], engine, req, self.run_dir, **kw)
                else:
                    res[m] = evaluate_benchmarks(self.policies[m], engine, req, **kw)
        return res

    # ------------------------------------------------------------------------------------------
    def summary(self, status: str, error: Optional[str] = None) -> dict:
        peers = {m: summary_peers(self.peers.peers_of(m)) if self.peers is not None else None
                 for m in self.model_ids}
        kind = peer_source_kind(self.cfg.peer.source)
        src = None if kind is None else kind.summary_name
        prc = None
        if kind is not None and kind.reads_run and not kind.live:  # the earlier runs' compute, amortized
            try:
                read = self.peers.stored_runs() or [(self.cfg.peer.path, self.peers.peer_of(self.model_ids[0]))]
                prc = stored_peers_cost(read)
            except Exception:  # the original peer run's compute is optional (amortized charge only)
                prc = None
        out = make_summary(as_dict(self.cfg), models=self.model_ids, peers=peers, status=status,
                           compute=self.meter.summary(), peer_source=src, peer_run_compute=prc, error=error,
                           placement=getattr(self, "placement", None))
        out["prompts_too_long"] = self.prompts_too_long  # training prompts dropped for their length, never cut
        return out

    def run(self) -> Path:
        """Train to ``run.steps`` (resuming when asked), evaluate, write the summary; release the run directory.
        A failure that a full disk or a read-only directory causes is re-raised as ``RunDirError`` naming it."""
        try:
            if self.finished:
                log.warning("%s: this run is finished (summary.json says done), nothing to do: %s; raise run.steps "
                            "to continue it, or pass --overwrite to run it again from the start", self.run_dir,
                            self.finished_reason)
                return self.run_dir
            return self._run()
        except (OSError, RuntimeError) as e:
            reason = _disk_error(e)
            if reason is None:
                raise
            raise RunDirError(f"{self.run_dir}: cannot write ({reason}); free space or fix permissions, then rerun "
                              f"the same command to resume from the last checkpoint") from e
        finally:
            self.close()

    def _resume(self) -> tuple:
        """Load the newest intact checkpoint (when resuming); returns the first step to run and that checkpoint."""
        ck = self.resume_from if self.resume else None
        if ck is None:
            return 0, None
        state = load_checkpoint(ck, self.policies, self.learners)
        self.ahead.load_state_dict(state.get("ahead") or {}, self.context)
        start = state["step"] + 1
        missing = [s for s in range(start, min(start + self.ahead.k, self.total_steps)) if s not in self.ahead.ready]
        if missing:  # a checkpoint written before the last step collected past the run's end
            raise RunDirUsageError(
                f"{self.run_dir}: {ck.name} holds no rollouts collected ahead for step {missing[0]} "
                f"(rollout.max_staleness={self.ahead.k}: a run of {self.total_steps} steps decodes them with the policy "
                f"after step {missing[0] - self.ahead.k - 1}), so it cannot continue as a longer run would; pass "
                f"--overwrite to train {self.total_steps} steps from the start, or another run.name")
        self.wandb_id = state.get("wandb_id")
        log.info("%s: resuming from %s (%d of %d steps done)", self.run_dir, ck.name, state["step"] + 1,
                 self.total_steps)
        if self.extends:
            kept = keep_final_evaluation(self.run_dir, start)
            if kept is not None:
                log.info("%s: the final evaluation of its %d steps is kept in %s", self.run_dir, start, kept)
        if self.config_changes:
            log.warning("%s: continuing from %s under a changed config: %s", self.run_dir, ck.name,
                        "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in self.config_changes.items()))
        for m, pol in self.policies.items():
            pol.apply_optim_settings(self.cfg.optim)
            self.engines[m].sync_weights()
        if self.peers is not None:
            self.peers.load_state_dict(state.get("peers", {}))
        for m, phases in state.get("compute", {}).get("models", {}).items():
            for ph, rec in phases.get("phases", {}).items():
                self.meter.add(m, ph, rec["wall_s"], rec["cpu_s"], rec["gpu_h"])
        return state["step"] + 1, ck

    def _run(self) -> Path:
        self.wandb_id = None
        start, resumed_from = self._resume()
        write_config(self.run_dir, as_dict(self.cfg))
        self.tracker = Tracker(self.run_dir, self.cfg, resume_id=self.wandb_id)
        self.tracker.truncate_after(start - 1)
        write_summary(self.run_dir, self.summary("running"))
        ev_every = int(self.cfg.run.eval_every or 0)
        save_every = int(self.cfg.run.save_every or 0)
        with StopRequest() as stop:
            stop.step = start - 1
            stop.last_checkpoint = resumed_from
            try:
                if start == 0 and self.cfg.run.eval_at_start:
                    res = self.evaluate(0, when="before training")
                    for m in self.model_ids:
                        self.tracker.log(-1, m, eval_metrics(res[m]))
                for step in range(start, self.total_steps):
                    try:
                        mets = self.train_step(step)
                    except NonFiniteError as e:
                        self.tracker.log(step, e.model, e.metrics)
                        raise
                    last = step == self.total_steps - 1
                    if ev_every and (step + 1) % ev_every == 0 and not last and stop.signum is None:
                        res = self.evaluate(step)
                        for m in mets:
                            mets[m].update(eval_metrics(res[m]))
                    for m, met in mets.items():
                        self.tracker.log(step, m, met)
                        self.tracker.log_completions(step, m, self.step_slots.get(m, []))
                    if self.progress:
                        self.progress(step, self.total_steps, mets)
                    if (save_every and (step + 1) % save_every == 0) or last or stop.signum is not None:
                        stop.last_checkpoint = self.checkpoint(step)
                    stop.step = step
                    if stop.signum is not None:
                        raise Interrupted(stop.signum, step, stop.last_checkpoint)
                if self.cfg.run.eval_at_end:
                    res = self.evaluate(self.total_steps - 1, final=True)
                    for m in self.model_ids:
                        self.tracker.log(self.total_steps, m, eval_metrics(res[m]))
                if stop.signum is not None:  # arrived during the final evaluation: every step is saved
                    raise Interrupted(stop.signum, self.total_steps - 1, stop.last_checkpoint)
                write_summary(self.run_dir, self.summary("done"))
                self.tracker.log_summary({"status": "done"})
            except Interrupted as e:
                self._final_summary("interrupted", str(e))
                raise
            except BaseException as e:
                self._final_summary("failed", f"{type(e).__name__}: {one_line(e)}")
                raise
            finally:
                self.tracker.finish()
        return self.run_dir

    def _final_summary(self, status: str, error: str):
        """The summary of a run that stops early; a failure to write it (a full disk) must not hide the cause."""
        try:
            write_summary(self.run_dir, self.summary(status, error))
            self.tracker.log_summary({"status": status, "error": error})
        except Exception as e:  # noqa: BLE001 - the original error is what the user must see
            log.warning("%s: could not record status %r: %s", self.run_dir, status, one_line(e))

    def checkpoint(self, step: int) -> Path:
        return save_checkpoint(self.run_dir, step, self.policies, self.learners,
                        {"wandb_id": self.tracker.run_id if self.tracker else None,
                         "peers": self.peers.state_dict() if self.peers is not None else {},
                         "compute": self.meter.summary(), "sampler": {"step": step + 1}},
                        keep=int(self.cfg.run.keep_checkpoints), ahead=self.ahead.state_dict())


# run.backend -> a factory of the object that builds and holds the models (``build``, ``close``): the in-process one
# here; the layers above add theirs (graftzoo.api registers graftzoo.distributed's Ray backend)
BACKENDS: dict = {"inprocess": InProcess}


def register_backend(name: str, factory) -> None:
    """Make ``run.backend=name`` build its models with ``factory()``."""
    BACKENDS[name] = factory


def make_backend(cfg: RunConfig):
    """The backend ``run.backend`` names (``BACKENDS``)."""
    name = cfg.run.backend
    if name not in BACKENDS:
        raise RunDirUsageError(f"run.backend={name!r} has no registered backend (known: {sorted(BACKENDS)}); "
                               f"graftzoo.api registers 'ray': train through graftzoo.api or the CLI")
    return BACKENDS[name]()


def train(cfg: RunConfig, run_dir: Optional[str] = None, resume: bool = True, progress=None, overwrite: bool = False,
          allow_config_change=()) -> Path:
    """Train a checked run config (``load_config``); returns the run directory (see ``Trainer``)."""
    return Trainer(cfg, run_dir=run_dir, resume=resume, progress=progress, overwrite=overwrite,
                   allow_config_change=allow_config_change).run()
