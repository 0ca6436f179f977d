"""The report's figures read back from their matplotlib artists: held-out markers at every evaluation (the one before
training at x = 0), ± sd bars only where a method has two or more seeds, markers set apart, a palette that tells 16+
methods apart, and small multiples (the baseline in every row) when there are many methods."""
import itertools
import math
import statistics
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pytest
from click.testing import CliRunner
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

from graftzoo.apps.report import report_cmd
from graftzoo.eval.artifacts import append_metrics, load_runs, make_summary, write_config, write_eval, write_summary
from graftzoo.eval.compute import ComputeMeter
from graftzoo.eval.plots import (BASELINE_COLOR, PER_PANEL, dodge, learning_curve_figure, method_panels,
                                 method_styles, run_styles)

A = "tiny-qwen-char"
STEPS = 4
HELDOUT_LABEL = "held-out score (avg@k x100)"
# held-out score of (method, seed) before training, after 2 updates, at the end (after STEPS updates)
HELDOUT = {("GRPO (n=8)", 0): (0.40, 0.44, 0.50), ("GRPO (n=8)", 1): (0.42, 0.48, 0.56),
           ("RLOO", 0): (0.40, 0.46, 0.52)}


def write_run(root, name, variant, algo, seed, heldout, model=A):
    """A finished one-model run whose metrics.jsonl holds what the trainer logs with run.eval_at_start and
    run.eval_every=2: the evaluation before training at step -1, the one after step 1's update in step 1's record
    (next to its training metrics), the final one at step STEPS in a record of its own."""
    run_dir = root / name
    config = {"run": {"name": name, "variant": variant, "seed": seed, "steps": STEPS}, "algo": {"name": algo},
              "pair": {"name": "quickstart", "models": [{"id": model, "kind": "tiny"}]}, "rollout": {"n": 8},
              "eval": {"k": 2, "size": 16, "dataset": None, "benchmarks": []}}
    write_config(run_dir, config)
    append_metrics(run_dir, {"step": -1, "model": model, "eval/avg": heldout[0]})
    for st in range(STEPS):
        rec = {"step": st, "model": model, "reward/mean": 0.3 + 0.05 * st + 0.01 * seed}
        if st == 1:
            rec["eval/avg"] = heldout[1]
        append_metrics(run_dir, rec)
    append_metrics(run_dir, {"step": STEPS, "model": model, "eval/avg": heldout[2]})
    write_eval(run_dir, model, {"model": model, "step": STEPS - 1,
                                "benchmarks": {"add": {"avg": heldout[2], "k": 2, "n_items": 16}}})
    meter = ComputeMeter(gpus=0)
    meter.add(model, "generate", wall_s=10.0, cpu_s=8.0)
    write_summary(run_dir, make_summary(config, models=[model], peers={model: None}, status="done",
                                        compute=meter.summary()))


@pytest.fixture(scope="module")
def report_figures(tmp_path_factory):
    """`graftzoo report` on GRPO (2 seeds) and RLOO (1 seed); every figure it saves, by file name."""
    root = tmp_path_factory.mktemp("runs")
    for (variant, seed), heldout in HELDOUT.items():
        write_run(root, f"{variant.split()[0].lower()}-s{seed}", variant, variant.split()[0].lower(), seed, heldout)
    saved = {}
    savefig = Figure.savefig

    def spy(self, fname, *args, **kwargs):
        saved[Path(fname).name] = self
        return savefig(self, fname, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", spy)
        res = CliRunner().invoke(report_cmd, [str(root), "--out", str(root / "report")])
    assert res.exit_code == 0, res.output
    return root, saved


def _hex(color) -> str:
    return mcolors.to_hex(color)


def test_learning_curve_marks_every_evaluation_with_error_bars_where_there_are_seeds(report_figures):
    root, saved = report_figures
    fig = saved["learning_curve.png"]
    assert (root / "report" / "learning_curve.png").stat().st_size > 5000
    ax = next(a for a in fig.axes if a.get_ylabel() == HELDOUT_LABEL)
    styles = run_styles(load_runs([root]), "GRPO (n=8)")
    grpo, rloo = styles["GRPO (n=8)"], styles["RLOO"]
    assert grpo.color == BASELINE_COLOR and rloo.color != grpo.color
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    # GRPO, 2 seeds: a marker with a ± sd bar at every evaluation, the one before training at x = 0
    (grpo_bars,) = [c for c in bars if _hex(c.lines[0].get_color()) == grpo.color]
    xs, ys = grpo_bars.lines[0].get_xdata(), grpo_bars.lines[0].get_ydata()
    assert [round(x) for x in xs] == [0, 2, STEPS] and all(abs(x - round(x)) < 0.5 for x in xs)
    seeds = [HELDOUT[("GRPO (n=8)", s)] for s in (0, 1)]
    assert list(ys) == pytest.approx([100 * statistics.mean(v) for v in zip(*seeds)])   # points, as Table 1
    halves = [abs(seg[1][1] - seg[0][1]) / 2 for seg in grpo_bars.lines[2][0].get_segments()]
    assert halves == pytest.approx([100 * statistics.stdev(v) for v in zip(*seeds)])
    # RLOO, 1 seed: bare markers at the same evaluations, no bar, set apart from GRPO's
    assert not [c for c in bars if _hex(c.lines[0].get_color()) == rloo.color]
    (bare,) = [ln for ln in ax.lines if _hex(ln.get_color()) == rloo.color and ln.get_linestyle() == "None"]
    assert bare.get_marker() == rloo.marker
    assert [round(x) for x in bare.get_xdata()] == [0, 2, STEPS]
    assert list(bare.get_ydata()) == pytest.approx([100 * v for v in HELDOUT[("RLOO", 0)]])
    assert min(abs(a - b) for a, b in zip(bare.get_xdata(), xs)) > 0.1
    assert not fig.texts   # the caption is beside the image (report.md, figures.md), not in it
    caption = (root / "report" / "report.md").read_text()
    assert "x = 0: before training" in caption and "± sd over seeds" in caption


def _lab(color) -> tuple:
    """CIELAB (D65) of an sRGB colour."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in mcolors.to_rgb(color)]
    m = ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505))
    xyz = [sum(a * b for a, b in zip(row, lin)) / w for row, w in zip(m, (0.95047, 1.0, 1.08883))]
    f = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_sixteen_methods_get_distinct_styles_far_apart_in_colour():
    assert _lab("#ff0000") == pytest.approx((53.24, 80.09, 67.20), abs=0.05)      # the textbook value
    methods = [f"method {i:02d}" for i in range(16)] + ["GRPO (n=8)"]
    styles = method_styles(methods, baseline="grpo (n=8)")
    assert styles["GRPO (n=8)"].color == BASELINE_COLOR
    assert len({(s.color, s.marker) for s in styles.values()}) == 17
    closest = min(math.dist(_lab(a.color), _lab(b.color)) for a, b in itertools.combinations(styles.values(), 2))
    assert closest > 25, closest      # ΔE*ab; tab20's closest pair is 16.6, a just-noticeable difference 2.3
    many = method_styles([f"m{i}" for i in range(45)])
    assert len({(s.color, s.marker) for s in many.values()}) == 45
    assert method_styles(methods)["method 03"] == styles["method 03"]    # the baseline does not move the others


def test_method_panels_and_dodge_worked_examples():
    assert dodge(3, 1.0) == pytest.approx([-0.5, 0.0, 0.5]) and dodge(1, 1.0) == [0.0]
    few = ["GRPO (n=8)", "GRAFT", "SGT"]
    assert method_panels(few, {}, "GRPO (n=8)") == [["GRAFT", "SGT"]]
    family = {"GRPO (n=8)": "grpo", "GRPO (n=16)": "grpo", "GRPO (n=32)": "grpo", "DS": "dapo", "HACPO": "hacpo",
              "SGT": "sgt", **{f"G{i}": "graft" for i in range(9)}}
    rows = method_panels(list(family), family, "GRPO (n=8)")
    assert rows == [["GRPO (n=16)", "GRPO (n=32)", "DS"], ["G0", "G1", "G2"], ["G3", "G4", "G5"],
                    ["G6", "G7", "G8", "HACPO"], ["SGT"]]


def test_many_methods_draw_small_multiples_with_the_baseline_in_every_row(tmp_path):
    labels = ["GRPO (n=8)"] + [f"variant {i:02d}" for i in range(15)]
    for i, label in enumerate(labels):
        write_run(tmp_path, f"r{i:02d}", label, "grpo" if i == 0 else "graft", 0, (0.4, 0.4 + i / 100, 0.5))
    runs = load_runs([tmp_path])
    fig = learning_curve_figure(runs, baseline="GRPO (n=8)")
    legends = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    plt.close(fig)
    assert len(legends) == len(method_panels(labels, {m: "x" for m in labels}, "GRPO (n=8)")) > 1
    shown = []
    for legend in legends:      # one legend per row, right of the row; its first entry the baseline
        names = [t.get_text().split(":")[0] for t in legend.get_texts()]
        assert names[0] == "GRPO (n=8)" and 2 <= len(names) <= PER_PANEL + 1
        shown += names[1:]
    assert sorted(shown) == labels[1:]
    styles = run_styles(runs, "GRPO (n=8)")
    colours = {_hex(s.color) for m, s in styles.items() if m != "GRPO (n=8)"}
    assert len(colours) == 15
