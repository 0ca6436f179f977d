"""The regime map: where peer exchange helps, as a heat map of Δ = method − baseline on the learner.

A grid's ``report.map`` (format: ``graftzoo.apps.grid``) lays its pairs out as rows (the learner's level) × columns
(the kind of peer). Each (row, col) is one pair whose FIRST model is the learner; every pair of a row has the same
learner. The score of a run is the learner's held-out score in the run's eval file (``eval_path``): the benchmark
``skill`` (the learner's weak skill), or the mean over the file's benchmarks when no skill is named.

For each cell and each panel (every method of ``methods``, plus ``budget`` when given), over training seeds s::

    Δ_s = score(method, cell pair, s) − score(baseline, row pair, s)

paired by seed: only seeds with both runs count. The cell shows the mean of Δ_s, its sample s.d. (n − 1; none for one
seed) and n, the number of paired seeds. The baseline and the budget do not depend on the peer, so a grid may run them
once per learner (a method's ``pairs``, e.g. on a one-model pair of the learner alone): their runs come from the
cell's own pair when it has them, else from the first of ``base_pairs[row]`` that does (the row's pairs in order, then
the grid's other pairs whose first model is the row's learner). A cell whose runs are missing says which instead of
failing.

``regime_cells`` is the computation (pure), ``plot_regime_map`` the figure, ``regime_markdown`` the table and
``write_regime_map`` writes ``regime_map.{png,md,json}``. Scores are fractions in [0, 1]; figure and table show
points (×100), the JSON keeps fractions.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from graftzoo.eval.artifacts import eval_path, validate_eval  # noqa: E402

FILES = ("regime_map.png", "regime_map.md", "regime_map.json")
DASH = "—"


@dataclass
class RegimeMap:
    """A validated ``report.map``: names in order, the pair of each (row, col), the learner of each pair, and the
    labels to score: ``labels`` maps each shown label (a method, an alias, the baseline, the budget) to the label of
    the grid method whose runs it shows (an alias's ``same_as``)."""

    title: str
    rows: list                    # row names (the learner's level), top to bottom
    cols: list                    # column names (the kind of peer), left to right
    cell_pair: dict               # (row, col) -> pair
    base_pairs: dict              # row -> where its baseline/budget runs are looked up, in order (module docstring)
    learner: dict                 # pair -> learner model id (the pair's first model), for every pair of the grid
    baseline: str
    methods: list                 # shown labels, one panel each (Δ = method − baseline)
    budget: Optional[str] = None  # one more panel: budget − baseline
    skill: Optional[str] = None   # the benchmark scored; None: the mean over the eval file's benchmarks
    labels: dict = field(default_factory=dict)

    def run_label(self, label: str) -> str:
        return self.labels.get(label, label)

    @property
    def panels(self) -> list:
        return list(self.methods) + ([self.budget] if self.budget else [])


def seed_stat(values: list) -> dict:
    """Mean, sample s.d. (n − 1; None for one value) and n of per-seed values; mean None for none."""
    if not values:
        return {"mean": None, "sd": None, "n": 0}
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else None,
            "n": len(values)}


def paired_delta(method: dict, baseline: dict) -> dict:
    """Δ_s = method[s] − baseline[s] over the seeds in both ({seed: score} each): ``seed_stat`` of the Δ_s, with the
    seeds and the per-seed values."""
    seeds = sorted(set(method) & set(baseline))
    values = [method[s] - baseline[s] for s in seeds]
    return {**seed_stat(values), "seeds": seeds, "values": values}


def _per_seed(scores: dict, label: str, pair: str) -> dict:
    return {s: v for (lab, p, s), v in scores.items() if lab == label and p == pair}


def _from_row(scores: dict, label: str, pair: str, base_pairs: list) -> tuple:
    """({seed: score}, pair they come from): the cell's own pair first, else the first of ``base_pairs`` with runs."""
    for p in [pair] + [q for q in base_pairs if q != pair]:
        found = _per_seed(scores, label, p)
        if found:
            return found, p
    return {}, None


def regime_cells(rmap: RegimeMap, scores: dict) -> list:
    """One record per (row, col), rows then columns in order, from ``scores`` {(method label, pair, seed): learner
    score}: the baseline's, the budget's and each method's ``seed_stat`` (with seeds and source pair), the Δ of each
    panel (``paired_delta``) and ``missing``, what keeps a number from being computed (module docstring)."""
    out = []
    for row in rmap.rows:
        for col in rmap.cols:
            pair = rmap.cell_pair[(row, col)]
            rec = {"row": row, "col": col, "pair": pair, "learner": rmap.learner[pair], "methods": {}, "delta": {},
                   "missing": []}
            base, base_pair = _from_row(scores, rmap.run_label(rmap.baseline), pair, rmap.base_pairs[row])
            rec["baseline"] = {"label": rmap.baseline, "pair": base_pair, **seed_stat(list(base.values())),
                               "seeds": sorted(base)}
            if not base:
                rec["missing"].append(f"no {rmap.baseline} run of {rmap.learner[pair]} in row {row!r}")
            rec["budget"] = None
            for label in rmap.panels:
                is_budget = label == rmap.budget
                if is_budget:
                    got, src = _from_row(scores, rmap.run_label(label), pair, rmap.base_pairs[row])
                else:
                    got, src = _per_seed(scores, rmap.run_label(label), pair), pair
                stat = {"label": label, "pair": src if got else None, **seed_stat(list(got.values())),
                        "seeds": sorted(got)}
                if is_budget:
                    rec["budget"] = stat
                else:
                    rec["methods"][label] = stat
                if not got:
                    rec["missing"].append(f"no {label} run" + (f" of {rmap.learner[pair]} in row {row!r}"
                                                                if is_budget else f" on pair {pair}"))
                rec["delta"][label] = d = paired_delta(got, base)
                if got and base and not d["n"]:
                    rec["missing"].append(f"no seed with both {label} and {rmap.baseline}")
            out.append(rec)
    return out


def learner_scores(runs: Iterable, rmap: RegimeMap) -> tuple:
    """({(label, pair, seed): score}, notes) from finished runs given as (label, pair, seed, run_dir): the learner's
    eval file (``eval_path``), benchmark ``rmap.skill`` or the mean over its benchmarks. A run without an eval file,
    or whose file lacks the skill, is left out and noted."""
    scores, notes = {}, []
    for label, pair, seed, run_dir in runs:
        if pair not in rmap.learner:
            continue
        path = eval_path(run_dir, rmap.learner[pair])
        if not path.is_file():
            notes.append(f"{path}: missing (no learner score for this run)")
            continue
        payload = json.loads(path.read_text(encoding="utf-8"))
        validate_eval(payload, str(path))
        bench = payload["benchmarks"]
        if rmap.skill is None:
            scores[(label, pair, seed)] = statistics.fmean(float(b["avg"]) for b in bench.values())
        elif rmap.skill in bench:
            scores[(label, pair, seed)] = float(bench[rmap.skill]["avg"])
        else:
            notes.append(f"{path}: no benchmark {rmap.skill!r} (report.map.skill); it has {sorted(bench)}")
    return scores, notes


def _pm(stat: Optional[dict], sign: bool = False) -> str:
    """``"+3.2 ± 1.1"`` in points; no ± for one seed; DASH for none."""
    if not stat or stat["mean"] is None:
        return DASH
    mean = f"{100 * stat['mean']:+.1f}" if sign else f"{100 * stat['mean']:.1f}"
    return mean if stat["sd"] is None else f"{mean} ± {100 * stat['sd']:.1f}"


def regime_markdown(rmap: RegimeMap, cells: list) -> str:
    """One table line per (row, col): learner, baseline, budget and methods (mean ± s.d.), each Δ (mean ± s.d. (n))."""
    head = (["row", "column", "pair", "learner", rmap.baseline] + ([rmap.budget] if rmap.budget else [])
            + list(rmap.methods) + [f"Δ {p}" for p in rmap.panels] + ["missing"])
    lines = [f"## {rmap.title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        vals = [c["row"], c["col"], c["pair"], c["learner"], _pm(c["baseline"])]
        vals += [_pm(c["budget"])] if rmap.budget else []
        vals += [_pm(c["methods"][m]) for m in rmap.methods]
        vals += [f"{_pm(c['delta'][p], sign=True)} (n={c['delta'][p]['n']})" for p in rmap.panels]
        vals.append("; ".join(c["missing"]))
        lines.append("| " + " | ".join(vals) + " |")
    lines += ["", _caption(rmap)]
    return "\n".join(lines) + "\n"


def _caption(rmap: RegimeMap) -> str:
    what = f"benchmark {rmap.skill!r}" if rmap.skill else "the mean over its eval benchmarks"
    return (f"Score: the learner's (the pair's first model) held-out score on {what}, in points (×100). "
            f"Δ = method − {rmap.baseline} on the same learner, paired by training seed; the cell is the mean of "
            f"the per-seed Δ, ± its sample s.d. over seeds, n = the number of seeds with both runs; {DASH}: runs "
            f"missing.")


def plot_regime_map(rmap: RegimeMap, cells: list, out_png) -> Path:
    """One heat-map panel per ``rmap.panels`` (rows × cols), Δ in points on one symmetric diverging scale centred
    at 0, each cell annotated "mean ± s.d." and "n=", a caption under the figure."""
    by = {(c["row"], c["col"]): c for c in cells}
    grids = []
    for p in rmap.panels:
        m = np.full((len(rmap.rows), len(rmap.cols)), np.nan)
        for i, r in enumerate(rmap.rows):
            for j, col in enumerate(rmap.cols):
                mean = by[(r, col)]["delta"][p]["mean"]
                m[i, j] = np.nan if mean is None else 100 * mean
        grids.append(m)
    finite = [abs(v) for g in grids for v in g.ravel() if not math.isnan(v)]
    vmax = max(finite + [1.0])
    cmap = plt.get_cmap("RdBu").with_extremes(bad="0.88")   # red: below the baseline, blue: above, grey: missing
    k = len(grids)
    fig, axes = plt.subplots(1, k, figsize=(1.9 * len(rmap.cols) * k + 3.0, 1.0 * len(rmap.rows) + 2.2),
                             squeeze=False, layout="constrained")
    learner_of = {r: by[(r, rmap.cols[0])]["learner"] for r in rmap.rows}
    for ax, p, g in zip(axes[0], rmap.panels, grids):
        im = ax.imshow(np.ma.masked_invalid(g), cmap=cmap, vmin=-vmax, vmax=vmax, aspect="auto")
        for i, r in enumerate(rmap.rows):
            for j, col in enumerate(rmap.cols):
                d = by[(r, col)]["delta"][p]
                text = DASH if d["mean"] is None else f"{_pm(d, sign=True)}\nn={d['n']}"
                dark = not math.isnan(g[i, j]) and abs(g[i, j]) > 0.6 * vmax
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_xticks(range(len(rmap.cols)), rmap.cols, fontsize=8)
        ax.set_yticks(range(len(rmap.rows)), [f"{r}\n(learner {learner_of[r]})" for r in rmap.rows], fontsize=8)
        if ax is not axes[0][0]:
            ax.set_yticklabels([])
        ax.set_title(f"{p} − {rmap.baseline}", fontsize=9)
    fig.colorbar(im, ax=list(axes[0]), label="Δ (points, ×100)", shrink=0.9)
    fig.suptitle(rmap.title, fontsize=10)
    fig.text(0.0, -0.02, _caption(rmap).replace(" Δ =", "\nΔ ="), fontsize=7, ha="left", va="top",
             wrap=True)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def write_regime_map(rmap: RegimeMap, runs: Iterable, out_dir, echo: Callable[[str], None] = print) -> list:
    """``FILES`` in ``out_dir`` from finished runs given as (label, pair, seed, run_dir); returns their paths."""
    scores, notes = learner_scores(runs, rmap)
    for n in notes:
        echo(f"regime map: {n}")
    cells = regime_cells(rmap, scores)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_regime_map(rmap, cells, out / FILES[0])
    (out / FILES[1]).write_text(regime_markdown(rmap, cells), encoding="utf-8")
    data = {"title": rmap.title, "baseline": rmap.baseline, "budget": rmap.budget, "methods": rmap.methods,
            "skill": rmap.skill, "rows": rmap.rows, "cols": rmap.cols, "labels": rmap.labels,
            "units": "fractions in [0, 1] (the figure and table show points, ×100)", "cells": cells}
    (out / FILES[2]).write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return [png, out / FILES[1], out / FILES[2]]
