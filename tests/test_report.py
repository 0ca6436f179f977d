"""Run artifacts, Table 1 / Table 9, plots and the report command on a hand-made results set."""
import csv
import io
import json
import subprocess
import sys
from typing import ClassVar

import matplotlib
import matplotlib.pyplot as plt
import pytest
import yaml
from click.testing import CliRunner

from graftzoo import Learner, LearnerConfig, register_algo
from graftzoo.algos import BUILTIN
from graftzoo.contract import registry
from graftzoo.eval.artifacts import (ArtifactError, append_metrics, load_run, load_runs,
                                     make_summary, stored_peer_cost, write_config, write_eval,
                                     write_summary)
from graftzoo.apps.report import report_cmd
from graftzoo.eval.compute import ComputeMeter
from graftzoo.eval.plots import (FIGURES, axis_label, method_colors, plot_fractions, plot_learning_curve,
                                 plot_score_vs_compute, run_colors, smooth, write_figures)
from graftzoo.apps.report import MIXABLE
from graftzoo.eval.metrics import SIGNIFICANCE, paired_t_p, seed_test, welch_t_p
from graftzoo.eval.report import (COMPARABLE_KEYS, build_table1, clip_fraction_table, default_baseline, flat_rows,
                                  is_report_baseline, log_table_to_wandb, to_csv, to_latex, to_markdown)

A, B = "tiny-qwen-char", "tiny-gpt2-pair"
BLOCK_A, BLOCK_B = f"{A} (peer: {B})", f"{B} (peer: {A})"


def make_run(root, name, variant, seed, n, scores, peers, source=None, metrics=(),
             cpu=100.0, peer_run_compute=None):
    """scores: {model: (math500, aime24)}; every model gets `cpu` CPU-s of generate+update."""
    run_dir = root / name
    # what a trained run's config.yaml holds for the report: its models and its peer source too (the Clip column is
    # the learner's effective clip, read from the validated config)
    config = {"run": {"name": name, "variant": variant, "seed": seed},
              "algo": {"name": variant.split(" ")[0].lower()},
              "pair": {"name": "tiny", "models": [{"id": m, "kind": "tiny"} for m in peers]},
              "rollout": {"n": n}}
    if source:
        config["peer"] = {"source": {"live": "online"}.get(source, source),
                          "path": None if source == "live" else str(root / "peer-run")}
    write_config(run_dir, config)
    meter = ComputeMeter(gpus=0)
    for m in peers:
        meter.add(m, "generate", wall_s=cpu, cpu_s=0.75 * cpu)
        meter.add(m, "update", wall_s=cpu / 2, cpu_s=0.25 * cpu)
        meter.add(m, "eval", wall_s=999.0, cpu_s=999.0)
    for m, (math500, aime24) in scores.items():
        write_eval(run_dir, m, {"model": m, "step": 30, "benchmarks": {
            "math500": {"avg": math500, "k": 4, "n_items": 50},
            "aime24": {"avg": aime24, "k": 16, "n_items": 30}}})
    for rec in metrics:
        append_metrics(run_dir, rec)
    write_summary(run_dir, make_summary(config, models=list(peers), peers=peers, status="done",
                                        compute=meter.summary(), peer_source=source,
                                        peer_run_compute=peer_run_compute))
    return run_dir


def _graft_metrics(seed):
    """Per-step clip fractions and group fractions of the live GRAFT run."""
    if seed == 0:
        own, peer, af, solved = [0.002, 0.004], [0.01, 0.02], [0.5, 0.3], [0.2, 0.4]
    elif seed == 1:
        own, peer, af, solved = [0.005], [0.025], [0.4], [0.3]
    else:
        own, peer, af, solved = [0.004], [0.02], [0.45], [0.35]
    out = []
    for step in range(len(own)):
        for m in (A, B):
            out.append({"step": step, "model": m, "clip/frac_own": own[step],
                        "clip/frac_peer": peer[step], "groups/all_fail": af[step],
                        "peer/solved_all_fail_frac": solved[step]})
    return out


# Per-seed offsets (seeds 0, 1, 2; mean 0.01 each) added to every score of a method's runs: the seed-to-seed noise
# that the report's paired test weighs. GRAFT's differences from the P0 rows vary a little (±0.5 points) around
# their mean; GRPO+DS's vary more (its Δ +2.0 over GRPO n=8 is +1, +3, +2 points: all positive, not significant).
P0 = (0.0, 0.02, 0.01)
JITTER = {"GRAFT": (0.005, 0.02, 0.005), "GRPO+DS": (-0.01, 0.03, 0.01)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Block A (peer B): GRPO n=8 30, GRPO+DS 32, n=16 34, n=32 38, GRAFT 36, w/o gate 33,
    stored 40 (one seed). Block B (peer A): GRPO n=8 21, n=16 23 (no n=32), GRAFT 26, w/o gate 22. Seeds 0-2."""
    root = tmp_path_factory.mktemp("results")
    single_ab = {A: None, B: None}
    live = {A: B, B: A}
    for s in (0, 1, 2):
        d, g, ds = P0[s], JITTER["GRAFT"][s], JITTER["GRPO+DS"][s]
        make_run(root, f"grpo8-s{s}", "GRPO (n=8)", s, 8,
                 {A: (0.30 + d, 0.28 + d), B: (0.22 + d, 0.18 + d)}, single_ab)
        make_run(root, f"ds-s{s}", "GRPO+DS", s, 8, {A: (0.33 + ds, 0.29 + ds)}, {A: None})
        make_run(root, f"grpo16a-s{s}", "GRPO (n=16)", s, 16, {A: (0.34 + d, 0.32 + d)},
                 {A: None}, cpu=200.0)
        make_run(root, f"grpo16b-s{s}", "GRPO (n=16)", s, 16, {B: (0.24 + d, 0.20 + d)},
                 {B: None}, cpu=200.0)
        make_run(root, f"grpo32-s{s}", "GRPO (n=32)", s, 32, {A: (0.38 + d, 0.36 + d)},
                 {A: None}, cpu=400.0)
        make_run(root, f"graft-s{s}", "GRAFT", s, 8,
                 {A: (0.40 + g, 0.30 + g), B: (0.27 + g, 0.23 + g)}, live, source="live",
                 metrics=_graft_metrics(s))
        make_run(root, f"nogate-s{s}", "GRAFT w/o gate", s, 8,
                 {A: (0.33 + d, 0.31 + d), B: (0.23 + d, 0.19 + d)}, live, source="live")
    make_run(root / "stored", "stored-s0", "GRAFT (stored)", 0, 8, {A: (0.42, 0.38)}, {A: B},
             source="stored", peer_run_compute={"wall_s": 300.0, "cpu_s": 200.0, "gpu_h": 0.0})
    return root


@pytest.fixture(scope="module")
def table(results):
    return build_table1(load_runs([results]))


def _rows(table, title):
    block = next(b for b in table.blocks if b.title == title)
    return {r.method: r for r in block.rows}


def test_load_runs_finds_nested_runs_once(results):
    runs = load_runs([results, results / "graft-s0", results / "stored"])
    assert len(runs) == 22
    graft = load_run(results / "graft-s0")
    assert graft.peers == {A: B, B: A} and graft.rollout_n == 8 and graft.seed == 0
    assert graft.series(A, "clip/frac_own") == ([0, 1], [0.002, 0.004])
    assert graft.evals[B]["benchmarks"]["aime24"]["avg"] == pytest.approx(0.235)


def test_blocks_rows_and_order(table, results):
    assert [b.title for b in table.blocks] == [BLOCK_B, BLOCK_A]
    assert table.benchmarks == ["math500", "aime24"]
    assert [r.method for r in table.blocks[1].rows] == [
        "GRPO (n=8)", "GRPO+DS", "GRPO (n=16)", "GRPO (n=32)",
        "GRAFT", "GRAFT (stored)", "GRAFT w/o gate"]
    first = build_table1(load_runs([results]), methods=["GRAFT", "GRPO (n=32)"])
    assert [r.method for r in first.blocks[1].rows][:3] == ["GRAFT", "GRPO (n=32)", "GRPO (n=8)"]
    rows = _rows(table, BLOCK_A)
    assert rows["GRAFT"].seeds == [0, 1, 2] and rows["GRAFT (stored)"].seeds == [0]
    assert rows["GRAFT"].avg.mean == pytest.approx(0.36)
    assert rows["GRAFT"].avg.sd == pytest.approx(0.0086602540)   # sample sd of 0.355, 0.37, 0.355
    assert rows["GRAFT (stored)"].avg.sd is None


def test_delta_against_grpo_n8(table):
    rows = _rows(table, BLOCK_A)
    assert rows["GRPO (n=8)"].delta is None
    expected = {"GRPO+DS": 0.02, "GRPO (n=16)": 0.04, "GRPO (n=32)": 0.08, "GRAFT": 0.06,
                "GRAFT w/o gate": 0.03, "GRAFT (stored)": 0.10}
    for method, d in expected.items():
        assert rows[method].delta == pytest.approx(d), method
    assert _rows(table, BLOCK_B)["GRAFT"].delta == pytest.approx(0.05)


def test_bold_is_the_best_of_its_budget_only_when_significantly_above_the_rest(table):
    bold_a = {m for m, r in _rows(table, BLOCK_A).items() if r.bold}
    bold_b = {m for m, r in _rows(table, BLOCK_B).items() if r.bold}
    # budget 8 in A: 30, 32, 36, 33, 40 -> stored has the best mean but one seed: no test, no bold
    assert bold_a == set()
    # budget 8 in B: 21, 26, 22 -> GRAFT, significantly above both (paired over seeds 0-2); budget 16 has one row
    assert bold_b == {"GRAFT"}


def test_dagger_marks_need_a_significant_paired_test(table):
    marks_a = {m: r.mark for m, r in _rows(table, BLOCK_A).items()}
    assert marks_a == {"GRPO (n=8)": "", "GRPO+DS": "", "GRPO (n=16)": "", "GRPO (n=32)": "",
                       "GRAFT": "†",            # significantly above 30, 32, 34 but not 38
                       "GRAFT w/o gate": "",    # 33 < 34
                       "GRAFT (stored)": ""}    # 40 > every baseline up to n=32, with one seed: no claim
    marks_b = {m: r.mark for m, r in _rows(table, BLOCK_B).items()}
    # B has no n=32 baseline: tier 32 is not covered, so beating everything gives † only
    assert marks_b == {"GRPO (n=8)": "", "GRPO (n=16)": "", "GRAFT": "†", "GRAFT w/o gate": ""}
    rows = _rows(table, BLOCK_A)
    # GRPO+DS: Δ +2.0 from differences +1, +3, +2 points: t = 3.46 on 2 df, p = 0.074 (docs/results.md)
    assert rows["GRPO+DS"].delta == pytest.approx(0.02) and rows["GRPO+DS"].p == pytest.approx(0.0742, abs=1e-4)
    assert rows["GRAFT"].p < 0.01 and rows["GRAFT (stored)"].p is None and rows["GRPO (n=8)"].p is None


def test_budget_tiers_are_configurable(results):
    t = build_table1(load_runs([results]), budgets=(8, 16))
    marks = {m: r.mark for m, r in _rows(t, BLOCK_A).items()}
    # w/o gate is 3 points above GRPO n=8 in every seed: a sign-flip p of 2/2^3 = 0.25, no mark
    assert marks["GRAFT"] == "‡" and marks["GRAFT w/o gate"] == ""
    with pytest.raises(ValueError, match="two increasing tiers"):
        build_table1(load_runs([results]), budgets=(32, 16))


def test_markdown(table):
    md = to_markdown(table)
    assert f"**{BLOCK_A}**" in md and f"**{BLOCK_B}**" in md
    assert "| Method | n | math500 | aime24 | Avg | Δ |" in md
    assert "| GRAFT | 8 | 41.0 ± 0.9 | 31.0 ± 0.9 | 36.0 ± 0.9† | +6.0 |" in md
    assert "| GRAFT (stored) | 8 | 42.0 | 38.0 | 40.0 | +10.0 |" in md
    assert "| GRPO (n=8) | 8 | 31.0 ± 1.0 | 29.0 ± 1.0 | 30.0 ± 1.0 | – |" in md
    assert "| GRAFT | 8 | 28.0 ± 0.9 | 24.0 ± 0.9 | **26.0 ± 0.9**† | +5.0 |" in md
    assert "paired t-test" in md and "p < 0.05" in md and "a row with one seed is never marked" in md
    assert "###" not in md   # one group of settings: no section headings


def test_csv(table):
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert len(rows) == 11
    graft = next(r for r in rows if r["block"] == BLOCK_A and r["method"] == "GRAFT")
    assert float(graft["avg_mean"]) == pytest.approx(36.0)
    assert float(graft["avg_sd"]) == pytest.approx(0.866, abs=1e-3)
    assert float(graft["delta"]) == pytest.approx(6.0)
    assert float(graft["p_vs_baseline"]) < 0.01
    assert graft["mark"] == "†" and graft["best_in_budget"] == "False"
    assert graft["seeds"] == "0 1 2" and graft["baseline"] == "False" and graft["group"] == graft["tag"] == ""
    # live GRAFT charges A the pair: 2 models x (100 + 50) wall-s, eval excluded
    assert float(graft["charged_wall_s"]) == pytest.approx(300.0)
    stored = next(r for r in rows if r["method"] == "GRAFT (stored)")
    assert float(stored["charged_wall_s"]) == pytest.approx(150.0)
    assert float(stored["amortized_wall_s"]) == pytest.approx(450.0)
    assert stored["avg_sd"] == "" and stored["best_in_budget"] == "False" and stored["p_vs_baseline"] == ""
    base = next(r for r in rows if r["block"] == BLOCK_A and r["method"] == "GRPO (n=8)")
    assert base["delta"] == "" and base["baseline"] == "True"


def test_latex(table):
    tex = to_latex(table)
    assert tex.startswith("% Table 1") and tex.rstrip().endswith(r"\end{document}")
    assert r"\begin{tabular}{lrcccrl}" in tex and r"\usepackage{booktabs}" in tex
    fragment = to_latex(table, standalone=False)
    assert fragment.startswith(r"\begin{table}[t]") and fragment in tex
    assert rf"\multicolumn{{7}}{{l}}{{\textit{{{BLOCK_A}}}}} \\" in tex
    assert r"GRAFT (stored) & 8 & 42.0 & 38.0 & 40.0 & +10.0 & 0.2/0.2 \\" in tex
    assert r"GRAFT & 8 & 41.0 $\pm$ 0.9 & 31.0 $\pm$ 0.9 & 36.0 $\pm$ 0.9$^\dagger$ & +6.0 & 0.2/0.2 \\" in tex
    assert r"GRPO (n=8) & 8 & 31.0 $\pm$ 1.0 & 29.0 $\pm$ 1.0 & 30.0 $\pm$ 1.0 & -- & 0.2/0.2 \\" in tex
    assert "±" not in tex and "–" not in tex


def test_alias_shows_one_method_under_a_second_label(results):
    """One configuration, two labels (GRAFT's "w/o balanced exchange" = "SGT + GRAFT how"): the row is
    repeated, at the alias's place in ``methods``, with the same numbers; no second set of runs."""
    runs = load_runs([results])
    t = build_table1(runs, methods=["GRPO (n=8)", "GRAFT w/o gate", "GRAFT", "SGT + GRAFT how"],
                     aliases={"SGT + GRAFT how": "GRAFT w/o gate"})
    for title in (BLOCK_A, BLOCK_B):
        rows = _rows(t, title)
        alias, orig = rows["SGT + GRAFT how"], rows["GRAFT w/o gate"]
        assert alias.same_as == "GRAFT w/o gate" and orig.same_as is None
        assert (alias.avg, alias.delta, alias.mark, alias.bold, alias.runs) == (
            orig.avg, orig.delta, orig.mark, orig.bold, orig.runs)
        assert [r.method for r in next(b for b in t.blocks if b.title == title).rows][:4] == [
            "GRPO (n=8)", "GRAFT w/o gate", "GRAFT", "SGT + GRAFT how"]
    md = to_markdown(t)
    assert md.count("| SGT + GRAFT how | 8 | 34.0 ± 1.0 | 32.0 ± 1.0 | 33.0 ± 1.0 | +3.0 |") == 1
    assert md.count("| GRAFT w/o gate | 8 | 34.0 ± 1.0 | 32.0 ± 1.0 | 33.0 ± 1.0 | +3.0 |") == 1
    assert "SGT + GRAFT how = GRAFT w/o gate (the same runs)." in md
    rows = list(csv.DictReader(io.StringIO(to_csv(t))))
    assert len(rows) == 13 and {r["same_as"] for r in rows if r["method"] == "SGT + GRAFT how"} == {"GRAFT w/o gate"}
    assert set(_rows(build_table1(runs), BLOCK_A)) == set(_rows(t, BLOCK_A)) - {"SGT + GRAFT how"}  # no alias
    with pytest.raises(ValueError, match="alias label"):
        build_table1(runs, aliases={"GRAFT": "GRAFT w/o gate"})


def test_unknown_baseline_and_a_seed_run_twice(results, tmp_path):
    """A run of the same method, models and seed in another folder is a second row labelled with its folder, not an
    error; a seed repeated inside one folder is labelled with each run's path."""
    runs = load_runs([results])
    with pytest.raises(ValueError, match="baseline 'GRPO n=8' is not a method"):
        build_table1(runs, baseline="GRPO n=8")
    dup = make_run(tmp_path / "again", "graft-s0", "GRAFT", 0, 8, {A: (0.1, 0.1), B: (0.1, 0.1)},
                   {A: B, B: A}, source="live")
    rows = [r for r in build_table1(runs + [load_run(dup)]).blocks[1].rows if r.method == "GRAFT"]
    assert [(r.label, r.seeds) for r in rows] == [(f"GRAFT [{results.name}]", [0, 1, 2]),
                                                  (f"GRAFT [{tmp_path.name}/again]", [0])]
    assert rows[0].delta == pytest.approx(0.06) and rows[1].delta == pytest.approx(0.10 - 0.30)
    twice = make_run(results.parent / "same", "graft-a", "GRAFT", 0, 8, {A: (0.1, 0.1)}, {A: B}, source="live")
    make_run(results.parent / "same", "graft-b", "GRAFT", 0, 8, {A: (0.2, 0.2)}, {A: B}, source="live")
    labels = [r.label for r in build_table1(load_runs([twice.parent]), baseline=None).blocks[0].rows]
    assert labels == ["GRAFT [same/graft-a]", "GRAFT [same/graft-b]"]
    solo = make_run(tmp_path, "graft-solo", "GRAFT", 5, 8, {A: (0.1, 0.1)}, {A: None})
    with pytest.raises(ValueError, match=r"label\(s\) \['GRAFT'\] used by both"):
        build_table1(runs + [load_run(solo)])


def test_clip_fraction_table(results):
    clip = clip_fraction_table(load_runs([results]))
    assert [(r.method, r.model) for r in clip.rows] == [("GRAFT", B), ("GRAFT", A)]
    row = clip.rows[1]
    assert row.own.mean == pytest.approx(0.004)          # seeds: mean(0.002, 0.004), 0.005, 0.004
    assert row.peer_tokens.mean == pytest.approx(0.020)  # seeds: 0.015, 0.025, 0.02
    md = to_markdown(clip)
    assert f"| GRAFT | {A} | {B} | 0.40 ± 0.10 | 2.00 ± 0.50 |" in md
    header, rows = flat_rows(clip)
    assert header[4] == "own_mean" and rows[1][4] == pytest.approx(0.4)
    assert r"0.40 $\pm$ 0.10 & 2.00 $\pm$ 0.50 \\" in to_latex(clip)


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plots_write_pngs(results, tmp_path):
    runs = load_runs([results])
    _assert_png(plot_score_vs_compute(runs, tmp_path / "svc.png"))
    _assert_png(plot_fractions(runs, tmp_path / "sub" / "frac.png"))
    with pytest.raises(ValueError, match="groups/all_fail"):
        plot_fractions([r for r in runs if r.variant != "GRAFT"], tmp_path / "none.png")


def test_report_command(results, tmp_path):
    out = tmp_path / "report"
    res = CliRunner().invoke(report_cmd, [str(results), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"**{BLOCK_A}**" in res.output
    for name in ("table1.md", "table1.csv", "table1.tex", "clip_table.md"):
        assert (out / name).stat().st_size > 0, name
    _assert_png(out / "score_vs_compute.png")
    _assert_png(out / "fractions.png")
    bad = CliRunner().invoke(report_cmd, [str(results), "--out", str(out), "--baseline", "nope"])
    assert bad.exit_code != 0 and "baseline 'nope'" in bad.output


def test_wandb_table_offline(table, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", project="graftzoo-test", dir=str(tmp_path))
    try:
        wt = log_table_to_wandb(table, run)
    finally:
        run.finish()
    header, rows = flat_rows(table)
    assert list(wt.columns) == header and len(wt.data) == len(rows) == 11


# ---------------------------------------------------------------- malformed run dirs

def test_missing_summary_names_the_file(results, tmp_path):
    write_config(tmp_path / "r", {"run": {"name": "r"}})
    with pytest.raises(ArtifactError, match=r"r/summary\.json: missing"):
        load_run(tmp_path / "r")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="empty: no run directory"):
        load_runs([tmp_path / "empty"])


def test_bad_metrics_line_names_file_and_line(tmp_path):
    run_dir = make_run(tmp_path, "r", "GRPO (n=8)", 0, 8, {A: (0.1, 0.1)}, {A: None},
                       metrics=[{"step": 0, "model": A, "reward/acc": 0.1, "kl": None}])
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 1, "model": ')            # torn write of a killed run: ignored
    assert [r["step"] for r in load_run(run_dir).metrics] == [0]
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('\n{"step": 2, "model": "x"}\n')    # now the broken line is followed by more
    with pytest.raises(ArtifactError, match=r"metrics\.jsonl:2: invalid JSON"):
        load_run(run_dir)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"model": A}) + "\n")
    with pytest.raises(ArtifactError, match=r"metrics\.jsonl:1: key 'step'"):
        load_run(run_dir)


def test_stored_peer_cost_reads_the_peer_run(results):
    # grpo8-s0 trained B alone: 100 + 50 wall-s, eval excluded; the store folder works too
    expected = {"wall_s": 150.0, "cpu_s": 100.0, "gpu_h": 0.0}
    assert stored_peer_cost(results / "grpo8-s0", B) == pytest.approx(expected)
    assert stored_peer_cost(results / "grpo8-s0" / "store", B) == pytest.approx(expected)
    with pytest.raises(ArtifactError, match="model 'nobody' not in"):
        stored_peer_cost(results / "grpo8-s0", "nobody")


def test_bad_eval_and_summary_name_the_key(tmp_path):
    run_dir = make_run(tmp_path, "r", "GRPO (n=8)", 0, 8, {A: (0.1, 0.1)}, {A: None})
    (run_dir / "eval" / f"{A}.json").write_text(json.dumps(
        {"model": A, "step": 3, "benchmarks": {"math500": {"sd": 0.1}}}))
    with pytest.raises(ArtifactError, match=rf"{A}\.json: benchmarks\.math500\.avg"):
        load_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["peers"] = {"someone-else": None}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ArtifactError, match=r"summary\.json: key 'peers'"):
        load_run(run_dir)
    with pytest.raises(ArtifactError, match="key 'status'"):
        write_summary(run_dir, dict(summary, peers={A: None}, status="finished"))
    with pytest.raises(ArtifactError, match="config key 'run.variant' is missing"):
        make_summary({"run": {"name": "x", "seed": 0}, "algo": {"name": "grpo"}},
                     models=[A], peers={A: None},
                     status="running")


def test_eval_writer_is_atomic_and_checks_model(tmp_path):
    payload = {"model": "org/model-1", "step": 1, "benchmarks": {"math500": {"avg": 0.5}}}
    path = write_eval(tmp_path, "org/model-1", payload)
    assert path.name == "org__model-1.json"
    assert json.loads(path.read_text()) == payload
    assert [p.name for p in path.parent.iterdir()] == ["org__model-1.json"]
    with pytest.raises(ArtifactError, match="payload model"):
        write_eval(tmp_path, "other", payload)


# ---------------------------------------------------------------- like with like, labels, zero scores, figures

def _cfg_run(root, name, variant, seed, scores, peers, steps=30, k=4, source=None):
    run_dir = make_run(root, name, variant, seed, 8, scores, peers, source=source,
                       metrics=[{"step": s, "model": m, "reward/mean": 0.1 * s, "groups/all_fail": 0.5,
                                 "eval/avg": 0.2 if s == 1 else None} for s in range(2) for m in peers])
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    raw["run"]["steps"], raw["eval"] = steps, {"k": k, "size": 8, "dataset": None, "benchmarks": []}
    write_config(run_dir, raw)
    return run_dir


def test_one_model_run_and_a_run_naming_it_as_peer(tmp_path):
    """A GRPO run of B alone, a live pair run and a stored run of A whose peer is B: one report."""
    _cfg_run(tmp_path, "grpo-B", "GRPO (n=8)", 0, {B: (0.2, 0.1)}, {B: None})
    _cfg_run(tmp_path, "graft", "GRAFT", 0, {A: (0.3, 0.2), B: (0.25, 0.1)}, {A: B, B: A}, source="live")
    _cfg_run(tmp_path, "stored", "graft (n=8, stored peer)", 0, {A: (0.3, 0.3)}, {A: B}, source="stored")
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert "| graft (n=8, stored peer) |" in res.output and f"**{B} (peer: {A})**" in res.output


def test_runs_with_different_steps_or_eval_are_grouped_not_refused(tmp_path):
    """Runs of 30 steps at eval k=4 and runs of 50 steps at k=8 (another folder, the same methods and seeds): one
    section of Table 1 per group, headed by its settings, each with its own Δ and its figures in a subfolder; the
    CSV names the group. --allow-mixed KEY merges groups on KEY, --mixed merges them all, and then the runs of one
    method and seed from the two folders are two rows labelled with their folders."""
    for s in (0, 1):
        _cfg_run(tmp_path, f"g-s{s}", "GRPO (n=8)", s, {A: (0.2 + s / 50, 0.1)}, {A: None})
        _cfg_run(tmp_path, f"graft-s{s}", "GRAFT", s, {A: (0.3, 0.2), B: (0.25, 0.1)}, {A: B, B: A}, source="live")
        _cfg_run(tmp_path / "later", f"g-s{s}", "GRPO (n=8)", s, {A: (0.4, 0.3)}, {A: None}, steps=50, k=8)
    out = tmp_path / "rep"
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 groups of runs differ in run.steps, eval.k: one section of Table 1 each" in res.stderr
    md = (out / "table1.md").read_text()
    assert "### steps 30 · eval k=4 (4 runs; Δ against GRPO (n=8))" in md
    assert "### steps 50 · eval k=8 (2 runs; Δ against GRPO (n=8))" in md
    first, second = md.split("### steps 50")
    # GRAFT 25.0 against 15.5 = mean(15.0, 16.0): 10 and 9 points, a paired t of 19 on 1 df, p = 0.033: bold
    assert "| GRAFT | 8 | 30.0 ± 0.0 | 20.0 ± 0.0 | **25.0 ± 0.0** | +9.5 |" in first
    assert "| GRPO (n=8) | 8 | 40.0 ± 0.0 | 30.0 ± 0.0 | 35.0 ± 0.0 | – |" in second and "GRAFT" not in second.split("Scores")[0]
    assert f"**{A}**" in second and f"**{B} (peer: {A})**" in first
    for folder in ("steps-30-eval-k4", "steps-50-eval-k8"):
        _assert_png(out / folder / "learning_curve.png")
    assert not (out / "learning_curve.png").exists()
    assert {r["group"] for r in csv.DictReader(io.StringIO((out / "table1.csv").read_text()))} == {
        "steps 30 · eval k=4", "steps 50 · eval k=8"}
    assert r"\textbf{steps 30 $\cdot$ eval k=4 (4 runs; $\Delta$ against GRPO (n=8))}" in (out / "table1.tex").read_text()

    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(out), "--allow-mixed", "run.steps"])
    assert res.exit_code == 0 and "### eval k=4 (4 runs" in (out / "table1.md").read_text(), res.output
    for extra in (["--allow-mixed", "run.steps", "--allow-mixed", "eval.k"], ["--mixed"]):
        res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "one"), *extra])
        assert res.exit_code == 0, res.output
        md = (tmp_path / "one" / "table1.md").read_text()
        assert "###" not in md and "groups of runs" not in res.stderr
        assert f"| GRPO (n=8) [{tmp_path.name}] | 8 | 21.0 ± 1.4 | 10.0 ± 0.0 | 15.5 ± 0.7 | – |" in md, md
        assert f"| GRPO (n=8) [{tmp_path.name}/later] | 8 | 40.0 ± 0.0 | 30.0 ± 0.0 | 35.0 ± 0.0 | +19.5 |" in md
        _assert_png(tmp_path / "one" / "learning_curve.png")
    bad = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(out), "--allow-mixed", "eval.x"])
    assert bad.exit_code == 2 and "--allow-mixed eval.x: not one of run.steps" in bad.output


def test_refusals_fit_in_two_lines(tmp_path):
    """An unknown --baseline among 12 methods, and 12 methods without any baseline row: one Error line each,
    naming a few methods and how many more."""
    for i in range(12):
        _cfg_run(tmp_path, f"m{i}", f"Method {i:02d}", 0, {A: (0.2, 0.1)}, {A: None})
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep"), "--baseline", "GRPO"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "'Method 00', 'Method 01', 'Method 02', 'Method 03', 'Method 04', 'Method 05' and 6 more" in res.output
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.strip().endswith("pass --baseline with one of: 'Method 00', 'Method 01', 'Method 02', "
                                       "'Method 03', 'Method 04', 'Method 05' and 6 more")


def test_method_labels_match_case_insensitively(tmp_path):
    """The trainer's default label and the grpo_n8 preset's are one method (GRPO, n=8), shown under the preset's
    label whatever case the runs or --baseline use; the caption says which labels it merged."""
    _cfg_run(tmp_path, "a", "grpo (n=8)", 0, {A: (0.2, 0.1)}, {A: None})
    _cfg_run(tmp_path, "b", "GRPO (n=8)", 1, {A: (0.4, 0.3)}, {A: None})
    t = build_table1(load_runs([tmp_path]), baseline="grpo (N=8)")
    [row] = t.blocks[0].rows
    assert row.method == "GRPO (n=8)" and row.seeds == [0, 1] and t.baseline == "GRPO (n=8)"
    assert "GRPO (n=8) (runs labelled grpo (n=8))" in to_markdown(t)


def test_all_zero_scores_have_no_bold_delta_or_marks(tmp_path):
    _cfg_run(tmp_path, "base", "GRPO (n=8)", 0, {A: (0.0, 0.0)}, {A: None})
    _cfg_run(tmp_path, "base16", "GRPO (n=16)", 0, {A: (0.0, 0.0)}, {A: None})
    _cfg_run(tmp_path, "graft", "GRAFT", 0, {A: (0.0, 0.0), B: (0.0, 0.0)}, {A: B, B: A}, source="live")
    t = build_table1(load_runs([tmp_path]))
    md = to_markdown(t)
    assert t.all_zero and "**0.0" not in md and "†" not in md and "‡" not in md and "+0.0" not in md
    assert md.count("All scores are 0") == 1
    assert "| GRAFT | 8 | 0.0 | 0.0 | 0.0 | – |" in md


def test_smooth_is_a_debiased_ema():
    assert smooth([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])      # no pull towards 0
    assert smooth([0.0, 1.0], weight=0.5) == pytest.approx([0.0, 0.5 / 0.75])
    assert smooth([1.0, 5.0], weight=0.0) == [1.0, 5.0]
    with pytest.raises(ValueError, match="weight"):
        smooth([1.0], weight=1.0)


def test_colours_are_stable_and_labels_are_words(results, tmp_path):
    runs = load_runs([results])
    colors = run_colors(runs)
    assert colors == method_colors(list(reversed(sorted(colors))))          # same map whatever the order
    assert run_colors(runs[::-1]) == colors
    assert axis_label("groups/all_fail") == "all-fail groups (fraction)" and "/" not in axis_label("eval/avg")
    written = write_figures(runs, tmp_path, "GRPO (n=8)")
    # these runs log no complementarity (each trained alone or against a stored peer): no heat map
    assert [p.name for p in written] == [f for f in FIGURES if f != "complementarity.png"]
    for p in written:
        _assert_png(p)
    # the same method has the same colour in every figure: lines of GRAFT in fractions and learning curve
    seen = {}
    orig = plt.Axes.plot

    def spy(self, *a, **kw):
        if kw.get("label"):
            seen.setdefault(kw["label"].split(":")[0], set()).add(matplotlib.colors.to_hex(kw["color"]))
        return orig(self, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Axes, "plot", spy)
        plot_fractions(runs, tmp_path / "f.png")
        plot_learning_curve(runs, tmp_path / "l.png")
    assert seen["GRAFT"] == {matplotlib.colors.to_hex(colors["GRAFT"])}
    assert all(len(c) == 1 for c in seen.values())


def test_report_without_baseline_takes_the_grpo_row_with_most_seeds(tmp_path):
    """No row "GRPO (n=8)": the GRPO row with the most seeds is the baseline (said in one line); no GRPO row at all
    is a usage error listing the labels --baseline takes."""
    for s in (0, 1):
        _cfg_run(tmp_path, f"g4-s{s}", "GRPO (n=4)", s, {A: (0.2, 0.1)}, {A: None})
        _cfg_run(tmp_path, f"graft-s{s}", "GRAFT", s, {A: (0.3, 0.2), B: (0.25, 0.1)}, {A: B, B: A}, source="live")
    _cfg_run(tmp_path, "g16-s0", "GRPO (n=16)", 0, {A: (0.4, 0.3)}, {A: None})
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert [x for x in res.output.splitlines() if x.startswith("baseline:")] == [
        "baseline: 'GRPO (n=4)' (algo grpo: the baseline row with the most seeds; --baseline to choose another)"]
    assert "Δ = Avg − GRPO (n=4)" in res.output
    assert "| GRAFT | 8 | 30.0 ± 0.0 | 20.0 ± 0.0 | 25.0 ± 0.0 | +10.0 |" in res.output

    other = tmp_path / "no-grpo"
    _cfg_run(other, "graft", "GRAFT", 0, {A: (0.3, 0.2), B: (0.25, 0.1)}, {A: B, B: A}, source="live")
    _cfg_run(other, "rloo", "RLOO", 0, {A: (0.2, 0.1)}, {A: None})
    res = CliRunner().invoke(report_cmd, [str(other), "--out", str(tmp_path / "rep2")])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [
        "Error: no baseline row (single-model runs of an algorithm whose section declares report_baseline; builtin: "
        "grpo) to measure Δ against; pass --baseline with one of: 'GRAFT', 'RLOO'"]


def test_the_default_baseline_is_declared_by_the_algorithms_section_not_named(tmp_path):
    """The report's default baseline is a row of an algorithm whose ``algo.*`` section declares
    ``report_baseline`` (AlgoSection), whatever its name: a plugin registered at runtime with that declaration is the
    baseline, over a GRPO row with fewer seeds; a plugin whose section only builds on GRPO's keys (``LearnerConfig``)
    does not inherit it, nor does any builtin section but GRPO's."""
    class AnchorConfig(LearnerConfig):
        report_baseline: ClassVar[bool] = True   # "compare against my rows"

    class KinConfig(LearnerConfig):   # GRPO's keys, not GRPO: no declaration of its own
        scale: float = 0.5

    class Anchor(Learner):
        Config = AnchorConfig

    class Kin(Learner):
        Config = KinConfig

    names = ("zooanchor", "zookin")
    try:
        register_algo("zooanchor")(Anchor)
        register_algo("zookin")(Kin)
        assert [n for n in BUILTIN + names if is_report_baseline(n)] == ["grpo", "zooanchor"]
        assert not is_report_baseline("no-such-algo") and not is_report_baseline(None)
        for s in (0, 1):   # algo.name of make_run: the label's first word, lower case
            _cfg_run(tmp_path, f"anchor-s{s}", "ZooAnchor (n=8)", s, {A: (0.2, 0.1)}, {A: None})
        for s in (0, 1, 2):
            _cfg_run(tmp_path, f"kin-s{s}", "ZooKin (n=8)", s, {A: (0.1, 0.1)}, {A: None})
        _cfg_run(tmp_path, "grpo-s0", "GRPO (n=8)", 0, {A: (0.3, 0.1)}, {A: None})
        _cfg_run(tmp_path, "graft-s0", "GRAFT", 0, {A: (0.3, 0.2), B: (0.25, 0.1)}, {A: B, B: A}, source="live")
        assert default_baseline(load_runs([tmp_path])) == "ZooAnchor (n=8)"
        res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep")])
        assert res.exit_code == 0, res.output
        assert [x for x in res.output.splitlines() if x.startswith("baseline:")] == [
            "baseline: 'ZooAnchor (n=8)' (algo zooanchor: the baseline row with the most seeds; --baseline to "
            "choose another)"]
        assert "Δ = Avg − ZooAnchor (n=8)" in res.output
        assert "| GRPO (n=8) | 8 | 30.0 | 10.0 | 20.0 | +5.0 |" in res.output, res.output
    finally:
        for name in names:
            registry._ALGOS.pop(name, None)
            registry._CONFIGS.pop(name, None)


def test_report_says_it_dropped_a_torn_metrics_line(tmp_path):
    """A torn last line of metrics.jsonl (a killed run) is left out with one warning naming the file and line."""
    run_dir = _cfg_run(tmp_path, "r", "GRPO (n=8)", 0, {A: (0.2, 0.1)}, {A: None})
    metrics = run_dir / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write('{"step": 2, "model": ')
    res = subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", "report", str(tmp_path), "--out",
                          str(tmp_path / "rep")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    warned = [x for x in res.stderr.splitlines() if "torn" in x]
    assert warned == [f"{metrics}:3: dropped a torn last line (21 characters), the write of a killed run; the 2 "
                      f"records before it are used"], res.stderr


# ---------------------------------------------------------------- marks of significance

def test_seed_test_worked_examples():
    """docs/results.md#marks-of-significance: the paired t-test over seeds, its sign-flip fallback, Welch's test."""
    # differences +1, +3, +2 points: t = 0.02 / (0.01 / sqrt 3) = 3.464 on 2 df; T_2(t) = 1/2 + t / (2 sqrt(2 + t^2))
    assert paired_t_p([0.01, 0.03, 0.02]) == pytest.approx(2 * (0.5 - 3.4641 / (2 * 14 ** 0.5)), abs=1e-4)
    assert paired_t_p([0.01, 0.03, 0.02]) == pytest.approx(0.0742, abs=1e-4) and SIGNIFICANCE == 0.05
    assert paired_t_p([0.02, 0.03, 0.04]) == pytest.approx(0.0351, abs=1e-4)     # t = 5.196 on 2 df: significant
    assert paired_t_p([0.005] * 3) == 0.25 and paired_t_p([0.0, 0.0]) == 1.0   # no spread: sign flips, 2 / 2^n
    # no seed in common: [0, 2] vs [3, 5]: t = 3 / sqrt(2) on 2 df (Welch-Satterthwaite), p = 0.168
    assert welch_t_p([0, 2], [3, 5]) == pytest.approx(0.1679, abs=1e-4)
    assert welch_t_p([0, 0], [1, 1]) == pytest.approx(2 / 6) and welch_t_p([0, 0], [1, 1, 1]) == pytest.approx(0.1)
    test = seed_test({0: 0.50, 1: 0.52, 2: 0.51, 3: 0.9}, {0: 0.60, 1: 0.61, 2: 0.62})   # paired on seeds 0-2
    assert (test.paired, test.n, round(test.diff, 6), test.significant) == (True, 3, 0.1, True)
    test = seed_test({0: 0.0, 1: 0.02}, {5: 0.03, 6: 0.05})
    assert (test.paired, test.name, round(test.p, 4)) == (False, "Welch's t-test", 0.1679)
    assert seed_test({0: 0.3}, {0: 0.9}) is None and seed_test({0: 0.3, 1: 0.2}, {0: 0.9}) is None
    with pytest.raises(ValueError, match="need >= 2"):
        paired_t_p([0.1])


def test_noise_gets_no_bold_and_no_mark_and_a_real_gap_does(tmp_path):
    """The quick start's grid on a pair that learns nothing: scores 0.0, or 0.5 ± 0.9 (one seed of three scores
    1.5), or +0.5 in every seed; none of it is bold or marked. A row 10-12 points above every baseline in each seed
    is bold and ‡; the caption names the test and its level. The same table with one seed per row: no mark at all,
    and the caption says why."""
    single = {A: None}
    for s in (0, 1, 2):
        for n in (8, 16, 32):
            make_run(tmp_path, f"grpo{n}-s{s}", f"GRPO (n={n})", s, n, {A: (0.0, 0.0)}, single)
        peer = {"peers": {A: B}, "source": "live"}
        make_run(tmp_path, f"graft-s{s}", "GRAFT", s, 8, {A: (0.015 if s == 2 else 0.0,) * 2}, **peer)
        make_run(tmp_path, f"sgt-s{s}", "SGT", s, 8, {A: (0.005, 0.005)}, **peer)
        make_run(tmp_path, f"win-s{s}", "GRAFT how", s, 8, {A: (0.10 + s / 100, 0.10 + s / 100)}, **peer)
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "rep" / "table1.md").read_text()
    rows = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["GRAFT"].startswith("| GRAFT | 8 | 0.5 ± 0.9 | 0.5 ± 0.9 | 0.5 ± 0.9 | +0.5 |")
    assert rows["SGT"].startswith("| SGT | 8 | 0.5 ± 0.0 | 0.5 ± 0.0 | 0.5 ± 0.0 | +0.5 |")
    assert rows["GRAFT how"].startswith("| GRAFT how | 8 | 11.0 ± 1.0 | 11.0 ± 1.0 | **11.0 ± 1.0**‡ | +11.0 |")
    assert not [r for m, r in rows.items() if m != "GRAFT how" and ("**" in r or "†" in r or "‡" in r)], rows
    assert "p < 0.05 in a two-sided paired t-test of the per-seed Avg" in md
    by_method = {r["method"]: r for r in csv.DictReader(io.StringIO((tmp_path / "rep" / "table1.csv").read_text()))}
    assert float(by_method["GRAFT"]["p_vs_baseline"]) == pytest.approx(0.4226, abs=1e-4)   # t = 1 on 2 df
    assert float(by_method["SGT"]["p_vs_baseline"]) == 0.25 and float(by_method["GRAFT how"]["p_vs_baseline"]) < 0.01

    one = tmp_path / "one"
    for n in (8, 16, 32):
        make_run(one, f"grpo{n}", f"GRPO (n={n})", 0, n, {A: (0.0, 0.0)}, single)
    make_run(one, "win", "GRAFT how", 0, 8, {A: (0.5, 0.5)}, {A: B}, source="live")
    md = to_markdown(build_table1(load_runs([one])))
    assert "| GRAFT how | 8 | 50.0 | 50.0 | 50.0 | +50.0 | ? |" in md   # no bold, no ‡
    assert "Every row has one seed: no test, so no bold and no marks." in md


def test_the_report_help_lists_the_keys_the_report_groups_by():
    assert MIXABLE == COMPARABLE_KEYS
