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
from graftzoo.eval.report import (build_table1, clip_fraction_table, default_baseline, flat_rows,
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
    else:
        own, peer, af, solved = [0.005], [0.025], [0.4], [0.3]
    out = []
    for step in range(len(own)):
        for m in (A, B):
            out.append({"step": step, "model": m, "clip/frac_own": own[step],
                        "clip/frac_peer": peer[step], "groups/all_fail": af[step],
                        "peer/solved_all_fail_frac": solved[step]})
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Block A (peer B): GRPO n=8 30, GRPO+DS 32, n=16 34, n=32 38, GRAFT 36, w/o gate 33,
    stored 40. Block B (peer A): GRPO n=8 21, n=16 23 (no n=32), GRAFT 26, w/o gate 22."""
    root = tmp_path_factory.mktemp("results")
    single_ab = {A: None, B: None}
    live = {A: B, B: A}
    for s, d in ((0, 0.0), (1, 0.02)):
        make_run(root, f"grpo8-s{s}", "GRPO (n=8)", s, 8,
                 {A: (0.30 + d, 0.28 + d), B: (0.22 + d, 0.18 + d)}, single_ab)
        make_run(root, f"ds-s{s}", "GRPO+DS", s, 8, {A: (0.33 + d, 0.29 + d)}, {A: None})
        make_run(root, f"grpo16a-s{s}", "GRPO (n=16)", s, 16, {A: (0.34 + d, 0.32 + d)},
                 {A: None}, cpu=200.0)
        make_run(root, f"grpo16b-s{s}", "GRPO (n=16)", s, 16, {B: (0.24 + d, 0.20 + d)},
                 {B: None}, cpu=200.0)
        make_run(root, f"grpo32-s{s}", "GRPO (n=32)", s, 32, {A: (0.38 + d, 0.36 + d)},
                 {A: None}, cpu=400.0)
        make_run(root, f"graft-s{s}", "GRAFT", s, 8,
                 {A: (0.40 + d, 0.30 + d), B: (0.27 + d, 0.23 + d)}, live, source="live",
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
    assert len(runs) == 15
    graft = load_run(results / "graft-s0")
    assert graft.peers == {A: B, B: A} and graft.rollout_n == 8 and graft.seed == 0
    assert graft.series(A, "clip/frac_own") == ([0, 1], [0.002, 0.004])
    assert graft.evals[B]["benchmarks"]["aime24"]["avg"] == 0.23


def test_blocks_rows_and_order(table, results):
    assert [b.title for b in table.blocks] == [BLOCK_B, BLOCK_A]
    assert table.benchmarks == ["math500", "aime24"]
    assert [r.method for r in table.blocks[1].rows] == [
        "GRPO (n=8)", "GRPO+DS", "GRPO (n=16)", "GRPO (n=32)",
        "GRAFT", "GRAFT (stored)", "GRAFT w/o gate"]
    first = build_table1(load_runs([results]), methods=["GRAFT", "GRPO (n=32)"])
    assert [r.method for r in first.blocks[1].rows][:3] == ["GRAFT", "GRPO (n=32)", "GRPO (n=8)"]
    rows = _rows(table, BLOCK_A)
    assert rows["GRAFT"].seeds == [0, 1] and rows["GRAFT (stored)"].seeds == [0]
    assert rows["GRAFT"].avg.mean == pytest.approx(0.36)
    assert rows["GRAFT"].avg.sd == pytest.approx(0.0141421356)   # sample sd of 0.35, 0.37
    assert rows["GRAFT (stored)"].avg.sd is None


def test_delta_against_grpo_n8(table):
    rows = _rows(table, BLOCK_A)
    assert rows["GRPO (n=8)"].delta is None
    expected = {"GRPO+DS": 0.02, "GRPO (n=16)": 0.04, "GRPO (n=32)": 0.08, "GRAFT": 0.06,
                "GRAFT w/o gate": 0.03, "GRAFT (stored)": 0.10}
    for method, d in expected.items():
        assert rows[method].delta == pytest.approx(d), method
    assert _rows(table, BLOCK_B)["GRAFT"].delta == pytest.approx(0.05)


def test_bold_is_best_avg_within_budget(table):
    bold_a = {m for m, r in _rows(table, BLOCK_A).items() if r.bold}
    bold_b = {m for m, r in _rows(table, BLOCK_B).items() if r.bold}
    # budget 8 in A: 30, 32, 36, 33, 40 -> stored; budgets 16 and 32 hold one row each
    assert bold_a == {"GRAFT (stored)"}
    # budget 8 in B: 21, 26, 22 -> GRAFT; budget 16 has one row
    assert bold_b == {"GRAFT"}


def test_dagger_marks(table):
    marks_a = {m: r.mark for m, r in _rows(table, BLOCK_A).items()}
    assert marks_a == {"GRPO (n=8)": "", "GRPO+DS": "", "GRPO (n=16)": "", "GRPO (n=32)": "",
                       "GRAFT": "†",            # 36 > 30, 32, 34 but not 38
                       "GRAFT w/o gate": "",    # 33 < 34
                       "GRAFT (stored)": "‡"}   # 40 > every baseline up to n=32
    marks_b = {m: r.mark for m, r in _rows(table, BLOCK_B).items()}
    # B has no n=32 baseline: tier 32 is not covered, so beating everything gives † only
    assert marks_b == {"GRPO (n=8)": "", "GRPO (n=16)": "", "GRAFT": "†", "GRAFT w/o gate": ""}


def test_budget_tiers_are_configurable(results):
    t = build_table1(load_runs([results]), budgets=(8, 16))
    marks = {m: r.mark for m, r in _rows(t, BLOCK_A).items()}
    assert marks["GRAFT"] == "‡" and marks["GRAFT w/o gate"] == "†"
    with pytest.raises(ValueError, match="two increasing tiers"):
        build_table1(load_runs([results]), budgets=(32, 16))


def test_markdown(table):
    md = to_markdown(table)
    assert f"**{BLOCK_A}**" in md and f"**{BLOCK_B}**" in md
    assert "| Method | n | math500 | aime24 | Avg | Δ |" in md
    assert "| GRAFT | 8 | 41.0 ± 1.4 | 31.0 ± 1.4 | 36.0 ± 1.4† | +6.0 |" in md
    assert "| GRAFT (stored) | 8 | 42.0 | 38.0 | **40.0**‡ | +10.0 |" in md
    assert "| GRPO (n=8) | 8 | 31.0 ± 1.4 | 29.0 ± 1.4 | 30.0 ± 1.4 | – |" in md
    assert "| GRAFT | 8 | 28.0 ± 1.4 | 24.0 ± 1.4 | **26.0 ± 1.4**† | +5.0 |" in md


def test_csv(table):
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert len(rows) == 11
    graft = next(r for r in rows if r["block"] == BLOCK_A and r["method"] == "GRAFT")
    assert float(graft["avg_mean"]) == pytest.approx(36.0)
    assert float(graft["avg_sd"]) == pytest.approx(1.414, abs=1e-3)
    assert float(graft["delta"]) == pytest.approx(6.0)
    assert graft["mark"] == "†" and graft["best_in_budget"] == "False"
    assert graft["seeds"] == "0 1" and graft["baseline"] == "False"
    # live GRAFT charges A the pair: 2 models x (100 + 50) wall-s, eval excluded
    assert float(graft["charged_wall_s"]) == pytest.approx(300.0)
    stored = next(r for r in rows if r["method"] == "GRAFT (stored)")
    assert float(stored["charged_wall_s"]) == pytest.approx(150.0)
    assert float(stored["amortized_wall_s"]) == pytest.approx(450.0)
    assert stored["avg_sd"] == "" and stored["best_in_budget"] == "True"
    base = next(r for r in rows if r["block"] == BLOCK_A and r["method"] == "GRPO (n=8)")
    assert base["delta"] == "" and base["baseline"] == "True"


def test_latex(table):
    tex = to_latex(table)
    assert tex.startswith(r"\begin{tabular}{lrcccrl}") and tex.rstrip().endswith(r"\end{tabular}")
    assert rf"\multicolumn{{7}}{{l}}{{\textit{{{BLOCK_A}}}}} \\" in tex
    assert r"GRAFT (stored) & 8 & 42.0 & 38.0 & \textbf{40.0}$^\ddagger$ & +10.0 & 0.2/0.2 \\" in tex
    assert r"GRAFT & 8 & 41.0 $\pm$ 1.4 & 31.0 $\pm$ 1.4 & 36.0 $\pm$ 1.4$^\dagger$ & +6.0 & 0.2/0.2 \\" in tex
    assert r"GRPO (n=8) & 8 & 31.0 $\pm$ 1.4 & 29.0 $\pm$ 1.4 & 30.0 $\pm$ 1.4 & -- & 0.2/0.2 \\" in tex
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
    assert md.count("| SGT + GRAFT how | 8 | 34.0 ± 1.4 | 32.0 ± 1.4 | 33.0 ± 1.4 | +3.0 |") == 1
    assert md.count("| GRAFT w/o gate | 8 | 34.0 ± 1.4 | 32.0 ± 1.4 | 33.0 ± 1.4 | +3.0 |") == 1
    assert "SGT + GRAFT how = GRAFT w/o gate (the same runs)." in md
    rows = list(csv.DictReader(io.StringIO(to_csv(t))))
    assert len(rows) == 13 and {r["same_as"] for r in rows if r["method"] == "SGT + GRAFT how"} == {"GRAFT w/o gate"}
    assert set(_rows(build_table1(runs), BLOCK_A)) == set(_rows(t, BLOCK_A)) - {"SGT + GRAFT how"}  # no alias
    with pytest.raises(ValueError, match="alias label"):
        build_table1(runs, aliases={"GRAFT": "GRAFT w/o gate"})


def test_unknown_baseline_and_duplicate_seed(results, tmp_path):
    runs = load_runs([results])
    with pytest.raises(ValueError, match="baseline 'GRPO n=8' is not a method"):
        build_table1(runs, baseline="GRPO n=8")
    dup = make_run(tmp_path, "graft-again", "GRAFT", 0, 8, {A: (0.1, 0.1), B: (0.1, 0.1)},
                   {A: B, B: A}, source="live")
    with pytest.raises(ValueError, match="seed 0: .*graft-s0 and .*graft-again"):
        build_table1(runs + [load_run(dup)])
    solo = make_run(tmp_path, "graft-solo", "GRAFT", 5, 8, {A: (0.1, 0.1)}, {A: None})
    with pytest.raises(ValueError, match=r"label\(s\) \['GRAFT'\] used by both"):
        build_table1(runs + [load_run(solo)])


def test_clip_fraction_table(results):
    clip = clip_fraction_table(load_runs([results]))
    assert [(r.method, r.model) for r in clip.rows] == [("GRAFT", B), ("GRAFT", A)]
    row = clip.rows[1]
    assert row.own.mean == pytest.approx(0.004)          # seeds: mean(0.002, 0.004), 0.005
    assert row.peer_tokens.mean == pytest.approx(0.020)  # seeds: 0.015, 0.025
    md = to_markdown(clip)
    assert f"| GRAFT | {A} | {B} | 0.40 ± 0.14 | 2.00 ± 0.71 |" in md
    header, rows = flat_rows(clip)
    assert header[4] == "own_mean" and rows[1][4] == pytest.approx(0.4)
    assert r"0.40 $\pm$ 0.14 & 2.00 $\pm$ 0.71 \\" in to_latex(clip)


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


def test_runs_with_different_steps_or_eval_are_refused(tmp_path):
    _cfg_run(tmp_path, "a", "GRPO (n=8)", 0, {A: (0.2, 0.1)}, {A: None}, steps=30, k=4)
    _cfg_run(tmp_path, "b", "GRPO (n=8)", 1, {A: (0.2, 0.1)}, {A: None}, steps=50, k=8)
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep")])
    assert res.exit_code != 0
    line = res.output.strip().splitlines()[-1]
    assert "run.steps (30: a; 50: b)" in line and "eval.k (4: a; 8: b)" in line and "--allow-mixed" in line
    res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep"), "--allow-mixed", "run.steps"])
    assert res.exit_code != 0 and "eval.k" in res.output and "run.steps" not in res.output.splitlines()[-1]
    for extra in (["--allow-mixed", "run.steps", "--allow-mixed", "eval.k"], ["--mixed"]):
        res = CliRunner().invoke(report_cmd, [str(tmp_path), "--out", str(tmp_path / "rep"), *extra])
        assert res.exit_code == 0, res.output


def test_method_labels_match_case_insensitively(tmp_path):
    _cfg_run(tmp_path, "a", "grpo (n=8)", 0, {A: (0.2, 0.1)}, {A: None})
    _cfg_run(tmp_path, "b", "GRPO (n=8)", 1, {A: (0.4, 0.3)}, {A: None})
    t = build_table1(load_runs([tmp_path]), baseline="GRPO (N=8)")
    [row] = t.blocks[0].rows
    assert row.method == "grpo (n=8)" and row.seeds == [0, 1] and t.baseline == "grpo (n=8)"


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
    assert [p.name for p in written] == list(FIGURES)
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
