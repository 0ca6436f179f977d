"""Running a grid's cells: each cell's status, the child-process and in-process runners, and the scheduler."""
from __future__ import annotations

import concurrent.futures as cf
import inspect
import json
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

from graftzoo.apps.grid.model import Cell, Grid, GridError, resolve_clips
from graftzoo.training.checkpoint import checkpoint_step, latest_checkpoint
from graftzoo.api import train_run as train
from graftzoo.eval.artifacts import EVAL_DIR, GRID_EVAL_DIR, eval_file_name
from graftzoo.training.eval_checkpoints import load_run_config, trained_specs
from graftzoo.eval.evaluate import eval_request
from graftzoo.training.eval_runner import evaluate_checkpoint


# ---------------------------------------------------------------------------------------------
# status of a cell
# ---------------------------------------------------------------------------------------------

def summary_status(run_dir: Path) -> Optional[str]:
    """The ``status`` of a run directory's ``summary.json`` ("done" once training finished), or None."""
    p = run_dir / "summary.json"
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("status")
    except json.JSONDecodeError:
        return None


def grid_eval_dir(cell: Cell) -> Path:
    """Where the grid's evaluation of a cell goes (``RUN/eval/grid``; the report prefers it to the trainer's)."""
    return cell.run_dir / EVAL_DIR / GRID_EVAL_DIR


def eval_done(cell: Cell, options: dict) -> bool:
    """Whether every trained model has an eval file that answers this grid's eval request."""
    cfg = load_run_config(cell.run_dir)
    keys = set(inspect.signature(eval_request).parameters) - {"cfg"}
    want = eval_request(cfg, **{k: v for k, v in options.items() if k in keys})
    for spec in trained_specs(cfg):
        p = grid_eval_dir(cell) / eval_file_name(spec["id"])
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


def _run_logged(cmd: list, log: Path) -> int:
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode


def _tail(log: Path, n: int = 15) -> str:
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
    return "\n".join("    " + line for line in lines[-n:])


def run_cell_subprocess(cell: Cell, status: str, eval_options: Optional[dict], logs: Path) -> Optional[str]:
    """Train (unless only the eval is pending) then evaluate, each in a child process; None or why it failed."""
    log = logs / f"{cell.name}.log"
    if status != "evaluate" and _run_logged(cell.train_command(), log) != 0:
        return f"training failed (log {log}):\n{_tail(log)}"
    if eval_options is not None and _run_logged(eval_command(cell, eval_options), log) != 0:
        return f"evaluation failed (log {log}):\n{_tail(log)}"
    return None


def run_cell_inprocess(cell: Cell, status: str, eval_options: Optional[dict], logs: Path) -> Optional[str]:
    """As :func:`run_cell_subprocess`, in this process (faster to start; a crash ends the grid)."""
    log = logs / f"{cell.name}.log"
    try:
        if status != "evaluate":
            train(cell.config(), run_dir=str(cell.run_dir))
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
             echo: Callable[[str], None] = print, runner: Optional[Callable] = None) -> dict:
    """Run ``cells`` (dependencies first); returns cell name -> "done" | "skipped" | "failed" | "blocked".
    ``runner``: how a cell runs (default: a child process, or this process with ``in_process``), e.g. as a Ray
    task (graftzoo.apps.grid.on_ray)."""
    logs = grid.root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    runner = runner or (run_cell_inprocess if in_process else run_cell_subprocess)
    result: dict = {}
    pending = list(cells)
    running: dict = {}
    selected = {c.name for c in cells}

    def ready(c: Cell) -> Optional[bool]:
        """True: can start; False: blocked by a failed dependency; None: wait."""
        states = [result.get(d) if d in selected else
                  ("done" if summary_status(grid.root / d) == "done" else "failed") for d in c.depends]
        if any(s in ("failed", "blocked") for s in states):
            return False
        return True if all(s in ("done", "skipped") for s in states) else None

    def finish(c: Cell, why: Optional[str], t0: float):
        result[c.name] = "failed" if why else "done"
        echo(f"[{'FAILED' if why else 'done'}] {c.name} ({time.time() - t0:.0f} s)" + (f": {why}" if why else ""))

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        while pending or running:
            before = len(pending)
            for c in list(pending):
                if len(running) >= max(1, jobs):
                    break
                ok = ready(c)
                if ok is None:
                    continue
                pending.remove(c)
                if not ok:
                    result[c.name] = "blocked"
                    echo(f"[blocked] {c.name}: depends on failed cell(s) {c.depends}")
                    continue
                status = cell_status(c, grid.eval)
                if status == "done":
                    result[c.name] = "skipped"
                    echo(f"[skipped] {c.name}: done")
                    continue
                echo(f"[{status}] {c.name}" + (f" ({resume_note(c)})" if status == "resume" else ""))
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
            elif len(pending) == before:
                raise GridError(f"cells {[c.name for c in pending]} wait on dependencies that never run")
    return result
