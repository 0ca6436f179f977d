"""The Python API, for notebooks and scripts: the same config, training, evaluation and export as the
``graftzoo`` command, with results as Python objects. ``import graftzoo`` exposes these names lazily
(``graftzoo/__init__.py``): this module, and with it torch and transformers, is imported on first use.

    import graftzoo
    cfg = graftzoo.load_config(pair="micro", algo="grpo", overrides={"run.steps": 2, "rollout.n": 4})
    result = graftzoo.train(cfg, run_dir="runs/notebook")
    result.scores            # model id -> final held-out avg@k (None without a final evaluation)
    result.metrics           # pandas DataFrame of metrics.jsonl: one row per (step, model)
    graftzoo.evaluate(result, benchmarks="heldout", k=4)   # model id -> {benchmark: avg@k}
    graftzoo.export(result, out="export/")                 # Hugging Face folders, one per model

Errors are the command's: a bad config value raises ``ConfigError`` naming the key before any model is built; a
run that diverges returns ``status == "failed"`` with the reason in ``error``. An error or a log line that says what
to pass says it in this API's words (``overwrite=True``, ``resume=False``, ``overrides={"run.name": NAME}``), not the
command's options (``API_WORDS``); a key that has no effect in the run's setting is said once, a warning line at start
(graftzoo.training.run.no_effect).

Any script may call these, with or without an ``if __name__ == "__main__":`` guard, and so may ``python -m``,
``python -c``, a heredoc and a notebook: no process that a run starts (a vLLM engine core and its workers, the
verifier's workers) runs or imports the caller's main module. ``train`` and ``evaluate`` leave ``os.environ`` as
they found it: what the run's engines and libraries set in it (vLLM's ``VLLM_*``, ``LD_PRELOAD``,
``LOCAL_WORLD_SIZE``, ...) is removed or put back when they return (docs/reliability.md#engines-and-their-processes).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import pandas as pd

from graftzoo.contract import metrics as M
from graftzoo.contract.config import ConfigError, RunConfig, load_config as _load_config, with_values
from graftzoo.contract.errors import NonFiniteError
from graftzoo.distributed.backend import RayBackend
from graftzoo.training.export import export_run
from graftzoo.training.engines.isolation import environment_kept
from graftzoo.training.run.no_effect import no_effect_lines
from graftzoo.training.run.rundir import default_run_name
from graftzoo.training.trainer import register_backend, train as train_run
from graftzoo.eval.artifacts import EVAL_DIR, METRICS, SUMMARY, eval_file_name, load_run
from graftzoo.eval.evaluate import fmt_score
from graftzoo.training.eval_runner import evaluate_checkpoint

register_backend("ray", RayBackend)  # run.backend=ray: each model in its own Ray worker group

Overrides = Union[Sequence[str], Mapping[str, Any], None]
log = logging.getLogger("graftzoo")

# What the command's messages tell a user to pass (its options), and the same in this API's words: (pattern,
# replacement), applied in this order to the message of every error the API raises (``api_words``).
_END = r"(?![\w-])"  # an option's name ends here (--out, not --out-dir)
API_WORDS = (
    (r"--no-resume" + _END, "resume=False"),
    (r"--overwrite" + _END, "overwrite=True"),
    (r"--no-track" + _END, "track=False"),
    (r"--set ([\w.]+)=([^\s;,)]+)", r'overrides={"\1": "\2"}'),
    (r"--allow-config-change ([\w.*,]+)",
     lambda m: "allow_config_change=[" + ", ".join(f'"{k}"' for k in m.group(1).split(",")) + "]"),
    (r"--peer online\|stored:PATH\|mixed:PATH",
     'overrides={"peer.source": "online"} (or "stored" / "mixed", with "peer.path": PATH)'),
    (r"--peer (\w+):([^\s;,)]+)", r'overrides={"peer.source": "\1", "peer.path": "\2"}'),
    (r"--pair (\w[\w.-]*)", r'pair="\1"'),
    (r"--algo (\w+)", r'algo="\1"'),
    (r"graftzoo eval --ckpt ([^\s;,)]+)", r'graftzoo.evaluate("\1")'),
    (r"graftzoo eval --ckpt" + _END, "graftzoo.evaluate"),
    (r"--benchmarks '", "benchmarks='"),
    (r"--benchmarks ([^\s;:)]+)", r'benchmarks="\1"'),
    (r"--out DIR \(graftzoo\.evaluate: out=DIR\)", "out=DIR"),
    (r"leave --out unset", "leave out=None"),
    (r"--out ([^\s;:,)]+)", r'out="\1"'),
    (r"--model ('[^']*')", r"models=[\1]"),
    (r"--step (\d+)", r"step=\1"),
    (r"--val-dataset" + _END, "val_dataset=PATH"),
    (r"--allow-test-selection" + _END, "allow_test_selection=True"),
)


def api_words(message: str) -> str:
    """``message`` (an error of the command line's layers) with every option it tells a user to pass in this API's
    words (``API_WORDS``): ``pass --overwrite`` -> ``pass overwrite=True``."""
    for pattern, replacement in API_WORDS:
        message = re.sub(pattern, replacement, message)
    return message


@contextlib.contextmanager
def _logs_in_api_words():
    """graftzoo's log lines in this API's words (``api_words``) while a call runs: each record of a ``graftzoo``
    logger is made with its message translated (the record factory is put back after)."""
    make = logging.getLogRecordFactory()

    def record(*args, **kwargs):
        rec = make(*args, **kwargs)
        if rec.name == "graftzoo" or rec.name.startswith("graftzoo."):
            try:
                rec.msg, rec.args = api_words(rec.getMessage()), None
            except Exception:  # a message that cannot be formatted is left for logging to report
                pass
        return rec

    logging.setLogRecordFactory(record)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make)


def _in_api_words(fn):
    """``fn`` whose errors are raised, and whose log lines are written, in this API's words (``api_words``): the
    same exception, its one-string message translated."""
    @functools.wraps(fn)
    def speaking(*args, **kwargs):
        try:
            with _logs_in_api_words():
                return fn(*args, **kwargs)
        except Exception as e:
            if len(e.args) == 1 and isinstance(e.args[0], str):
                e.args = (api_words(e.args[0]),)
            raise
    return speaking


def _override_list(overrides: Overrides) -> list:
    """``["key=value", ...]`` from a list of such strings or a mapping of dotted keys to Python values (a value is
    written as JSON, which the config reads as YAML: numbers, strings, booleans, None, lists and mappings keep
    their types)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of 'key=value' strings or a mapping, got the string "
                          f"{overrides!r}")
    return [str(o) for o in overrides]


@_in_api_words
def load_config(pair: Optional[str] = None, algo: Optional[str] = None, overrides: Overrides = None,
                files: Sequence = ()) -> RunConfig:
    """The checked run config of ``graftzoo train --pair PAIR --algo ALGO -c FILE --set KEY=VALUE``;
    ``overrides`` is a list of ``"key=value"`` strings or a mapping ``{"optim.lr": 1e-5, ...}``."""
    return _load_config(pair=pair, algo=algo, files=tuple(files), overrides=_override_list(overrides))


@dataclass
class RunResult:
    """What a run left: its directory, status, final held-out score per model, metrics and config."""

    run_dir: Path
    status: str                                   # summary.json status: done, failed, interrupted, running
    scores: dict                                  # model id -> final held-out avg@k (greedy when k = 0), or None
    metrics: pd.DataFrame                         # metrics.jsonl: one row per (step, model)
    config: dict                                  # the resolved config (config.yaml)
    error: Optional[str] = None                   # why a run failed or stopped
    evals: dict = field(default_factory=dict)     # model id -> the trainer's eval file (graftzoo.eval.artifacts)

    @property
    def steps(self) -> int:
        """Training steps done: the last step of metrics.jsonl that trained (``time/step`` set; the final
        evaluation's ``eval/*`` row comes after it, at step ``run.steps``), plus one."""
        if self.metrics.empty or M.TIME_STEP not in self.metrics:
            return 0
        trained = self.metrics.loc[self.metrics[M.TIME_STEP].notna(), M.STEP]
        return 0 if trained.empty else int(trained.max()) + 1

    @classmethod
    def from_dir(cls, run_dir) -> "RunResult":
        """The result of a run directory (finished or not)."""
        run = load_run(run_dir)
        metrics = pd.DataFrame(run.metrics)
        if not metrics.empty:
            metrics = metrics.sort_values([M.STEP, M.MODEL], kind="stable").reset_index(drop=True)
        return cls(run_dir=Path(run_dir), status=run.status, config=run.config, metrics=metrics,
                   scores={m: final_score(run.evals.get(m)) for m in run.models},
                   error=run.summary.get("error"), evals=dict(run.evals))


def final_score(payload: Optional[dict]) -> Optional[float]:
    """The held-out score of a trainer's eval file: avg@k of the whole split, greedy accuracy when k = 0."""
    if not payload:
        return None
    whole = payload.get("overall") or {}
    return whole.get("avg") if whole.get("avg") is not None else whole.get("greedy")


@_in_api_words
def train(cfg: Optional[RunConfig] = None, *, algo: Optional[str] = None, pair: Optional[str] = None,
          overrides: Overrides = None, files: Sequence = (), run_dir=None, resume: bool = True,
          overwrite: bool = False, track: Optional[bool] = None, progress=None,
          allow_config_change: Sequence[str] = ()) -> RunResult:
    """Train a run config (``load_config``), or the one ``algo``, ``pair``, ``files`` and ``overrides`` give, into
    ``run_dir`` (default ``run.out_dir/run.name``); as ``graftzoo train`` does: an existing run resumes
    (``resume=False`` refuses it, ``overwrite=True`` moves it aside; ``allow_config_change=["optim.*"]`` resumes it
    although those keys changed). ``track``: wandb on / off (default ``run.track``); ``progress``: a callable
    ``(step, total, metrics per model)``. A diverged run comes back with
    status ``failed``. ``os.environ`` is as it was before the call when it returns or raises (what the run set in it,
    a ``progress`` callable's changes included, is removed or put back)."""
    if cfg is None:
        extra = [] if track is None else [f"run.track={json.dumps(bool(track))}"]
        cfg = load_config(pair=pair, algo=algo, files=files, overrides=_override_list(overrides) + extra)
    elif algo or pair or overrides or files:
        raise ConfigError("train: give a config (cfg) or algo / pair / files / overrides, not both")
    elif track is not None:
        cfg = with_values(cfg, {"run.track": bool(track)})
    for line in no_effect_lines(cfg):  # a key set where the rest of the config leaves it idle (in the API's words:
        log.warning("%s", line)        # _in_api_words translates the call's log lines)
    try:
        with environment_kept():
            out = train_run(cfg, run_dir=None if run_dir is None else str(run_dir), resume=resume,
                            progress=progress, overwrite=overwrite, allow_config_change=allow_config_change)
    except NonFiniteError:
        out = Path(run_dir) if run_dir is not None else Path(cfg.run.out_dir) / (cfg.run.name or default_run_name(cfg))
    return RunResult.from_dir(out)


def _target(run_or_ckpt) -> str:
    return str(run_or_ckpt.run_dir if isinstance(run_or_ckpt, RunResult) else run_or_ckpt)


@_in_api_words
def evaluate(run_or_ckpt, benchmarks=None, k: Optional[int] = None, **options) -> dict:
    """``graftzoo eval``: evaluate a run (its checkpoint chosen by ``eval.select``), a ``RunResult`` or a checkpoint
    folder on ``benchmarks`` (``"all"``, names or paths, a list, or ``"heldout"``; default ``eval.benchmarks``, else
    the held-out split) with ``k`` samples per problem; returns model id -> {benchmark: avg@k}. ``options`` are
    ``graftzoo.training.eval_runner.evaluate_checkpoint``'s (seeds, greedy, temperature, limit, models, out, ...). The files
    go to ``RUN/eval/cli/...`` (never the trainer's ``RUN/eval/<model>.json``). ``os.environ`` is left as it was."""
    if isinstance(benchmarks, (list, tuple)):
        benchmarks = ",".join(map(str, benchmarks))
    out = {}
    with environment_kept():
        paths = evaluate_checkpoint(_target(run_or_ckpt), benchmarks, k, **options)
    for path in paths:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        out[payload["model"]] = {name: rec.get("avg") for name, rec in payload["benchmarks"].items()}
    return out


@_in_api_words
def export(run_or_ckpt, step: Optional[int] = None, out=None, models: Optional[Sequence[str]] = None) -> list:
    """``graftzoo export``: the trained models of a run (or ``RunResult``, or checkpoint folder) as Hugging Face
    folders (``graftzoo.training.export``); returns the folders, one per model."""
    return export_run(_target(run_or_ckpt), step=step, out=out, models=models)


def before_training(metrics: pd.DataFrame, model: str) -> dict:
    """The held-out evaluation before training (``run.eval_at_start``: the ``eval/*`` row of metrics.jsonl at step
    -1) of ``model``: its ``eval/avg`` and ``eval/greedy``; {} when there is none."""
    if metrics.empty or M.STEP not in metrics:
        return {}
    rows = metrics[(metrics[M.STEP] == -1) & (metrics[M.MODEL] == model)]
    if rows.empty:
        return {}
    row = rows.iloc[-1]
    return {k: float(row[k]) for k in (M.EVAL_AVG, M.EVAL_GREEDY) if k in row and pd.notna(row[k])}


def before_after(before: Optional[float], after: Optional[float]) -> str:
    """``44.5 -> 51.5 (+7.0)``: a held-out score before and after training, in points, and the change (computed from
    the unrounded scores); the after score alone without a before one."""
    if before is None or after is None:
        return fmt_score(after)
    return f"{fmt_score(before)} -> {fmt_score(after)} ({100 * (after - before):+.1f})"


def score_line(m: str, width: int, payload: dict, before: dict) -> str:
    """One model's line of ``summary_lines``: its held-out score before -> after training (avg@k, or greedy when
    k = 0), the greedy score too where both are measured, the step, the number of problems."""
    whole = payload.get("overall") or {}
    sampled = whole.get("avg") is not None
    what = f"avg@{whole.get('k')}" if sampled else "greedy"
    first = before.get(M.EVAL_AVG if sampled else M.EVAL_GREEDY)
    line = f"  {m:<{width}}  held-out {what} {before_after(first, final_score(payload))}"
    if "greedy" in whole and sampled:
        line += f"  greedy {before_after(before.get(M.EVAL_GREEDY), whole['greedy'])}"
    line += f"  (step {payload.get('step')}, n={whole.get('n_items')}"
    return line + ("; no score before training: run.eval_at_start is false)" if not before else ")")


def summary_lines(run_dir) -> list:
    """The end-of-training summary ``graftzoo train`` prints: status and steps, the held-out score per model before
    and after training, the files of the run and the commands to go on with."""
    res = RunResult.from_dir(run_dir)
    root = res.run_dir
    total = res.config.get("run", {}).get("steps")
    lines = [f"{res.status}: {res.steps} of {total} steps" + (f" ({res.error})" if res.error else "")]
    width = max(len(m) for m in res.scores)
    for m in res.scores:
        payload = res.evals.get(m)
        if payload is None:
            lines.append(f"  {m:<{width}}  no final evaluation (run.eval_at_end=false): graftzoo eval --ckpt {root}")
            continue
        lines.append(score_line(m, width, payload, before_training(res.metrics, m)))
    lines.append(f"run directory: {root}")
    lines.append(f"  summary  {root / SUMMARY}")
    lines.append(f"  metrics  {root / METRICS}")
    evals = [str(root / EVAL_DIR / eval_file_name(m)) for m in res.evals]
    if evals:
        lines.append(f"  eval     {', '.join(evals)}")
    lines.append("next:")
    lines.append(f"  graftzoo report {root} --out {root / 'report'}      # tables and plots")
    lines.append(f"  graftzoo export {root}      # Hugging Face folders in {root / 'export'}/step_N/")
    return lines


__all__ = ["API_WORDS", "ConfigError", "RunResult", "api_words", "before_training", "evaluate", "export", "final_score",
           "load_config", "summary_lines", "train", "train_run"]
