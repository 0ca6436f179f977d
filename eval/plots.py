"""Paper-style figures (matplotlib, Agg backend, PNG).

- ``plot_score_vs_compute``: Figure 3a of the GRAFT paper. One panel per Table-1 block; one
  point per method at (compute charged to the model, Avg score), error bar = sd over seeds.
  Compute is the ``joint_charge`` figure (co-trained methods pay for the pair); a stored-peer
  method also shows its amortized cost as a hollow marker joined by a dashed line.
- ``plot_fractions``: Figure 1 (right). Per training step, the fraction of all-fail groups and
  the fraction of all-fail prompts that the peer solved, one line per (method, model, peer),
  averaged over seeds at each step.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from graftzoo.eval.artifacts import RunRecord  # noqa: E402
from graftzoo.eval.report import build_table1  # noqa: E402

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
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4.2), squeeze=False)
    for ax, (block, rows) in zip(axes[0], blocks):
        for i, r in enumerate(rows):
            color = f"C{i % 10}"
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
        ax.legend(fontsize=7)
    return _save(fig, out_png)


def plot_fractions(runs: Sequence[RunRecord], out_png, all_fail_key: str = "groups/all_fail",
                   solved_key: str = "peer/solved_all_fail_frac",
                   methods: Optional[Sequence[str]] = None) -> Path:
    """Figure 1 (right): per-step all-fail fraction and peer-solved fraction of all-fail prompts.

    ``methods`` restricts the lines to those variants (default: all runs with the metrics).
    """
    keys = (all_fail_key, solved_key)
    lines: dict = {k: {} for k in keys}
    for run in runs:
        if run.status == "failed" or (methods is not None and run.variant not in methods):
            continue
        for model in run.models:
            peer = run.peers[model]
            label = f"{run.variant}: {model}" + ("" if peer is None else f" (peer {peer})")
            for key in keys:
                steps, values = run.series(model, key)
                for s, v in zip(steps, values):
                    lines[key].setdefault(label, {}).setdefault(s, []).append(v)
    if not any(lines.values()):
        raise ValueError(f"no run logs {all_fail_key!r} or {solved_key!r} in metrics.jsonl")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    titles = ("all-fail groups (fraction of prompts)", "all-fail prompts solved by the peer")
    for ax, key, title in zip(axes[0], keys, titles):
        for label, per_step in sorted(lines[key].items()):
            steps = sorted(per_step)
            ax.plot(steps, [math.fsum(per_step[s]) / len(per_step[s]) for s in steps], label=label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel(key)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if lines[key]:
            ax.legend(fontsize=7)
    return _save(fig, out_png)


def _save(fig, out_png) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
