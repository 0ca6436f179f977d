"""Checkpoint evaluation (what ``graftzoo eval`` runs): evaluate a checkpoint (or a run's selected checkpoint) on math benchmarks.

Targets (``graftzoo.training.eval_checkpoints``): a run directory's checkpoint ``RUN/checkpoints/step_N``,
or a run directory, which means the checkpoint that the run's selection rule picks
(``eval.select``: ``last`` or ``val_avg``, ``graftzoo.training.selection``; the validation set is the
run's task's, ``graftzoo.envs.task``).

Benchmarks: ``all`` (math500, aime24, aime25, amc23, minerva_math), any name or file path that
``graftzoo.envs.load_dataset`` accepts, or ``heldout``: the run's own held-out split (the one the
trainer evaluates on: ``Task.heldout``).

Protocol (``graftzoo.eval.protocol``): ``seeds`` evaluation runs of k samples per problem, every
sample under its own seed; avg@k with sd and a 95% t-interval over the runs (over the k sample
seeds when there is one run), unbiased pass@k; optionally a greedy pass. The policy is rebuilt
from the run's ``config.yaml`` (``graftzoo.training.planner.build.build_policy`` with the pair's model spec) and
the checkpoint's weights, and evaluated by ``graftzoo.eval.evaluate`` (the trainer's own
evaluation goes through it too). Results are written in the ``graftzoo.eval.artifacts`` eval
format, one file per model, by default in a folder of their own that names what was evaluated,
``RUN/eval/cli/step_N-<benchmarks>-k<k>[-s<seeds>][-limit<N>]/<model>.json`` (``cli_eval_folder``; N is
the step of the checkpoint evaluated), for a run directory and for an explicit checkpoint alike.
``graftzoo eval`` never writes the trainer's final evaluation ``RUN/eval/<model>.json`` (what the
report reads): ``--out`` naming ``RUN/eval`` is refused.

Checkpoints are read safely (``graftzoo.training.run.checkpoint.load_weights``: ``torch.load(weights_only=True)``
after checking the manifest's size and sha256 of the model file): an explicitly given checkpoint that
fails is an error naming the file; for a run directory, selection skips failing checkpoints with a
warning (``graftzoo.training.selection``).
"""
from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path
from typing import Callable, Optional, Sequence

from graftzoo.training.run.checkpoint import checkpoint_step, load_weights
from graftzoo.contract.config import with_values
from graftzoo.contract.output import wait
from graftzoo.contract.errors import ConfigError, did_you_mean
from graftzoo.envs.datasets import BENCHMARKS, bundled_names
from graftzoo.envs.task import HELDOUT, LOAD_ERRORS, Task
from graftzoo.eval.artifacts import EVAL_DIR
from graftzoo.training.eval_checkpoints import build_policies, load_run_config, resolve_target, trained_specs
from graftzoo.eval.evaluate import check_writable, eval_request, evaluate_and_write
from graftzoo.training.engines.engine import fitting_prompts
from graftzoo.training.planner.build import make_eval_engine, prompt_limits
from graftzoo.training.selection import select_checkpoints


CLI_EVAL_DIR = "cli"   # RUN/eval/cli/<what was evaluated>/<model>.json: graftzoo eval's files
OUT_HINT = "write them to another folder with --out DIR (graftzoo.evaluate: out=DIR)"


def cli_eval_folder(run_dir, step: int, req: dict) -> Path:
    """The folder of ``graftzoo eval``'s files for the checkpoint of ``step`` under ``req`` (``eval_request``):
    ``RUN/eval/cli/step_N-<benchmarks>-k<k>[-s<seeds>][-limit<N>]``; benchmark names (or file stems) joined by
    "+", a long list shortened to its first name and a hash of all."""
    names = [re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(b)).stem if "/" in str(b) else str(b))
             for b in req["benchmarks"]]
    bench = "+".join(names)
    if len(bench) > 48:
        bench = f"{names[0][:24]}+{len(names) - 1}more-" + hashlib.sha256(
            "\n".join(map(str, req["benchmarks"])).encode()).hexdigest()[:8]
    name = f"step_{int(step)}-{bench}-k{int(req['k'])}"
    if int(req["seeds"]) != 1:
        name += f"-s{int(req['seeds'])}"
    if req.get("limit") is not None:
        name += f"-limit{int(req['limit'])}"
    return Path(run_dir) / EVAL_DIR / CLI_EVAL_DIR / name


def check_benchmarks(task: Task, names: Sequence[str], limit: Optional[int] = None) -> int:
    """Load each benchmark of an evaluation once, so that an unknown name, a missing file or a broken row is one
    ``ConfigError`` line naming it (with the closest known names) before any model is built; returns their prompts
    in all."""
    prompts = 0
    for name in names:
        try:
            prompts += len(task.benchmark(name, limit).prompts)
        except LOAD_ERRORS as e:
            text = " ".join(str(e).split()) or type(e).__name__
            known = [HELDOUT, "all", *BENCHMARKS, *bundled_names()]
            hint = did_you_mean(name, dict.fromkeys(known)) if name not in known and not Path(name).exists() else ""
            raise ConfigError(f"--benchmarks {name!r}{hint}: {text}") from None
    return prompts


def check_prompts_fit(cfg, task: Task, request: dict, models: Optional[Sequence[str]] = None) -> None:
    """Every model evaluated has, in every benchmark of ``request``, a prompt within its prompt budget (its context
    window less the response limit, at most ``rollout.max_prompt_tokens``: what ``evaluate_benchmarks`` keeps of a
    benchmark, ``graftzoo.training.planner.build.prompt_limits``); otherwise the whole request is refused before any model
    is built, in one ``ConfigError`` line naming each benchmark with no such prompt (in ``score_benchmark``'s words)
    and the benchmarks that can be evaluated (the evaluation would stop at the first such benchmark, after scoring
    the ones before it)."""
    max_new = request.get("max_new_tokens")
    limits = {}
    for spec in trained_specs(cfg, models):
        try:
            limits[spec.id] = prompt_limits(spec.replace(max_new_tokens=int(max_new)) if max_new else spec, cfg)
        except ConfigError as e:
            if not max_new:
                raise
            why = str(e).partition(" must be ")[2] or str(e)  # the run's key named there is not what was asked
            raise ConfigError(f"max_new_tokens={max_new} must be {why}") from None
    empty: dict = {}  # benchmark -> (its prompts, [(model, its prompt budget)] of the models none of them fits)
    for name in request["benchmarks"]:
        prompts = task.benchmark(name, request.get("limit")).prompts
        for m, limit in limits.items():
            if prompts and not fitting_prompts(prompts, {m: limit})[0]:
                empty.setdefault(name, (len(prompts), []))[1].append((m, limit[2]))
    if not empty:
        return
    said = "; ".join(f"benchmark {name!r}: none of its {n} prompts is within "
                     + " or ".join(f"model {m!r}'s prompt limit of {budget} tokens" for m, budget in who)
                     for name, (n, who) in empty.items())
    rest = [name for name in request["benchmarks"] if name not in empty]
    then = f"; evaluate the others with --benchmarks {','.join(rest)}" if rest else ""
    raise ConfigError(f"{said} (rollout.max_prompt_tokens, less max_new_tokens where the context window needs it; "
                      f"prompts are left out, never cut){then}")


def eval_answers(prompts: int, request: dict) -> int:
    """The answers an evaluation generates (docs/guide.md#what-a-command-prints): each prompt's k sampled answers
    in each of ``seeds`` runs, plus one greedy answer with ``greedy``. Example: 8 prompts, k=2, one run, greedy:
    8 × (2 × 1 + 1) = 24."""
    return int(prompts) * (int(request["k"]) * int(request["seeds"]) + (1 if request["greedy"] else 0))


class Counted:
    """An engine that counts the answers it generates into a wait (an evaluation's progress, ``evaluating``);
    the engine's own in everything else."""

    def __init__(self, engine, shown):
        self.engine, self.shown, self.done = engine, shown, 0

    def generate(self, prompts, n, *args, **kwargs):
        out = self.engine.generate(prompts, n, *args, **kwargs)
        self.done += len(prompts) * n if isinstance(n, int) else sum(n)
        self.shown.update(self.done)
        return out

    def __getattr__(self, name):
        if name == "engine":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.engine, name)


@contextlib.contextmanager
def evaluating(what: str, engine, request: dict, prompts: int):
    """An evaluation as a wait (graftzoo.contract.output) called ``what``: yields ``engine`` counting its answers
    against ``eval_answers``."""
    each = eval_answers(1, request)
    with wait(what, total=eval_answers(prompts, request), unit="answers",
              note=f"{prompts} problems, {each} answer{'s' if each != 1 else ''} each") as shown:
        yield Counted(engine, shown)


def evaluate_checkpoint(path, benchmarks=None, k: Optional[int] = None, *, seeds: int = 1,
                        greedy: Optional[bool] = None, temperature: Optional[float] = None,
                        top_p: Optional[float] = None, max_new_tokens: Optional[int] = None,
                        limit: Optional[int] = None, seed: Optional[int] = None, out=None,
                        select: Optional[str] = None, val_dataset=None, val_size: Optional[int] = None,
                        allow_test_selection: Optional[bool] = None, models: Optional[Sequence[str]] = None,
                        log: Optional[Callable[[str], None]] = None) -> list:
    """Evaluate a checkpoint or a run's selected checkpoint; write one eval file per model and
    return their paths (defaults and output folders: module docstring and :func:`eval_request`)."""
    run_dir, ckpt = resolve_target(path)
    if out and Path(out).resolve() == (run_dir / EVAL_DIR).resolve():
        raise ConfigError(f"--out {out}: that folder holds the trainer's evaluation (what graftzoo report "
                         f"reads), which graftzoo eval never overwrites; leave --out unset or name another")
    check_writable(Path(out) if out else run_dir / EVAL_DIR / CLI_EVAL_DIR, OUT_HINT)  # before anything is computed
    cfg = load_run_config(run_dir)
    req = eval_request(cfg, benchmarks, k, seeds=seeds, greedy=greedy, temperature=temperature, top_p=top_p,
                       max_new_tokens=max_new_tokens, limit=limit, seed=seed, select=select)
    task = Task(cfg)
    prompts = check_benchmarks(task, req["benchmarks"], limit)  # before any model is built
    check_prompts_fit(cfg, task, req, models)  # a benchmark none of whose prompts fits: before anything is scored
    policies = build_policies(cfg, models)
    # engines sized for the request's response limit (a vLLM engine's max_model_len), --max-new-tokens included
    sized = with_values(cfg, {"eval.max_new_tokens": req["max_new_tokens"]}) if req["max_new_tokens"] else cfg
    engines = {}
    try:
        for m, p in policies.items():
            engines[m] = make_eval_engine(p, sized, req["top_p"])
        if ckpt is not None:
            chosen = {m: (ckpt, {"rule": "given"}) for m in policies}
        else:
            chosen = select_checkpoints(run_dir, cfg, policies, engines, rule=req["select"], val_dataset=val_dataset,
                                        val_size=val_size, allow_test=allow_test_selection, k=req["k"],
                                        temperature=req["temperature"], max_new_tokens=req["max_new_tokens"],
                                        seed=req["seed"], log=log)
        for m, pol in policies.items():  # every checkpoint file checked and loaded before anything is evaluated
            load_weights(pol, chosen[m][0])
            engines[m].sync_weights()
        written = []
        for spec in trained_specs(cfg, models):
            m = spec.id
            use, selection = chosen[m]
            folder = Path(out) if out else cli_eval_folder(run_dir, checkpoint_step(use), req)
            with evaluating(f"evaluating {m} on {', '.join(req['benchmarks'])}", engines[m], req, prompts) as engine:
                _, path = evaluate_and_write(policies[m], engine, req, run_dir, folder=folder, task=task,
                                             step=checkpoint_step(use), log=log,
                                             extra={"run": cfg.run.name, "checkpoint": f"checkpoints/{use.name}",
                                                    "model_spec": spec.model_dump(), "selection": selection,
                                                    "request": req})
            written.append(path)
        return written
    finally:
        for engine in engines.values():
            engine.close()


__all__ = ["CLI_EVAL_DIR", "Counted", "check_prompts_fit", "cli_eval_folder", "eval_answers", "evaluate_checkpoint",
           "evaluating"]
