"""``run.backend: ray`` — each model in its own group of Ray workers (graftzoo.distributed.worker), placed by a placement
group with its own devices; the driver (the trainer's process) runs the same step as in-process, through the same
Learner hooks, on plain data.

On the driver a model is a ``RemotePolicy`` (its tokenizer and template, for the learner's text work; its forward
passes — scoring, hidden states, the update — run in the group) and a ``RemoteEngine`` (generate runs in the group).
No algorithm code knows about Ray: the learners get these in place of a ``Policy`` and an ``Engine``.

A group of ``pair.models[i].num_workers`` ranks trains with FSDP2 (graftzoo.training.models.fsdp): each rank gets its share of
every minibatch's micro-batches (round-robin; a stand-in of scale 0 where it holds fewer), and the ranks' gradients
are summed, so the update is the one-process update. A rank that dies or fails ends the run with an error naming the
model and the rank (``WorkerError``); the rest of its group is killed, nothing hangs.
"""
from __future__ import annotations

import copy
import itertools
import logging
import os
import time
from pathlib import Path
from typing import Optional

import torch

from graftzoo.contract import metrics as M
from graftzoo.contract.config import ModelSpec, RunConfig
from graftzoo.training.engines.engine import Engine
from graftzoo.training.planner.build import check_context, load_tokenizer_of, model_stop, model_template, resolve_device
from graftzoo.training.models.policy import Policy
from graftzoo.distributed.errors import WorkerDied, WorkerError
from graftzoo.distributed.cluster import alive_nodes, check_shared_dir, connect, disconnect, node_names
from graftzoo.distributed.worker import PolicyWorker, RolloutWorker

log = logging.getLogger("graftzoo")
_PG_SERIAL = itertools.count()  # placement group names stay unique when one process builds several runs


class WorkerGroup:
    """The Ray actors of one model: its training ranks and, with ``ray.rollout_workers``, its rollout workers, in a
    placement group of their own (``ray.model_placement`` any) or in their bundle of the run's (pack, spread)."""

    def __init__(self, model_id: str, spec: ModelSpec, cfg: RunConfig, seed: int, shared=None):
        from ray.util.placement_group import placement_group

        self.model_id, self.actors, self.rollouts, self.pg, self.shared = model_id, [], [], None, shared
        self.pids, self.nodes, self.rollout_pids, self.rollout_nodes = [], [], [], []
        self.broken = False  # a call failed: the others may wait in a collective, so close() ends them at once
        self.world = int(spec.num_workers)  # its own num_workers, else ray.num_workers
        self.apart = int(cfg.ray.rollout_workers)  # rollout workers apart from the training ranks
        self.split_hf = self.world > 1 and bool(cfg.ray.hf_split_generate)  # HF ranks decode their own shares
        self.bundle, gpus = worker_bundle(spec, cfg)
        self.gpus = gpus * (self.world + self.apart)  # GPUs the group holds, for the compute accounting
        if shared is None:
            self.pg = placement_group([dict(self.bundle) for _ in range(self.world + self.apart)],
                                      strategy=cfg.ray.placement,
                                      name=f"graftzoo-{model_id}-{os.getpid()}-{next(_PG_SERIAL)}")
        try:
            self._start(spec, cfg, seed, gpus)
        except BaseException:  # a group that cannot start leaves no actor or reservation behind
            self.broken = True
            self.close()
            raise

    def _where(self, i: int):
        """The placement group and bundle of the group's i-th actor (training ranks first, then rollout workers)."""
        if self.shared is not None:
            return self.shared
        return self.pg, i

    def _start(self, spec: ModelSpec, cfg: RunConfig, seed: int, gpus: float) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        model_id, r, bundle = self.model_id, cfg.ray, self.bundle
        pg = self._where(0)[0]
        ready, _ = ray.wait([pg.ready()], timeout=float(r.ready_timeout_s))
        if not ready:
            where = (f"{self.world + self.apart} x {bundle}, {r.placement}" if self.shared is None else
                     f"one node per model, ray.model_placement={r.model_placement}")
            raise WorkerError(f"model {model_id!r}: its placement group ({where}) was not ready after "
                              f"{r.ready_timeout_s} s; the cluster has {ray.cluster_resources()} over "
                              f"{len(alive_nodes())} node(s) (STRICT_SPREAD and ray.model_placement=spread need a "
                              f"node per worker or per model)")
        env = {"OMP_NUM_THREADS": str(cfg.run.threads), "TOKENIZERS_PARALLELISM": "false"}

        def options(i: int):
            pg_i, idx = self._where(i)
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg_i, placement_group_bundle_index=idx)
            return dict(num_cpus=bundle["CPU"], num_gpus=gpus, scheduling_strategy=strategy,
                        runtime_env={"env_vars": env}, name=None, max_restarts=0)

        cls, decoders = ray.remote(PolicyWorker), ray.remote(RolloutWorker)
        for rank in range(self.world):
            self.actors.append(cls.options(**options(rank)).remote(spec, cfg, rank, self.world, os.getcwd(),
                                                                    decodes=not self.apart))
        for i in range(self.apart):
            self.rollouts.append(decoders.options(**options(self.world + i)).remote(spec, cfg, i, os.getcwd()))
        addr, port = self.call("address", ranks=[0])[0] if self.world > 1 else ("127.0.0.1", 0)
        wait = float(r.ready_timeout_s) + 600.0
        self.infos, outs = self.call_both(("setup", (addr, port, seed)), ("setup", (seed,)), timeout=wait)
        self.pids, self.nodes = [i["pid"] for i in self.infos], [i["node_id"] for i in self.infos]
        self.rollout_pids, self.rollout_nodes = [o["pid"] for o in outs], [o["node_id"] for o in outs]
        self.info = dict(self.infos[0])
        if self.apart:
            if {o["signature"] for o in outs} != {self.info["signature"]}:
                raise WorkerError(f"model {model_id!r}: its rollout workers built weights of another layout than its "
                                  f"training ranks (names, shapes, dtypes), so the weights cannot be sent to them")
            self.info["engine"] = outs[0]["engine"]
            host, tport = self.call("address", ranks=[0])[0]
            world, timeout = 1 + self.apart, float(r.collective_timeout_s)
            self.call_both(("open_transfer", (host, tport, world, timeout)),
                           ("open_transfer", (host, tport, world, timeout)), timeout=wait)

    def placement_lines(self) -> list:
        """Where the group's actors run: one line per kind, naming each node by its address."""
        names = node_names()
        ranks = ", ".join(f"{i}: {names.get(n, n[:12])}" for i, n in enumerate(self.nodes))
        lines = [f"model {self.model_id}: training ranks on nodes ({ranks})"]
        if self.rollouts:
            where = ", ".join(f"{i}: {names.get(n, n[:12])}" for i, n in enumerate(self.rollout_nodes))
            lines.append(f"model {self.model_id}: rollout workers on nodes ({where})")
        return lines

    # ---- calls -------------------------------------------------------------------------------
    def call(self, method: str, *args, ranks=None, per_rank=None, timeout: Optional[float] = None,
             rollout: bool = False, **kwargs) -> list:
        """Call ``method`` on the training ranks (all by default; ``rollout``: on the rollout workers) at once and
        wait for all of them; ``per_rank[i]``: keyword arguments of the i-th call only. The first failure ends the
        wait: a dead actor raises ``WorkerDied`` naming it (model, rank, pid, node); an error raised in an actor is
        re-raised as itself (its message gains the model and rank)."""
        refs, where = self._issue(method, args, kwargs, ranks, per_rank, rollout)
        self._wait(refs, where, method, timeout)
        import ray
        return ray.get(refs)

    def call_both(self, train: tuple, rollout: tuple, timeout: Optional[float] = None) -> tuple[list, list]:
        """``(method, args)`` on every training rank and ``(method, args)`` on every rollout worker, all at once (a
        collective between them), waited for together; returns both lists of answers."""
        a, wa = self._issue(train[0], train[1], {}, None, None, False)
        b, wb = self._issue(rollout[0], rollout[1], {}, None, None, True)
        self._wait(a + b, {**wa, **wb}, f"{train[0]}", timeout)
        import ray
        return ray.get(a), ray.get(b)

    def _issue(self, method, args, kwargs, ranks, per_rank, rollout) -> tuple[list, dict]:
        import ray
        actors = self.rollouts if rollout else self.actors
        ranks = list(range(len(actors))) if ranks is None else list(ranks)
        shared = [ray.put(a) if _large(a) else a for a in args]
        refs = []
        for i, rank in enumerate(ranks):
            own = per_rank[i] if per_rank is not None else {}
            refs.append(getattr(actors[rank], method).remote(*shared, **kwargs, **own))
        return refs, {ref: (rollout, rank) for ref, rank in zip(refs, ranks)}

    def _wait(self, refs: list, where: dict, method: str, timeout: Optional[float]) -> None:
        import ray
        pending, t0 = list(refs), time.monotonic()
        while pending:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - t0))
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                self.broken = True
                late = ", ".join(self._who(*where[p]) for p in pending)
                raise WorkerError(f"model {self.model_id!r}: {late} did not answer {method} within {timeout:.0f} s")
            try:
                self._check(done[0], where[done[0]], method)
            except BaseException as e:
                self.broken = True
                if isinstance(e, Exception) and not isinstance(e, WorkerDied):
                    self._name_a_dead_rank(pending, where, method)
                raise

    def _who(self, rollout: bool, rank: int, node: bool = False) -> str:
        """An actor of the group in words: ``worker rank 1`` / ``rollout worker 0``, with its pid and node."""
        kind, pids, nodes = ("rollout worker", self.rollout_pids, self.rollout_nodes) if rollout else \
            ("worker rank", self.pids, self.nodes)
        if not node:
            return f"{kind} {rank}"
        pid = pids[rank] if rank < len(pids) else "?"
        at = node_names().get(nodes[rank], nodes[rank][:12]) if rank < len(nodes) else "?"
        return f"{kind} {rank} (pid {pid}, node {at})"

    def _name_a_dead_rank(self, pending: list, where: dict, method: str, grace: float = 5.0) -> None:
        """A rank's error in a collective is often the echo of another rank's death (gloo: "connection reset by
        peer"). Before that error is reported, the other ranks get ``grace`` seconds to show whether one of them
        died; a dead rank is the cause, so it is the one named (``WorkerDied``)."""
        import ray
        from ray.exceptions import RayActorError
        deadline = time.monotonic() + grace
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                return
            try:
                ray.get(done[0])
            except RayActorError:
                self._check(done[0], where[done[0]], method)  # raises WorkerDied naming the dead rank
            except Exception:  # noqa: BLE001 - another rank's own error: the first one is reported
                pass

    def _check(self, ref, who: tuple, method: str) -> None:
        import ray
        from ray.exceptions import RayActorError, RayTaskError
        try:
            ray.get(ref)
        except RayActorError as e:
            rollout, rank = who
            nodes = self.rollout_nodes if rollout else self.nodes
            gone = rank < len(nodes) and nodes[rank] not in {n["NodeID"] for n in alive_nodes()}
            why = "its node is gone from the cluster" if gone else _first_line(e)
            raise WorkerDied(f"model {self.model_id!r}: {self._who(rollout, rank, node=True)} died during {method}: "
                              f"{why}; rerun the command to resume from the last checkpoint") from None
        except RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, BaseException) and not isinstance(cause, RayTaskError):
                if cause.args and isinstance(cause.args[0], str):
                    cause.args = (f"{cause.args[0]} [model {self.model_id!r}, {self._who(*who)}]", *cause.args[1:])
                raise cause from None
            raise WorkerError(f"model {self.model_id!r}: {self._who(*who, node=True)} failed in {method}: "
                              f"{_first_line(e)}") from None

    def close(self, timeout: float = 30.0) -> None:
        """Close the engines and leave the process group (bounded wait; skipped after a failed call, when a rank may
        be waiting in a collective), then end the actors and free the placement group (its own only)."""
        import ray
        from ray.util.placement_group import remove_placement_group
        try:
            if (self.actors or self.rollouts) and self.pids and not self.broken:
                refs = [a.close.remote() for a in self.actors + self.rollouts]
                ray.wait(refs, num_returns=len(refs), timeout=timeout)
        except Exception as e:  # noqa: BLE001 - a dead group is ended below all the same
            log.debug("closing model %s's workers: %s", self.model_id, e)
        finally:
            for a in self.actors + self.rollouts:
                ray.kill(a, no_restart=True)
            self.actors, self.rollouts = [], []
            if self.pg is not None:
                remove_placement_group(self.pg)
                self.pg = None


def worker_bundle(spec: ModelSpec, cfg: RunConfig) -> tuple[dict, float]:
    """What each worker of a model reserves (``ray.cpus_per_worker``; ``ray.gpus_per_worker`` on a cuda device) and
    its GPUs."""
    r = cfg.ray
    gpus = float(r.gpus_per_worker) if resolve_device(spec.device).startswith("cuda") else 0
    return {"CPU": float(r.cpus_per_worker), **({"GPU": gpus} if gpus else {})}, gpus


def _large(x) -> bool:
    """Arguments sent to several ranks are put in Ray's object store once."""
    return isinstance(x, (list, dict, tuple)) and len(x) > 8


def _first_line(e) -> str:
    return " ".join(str(e).split())[:400]


# ----------------------------------------------------------------------------------------------
# the driver's view of a model: a Policy whose forward passes run in its group, an Engine that generates there
# ----------------------------------------------------------------------------------------------

class RemotePolicy(Policy):
    """A model living in a worker group, as the learner sees it: tokenizer, template and limits here; scoring,
    hidden states, the update and the state in the group."""

    def __init__(self, group: WorkerGroup, spec: ModelSpec, cfg: RunConfig, tokenizer, tokenizer_id: str):
        template = model_template(spec, tokenizer)  # as the workers' build_policy resolves it
        super().__init__(spec.id, None, tokenizer, template=template, temperature=cfg.rollout.temperature,
                         max_prompt_tokens=cfg.rollout.max_prompt_tokens, tokenizer_id=tokenizer_id)
        self.stop_strings = model_stop(spec, template)
        self.group, info = group, group.info
        self.max_response_tokens = int(info["max_response_tokens"])
        self.max_tokens_per_micro = info["max_tokens_per_micro"]
        self.autocast_dtype = getattr(torch, info["autocast_dtype"].replace("torch.", "")) \
            if info["autocast_dtype"] else None
        self._param_dtype = getattr(torch, info["param_dtype"].replace("torch.", ""))
        self._lr, self.version = float(info["lr"]), int(info["version"])

    # what runs here
    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # minibatches are built here and sent to the group

    @property
    def param_dtype(self) -> torch.dtype:
        return self._param_dtype

    @property
    def context_window(self) -> int:
        return int(self.group.info["context_window"])

    @property
    def lr(self) -> float:
        return self._lr

    # what runs in the group
    def score_sequences(self, prompts: list, responses: list, *, with_entropy: bool = False, chunk: int = 256):
        return self.group.call("score_sequences", prompts, responses, with_entropy)[0]

    def mean_hidden(self, texts, batch: int = 64) -> torch.Tensor:
        return self.group.call("mean_hidden", list(texts), batch)[0]

    def update(self, ctx, learner, mbs: list, base_from_forward: bool, where: str) -> list:
        """Each rank gets its share of every minibatch's micro-batches and runs the optimizer loop on it
        (``graftzoo.training.models.loss.optimize``, as ``Policy.update`` does in one process); returns per minibatch the
        ranks' parts (the step merges them as one process computes its metrics: loss the sum, the others means
        weighted by rows, the group's grad norm)."""
        W = self.group.world
        shares = [[_share(micros, r, W) for micros in mbs] for r in range(W)]
        res = self.group.call("update", ctx.step, ctx.epoch, ctx.model_index, learner.state_dict(),
                              base_from_forward=base_from_forward, where=where,
                              per_rank=[{"mbs": s} for s in shares])
        for k, (wall, cpu) in res[0]["phases"].items():
            if ctx.meter is not None:
                ctx.meter.add(self.model_id, k, wall, cpu, self.group.gpus * wall / 3600.0)
        for k, v in res[0]["metrics"].items():
            ctx.log(k, v)
        ctx.log(M.PERF_PEAK_MEM_GB, max(r["peak_mem_gb"] for r in res))  # the group's largest rank
        self._lr = float(res[0]["lr"])
        return [[r["minibatches"][u] for r in res] for u in range(len(mbs))]

    def apply_optim_settings(self, optim: dict):
        self.group.call("apply_optim_settings", optim)

    def state_dict(self) -> dict:
        if self.group.world > 1:
            raise NotImplementedError(f"model {self.model_id!r} is sharded over {self.group.world} workers: "
                                      f"use checkpoint_state (sharded) or full_state_dict")
        return self.group.call("state_dict")[0]

    def full_state_dict(self) -> dict:
        return self.group.call("full_state_dict")[0]

    def checkpoint_state(self, folder, stem: str) -> tuple[dict, list]:
        if self.group.world == 1:
            return self.state_dict(), []
        return self.group.call("checkpoint_state", str(Path(folder).resolve()), stem)[0]

    def load_state_dict(self, state: dict, folder=None):
        where = None if folder is None else str(Path(folder).resolve())
        got = self.group.call("load_state_dict", state, where)[0]
        self.version, self._lr = int(got["version"]), float(got["lr"])

    # a forward pass or optimizer call here is a mistake: say where the model is
    def _elsewhere(self, *_, **__):
        raise WorkerError(f"model {self.model_id!r} lives in a Ray worker group (run.backend=ray): its forward "
                          f"passes and optimizer run there (score_sequences, mean_hidden, update)")

    logprobs = step = zero_grad = accumulate = apply_gradients = configure_optimizer = _elsewhere


def dp_shares(n: list, world: int) -> list:
    """Each rank's contiguous ``(start, end)`` span of a request's prompts (``n``: samples per prompt) for
    data-parallel generation: whole groups, cut where the running count of samples crosses each rank's equal
    share, so every rank decodes about as many sequences; a rank may get none."""
    total, spans, start, acc = sum(n), [], 0, 0
    for r in range(world):
        target, end = total * (r + 1) / world, start
        while end < len(n) and (r == world - 1 or acc + n[end] / 2 <= target):
            acc += n[end]
            end += 1
        spans.append((start, end))
        start = end
    return spans


def _share(micros: list, rank: int, world: int) -> list:
    """Rank ``rank``'s micro-batches of a minibatch (round-robin), without their Rollouts; a rank left with fewer
    than the others gets a stand-in of scale 0 for each missing pass (the group's collectives need them)."""
    mine = [mb.tensors_only() for mb in micros[rank::world]]
    passes = -(-len(micros) // world)
    while len(mine) < passes:
        mine.append(micros[0].tensors_only(scale=0.0))
    return mine


class RemoteEngine(Engine):
    """The rollout engine of a worker group: a vLLM engine on every rank, each decoding its share of the request
    (data-parallel: ``dp_shares``), the groups returned in the request's order. Each prompt's seed is drawn here,
    from the generator the trainer seeds per step and model, so a seeded request gives the same rollouts on any
    number of ranks. The HF engine decodes with the sharded training model: every rank runs the whole request in
    lockstep (the in-process run's rollouts), or its own share with ``ray.hf_split_generate`` (each rank seeded
    apart, every rank running as many forward passes as the busiest).

    With rollout workers apart (``ray.rollout_workers``) the requests go to them instead (each decoding its share,
    seeded per prompt by a vLLM engine, the whole request by one HF engine's worker), and a weight sync sends the
    updated weights from the training ranks to them over their collective (graftzoo.distributed.transfer): the
    engine decodes apart from the update, so rollouts ahead overlap it (``decodes_apart``)."""

    def __init__(self, group: WorkerGroup, policy: RemotePolicy):
        info = group.info["engine"]
        self.group, self.policy = group, policy
        self.apart = bool(group.rollouts)
        self.decodes_apart = self.apart
        # a rollout worker's HF engine decodes with its own copy of the weights, not the training model
        self.uses_training_model = info["uses_training_model"] and not self.apart
        self.temperature, self.top_p, self.top_k = info["temperature"], info["top_p"], info["top_k"]
        self.max_new_tokens, self.min_new_tokens = info["max_new_tokens"], info["min_new_tokens"]
        self.sampling: dict = {}
        self.seeds = torch.Generator().manual_seed(0)  # each prompt's seed (vLLM); the trainer reseeds it per step
        self.lockstep = self.uses_training_model and not group.split_hf  # HF: every rank decodes the whole request

    def generate(self, prompts, n, prefixes=None, greedy=False, temperature=None, max_new_tokens=None) -> list:
        prompts = list(prompts)
        W = len(self.group.rollouts) if self.apart else self.group.world
        n = [int(n)] * len(prompts) if isinstance(n, int) else [int(k) for k in n]
        shared = (greedy, temperature, max_new_tokens, self.policy.max_prompt_tokens, self.sampling)
        if self.lockstep:  # rank 0's answer
            return self.group.call("generate", *shared, prompts=prompts, n=n, prefixes=prefixes)[0]
        hf = self.group.info["engine"]["uses_training_model"]  # an HF engine seeds its worker, not each prompt
        seeds = None if hf else torch.randint(0, 2**63 - 1, (len(prompts),), generator=self.seeds).tolist()
        spans = dp_shares(n, W)
        per_rank = [{"prompts": prompts[a:b], "n": n[a:b], "prefixes": None if prefixes is None else prefixes[a:b],
                     "prompt_seeds": None if seeds is None else seeds[a:b]} for a, b in spans]
        parts = self.group.call("generate", *shared, per_rank=per_rank, rollout=self.apart)
        return [g for part in parts for g in part]

    def seed(self, seed: int) -> None:
        """Seed the group's sampling, and this model's own generator of prompt seeds (drawn from apart from the
        driver's global generators, which the two models' steps would share when they run at once). Rollout workers
        apart are seeded alone: the driver's global generator is left as it is, since their seeding may run while
        another model's phase runs (rollouts ahead)."""
        if not self.apart:
            torch.manual_seed(seed)
        self.seeds = torch.Generator().manual_seed(int(seed))
        self.group.call("seed", seed, rollout=self.apart)

    def release_memory(self) -> None:
        """Rollout workers apart keep their engines awake: they hold memory and devices of their own."""
        if not self.apart:
            self.group.call("release_memory")

    def sync_weights(self) -> float:
        """The updated weights into the engines: each rank's engine takes them in memory, or the training ranks send
        them to the rollout workers apart over their collective; seconds taken."""
        if not self.apart:
            return float(self.group.call("sync_weights")[0])
        t = time.perf_counter()
        self.group.call_both(("send_weights", ()), ("receive_weights", (int(self.policy.version),)))
        return time.perf_counter() - t

    def with_sampling(self, **settings) -> "RemoteEngine":
        view = copy.copy(self)
        view.sampling = {**self.sampling, **settings}
        for k, v in settings.items():
            setattr(view, k, v)
        return view

    def close(self) -> None:
        """The group closes its engines (``RayBackend.close``)."""


class RayBackend:
    """Builds each trained model's worker group on Ray (a private local cluster unless ``ray.address``).

    ``concurrent_models``: the models share nothing between their groups, so the trainer may run their phases at
    once, one driver thread per model (``ray.concurrent_models``, on by default). A thread whose group fails raises
    as the sequential step does; a group still busy when the run ends is closed like the others (its workers are
    killed after ``WorkerGroup.close``'s bounded wait), which ends its thread's call.

    On a cluster of several nodes the run directory must be one every node reads and writes (a shared file system):
    it is checked before any group starts (``check_shared_dir``). ``ray.model_placement`` pack or spread puts every
    model in one placement group, a bundle per model (STRICT_PACK: one node; STRICT_SPREAD: a node each)."""

    concurrent_models = True

    def __init__(self):
        self.groups: dict = {}
        self.started = False
        self.pg = None  # the run's placement group (ray.model_placement pack or spread)

    def build(self, cfg: RunConfig, specs: list, train_ids: list, seed: int,
              run_dir: Optional[Path] = None) -> tuple[dict, dict, dict]:
        self.concurrent_models = bool(cfg.ray.concurrent_models)
        specs = [s for s in specs if s.id in train_ids]
        toks = {s.id: load_tokenizer_of(s) for s in specs}  # a tiny model is warmed up here, once
        workers = sum(s.num_workers + cfg.ray.rollout_workers for s in specs)
        self.started = connect(cfg.ray, workers)
        if run_dir is not None:
            check_shared_dir(Path(run_dir))
        shared = self._models_pg(cfg, specs)
        policies, engines = {}, {}
        for i, s in enumerate(specs):  # one at a time: close() ends the groups built when a later one fails
            self.groups[s.id] = group = WorkerGroup(s.id, s, cfg, seed, shared=None if shared is None else
                                                    (shared, i))
            for line in group.placement_lines():
                log.info("%s", line)
            tok, tok_id = toks[s.id]
            policies[s.id] = pol = RemotePolicy(group, s, cfg, tok, tok_id)
            engines[s.id] = RemoteEngine(group, pol)
            if group.rollouts:  # the rollout workers decode with the training ranks' very weights from the start
                engines[s.id].sync_weights()
        check_context(cfg, policies)
        return policies, engines, {}  # a KL reference lives in its model's group

    def _models_pg(self, cfg: RunConfig, specs: list):
        """The run's placement group for ``ray.model_placement`` pack or spread: a bundle per model holding all its
        workers (None for ``any``)."""
        if cfg.ray.model_placement == "any":
            return None
        from ray.util.placement_group import placement_group
        bundles = []
        for s in specs:
            one, _ = worker_bundle(s, cfg)
            count = s.num_workers + cfg.ray.rollout_workers
            bundles.append({k: v * count for k, v in one.items()})
        strategy = {"pack": "STRICT_PACK", "spread": "STRICT_SPREAD"}[cfg.ray.model_placement]
        self.pg = placement_group(bundles, strategy=strategy,
                                  name=f"graftzoo-models-{os.getpid()}-{next(_PG_SERIAL)}")
        return self.pg

    def close(self) -> None:
        groups, self.groups = self.groups, {}
        try:
            for g in groups.values():
                g.close()
            if self.pg is not None:
                from ray.util.placement_group import remove_placement_group
                remove_placement_group(self.pg)
        finally:
            self.pg = None
            disconnect(self.started)
            self.started = False
