"""Running a grid's cells: each cell's status, the child-process and in-process runners, and the scheduler.

A cell's child process dies with the grid: on Linux the kernel kills it when the grid process dies
(``PR_SET_PDEATHSIG``, even on ``kill -9``); SIGTERM or SIGINT to the grid is passed on to each running child by PID
(the trainer finishes its step, saves a checkpoint and stops; a second signal stops it at once), no new cell starts,
and the grid exits 128 + signal. A rerun resumes the cells that were stopped or killed.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import inspect
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

from graftzoo.apps.grid.model import Cell, Grid, GridError, cell_names, resolve_clips
from graftzoo.training.run.checkpoint import checkpoint_step, latest_checkpoint
from graftzoo.api import train_run as train
from graftzoo.contract.config import as_dict, read_yaml
from graftzoo.envs.verify_worker import die_with_parent
from graftzoo.eval.artifacts import CONFIG, EVAL_DIR, GRID_EVAL_DIR, eval_file_name, summary_status
from graftzoo.eval.report import COMPARABLE_KEYS, clip_fraction_table, log_table_to_wandb
from graftzoo.training.eval_checkpoints import load_run_config, trained_specs
from graftzoo.eval.evaluate import eval_request
from graftzoo.training.eval_runner import evaluate_checkpoint
from graftzoo.training.run.rundir import config_changes, flatten

logger = logging.getLogger("graftzoo")


# ---------------------------------------------------------------------------------------------
# status of a cell
# ---------------------------------------------------------------------------------------------

def grid_eval_dir(cell: Cell) -> Path:
    """Where the grid's evaluation of a cell goes (``RUN/eval/grid``; the report prefers it to the trainer's)."""
    return cell.run_dir / EVAL_DIR / GRID_EVAL_DIR


def eval_done(cell: Cell, options: dict) -> bool:
    """Whether every trained model has an eval file that answers this grid's eval request."""
    cfg = load_run_config(cell.run_dir)
    keys = set(inspect.signature(eval_request).parameters) - {"cfg"}
    want = eval_request(cfg, **{k: v for k, v in options.items() if k in keys})
    for spec in trained_specs(cfg):
        p = grid_eval_dir(cell) / eval_file_name(spec.id)
        try:
            if json.loads(p.read_text(encoding="utf-8")).get("request") != want:
                return False
        except (OSError, json.JSONDecodeError):
            return False
    return True


def cell_status(cell: Cell, eval_options: Optional[dict]) -> str:
    """``done`` | ``evaluate`` (trained, eval pending) | ``resume`` | ``new``."""
    status = summary_status(cell.run_dir)
    if status == "done":
        return "done" if eval_options is None or eval_done(cell, eval_options) else "evaluate"
    return "resume" if cell.run_dir.is_dir() and any(cell.run_dir.iterdir()) else "new"


def config_drift(cell: Cell) -> dict:
    """key -> (old, new): where a trained cell's stored config differs from what the grid would run now: the keys a
    resume may not change (``graftzoo.training.run.rundir.config_changes``) and the ones a report compares
    (``COMPARABLE_KEYS``: run length, eval k and set)."""
    path = cell.run_dir / CONFIG
    if not path.is_file():
        return {}
    old, new = read_yaml(path), as_dict(cell.config())
    drift = config_changes(old, new)
    a, b = flatten(old), flatten(new)
    drift.update({k: (a.get(k), b.get(k)) for k in COMPARABLE_KEYS if a.get(k) != b.get(k)})
    return dict(sorted(drift.items()))


def changed_cells(cells: list) -> dict:
    """cell name -> what changed, for the finished cells that ran with other settings than the grid's now (or after
    a peer cell that reruns): they would be reported under settings they did not use."""
    out: dict = {}
    for c in cells:   # dependencies first (order_cells)
        if summary_status(c.run_dir) != "done":
            continue
        drift = "; ".join(f"{k}: {old!r} → {new!r}" for k, (old, new) in config_drift(c).items())
        rerun = [d for d in c.depends if d in out]
        if drift or rerun:
            out[c.name] = drift or f"its peer cell {', '.join(rerun)} reruns"
    return out


def check_changed(grid: Grid, cells: list, rerun_changed: bool) -> dict:
    """``changed_cells``; a GridError naming them and what changed unless ``rerun_changed``."""
    changed = changed_cells(cells)
    if changed and not rerun_changed:
        by_change: dict = {}
        for c in cells:
            if c.name in changed:
                by_change.setdefault(changed[c.name], []).append(c)
        listed = "; ".join(f"{cell_names(group)} ({what})" for what, group in by_change.items())
        raise GridError(f"{grid.path}: finished cells ran with other settings than the grid's now: {listed}; pass "
                        f"--rerun-changed to rerun them from the start (each old run is moved aside to "
                        f"CELL.replaced-<time>), or restore the settings")
    return changed


def resume_note(cell: Cell) -> str:
    """Where a ``resume`` cell's training picks up."""
    ckpt = latest_checkpoint(cell.run_dir)
    return (f"training resumes from its last checkpoint (step {checkpoint_step(ckpt)})" if ckpt is not None
            else "no checkpoint yet: training starts from the beginning")


# ---------------------------------------------------------------------------------------------
# running one cell
# ---------------------------------------------------------------------------------------------

def eval_command(cell: Cell, options: dict) -> list:
    """``graftzoo eval`` on the cell's run directory with the grid's eval options."""
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", "eval", "--ckpt", str(cell.run_dir),
           "--out", str(grid_eval_dir(cell))]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "allow_test_selection":
            cmd += [flag] if value else []
        elif key == "greedy":
            cmd += ["--greedy" if value else "--no-greedy"]
        elif value is not None:
            cmd += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return cmd


_CHILDREN: dict = {}   # pid -> Popen: the cells' running child processes
_STOP: dict = {"signum": None}   # the signal that stops the grid (``stop_children_on_signal``)


def _die_with_grid() -> Optional[Callable]:
    """A ``preexec_fn`` (Linux): the kernel SIGKILLs the child when the grid's thread that started it dies; the
    child exits at once (status 1) if the grid is already gone. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    return functools.partial(die_with_parent, os.getpid(), 1)


def _run_logged(cmd: list, log: Path) -> int:
    """Run ``cmd`` with its output in ``log``. Its own process group: a Ctrl-C reaches the grid only, which
    passes it on (``stop_children_on_signal``)."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_grid())
        _CHILDREN[proc.pid] = proc
        if _STOP["signum"]:   # the signal came while it started
            proc.terminate()
        try:
            return proc.wait()
        finally:
            _CHILDREN.pop(proc.pid, None)


class GridInterrupted(KeyboardInterrupt):
    """The grid stopped on SIGTERM / SIGINT (exit code 128 + signal); its stopped cells resume on a rerun."""

    def __init__(self, signum: int, stopped: list, not_started: list):
        self.exit_code = 128 + int(signum)
        text = f"grid interrupted by {signal.Signals(signum).name}"
        text += f"; stopped: {', '.join(stopped)}" if stopped else ""
        text += f"; not started: {', '.join(not_started)}" if not_started else ""
        super().__init__(text + "; rerun the same command to resume")


@contextlib.contextmanager
def stop_children_on_signal():
    """While active (main thread only): SIGTERM / SIGINT are passed on to every running cell child, by PID, as
    SIGTERM; yields a dict whose ``signum`` is set once a signal came."""
    state = _STOP
    state["signum"] = None
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handle(signum, frame):
        if state["signum"] is None:
            logger.warning("received %s: stopping the running cells (each saves a checkpoint; send it again to "
                           "stop them at once)", signal.Signals(signum).name)
        state["signum"] = state["signum"] or signum
        for pid in list(_CHILDREN):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        state["signum"] = None


def _tail(log: Path, n: int = 15) -> str:
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
    return "\n".join("    " + line for line in lines[-n:])


def run_cell_subprocess(cell: Cell, status: str, eval_options: Optional[dict], logs: Path) -> Optional[str]:
    """Train (unless only the eval is pending) then evaluate, each in a child process; None or why it failed."""
    log = logs / f"{cell.name}.log"
    train_cmd = cell.train_command() + (["--overwrite"] if status == "changed" else [])
    if status != "evaluate" and _run_logged(train_cmd, log) != 0:
        return f"training failed (log {log}):\n{_tail(log)}"
    if eval_options is not None and _run_logged(eval_command(cell, eval_options), log) != 0:
        return f"evaluation failed (log {log}):\n{_tail(log)}"
    return None


def run_cell_inprocess(cell: Cell, status: str, eval_options: Optional[dict], logs: Path) -> Optional[str]:
    """As :func:`run_cell_subprocess`, in this process (faster to start; a crash ends the grid)."""
    log = logs / f"{cell.name}.log"
    try:
        if status != "evaluate":
            train(cell.config(), run_dir=str(cell.run_dir), overwrite=status == "changed")
        if eval_options is not None:
            evaluate_checkpoint(cell.run_dir, out=grid_eval_dir(cell), **eval_options)
    except Exception as e:  # reported by name; the grid goes on
        with open(log, "a", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        return f"{type(e).__name__}: {e} (log {log})"
    return None


def check_configs(cells: list) -> dict:
    """cell name -> config error, for cells whose config does not load (loaded once, by ``resolve_clips``)."""
    unresolved = [c for c in cells if c.clip is None and c.config_error is None]
    resolve_clips(unresolved)
    return {c.name: c.config_error for c in cells if c.config_error}


# ---------------------------------------------------------------------------------------------
# running the grid
# ---------------------------------------------------------------------------------------------

def run_grid(grid: Grid, cells: list, *, jobs: int = 1, in_process: bool = False,
             echo: Callable[[str], None] = print, runner: Optional[Callable] = None,
             rerun_changed: bool = False) -> dict:
    """Run ``cells`` (dependencies first); returns cell name -> "done" | "skipped" | "failed" | "blocked".
    ``runner``: how a cell runs (default: a child process, or this process with ``in_process``), e.g. as a Ray
    task (graftzoo.apps.grid.on_ray). A finished cell whose settings changed is a GridError (``check_changed``)
    unless ``rerun_changed``: then it reruns from the start. SIGTERM / SIGINT stop the default runners' cells
    (``stop_children_on_signal``) and raise ``GridInterrupted``."""
    changed = check_changed(grid, cells, rerun_changed)
    logs = grid.root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    guard = stop_children_on_signal() if runner is None else contextlib.nullcontext({"signum": None})
    runner = runner or (run_cell_inprocess if in_process else run_cell_subprocess)
    result: dict = {}
    pending = list(cells)
    running: dict = {}
    selected = {c.name for c in cells}
    count = {"started": 0, "ended": 0, "of": len(cells)}   # "cell i/N" as each cell starts, "i of N ended" as it ends

    def ready(c: Cell) -> Optional[bool]:
        """True: can start; False: blocked by a failed dependency; None: wait."""
        states = [result.get(d) if d in selected else
                  ("done" if summary_status(grid.root / d) == "done" else "failed") for d in c.depends]
        if any(s in ("failed", "blocked") for s in states):
            return False
        return True if all(s in ("done", "skipped") for s in states) else None

    def finish(c: Cell, why: Optional[str], t0: float):
        count["ended"] += 1
        took = f"{time.time() - t0:.0f} s; {count['ended']} of {count['of']} cells ended"
        if why and stop["signum"]:   # stopped by the grid's signal: it resumes on a rerun
            result[c.name] = "interrupted"
            echo(f"[interrupted] {c.name} ({took})")
            return
        result[c.name] = "failed" if why else "done"
        echo(f"[{'FAILED' if why else 'done'}] {c.name} ({took})" + (f": {why}" if why else ""))

    def settled(c: Cell, outcome: str, line: str):   # a cell that does not run: skipped, blocked
        count["started"] += 1
        count["ended"] += 1
        result[c.name] = outcome
        echo(f"{line} (cell {count['started']}/{count['of']})")

    with guard as stop, cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        while (pending and not stop["signum"]) or running:
            before = len(pending)
            for c in list(pending):
                if len(running) >= max(1, jobs) or stop["signum"]:
                    break
                ok = ready(c)
                if ok is None:
                    continue
                pending.remove(c)
                if not ok:
                    settled(c, "blocked", f"[blocked] {c.name}: depends on failed cell(s) {c.depends}")
                    continue
                status = "changed" if c.name in changed else cell_status(c, grid.eval)
                if status == "done":
                    settled(c, "skipped", f"[skipped] {c.name}: done")
                    continue
                note = (resume_note(c) if status == "resume" else
                        f"{changed[c.name]}: reruns from the start" if status == "changed" else None)
                count["started"] += 1
                echo(f"[{status}] {c.name} ({note + '; ' if note else ''}cell {count['started']}/{count['of']})")
                if in_process or jobs <= 1:
                    t0 = time.time()
                    finish(c, runner(c, status, grid.eval, logs), t0)
                else:
                    running[pool.submit(runner, c, status, grid.eval, logs)] = (c, time.time())
            if running:
                done, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    c, t0 = running.pop(fut)
                    finish(c, fut.result(), t0)
            elif len(pending) == before and not stop["signum"]:
                raise GridError(f"cells {[c.name for c in pending]} wait on dependencies that never run")
        signum = stop["signum"]
    if signum:
        raise GridInterrupted(signum, [n for n, s in result.items() if s == "interrupted"], [c.name for c in pending])
    return result


# ---------------------------------------------------------------------------------------------
# the report on wandb
# ---------------------------------------------------------------------------------------------

def log_report_to_wandb(grid: Grid, finished: list, table, runs: list, out: Path,
                        echo: Callable[[str], None] = print) -> Optional[str]:
    """Log the grid's report to a wandb run of job_type ``report`` named ``<grid>-report``, in the cells' wandb
    group (the grid's name): Table 1 as ``table1`` (each method's scores and its Δ vs the baseline), the clip table
    as ``clip_table`` and the report's figures (``out/*.png``), the grid's name, cells and baseline in its config.
    Only when the finished cells track to wandb (the first one's ``run.track``, the default) and the grid file does
    not say ``report: {wandb: false}``; the mode, project and entity are the cells' (offline without an API key,
    in ``out/wandb``). A wandb failure is said in one line and never fails the grid. Returns where the run went
    (its URL, or its offline folder for ``wandb sync``), else None."""
    cfg = finished[0].config() if finished and grid.report.get("wandb", True) else None
    if cfg is None or not cfg.run.track:
        return None
    import wandb
    from graftzoo.training.run.tracking import init_wandb   # imports torch: kept off the grid's import (--help)
    try:
        run = init_wandb(out, cfg, name=f"{grid.name}-report", job_type="report",
                         group=cfg.run.wandb_group or grid.name, tags=["report"],
                         config={"grid": grid.name, "baseline": table.baseline, "cells": [c.name for c in finished]})
        try:
            log_table_to_wandb(table, run)
            log_table_to_wandb(clip_fraction_table(runs), run)
            figures = sorted(out.glob("*.png"))
            if figures:
                run.log({p.stem: wandb.Image(str(p)) for p in figures})
            where = run.settings.sync_dir if run.offline else run.url
        finally:
            run.finish()
    except Exception as e:  # noqa: BLE001 - wandb's errors (auth, network, disk) must not fail a finished grid
        echo(f"wandb: the report was not logged ({type(e).__name__}: {' '.join(str(e).split())[:300]})")
        return None
    if where:
        echo(f"report logged to wandb: {where}" + (f" (offline: `wandb sync {where}` uploads it)" if run.offline
                                                   else ""))
    return where
