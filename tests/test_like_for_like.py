"""Comparisons that are not like for like are said, not passed over: a grid or report whose rows differ in rollout
budget, clip or run length marks them (the Differs column) and warns; runs on different datasets are separate rows;
a held-out split too small to score on and a step that must repeat prompts are warned about at start."""
import csv
import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import load_config
from graftzoo.envs.task import Task
from graftzoo.eval.artifacts import write_config
from graftzoo.training.learning.sampler import PromptSampler
from test_grid import write_grid
from test_report import A, B, make_run


def _run(root, name, variant, seed, n, scores, peers, source=None, metrics=(), **settings):
    """A hand-made finished run (``test_report.make_run``) whose config also holds ``settings`` (dotted key with
    "__" for "." -> value)."""
    run_dir = make_run(root, name, variant, seed, n, scores, peers, source=source, metrics=metrics)
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    for dotted, value in settings.items():
        node = raw
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    write_config(run_dir, raw)
    return run_dir


def _warnings(stderr: str) -> list:
    return [x for x in stderr.splitlines() if x.startswith("not like for like")]


def test_grid_says_rows_that_differ_in_rollout_budget(tmp_path):
    """The grpo_n8 preset (n=8) against GRAFT at the micro pair's n=4: the table marks GRAFT and one line on stderr
    names the rows and values; GRPO (n=16), whose preset sets rollout.n, differs by design and is not named."""
    spec = write_grid(tmp_path / "g.yaml", seeds=[0], algorithms=["grpo_n8", "grpo_n16"],
                      variants=[{"label": "GRAFT", "algo": "graft", "peer": "online"}],
                      report={"baseline": "GRPO (n=8)"})
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path / "out"), "--in-process"])
    assert res.exit_code == 0, res.output
    assert _warnings(res.stderr) == ["not like for like: rows differ in rollout.n: GRAFT 4 vs GRPO (n=8) 8 "
                                     "(the Differs column of Table 1)"], res.stderr
    table = (tmp_path / "out" / "report" / "table1.md").read_text()
    assert "| Method | n | add | mul | Avg | Δ | Clip | Differs |" in table
    graft = [x for x in table.splitlines() if x.startswith("| GRAFT |")]
    assert len(graft) == 2 and all(x.startswith("| GRAFT | 4 |") and x.endswith("| rollout.n 4 vs 8 |")
                                   for x in graft)
    assert all(x.endswith("| 0.2/0.2 |  |") for x in table.splitlines() if x.startswith("| GRPO (n=16) | 16 |"))


def test_report_says_rows_that_differ_in_budget_clip_or_steps(tmp_path):
    """``graftzoo report``: a row is compared with its block's baseline row on rollout.n, prompts per step, clip and
    the keys --allow-mixed lets differ; a label that states the row's n ("GRPO (n=16)") makes that difference its
    point, a label that states another n ("GRPO (n=32)" at n=16) does not."""
    single = {A: None}
    _run(tmp_path, "g8", "GRPO (n=8)", 0, 8, {A: (0.2, 0.1)}, single, task__prompts_per_step=8, run__steps=30)
    _run(tmp_path, "g16", "GRPO (n=16)", 0, 16, {A: (0.3, 0.1)}, single, task__prompts_per_step=8, run__steps=30)
    _run(tmp_path, "g32", "GRPO (n=32)", 0, 16, {A: (0.3, 0.2)}, single, task__prompts_per_step=8, run__steps=30)
    _run(tmp_path, "rloo", "RLOO", 0, 8, {A: (0.2, 0.2)}, single, task__prompts_per_step=4, run__steps=50,
         optim__clip={"eps_high": 0.28})
    _run(tmp_path, "graft", "GRAFT", 0, 4, {A: (0.3, 0.3), B: (0.2, 0.1)}, {A: B, B: A}, source="live",
         task__prompts_per_step=8, run__steps=30)
    out = tmp_path / "rep"
    res = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(out)])   # run.steps differs: two groups
    assert res.exit_code == 0, res.output
    assert "2 groups of runs differ in run.steps: one section of Table 1 each" in res.stderr
    md = (out / "table1.md").read_text()
    assert "### steps 30 (4 runs; Δ against GRPO (n=8))" in md and "### steps 50 (1 run; no baseline row, no Δ)" in md
    rloo = md.split("### steps 50")[1]   # RLOO alone in its group: nothing to compare it with
    assert "| RLOO | 8 | 20.0 | 20.0 | 20.0 | – | 0.2/0.28 |  |" in rloo
    assert "_No baseline row in this group: no Δ (--baseline LABEL names one)._" in rloo
    res = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(out), "--allow-mixed", "run.steps"])
    assert res.exit_code == 0, res.output
    note = " (the Differs column of Table 1)"
    assert _warnings(res.stderr) == [
        "not like for like: rows differ in rollout.n: GRPO (n=32) 16, GRAFT 4 vs GRPO (n=8) 8" + note,
        "not like for like: rows differ in task.prompts_per_step: RLOO 4 vs GRPO (n=8) 8" + note,
        "not like for like: rows differ in clip: RLOO 0.2/0.28 vs GRPO (n=8) 0.2/0.2" + note,
        "not like for like: rows differ in run.steps: RLOO 50 vs GRPO (n=8) 30" + note], res.stderr
    md = (out / "table1.md").read_text()
    assert "| RLOO | 8 | 20.0 | 20.0 | 20.0 | +5.0 | 0.2/0.28 | task.prompts_per_step 4 vs 8; clip 0.2/0.28 vs " \
           "0.2/0.2; run.steps 50 vs 30 |" in md
    assert "| GRPO (n=16) | 16 | 30.0 | 10.0 | 20.0 | +5.0 | 0.2/0.2 |  |" in md
    assert "| GRPO (n=32) | 16 | 30.0 | 20.0 | 25.0 | +10.0 | 0.2/0.2 | rollout.n 16 vs 8 |" in md
    rows = list(csv.DictReader(io.StringIO((out / "table1.csv").read_text())))
    assert {r["method"]: r["differs"] for r in rows if r["model"] == A}["GRAFT"] == "rollout.n 4 vs 8"


def test_report_groups_runs_by_method_and_task(tmp_path):
    """Two datasets are two rows, each in the block of its task (named in the title), Δ against the baseline on the
    same task; one line says the runs train on two tasks. --mixed changes none of it."""
    _run(tmp_path, "a0", "GRPO (n=8)", 0, 8, {A: (0.2, 0.2)}, {A: None}, task__dataset="a.jsonl")
    _run(tmp_path, "b1", "GRPO (n=8)", 1, 8, {A: (0.6, 0.6)}, {A: None}, task__dataset="b.jsonl")
    _run(tmp_path, "graft-a", "GRAFT", 0, 8, {A: (0.3, 0.3)}, {A: B}, source="live", task__dataset="a.jsonl",
         metrics=[{"step": 0, "model": A, "clip/frac_own": 0.01, "clip/frac_peer": 0.02}])
    out = tmp_path / "rep"
    res = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(out), "--mixed"])
    assert res.exit_code == 0, res.output
    assert _warnings(res.stderr) == ["not like for like: rows train on 2 tasks, tabulated in one block each: "
                                     "a.jsonl (GRPO (n=8), GRAFT); b.jsonl (GRPO (n=8))"], res.stderr
    md = (out / "table1.md").read_text()
    assert f"**{A} (peer: {B}) on a.jsonl**" in md and f"**{A} (peer: {B}) on b.jsonl**" in md
    assert md.count("| GRPO (n=8) | 8 |") == 2 and "| GRPO (n=8) | 8 | 20.0 | 20.0 | 20.0 | – |" in md
    assert "| GRPO (n=8) | 8 | 60.0 | 60.0 | 60.0 | – |" in md
    assert "| GRAFT | 8 | 30.0 | 30.0 | 30.0 | +10.0 |" in md             # Δ against GRPO on a.jsonl; one seed: no bold
    assert f"| GRAFT on a.jsonl | {A} | {B} | 1.00 | 2.00 |" in (out / "clip_table.md").read_text()
    rows = list(csv.DictReader(io.StringIO((out / "table1.csv").read_text())))
    assert sorted((r["task"], r["method"], r["seeds"]) for r in rows) == [
        ("a.jsonl", "GRAFT", "0"), ("a.jsonl", "GRPO (n=8)", "0"), ("b.jsonl", "GRPO (n=8)", "1")]


@pytest.mark.slow
def test_train_warns_about_a_tiny_heldout_split_and_repeated_prompts(tmp_path):
    """20 rows: the held-out slice is 2 prompts (a tenth), and 32 prompts per step out of the 18 left repeat 14 of
    them in every step; each said in one line with the numbers, as a user types the command."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"{i}+1", "answer": str(i + 1)}) + "\n"
                            for i in range(20)))
    cmd = [str(Path(sys.executable).parent / "graftzoo"), "train", "--algo", "grpo", "--pair", "micro", "--no-track",
           "--set", f"task.dataset={data}", "--set", "task.prompts_per_step=32", "--set", "run.steps=1",
           "--set", "eval.size=200", "--run-dir", str(tmp_path / "run")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert ("held-out split: 2 prompts (a tenth of the 20 of 'd', which has no test split), fewer than "
            "eval.min_heldout=10 and eval.size=200: one prompt moves its score by 50 points; give eval.dataset or "
            "more data") in lines, res.stderr
    assert ("18 training prompts, 32 per step (task.prompts_per_step): every step repeats 14 of them; lower "
            "task.prompts_per_step or give more data") in lines, res.stderr


class _Said(logging.Handler):
    def __init__(self, name):
        super().__init__()
        self.lines, self.logger = [], logging.getLogger(name)

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        self.logger.addHandler(self)
        return self.lines

    def __exit__(self, *exc):
        self.logger.removeHandler(self)


def test_many_passes_over_a_small_set_and_the_heldout_minimum_key(tmp_path):
    cfg = load_config(pair="micro", algo="grpo", overrides=["task.size=20", "run.steps=50"])
    with _Said("graftzoo.training.learning.sampler") as said:
        PromptSampler(cfg, list(range(20)))
        PromptSampler(load_config(pair="micro", algo="grpo", overrides=["task.size=20", "run.epochs=20"]),
                      list(range(20)))                                        # epochs: asked for
        PromptSampler(cfg, list(range(400)))
    assert said == ["20 training prompts, 4 per step, 50 steps (run.steps): the run trains on each prompt about 10 "
                    "times; give more data or fewer steps"]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(30)))
    with _Said("graftzoo.envs.task") as said:
        Task(load_config(pair="micro", algo="grpo", overrides=[f"task.dataset={data}", "eval.size=100",
                                                               "eval.min_heldout=0"])).check()
        Task(load_config(pair="micro", algo="grpo", overrides=[f"task.dataset={data}", "eval.size=3"])).check()
        Task(load_config(pair="micro", algo="grpo", overrides=["eval.size=4"])).check()   # 4 asked, 4 given
        assert said == []
        Task(load_config(pair="micro", algo="grpo", overrides=[f"task.dataset={data}", "eval.size=100"])).check()
    assert len(said) == 1 and said[0].startswith("held-out split: 3 prompts (a tenth of the 30 of 'd'")
