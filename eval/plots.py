"""Paper-style figures (matplotlib, Agg backend, PNG), in Table 1's units and with Table 1's labels.

- ``plot_score_vs_compute``: Figure 3a of the GRAFT paper. One panel per Table-1 block; one
  point per row at (compute charged to the model, Avg score x100), error bar = sd over seeds.
  Compute is the ``joint_charge`` figure (co-trained methods pay for the pair); a stored-peer
  method also shows its amortized cost as a hollow marker joined by a dashed line.
- ``plot_fractions``: Figure 1 (right). Per training step, the fraction of all-fail groups and
  the fraction of all-fail prompts that the peer solved, one line per (row, model, peer),
  averaged over seeds at each step, smoothed (``smooth``, an EMA) over the raw trace drawn faint.
- the complementarity heat map (``complementarity.png``): for each row and population, comp(L, P) of every ordered
  pair of co-trained models, the paper's Figure 1 for N models (docs/algorithms.md#populations).
- ``plot_learning_curve``: reward and held-out score (x100, as Table 1) against the training step, one column per
  model and quantity, one line per row: the mean over seeds with a ± sd band, and each run (seed) of a row with two or
  more as a thin line of its own (a shade of the row's colour, a dash per seed, named in the legend). Held-out
  markers are every evaluation the runs made (``eval/avg`` in metrics.jsonl), at the number of updates done: the
  one before training (logged at step -1) at x = 0, every ``run.eval_every`` steps, at the end; ± sd bars where a
  row has >= 2 seeds, a bare marker for one seed; markers of different rows at one x set slightly apart
  (``dodge``).

A series is labelled as its row of Table 1 (``run_labels``: ``Table.labels``, one label per method whatever case its
runs wrote it in, with the row's tag where a method has several rows), so the legends and the table name the same
things. Every figure draws a label the same way (``method_styles``: colour and marker from the sorted labels over all
runs; ``PALETTE`` separates 20 colours, the baseline row is dark grey), labels axes in words (``axis_label``) and
puts its legend outside the data area. More than ``MOST_IN_ONE_PANEL`` rows (besides the baseline):
``plot_fractions`` and ``plot_learning_curve`` draw small multiples, one row of panels per group of at most
``PER_PANEL`` labels (``method_panels``: grouped by algorithm), the baseline repeated in each row.

Captions are text beside the image, not in it: ``draw_figures`` (and ``write_figures``) write ``figures.md`` (each
image with its caption) and ``figures.json`` (each figure's caption, legend labels and series) next to the PNGs;
``captions_in_images`` also prints a caption under the panels.
"""
from __future__ import annotations

import json
import math
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from graftzoo.contract import metrics as M  # noqa: E402
from graftzoo.eval.artifacts import RunRecord  # noqa: E402
from graftzoo.eval.metrics import mean_sd_ci  # noqa: E402
from graftzoo.eval.report import (Table, build_table1, method_labels, method_of, normalize_label,  # noqa: E402
                                  repeat_tags, resolve_label)

AXIS_LABELS = {
    M.GROUPS_ALL_FAIL: "all-fail groups (fraction)",
    M.PEER_SOLVED_ALL_FAIL_FRAC: "all-fail prompts the peer solved (fraction)",
    M.REWARD_MEAN: "mean reward",
    M.REWARD_ACC: "reward accuracy (fraction correct)",
    M.EVAL_AVG: "held-out score (avg@k x100)",
}
FIGURES = ("score_vs_compute.png", "fractions.png", "learning_curve.png", "complementarity.png")
SIDECARS = ("figures.md", "figures.json")   # what ``draw_figures`` writes beside the images: captions and legends
SCORE_SCALE = 100.0   # held-out scores are drawn x100, as Table 1 shows them (points)


def axis_label(key: str) -> str:
    """A metric key in words for an axis ("groups/all_fail" -> "all-fail groups (fraction)")."""
    return AXIS_LABELS.get(key, key.replace("/", " ").replace("_", " "))


# The method palette: tab10 without its grey, then 11 colours picked one at a time from the xkcd colour names
# (lightness 28-72, chroma 35-85 in CIELAB: no pastels, no neon) as the farthest from those already chosen and from
# BASELINE_COLOR. Any two are at least 27 apart in CIELAB (ΔE*ab; 2.3 is a just-noticeable difference).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#4b5d16", "#ff0789", "#1d5dec", "#9a6200", "#920a4e", "#fe828c", "#65ab7c", "#a00498", "#ccad60",
           "#c071fe", "#7f2b0a")
MARKERS = ("o", "s", "D", "^", "v", "<", ">", "P", "X", "*")
BASELINE_COLOR = "#333333"   # the baseline, in every figure: dark grey, drawn under the methods
MOST_IN_ONE_PANEL = 8        # more methods than this (besides the baseline): small multiples ...
PER_PANEL = 4                # ... of at most this many methods each, the baseline repeated in every one


@dataclass(frozen=True)
class Style:
    """How a label is drawn: a colour and a marker (the marker tells apart colours a reader confuses)."""

    color: str
    marker: str


def method_styles(methods, baseline: Optional[str] = None) -> dict:
    """Label -> ``Style``, from the sorted labels, so that the same label looks the same in every figure. The i-th
    label gets ``PALETTE[i % 20]`` and ``MARKERS[(i + i // 20) % 10]``: distinct colours up to 20 labels, distinct
    (colour, marker) pairs up to 200. ``baseline`` (the baseline row's label, matched in any case) keeps its slot but
    is drawn in ``BASELINE_COLOR``, so a label's style does not depend on which row is the baseline; another row of
    the baseline's method ("GRPO (n=8) [runs/demo]") has a colour of its own, as every row."""
    out = {}
    base = None if baseline is None else normalize_label(baseline)
    for i, m in enumerate(sorted(set(methods))):
        color = BASELINE_COLOR if normalize_label(m) == base else PALETTE[i % len(PALETTE)]
        out[m] = Style(color, MARKERS[(i + i // len(PALETTE)) % len(MARKERS)])
    return out


def method_colors(methods, baseline: Optional[str] = None) -> dict:
    """Label -> colour of ``method_styles``."""
    return {m: s.color for m, s in method_styles(methods, baseline).items()}


def _table_or_none(runs: Sequence[RunRecord], baseline: Optional[str] = None) -> Optional[Table]:
    """Table 1 of ``runs`` (with ``baseline``, else each group's default), or None where they have no row."""
    for base in dict.fromkeys((baseline or None, None)):
        try:
            return build_table1(runs, baseline=base)
        except ValueError:
            continue
    return None


def run_labels(runs: Sequence[RunRecord], table: Optional[Table] = None) -> dict:
    """(str(run path), model) -> the label a figure draws that run's model under: its row's label in Table 1
    (``Table.labels`` of ``table``, else of Table 1 of ``runs``), so that legends and table agree. A model without a
    row (no eval file) is drawn under its method's label (``method_labels``), with the run's folder where a seed
    repeats (``repeat_tags``)."""
    table = _table_or_none(runs) if table is None else table
    out = dict(table.labels) if table is not None else {}
    labels = method_labels(runs)
    missing: dict = {}
    for run in runs:
        if run.status == "failed":
            continue
        for model in run.models:
            if (str(run.path), model) not in out:
                missing.setdefault((method_of(run, labels), model), []).append(run)
    for (method, model), members in missing.items():
        tags = repeat_tags(members, [r.seed for r in members])
        for r in members:
            tag = tags.get(str(r.path))
            out[(str(r.path), model)] = method if tag is None else f"{method} [{tag}]"
    return out


def run_styles(runs: Sequence[RunRecord], baseline: Optional[str] = None, table: Optional[Table] = None) -> dict:
    """``method_styles`` of every label of ``runs`` (``run_labels``)."""
    return method_styles(run_labels(runs, table).values(), baseline)


def run_colors(runs: Sequence[RunRecord], baseline: Optional[str] = None, table: Optional[Table] = None) -> dict:
    """``method_colors`` of every label of ``runs`` (``run_labels``)."""
    return method_colors(run_labels(runs, table).values(), baseline)


def _baseline_label(runs: Sequence[RunRecord], baseline: Optional[str], table: Optional[Table] = None) \
        -> Optional[str]:
    """The label of the row the figures draw in the baseline's grey: the row Table 1 measures Δ against in most of
    the blocks of ``runs`` (``Block.reference``), else ``baseline`` as ``resolve_label`` reads it; None without
    one."""
    if table is not None:
        paths = {str(r.path) for r in runs}
        refs = Counter(b.reference for b in table.blocks if b.reference
                       and any(p in paths for r in b.rows for p in r.runs))
        if refs:
            return refs.most_common(1)[0][0]
    return resolve_label(baseline, runs) if baseline else None


def method_panels(methods: Sequence[str], family: dict, baseline: Optional[str] = None,
                  most: int = MOST_IN_ONE_PANEL, per_panel: int = PER_PANEL) -> list:
    """The methods of each row of small multiples, the baseline left out (every row draws it). At most ``most``
    methods besides the baseline: one row of all of them (sorted). More: methods grouped by ``family`` (method ->
    its algorithm), the baseline's family first, then by name; a family larger than ``per_panel`` split into
    near-equal parts; consecutive groups merged while they fit in ``per_panel``."""
    rest = sorted(m for m in set(methods) if m != baseline)
    if len(rest) <= most:
        return [rest] if rest else []
    fams: dict = {}
    for m in rest:
        fams.setdefault(family.get(m, m), []).append(m)
    first = family.get(baseline) if baseline is not None else None
    groups = []
    for name in sorted(fams, key=lambda f: (f != first, f)):
        members = fams[name]
        parts = -(-len(members) // per_panel)
        size = -(-len(members) // parts)
        groups += [members[i:i + size] for i in range(0, len(members), size)]
    rows = [groups[0]]
    for g in groups[1:]:
        if len(rows[-1]) + len(g) <= per_panel:
            rows[-1] = rows[-1] + g
        else:
            rows.append(g)
    return rows


def dodge(n: int, spread: float) -> list:
    """x offsets of ``n`` markers that share an x, spread evenly over ``spread`` around 0 so that none hides
    another (docs/guide.md#reports-plots-and-wandb): ``(i - (n - 1) / 2) * spread / (n - 1)``; [0.0] for one."""
    if n <= 1:
        return [0.0] * n
    return [(i - (n - 1) / 2) * spread / (n - 1) for i in range(n)]


def smooth(values: Sequence[float], weight: float = 0.6) -> list:
    """Debiased exponential moving average (TensorBoard's): ``m_t = w m_{t-1} + (1 - w) x_t``, divided by
    ``1 - w^t`` so the first points are not pulled towards 0. ``weight`` in [0, 1); 0 leaves the values."""
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out, m = [], 0.0
    for t, x in enumerate(values, 1):
        m = weight * m + (1 - weight) * x
        out.append(m / (1 - weight ** t))
    return out


SEED_DASHES = ((0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (3, 3)), (0, (8, 2, 1, 2, 1, 2)),
               (0, (2, 1)))
"""Line styles of single runs, by the seed's place among the figure's seeds: the same seed is drawn the same way in
every panel, and a legend entry says which dash is which seed."""


def seed_shade(color: str, i: int, n: int) -> str:
    """The colour of the i-th of n runs of one row: ``color`` blended 15% to 50% of the way to white (to black for a
    light colour), in even steps, never ``color`` itself: each run is told from the others and from the row's mean
    (drawn in ``color``)."""
    rgb = mcolors.to_rgb(color)
    amount = 0.15 + 0.35 * (i / (n - 1) if n > 1 else 0.0)
    light = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 0.6
    target = (0.0, 0.0, 0.0) if light else (1.0, 1.0, 1.0)
    return mcolors.to_hex(tuple(c + (g - c) * amount for c, g in zip(rgb, target)))


@dataclass
class Drawn:
    """A figure before it is saved: the matplotlib figure, its caption, its legend's labels (Table 1's row labels,
    in legend order) and the series it draws (one dict each: label, model, seed (None: the mean over seeds), colour,
    line style, marker)."""

    fig: object
    caption: str
    labels: list
    series: list = field(default_factory=list)


@dataclass
class FigureInfo:
    """A figure as ``draw_figures`` wrote it: its file, title, caption (written in figures.md and the report's
    report.md, beside the image), the labels of its legend (as Table 1's rows) and its series (``Drawn``)."""

    path: Path
    title: str
    caption: str
    labels: list
    series: list = field(default_factory=list)


def _legend_outside(fig, axes, extra: Sequence = ()) -> None:
    """One legend for the figure, right of the panels (labels de-duplicated; ``extra`` handles at its end)."""
    seen = _handles(axes)
    seen.update({h.get_label(): h for h in extra})
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8,
                   frameon=False)


def _handles(axes) -> dict:
    seen: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    return seen


def _row_legends(rows, extra: Sequence = ()) -> None:
    """Small multiples: one legend per row of panels, right of the row's last panel (``extra`` at the end of each)."""
    for row in rows:
        seen = _handles(row)
        if seen:
            seen.update({h.get_label(): h for h in extra})
            row[-1].legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           fontsize=7, frameon=False)


def _families(runs: Sequence[RunRecord], labels: dict) -> dict:
    """Label (``run_labels``) -> its algorithm (``algo.name`` of its first run): the families of ``method_panels``."""
    out: dict = {}
    for run in runs:
        for (path, _), label in labels.items():
            if path == str(run.path):
                out.setdefault(label, str((run.config.get("algo") or {}).get("name") or label))
    return out


def _panels_caption(rows: list, baseline: Optional[str]) -> str:
    if len(rows) <= 1:
        return ""
    text = f" Rows of Table 1 in rows of panels of at most {PER_PANEL}, grouped by algorithm"
    return text + (f"; the baseline {baseline} (dark grey) is repeated in every row." if baseline else ".")


def _legend_order(labels, baseline: Optional[str]) -> list:
    """The legend's labels: the baseline first, then the others sorted."""
    labels = sorted(set(labels))
    return ([baseline] if baseline in labels else []) + [x for x in labels if x != baseline]


UNITS = {"gpu_h": "GPU-hours", "cpu_s": "CPU-seconds", "wall_s": "wall-clock seconds"}


def _pick_unit(rows: list) -> str:
    """GPU-h when every plotted row used GPUs, else process CPU seconds."""
    return "gpu_h" if rows and all(r.compute["gpu_h"] > 0 for r in rows) else "cpu_s"


def _score_vs_compute(runs: Sequence[RunRecord], baseline: Optional[str], unit: Optional[str],
                      table: Optional[Table]) -> Drawn:
    table = build_table1(runs, baseline=baseline) if table is None else table
    paths = {str(r.path) for r in runs}
    blocks = [(b, [r for r in b.rows if r.compute is not None and r.avg.mean is not None
                   and any(p in paths for p in r.runs)]) for b in table.blocks]
    blocks = [(b, rows) for b, rows in blocks if rows]
    if not blocks:
        raise ValueError("no method has both an Avg score and recorded compute "
                         "(summary.json 'compute')")
    if unit is None:
        unit = _pick_unit([r for _, rows in blocks for r in rows])
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {sorted(UNITS)}, got {unit!r}")
    base = _baseline_label(runs, baseline, table)
    styles = method_styles(run_labels(runs, table).values(), base)   # as every figure: from the runs' labels
    series = []
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4.2), squeeze=False)
    for ax, (block, rows) in zip(axes[0], blocks):
        for r in rows:
            label = r.label    # Table 1's row label: the method, with its tag where it has several rows
            style = styles.get(label) or styles.get(r.same_as or r.method, Style("black", "o"))   # an alias: its
            #                                                                            method's (the same runs)
            color = style.color
            err = None if r.avg.sd is None else [SCORE_SCALE * r.avg.sd]
            y, x = SCORE_SCALE * r.avg.mean, r.compute[unit]
            ax.errorbar([x], [y], yerr=err, fmt=style.marker, color=color, capsize=3, label=label)
            series.append({"label": label, "model": block.model, "seed": None, "color": color, "linestyle": "",
                           "marker": style.marker})
            if r.compute_amortized is not None:
                xa = r.compute_amortized[unit]
                ax.errorbar([xa], [y], yerr=err, fmt=style.marker, mfc="none", color=color, capsize=3)
                ax.plot([x, xa], [y, y], ls="--", color=color, lw=0.8)
        group = block.group
        ax.set_title(block.title + (f"\n{group}" if group else ""), fontsize=9)
        ax.set_xlabel(f"compute ({UNITS[unit]})")
        ax.set_ylabel("Avg score (avg@k x100)")
        ax.grid(alpha=0.3)
    _legend_outside(fig, axes[0])
    caption = ("Avg score (x100, as in Table 1) against compute, one panel per block of Table 1, one point per row. "
               "Filled marker: compute charged to the model (co-trained runs pay for both models). "
               "Hollow marker joined by a dashed line: amortized cost of a stored-peer run, which adds the cost of "
               "the earlier run whose trajectories it reused. Error bars: ± sd over training seeds (n − 1), none for "
               "one seed." + (f" The baseline {base} is dark grey." if base else ""))
    return Drawn(fig, caption, list(dict.fromkeys(s["label"] for s in series)), series)


def plot_score_vs_compute(runs: Sequence[RunRecord], out_png, baseline: Optional[str] = "GRPO (n=8)",
                          unit: Optional[str] = None, table: Optional[Table] = None,
                          captions_in_images: bool = False) -> Path:
    """Figure 3a: Avg score (x100) against compute; ``unit`` in UNITS (default: auto); ``baseline`` as
    ``build_table1`` takes it; ``table``: Table 1 the points come from (default: that of ``runs``)."""
    return _save(_score_vs_compute(runs, baseline, unit, table), out_png, captions_in_images, -0.04)


def _fraction_lines(runs: Sequence[RunRecord], keys: tuple, wanted, labels: dict) -> dict:
    """{key: {(line label, row label, model): {step: [value per seed]}}} of the runs (``wanted``: their labels or
    None); the row label as ``run_labels`` gives it (``labels``)."""
    lines: dict = {k: {} for k in keys}
    for run in runs:
        if run.status == "failed" or (wanted is not None and normalize_label(run.variant) not in wanted
                                      and not any(normalize_label(labels.get((str(run.path), m), "")) in wanted
                                                  for m in run.models)):
            continue
        for model in run.models:
            method = labels[(str(run.path), model)]
            peer = run.peers[model]
            label = f"{method}: {model}" + ("" if peer is None else f" (peer {peer})")
            for key in keys:
                steps, values = run.series(model, key)
                for st, v in zip(steps, values):
                    lines[key].setdefault((label, method, model), {}).setdefault(st, []).append(v)
    return lines


def _fractions(runs: Sequence[RunRecord], all_fail_key: str, solved_key: str, methods, weight: float,
               baseline: Optional[str], table: Optional[Table]) -> Drawn:
    keys = (all_fail_key, solved_key)
    table = _table_or_none(runs, baseline) if table is None else table
    labels = run_labels(runs, table)
    wanted = None if methods is None else {normalize_label(m) for m in methods}
    lines = _fraction_lines(runs, keys, wanted, labels)
    if not any(lines.values()):
        raise ValueError(f"no run logs {all_fail_key!r} or {solved_key!r} in metrics.jsonl")
    base = _baseline_label(runs, baseline, table)
    styles = method_styles(labels.values(), base)
    models = sorted({m for run in runs for m in run.models})
    drawn = {method for per_key in lines.values() for (_, method, _) in per_key}
    rows = method_panels(drawn, _families(runs, labels), base) or [[]]
    dashes = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 4.2 if len(rows) == 1 else 2.8 * len(rows) + 0.6),
                             squeeze=False, sharex=True)
    titles = ("prompts where every rollout failed", "of those, prompts the peer solved")
    series: dict = {}
    for g, group in enumerate(rows):
        shown = set(group) | ({base} if base in drawn else set())
        for ax, key, title in zip(axes[g], keys, titles):
            for (label, method, model), per_step in sorted(lines[key].items(), key=lambda kv: kv[0][1] != base):
                if method not in shown:
                    continue
                steps = sorted(per_step)
                raw = [math.fsum(per_step[st]) / len(per_step[st]) for st in steps]
                style = dict(color=styles[method].color, ls=dashes[models.index(model) % len(dashes)])
                ax.plot(steps, raw, alpha=0.25, lw=0.8, **style)
                ax.plot(steps, smooth(raw, weight), label=label, lw=1.2 if method == base else 1.6, **style)
                series.setdefault((method, model), {"label": method, "model": model, "seed": None,
                                                    "color": style["color"], "linestyle": style["ls"], "marker": ""})
            if g == 0:
                ax.set_title(title, fontsize=9)
            ax.set_ylabel(axis_label(key), fontsize=8 if len(rows) > 1 else None)
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    if len(rows) == 1:
        _legend_outside(fig, axes[0])
    else:
        _row_legends(axes)
    caption = (f"Per training step, the fraction of prompts where every rollout failed (left) and, of those, the "
               f"fraction the peer solved (right), mean over seeds. Thick line: exponential moving average (weight "
               f"{weight}); faint line: the raw per-step value; colour: the row of Table 1; line style: the model."
               + _panels_caption(rows, base))
    return Drawn(fig, caption, _legend_order(drawn, base), list(series.values()))


def plot_fractions(runs: Sequence[RunRecord], out_png, all_fail_key: str = M.GROUPS_ALL_FAIL,
                   solved_key: str = M.PEER_SOLVED_ALL_FAIL_FRAC,
                   methods: Optional[Sequence[str]] = None, weight: float = 0.6,
                   baseline: Optional[str] = "GRPO (n=8)", table: Optional[Table] = None,
                   captions_in_images: bool = False) -> Path:
    """Figure 1 (right): per-step all-fail fraction and peer-solved fraction of all-fail prompts, smoothed
    (``smooth(weight)``) over the faint raw trace; colour = row of Table 1, line style = model. More than
    ``MOST_IN_ONE_PANEL`` rows: one row of panels per group of ``method_panels``, the baseline in each.

    ``methods`` restricts the lines to those labels, in any case (default: all runs with the metrics).
    """
    return _save(_fractions(runs, all_fail_key, solved_key, methods, weight, baseline, table), out_png,
                 captions_in_images)


def complementarity_matrices(runs: Sequence[RunRecord], labels: dict) -> dict:
    """(row label, models) -> {(learner, peer): mean comp(L, P) over the steps and runs} of the co-trained runs of
    two or more models (docs/algorithms.md#populations): ``peer/comp/<P>`` where a learner has several peers,
    ``peer/mixed_on_all_fail_frac`` where it has one; a pair never logged is left out."""
    values: dict = {}
    for run in runs:
        if run.status == "failed" or len(run.models) < 2:
            continue
        cells = values.setdefault((labels[(str(run.path), run.models[0])], tuple(run.models)), {})
        for learner in run.models:
            peers = [p for p in run.models if p != learner]
            for peer in peers:
                key = M.PEER_COMP.of(peer=peer) if len(peers) >= 2 else M.PEER_MIXED_ON_ALL_FAIL_FRAC
                cells.setdefault((learner, peer), []).extend(run.series(learner, key)[1])
    return {k: {pair: math.fsum(v) / len(v) for pair, v in cells.items() if v} for k, cells in values.items()}


def _complementarity(runs: Sequence[RunRecord], table: Optional[Table]) -> Drawn:
    labels = run_labels(runs, _table_or_none(runs) if table is None else table)
    mats = {k: m for k, m in complementarity_matrices(runs, labels).items() if m}
    if not mats:
        raise ValueError("no co-trained run of two or more models logs peer/comp/* or peer/mixed_on_all_fail_frac")
    fig, axes = plt.subplots(1, len(mats) + 1, figsize=(3.6 * len(mats) + 0.8, 3.6), squeeze=False,
                             gridspec_kw={"width_ratios": [1.0] * len(mats) + [0.06]})
    for ax, ((label, models), cells) in zip(axes[0][:-1], sorted(mats.items())):
        grid = [[cells.get((l, p), math.nan) for p in models] for l in models]
        im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8,
                            color="white" if v < 0.5 else "black")
        ax.set_xticks(range(len(models)), [m.split("/")[-1] for m in models], rotation=30, ha="right", fontsize=7)
        ax.set_yticks(range(len(models)), [m.split("/")[-1] for m in models], fontsize=7)
        ax.set_xlabel("peer P", fontsize=8)
        ax.set_ylabel("learner L", fontsize=8)
        ax.set_title(f"{label}: {len(models)} models", fontsize=9)
    fig.colorbar(im, cax=axes[0][-1], label="comp(L, P)")
    caption = ("For each ordered pair of co-trained models, comp(L, P): the fraction of the learner's all-fail "
               "prompts where the peer's group is mixed, the mean over every training step and seed of a row "
               "(the paper's Figure 1 for N models, docs/algorithms.md#populations); the diagonal is empty.")
    series = [{"label": label, "model": f"{l} <- {p}", "seed": None, "value": v}
              for (label, _), cells in sorted(mats.items()) for (l, p), v in cells.items()]
    return Drawn(fig, caption, sorted({label for label, _ in mats}), series)


def _curve(per_run: list) -> tuple:
    """(steps, mean, sd, n) over runs of {step: value} dicts: n runs have the step; sd over them (n − 1), 0 where
    one run has the step."""
    steps = sorted({st for d in per_run for st in d})
    mean, sd, count = [], [], []
    for st in steps:
        vals = [d[st] for d in per_run if st in d]
        if len(vals) > 1:
            m, s_, _, _ = mean_sd_ci(vals)
        else:
            m, s_ = vals[0], 0.0
        mean.append(float(m))
        sd.append(float(s_))
        count.append(len(vals))
    return steps, mean, sd, count


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _heldout_points(run: RunRecord, model: str) -> dict:
    """{updates done: held-out score (a fraction)} of a run's evaluations (``eval/avg`` in metrics.jsonl). The trainer
    logs the evaluation before training at step -1 (x = 0), one made after step s's update in step s's record, next
    to its training metrics (x = s + 1), and the final one at step ``run.steps`` in a record of its own
    (x = run.steps). The final eval file stands in when metrics.jsonl has no ``eval/avg``."""
    pts = {}
    for r in run.metrics:
        if r[M.MODEL] != model or not _number(r.get(M.EVAL_AVG)):
            continue
        st = int(r[M.STEP])
        trained = _number(r.get(M.REWARD_MEAN)) or _number(r.get(M.REWARD_ACC))
        pts[0 if st < 0 else st + 1 if trained else st] = float(r[M.EVAL_AVG])
    ev = run.evals.get(model)
    if ev is not None and not pts:
        whole = ev.get("overall") or {}
        avg = whole.get("avg")
        if avg is None:
            avg = math.fsum(b["avg"] for b in ev["benchmarks"].values()) / len(ev["benchmarks"])
        pts[int(ev["step"]) + 1] = float(avg)
    return pts


def _eval_kinds(runs: Sequence[RunRecord]) -> str:
    """The caption's account of the held-out markers: which evaluations the runs made."""
    live = [run for run in runs if run.status != "failed"]
    evals = [[r for r in run.metrics if _number(r.get(M.EVAL_AVG))] for run in live]
    start = sum(any(int(r[M.STEP]) < 0 for r in recs) for recs in evals)
    if start == 0:
        kinds = ["no run evaluated before training (run.eval_at_start false), so none is drawn at x = 0"]
    else:
        kinds = ["x = 0: before training" + ("" if start == len(live) else f", in {start} of {len(live)} runs")]
    if any(_number(r.get(M.REWARD_MEAN)) for recs in evals for r in recs):
        kinds.append("during training (run.eval_every)")
    kinds.append("at the end")
    return "; ".join(kinds)


def _learning_data(runs: Sequence[RunRecord], reward_key: str, labels: dict) -> tuple:
    """({(row, model, label): [(seed, {x: value}) per run]}, {label: seeds}); row 0 reward, row 1 held-out (x100, as
    Table 1); label as ``run_labels`` gives it (``labels``)."""
    data: dict = {}
    seeds: dict = {}
    for run in runs:
        if run.status == "failed":
            continue
        for model in run.models:
            method = labels[(str(run.path), model)]
            seeds.setdefault(method, set()).add(run.seed)
            steps, values = run.series(model, reward_key)
            if steps:
                data.setdefault((0, model, method), []).append((run.seed, dict(zip(steps, values))))
            pts = _heldout_points(run, model)
            if pts:
                data.setdefault((1, model, method), []).append(
                    (run.seed, {x: SCORE_SCALE * v for x, v in pts.items()}))
    return data, {m: len(s) for m, s in seeds.items()}


def _draw_runs(ax, per_run: list, style: Style, seed_rank: dict, offset: float = 0.0) -> list:
    """Each run of a row with two or more as a thin line (``seed_shade`` of the row's colour, the seed's dash of
    ``SEED_DASHES``); the series drawn."""
    if len(per_run) < 2:
        return []
    drawn = []
    for i, (seed, d) in enumerate(sorted(per_run, key=lambda sd: sd[0])):
        xs = sorted(d)
        color = seed_shade(style.color, i, len(per_run))
        dash = SEED_DASHES[seed_rank[seed] % len(SEED_DASHES)]
        ax.plot([x + offset for x in xs], [d[x] for x in xs], color=color, ls=dash, lw=0.9, alpha=0.9, zorder=1)
        drawn.append((seed, color, dash))
    return drawn


def _draw_reward(ax, per_run: list, style: Style, label: str, is_base: bool) -> None:
    steps, mean, sd, _ = _curve([d for _, d in per_run])
    ax.plot(steps, mean, color=style.color, label=label, lw=1.2 if is_base else 1.6, marker=style.marker, ms=4,
            markevery=max(1, len(steps) // 5), zorder=2 if is_base else 3)
    ax.fill_between(steps, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)],
                    color=style.color, alpha=0.12, lw=0)


def _draw_heldout(ax, per_run: list, style: Style, label: str, offset: float) -> None:
    """Mean over seeds at each evaluation, ± sd bar where >= 2 seeds have it, a bare marker where one has."""
    xs, mean, sd, count = _curve([d for _, d in per_run])
    xs = [x + offset for x in xs]
    ax.plot(xs, mean, color=style.color, label=label, lw=0.9, alpha=0.7)
    many = [i for i, c in enumerate(count) if c >= 2]
    if many:
        ax.errorbar([xs[i] for i in many], [mean[i] for i in many], yerr=[sd[i] for i in many], fmt=style.marker,
                    color=style.color, ms=5, capsize=3, elinewidth=1.1, ls="none")
    one = [i for i, c in enumerate(count) if c == 1]
    if one:
        ax.plot([xs[i] for i in one], [mean[i] for i in one], ls="none", marker=style.marker, color=style.color,
                ms=5)


def _spread(data: dict, model: str, methods: list, alone: bool) -> float:
    """The width over which ``dodge`` spreads one x's held-out markers in a panel: 40% of the smallest gap between
    evaluations, at most 8% of the panel's steps; 1.2 steps in a narrow panel of one evaluation (``alone``)."""
    if alone:
        return 1.2
    xs = sorted({x for row in (0, 1) for m in methods for _, d in data.get((row, model, m), []) for x in d})
    span = max(xs[-1] - xs[0], 1) if xs else 1
    evals = sorted({x for m in methods for _, d in data.get((1, model, m), []) for x in d})
    gaps = [b - a for a, b in zip(evals, evals[1:])]
    return min([0.08 * span] + [0.4 * g for g in gaps])


def _learning_axes(n_rows: int, models: list, alone: bool) -> tuple:
    """(fig, axes, {(row, 0 reward | 1 held-out, model): ax}). One row of labels: reward over held-out, one column
    per model, x shared. Small multiples: a row per group, a (reward, held-out) pair of columns per model, each
    column sharing its axes; a held-out column narrow when every run evaluated once (``alone``)."""
    if n_rows == 1:
        fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 6.5), squeeze=False, sharex="col")
        return fig, axes, {(0, q, model): axes[q][j] for q in (0, 1) for j, model in enumerate(models)}
    ratios = [1.0, 0.4 if alone else 1.0] * len(models)
    fig, axes = plt.subplots(n_rows, 2 * len(models), figsize=(3.4 * sum(ratios) + 0.6, 2.5 * n_rows + 0.8),
                             squeeze=False, sharex="col", sharey="col", gridspec_kw={"width_ratios": ratios})
    return fig, axes, {(g, q, model): axes[g][2 * j + q] for g in range(n_rows) for q in (0, 1)
                       for j, model in enumerate(models)}


def _learning_curve(runs: Sequence[RunRecord], reward_key: str, baseline: Optional[str],
                    table: Optional[Table]) -> Drawn:
    table = _table_or_none(runs, baseline) if table is None else table
    labels = run_labels(runs, table)
    data, seeds = _learning_data(runs, reward_key, labels)
    if not data:
        raise ValueError(f"no run logs {reward_key!r} or a held-out score")
    base = _baseline_label(runs, baseline, table)
    styles = method_styles(labels.values(), base)
    models = sorted({model for _, model, _ in data})
    drawn = {method for *_, method in data}
    rows = method_panels(drawn, _families(runs, labels), base) or [[]]
    evals = sorted({x for (q, _, _), per_run in data.items() if q == 1 for _, d in per_run for x in d})
    alone = len(rows) > 1 and len(evals) == 1
    seed_rank = {s: i for i, s in enumerate(sorted({s for per_run in data.values() for s, _ in per_run}))}
    fig, axes, ax_of = _learning_axes(len(rows), models, alone)
    series: dict = {}
    dashes_used: dict = {}
    for (g, q, model), ax in ax_of.items():
        shown = ([base] if base in drawn else []) + rows[g]
        present = [m for m in shown if (q, model, m) in data]
        offsets = dict(zip(present, dodge(len(present), _spread(data, model, present, alone)))) if q == 1 else {}
        for m in present:
            n = seeds[m]
            label = f"{m}: {n} seed{'s' if n != 1 else ''}" + (" (baseline)" if m == base else "")
            per_run = data[(q, model, m)]
            if q == 0:
                _draw_reward(ax, per_run, styles[m], label, m == base)
            else:
                _draw_heldout(ax, per_run, styles[m], label, offsets[m])
            series.setdefault((m, model, None), {"label": m, "model": model, "seed": None,
                                                 "color": styles[m].color, "linestyle": "-",
                                                 "marker": styles[m].marker})
            for seed, color, dash in _draw_runs(ax, per_run, styles[m], seed_rank, offsets.get(m, 0.0)):
                dashes_used[seed] = dash
                series.setdefault((m, model, seed), {"label": m, "model": model, "seed": seed, "color": color,
                                                     "linestyle": str(dash), "marker": ""})
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        if q == 1 and alone:
            ax.set_xticks(evals)
            ax.set_xlim(evals[0] - 1, evals[0] + 1)
    keys = [Line2D([], [], color="#777777", ls=dashes_used[s], lw=0.9, label=f"run of seed {s} (thin)")
            for s in sorted(dashes_used)]
    _label_learning_axes(fig, axes, models, reward_key, len(rows), keys)
    runs_words = (" Thin lines: each run of a row with 2 or more seeds, in a shade of the row's colour, dashed by its "
                  "seed (legend)." if dashes_used else "")
    caption = ("Reward (top) and held-out score (x100, as in Table 1; bottom) against the training step, one line "
               "per row of Table 1. Line: mean over training seeds; band: ± sd over seeds (n − 1)." + runs_words +
               f" Held-out markers: the runs' evaluations, at the number of updates done ({_eval_kinds(runs)}); "
               "error bar: ± sd over seeds (n − 1) where a row has 2 or more seeds, a bare marker where it has one; "
               "markers at the same step are set slightly apart." + _panels_caption(rows, base))
    return Drawn(fig, caption, _legend_order(drawn, base), list(series.values()))


def learning_curve_figure(runs: Sequence[RunRecord], reward_key: str = M.REWARD_MEAN,
                          baseline: Optional[str] = "GRPO (n=8)", table: Optional[Table] = None,
                          captions_in_images: bool = False):
    """The figure of ``plot_learning_curve`` (a matplotlib Figure; the caller saves or closes it)."""
    drawn = _learning_curve(runs, reward_key, baseline, table)
    if captions_in_images:
        _caption(drawn.fig, drawn.caption)
    return drawn.fig


def _label_learning_axes(fig, axes, models: list, reward_key: str, n_rows: int, keys: Sequence = ()) -> None:
    if n_rows == 1:
        for j, model in enumerate(models):
            axes[0][j].set_title(model, fontsize=9)
            axes[0][j].set_ylabel(axis_label(reward_key))
            axes[1][j].set_ylabel(axis_label(M.EVAL_AVG))
            axes[1][j].set_xlabel("training step")
        _legend_outside(fig, axes.ravel(), keys)
        return
    for j, model in enumerate(models):
        axes[0][2 * j].set_title(f"{model}\n{axis_label(reward_key)}", fontsize=8)
        axes[0][2 * j + 1].set_title(f"{model}\n{axis_label(M.EVAL_AVG)}", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("training step", fontsize=8)
    for row in axes:
        for ax in row:
            ax.tick_params(labelsize=7)
    _row_legends(axes, keys)


def plot_learning_curve(runs: Sequence[RunRecord], out_png, reward_key: str = M.REWARD_MEAN,
                        baseline: Optional[str] = "GRPO (n=8)", table: Optional[Table] = None,
                        captions_in_images: bool = False) -> Path:
    """Reward (top row) and held-out score (x100; bottom row) against the training step, one column per model,
    one line per row of Table 1: mean over seeds with a ± sd band, each run of a row with >= 2 seeds a thin line of
    its own; held-out markers at every evaluation the runs made (the one before training at x = 0), ± sd bars where
    a row has >= 2 seeds, set apart sideways (``dodge``). More than ``MOST_IN_ONE_PANEL`` rows: one row of panels
    per group of ``method_panels``, the baseline (dark grey) in each."""
    return _save(_learning_curve(runs, reward_key, baseline, table), out_png, captions_in_images)


TITLES = {"score_vs_compute.png": "Score against compute", "fractions.png": "All-fail groups and the peer's help",
          "learning_curve.png": "Learning curves", "complementarity.png": "Complementarity of each ordered pair"}


def draw_figures(runs: Sequence[RunRecord], out_dir, baseline: Optional[str] = "GRPO (n=8)", echo=print,
                 table: Optional[Table] = None, captions_in_images: bool = False) -> list:
    """``FIGURES`` into ``out_dir``, with ``SIDECARS`` beside them: ``figures.md`` (each image, then its caption) and
    ``figures.json`` (per figure: file, title, caption, legend labels and series); a list of ``FigureInfo``. A figure
    without data is skipped and said. ``baseline`` "" or None: a table without a baseline row (no row drawn in the
    baseline's grey). ``table``: Table 1 whose labels the figures use (default: that of ``runs``; a report of several
    groups passes its own so that each group's figures name rows as the whole table does)."""
    out = Path(out_dir)
    baseline = baseline or None
    table = _table_or_none(runs, baseline) if table is None else table
    builders = {"score_vs_compute.png": lambda: _score_vs_compute(runs, baseline, None, table),
                "fractions.png": lambda: _fractions(runs, M.GROUPS_ALL_FAIL, M.PEER_SOLVED_ALL_FAIL_FRAC, None, 0.6,
                                                    baseline, table),
                "learning_curve.png": lambda: _learning_curve(runs, M.REWARD_MEAN, baseline, table),
                "complementarity.png": lambda: _complementarity(runs, table)}
    written = []
    for name in FIGURES:
        try:
            if name == "score_vs_compute.png" and table is None:
                raise ValueError("no run with an eval/<model>.json to tabulate")
            drawn = builders[name]()
        except ValueError as e:
            echo(f"figure {name} skipped: {e}")
            continue
        path = _save(drawn, out / name, captions_in_images, -0.04 if name == "score_vs_compute.png" else -0.02)
        written.append(FigureInfo(path=path, title=TITLES[name], caption=drawn.caption, labels=drawn.labels,
                                  series=drawn.series))
    if written:
        (out / "figures.json").write_text(json.dumps(
            [{**asdict(f), "path": f.path.name} for f in written], indent=2, ensure_ascii=False) + "\n",
            encoding="utf-8")
        (out / "figures.md").write_text(figures_markdown(written, out), encoding="utf-8")
    return written


def figures_markdown(figures: Sequence[FigureInfo], folder: Path, level: int = 2) -> str:
    """Markdown of ``figures``: per figure a heading, the image (its path relative to ``folder``) and its caption
    in italics under it."""
    out = []
    for i, f in enumerate(figures, 1):
        rel = Path(f.path).resolve().relative_to(Path(folder).resolve()).as_posix()
        out += [f"{'#' * level} {f.title}", "", f"![{f.title}]({rel})", "", f"*Figure {i}. {f.caption}*", ""]
    return "\n".join(out)


def write_figures(runs: Sequence[RunRecord], out_dir, baseline: Optional[str] = "GRPO (n=8)", echo=print,
                  table: Optional[Table] = None, captions_in_images: bool = False) -> list:
    """``draw_figures``, returning the paths of the images written."""
    return [f.path for f in draw_figures(runs, out_dir, baseline, echo, table, captions_in_images)]


def _caption(fig, text: str, y: float = -0.02) -> None:
    """The caption under the panels, wrapped to the figure's width (about 17 characters an inch at 7 pt)."""
    fig.text(0.01, y, textwrap.fill(text, max(60, int(19 * fig.get_figwidth()))), fontsize=7, ha="left", va="top")


def _save(drawn: Drawn, out_png, captions_in_images: bool = False, y: float = -0.02) -> Path:
    """Save ``drawn``'s figure as a PNG (its caption under the panels only with ``captions_in_images``)."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = drawn.fig
    if captions_in_images:
        _caption(fig, drawn.caption, y)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")  # keeps the legend (and a caption) outside the panels
    plt.close(fig)
    return out
