"""``graftzoo report``: tables and figures from run directories (wired into the main CLI)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import click

from graftzoo.algos import BUILTIN
from graftzoo.contract.errors import did_you_mean
from graftzoo.eval.artifacts import ArtifactError, load_runs
from graftzoo.eval.report import (COMPARABLE_KEYS, baseline_runs, build_table1, clip_fraction_table, few,
                                  is_report_baseline, log_table_to_wandb, method_labels, method_of,
                                  population_markdown, population_rows, resolve_label, row_labels, to_csv, to_latex,
                                  to_markdown, transfer_markdown, transfer_table)

MIXABLE = COMPARABLE_KEYS  # the settings --allow-mixed merges groups on


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", default="report", show_default=True,
              type=click.Path(file_okay=False), help="Folder for the tables and figures.")
@click.option("--baseline", default=None,
              help="Method label that the Δ column is measured against [default: per group of runs, of the "
                   "single-model rows of an algorithm whose section declares report_baseline, as GRPO's does, the "
                   "one with the most seeds].")
@click.option("--wandb/--no-wandb", "use_wandb", default=False, show_default=True,
              help="Also log the tables and figures to a wandb run (offline without an API key).")
@click.option("--allow-mixed", "allow_mixed", multiple=True, metavar="KEY",
              help=f"put runs that differ in KEY in one group (repeatable; one of {', '.join(MIXABLE)})")
@click.option("--mixed", is_flag=True, help="one group: runs whatever their steps, eval k and eval set")
@click.option("--captions-in-figures", "captions_in_images", is_flag=True,
              help="also print each figure's caption under its panels (captions are always in report.md and "
                   "figures.md, beside the images)")
def report_cmd(runs, out_dir, baseline, use_wandb, allow_mixed, mixed, captions_in_images):
    """Write report.md (Table 1 and the figures with their captions), table1.md/.csv/.tex (the .tex a complete
    LaTeX document), clip_table.md, transfer.md (runs with a peer), score_vs_compute.png, fractions.png and
    learning_curve.png (with figures.md/.json: captions and legends) from RUNS (run directories or folders holding
    them) into --out, and print Table 1.

    A method is its algorithm, preset and settings: runs labelled "grpo (n=8)" and "GRPO (n=8)" are one method, shown
    under one label in the table and the figures. Runs that differ in training steps, eval k or eval set are
    tabulated in separate groups, each a section of Table 1 headed by its settings, with its own baseline row and Δ,
    and its figures in a subfolder of --out named after them; --allow-mixed KEY / --mixed merge groups. Runs on
    different tasks are tabulated in separate blocks; a row whose settings differ from its baseline row's in any key
    that changes training or scoring (learning rate, clip, steps, rollout budget, ...) says so in the Differs column
    and on stderr, one line per key. Bold, † and ‡ need a significant paired test over seeds (the caption says
    which)."""
    unknown = [k for k in allow_mixed if k not in MIXABLE]
    if unknown:
        raise click.UsageError(f"--allow-mixed {unknown[0]}: not one of {', '.join(MIXABLE)}")

    try:
        records = load_runs(runs)
    except ArtifactError as e:
        raise click.ClickException(str(e)) from None
    allow = ("*",) if mixed else tuple(allow_mixed)
    try:
        labels = row_labels(records)
        if baseline is not None and labels and resolve_label(baseline, records) not in labels:
            raise _usage_error(f"--baseline {baseline!r} is not a method of these runs{did_you_mean(baseline, labels)}"
                               f" (methods: {_few_labels(labels)})")
        if baseline is None and labels:   # no rows at all: build_table1 says so
            _check_some_baseline(records, labels)
        table = build_table1(records, baseline=baseline, allow=allow)
    except (ArtifactError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if baseline is None:
        _say_baselines(records, table)
    _say_groups(table)
    for line in table.warnings:
        click.echo(line, err=True)
    md, clip, figures = _write(records, table, Path(out_dir), captions_in_images)
    click.echo(md)
    if use_wandb:
        _log_wandb(table, clip, figures, Path(out_dir))


def _few_labels(labels) -> str:

    return few([repr(x) for x in labels], 6)


def _check_some_baseline(records, labels) -> None:
    """A usage error (exit 2, one line listing a few labels) when no group of runs has a row ``default_baseline``
    can take, so that Δ has nothing to be measured against anywhere."""

    if baseline_runs(records):
        return
    declared = [name for name in BUILTIN if is_report_baseline(name)]
    raise _usage_error(f"no baseline row (single-model runs of an algorithm whose section declares "
                       f"report_baseline{'; builtin: ' + ', '.join(declared) if declared else ''}) to measure "
                       f"Δ against; pass --baseline with one of: {_few_labels(labels)}")


def _say_baselines(records, table) -> None:
    """One line naming the baseline ``default_baseline`` chose (per group when the groups' differ)."""

    chosen = [g.baseline for g in table.groups if g.baseline]
    if not chosen:
        return
    if len(set(chosen)) == 1:
        labels = method_labels(records)   # the table's labels: one per method
        algos = sorted({str(r.summary.get("algo")) for r in baseline_runs(records)
                        if method_of(r, labels) == chosen[0]})
        click.echo(f"baseline: {chosen[0]!r} (algo {', '.join(algos)}: the baseline row with the most seeds; "
                   f"--baseline to choose another)", err=True)
        return
    per = "; ".join(f"{g.label}: {g.baseline!r}" for g in table.groups if g.baseline)
    click.echo(f"baselines per group: {per} (the baseline row with the most seeds; --baseline to choose one)",
               err=True)


def _say_groups(table) -> None:
    """One line when the runs fall into several groups of settings."""
    if len(table.groups) < 2:
        return
    keys = list(dict.fromkeys(k for g in table.groups for k in g.settings))
    click.echo(f"{len(table.groups)} groups of runs differ in {', '.join(keys)}: one section of Table 1 each, "
               f"figures in a subfolder each (--allow-mixed KEY or --mixed: one group)", err=True)


def _sections(parts: list) -> str:
    """Markdown of one table per group: under a heading per group when there are several."""
    if len(parts) == 1:
        return parts[0][1]
    return "\n".join(f"### {group.label}\n\n{text}" for group, text in parts)


def _write(records, table, out: Path, captions_in_images: bool = False) -> tuple:
    """The tables, the figures and report.md into ``out``; (Table 1's markdown, the clip tables, the figures'
    paths)."""
    from graftzoo.eval.plots import draw_figures  # matplotlib: only when a report is written

    out.mkdir(parents=True, exist_ok=True)
    md = to_markdown(table)
    (out / "table1.md").write_text(md, encoding="utf-8")
    (out / "table1.csv").write_text(to_csv(table), encoding="utf-8")
    (out / "table1.tex").write_text(to_latex(table), encoding="utf-8")
    labels = method_labels(records)   # one label per method in every table
    clips = [(g, clip_fraction_table(g.runs, labels=labels)) for g in table.groups]
    (out / "clip_table.md").write_text(_sections([(g, to_markdown(c)) for g, c in clips]), encoding="utf-8")
    transfers = [(g, transfer_table(g.runs, labels)) for g in table.groups]
    transfers = [(g, t) for g, t in transfers if t.rows]
    if transfers:  # runs with a peer: what the exchange moved
        (out / "transfer.md").write_text(_sections([(g, transfer_markdown(t)) for g, t in transfers]),
                                         encoding="utf-8")
    population = population_rows(table)
    if population:  # a method trained with two population sizes: does another peer help?
        (out / "population.md").write_text(population_markdown(population, table.digits), encoding="utf-8")
    drawn = []
    for group, folder in _figure_folders(table, out):
        said = "" if folder == out else f"{group.label}: "
        drawn.append((group, draw_figures(group.runs, folder, group.baseline, table=table,
                                          captions_in_images=captions_in_images,
                                          echo=lambda m, said=said: click.echo(said + m, err=True))))
    (out / "report.md").write_text(report_markdown(md, drawn, out, transfer=bool(transfers),
                                                   population=population_markdown(population, table.digits)
                                                   if population else None), encoding="utf-8")
    return md, [c for _, c in clips], [f.path for _, figures in drawn for f in figures]


def report_markdown(table_md: str, drawn: list, out: Path, transfer: bool = False,
                    population: Optional[str] = None) -> str:
    """report.md: Table 1 with its legend, the populations table (``population``: its Markdown, where a method
    trained with two population sizes), then each group's figures (image, then caption) and the other tables'
    files. ``drawn``: (group, its ``FigureInfo``s) per group of the table."""
    from graftzoo.eval.plots import figures_markdown  # matplotlib: only when a report is written

    lines = ["# Report", "", "## Table 1", "", table_md.rstrip("\n"), "",
             "LaTeX: [table1.tex](table1.tex) (a complete document); CSV: [table1.csv](table1.csv); clipped tokens: "
             "[clip_table.md](clip_table.md)" + ("; what the peer exchange moved: [transfer.md](transfer.md)"
                                                 if transfer else "") + ".", ""]
    if population:
        lines += ["## Does another peer help?", "", population.rstrip("\n"), ""]
    several = len(drawn) > 1
    for group, figures in drawn:
        if not figures:
            continue
        lines += [f"## Figures{': ' + group.label if several else ''}", ""]
        lines.append(figures_markdown(figures, out, level=3))
    return "\n".join(lines).rstrip("\n") + "\n"


def _figure_folders(table, out: Path) -> list:
    """(group, the folder of its figures): ``out`` for a table of one group, else a subfolder per group named after
    its settings (``Group.slug``; "-2" added where two slugs meet)."""
    if len(table.groups) < 2:
        return [(table.groups[0], out)] if table.groups else []
    seen: dict = {}
    folders = []
    for g in table.groups:
        seen[g.slug] = seen.get(g.slug, 0) + 1
        folders.append((g, out / (g.slug if seen[g.slug] == 1 else f"{g.slug}-{seen[g.slug]}")))
    return folders


def _usage_error(message: str) -> click.ClickException:
    """One ``Error:`` line, exit 2 (a usage error, without click's usage text)."""
    e = click.ClickException(message)
    e.exit_code = 2
    return e


def _log_wandb(table, clips, figures, out: Path) -> None:
    import wandb


    mode = None if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY") else "offline"
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "graftzoo"), job_type="report",
                     mode=mode)
    try:
        log_table_to_wandb(table, run)
        for i, clip in enumerate(clips):
            log_table_to_wandb(clip, run, key="clip_table" if i == 0 else f"clip_table_{i + 1}")
        run.log({str(p.relative_to(out).with_suffix("")): wandb.Image(str(p)) for p in figures})
    finally:
        run.finish()
