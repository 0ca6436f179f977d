"""A run directory belongs to one run: a lock, the run's identity, and starting over without loss.

- **Lock** (``RUN/.lock``, ``fcntl.flock``): one process per run directory. The file names the holder (PID, host,
  start time); a second process gets a one-line error naming it. The kernel releases the lock when its process
  dies, so a lock file left by a dead process is taken over, and the take-over is said.
- **Identity**: resuming compares the requested config with the stored ``config.yaml`` on every key that can change
  the training trajectory (everything except the keys in ``FREE_TO_CHANGE``: run length, checkpoint/eval
  cadence, logging, labels) and refuses with the differing keys listed, unless the caller allows them by name
  (``--allow-config-change KEY``, shell-style patterns such as ``optim.*`` accepted).
- **Starting over** (``--no-resume``) in a directory that holds a run refuses unless ``overwrite``: the old run is
  then moved aside to a sibling ``RUN.replaced-<time>`` folder, never deleted. A resume that finds no intact
  checkpoint where some failed their check refuses too (``resume_checkpoint``): starting over would rewrite the
  run's metrics and store.
- **A rerun never rewrites what a run did** (``rerun_plan``): it continues (more steps, the final evaluation it
  lacks), does nothing (a finished run asked for no more: no file is rewritten, so a report read meanwhile still
  sees it done), or is refused in one line naming the key (fewer steps, other evaluation settings once it has
  evaluated, another label, another ``rollout.max_staleness``). A finished run extended keeps its final evaluation
  aside (``keep_final_evaluation``).
- **A stored peer is another run**: a peer store inside the run directory is refused (``check_peer_path``) before
  anything is moved.
"""
from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import re
import socket
import time
from pathlib import Path, PurePath
from typing import Iterable, Optional

from graftzoo.training.run.checkpoint import CHECKPOINTS, list_checkpoints, prepare_resume, set_aside_checkpoints
from graftzoo.contract.config import (FREE_TO_CHANGE, HOSTING_MODEL_KEYS, MAX_RUN_NAME, RunConfig, as_dict,
                                      defaults, read_yaml)
from graftzoo.contract.layout import STORE
from graftzoo.contract.names import label_slug
from graftzoo.contract.peer_sources import peer_source_kind
from graftzoo.eval.artifacts import CONFIG, summary_status

log = logging.getLogger("graftzoo")

LOCK_FILE = ".lock"



class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (held by another process, holds another run, ...)."""


class RunLockedError(RunDirError):
    """Another live process holds the run directory's lock."""


class RunDirUsageError(RunDirError):
    """The request contradicts what the run directory holds (a changed config, --no-resume over a run): a usage
    error, the message says which option resolves it."""


# ------------------------------------------------------------------------------------------------
# lock
# ------------------------------------------------------------------------------------------------

class RunLock:
    """An exclusive ``flock`` on ``RUN/.lock`` for the life of a run (``release`` or process exit ends it)."""

    def __init__(self, run_dir):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLockedError(f"{self.path.parent}: in use by {holder or 'another process'} "
                                 f"(lock file {self.path}); wait for it to finish or stop that process") from None
        previous = _read_holder(fd)
        if previous:
            log.warning("%s: took over the lock left by %s, which is no longer running", self.path.parent, previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty lock file: released cleanly, nothing to take over
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "null")
    except (OSError, ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(info, dict):
        return ""
    return f"pid {info.get('pid')} on host {info.get('host')} (since {info.get('since')})"


# ------------------------------------------------------------------------------------------------
# what a run directory holds
# ------------------------------------------------------------------------------------------------

def _safe(text: str) -> str:
    """``text`` as a file-name part: runs of characters other than letters, digits, ``.`` and ``_`` become one ``-``
    (``=`` and brackets are dropped: ``my.v2 data`` -> ``my.v2-data``); case is kept (a path's folder name)."""
    text = re.sub(r"[=()\[\]{}'\"]", "", str(text))
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-.") or "x"


# keys a default run name shows in words (or that name it): its hash leaves them out
NAMED_KEYS = ("run.seed", "run.variant", "run.name", "algo.name", "pair.name", "pair.train", "task.dataset",
              "peer.source", "peer.path")


def free_to_change(key: str) -> bool:
    """Whether ``key`` is one of ``FREE_TO_CHANGE`` (a pattern of it): it does not change the trajectory."""
    return any(fnmatch.fnmatchcase(key, pat) for pat in FREE_TO_CHANGE)


def name_settings(cfg: RunConfig) -> dict:
    """What a default run name's hash stands for: the keys the user set beyond the pair file and the algorithm
    preset (``--set``, ``-c FILE``, ``--peer``, ...: ``RunConfig.beyond_preset``, to a value the pair and preset do
    not give) that change the trajectory (not ``FREE_TO_CHANGE``) and that the name does not show in words
    (``NAMED_KEYS``); key -> resolved value, sorted by key."""
    return {k: v for k, v in cfg.beyond_preset.items() if k not in NAMED_KEYS and not free_to_change(k)}


def settings_hash(settings: dict) -> str:
    """8 hex digits of the sha256 of ``settings`` as sorted JSON: the same settings give the same hash anywhere."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def name_note(name: str, cfg: RunConfig) -> Optional[str]:
    """The line that says what the hash of the default run name ``name`` stands for; None when it has none."""
    said = name_settings(cfg)
    if not said:
        return None
    keys = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in said.items())
    return f"run name {name}: {keys} (set beyond the pair and preset; --set run.name=NAME to choose one)"


def default_run_name(cfg: RunConfig) -> str:
    """The run name when ``run.name`` is null: everything that tells runs of different configurations apart, readable
    and filesystem-safe: ``ALGO[-VARIANT][-MODELS]-PAIR[-DATA][-PEER][-HASH]-sSEED``, e.g. ``graft-tiny-online-s0``,
    ``grpo-n8-micro-s0`` (preset grpo_n8: its label, run.variant "GRPO (n=8)", replaces the algorithm's name),
    ``grpo-tiny-gpt2-pair-tiny-s0`` (pair.train a subset, named as the grid names a per-model cell),
    ``graft-tiny-qwen-char-tiny-stored-grpo-B-s0`` (peer.source stored / mixed + the stored run's folder name),
    ``grpo-mine-my-s0`` (task.dataset my.jsonl: the data's name follows the pair's),
    ``grpo-tiny-3f9a1c2d-s0`` (``--set optim.lr=3e-4``: HASH, ``settings_hash`` of ``name_settings``, stands for
    the trajectory-changing keys set beyond the pair and preset; none, no hash). The variant and the models are
    named by ``label_slug``, as a grid names its cells, so the same preset, models, pair and seed get the same name
    from ``graftzoo train`` and from a grid. A config that ``load_config`` did not build has no record of what was
    set beyond the preset: no hash."""
    run, pair, peer = cfg.run, cfg.pair, cfg.peer
    algo = label_slug(cfg.algo.name) or "x"
    parts = [algo]
    if run.variant:
        variant = label_slug(run.variant) or "x"
        parts = [variant]  # the label names the method, as a grid names its cells
    ids = [m.id for m in pair.models]
    train = list(pair.train or [])
    if train and sorted(train) != sorted(ids):  # as a grid's each_model cell: the id's last part
        short = [label_slug(m.split("/")[-1]) for m in ids]
        whole = len(set(short)) < len(short)  # org-a/m and org-b/m: the whole ids tell them apart
        parts.append("+".join(label_slug(m if whole else m.split("/")[-1]) or "x" for m in train))
    parts.append(_safe(pair.name or "pair"))
    dataset = cfg.task.dataset
    if dataset:  # a file, folder or Hub name: its last part without the suffix (my.jsonl -> my)
        parts.append(_safe(PurePath(str(dataset).rstrip("/")).stem or dataset))
    source = peer.source
    if source != "none":
        where = Path(str(peer.path or ""))
        if where.name == STORE:  # RUN/store names the run RUN
            where = where.parent
        reads = peer_source_kind(source).reads_run  # the earlier run it reads is part of the name
        parts.append(source + (f"-{_safe(where.name)}" if where.name and reads else ""))
    settings = name_settings(cfg)
    if settings:
        parts.append(settings_hash(settings))
    parts.append(f"s{run.seed}")
    name = "-".join(parts)
    if len(name) > MAX_RUN_NAME:  # long ids or data names: cut, and keep configurations apart by a hash
        name = f"{name[:MAX_RUN_NAME - 13]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return name


def resume_checkpoint(run_dir) -> Optional[Path]:
    """The checkpoint a resume continues from (``prepare_resume``: leftovers removed, failing ones renamed aside), or
    None for a run that saved none. Refuses (``RunDirUsageError``) when no intact one is left but some failed their
    check: starting over would replace the run's metrics and store; ``--overwrite`` moves the run aside first."""
    ck = prepare_resume(run_dir)
    corrupt = set_aside_checkpoints(run_dir) if ck is None else []
    if corrupt:
        raise RunDirUsageError(
            f"{run_dir}: no intact checkpoint to resume from ({', '.join(p.name for p in corrupt)} failed their "
            f"check and are kept in {Path(run_dir) / CHECKPOINTS}); pass --overwrite to move this run aside and "
            f"start over, or choose another run.name (--set run.name=NAME)")
    return ck


def check_peer_path(run_dir, peer_path) -> None:
    """Refuse (``RunDirUsageError``) a stored peer (``peer.path``) that lies inside ``run_dir``: a run's own store is
    not another run's trajectories, and ``--overwrite`` would move it aside under the peer."""
    if not peer_path:
        return
    run, peer = Path(run_dir).resolve(), Path(peer_path).resolve()
    if peer == run or run in peer.parents:
        raise RunDirUsageError(f"config key 'peer.path' ({peer_path}) is inside this run's own directory {run_dir}: "
                               f"a stored peer is the store of another run; give that run's directory (a run "
                               f"moved aside by --overwrite is {Path(run_dir).name}.replaced-<time>)")


def move_aside(run_dir) -> Path:
    """Rename ``run_dir`` to a free sibling ``<name>.replaced-<YYYYmmdd-HHMMSS>[-k]`` and return the new path."""
    d = Path(run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = d.with_name(f"{d.name}.replaced-{stamp}")
    k = 1
    while target.exists():
        target = d.with_name(f"{d.name}.replaced-{stamp}-{k}")
        k += 1
    os.rename(d, target)
    return target


def flatten(cfg: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and free-form maps of specs stay values)."""
    out = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key not in ("pair.models",):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_changes(stored: dict, requested: dict) -> dict:
    """Trajectory-relevant keys whose value differs: key -> (stored, requested). A key that the stored config
    lacks (added by a later release) and that is requested at its default is no change."""
    a, b = flatten(stored), flatten(requested)
    for flat in (a, b):  # where a model runs is not what it learns: its hosting keys are free to change
        if isinstance(flat.get("pair.models"), list):
            flat["pair.models"] = [{k: v for k, v in m.items() if k not in HOSTING_MODEL_KEYS} if isinstance(m, dict)
                                   else m for m in flat["pair.models"]]
    declared = flatten(defaults())
    out = {}
    for key in sorted(set(a) | set(b)):
        if free_to_change(key):
            continue
        if key not in a and key in declared and b.get(key) == declared[key]:
            continue
        if a.get(key) != b.get(key):
            out[key] = (a.get(key), b.get(key))
    return out


# ------------------------------------------------------------------------------------------------
# a rerun's contract (docs/reliability.md#what-a-rerun-may-change)
# ------------------------------------------------------------------------------------------------

LENGTH_KEYS = ("run.steps", "run.epochs")    # how long the run trains: a rerun may raise it, never cut it
FINAL_EVAL_KEY = "run.eval_at_end"          # a final evaluation: a rerun may add one, never take one away
EVAL_KEYS = ("eval.*",)                      # how the run evaluates: fixed once it has evaluated
LABEL_KEYS = ("run.variant",)               # the report's label of the run: fixed
STALENESS_KEY = "rollout.max_staleness"     # which policy version decodes each step: fixed (0 allowed, by name)
RERUN_KEYS = LENGTH_KEYS + (FINAL_EVAL_KEY,) + EVAL_KEYS + LABEL_KEYS + (STALENESS_KEY,)
"""The keys a summary, a report or a resume reads that a rerun could otherwise change freely (``rerun_plan``); every
other key that changes the trajectory is refused by ``check_resume_config`` unless allowed by name."""

EVAL_METRIC_PREFIX = "eval/"  # metrics.jsonl keys of an evaluation (graftzoo.eval.evaluate.eval_metrics)


class Rerun:
    """What a rerun of an existing run does (``rerun_plan``): ``action`` "continue" (train on from its last
    checkpoint: more steps, or the final evaluation it lacks) or "nothing" (a no-op, ``reason`` says why);
    ``changes``: the config changes it continues under (``check_resume_config``); ``extends``: it continues a
    finished run (its final evaluation, if any, is kept aside: ``keep_final_evaluation``)."""

    def __init__(self, action: str, reason: str = "", changes: Optional[dict] = None, extends: bool = False):
        self.action, self.reason, self.changes, self.extends = action, reason, dict(changes or {}), extends


def steps_done(run_dir) -> int:
    """Steps a run has checkpointed: its newest complete checkpoint's step + 1 (0 without one)."""
    done = list_checkpoints(run_dir)
    return int(done[-1].name.split("_")[-1]) + 1 if done else 0


def evaluated(run_dir) -> bool:
    """Whether a run has logged an evaluation: an ``eval/*`` metric in ``metrics.jsonl`` (before training, every
    ``run.eval_every`` steps, at the end) or an evaluation file in ``RUN/eval`` (its own or a grid's)."""
    d = Path(run_dir)
    if any(d.joinpath("eval").glob("*.json")) or any(d.joinpath("eval", "grid").glob("*.json")):
        return True
    path = d / "metrics.jsonl"
    if not path.is_file():
        return False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and any(k.startswith(EVAL_METRIC_PREFIX) and v is not None for k, v in rec.items()):
            return True
    return False


def _matching(flat: dict, patterns) -> dict:
    return {k: v for k, v in flat.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def rerun_plan(run_dir, requested: RunConfig, total_of, allow: Iterable[str] = ()) -> Rerun:
    """What rerunning ``run_dir`` under ``requested`` does, by one rule: what a run has done is never rewritten. It
    continues (more steps, the final evaluation it lacks, the same settings otherwise), does nothing (``Rerun``
    "nothing", with the reason), or is refused in one line (``RunDirUsageError``) naming the key and what to do.
    ``total_of(flat_config)``: the steps a config trains (``run.steps``, or ``run.epochs`` times the steps of an
    epoch). The keys (``RERUN_KEYS``) and what each allows are in docs/reliability.md#what-a-rerun-may-change; every
    other trajectory key goes through ``check_resume_config`` (refused unless ``allow`` names it)."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return Rerun("continue")
    try:
        stored = flatten(read_yaml(path))
    except (OSError, ValueError, AttributeError):
        return Rerun("continue")  # an unreadable config.yaml: check_resume_config names the file
    asked = flatten(as_dict(requested))
    what = "--overwrite to start it over (the old run is moved aside) or another run.name (--set run.name=NAME)"

    # which policy version decodes each step (rollout.max_staleness): lowering it to 0, by name, alone continues
    # exactly (every later step decodes its own rollouts); any other change decodes later steps by versions that no
    # run of either value uses
    old_k, new_k = stored.get(STALENESS_KEY, 0) or 0, asked.get(STALENESS_KEY, 0) or 0
    if old_k != new_k and not (new_k == 0 and any(fnmatch.fnmatchcase(STALENESS_KEY, p) for p in allow or ())):
        raise RunDirUsageError(
            f"{run_dir}: config key '{STALENESS_KEY}' cannot change on a rerun ({old_k!r} -> {new_k!r}): its steps "
            f"after the last checkpoint would be decoded by other policy versions than a run with either value "
            f"decodes them (lowering it to 0 with --allow-config-change {STALENESS_KEY} continues with rollouts in "
            f"turn); pass {what}")
    changes = check_resume_config(run_dir, requested, allow)

    for key in LABEL_KEYS:
        if stored.get(key) != asked.get(key) and key in stored:
            raise RunDirUsageError(
                f"{run_dir}: config key '{key}' ({stored.get(key)!r} -> {asked.get(key)!r}) is the label the run's "
                f"summary and reports carry for what it has done; a rerun keeps it: leave it out, or pass {what}")

    done, status = steps_done(run_dir), summary_status(run_dir)
    old_total, new_total = total_of(stored), total_of(asked)
    length_key = "run.epochs" if asked.get("run.epochs") else "run.steps"
    if new_total < done:
        raise RunDirUsageError(
            f"{run_dir}: config key '{length_key}' ({asked.get(length_key)!r}) asks for {new_total} steps and the run "
            f"has trained {done}: a rerun never cuts a run (its checkpoints, metrics and evaluation stay as they "
            f"are); pass {what}, or evaluate an earlier checkpoint with graftzoo eval --ckpt")

    finished = status == "done" and done >= old_total
    has_final = bool(stored.get(FINAL_EVAL_KEY))
    wants_final = bool(asked.get(FINAL_EVAL_KEY))
    nothing_more = finished and new_total == old_total and not (wants_final and not has_final)

    # the evaluation settings are the ones the run has evaluated under, once it has (unless nothing is evaluated)
    declared = flatten(defaults())
    eval_changes = {k: (stored.get(k), asked.get(k)) for k in sorted(set(_matching(stored, EVAL_KEYS))
                                                                      | set(_matching(asked, EVAL_KEYS)))
                    if stored.get(k) != asked.get(k) and not (k not in stored and asked.get(k) == declared.get(k))}
    if eval_changes and not (nothing_more and not wants_final) and evaluated(run_dir):
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in eval_changes.items())
        raise RunDirUsageError(
            f"{run_dir}: the run has evaluated under other settings ({listed}); a rerun keeps them: evaluate it "
            f"under these with graftzoo eval --ckpt {run_dir} (written beside its own evaluation), or pass {what}")
    if nothing_more:
        reason = (f"it has trained its {done} steps" + (" and has its final evaluation" if has_final else "")
                  + ("; run.eval_at_end=false takes nothing away (the evaluation is kept)" if has_final
                     and not wants_final else ""))
        return Rerun("nothing", reason, changes)
    return Rerun("continue", changes=changes, extends=finished)


def keep_final_evaluation(run_dir, steps: int) -> Optional[Path]:
    """Before a finished run is extended: its final evaluation (``RUN/eval/*.json``, a grid's ``RUN/eval/grid/*.json``)
    moved to ``RUN/eval/after_<steps>_steps/``, kept as the evaluation of the run as it was, out of the reports'
    way (they read the run's final evaluation, which the extended run writes anew). The folder, or None when there
    was nothing to keep."""
    root = Path(run_dir) / "eval"
    files = sorted(root.glob("*.json")) + sorted((root / "grid").glob("*.json"))
    if not files:
        return None
    target = root / f"after_{steps}_steps"
    for f in files:
        dest = target / f.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f, dest)
    return target


def check_resume_config(run_dir, requested: RunConfig, allow: Iterable[str] = ()) -> dict:
    """Refuse (``RunDirUsageError``) to resume ``run_dir`` under a config whose trajectory-relevant keys differ
    from its stored ``config.yaml``, unless every differing key matches a pattern of ``allow``. Returns the
    allowed changes (key -> (old, new)); nothing when the directory has no stored config."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return {}
    changes = config_changes(read_yaml(path), as_dict(requested))
    allow = list(allow or ())
    refused = {k: v for k, v in changes.items() if not any(fnmatch.fnmatchcase(k, p) for p in allow)}
    if refused:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise RunDirUsageError(
            f"{run_dir}: resuming with a changed config ({listed}); pass --allow-config-change "
            f"{','.join(refused)} to continue the run under the new values, --overwrite to start a new run "
            f"(the old one is moved aside), or another run.name (--set run.name=NAME)")
    return changes
