"""The demo's verdict rests on seeds: the paired test over seeds that the report's marks use, never one run."""
import json

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.apps.demo import conclusion, verdict
from graftzoo.apps.grid import Cell
from graftzoo.contract.config import packaged_configs, read_yaml

pytestmark = pytest.mark.slow  # real processes: see pytest.ini


def test_a_gap_inside_the_seed_spread_is_no_significant_difference():
    # GRPO 0.31 / 0.98 (one seed "grokked"), GRAFT 0.60 / 0.62: differences +29 and -36 points, p = 0.93
    said = verdict([0.31, 0.98], [0.60, 0.62])
    assert said == ("there is no significant difference between GRAFT and GRPO at n=2 seeds (paired t-test, "
                    "p = 0.93)")


def test_the_verdict_is_the_paired_test_not_the_spread():
    """Above or below only where the paired test rejects: +10, +9, +11 points over 3 seeds (p = 0.003); the same
    means with +1, +3, +2 points (p = 0.07), or two seeds whose differences vary (this machine's demo figures of
    GRPO 52.7 ± 0.6 and GRAFT 50.5 ± 1.8), are no significant difference."""
    assert verdict([0.50, 0.52, 0.51], [0.60, 0.61, 0.62]).startswith("GRAFT is significantly above GRPO at n=3")
    assert verdict([0.60, 0.61, 0.62], [0.50, 0.52, 0.51]).startswith("GRAFT is significantly below GRPO at n=3")
    assert "no significant difference" in verdict([0.50, 0.50, 0.50], [0.51, 0.53, 0.52])
    assert verdict({0: 0.523, 1: 0.531}, {0: 0.492, 1: 0.518}).startswith(
        "there is no significant difference between GRAFT and GRPO at n=2 seeds")
    # the same 3-point gap in every seed: no spread to weigh it against, the exact sign-flip p is 2/2^2
    assert verdict([0.5, 0.6], [0.53, 0.63]).endswith("at n=2 seeds (paired t-test, p = 0.50)")
    # no seed in common: Welch's t-test over all of them
    assert "(Welch's t-test, p = 0.17)" in verdict({0: 0.0, 1: 0.02}, {5: 0.03, 6: 0.05})


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
    assert "there is no significant difference between GRAFT and GRPO (n=8) at n=2 seeds (paired t-test" in text


def test_demo_runs_the_plans_extra_grids_and_concludes_on_each_learner(tmp_path, monkeypatch):
    """`demo --full`'s `also` (the control, the regime map) through the real demo on a user ./configs: each extra
    grid runs in its own folder with its report, and its conclusion compares each peer method with the baseline on
    the learner of each pair (the first model), the baseline's runs coming from a one-model pair."""
    micro = read_yaml(packaged_configs() / "pairs" / "micro.yaml")
    (tmp_path / "configs" / "pairs").mkdir(parents=True)
    (tmp_path / "configs" / "pairs" / "solo.yaml").write_text(
        yaml.safe_dump({**micro, "name": "solo", "models": micro["models"][:1]}))
    (tmp_path / "configs" / "grids").mkdir()
    small = {"run.steps": 1, "rollout.n": 4, "task.prompts_per_step": 4, "eval.size": 4, "eval.k": 1,
             "run.save_every": 0, "run.progress": False, "run.track": False}
    (tmp_path / "configs" / "grids" / "ctl.yaml").write_text(yaml.safe_dump({
        "name": "ctl", "pairs": ["solo", "micro"], "seeds": [0], "set": small,
        "algorithms": [{"label": "GRPO (n=8)", "algo": "grpo_n8", "pairs": ["solo"]}],
        "variants": [{"label": "GRAFT", "algo": "graft", "peer": "online", "pairs": ["micro"]}],
        "report": {"baseline": "GRPO (n=8)"}}, sort_keys=False))
    (tmp_path / "configs" / "demo").mkdir()
    (tmp_path / "configs" / "demo" / "quick.yaml").write_text(yaml.safe_dump({
        "name": "q", "pairs": ["micro"], "seeds": [0], "set": small, "algorithms": ["grpo_n8"],
        "report": {"baseline": "GRPO (n=8)"}}, sort_keys=False))  # one run: the extra grid is what is checked
    (tmp_path / "configs" / "demo" / "demo.yaml").write_text(yaml.safe_dump(
        {"quick": {"grid": "quick", "complementarity_size": 4, "also": ["ctl"]}}))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["demo", "--quick", "--out", "out", "--jobs", "1"])
    assert res.exit_code == 0, res.output[-3000:]
    said = (tmp_path / "out" / "quick" / "ctl" / "report" / "conclusion.txt").read_text().strip().splitlines()
    assert len(said) == 1 and said[0].startswith("[micro] For micro-qwen-char"), said  # no line for the solo pair
    # a 1-step run may score 0 everywhere: then no verdict; else the seed-based comparison
    assert ("(one seed), GRAFT scores" in said[0]) != ("every score is 0 (GRPO (n=8), GRAFT)" in said[0]), said
    assert "\nctl: [micro]" in res.output.replace("\n\n", "\n")
    assert (tmp_path / "out" / "quick" / "ctl" / "grpo-n8-solo-s0" / "summary.json").exists()
