"""Paper-style figures (matplotlib, Agg backend, PNG).

- ``plot_score_vs_compute``: Figure 3a of the GRAFT paper. One panel per Table-1 block; one
  point per method at (compute charged to the model, Avg score), error bar = sd over seeds.
  Compute is the ``joint_charge`` figure (co-trained methods pay for the pair); a stored-peer
  method also shows its amortized cost as a hollow marker joined by a dashed line.
- ``plot_fractions``: Figure 1 (right). Per training step, the fraction of all-fail groups and
  the fraction of all-fail prompts that the peer solved, one line per (method, model, peer),
  averaged over seeds at each step, smoothed (``smooth``, an EMA) over the raw trace drawn faint.
- ``plot_learning_curve``: reward and held-out score against the training step, one column per model and
  quantity, one line per method: the mean over seeds with a ± sd band. Held-out markers are every evaluation the
  runs made (``eval/avg`` in metrics.jsonl), at the number of updates done: the one before training (logged at
  step -1) at x = 0, every ``run.eval_every`` steps, at the end; ± sd bars where a method has >= 2 seeds, a bare
  marker for one seed; markers of different methods at one x set slightly apart (``dodge``). The caption says
  which evaluations the runs made.

Every figure draws a method the same way (``method_styles``: colour and marker from the sorted labels over all
runs' methods; ``PALETTE`` separates 20 colours, the baseline is dark grey), labels axes in words (``axis_label``)
and puts its legend outside the data area. More than ``MOST_IN_ONE_PANEL`` methods (besides the baseline):
``plot_fractions`` and ``plot_learning_curve`` draw small multiples, one row of panels per group of at most
``PER_PANEL`` methods (``method_panels``: grouped by algorithm), the baseline repeated in each row.
``write_figures`` writes all three.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from graftzoo.contract import metrics as M  # noqa: E402
from graftzoo.eval.artifacts import RunRecord  # noqa: E402
from graftzoo.eval.metrics import mean_sd_ci  # noqa: E402
from graftzoo.eval.report import build_table1, method_labels, method_of, repeat_tags  # noqa: E402

AXIS_LABELS = {
    M.GROUPS_ALL_FAIL: "all-fail groups (fraction)",
    M.PEER_SOLVED_ALL_FAIL_FRAC: "all-fail prompts the peer solved (fraction)",
    M.REWARD_MEAN: "mean reward",
    M.REWARD_ACC: "reward accuracy (fraction correct)",
    M.EVAL_AVG: "held-out score (avg@k)",
}
FIGURES = ("score_vs_compute.png", "fractions.png", "learning_curve.png")


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
    """How a method is drawn: a colour and a marker (the marker tells apart colours a reader confuses)."""

    color: str
    marker: str


def method_styles(methods, baseline: Optional[str] = None) -> dict:
    """Method label -> ``Style``, from the sorted labels, so that the same method looks the same in every figure.
    The i-th label gets ``PALETTE[i % 20]`` and ``MARKERS[(i + i // 20) % 10]``: distinct colours up to 20 methods,
    distinct (colour, marker) pairs up to 200. ``baseline`` (matched case-insensitively, with or without a folder
    tag "[runs/demo]", ``run_labels``) keeps its slot but is drawn in ``BASELINE_COLOR``, so a method's style does
    not depend on which row is the baseline."""
    out = {}
    base = None if baseline is None else baseline.casefold()
    for i, m in enumerate(sorted(set(methods))):
        is_base = base is not None and (m.casefold() == base or m.casefold().startswith(base + " ["))
        color = BASELINE_COLOR if is_base else PALETTE[i % len(PALETTE)]
        out[m] = Style(color, MARKERS[(i + i // len(PALETTE)) % len(MARKERS)])
    return out


def method_colors(methods, baseline: Optional[str] = None) -> dict:
    """Method label -> colour of ``method_styles``."""
    return {m: s.color for m, s in method_styles(methods, baseline).items()}


def run_labels(runs: Sequence[RunRecord]) -> dict:
    """str(run path) -> the label the figures draw a run under: its method (as ``method_labels`` spells it), with the
    run's folder ("GRPO (n=8) [runs/demo]", ``folder_tags`` as Table 1's rows) where two runs of the method train one
    model with the same seed (the same method from two folders)."""
    labels = method_labels(runs)
    by_method: dict = {}
    for run in runs:
        if run.status != "failed":
            by_method.setdefault(method_of(run, labels), []).append(run)
    out = {}
    for method, members in by_method.items():
        seen = [(model, r.seed) for r in members for model in r.models]
        tags = repeat_tags(members, seen)
        for r in members:
            tag = tags.get(str(r.path))
            out[str(r.path)] = method if tag is None else f"{method} [{tag}]"
    return out


def run_styles(runs: Sequence[RunRecord], baseline: Optional[str] = None) -> dict:
    """``method_styles`` of every label of ``runs`` (``run_labels``)."""
    return method_styles(run_labels(runs).values(), baseline)


def run_colors(runs: Sequence[RunRecord], baseline: Optional[str] = None) -> dict:
    """``method_colors`` of every label of ``runs`` (``run_labels``)."""
    return method_colors(run_labels(runs).values(), baseline)


def _baseline_label(runs: Sequence[RunRecord], baseline: Optional[str]) -> Optional[str]:
    """``baseline`` as ``method_labels`` spells it, or None when no run has that method."""
    if baseline is None:
        return None
    return method_labels(runs).get(baseline.casefold())


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


def _legend_outside(fig, axes) -> None:
    """One legend for the figure, right of the panels (labels de-duplicated)."""
    seen = _handles(axes)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8,
                   frameon=False)


def _handles(axes) -> dict:
    seen: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    return seen


def _row_legends(rows) -> None:
    """Small multiples: one legend per row of panels, right of the row's last panel."""
    for row in rows:
        seen = _handles(row)
        if seen:
            row[-1].legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           fontsize=7, frameon=False)


def _families(runs: Sequence[RunRecord], labels: dict) -> dict:
    """Label (``run_labels``) -> its algorithm (``algo.name`` of its first run): the families of ``method_panels``."""
    out: dict = {}
    for run in runs:
        label = labels.get(str(run.path))
        if label is not None:
            out.setdefault(label, str((run.config.get("algo") or {}).get("name") or label))
    return out


def _panels_caption(rows: list, baseline: Optional[str]) -> str:
    if len(rows) <= 1:
        return ""
    text = f" Methods in rows of at most {PER_PANEL}, grouped by algorithm"
    return text + (f"; the baseline {baseline} (dark grey) is repeated in every row." if baseline else ".")

UNITS = {"gpu_h": "GPU-hours", "cpu_s": "CPU-seconds", "wall_s": "wall-clock seconds"}


def _pick_unit(rows: list) -> str:
    """GPU-h when every plotted row used GPUs, else process CPU seconds."""
    return "gpu_h" if rows and all(r.compute["gpu_h"] > 0 for r in rows) else "cpu_s"


def plot_score_vs_compute(runs: Sequence[RunRecord], out_png, baseline: Optional[str] = "GRPO (n=8)",
                          unit: Optional[str] = None) -> Path:
    """Figure 3a: Avg score (x100) against compute; ``unit`` in UNITS (default: auto); ``baseline`` as
    ``build_table1`` takes it."""
    table = build_table1(runs, baseline=baseline)
    blocks = [(b, [r for r in b.rows if r.compute is not None and r.avg.mean is not None])
              for b in table.blocks]
    blocks = [(b, rows) for b, rows in blocks if rows]
    if not blocks:
        raise ValueError("no method has both an Avg score and recorded compute "
                         "(summary.json 'compute')")
    if unit is None:
        unit = _pick_unit([r for _, rows in blocks for r in rows])
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {sorted(UNITS)}, got {unit!r}")
    base = table.baseline or None
    styles = run_styles(runs, base)
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4.2), squeeze=False)
    for ax, (block, rows) in zip(axes[0], blocks):
        for r in rows:
            label = r.label    # the method, with its folder where two rows share seeds
            style = styles.get(label) or styles.get(r.same_as or r.method, Style("black", "o"))
            color = style.color
            err = None if r.avg.sd is None else [100 * r.avg.sd]
            y, x = 100 * r.avg.mean, r.compute[unit]
            ax.errorbar([x], [y], yerr=err, fmt=style.marker, color=color, capsize=3, label=label)
            if r.compute_amortized is not None:
                xa = r.compute_amortized[unit]
                ax.errorbar([xa], [y], yerr=err, fmt=style.marker, mfc="none", color=color, capsize=3)
                ax.plot([x, xa], [y, y], ls="--", color=color, lw=0.8)
        group = block.group
        ax.set_title(block.title + (f"\n{group}" if group else ""), fontsize=9)
        ax.set_xlabel(f"compute ({UNITS[unit]})")
        ax.set_ylabel("Avg score (x100)")
        ax.grid(alpha=0.3)
    _legend_outside(fig, axes[0])
    _caption(fig, "Filled marker: compute charged to the model (co-trained runs pay for both models). "
             "Hollow marker joined by a dashed line: amortized cost of a stored-peer run, which adds the cost of "
             "the earlier run whose trajectories it reused. Error bars: ± sd over training seeds (n − 1), none for one "
             "seed." + (f" The baseline {base} is dark grey." if base else ""), -0.04)
    return _save(fig, out_png)


def _fraction_lines(runs: Sequence[RunRecord], keys: tuple, wanted) -> dict:
    """{key: {(label, method, model): {step: [value per seed]}}} of the runs (``wanted``: variants or None); method
    as ``run_labels`` spells it."""
    labels = run_labels(runs)
    lines: dict = {k: {} for k in keys}
    for run in runs:
        if run.status == "failed" or (wanted is not None and run.variant.casefold() not in wanted):
            continue
        method = labels[str(run.path)]
        for model in run.models:
            peer = run.peers[model]
            label = f"{method}: {model}" + ("" if peer is None else f" (peer {peer})")
            for key in keys:
                steps, values = run.series(model, key)
                for st, v in zip(steps, values):
                    lines[key].setdefault((label, method, model), {}).setdefault(st, []).append(v)
    return lines


def plot_fractions(runs: Sequence[RunRecord], out_png, all_fail_key: str = M.GROUPS_ALL_FAIL,
                   solved_key: str = M.PEER_SOLVED_ALL_FAIL_FRAC,
                   methods: Optional[Sequence[str]] = None, weight: float = 0.6,
                   baseline: Optional[str] = "GRPO (n=8)") -> Path:
    """Figure 1 (right): per-step all-fail fraction and peer-solved fraction of all-fail prompts, smoothed
    (``smooth(weight)``) over the faint raw trace; colour = method, line style = model. More than
    ``MOST_IN_ONE_PANEL`` methods: one row of panels per group of ``method_panels``, the baseline in each.

    ``methods`` restricts the lines to those variants (default: all runs with the metrics).
    """
    keys = (all_fail_key, solved_key)
    wanted = None if methods is None else {m.casefold() for m in methods}
    lines = _fraction_lines(runs, keys, wanted)
    if not any(lines.values()):
        raise ValueError(f"no run logs {all_fail_key!r} or {solved_key!r} in metrics.jsonl")
    base = _baseline_label(runs, baseline)
    styles = run_styles(runs, base)
    models = sorted({m for run in runs for m in run.models})
    drawn = {method for per_key in lines.values() for (_, method, _) in per_key}
    rows = method_panels(drawn, _families(runs, run_labels(runs)), base) or [[]]
    dashes = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 4.2 if len(rows) == 1 else 2.8 * len(rows) + 0.6),
                             squeeze=False, sharex=True)
    titles = ("prompts where every rollout failed", "of those, prompts the peer solved")
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
    _caption(fig, f"Thick line: exponential moving average (weight {weight}); faint line: the raw "
             "per-step value, mean over seeds; line style: the model." + _panels_caption(rows, base))
    return _save(fig, out_png)


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
    """{updates done: held-out score} of a run's evaluations (``eval/avg`` in metrics.jsonl). The trainer logs the
    evaluation before training at step -1 (x = 0), one made after step s's update in step s's record, next to its
    training metrics (x = s + 1), and the final one at step ``run.steps`` in a record of its own (x = run.steps).
    The final eval file stands in when metrics.jsonl has no ``eval/avg``."""
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


def _learning_data(runs: Sequence[RunRecord], reward_key: str) -> tuple:
    """({(row, model, method): [{x: value} per run]}, {method: seeds}); row 0 reward, row 1 held-out; method as
    ``run_labels`` spells it."""
    labels = run_labels(runs)
    data: dict = {}
    seeds: dict = {}
    for run in runs:
        if run.status == "failed":
            continue
        method = labels[str(run.path)]
        seeds.setdefault(method, set()).add(run.seed)
        for model in run.models:
            steps, values = run.series(model, reward_key)
            if steps:
                data.setdefault((0, model, method), []).append(dict(zip(steps, values)))
            pts = _heldout_points(run, model)
            if pts:
                data.setdefault((1, model, method), []).append(pts)
    return data, {m: len(s) for m, s in seeds.items()}


def _draw_reward(ax, per_run: list, style: Style, label: str, is_base: bool) -> None:
    steps, mean, sd, _ = _curve(per_run)
    ax.plot(steps, mean, color=style.color, label=label, lw=1.2 if is_base else 1.6, marker=style.marker, ms=4,
            markevery=max(1, len(steps) // 5), zorder=1 if is_base else 2)
    ax.fill_between(steps, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)],
                    color=style.color, alpha=0.15, lw=0)


def _draw_heldout(ax, per_run: list, style: Style, label: str, offset: float) -> None:
    """Mean over seeds at each evaluation, ± sd bar where >= 2 seeds have it, a bare marker where one has."""
    xs, mean, sd, count = _curve(per_run)
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
    xs = sorted({x for row in (0, 1) for m in methods for d in data.get((row, model, m), []) for x in d})
    span = max(xs[-1] - xs[0], 1) if xs else 1
    evals = sorted({x for m in methods for d in data.get((1, model, m), []) for x in d})
    gaps = [b - a for a, b in zip(evals, evals[1:])]
    return min([0.08 * span] + [0.4 * g for g in gaps])


def _learning_axes(n_rows: int, models: list, alone: bool) -> tuple:
    """(fig, axes, {(row, 0 reward | 1 held-out, model): ax}). One row of methods: reward over held-out, one column
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


def learning_curve_figure(runs: Sequence[RunRecord], reward_key: str = M.REWARD_MEAN,
                          baseline: Optional[str] = "GRPO (n=8)"):
    """The figure of ``plot_learning_curve`` (a matplotlib Figure; the caller saves or closes it)."""
    data, seeds = _learning_data(runs, reward_key)
    if not data:
        raise ValueError(f"no run logs {reward_key!r} or a held-out score")
    base = _baseline_label(runs, baseline)
    styles = run_styles(runs, base)
    models = sorted({model for _, model, _ in data})
    drawn = {method for *_, method in data}
    rows = method_panels(drawn, _families(runs, run_labels(runs)), base) or [[]]
    evals = sorted({x for (q, _, _), per_run in data.items() if q == 1 for d in per_run for x in d})
    alone = len(rows) > 1 and len(evals) == 1
    fig, axes, ax_of = _learning_axes(len(rows), models, alone)
    for (g, q, model), ax in ax_of.items():
        shown = ([base] if base in drawn else []) + rows[g]
        present = [m for m in shown if (q, model, m) in data]
        offsets = dict(zip(present, dodge(len(present), _spread(data, model, present, alone)))) if q == 1 else {}
        for m in present:
            n = seeds[m]
            label = f"{m}: {n} seed{'s' if n != 1 else ''}" + (" (baseline)" if m == base else "")
            if q == 0:
                _draw_reward(ax, data[(0, model, m)], styles[m], label, m == base)
            else:
                _draw_heldout(ax, data[(1, model, m)], styles[m], label, offsets[m])
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        if q == 1 and alone:
            ax.set_xticks(evals)
            ax.set_xlim(evals[0] - 1, evals[0] + 1)
    _label_learning_axes(fig, axes, models, reward_key, len(rows))
    _caption(fig, "Line: mean over training seeds; band: ± sd over seeds (n − 1). Held-out markers: the "
             f"runs' evaluations, at the number of updates done ({_eval_kinds(runs)}); error bar: ± sd over seeds "
             "(n − 1) where a method has 2 or more seeds, a bare marker where it has one; markers at the same step "
             "are set slightly apart." + _panels_caption(rows, base))
    return fig


def _label_learning_axes(fig, axes, models: list, reward_key: str, n_rows: int) -> None:
    if n_rows == 1:
        for j, model in enumerate(models):
            axes[0][j].set_title(model, fontsize=9)
            axes[0][j].set_ylabel(axis_label(reward_key))
            axes[1][j].set_ylabel(axis_label(M.EVAL_AVG))
            axes[1][j].set_xlabel("training step")
        _legend_outside(fig, axes.ravel())
        return
    for j, model in enumerate(models):
        axes[0][2 * j].set_title(f"{model}\n{axis_label(reward_key)}", fontsize=8)
        axes[0][2 * j + 1].set_title(f"{model}\n{axis_label(M.EVAL_AVG)}", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("training step", fontsize=8)
    for row in axes:
        for ax in row:
            ax.tick_params(labelsize=7)
    _row_legends(axes)


def plot_learning_curve(runs: Sequence[RunRecord], out_png, reward_key: str = M.REWARD_MEAN,
                        baseline: Optional[str] = "GRPO (n=8)") -> Path:
    """Reward (top row) and held-out score (bottom row) against the training step, one column per model,
    one line per method: mean over seeds with a ± sd band; held-out markers at every evaluation the runs made
    (the one before training at x = 0), ± sd bars where a method has >= 2 seeds, set apart sideways (``dodge``).
    More than ``MOST_IN_ONE_PANEL`` methods: one row of panels per group of ``method_panels``, the baseline
    (dark grey) in each."""
    return _save(learning_curve_figure(runs, reward_key, baseline), out_png)


def write_figures(runs: Sequence[RunRecord], out_dir, baseline: Optional[str] = "GRPO (n=8)", echo=print) -> list:
    """``FIGURES`` into ``out_dir`` (the report's figures); a figure without data is skipped and said. ``baseline``
    "" or None: a table without a baseline row (no method drawn in the baseline's grey)."""
    out = Path(out_dir)
    baseline = baseline or None
    plots = {"score_vs_compute.png": lambda p: plot_score_vs_compute(runs, p, baseline),
             "fractions.png": lambda p: plot_fractions(runs, p, baseline=baseline),
             "learning_curve.png": lambda p: plot_learning_curve(runs, p, baseline=baseline)}
    written = []
    for name in FIGURES:
        try:
            written.append(plots[name](out / name))
        except ValueError as e:
            echo(f"figure {name} skipped: {e}")
    return written


def _caption(fig, text: str, y: float = -0.02) -> None:
    """The caption under the panels, wrapped to the figure's width (about 17 characters an inch at 7 pt)."""
    fig.text(0.01, y, textwrap.fill(text, max(60, int(19 * fig.get_figwidth()))), fontsize=7, ha="left", va="top")


def _save(fig, out_png) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")  # keeps the legend and caption outside the panels
    plt.close(fig)
    return out
