"""``graftzoo grid``: run an algorithm x pair x seed grid (plus ablation variants) and its report.

A grid file (``configs/grids/NAME.yaml``)::

    name: tiny_table1                 # wandb group of every cell; default folder runs/<name>
    out_dir: runs/tiny_table1         # optional (``--out`` wins)
    pairs: [micro]                    # configs/pairs/<pair>.yaml
    seeds: [0, 1, 2]                  # or a count: 3
    files: []                         # extra config files for every cell (optional)
    set: {run.steps: 20}              # dotted overrides for every cell (optional)
    algorithms: [grpo_n8, grpo_n16]   # presets or algorithm names; label = the preset's run.variant
    variants:                         # ablations and other labelled methods
      - {label: "GRAFT", algo: graft, peer: online}
      - {label: "GRAFT w/o gate", algo: graft, peer: online, set: {algo.delta: 0.0}}
      - {label: "GRAFT (stored)", algo: graft, peer: "stored:{cell:GRPO (n=8)}", each_model: true}
    eval: {benchmarks: all, k: 8}     # optional: ``graftzoo eval`` on each finished cell
    report: {baseline: "GRPO (n=8)", budgets: [16, 32]}

A method entry (in ``algorithms`` or ``variants``) has ``algo`` and optionally ``label``, ``set``
(its own overrides, after the grid's), ``files``, ``peer`` (``online`` | ``none`` |
``stored:PATH`` | ``mixed:PATH``, where PATH may be ``{cell:LABEL}``: the run directory of the
method LABEL with the same pair and seed, which then runs first) and ``each_model: true`` (one
cell per model of the pair, training that model alone: stored-peer methods, whose source is
one model of an earlier pair run).

Cell ``f"{slug(label)}-{pair}-s{seed}"`` (``f"{slug(label)}-{model}-{pair}-s{seed}"`` with
``each_model``) trains in ``<grid dir>/<cell>`` with ``run.variant = label``,
``run.wandb_group = name`` and ``run.tags = [algo, pair, "s<seed>"]``. A cell whose
``summary.json`` says "done" (and, with an ``eval`` block, whose eval files answer the same
request) is skipped; an unfinished one is run again and the trainer resumes from its last
checkpoint. Cells run one after another (``--jobs N``: N at a time), each in its own process
(output in ``<grid dir>/logs/<cell>.log``), so a failed cell is reported by name and the grid
goes on; cells that depend on it are not run. The exit code is 1 if any cell failed. At the
end the report (Table 1, the clip table and the figures) is written to ``<grid dir>/report``.
"""
from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import inspect
import json
import re
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import click

from graftzoo.core.config import DEFAULTS, ConfigError, find_config, load_config, read_yaml

GRID_KEYS = {"name", "out_dir", "pairs", "seeds", "files", "set", "algorithms", "variants", "eval", "report"}
METHOD_KEYS = {"label", "algo", "set", "files", "peer", "each_model"}
REPORT_KEYS = {"baseline", "budgets"}
CELL_REF = re.compile(r"^\{cell:(.+)\}$")


class GridError(ValueError):
    """A grid file is malformed; the message names the file and the key."""


def slug(text: str) -> str:
    """``"GRAFT w/o gate"`` -> ``"graft-w-o-gate"``."""
    out = re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")
    if not out:
        raise GridError(f"label {text!r} has no letters or digits to name a run with")
    return out


@dataclass
class Method:
    label: str
    algo: str
    overrides: dict = field(default_factory=dict)
    files: list = field(default_factory=list)
    peer: Optional[str] = None
    each_model: bool = False


@dataclass
class Cell:
    name: str
    label: str
    algo: str
    pair: str
    seed: int
    run_dir: Path
    overrides: dict            # dotted key -> value, applied after the pair, preset and files
    files: list
    model: Optional[str] = None  # each_model: the one model this cell trains
    depends: list = field(default_factory=list)

    def override_args(self) -> list:
        """``key=value`` strings (values in JSON, which YAML reads back as the same value)."""
        return [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in self.overrides.items()]

    def train_command(self) -> list:
        cmd = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", self.algo, "--pair", self.pair]
        for f in self.files:
            cmd += ["-c", str(f)]
        for o in self.override_args():
            cmd += ["--set", o]
        return cmd + ["--run-dir", str(self.run_dir)]

    def config(self) -> dict:
        return load_config(pair=self.pair, algo=self.algo, files=self.files, overrides=self.override_args())


@dataclass
class Grid:
    name: str
    path: Path
    root: Path
    methods: list
    cells: list
    eval: Optional[dict] = None
    report: dict = field(default_factory=dict)

    def cell(self, name: str) -> Cell:
        return next(c for c in self.cells if c.name == name)


# ---------------------------------------------------------------------------------------------
# reading and expanding a grid file
# ---------------------------------------------------------------------------------------------

def _preset_label(algo: str) -> str:
    p = find_config("algos", algo)
    variant = (read_yaml(p).get("run") or {}).get("variant") if p is not None else None
    return str(variant or algo)


def _flat(mapping: dict, where: str, prefix: str = "") -> dict:
    """Dotted overrides from ``{a.b: 1}`` or ``{a: {b: 1}}``; free maps (task.mix ...) and
    ``algo.*`` values stay whole."""
    if not isinstance(mapping, dict):
        raise GridError(f"{where} must be a mapping of dotted config keys to values")
    out = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path in DEFAULTS and isinstance(DEFAULTS[path], dict) and path != "algo":
            out.update(_flat(value, f"{where}.{key}", f"{path}."))
        elif isinstance(value, dict) and path == "algo":
            out.update({f"algo.{k}": v for k, v in value.items()})
        else:
            out[path] = value
    return out


def _method(entry, where: str) -> Method:
    if isinstance(entry, str):
        return Method(label=_preset_label(entry), algo=entry)
    if not isinstance(entry, dict):
        raise GridError(f"{where} must be an algorithm name or a mapping with 'algo'")
    unknown = sorted(set(entry) - METHOD_KEYS)
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}; known: {sorted(METHOD_KEYS)}")
    if not isinstance(entry.get("algo"), str) or not entry["algo"]:
        raise GridError(f"{where}: key 'algo' (a preset or algorithm name) is required")
    files = entry.get("files") or []
    if not isinstance(files, list):
        raise GridError(f"{where}.files must be a list of config files")
    peer = entry.get("peer")
    if peer is not None and not isinstance(peer, str):
        raise GridError(f"{where}.peer must be online | none | stored:PATH | mixed:PATH")
    return Method(label=str(entry.get("label") or _preset_label(entry["algo"])), algo=entry["algo"],
                  overrides=_flat(entry.get("set") or {}, f"{where}.set"), files=[str(f) for f in files],
                  peer=peer, each_model=bool(entry.get("each_model", False)))


def _pair_models(pair: str, where: str) -> list:
    p = find_config("pairs", pair)
    if p is None:
        raise GridError(f"{where}: unknown pair {pair!r} (no configs/pairs/{pair}.yaml)")
    data = read_yaml(p)
    models = data.get("models") or (data.get("pair") or {}).get("models") or []
    return [m["id"] for m in models]


def _peer_overrides(peer: str, where: str) -> tuple:
    """({peer.* overrides}, referenced label or None)."""
    kind, _, path = peer.partition(":")
    if kind not in ("none", "online", "stored", "mixed"):
        raise GridError(f"{where}.peer: {peer!r} must be online | none | stored:PATH | mixed:PATH")
    if kind in ("stored", "mixed") and not path:
        raise GridError(f"{where}.peer: {kind} needs a path: {kind}:PATH or {kind}:{{cell:LABEL}}")
    if kind in ("none", "online") and path:
        raise GridError(f"{where}.peer: {kind} takes no path, got {peer!r}")
    ref = CELL_REF.match(path)
    out = {"peer.source": kind}
    if path and not ref:
        out["peer.path"] = path
    return out, (ref.group(1).strip() if ref else None)


def _order(cells: list, where: str) -> list:
    """Dependencies first, otherwise the expansion order."""
    by_name = {c.name: c for c in cells}
    done, out, visiting = set(), [], set()

    def visit(c: Cell, chain: tuple):
        if c.name in done:
            return
        if c.name in visiting:
            raise GridError(f"{where}: cells depend on each other in a cycle: {' -> '.join(chain + (c.name,))}")
        visiting.add(c.name)
        for d in c.depends:
            visit(by_name[d], chain + (c.name,))
        visiting.discard(c.name)
        done.add(c.name)
        out.append(c)

    for c in cells:
        visit(c, ())
    return out


def load_grid(path, out: Optional[str] = None) -> Grid:
    """Read and expand a grid file (format: module docstring); nothing is run or created."""
    path = Path(path)
    if not path.is_file():
        found = find_config("grids", str(path))
        if found is None:
            raise GridError(f"{path}: no such grid file (nor configs/grids/{path}.yaml)")
        path = found
    try:
        data = read_yaml(path)
    except ConfigError as e:
        raise GridError(str(e)) from None
    where = str(path)
    unknown = sorted(set(data) - GRID_KEYS)
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}; known: {sorted(GRID_KEYS)}")
    name = str(data.get("name") or path.stem)
    root = Path(out or data.get("out_dir") or Path("runs") / name)
    pairs = data.get("pairs")
    pairs = [pairs] if isinstance(pairs, str) else pairs
    if not pairs or not all(isinstance(p, str) for p in pairs):
        raise GridError(f"{where}: key 'pairs' must name at least one pair")
    seeds = data.get("seeds", [0])
    seeds = list(range(seeds)) if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise GridError(f"{where}: key 'seeds' must be a list of integers or a count")
    files = [str(f) for f in data.get("files") or []]
    common = _flat(data.get("set") or {}, f"{where}: set")
    methods = [_method(e, f"{where}: algorithms[{i}]") for i, e in enumerate(data.get("algorithms") or [])]
    methods += [_method(e, f"{where}: variants[{i}]") for i, e in enumerate(data.get("variants") or [])]
    if not methods:
        raise GridError(f"{where}: no methods: give 'algorithms' and/or 'variants'")
    labels = [m.label for m in methods]
    clash = sorted({x for x in labels if labels.count(x) > 1})
    if clash:
        raise GridError(f"{where}: method label(s) {clash} repeat; give each a distinct 'label'")
    by_label = {m.label: m for m in methods}
    ev = data.get("eval")
    if ev is not None:
        ev = _eval_options(ev, f"{where}: eval")
    report = data.get("report") or {}
    if not isinstance(report, dict) or set(report) - REPORT_KEYS:
        raise GridError(f"{where}: report must be a mapping with keys among {sorted(REPORT_KEYS)}")

    cells, names = [], {}
    for mi, m in enumerate(methods):
        mwhere = f"{where}: method {m.label!r}"
        peer, ref = _peer_overrides(m.peer, mwhere) if m.peer else ({}, None)
        if ref is not None:
            if ref not in by_label:
                raise GridError(f"{mwhere}: peer refers to {{cell:{ref}}} but no method has that label; "
                                f"labels: {labels}")
            if by_label[ref].each_model:
                raise GridError(f"{mwhere}: peer cell {ref!r} trains one model per cell (each_model); "
                                f"refer to a method that trains the whole pair")
        for pair in pairs:
            models = _pair_models(pair, mwhere) if m.each_model else [None]
            for seed in seeds:
                for model in models:
                    stem = slug(m.label) + (f"-{slug(model.split('/')[-1])}" if model else "")
                    cname = f"{stem}-{pair}-s{seed}"
                    if cname in names:
                        raise GridError(f"{where}: methods {names[cname]!r} and {m.label!r} both name a run "
                                        f"{cname!r}; make their labels differ in letters or digits")
                    names[cname] = m.label
                    ov = dict(common)
                    ov.update(m.overrides)
                    ov.update({"run.name": cname, "run.variant": m.label, "run.seed": seed,
                               "run.wandb_group": name, "run.tags": [m.algo, pair, f"s{seed}"],
                               "run.out_dir": str(root)})
                    ov.update(peer)
                    depends = []
                    if ref is not None:
                        dep = f"{slug(ref)}-{pair}-s{seed}"
                        ov["peer.path"] = str(root / dep)
                        depends.append(dep)
                    if model is not None:
                        ov["pair.train"] = [model]
                    cells.append(Cell(name=cname, label=m.label, algo=m.algo, pair=pair, seed=seed,
                                      run_dir=root / cname, overrides=ov, files=files + m.files, model=model,
                                      depends=depends))
    return Grid(name=name, path=path, root=root, methods=methods, cells=_order(cells, where), eval=ev,
                report=report)


def _eval_options(ev, where: str) -> dict:
    from graftzoo.eval.runner import evaluate_checkpoint
    if not isinstance(ev, dict):
        raise GridError(f"{where} must be a mapping of graftzoo eval options")
    allowed = {p for p, v in inspect.signature(evaluate_checkpoint).parameters.items()
               if p not in ("path", "out", "log", "models")}
    unknown = sorted(set(ev) - allowed)
    if unknown:
        raise GridError(f"{where}: unknown option(s) {unknown}; known: {sorted(allowed)}")
    return dict(ev)


# ---------------------------------------------------------------------------------------------
# status of a cell
# ---------------------------------------------------------------------------------------------

def _summary_status(run_dir: Path) -> Optional[str]:
    p = run_dir / "summary.json"
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("status")
    except json.JSONDecodeError:
        return None


def eval_done(cell: Cell, options: dict) -> bool:
    """Whether every trained model has an eval file that answers this grid's eval request."""
    from graftzoo.eval.artifacts import eval_file_name
    from graftzoo.eval.runner import eval_request, load_run_config, trained_specs
    cfg = load_run_config(cell.run_dir)
    keys = set(inspect.signature(eval_request).parameters) - {"cfg"}
    want = eval_request(cfg, **{k: v for k, v in options.items() if k in keys})
    for spec in trained_specs(cfg):
        p = cell.run_dir / "eval" / eval_file_name(spec["id"])
        try:
            if json.loads(p.read_text(encoding="utf-8")).get("request") != want:
                return False
        except (OSError, json.JSONDecodeError):
            return False
    return True


def cell_status(cell: Cell, eval_options: Optional[dict]) -> str:
    """``done`` | ``evaluate`` (trained, eval pending) | ``resume`` | ``new``."""
    status = _summary_status(cell.run_dir)
    if status == "done":
        return "done" if eval_options is None or eval_done(cell, eval_options) else "evaluate"
    return "resume" if cell.run_dir.is_dir() and any(cell.run_dir.iterdir()) else "new"


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------

def eval_command(cell: Cell, options: dict) -> list:
    """``graftzoo eval`` on the cell's run directory with the grid's eval options."""
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", "eval", "--ckpt", str(cell.run_dir)]
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
    from graftzoo.eval.runner import evaluate_checkpoint
    from graftzoo.core.trainer import train
    log = logs / f"{cell.name}.log"
    try:
        if status != "evaluate":
            train(cell.config(), run_dir=str(cell.run_dir))
        if eval_options is not None:
            evaluate_checkpoint(cell.run_dir, **eval_options)
    except Exception as e:  # reported by name; the grid goes on
        with open(log, "a", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        return f"{type(e).__name__}: {e} (log {log})"
    return None


def select_cells(grid: Grid, patterns) -> list:
    """Cells whose name matches one of the glob ``patterns`` (all when none), with their dependencies."""
    if not patterns:
        return list(grid.cells)
    wanted = {c.name for c in grid.cells if any(fnmatch.fnmatch(c.name, p) for p in patterns)}
    if not wanted:
        raise GridError(f"--only {list(patterns)} matches no cell of {grid.path}")
    stack = list(wanted)
    while stack:
        for d in grid.cell(stack.pop()).depends:
            if d not in wanted:
                wanted.add(d)
                stack.append(d)
    return [c for c in grid.cells if c.name in wanted]


def check_configs(cells: list) -> dict:
    """cell name -> config error, for cells whose config does not load."""
    errors = {}
    for c in cells:
        try:
            c.config()
        except Exception as e:  # ConfigError, RegistryError, ValueError from a learner Config
            errors[c.name] = f"{type(e).__name__}: {e}"
    return errors


def run_grid(grid: Grid, cells: list, *, jobs: int = 1, in_process: bool = False,
             echo: Callable[[str], None] = print) -> dict:
    """Run ``cells`` (dependencies first); returns cell name -> "done" | "skipped" | "failed" | "blocked"."""
    logs = grid.root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    runner = run_cell_inprocess if in_process else run_cell_subprocess
    result: dict = {}
    pending = list(cells)
    running: dict = {}
    selected = {c.name for c in cells}

    def ready(c: Cell) -> Optional[bool]:
        """True: can start; False: blocked by a failed dependency; None: wait."""
        states = [result.get(d) if d in selected else
                  ("done" if _summary_status(grid.root / d) == "done" else "failed") for d in c.depends]
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
                echo(f"[{status}] {c.name}" + (" (training resumes from its last checkpoint)"
                                               if status == "resume" else ""))
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


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def write_report(grid: Grid, cells: list, echo: Callable[[str], None] = print) -> Optional[Path]:
    """Table 1 (md/csv/tex), the clip table and the figures of the finished cells, in
    ``<grid dir>/report``; None when the report modules are missing or nothing is finished."""
    try:
        from graftzoo.eval.artifacts import ArtifactError, load_run
        from graftzoo.eval.plots import plot_fractions, plot_score_vs_compute
        from graftzoo.eval.report import build_table1, clip_fraction_table, to_csv, to_latex, to_markdown
    except ModuleNotFoundError as e:
        echo(f"report skipped: {e}")
        return None
    finished = [c for c in cells if _summary_status(c.run_dir) == "done"]
    if not finished:
        echo("report skipped: no finished cell")
        return None
    labels = [m.label for m in grid.methods]
    baseline = grid.report.get("baseline") or ("GRPO (n=8)" if "GRPO (n=8)" in labels else labels[0])
    budgets = tuple(grid.report.get("budgets") or (16, 32))
    out = grid.root / "report"
    out.mkdir(parents=True, exist_ok=True)
    try:
        runs = [load_run(c.run_dir) for c in finished]
        table = build_table1(runs, baseline=baseline, budgets=budgets, methods=labels)
    except (ArtifactError, ValueError) as e:
        echo(f"report skipped: {e}")
        return None
    md = to_markdown(table)
    (out / "table1.md").write_text(md, encoding="utf-8")
    (out / "table1.csv").write_text(to_csv(table), encoding="utf-8")
    (out / "table1.tex").write_text(to_latex(table), encoding="utf-8")
    (out / "clip_table.md").write_text(to_markdown(clip_fraction_table(runs)), encoding="utf-8")
    for fname, plot in (("score_vs_compute.png", lambda p: plot_score_vs_compute(runs, p, baseline)),
                        ("fractions.png", lambda p: plot_fractions(runs, p))):
        try:
            plot(out / fname)
        except ValueError as e:
            echo(f"figure {fname} skipped: {e}")
    echo(md)
    echo(f"report: {out}")
    return out


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

def _plan(grid: Grid, cells: list, echo) -> None:
    echo(f"grid {grid.name}: {len(cells)} cell(s) in {grid.root}")
    for c in cells:
        dep = f"  (after {', '.join(c.depends)})" if c.depends else ""
        echo(f"  [{cell_status(c, grid.eval)}] {c.name}{dep}")
        echo("      graftzoo " + shlex.join(c.train_command()[3:]))
        if grid.eval is not None:
            echo("      graftzoo " + shlex.join(eval_command(c, grid.eval)[3:]))


@click.command("grid")
@click.argument("grid_file")
@click.option("--dry-run", is_flag=True, help="print the cells, their status and commands; check configs; run nothing")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="grid folder [default: out_dir or runs/NAME]")
@click.option("--only", multiple=True, metavar="GLOB", help="run only matching cells (and what they depend on)")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="cells run at a time")
@click.option("--in-process", is_flag=True, help="run cells in this process instead of child processes")
@click.option("--no-report", is_flag=True, help="do not write the report at the end")
def grid_cmd(grid_file, dry_run, out, only, jobs, in_process, no_report):
    """Run a grid: graftzoo grid configs/grids/NAME.yaml [--dry-run] [--out DIR]."""
    try:
        grid = load_grid(grid_file, out)
        cells = select_cells(grid, only)
    except (GridError, ConfigError) as e:
        raise click.ClickException(str(e)) from None
    if in_process and jobs > 1:
        raise click.UsageError("--in-process runs one cell at a time; drop --jobs")
    errors = check_configs(cells)
    if dry_run:
        _plan(grid, cells, click.echo)
    for name, why in errors.items():
        click.echo(f"config error in cell {name}: {why}", err=True)
    if errors:
        sys.exit(2)
    if dry_run:
        return
    result = run_grid(grid, cells, jobs=jobs, in_process=in_process, echo=click.echo)
    if not no_report:
        write_report(grid, cells, echo=click.echo)
    bad = [n for n, s in result.items() if s in ("failed", "blocked")]
    counts = {s: sum(1 for v in result.values() if v == s) for s in ("done", "skipped", "failed", "blocked")}
    click.echo(f"grid {grid.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    if bad:
        click.echo(f"failed or blocked cells: {', '.join(bad)}", err=True)
        sys.exit(1)


__all__ = ["Cell", "Grid", "GridError", "cell_status", "check_configs", "eval_command", "eval_done", "grid_cmd",
           "load_grid", "run_grid", "select_cells", "slug", "write_report"]
