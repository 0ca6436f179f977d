"""``graftzoo grid``: the click command, its dry-run plan and the report of the finished cells. The command reads and
checks the grid file (``load_grid``: every cell's config) before it imports the runners and the report (torch):
``--help``, a missing or broken grid file and a cell whose config does not load answer at once."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Callable, Optional

import click

from graftzoo.apps.options import plugin_option

from graftzoo.apps.grid.load import load_grid
from graftzoo.apps.grid.model import Grid, select_cells
from graftzoo.contract.config import clip_label


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def write_report(grid: Grid, cells: list, echo: Callable[[str], None] = print,
                 warn: Callable[[str], None] = _stderr) -> Optional[Path]:
    """Table 1 (md/csv/tex), the clip table, the figures and (with ``report.map``) the regime map
    ``regime_map.{png,md,json}`` of the finished cells, in ``<grid dir>/report``; None when nothing is finished.
    Rows that differ in a setting they do not set by design (a key of their preset, the clip of ``clip: own``) are
    said to ``warn``, one line per setting (``Table.warnings``)."""
    from graftzoo.apps.grid.run import log_report_to_wandb, summary_status  # torch: only once a report is written
    from graftzoo.eval.artifacts import ArtifactError, load_run  # torch: only once a report is written
    from graftzoo.eval.plots import write_figures  # matplotlib, torch: only once a report is written
    from graftzoo.eval.regime import write_regime_map  # matplotlib, torch: only once a report is written
    from graftzoo.eval.report import (build_table1, clip_fraction_table, design_keys,  # torch: a report only
                                      population_markdown, population_rows, to_csv, to_latex, to_markdown,
                                      transfer_markdown, transfer_table)
    finished = [c for c in cells if summary_status(c.run_dir) == "done"]
    if not finished:
        echo("report skipped: no finished cell")
        return None
    labels = [m.label for m in grid.methods]
    baseline = grid.report.get("baseline") or ("GRPO (n=8)" if "GRPO (n=8)" in labels else labels[0])
    budgets = tuple(grid.report.get("budgets") or (16, 32))
    out = grid.root / "report"
    out.mkdir(parents=True, exist_ok=True)
    if grid.regime is not None:   # report.map: the learner's Δ heat map; from the cells (their pair), not Table 1
        try:
            write_regime_map(grid.regime, [(c.label, c.pair, c.seed, c.run_dir) for c in finished], out, echo=echo)
        except (ArtifactError, ValueError) as e:
            echo(f"regime map skipped: {e}")
    try:
        runs = [load_run(c.run_dir) for c in finished]
        design = {m.label: design_keys(m.sets) | ({"clip"} if m.clip == "own" else set()) for m in grid.methods}
        table = build_table1(runs, baseline=baseline, budgets=budgets, methods=labels,
                             aliases={m.label: m.same_as for m in grid.methods if m.same_as}, design=design)
    except (ArtifactError, ValueError) as e:
        echo(f"report skipped: {e}")
        return None
    for line in table.warnings:
        warn(line)
    md = to_markdown(table)
    (out / "table1.md").write_text(md, encoding="utf-8")
    (out / "table1.csv").write_text(to_csv(table), encoding="utf-8")
    (out / "table1.tex").write_text(to_latex(table), encoding="utf-8")
    (out / "clip_table.md").write_text(to_markdown(clip_fraction_table(runs)), encoding="utf-8")
    transfer = transfer_table(runs)
    if transfer.rows:  # runs with a peer: what the exchange moved
        (out / "transfer.md").write_text(transfer_markdown(transfer), encoding="utf-8")
    population = population_rows(table)
    if population:  # a method trained with two population sizes: does another peer help?
        (out / "population.md").write_text(population_markdown(population, table.digits), encoding="utf-8")
    write_figures(runs, out, table.baseline, echo=echo)
    echo(md)
    if population:
        echo(population_markdown(population, table.digits))
    echo(f"report: {out}")
    log_report_to_wandb(grid, finished, table, runs, out, echo=echo)   # report.wandb: false keeps it off wandb
    return out


def print_plan(grid: Grid, cells: list, echo: Callable[[str], None]) -> None:
    """The report's rows (labels, with each method's algorithm, peer and overrides), then the cells, their
    status and the commands that would run them (``--dry-run``)."""
    from graftzoo.apps.grid.run import cell_status, changed_cells, eval_command, resume_note  # torch: the runners
    echo(f"grid {grid.name}: {len(grid.methods)} row(s)")
    for m in grid.methods:
        parts = [m.algo] + ([f"peer={m.peer}"] if m.peer else []) + (["each_model"] if m.each_model else [])
        parts += [f"pairs={','.join(m.pairs)}"] if m.pairs is not None else []
        parts += [f"{k}={v}" for k, v in m.overrides.items()]
        echo(f"  {m.label}: " + (f"the runs of {m.same_as!r}, under a second label" if m.same_as else " ".join(parts)))
    if grid.regime is not None:
        rm = grid.regime
        echo(f"regime map: {' | '.join(f'{p} − {rm.baseline}' for p in rm.panels)}"
             + (f" on {rm.skill}" if rm.skill else ""))
        for r in rm.rows:
            echo(f"  {r} (learner {rm.learner[rm.cell_pair[(r, rm.cols[0])]]}): "
                 + ", ".join(f"{c}: pair {rm.cell_pair[(r, c)]}" for c in rm.cols))
    echo(f"grid {grid.name}: {len(cells)} cell(s) in {grid.root}")
    changed = changed_cells(cells)
    for c in cells:
        dep = f"  (after {', '.join(c.depends)})" if c.depends else ""
        status = "changed" if c.name in changed else cell_status(c, grid.eval)
        note = (resume_note(c) if status == "resume" else
                f"{changed[c.name]} (--rerun-changed reruns it)" if status == "changed" else None)
        echo(f"  [{status}] {c.name}{dep}" + (f": {note}" if note else ""))
        echo(f"      clip: {clip_label(c.clip)}" + ("  (clip: own, differs by design)" if c.clip_own else ""))
        echo("      graftzoo " + shlex.join(c.train_command()[3:]))
        if grid.eval is not None:
            echo("      graftzoo " + shlex.join(eval_command(c, grid.eval)[3:]))


@click.command("grid")
@plugin_option
@click.argument("grid_file")
@click.option("--dry-run", is_flag=True, help="print the cells, their status and commands; check configs; run nothing")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="grid folder [default: out_dir or runs/NAME]")
@click.option("--only", multiple=True, metavar="GLOB", help="run only matching cells (and what they depend on)")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="cells run at a time")
@click.option("--in-process", is_flag=True, help="run cells in this process instead of child processes")
@click.option("--no-report", is_flag=True, help="do not write the report at the end")
@click.option("--rerun-changed", is_flag=True,
              help="rerun from the start the finished cells whose settings changed (old runs moved aside); "
                   "without it such cells are refused")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="run each cell as a Ray task holding the CPUs/GPUs it needs, on a private local cluster or the "
                   "one at ADDRESS (cells run as soon as their dependencies are done and the cluster has room)")
def grid_cmd(grid_file, dry_run, out, only, jobs, in_process, no_report, rerun_changed, ray_address):
    """Run a grid: graftzoo grid configs/grids/NAME.yaml [--dry-run] [--out DIR]."""
    grid = load_grid(grid_file, out)  # a GridError or ConfigError: one line, exit 2 (graftzoo.apps.cli.Main)
    cells = select_cells(grid, only)
    if in_process and jobs > 1:
        raise click.UsageError("--in-process runs one cell at a time; drop --jobs")
    errors: dict = {}  # error -> the cells whose config it stops (load_grid loaded each cell's config)
    for c in cells:
        if c.config_error:
            errors.setdefault(c.config_error, []).append(c.name)
    if dry_run:
        print_plan(grid, cells, click.echo)
    for why, names in errors.items():  # one line per error, however many cells share it (a grid's file, say)
        more = f" (and {len(names) - 1} more: {', '.join(names[1:])})" if len(names) > 1 else ""
        click.echo(f"config error in cell {names[0]}{more}: {why}", err=True)
    if errors:
        sys.exit(2)
    from graftzoo.apps.grid.run import check_changed, run_grid  # torch: after the grid file's checks
    check_changed(grid, cells, rerun_changed)   # a GridError: one line, exit 2
    if dry_run:
        return
    if ray_address and in_process:
        raise click.UsageError("--ray runs cells as Ray tasks; drop --in-process")
    if ray_address:
        from graftzoo.apps.grid.on_ray import RayCells  # ray: only for --ray
        ray_cells = RayCells(None if ray_address == "local" else ray_address, cells, grid.root, echo=click.echo)
        try:
            result = run_grid(grid, cells, jobs=max(1, len(cells)), echo=click.echo, runner=ray_cells,
                              rerun_changed=rerun_changed)
        finally:
            ray_cells.close()
    else:
        result = run_grid(grid, cells, jobs=jobs, in_process=in_process, echo=click.echo, rerun_changed=rerun_changed)
    if not no_report:
        write_report(grid, cells, echo=click.echo, warn=lambda line: click.echo(line, err=True))
    bad = [n for n, s in result.items() if s in ("failed", "blocked")]
    counts = {s: sum(1 for v in result.values() if v == s) for s in ("done", "skipped", "failed", "blocked")}
    click.echo(f"grid {grid.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    if bad:
        click.echo(f"failed or blocked cells: {', '.join(bad)}", err=True)
        sys.exit(1)
