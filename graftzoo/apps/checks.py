"""What the commands refuse before they import torch: a bad path, file or checkpoint is one ``Error:`` line naming
it, in about the time Python takes to start (docs/reliability.md#one-line-per-error). Everything here reads files
with pathlib, json and yaml only (gymnasium and pyarrow for the task's data); the trainer, ``evaluate_checkpoint``
and ``export_run`` check the same again, and more (a checkpoint's files against its manifest, hub models and
datasets, a stored peer's contents), for the Python API.

- ``check_train``: ``graftzoo train``'s run config: the local folder of every trained ``kind: hf`` model
  (``graftzoo.contract.config.model_folder``), the task's data when the config names the user's own files
  (``graftzoo.envs.task.Task.check``: a missing file, a broken row with its line), a stored or mixed peer's store
  and the place of the run directory;
- ``eval_target`` / ``export_target``: the run directory or checkpoint of ``graftzoo eval --ckpt`` and
  ``graftzoo export``, and a run that holds a complete checkpoint to evaluate or export.

Each refusal says what the heavy path would say (same words, same exit code: ``ConfigError`` 2, a missing file 1).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import re
from pathlib import Path
from typing import Optional

import yaml

from graftzoo.contract.config import RunConfig, check_model_folders
from graftzoo.contract.errors import ConfigError, did_you_mean
from graftzoo.contract.layout import (CHECKPOINTS, CONFIG, MANIFEST, METRICS, STORE,  # noqa: F401
                                      SUMMARY, TRAINER_FILE, holds_run)
from graftzoo.contract.peer_sources import peer_source_kind

STEP_NAME = re.compile(r"^step_(\d+)$")


@contextlib.contextmanager
def _warnings_off(name: str):
    """The logger ``name`` silent inside the block (the trainer checks again and says its warnings then, once)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_data(cfg: RunConfig) -> None:
    """The task's data (``graftzoo.envs.task.Task.check``) when a dataset the run reads is the user's own file or
    folder (``task.dataset``, ``eval.dataset``, ``eval.val_dataset``, an ``eval.benchmarks`` entry); bundled and
    Hub datasets are left to the trainer."""
    from graftzoo.envs.datasets import is_user_data  # pyarrow: only the commands that read data
    from graftzoo.envs.task import HELDOUT, Task, resolve_benchmarks  # gymnasium: only the commands that read data
    ev = cfg.eval
    names = [cfg.task.dataset, ev.dataset, ev.val_dataset]
    try:
        names += resolve_benchmarks(ev.benchmarks) if ev.benchmarks else []
    except ValueError:  # Task.check refuses it, naming eval.benchmarks
        names.append(str(ev.benchmarks))
    if any(is_user_data(n) for n in names if n and n != HELDOUT):
        with _warnings_off("graftzoo.envs.task"):
            Task(cfg).check()


def check_peer_source(cfg: RunConfig) -> None:
    """The pre-flight check the peer source declares (a stored or mixed peer: ``peer.path`` holds a trajectory store
    with the model ``peer.model`` names), before any heavy import."""
    kind = peer_source_kind(cfg.peer.source)
    if kind is not None and kind.check is not None:
        kind.check(cfg)


def check_run_place(run_dir) -> None:
    """The run directory can be made: the nearest of it and its parents that exists is a folder."""
    target = Path(run_dir)
    for p in (target, *target.parents):
        try:
            found = p.exists()
        except PermissionError as e:  # a folder on the way this user may not enter: the run directory named
            raise PermissionError(errno.EACCES, f"{e.strerror} (at {p})", str(target)) from None
        if found:
            if not p.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"a file, not a folder: no run directory {target} can be "
                                                        f"made there", str(p))
            return


def check_train(cfg: RunConfig, run_dir: Optional[str] = None) -> None:
    """What ``graftzoo train`` refuses before it imports torch (module docstring), in the trainer's order: the data,
    the models' folders, the stored peer, then the run directory's place (``--run-dir``, else ``run.out_dir`` and
    ``run.name`` where it is set)."""
    check_data(cfg)
    check_model_folders(cfg)
    check_peer_source(cfg)
    named = Path(cfg.run.out_dir) / cfg.run.name if cfg.run.name else cfg.run.out_dir  # the default name: torch's
    check_run_place(run_dir or named)


def check_fresh_start(cfg: RunConfig, run_dir: Optional[str]) -> None:
    """``graftzoo train --no-resume`` without ``--overwrite`` into a folder that holds a run: refused in the
    trainer's words (``RunDirUsageError``) before torch, where the folder is known without the default run name
    (``--run-dir``, or ``run.name`` set); the trainer refuses the rest."""
    where = run_dir or (Path(cfg.run.out_dir) / cfg.run.name if cfg.run.name else None)
    if where is not None and holds_run(where):
        raise ConfigError(f"{where}: holds a run; --no-resume would mix the new run with it: pass --overwrite to move "
                          f"the old run aside and start over, drop --no-resume to resume it, or choose another "
                          f"run.name (--set run.name=NAME)")


def is_checkpoint(path: Path) -> bool:
    """``RUN/checkpoints/step_N`` holding its manifest (or an older graftzoo's ``trainer.pt``): a complete one."""
    return (path.parent.name == CHECKPOINTS and bool(STEP_NAME.match(path.name))
            and ((path / MANIFEST).is_file() or (path / TRAINER_FILE).is_file()))


def checkpoint_steps(run_dir: Path) -> list:
    """The steps of a run's complete checkpoints, oldest first (not verified against their manifests)."""
    root = run_dir / CHECKPOINTS
    found = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    return sorted(int(STEP_NAME.match(p.name).group(1)) for p in found if is_checkpoint(p))


def run_target(path) -> tuple:
    """(run directory, checkpoint or None) that ``path`` names: a checkpoint folder or a run directory holding its
    ``config.yaml`` (as ``graftzoo.training.eval_checkpoints.resolve_target`` and ``load_run_config`` say)."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such directory (expected a run dir or RUN/checkpoints/step_N)")
    if is_checkpoint(p):
        run, ckpt = p.parent.parent, p
    elif (p / CONFIG).is_file():
        run, ckpt = p, None
    else:
        raise ConfigError(f"{p}: neither a run directory ({CONFIG}) nor a checkpoint ({MANIFEST}, or {TRAINER_FILE} "
                          f"of an older graftzoo)")
    if not (run / CONFIG).is_file():
        raise FileNotFoundError(f"{run / CONFIG}: missing; {run} is not a graftzoo run directory")
    try:
        yaml.safe_load((run / CONFIG).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:  # a runtime error (exit 1), as reading the run would give
        raise OSError(f"{run / CONFIG}: invalid YAML ({' '.join(str(e).split())})") from None
    return run, ckpt


def check_benchmark_files(benchmarks: Optional[str]) -> None:
    """``graftzoo eval --benchmarks``: each entry that is the user's own file or folder loads (a missing file, a broken
    row; an unknown name), refused in the words of graftzoo.training.eval_runner.check_benchmarks; bundled and Hub
    datasets are left to it."""
    from graftzoo.envs.datasets import BENCHMARKS, bundled_names, is_user_data  # pyarrow: only eval reads data
    from graftzoo.envs.task import HELDOUT, LOAD_ERRORS, load_labelled, resolve_benchmarks  # gymnasium: eval only
    try:
        names = resolve_benchmarks(benchmarks) if benchmarks else []
    except ValueError:  # evaluate_checkpoint says so
        return
    known = [HELDOUT, "all", *BENCHMARKS, *bundled_names()]
    for name in names:
        if name in known or not is_user_data(name):
            continue
        try:
            load_labelled(name)
        except LOAD_ERRORS as e:
            text = " ".join(str(e).split()) or type(e).__name__
            hint = did_you_mean(name, dict.fromkeys(known)) if not Path(name).exists() else ""
            raise ConfigError(f"--benchmarks {name!r}{hint}: {text}") from None


def eval_target(path, benchmarks: Optional[str] = None) -> None:
    """``graftzoo eval --ckpt PATH [--benchmarks B]``: a checkpoint, or a run directory with a complete checkpoint to
    choose from; the benchmark files of ``B`` (``check_benchmark_files``)."""
    run, ckpt = run_target(path)
    if ckpt is None and not checkpoint_steps(run):
        raise FileNotFoundError(f"{run / CHECKPOINTS}: no complete checkpoint to evaluate")
    check_benchmark_files(benchmarks)


def export_target(path, step: Optional[int] = None) -> None:
    """``graftzoo export PATH [--step N]``: a checkpoint, or a run directory with a complete checkpoint (of step N)."""
    run, ckpt = run_target(path)
    if ckpt is not None:
        return
    steps = checkpoint_steps(run)
    if step is not None and step not in steps:
        have = ", ".join(map(str, steps)) or "none"
        raise ConfigError(f"--step {step}: no complete checkpoint of that step in {run} (steps: {have})")
    if not steps:
        raise FileNotFoundError(f"{run}: no intact checkpoint to export")

