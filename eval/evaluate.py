"""Evaluate a live policy on benchmarks: the one evaluation path of ``graftzoo eval`` and of the
trainer's own evaluation, and the one place eval result files are written from.

- ``eval_request(cfg, ...)``: every evaluation setting, unset options filled from ``eval.*``;
  ``top_p`` is ``eval.top_p``, None meaning ``rollout.top_p`` (``eval_top_p``), in both callers.
- ``evaluate_benchmarks(policy, engine, request, task=...)``: the eval payload
  (``graftzoo.eval.artifacts`` format), every benchmark scored by
  ``graftzoo.eval.protocol.score_benchmark``. ``group_by`` (one benchmark) reports its groups of
  prompts as the benchmarks and the whole set as ``overall``: the trainer's layout, whose
  ``eval_metrics`` are the ``eval/*`` metrics of a run.
- ``evaluate_and_write``: the same, written with ``graftzoo.eval.artifacts.write_eval``; its folder is checked
  to be writable (``check_writable``) before anything is scored, so that no score is computed only to be lost.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

from graftzoo.contract import metrics as M
from graftzoo.contract.config import RunConfig
from graftzoo.contract.errors import ConfigError
from graftzoo.envs.task import HELDOUT, Task, load_benchmark, resolve_benchmarks
from graftzoo.envs.verifier import VERIFIER_VERSION, verifier_version
from graftzoo.eval.artifacts import EVAL_DIR, write_eval
from graftzoo.eval.protocol import score_benchmark


def check_writable(folder, hint: str = "") -> Path:
    """Check that a file can be written in ``folder`` before anything expensive is computed for it: create it (and
    its parents), write a file, then remove what the check created (a command that fails later leaves no empty
    folder; its writers create the folder again). An ``OSError`` naming the folder (plus ``hint``: where else to
    write) when that fails."""
    folder = Path(folder)
    made = [d for d in (folder, *folder.parents) if not d.exists()]  # innermost first
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise OSError(e.errno, f"cannot write results there ({why}){'; ' + hint if hint else ''}",
                      str(e.filename or folder)) from None
    finally:
        for d in made:
            try:
                d.rmdir()
            except OSError:  # not made after all, or something else wrote there meanwhile
                break
    return folder


def eval_top_p(cfg: RunConfig) -> float:
    """The top-p of evaluation: ``eval.top_p``, None meaning ``rollout.top_p``."""
    top_p = cfg.eval.top_p
    return float(cfg.rollout.top_p if top_p is None else top_p)




def eval_request(cfg: RunConfig, benchmarks=None, k: Optional[int] = None, *, seeds: int = 1,
                 greedy: Optional[bool] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 max_new_tokens: Optional[int] = None, limit: Optional[int] = None, seed: Optional[int] = None,
                 select: Optional[str] = None) -> dict:
    """The full evaluation request: every unset option filled from the run config (``eval.*``;
    benchmarks default to ``eval.benchmarks``, else ``heldout``). Stored in each eval file."""
    ev = cfg.eval
    return {"benchmarks": [str(b) for b in resolve_benchmarks(benchmarks or ev.benchmarks or [HELDOUT])],
            "k": int(ev.k if k is None else k), "seeds": int(seeds),
            "greedy": bool(ev.greedy if greedy is None else greedy),
            "temperature": float(ev.temperature if temperature is None else temperature),
            "top_p": eval_top_p(cfg) if top_p is None else float(top_p),
            "max_new_tokens": max_new_tokens or ev.max_new_tokens,
            "limit": limit, "seed": int(cfg.run.seed if seed is None else seed),
            "select": select or ev.select or "last"}


def heldout_request(cfg: RunConfig) -> dict:
    """What the trainer evaluates: the held-out split under the run's ``eval.*`` settings."""
    return eval_request(cfg, [HELDOUT])


def prompt_budget(policy, max_new_tokens: int) -> int:
    """The longest prompt evaluated (a longer one is left out and counted, never cut): the policy's limit,
    lowered so that prompt + ``max_new_tokens`` fit the model's context window when it has one."""
    ctx = getattr(policy, "context_window", None)
    if not ctx or ctx >= 1 << 30:  # a model that declares no context window
        return policy.max_prompt_tokens
    if ctx <= max_new_tokens:
        raise ConfigError(f"model {policy.model_id!r}: max_new_tokens={max_new_tokens} leaves no room for a prompt "
                         f"in its context of {ctx} tokens")
    return min(policy.max_prompt_tokens, ctx - max_new_tokens)


def _engine_name(engine, cfg: Optional[RunConfig]) -> str:
    if cfg is not None:
        return str(cfg.rollout.engine)
    return {"HFEngine": "hf", "VLLMEngine": "vllm"}.get(type(engine).__name__, type(engine).__name__)


def evaluate_benchmarks(policy, engine, request: dict, *, task: Optional[Task] = None, step: int = 0,
                        group_by: Optional[str] = None, log: Optional[Callable[[str], None]] = None) -> dict:
    """The eval payload of a live ``policy`` generating with ``engine`` (built with the request's
    top-p: ``graftzoo.training.planner.build.make_eval_engine``) under ``request`` (``eval_request``).

    ``task``: the run's task (needed for ``heldout``; its rewards score every benchmark).
    ``group_by``: a prompt field; with it the one benchmark's groups of prompts are the payload's
    benchmarks and the whole benchmark is ``overall`` (module docstring)."""
    k, seeds, limit = int(request["k"]), int(request["seeds"]), request["limit"]
    if k < 0 or seeds < 1:
        raise ValueError(f"need k >= 0 and seeds >= 1, got k={k}, seeds={seeds}")
    names = resolve_benchmarks(request["benchmarks"])
    if group_by and len(names) != 1:
        raise ValueError(f"group_by={group_by!r} reports the groups of one benchmark, got {names}")
    max_new = int(request["max_new_tokens"] or engine.max_new_tokens)
    temp = float(engine.temperature if request["temperature"] is None else request["temperature"])
    payload: dict = {"model": policy.model_id, "step": int(step), "benchmarks": {}, "dataset_hashes": {}}
    saved = policy.max_prompt_tokens
    policy.max_prompt_tokens = prompt_budget(policy, max_new)
    try:
        for name in names:
            bench = load_benchmark(name, task, limit)
            rec = score_benchmark(policy, engine, bench, k, seeds=seeds, greedy=bool(request["greedy"]),
                                  temperature=temp, max_new_tokens=max_new, seed=int(request["seed"]),
                                  group_by=group_by)
            if limit is not None:
                rec["limit"] = int(limit)
            payload["benchmarks"][bench.name] = rec
            payload["dataset_hashes"][bench.name] = bench.hash
            if log:
                log(_line(policy.model_id, bench.name, rec))
        budget = policy.max_prompt_tokens
    finally:
        policy.max_prompt_tokens = saved
    payload.update({
        "verifier": verifier_version(task.cfg.task.verifier.model_dump()) if task is not None else VERIFIER_VERSION,
        "engine": _engine_name(engine, task.cfg if task is not None else None),
        "sampling": {"temperature": temp, "top_p": getattr(engine, "top_p", None),
                     "top_k": getattr(engine, "top_k", None), "max_new_tokens": max_new,
                     "max_prompt_tokens": budget, "k": k, "seeds": seeds, "greedy": bool(request["greedy"]),
                     "seed": int(request["seed"]),
                     "sample_seed": "graftzoo.eval.protocol.sample_seed(seed, run, j)"},
    })
    if group_by:
        (whole,) = payload["benchmarks"].values()
        payload["benchmarks"] = whole.pop("groups")
        payload["overall"] = whole
    return payload


def evaluate_and_write(policy, engine, request: dict, run_dir, *, folder=None, task: Optional[Task] = None,
                       step: int = 0, group_by: Optional[str] = None, extra: Optional[dict] = None,
                       log: Optional[Callable[[str], None]] = None) -> tuple:
    """(payload, path): ``evaluate_benchmarks`` plus the ``extra`` fields, written as the model's
    eval file in ``run_dir/eval/`` (or ``folder``), whose writability is checked first."""
    check_writable(folder if folder is not None else Path(run_dir) / EVAL_DIR)
    payload = evaluate_benchmarks(policy, engine, request, task=task, step=step, group_by=group_by, log=log)
    payload.update(extra or {})
    return payload, write_eval(run_dir, payload["model"], payload, folder=folder)


def eval_metrics(payload: dict) -> dict:
    """The ``eval/*`` metrics of a run from a grouped payload (``group_by``): ``eval/avg``,
    ``eval/greedy``, and per group ``eval/avg_<group>`` (when sampled) and ``eval/greedy_<group>``."""
    whole, groups = payload["overall"], payload["benchmarks"]
    out = {M.EVAL_AVG: whole.get("avg"), M.EVAL_GREEDY: whole.get("greedy")}
    if whole.get("k", 0) > 0:
        out.update({M.EVAL_AVG_GROUP.of(group=g): rec["avg"] for g, rec in groups.items()})
    out.update({M.EVAL_GREEDY_GROUP.of(group=g): rec["greedy"] for g, rec in groups.items() if "greedy" in rec})
    return out


def fmt_score(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _line(model: str, name: str, rec: dict) -> str:
    ci = rec.get("ci")
    parts = [f"{model}  {name:<14} avg@{rec['k']} {fmt_score(rec['avg'])} ± {fmt_score(rec.get('sd'))}",
             f"CI [{fmt_score(ci[0])}, {fmt_score(ci[1])}]" if ci else "CI -",
             " ".join(f"pass@{kk} {fmt_score(v)}" for kk, v in rec.get("pass_at_k", {}).items())]
    if "greedy" in rec:
        parts.append(f"greedy {fmt_score(rec['greedy'])}")
    return "  ".join(parts) + f"  (n={rec['n_items']})"
