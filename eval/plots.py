"""Paper-style figures (matplotlib, Agg backend, PNG).

- ``plot_score_vs_compute``: Figure 3a of the GRAFT paper. One panel per Table-1 block; one
  point per method at (compute charged to the model, Avg score), error bar = sd over seeds.
  Compute is the ``joint_charge`` figure (co-trained methods pay for the pair); a stored-peer
  method also shows its amortized cost as a hollow marker joined by a dashed line.
- ``plot_fractions``: Figure 1 (right). Per training step, the fraction of all-fail groups and
  the fraction of all-fail prompts that the peer solved, one line per (method, model, peer),
  averaged over seeds at each step, smoothed (``smooth``, an EMA) over the raw trace drawn faint.
- ``plot_learning_curve``: reward and held-out score against the training step, one panel per model
  and quantity, one line per method: the mean over seeds with a ± sd band. Held-out points are the
  run's evaluations (``eval/avg`` in metrics.jsonl: at start, every ``run.eval_every`` steps, at the end).

Every figure colours a method the same way (``method_colors`` over all runs' methods), labels axes in
words (``axis_label``) and puts its legend outside the data area. ``write_figures`` writes all three.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from graftzoo.contract import metrics as M  # noqa: E402
from graftzoo.eval.artifacts import RunRecord  # noqa: E402
from graftzoo.eval.metrics import mean_sd_ci  # noqa: E402
from graftzoo.eval.report import build_table1, method_labels, method_of  # noqa: E402

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


def method_colors(methods) -> dict:
    """Method label -> colour, from the sorted labels: the same method has the same colour in every figure."""
    cmap = plt.get_cmap("tab10" if len(set(methods)) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(sorted(set(methods)))}


def run_colors(runs: Sequence[RunRecord]) -> dict:
    """``method_colors`` of every method of ``runs`` (as ``method_labels`` spells them)."""
    return method_colors(method_labels(runs).values())


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
    seen = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8,
                   frameon=False)

UNITS = {"gpu_h": "GPU-hours", "cpu_s": "CPU-seconds", "wall_s": "wall-clock seconds"}


def _pick_unit(rows: list) -> str:
    """GPU-h when every plotted row used GPUs, else process CPU seconds."""
    return "gpu_h" if rows and all(r.compute["gpu_h"] > 0 for r in rows) else "cpu_s"


def plot_score_vs_compute(runs: Sequence[RunRecord], out_png, baseline: str = "GRPO (n=8)",
                          unit: Optional[str] = None) -> Path:
    """Figure 3a: Avg score (x100) against compute; ``unit`` in UNITS (default: auto)."""
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
    colors = run_colors(runs)
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4.2), squeeze=False)
    for ax, (block, rows) in zip(axes[0], blocks):
        for r in rows:
            color = colors.get(r.same_as or r.method, "black")
            y, err = 100 * r.avg.mean, 0.0 if r.avg.sd is None else 100 * r.avg.sd
            x = r.compute[unit]
            ax.errorbar([x], [y], yerr=[err], fmt="o", color=color, capsize=3, label=r.method)
            if r.compute_amortized is not None:
                xa = r.compute_amortized[unit]
                ax.errorbar([xa], [y], yerr=[err], fmt="o", mfc="none", color=color, capsize=3)
                ax.plot([x, xa], [y, y], ls="--", color=color, lw=0.8)
        ax.set_title(block.title, fontsize=9)
        ax.set_xlabel(f"compute ({UNITS[unit]})")
        ax.set_ylabel("Avg score (x100)")
        ax.grid(alpha=0.3)
    _legend_outside(fig, axes[0])
    fig.text(0.01, -0.04, "Filled marker: compute charged to the model (co-trained runs pay for both models). "
             "Hollow marker joined by a dashed line: amortized cost of a stored-peer run,\nwhich adds the cost of "
             "the earlier run whose trajectories it reused. Error bars: sd over training seeds.",
             fontsize=7, ha="left", va="top")
    return _save(fig, out_png)


def plot_fractions(runs: Sequence[RunRecord], out_png, all_fail_key: str = M.GROUPS_ALL_FAIL,
                   solved_key: str = M.PEER_SOLVED_ALL_FAIL_FRAC,
                   methods: Optional[Sequence[str]] = None, weight: float = 0.6) -> Path:
    """Figure 1 (right): per-step all-fail fraction and peer-solved fraction of all-fail prompts, smoothed
    (``smooth(weight)``) over the faint raw trace; colour = method, line style = model.

    ``methods`` restricts the lines to those variants (default: all runs with the metrics).
    """
    keys = (all_fail_key, solved_key)
    labels, colors = method_labels(runs), run_colors(runs)
    wanted = None if methods is None else {m.casefold() for m in methods}
    lines: dict = {k: {} for k in keys}
    models = sorted({m for run in runs for m in run.models})
    for run in runs:
        if run.status == "failed" or (wanted is not None and run.variant.casefold() not in wanted):
            continue
        method = method_of(run, labels)
        for model in run.models:
            peer = run.peers[model]
            label = f"{method}: {model}" + ("" if peer is None else f" (peer {peer})")
            for key in keys:
                steps, values = run.series(model, key)
                for st, v in zip(steps, values):
                    lines[key].setdefault((label, method, model), {}).setdefault(st, []).append(v)
    if not any(lines.values()):
        raise ValueError(f"no run logs {all_fail_key!r} or {solved_key!r} in metrics.jsonl")
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    titles = ("prompts where every rollout failed", "of those, prompts the peer solved")
    for ax, key, title in zip(axes[0], keys, titles):
        for (label, method, model), per_step in sorted(lines[key].items()):
            steps = sorted(per_step)
            raw = [math.fsum(per_step[st]) / len(per_step[st]) for st in steps]
            style = dict(color=colors.get(method, "black"), ls=styles[models.index(model) % len(styles)])
            ax.plot(steps, raw, alpha=0.25, lw=0.8, **style)
            ax.plot(steps, smooth(raw, weight), label=label, lw=1.6, **style)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_ylabel(axis_label(key))
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    _legend_outside(fig, axes[0])
    fig.text(0.01, -0.02, f"Thick line: exponential moving average (weight {weight}); faint line: the raw "
             "per-step value, mean over seeds.", fontsize=7, ha="left", va="top")
    return _save(fig, out_png)


def _curve(per_run: list) -> tuple:
    """(steps, mean, sd) over runs of {step: value} dicts; sd 0 where one run has the step."""
    steps = sorted({st for d in per_run for st in d})
    mean, sd = [], []
    for st in steps:
        vals = [d[st] for d in per_run if st in d]
        if len(vals) > 1:
            m, s_, _, _ = mean_sd_ci(vals)
        else:
            m, s_ = vals[0], 0.0
        mean.append(float(m))
        sd.append(float(s_))
    return steps, mean, sd


def _heldout_points(run: RunRecord, model: str) -> dict:
    """{step: held-out score} of a run's evaluations: ``eval/avg`` records (step -1, the evaluation before
    training, is drawn at step 0) and the final eval file when metrics.jsonl lacks it."""
    steps, values = run.series(model, M.EVAL_AVG)
    pts = {max(st, 0): v for st, v in zip(steps, values)}
    ev = run.evals.get(model)
    if ev is not None and not pts:
        whole = ev.get("overall") or {}
        avg = whole.get("avg")
        if avg is None:
            avg = math.fsum(b["avg"] for b in ev["benchmarks"].values()) / len(ev["benchmarks"])
        pts[int(ev["step"]) + 1] = float(avg)
    return pts


def plot_learning_curve(runs: Sequence[RunRecord], out_png, reward_key: str = M.REWARD_MEAN) -> Path:
    """Reward (top row) and held-out score (bottom row) against the training step, one column per model,
    one line per method: mean over seeds with a ± sd band (markers where the run evaluated)."""
    labels, colors = method_labels(runs), run_colors(runs)
    models = sorted({m for run in runs if run.status != "failed" for m in run.models})
    data: dict = {}   # (row, model, method) -> list of {step: value}, one per run
    for run in runs:
        if run.status == "failed":
            continue
        method = method_of(run, labels)
        for model in run.models:
            steps, values = run.series(model, reward_key)
            if steps:
                data.setdefault((0, model, method), []).append(dict(zip(steps, values)))
            pts = _heldout_points(run, model)
            if pts:
                data.setdefault((1, model, method), []).append(pts)
    if not data:
        raise ValueError(f"no run logs {reward_key!r} or a held-out score")
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 6.5), squeeze=False, sharex="col")
    for (row, model, method), per_run in sorted(data.items()):
        ax = axes[row][models.index(model)]
        steps, mean, sd = _curve(per_run)
        color = colors.get(method, "black")
        ax.plot(steps, mean, color=color, label=method, marker="o" if row == 1 else None, ms=4)
        ax.fill_between(steps, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)],
                        color=color, alpha=0.2, lw=0)
    for j, model in enumerate(models):
        axes[0][j].set_title(model, fontsize=9)
        axes[0][j].set_ylabel(axis_label(reward_key))
        axes[1][j].set_ylabel(axis_label(M.EVAL_AVG))
        axes[1][j].set_xlabel("training step")
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    _legend_outside(fig, axes.ravel())
    fig.text(0.01, -0.02, "Line: mean over training seeds; band: ± sd over seeds. Held-out markers are the "
             "run's evaluations (before training at step 0, every run.eval_every steps, at the end).",
             fontsize=7, ha="left", va="top")
    return _save(fig, out_png)


def write_figures(runs: Sequence[RunRecord], out_dir, baseline: str = "GRPO (n=8)", echo=print) -> list:
    """``FIGURES`` into ``out_dir`` (the report's figures); a figure without data is skipped and said."""
    out = Path(out_dir)
    plots = {"score_vs_compute.png": lambda p: plot_score_vs_compute(runs, p, baseline),
             "fractions.png": lambda p: plot_fractions(runs, p),
             "learning_curve.png": lambda p: plot_learning_curve(runs, p)}
    written = []
    for name in FIGURES:
        try:
            written.append(plots[name](out / name))
        except ValueError as e:
            echo(f"figure {name} skipped: {e}")
    return written


def _save(fig, out_png) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")  # keeps the legend and caption outside the panels
    plt.close(fig)
    return out
