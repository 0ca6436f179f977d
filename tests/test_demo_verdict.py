"""The demo's verdict rests on seeds (issue 16): words from the seed means and their spread, never one run."""
import json

from graftzoo.apps.demo import conclusion, verdict
from graftzoo.apps.grid import Cell


def test_a_gap_inside_the_seed_spread_is_no_clear_difference():
    # GRPO 0.31 / 0.98 (one seed "grokked"), GRAFT 0.60 / 0.62: the gap (-3.5 points) is far inside s.d. 47
    said = verdict([0.31, 0.98], [0.60, 0.62])
    assert said.startswith("there is no clear difference between GRAFT and GRPO") and "47.4" in said


def test_a_gap_beyond_the_spread_says_which_side():
    assert verdict([0.50, 0.52, 0.51], [0.60, 0.61, 0.62]).startswith("GRAFT is above GRPO by more than")
    assert verdict([0.60, 0.61, 0.62], [0.50, 0.52, 0.51]).startswith("GRAFT is below GRPO by more than")
    # identical seeds: s.d. 0, and a gap under half a point is still a tie
    assert "no clear difference" in verdict([0.5, 0.5], [0.504, 0.504])


def test_one_seed_gets_no_verdict():
    said = verdict([0.31], [0.98])
    assert "single seed" in said and "no verdict" in said and "above" in said


def _cell(tmp_path, label, seed, model, score):
    d = tmp_path / f"{label}-s{seed}"
    (d / "eval").mkdir(parents=True)
    (d / "eval" / f"{model}.json").write_text(json.dumps({"benchmarks": {"mul": {"avg": score}}}))
    return Cell(name=d.name, label=label, algo="x", pair="p", seed=seed, run_dir=d, overrides={}, files=[])


def test_conclusion_quotes_seed_means_spread_and_each_seed(tmp_path):
    cells = [_cell(tmp_path, "GRPO (n=8)", 0, "m", 0.31), _cell(tmp_path, "GRPO (n=8)", 1, "m", 0.98),
             _cell(tmp_path, "GRAFT", 0, "m", 0.60), _cell(tmp_path, "GRAFT", 1, "m", 0.62)]
    text = conclusion(cells, ["m"])
    assert "For m (over 2 seeds), GRAFT n=8 scores 61.0 ± 1.4 (seeds: 60.0, 62.0)" in text
    assert "GRPO (n=8)'s 64.5 ± 47.4 (seeds: 31.0, 98.0)" in text and "Δ -3.5 points" in text
    assert "no clear difference" in text
