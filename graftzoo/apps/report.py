"""``graftzoo report``: tables and figures from run directories (wired into the main CLI)."""
from __future__ import annotations

import os
from pathlib import Path

import click

from graftzoo.algos import BUILTIN
from graftzoo.contract.errors import did_you_mean
from graftzoo.eval.artifacts import ArtifactError, load_runs
from graftzoo.eval.plots import write_figures
from graftzoo.eval.report import (COMPARABLE_KEYS, baseline_runs, build_table1, check_comparable,
                                  clip_fraction_table, default_baseline, is_report_baseline, log_table_to_wandb,
                                  method_labels, method_of, row_labels, to_csv, to_latex, to_markdown,
                                  transfer_markdown, transfer_table)


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", default="report", show_default=True,
              type=click.Path(file_okay=False), help="Folder for the tables and figures.")
@click.option("--baseline", default=None,
              help="Method label that the Δ column is measured against [default: of the single-model rows of an "
                   "algorithm whose section declares report_baseline, as GRPO's does, the one with the most seeds].")
@click.option("--wandb/--no-wandb", "use_wandb", default=False, show_default=True,
              help="Also log the tables and figures to a wandb run (offline without an API key).")
@click.option("--allow-mixed", "allow_mixed", multiple=True, metavar="KEY",
              help=f"tabulate runs that differ in KEY (repeatable; one of {', '.join(COMPARABLE_KEYS)})")
@click.option("--mixed", is_flag=True, help="tabulate runs whatever their steps, eval k and eval set")
def report_cmd(runs, out_dir, baseline, use_wandb, allow_mixed, mixed):
    """Write table1.md/.csv/.tex, clip_table.md, transfer.md (runs with a peer), score_vs_compute.png, fractions.png
    and learning_curve.png from RUNS (run directories or folders holding them) into --out, and print Table 1.

    Runs that differ in training steps, eval k or eval set are refused unless --allow-mixed / --mixed. Runs on
    different tasks are tabulated in separate blocks; rows that differ in rollout budget, clip or a mixed key are
    marked in the Differs column and said on stderr, one line per key."""
    unknown = [k for k in allow_mixed if k not in COMPARABLE_KEYS]
    if unknown:
        raise click.UsageError(f"--allow-mixed {unknown[0]}: not one of {', '.join(COMPARABLE_KEYS)}")
    try:
        records = load_runs(runs)
    except ArtifactError as e:
        raise click.ClickException(str(e)) from None
    try:
        check_comparable(records, allow=("*",) if mixed else allow_mixed)
    except ValueError as e:   # a usage error: --allow-mixed / --mixed put them in one table
        raise _usage_error(str(e)) from None
    try:
        labels = row_labels(records)
        if baseline is None and labels:   # no rows at all: build_table1 says so
            baseline = _pick_baseline(records)
        elif labels and baseline not in labels:
            raise _usage_error(f"--baseline {baseline!r} is not a method of these runs{did_you_mean(baseline, labels)} "
                               f"(methods: {', '.join(repr(x) for x in labels)})")
        table = build_table1(records, baseline=baseline or "")
    except (ArtifactError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    for line in table.warnings:
        click.echo(line, err=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = to_markdown(table)
    (out / "table1.md").write_text(md, encoding="utf-8")
    (out / "table1.csv").write_text(to_csv(table), encoding="utf-8")
    (out / "table1.tex").write_text(to_latex(table), encoding="utf-8")
    clip = clip_fraction_table(records)
    (out / "clip_table.md").write_text(to_markdown(clip), encoding="utf-8")
    transfer = transfer_table(records)
    if transfer.rows:  # runs with a peer: what the exchange moved
        (out / "transfer.md").write_text(transfer_markdown(transfer), encoding="utf-8")
    figures = write_figures(records, out, table.baseline, echo=lambda m: click.echo(m, err=True))
    click.echo(md)
    if use_wandb:
        _log_wandb(table, clip, figures)


def _pick_baseline(records) -> str:
    """``default_baseline``, said in one line; a usage error (exit 2) listing the labels when there is none."""
    chosen = default_baseline(records)
    if chosen is None:
        declared = [name for name in BUILTIN if is_report_baseline(name)]
        raise _usage_error(f"no baseline row (single-model runs of an algorithm whose section declares "
                           f"report_baseline{'; builtin: ' + ', '.join(declared) if declared else ''}) to measure "
                           f"Δ against; pass --baseline with one of: {', '.join(repr(x) for x in row_labels(records))}")
    labels = method_labels(records)
    algos = sorted({str(r.summary.get("algo")) for r in baseline_runs(records) if method_of(r, labels) == chosen})
    click.echo(f"baseline: {chosen!r} (algo {', '.join(algos)}: the baseline row with the most seeds; --baseline to "
               f"choose another)", err=True)
    return chosen


def _usage_error(message: str) -> click.ClickException:
    """One ``Error:`` line, exit 2 (a usage error, without click's usage text)."""
    e = click.ClickException(message)
    e.exit_code = 2
    return e


def _log_wandb(table, clip, figures) -> None:
    import wandb

    mode = None if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY") else "offline"
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "graftzoo"), job_type="report",
                     mode=mode)
    try:
        log_table_to_wandb(table, run)
        log_table_to_wandb(clip, run)
        run.log({p.stem: wandb.Image(str(p)) for p in figures})
    finally:
        run.finish()
