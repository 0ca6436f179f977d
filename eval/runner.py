"""``graftzoo eval``: evaluate a checkpoint (or a live policy) on math benchmarks.

Targets: a run directory's checkpoint ``RUN/checkpoints/step_N``, or a run directory, which means
the checkpoint that the run's selection rule picks (``eval.select``):

- ``last``: the newest complete checkpoint;
- ``val_avg``: every kept checkpoint is scored (avg@k, the eval sampling settings) on a
  VALIDATION set and each model gets its best one (ties: the later step), as in the GRAFT
  paper's Figure 4. The validation set is ``eval.val_dataset`` (a dataset name or path) when
  set, else ``eval.val_size`` (default 64) prompts of the task held out from testing: the
  ``val`` split of the procedural task, or a fixed slice of the training file
  (``validation_ids`` names it, so that training can leave it out). Selecting on a test set
  (the run's held-out split, a benchmark, any dataset whose split is ``test``) raises
  ``SelectionError`` unless ``allow_test`` / ``eval.allow_test_selection`` says otherwise.
  Keep every checkpoint for such runs (``run.keep_checkpoints: 0``).

Benchmarks: ``all`` (math500, aime24, aime25, amc23, minerva_math), any name or file path that
``graftzoo.envs.load_dataset`` accepts, or ``heldout``: the run's own held-out split (the one the
trainer evaluates on: ``eval.dataset``, else the task's ``test`` split of ``eval.size`` prompts).

Protocol (``graftzoo.eval.evaluate``): ``seeds`` evaluation runs of k samples per problem, every
sample under its own seed; avg@k with sd and a 95% t-interval over the runs (over the k sample
seeds when there is one run), unbiased pass@k; optionally a greedy pass. The policy is rebuilt
from the run's ``config.yaml`` (``graftzoo.core.models.build_policy`` with the pair's model spec) and
the checkpoint's weights. Results are written in the ``graftzoo.eval.artifacts`` eval format,
one file per model: by default ``RUN/eval/<model>.json`` for a run directory (what the report
reads) and ``RUN/eval/step_N/<model>.json`` for an explicit checkpoint.
"""
from __future__ import annotations

import copy
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

import click
import yaml

from graftzoo.eval.artifacts import eval_file_name, validate_eval

SELECT_RULES = ("last", "val_avg")
HELDOUT = "heldout"
DEFAULT_VAL_SIZE = 64


class SelectionError(ValueError):
    """Checkpoint selection is misconfigured (e.g. it would select on a test set)."""


# ---------------------------------------------------------------------------------------------
# run directories and checkpoints
# ---------------------------------------------------------------------------------------------

def load_run_config(run_dir) -> dict:
    """The resolved config a run was trained with (``RUN/config.yaml``)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; {run_dir} is not a graftzoo run directory")
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(cfg, dict) or not isinstance(cfg.get("pair"), dict):
        raise ValueError(f"{path}: not a run config (no 'pair' section)")
    return cfg


def list_checkpoints(run_dir) -> list:
    """Complete checkpoints of a run (those with ``trainer.pt``), oldest first."""
    root = Path(run_dir) / "checkpoints"
    return sorted(p for p in root.glob("step_*") if (p / "trainer.pt").is_file()) if root.is_dir() else []


def checkpoint_step(ckpt) -> int:
    """The training step of ``.../checkpoints/step_N``."""
    name = Path(ckpt).name
    try:
        return int(name.split("_", 1)[1])
    except (IndexError, ValueError):
        raise ValueError(f"{ckpt}: not a checkpoint directory (expected a name like step_000012)") from None


def resolve_target(path) -> tuple:
    """(run_dir, checkpoint or None) for a checkpoint directory or a run directory."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such directory (expected a run dir or RUN/checkpoints/step_N)")
    if (p / "trainer.pt").is_file() and p.parent.name == "checkpoints":
        return p.parent.parent, p
    if (p / "config.yaml").is_file():
        return p, None
    raise ValueError(f"{p}: neither a run directory (config.yaml) nor a checkpoint (trainer.pt)")


def trained_specs(cfg: dict, models: Optional[Sequence[str]] = None) -> list:
    """Model specs of the models a run trained (``pair.train``), or of ``models``."""
    specs = cfg["pair"]["models"]
    ids = [s["id"] for s in specs]
    wanted = list(models) if models else (cfg["pair"].get("train") or ids)
    unknown = [m for m in wanted if m not in ids]
    if unknown:
        raise ValueError(f"model(s) {unknown} are not in the run's pair.models {ids}")
    return [s for s in specs if s["id"] in wanted]


def build_policies(cfg: dict, models: Optional[Sequence[str]] = None) -> dict:
    """Fresh policies (model id -> Policy) for the run's trained models, from their pair specs."""
    from graftzoo.core.models import build_policy
    return {s["id"]: build_policy(s, cfg, int(cfg["run"]["seed"])) for s in trained_specs(cfg, models)}


def load_weights(policy, ckpt) -> None:
    """Load ``policy``'s model weights (only) from a checkpoint directory."""
    import torch
    path = Path(ckpt) / f"{policy.model_id.replace('/', '__')}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint {ckpt} holds no weights for model {policy.model_id!r}")
    state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    policy.model.load_state_dict(state["policy"]["model"])
    policy.version = int(state["policy"].get("version", 0))


def make_eval_engine(policy, cfg: dict, top_p: Optional[float] = None):
    """A rollout engine for ``policy`` built as in training, with the eval top-p."""
    from graftzoo.core.models import build_engine
    cfg = copy.deepcopy(cfg)
    if top_p is not None:
        cfg["rollout"]["top_p"] = float(top_p)
    return build_engine(policy, cfg)


# ---------------------------------------------------------------------------------------------
# benchmarks and the validation set
# ---------------------------------------------------------------------------------------------

def resolve_benchmarks(spec) -> list:
    """Benchmark names from ``"all"``, ``"a,b"`` or a list (``all`` expands in place, no repeats)."""
    from graftzoo.envs.datasets import BENCHMARKS
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list = []
    for item in items:
        if not isinstance(item, str):
            out.append(item)
            continue
        for name in (BENCHMARKS if item.strip() == "all" else [item.strip()]):
            if name and name not in out:
                out.append(name)
    if not out:
        raise ValueError(f"no benchmark named in {spec!r}")
    return out


def _task_kwargs(cfg: Optional[dict]) -> dict:
    task = (cfg or {}).get("task") or {}
    return {"reward_correct": task.get("reward_correct", 1.0), "reward_wrong": task.get("reward_wrong", 0.0),
            "verifier_timeout": task.get("verifier_timeout", 2.0)}


def _scoring_env(dataset, cfg: Optional[dict]):
    from graftzoo.envs.env import MathReasoningEnv
    return MathReasoningEnv(dataset=dataset, **_task_kwargs(cfg))


def _limited(items, limit: Optional[int]) -> list:
    items = list(items)
    return items if limit is None else items[:int(limit)]


def load_benchmark(bench, cfg: Optional[dict] = None, limit: Optional[int] = None) -> dict:
    """``{"name", "prompts", "env", "dataset", "hash", "split"}`` of one benchmark.

    ``bench`` is a dataset name or path, a MathDataset, or ``"heldout"`` (needs the run config)."""
    from graftzoo.envs.datasets import MathDataset, load_dataset
    if bench == HELDOUT:
        if cfg is None:
            raise ValueError("benchmark 'heldout' is the run's held-out split: it needs the run config (cfg=...)")
        ev = cfg["eval"]
        if ev.get("dataset"):
            ds = load_dataset(ev["dataset"])
            prompts, env = _limited(ds, ev.get("size")), _scoring_env(ds, cfg)
        else:
            from graftzoo.core.trainer import make_env
            env = make_env(cfg, "test", size=ev.get("size"))
            ds, prompts = env.dataset, list(env.dataset)
        return {"name": HELDOUT, "prompts": _limited(prompts, limit), "env": env, "dataset": ds.name,
                "hash": ds.hash, "split": "test"}
    ds = bench if isinstance(bench, MathDataset) else load_dataset(bench)
    return {"name": ds.name, "prompts": _limited(ds, limit), "env": _scoring_env(ds, cfg), "dataset": ds.name,
            "hash": ds.hash, "split": ds.split}


def _is_arithmetic(cfg: dict) -> bool:
    return "Arithmetic" in cfg["task"]["env"]


def validation_slice(dataset, size: int) -> list:
    """Indices of the fixed validation slice of a training file: ``size`` items drawn by a seed
    derived from the file's hash, so every run on that file shares it (sorted)."""
    n = len(dataset)
    if not 0 < size < n:
        raise ValueError(f"validation slice of {size} items out of {n} in {dataset.name!r}: need 0 < size < {n}")
    return sorted(random.Random(f"val:{dataset.hash}").sample(range(n), size))


def validation_set(cfg: dict, dataset=None, size: Optional[int] = None) -> dict:
    """The validation set of checkpoint selection, as :func:`load_benchmark` returns it (module doc)."""
    ev = cfg["eval"]
    dataset = dataset or ev.get("val_dataset")
    size = int(size or ev.get("val_size") or DEFAULT_VAL_SIZE)
    if dataset:
        return load_benchmark(dataset, cfg, limit=size)
    if _is_arithmetic(cfg):
        from graftzoo.core.trainer import make_env
        env = make_env(cfg, "val", size=size)
        return {"name": "val", "prompts": list(env.dataset), "env": env, "dataset": env.dataset.name,
                "hash": env.dataset.hash, "split": "val"}
    from graftzoo.envs.datasets import MathDataset, load_dataset
    task = cfg["task"]
    train = load_dataset(task["dataset"], task["split"])
    items = [train[i] for i in validation_slice(train, size)]
    sliced = MathDataset(f"{train.name}-val", items, split="val")
    return {"name": sliced.name, "prompts": items, "env": _scoring_env(train, cfg), "dataset": train.name,
            "hash": sliced.hash, "split": "val"}


def validation_ids(cfg: dict) -> set:
    """Prompt ids of the training-file validation slice (empty when the validation set is not
    carved from the training data): what training must leave out for ``eval.select=val_avg``."""
    if cfg["eval"].get("val_dataset") or _is_arithmetic(cfg):
        return set()
    return {p.id for p in validation_set(cfg)["prompts"]}


def is_test_set(bench: dict, cfg: dict) -> bool:
    """Whether a loaded benchmark is a test set: the held-out split, a dataset whose split is
    ``test``, one of the GRAFT benchmarks, or one the run evaluates on (eval.benchmarks/dataset)."""
    from graftzoo.envs.datasets import BENCHMARKS
    ev = cfg["eval"]
    listed = set(BENCHMARKS) | {str(b) for b in (ev.get("benchmarks") or [])}
    if ev.get("dataset"):
        listed.add(Path(str(ev["dataset"])).stem)
        listed.add(str(ev["dataset"]))
    return bench["name"] == HELDOUT or bench["split"] == "test" or bench["dataset"] in listed


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------

def _engine_name(engine, cfg: Optional[dict]) -> str:
    if cfg is not None:
        return str(cfg["rollout"]["engine"])
    return {"HFEngine": "hf", "VLLMEngine": "vllm"}.get(type(engine).__name__, type(engine).__name__)


def score_benchmark(policy, engine, bench: dict, k: int, *, seeds: int = 1, greedy: bool = False,
                    temperature: Optional[float] = None, max_new_tokens: Optional[int] = None,
                    seed: int = 0) -> dict:
    """One benchmark record (eval artifact format) of ``policy`` on a loaded benchmark."""
    from graftzoo.eval.evaluate import greedy_correctness, sample_correctness, summarize
    prompts, env = bench["prompts"], bench["env"]
    if not prompts:
        raise ValueError(f"benchmark {bench['name']!r} has no prompts to evaluate")
    rec: dict = {}
    if k > 0:
        rec.update(summarize(sample_correctness(engine, env, prompts, k, seed=seed, runs=seeds,
                                                temperature=temperature, max_new_tokens=max_new_tokens)))
    if greedy:
        corr = greedy_correctness(engine, env, prompts, max_new_tokens)
        rec["greedy"] = sum(corr) / len(corr)
        if k == 0:
            rec.update({"avg": rec["greedy"], "sd": None, "ci": None, "per_seed_run": [rec["greedy"]],
                        "k": 0, "seeds": 0, "n_items": len(prompts), "pass_at_k": {"1": rec["greedy"]}})
    if not rec:
        raise ValueError("nothing to evaluate: k = 0 and greedy is off")
    rec["dataset"] = bench["dataset"]
    return rec


def evaluate_benchmarks(policy, engine, benchmarks="all", k: int = 8, *, seeds: int = 1, greedy: bool = False,
                        temperature: Optional[float] = None, max_new_tokens: Optional[int] = None,
                        limit: Optional[int] = None, seed: int = 0, cfg: Optional[dict] = None, step: int = 0,
                        log: Optional[Callable[[str], None]] = None) -> dict:
    """Evaluate a live ``policy`` (with its ``engine``) and return its eval payload
    (``graftzoo.eval.artifacts`` format; ``write_eval`` accepts it).

    ``benchmarks``: ``"all"``, ``"a,b"``, or a list of names / paths / MathDatasets / ``"heldout"``
    (the latter needs ``cfg``, the run config). ``limit`` keeps the first N prompts of each.
    ``temperature`` None: the engine's; ``max_new_tokens`` None: the engine's."""
    if k < 0 or seeds < 1:
        raise ValueError(f"need k >= 0 and seeds >= 1, got k={k}, seeds={seeds}")
    max_new = int(max_new_tokens or engine.max_new_tokens)
    temp = float(engine.temperature if temperature is None else temperature)
    payload: dict = {"model": policy.model_id, "step": int(step), "benchmarks": {}, "dataset_hashes": {}}
    saved = policy.max_prompt_tokens
    policy.max_prompt_tokens = prompt_budget(policy, max_new)
    try:
        for name in resolve_benchmarks(benchmarks):
            bench = load_benchmark(name, cfg, limit)
            rec = score_benchmark(policy, engine, bench, int(k), seeds=int(seeds), greedy=greedy,
                                  temperature=temp, max_new_tokens=max_new, seed=seed)
            rec["truncated_prompts"] = sum(len(policy.tokenizer.encode(policy.render(p), add_special_tokens=False))
                                           > policy.max_prompt_tokens for p in bench["prompts"])
            if limit is not None:
                rec["limit"] = int(limit)
            payload["benchmarks"][bench["name"]] = rec
            payload["dataset_hashes"][bench["name"]] = bench["hash"]
            if log:
                log(_line(policy.model_id, bench["name"], rec))
        budget = policy.max_prompt_tokens
    finally:
        policy.max_prompt_tokens = saved
    from graftzoo.envs.verifier import VERIFIER_VERSION
    payload.update({
        "verifier": VERIFIER_VERSION, "engine": _engine_name(engine, cfg),
        "sampling": {"temperature": temp, "top_p": getattr(engine, "top_p", None),
                     "top_k": getattr(engine, "top_k", None), "max_new_tokens": max_new,
                     "max_prompt_tokens": budget, "k": int(k),
                     "seeds": int(seeds), "greedy": bool(greedy), "seed": int(seed),
                     "sample_seed": "graftzoo.eval.evaluate.sample_seed(seed, run, j)"},
    })
    return payload


def prompt_budget(policy, max_new_tokens: int) -> int:
    """Prompt tokens kept (the last ones, as ``Policy.encode_prompt`` does): the policy's limit,
    lowered so that prompt + ``max_new_tokens`` fit the model's context window when it has one."""
    ctx = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)
    if not ctx:
        return policy.max_prompt_tokens
    if ctx <= max_new_tokens:
        raise ValueError(f"model {policy.model_id!r}: max_new_tokens={max_new_tokens} leaves no room for a prompt "
                         f"in its context of {ctx} tokens")
    return min(policy.max_prompt_tokens, ctx - max_new_tokens)


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _line(model: str, name: str, rec: dict) -> str:
    ci = rec.get("ci")
    parts = [f"{model}  {name:<14} avg@{rec['k']} {_fmt(rec['avg'])} ± {_fmt(rec.get('sd'))}",
             f"CI [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "CI -",
             " ".join(f"pass@{kk} {_fmt(v)}" for kk, v in rec.get("pass_at_k", {}).items())]
    if "greedy" in rec:
        parts.append(f"greedy {_fmt(rec['greedy'])}")
    return "  ".join(parts) + f"  (n={rec['n_items']})"


def select_checkpoints(run_dir, cfg: dict, policies: dict, engines: dict, *, rule: Optional[str] = None,
                       val_dataset=None, val_size: Optional[int] = None, allow_test: Optional[bool] = None,
                       k: int = 1, temperature: Optional[float] = None, max_new_tokens: Optional[int] = None,
                       seed: int = 0, log: Optional[Callable[[str], None]] = None) -> dict:
    """model id -> (checkpoint, selection record) under ``rule`` (default ``eval.select``)."""
    ev = cfg["eval"]
    rule = rule or ev.get("select") or "last"
    if rule not in SELECT_RULES:
        raise SelectionError(f"config key 'eval.select' must be one of {SELECT_RULES}, got {rule!r}")
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"{Path(run_dir) / 'checkpoints'}: no complete checkpoint to evaluate")
    steps = [checkpoint_step(c) for c in ckpts]
    if rule == "last":
        return {m: (ckpts[-1], {"rule": "last", "candidates": steps}) for m in policies}
    allow = bool(ev.get("allow_test_selection", False) if allow_test is None else allow_test)
    val = validation_set(cfg, val_dataset, val_size)
    if is_test_set(val, cfg) and not allow:
        raise SelectionError(f"eval.select=val_avg would pick checkpoints on {val['name']!r}, a test set; "
                             f"give a validation set (eval.val_dataset / --val-dataset) or allow it explicitly "
                             f"(eval.allow_test_selection / --allow-test-selection)")
    scores: dict = {m: {} for m in policies}
    for ckpt, step in zip(ckpts, steps):
        for m, pol in policies.items():
            load_weights(pol, ckpt)
            rec = score_benchmark(pol, engines[m], val, k, greedy=k == 0, temperature=temperature,
                                  max_new_tokens=max_new_tokens, seed=seed)
            scores[m][step] = rec["avg"]
            if log:
                log(f"select {m}  step {step}  {val['name']} avg@{k} {_fmt(rec['avg'])}")
    out = {}
    for m in policies:
        best = max(steps, key=lambda s: (scores[m][s], s))
        out[m] = (ckpts[steps.index(best)],
                  {"rule": "val_avg", "dataset": val["name"], "dataset_hash": val["hash"],
                   "n_items": len(val["prompts"]), "k": k, "candidates": steps,
                   "scores": {str(s): scores[m][s] for s in steps}, "selected_step": best})
    return out


def _write_payload(folder: Path, payload: dict) -> Path:
    path = folder / eval_file_name(payload["model"])
    validate_eval(payload, str(path))
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def eval_request(cfg: dict, benchmarks=None, k: Optional[int] = None, *, seeds: int = 1,
                 greedy: Optional[bool] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 max_new_tokens: Optional[int] = None, limit: Optional[int] = None, seed: Optional[int] = None,
                 select: Optional[str] = None) -> dict:
    """The full evaluation request: every unset option filled from the run config (``eval.*``;
    benchmarks default to ``eval.benchmarks``, else ``heldout``). Stored in each eval file."""
    ev = cfg["eval"]
    return {"benchmarks": [str(b) for b in resolve_benchmarks(benchmarks or ev.get("benchmarks") or [HELDOUT])],
            "k": int(ev["k"] if k is None else k), "seeds": int(seeds),
            "greedy": bool(ev["greedy"] if greedy is None else greedy),
            "temperature": float(ev["temperature"] if temperature is None else temperature),
            "top_p": float(ev.get("top_p") or cfg["rollout"]["top_p"]) if top_p is None else float(top_p),
            "max_new_tokens": max_new_tokens or ev.get("max_new_tokens"),
            "limit": limit, "seed": int(cfg["run"]["seed"] if seed is None else seed),
            "select": select or ev.get("select") or "last"}


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
    cfg = load_run_config(run_dir)
    req = eval_request(cfg, benchmarks, k, seeds=seeds, greedy=greedy, temperature=temperature, top_p=top_p,
                       max_new_tokens=max_new_tokens, limit=limit, seed=seed, select=select)
    policies = build_policies(cfg, models)
    engines = {m: make_eval_engine(p, cfg, req["top_p"]) for m, p in policies.items()}
    if ckpt is not None:
        chosen = {m: (ckpt, {"rule": "given"}) for m in policies}
    else:
        chosen = select_checkpoints(run_dir, cfg, policies, engines, rule=req["select"], val_dataset=val_dataset,
                                    val_size=val_size, allow_test=allow_test_selection, k=req["k"],
                                    temperature=req["temperature"], max_new_tokens=req["max_new_tokens"],
                                    seed=req["seed"], log=log)
    folder = Path(out) if out else (run_dir / "eval" if ckpt is None else run_dir / "eval" / ckpt.name)
    written = []
    for spec in trained_specs(cfg, models):
        m = spec["id"]
        use, selection = chosen[m]
        load_weights(policies[m], use)
        payload = evaluate_benchmarks(policies[m], engines[m], req["benchmarks"], req["k"], seeds=req["seeds"],
                                      greedy=req["greedy"], temperature=req["temperature"],
                                      max_new_tokens=req["max_new_tokens"], limit=req["limit"], seed=req["seed"],
                                      cfg=cfg, step=checkpoint_step(use), log=log)
        payload.update({"run": cfg["run"].get("name"), "checkpoint": f"checkpoints/{use.name}",
                        "model_spec": spec, "selection": selection, "request": req})
        written.append(_write_payload(folder, payload))
    return written


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

@click.command("eval")
@click.option("--ckpt", "path", required=True, type=click.Path(exists=True, file_okay=False),
              help="RUN/checkpoints/step_N, or a run dir (its checkpoint chosen by eval.select)")
@click.option("--benchmarks", default=None,
              help="all | comma-separated names or paths | heldout  [default: eval.benchmarks, else heldout]")
@click.option("--k", type=click.IntRange(min=0), default=None, help="samples per problem [default: eval.k]")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="evaluation runs of k samples each (sd and CI are over runs when > 1)")
@click.option("--greedy/--no-greedy", default=None, help="also score one greedy response [default: eval.greedy]")
@click.option("--temperature", type=float, default=None, help="[default: eval.temperature]")
@click.option("--top-p", type=float, default=None, help="[default: eval.top_p, else rollout.top_p]")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
              help="[default: eval.max_new_tokens, else the model's rollout limit]")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="first N prompts of each benchmark")
@click.option("--seed", type=int, default=None, help="base sampling seed [default: run.seed]")
@click.option("--out", default=None, type=click.Path(file_okay=False), help="folder for <model>.json")
@click.option("--select", type=click.Choice(SELECT_RULES), default=None,
              help="checkpoint selection for a run dir [default: eval.select]")
@click.option("--val-dataset", default=None, help="validation set for --select val_avg [default: eval.val_dataset]")
@click.option("--val-size", type=click.IntRange(min=1), default=None, help="validation prompts [default: 64]")
@click.option("--allow-test-selection", is_flag=True, default=None,
              help="allow val_avg selection on a test set (off: it raises)")
@click.option("--model", "models", multiple=True, help="evaluate only this model id (repeatable)")
def eval_cmd(path, benchmarks, k, seeds, greedy, temperature, top_p, max_new_tokens, limit, seed, out, select,
             val_dataset, val_size, allow_test_selection, models):
    """Evaluate a checkpoint on math benchmarks: avg@k ± sd, 95% CI and pass@k per benchmark."""
    try:
        paths = evaluate_checkpoint(path, benchmarks, k, seeds=seeds, greedy=greedy, temperature=temperature,
                                    top_p=top_p, max_new_tokens=max_new_tokens, limit=limit, seed=seed, out=out,
                                    select=select, val_dataset=val_dataset, val_size=val_size,
                                    allow_test_selection=allow_test_selection, models=models or None,
                                    log=click.echo)
    except (SelectionError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    for p in paths:
        click.echo(f"wrote {p}")


__all__ = ["SelectionError", "build_policies", "checkpoint_step", "eval_cmd", "eval_request", "evaluate_benchmarks",
           "evaluate_checkpoint", "is_test_set", "list_checkpoints", "load_benchmark", "load_run_config",
           "load_weights", "resolve_benchmarks", "resolve_target", "score_benchmark", "select_checkpoints",
           "validation_ids", "validation_set", "validation_slice"]

