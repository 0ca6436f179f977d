"""On-disk format of one run directory, with its writers and readers.

The trainer writes these files; ``graftzoo report`` reads them. Every JSON/YAML file is written
atomically (temporary file in the same folder, then ``os.replace``), so a reader never sees a
half-written file. Scores are fractions in [0, 1]; tables show them x100.

``run_dir/config.yaml``
    The resolved config (``write_config``). Keys read by ``make_summary``: ``run.name``,
    ``run.variant`` (the table row label: "GRPO (n=8)", "GRAFT", "GRAFT w/o gate", ...),
    ``run.seed``, ``algo.name``, ``pair.name``, ``rollout.n``.

``run_dir/metrics.jsonl``
    One JSON object per line, one line per (step, model) (``append_metrics``)::

        {"step": 12, "model": "tiny-qwen-char", "reward/acc": 0.41, "groups/all_fail": 0.22,
         "peer/solved_all_fail_frac": 0.35, "clip/frac_own": 0.004,
         "clip/frac_peer": 0.011, "time/generate": 3.2, ...}

    ``step`` (int) and ``model`` (str) are required; all other keys are metric names with
    numeric values or null (the fixed vocabulary of docs/architecture.md). A final line
    without its newline that does not parse is a torn write of a killed run: it is left out, with a
    warning naming the file and line.

``run_dir/eval/<model file name>.json``
    Final evaluation of one model (``write_eval``, by the trainer's final evaluation); a grid's own
    evaluation of its cell goes to ``run_dir/eval/grid/`` and takes its place in the report
    (``eval_path``); ``graftzoo eval`` writes under ``run_dir/eval/cli/`` and never replaces either. The
    file name is the model id with "/" replaced by "__", the id itself is the ``model`` field::

        {"model": "tiny-qwen-char", "step": 174,
         "benchmarks": {"math500": {"avg": 0.412, "sd": 0.011, "ci": [0.39, 0.43], "k": 4,
                                    "n_items": 500, "per_seed_run": [0.40, 0.42, 0.41, 0.42],
                                    "pass_at_k": {"1": 0.412, "4": 0.58}}, ...},
         "dataset_hashes": {"math500": "sha256:..."}, "verifier": "math-verify 0.7.0",
         "engine": "hf", "sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 4096}}

    Required: ``model`` (str), ``step`` (int), ``benchmarks`` (non-empty mapping), and a numeric
    ``avg`` per benchmark. ``avg`` is avg@k over the benchmark's items for this run;
    ``per_seed_run`` holds that score for each evaluation sampling seed and ``sd`` is its sample
    sd; ``ci`` is the bootstrap interval over the benchmark's items (``ci_method``). The report's ± is a different spread: across training seeds (runs).
    The trainer's final evaluation (of the held-out split) has one ``benchmarks`` entry per group
    of prompts (the arithmetic skill, else the prompt's source: ``add``, ``mul``, ...) and the
    whole split under ``overall``; ``graftzoo eval`` has one entry per benchmark it was asked for.

``run_dir/summary.json``
    Written at start (status "running") and at the end (``write_summary``; build it with
    ``make_summary``)::

        {"name": "graft-s0", "algo": "graft", "variant": "GRAFT", "pair": "tiny",
         "seed": 0, "models": ["tiny-qwen-char", "tiny-gpt2-pair"],
         "peers": {"tiny-qwen-char": "tiny-gpt2-pair", "tiny-gpt2-pair": "tiny-qwen-char"},
         "peer_source": "live", "rollout_n": 8, "status": "done",
         "compute": <ComputeMeter.summary()>, "peer_run_compute": null}

    ``peers[m]`` is the model whose rollouts ``m`` learned from (the list of them in a population), or null for
    single-model methods (these are the baselines of the report). ``peer_source`` is "live" (co-trained),
    "stored" (peer logs of an earlier run), "mixed" (live with stored fallback), a plugin source's name, or null.
    ``rollout_n`` is the rollout budget: rollouts per prompt per model. ``compute`` is ``graftzoo.eval.compute.ComputeMeter.summary()``;
    ``peer_run_compute`` (stored/mixed mode, optional) is the original peer run's compute total
    ``{"wall_s", "cpu_s", "gpu_h"}`` used for the amortized charge (``stored_peer_cost``).
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import yaml

from graftzoo.contract import metrics as M
from graftzoo.contract.layout import CONFIG, METRICS, SUMMARY
from graftzoo.contract.names import model_slug
from graftzoo.eval.compute import FIELDS, joint_charge

log = logging.getLogger("graftzoo")

EVAL_DIR = "eval"
GRID_EVAL_DIR = "grid"  # RUN/eval/grid/<model>.json: a grid's own evaluation of its cell, preferred by the report
STATUSES = ("done", "running", "failed", "interrupted")  # "error" says why a run failed or stopped
PEER_SOURCES = (None, "live", "stored", "mixed")  # the builtins' (graftzoo.contract.peer_sources); a plugin's own


class ArtifactError(ValueError):
    """A run directory (or a payload for it) does not follow the format above."""


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def eval_file_name(model_id: str) -> str:
    """File name under ``run_dir/eval/`` for a model id (``graftzoo.contract.names.model_slug``)."""
    return model_slug(model_id) + ".json"


def eval_path(run_dir, model_id: str) -> Path:
    """The eval file a report reads for ``model_id`` in ``run_dir``: the grid's (``eval/grid/``) when there is
    one, else the trainer's (``eval/``); it may not exist."""
    name = eval_file_name(model_id)
    grid = Path(run_dir) / EVAL_DIR / GRID_EVAL_DIR / name
    return grid if grid.is_file() else Path(run_dir) / EVAL_DIR / name


def validate_eval(payload: Mapping, where: str) -> None:
    """Raise ArtifactError naming ``where`` and the key if ``payload`` is not an eval record."""
    if not isinstance(payload, Mapping):
        raise ArtifactError(f"{where}: expected a JSON object, got {type(payload).__name__}")
    if not isinstance(payload.get("model"), str) or not payload["model"]:
        raise ArtifactError(f"{where}: key 'model' must be a non-empty string")
    if not isinstance(payload.get("step"), int) or isinstance(payload.get("step"), bool):
        raise ArtifactError(f"{where}: key 'step' must be an integer")
    benches = payload.get("benchmarks")
    if not isinstance(benches, Mapping) or not benches:
        raise ArtifactError(f"{where}: key 'benchmarks' must be a non-empty mapping")
    for name, rec in benches.items():
        if not isinstance(rec, Mapping) or not _is_number(rec.get("avg")):
            raise ArtifactError(f"{where}: benchmarks.{name}.avg must be a finite number")


def validate_summary(payload: Mapping, where: str) -> None:
    """Raise ArtifactError naming ``where`` and the key if ``payload`` is not a run summary."""
    if not isinstance(payload, Mapping):
        raise ArtifactError(f"{where}: expected a JSON object, got {type(payload).__name__}")
    for key in ("name", "algo", "variant", "pair"):
        if not isinstance(payload.get(key), str) or not payload[key]:
            raise ArtifactError(f"{where}: key '{key}' must be a non-empty string")
    for key in ("seed", "rollout_n"):
        if not isinstance(payload.get(key), int) or isinstance(payload.get(key), bool):
            raise ArtifactError(f"{where}: key '{key}' must be an integer")
    models = payload.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ArtifactError(f"{where}: key 'models' must be a non-empty list of model ids")
    peers = payload.get("peers")
    if not isinstance(peers, Mapping) or set(peers) != set(models):
        raise ArtifactError(f"{where}: key 'peers' must map every model in 'models' to a peer "
                            f"model id, a list of them (a population) or null (models={models})")
    for m, p in peers.items():
        if p is not None and not isinstance(p, str) and not (
                isinstance(p, list) and p and all(isinstance(x, str) for x in p)):
            raise ArtifactError(f"{where}: peers.{m} must be a model id, a list of model ids or null")
    if payload.get("status") not in STATUSES:
        raise ArtifactError(f"{where}: key 'status' must be one of {STATUSES}, "
                            f"got {payload.get('status')!r}")
    source = payload.get("peer_source")
    if source is not None and not (isinstance(source, str) and source.strip()):
        raise ArtifactError(f"{where}: key 'peer_source' must be null or a peer source's name ({PEER_SOURCES[1:]} "
                            f"or a plugin's), got {source!r}")
    if payload.get("peer_source") is None and any(p is not None for p in peers.values()):
        raise ArtifactError(f"{where}: key 'peer_source' must be 'live', 'stored' or 'mixed' "
                            f"when a model has a peer")
    if not isinstance(payload.get("compute", {}), Mapping):
        raise ArtifactError(f"{where}: key 'compute' must be a mapping (ComputeMeter.summary())")


def write_config(run_dir, config: Mapping) -> Path:
    """Write the resolved config as ``run_dir/config.yaml`` (atomic)."""
    path = Path(run_dir) / CONFIG
    _atomic_write(path, yaml.safe_dump(dict(config), sort_keys=False))
    return path


def write_eval(run_dir, model_id: str, payload: Mapping, *, folder=None) -> Path:
    """Write one model's eval as ``run_dir/eval/<model>.json``, or ``folder/<model>.json``
    (validated, atomic). The only writer of eval files: the trainer's final evaluation and
    ``graftzoo eval`` both write through ``graftzoo.eval.evaluate.evaluate_and_write``."""
    path = Path(folder if folder is not None else Path(run_dir) / EVAL_DIR) / eval_file_name(model_id)
    validate_eval(payload, str(path))
    if payload["model"] != model_id:
        raise ArtifactError(f"{path}: payload model {payload['model']!r} != {model_id!r}")
    _atomic_write(path, json.dumps(payload, indent=2))
    return path


def write_summary(run_dir, payload: Mapping) -> Path:
    """Write ``run_dir/summary.json`` (validated, atomic)."""
    path = Path(run_dir) / SUMMARY
    validate_summary(payload, str(path))
    _atomic_write(path, json.dumps(payload, indent=2))
    return path


def append_metrics(run_dir, record: Mapping) -> None:
    """Append one (step, model) record as a line of ``run_dir/metrics.jsonl``."""
    path = Path(run_dir) / METRICS
    _check_metrics_record(record, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(dict(record)) + "\n")
        f.flush()


def _check_metrics_record(record: Any, where: str) -> None:
    if not isinstance(record, Mapping):
        raise ArtifactError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if not isinstance(record.get(M.STEP), int) or isinstance(record.get(M.STEP), bool):
        raise ArtifactError(f"{where}: key 'step' must be an integer")
    if not isinstance(record.get(M.MODEL), str):
        raise ArtifactError(f"{where}: key 'model' must be a string")


def _config_get(config: Mapping, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ArtifactError(f"config key '{dotted}' is missing")
        node = node[part]
    return node


def make_summary(config: Mapping, *, models: list, peers: Mapping, status: str,
                 compute: Optional[Mapping] = None, peer_source: Optional[str] = None,
                 peer_run_compute: Optional[Mapping] = None, error: Optional[str] = None,
                 placement: Optional[Mapping] = None) -> dict:
    """Build a ``summary.json`` payload from the resolved config plus what the trainer knows (``error``: one line
    saying why a run failed or was interrupted; ``placement``: where each model's weights, optimizer state, engine
    and KV cache lived, graftzoo.training.planner.placement.describe)."""
    payload = {
        "name": _config_get(config, "run.name"),
        "algo": _config_get(config, "algo.name"),
        "variant": _config_get(config, "run.variant"),
        "pair": _config_get(config, "pair.name"),
        "seed": _config_get(config, "run.seed"),
        "models": list(models),
        "peers": dict(peers),
        "peer_source": peer_source,
        "rollout_n": _config_get(config, "rollout.n"),
        "status": status,
        "compute": dict(compute or {}),
        "peer_run_compute": None if peer_run_compute is None else dict(peer_run_compute),
        "error": error,
        "placement": None if placement is None else dict(placement),
    }
    validate_summary(payload, "summary built from config")
    return payload


@dataclass
class RunRecord:
    """The parsed pieces of one run directory."""

    path: Path
    config: dict
    summary: dict
    metrics: list = field(default_factory=list)   # metrics.jsonl records, file order
    evals: dict = field(default_factory=dict)     # model id -> eval payload

    @property
    def name(self) -> str:
        return self.summary["name"]

    @property
    def variant(self) -> str:
        return self.summary["variant"]

    @property
    def seed(self) -> int:
        return self.summary["seed"]

    @property
    def models(self) -> list:
        return self.summary["models"]

    @property
    def peers(self) -> dict:
        """model -> its peer (None for none); a population's several peers as one label, ``A + B``."""
        return {m: " + ".join(p) if isinstance(p, list) else p for m, p in self.summary["peers"].items()}

    @property
    def rollout_n(self) -> int:
        return self.summary["rollout_n"]

    @property
    def status(self) -> str:
        return self.summary["status"]

    def series(self, model: str, key: str) -> tuple:
        """(steps, values) of metric ``key`` for ``model``, in step order; records lacking it are skipped."""
        pts = sorted((r[M.STEP], float(r[key])) for r in self.metrics
                     if r[M.MODEL] == model and _is_number(r.get(key)))
        return [s for s, _ in pts], [v for _, v in pts]


def summary_status(run_dir) -> Optional[str]:
    """The ``status`` of a run directory's ``summary.json`` ("done" once training finished), or None when it has
    none that can be read (missing, torn, not an object)."""
    try:
        payload = json.loads((Path(run_dir) / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return payload.get("status") if isinstance(payload, dict) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def _read_metrics(path: Path) -> list:
    """The records of a metrics.jsonl; a torn last line (see module docstring) is dropped and said."""
    records = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):   # no newline after it: a torn write, see module docstring
                log.warning("%s: dropped a torn last line (%d characters), the write of a killed run; the %d "
                            "records before it are used", where, len(line), len(records))
                break
            raise ArtifactError(f"{where}: invalid JSON ({e.msg})") from None
        _check_metrics_record(rec, where)
        records.append(rec)
    return records


def load_run(run_dir) -> RunRecord:
    """Parse one run directory; ArtifactError names the offending file (and line / key)."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ArtifactError(f"{root}: not a directory")
    cfg_path, sum_path = root / CONFIG, root / SUMMARY
    for p in (cfg_path, sum_path):
        if not p.is_file():
            raise ArtifactError(f"{p}: missing (a run directory needs {CONFIG} and {SUMMARY})")
    try:
        config = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ArtifactError(f"{cfg_path}: invalid YAML ({e})") from None
    if not isinstance(config, dict):
        raise ArtifactError(f"{cfg_path}: expected a mapping at top level")
    summary = _read_json(sum_path)
    validate_summary(summary, str(sum_path))
    metrics = _read_metrics(root / METRICS) if (root / METRICS).is_file() else []
    evals = {}
    # the trainer's final evaluation, then a grid's evaluation of the cell (its comparison's setting) in its place
    for p in sorted((root / EVAL_DIR).glob("*.json")) + sorted((root / EVAL_DIR / GRID_EVAL_DIR).glob("*.json")):
        payload = _read_json(p)
        validate_eval(payload, str(p))
        if payload["model"] not in summary["models"]:
            raise ArtifactError(f"{p}: model {payload['model']!r} is not in {sum_path} "
                                f"models {summary['models']}")
        evals[payload["model"]] = payload
    return RunRecord(path=root, config=config, summary=summary, metrics=metrics, evals=evals)


def _is_run_dir(path: Path) -> bool:
    return (path / SUMMARY).is_file() or (path / CONFIG).is_file()


def find_run_dirs(path) -> list:
    """``path`` itself if it is a run dir, else every run dir below it (sorted)."""
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"{root}: not a directory")
    if _is_run_dir(root):
        return [root]
    found = []
    for here, dirs, _ in os.walk(root):
        here_p = Path(here)
        if _is_run_dir(here_p):
            found.append(here_p)
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    if not found:
        raise ArtifactError(f"{root}: no run directory (one holding {SUMMARY}) inside")
    return sorted(found)


def stored_peer_cost(path, model_id: str) -> dict:
    """Charged training cost of ``model_id`` in an earlier run: ``peer_run_compute`` for stored mode.

    ``path`` is that run's directory or its ``store/`` folder (as given to ``peer.path``).
    """
    root = Path(path)
    if not (root / SUMMARY).is_file() and (root.parent / SUMMARY).is_file():
        root = root.parent
    summary = _read_json(root / SUMMARY) if (root / SUMMARY).is_file() else None
    if summary is None:
        raise ArtifactError(f"{path}: no {SUMMARY} here or in the parent folder")
    validate_summary(summary, str(root / SUMMARY))
    if model_id not in summary["peers"]:
        raise ArtifactError(f"{root / SUMMARY}: model {model_id!r} not in {summary['models']}")
    return joint_charge(summary)[model_id]["charged"]


def stored_peers_cost(runs: Iterable) -> dict:
    """``peer_run_compute`` of a source that reads several earlier runs (one store per peer model,
    docs/algorithms.md#populations): ``stored_peer_cost`` of each (path, model), added up."""
    costs = [stored_peer_cost(path, model) for path, model in runs]
    return {k: math.fsum(float(c.get(k) or 0.0) for c in costs) for k in FIELDS}


def load_runs(paths: Iterable) -> list:
    """Load run dirs given directly or found below parent folders; each run once."""
    runs, seen = [], set()
    for p in paths:
        for d in find_run_dirs(p):
            key = d.resolve()
            if key not in seen:
                seen.add(key)
                runs.append(load_run(d))
    return runs
