"""HORA learner (docs/algorithms.md#hora): test vectors through the learner, compute-matched variable-size
groups, history posterior, caps, and an end-to-end CLI run on the micro pair."""
from dataclasses import replace
import json

import pytest
import torch
from click.testing import CliRunner
from helpers import one_run

from graftzoo.algos.base import StepContext
from graftzoo.algos.hora.formulas import hit_utility
from graftzoo.algos.hora import HORAConfig
from graftzoo.algos.hora.learner import HORA
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.schema import validate_section
from graftzoo.contract.types import Group, Prompt, Rollout

COUNTS = [(4, 0), (2, 2), (0, 4), (1, 3)]
U_VECTORS = {
    (0, 4): [0, 0.166667, 0.285714, 0.375, 0.444444, 0.5],
    (2, 2): [0, 0.5, 0.714286, 0.821429, 0.880952, 0.916667],
    (4, 0): [0, 0.833333, 0.952381, 0.982143, 0.992063, 0.996032],
    (1, 3): [0, 0.333333, 0.523810, 0.642857, 0.722222, 0.777778],
}


class ScriptedEngine:
    """Rollouts whose correctness follows a per-prompt script; records every call's counts."""

    def __init__(self, script: dict):
        self.script = {k: list(v) for k, v in script.items()}
        self.calls = []
        self.max_new_tokens = 8

    def generate(self, prompts, n, prefixes=None, greedy=False, temperature=None, max_new_tokens=None):
        n = [n] * len(prompts) if isinstance(n, int) else list(n)
        self.calls.append(n)
        out = []
        for p, k in zip(prompts, n):
            rs = []
            for _ in range(k):
                ok = self.script[p.id].pop(0) if self.script[p.id] else False
                rs.append(Rollout(prompt_id=p.id, model_id="m", policy_version=0, text="yes" if ok else "no",
                                  token_ids=[1, 2], logprobs=[-0.1, -0.1]))
            out.append(Group(prompt=p, model_id="m", rollouts=rs))
        return out


class MarkEnv:
    def score_groups(self, groups):
        return [replace(g, rollouts=[replace(r, correct=r.text == "yes", reward=float(r.text == "yes"))
                                     for r in g.rollouts]) for g in groups]


class FakePolicy:
    model_id = "m"


def make(G, algo=None, script=None, step=0):
    run = LearnerFacts(n=G, max_new_tokens=8, minibatches=1)
    cfg = validate_section(HORAConfig, dict(algo or {}), "algo.")   # checked as load_config does:
    cfg.check(run)                                                  # the section, then its rules against the run
    learner = HORA(cfg, run)
    engine = ScriptedEngine(script or {})
    ctx = StepContext(step=step, epoch=0, run=run, policy=FakePolicy(), engine=engine, env=MarkEnv())
    return learner, ctx, engine


def prompts(k):
    return [Prompt(id=f"p{i}", text=f"{i}+{i}", gold=str(2 * i)) for i in range(k)]


def probe_script(counts, extra=20):
    """Probe outcomes (s successes then f failures) followed by failures for the extra rollouts."""
    return {f"p{i}": [True] * s + [False] * f + [False] * extra for i, (s, f) in enumerate(counts)}


@pytest.mark.parametrize("sf", list(U_VECTORS))
def test_hit_utility_vectors(sf):
    assert [hit_utility(*sf, m) for m in range(6)] == pytest.approx(U_VECTORS[sf], abs=1e-6)


@pytest.mark.parametrize("budget,want", [(6, [1, 2, 1, 2]), (8, [2, 2, 2, 2]), (10, [2, 3, 2, 3]),
                                         (16, [2, 4, 5, 5])])
def test_greedy_vectors_through_learner(budget, want):
    learner, _, _ = make(G=8)
    assert learner.allocate_extra(COUNTS, budget) == want


@pytest.mark.parametrize("G,extra", [(6, [2, 2, 2, 2]), (8, [2, 4, 5, 5])])
def test_collect_probe_then_compute_matched_allocation(G, extra):
    learner, ctx, engine = make(G, {"n0": 4}, probe_script(COUNTS))
    groups = learner.collect(ctx, prompts(4))
    assert engine.calls == [[4, 4, 4, 4], extra]
    assert [g.n for g in groups] == [4 + m for m in extra]
    assert sum(g.n for g in groups) == G * 4                      # compute-matched to GRPO
    assert [(g.rollouts[0].prompt_id, g.prompt.id) for g in groups] == [(f"p{i}", f"p{i}") for i in range(4)]
    assert ctx.metrics["hora/min_n"] == 4 + min(extra) and ctx.metrics["hora/max_n"] == 4 + max(extra)
    assert ctx.metrics["hora/probe_frac"] == pytest.approx(16 / (4 * G))
    assert ctx.metrics["hora/unused_budget"] == 0
    assert ctx.metrics["rollouts/generated"] == 4 * G


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_variable_size_groups_get_their_own_statistics(estimator):
    learner, ctx, _ = make(4, {"estimator": estimator, "n0": 2}, {"p0": [True, False, False],
                                                                     "p1": [True, True, False, False, True]})
    gs = [Group(prompt=p, model_id="m", rollouts=ctx.engine.generate([p], k)[0].rollouts)
          for p, k in zip(prompts(2), [3, 5])]
    gs = learner.advantages(ctx, ctx.score(gs))
    for g in gs:
        r = torch.tensor(g.rewards, dtype=torch.float64)
        n = len(r)
        if estimator == "grpo":
            want = (r - r.mean()) / (r.std(unbiased=True) + 1e-6)
        else:
            want = torch.tensor([r[i] - (r.sum() - r[i]) / (n - 1) for i in range(n)])
        assert g.advantages == pytest.approx(want.tolist(), abs=1e-9)


def test_skip_saturated_and_cap_leave_budget_unused():
    # p0 all-correct probe, p1 all-wrong; cap 1 extra each: 2 of the 4 extra rollouts cannot be spent
    learner, ctx, engine = make(4, {"n0": 2, "cap": 1}, {"p0": [True] * 9, "p1": [False] * 9})
    groups = learner.collect(ctx, prompts(2))
    assert engine.calls == [[2, 2], [1, 1]] and [g.n for g in groups] == [3, 3]
    assert ctx.metrics["hora/unused_budget"] == 2 and ctx.metrics["hora/capped_frac"] == 1.0
    learner, ctx, engine = make(4, {"n0": 2, "skip_saturated": True}, {"p0": [True] * 9, "p1": [False] * 9})
    groups = learner.collect(ctx, prompts(2))
    assert engine.calls == [[2, 2], [0, 4]] and [g.n for g in groups] == [2, 6]


def test_rounds_refresh_the_posterior_between_rounds():
    # both probes succeed twice; in round 1 (3 extra each) p0 fails, p1 succeeds: round 2 must favour p0
    # ([4, 2]); the stale probe posterior would split evenly ([3, 3])
    learner, ctx, engine = make(8, {"n0": 2, "rounds": 2}, {"p0": [True] * 2 + [False] * 9, "p1": [True] * 11})
    groups = learner.collect(ctx, prompts(2))
    assert engine.calls == [[2, 2], [3, 3], [4, 2]]
    assert learner.allocate_extra([(2, 0), (2, 0)], 6) == [3, 3]
    assert [g.n for g in groups] == [9, 7]


def test_history_posterior_allocates_without_probe_and_is_checkpointed():
    learner, ctx, engine = make(4, {"n0": 2, "posterior_source": "history"},
                                probe_script([(0, 0), (0, 0)]))
    learner.load_state_dict({"history": {"p0": [6, 0], "p1": [0, 1]}})
    learner.collect(ctx, prompts(2))
    assert engine.calls == [[2 + 1, 2 + 3]]         # one call: minimum n0 plus the allocation from history
    assert learner.allocate_extra([(6, 0), (0, 1)], 4) == [1, 3]
    assert ctx.metrics["hora/probe_frac"] == 0.0
    state = learner.state_dict()
    assert state["history"]["p0"] == [6, 3] and state["history"]["p1"] == [0, 1 + 5]
    again, _, _ = make(4, {"n0": 2, "posterior_source": "history", "history_decay": 0.5})
    again.load_state_dict(state)
    again._remember([Group(prompt=prompts(1)[0], model_id="m", rollouts=[])])
    assert again.state_dict()["history"]["p0"] == [3.0, 1.5]


@pytest.mark.parametrize("algo,match", [({"n0": 1}, "n0"), ({"n0": 9}, "n0"), ({"rounds": 0}, "rounds"),
                                        ({"posterior_source": "oracle"}, "posterior_source"),
                                        ({"history_decay": 0.0}, "history_decay")])
def test_bad_config_is_rejected_by_key(algo, match):
    with pytest.raises(ConfigError, match=match):
        make(8, algo)


def test_cli_end_to_end_micro(tmp_path):
    from graftzoo.apps.cli import main
    res = CliRunner().invoke(main, ["train", "--algo", "hora", "--pair", "micro", "--no-track", "--no-resume",
                                    "--set", "pair.train=[micro-qwen-char]", "--set", "run.steps=2",
                                    "--set", f"run.out_dir={tmp_path}", "--set", "eval.size=2",
                                    "--set", "algo.estimator=rloo"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    recs = [json.loads(x) for x in (one_run(tmp_path, "hora-micro-qwen-char-micro-*-s0") / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["step"] in (0, 1)]
    assert len(train) == 2
    for r in train:
        assert r["rollouts/generated"] == 4 * 4                  # rollout.n x prompts_per_step
        assert 2 <= r["hora/min_n"] <= r["hora/mean_n"] == 4.0 <= r["hora/max_n"]
        assert r["hora/probe_frac"] == 0.5 and r["loss"] is not None
