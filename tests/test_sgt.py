"""SGT learner (docs/algorithms.md#sgt): the rescue set, K_inj, both gates, augment and aux_nll modes,
and the micro pair (two tokenizers) co-trained end to end through the CLI."""
import json
import math
import random

import pytest
from helpers import scored_rollout
import torch
from click.testing import CliRunner

from graftzoo.algos.base import StepContext
from graftzoo.algos.functional import sequence_mean_logp
from graftzoo.algos.sgt import SGTConfig
from graftzoo.algos.sgt.learner import SGT
from graftzoo.contract.config import ConfigError, LearnerFacts, load_config
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.planner.build import build_policy
from graftzoo.contract.types import Group, Prompt

torch.set_num_threads(1)
QWEN, GPT2 = "micro-qwen-char", "micro-gpt2-pair"
G = 8


@pytest.fixture(scope="module")
def pols():
    cfg = load_config(pair="micro", algo="sgt", overrides=["peer.source=online", "run.track=false"])
    return {s.id: build_policy(s, cfg) for s in cfg.pair.models}


def run_cfg(*overrides):
    return load_config(pair="micro", algo="sgt", overrides=["peer.source=online", "run.track=false", *overrides])


rollout = scored_rollout


P = Prompt("p0", "2+3", gold="5")
Q = Prompt("p1", "4+4", gold="8")


def own_group(pol, prompt, n_correct):
    """G learner responses, the first n_correct of them correct."""
    texts = [f"{prompt.text}={prompt.gold}" if i < n_correct else f"{prompt.text}={i + 10}" for i in range(G)]
    return Group(prompt, pol.model_id, [rollout(pol, prompt, t, i < n_correct) for i, t in enumerate(texts)])


def peer_group(pol, prompt, correct):
    texts = [f"{prompt.text}={prompt.gold}" if c else f"{prompt.text}={i + 20}" for i, c in enumerate(correct)]
    return Group(prompt, pol.model_id, [rollout(pol, prompt, t, c) for t, c in zip(texts, correct)])


def step(pols, own_correct, peer_correct, *overrides):
    """One exchange for the qwen learner with the gpt2 peer; returns (learner, ctx, own groups, slots)."""
    cfg = run_cfg(*overrides)
    learner = SGT(cfg.algo, LearnerFacts.of(cfg))
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=pols[QWEN], engine=None, env=None,
                      rng=random.Random(0))
    prompts = [P, Q][:len(own_correct)]
    groups = learner.advantages(ctx, [own_group(pols[QWEN], p, c) for p, c in zip(prompts, own_correct)])
    peer = {p.id: peer_group(pols[GPT2], p, pc) for p, pc in zip(prompts, peer_correct) if pc is not None}
    return learner, ctx, groups, learner.exchange(ctx, groups, peer)


def injected(group):
    return [i for i, r in enumerate(group.rollouts) if r.role == "peer"]


def test_augment_worked_example(pols):
    """The worked example (docs/algorithms.md#sgt): G = 8, learner all-fail, one verified peer success injected:
    A = 2.47 / -0.35."""
    peer_c = [False, True, False, True, True, False, False, False]
    learner, ctx, groups, slots = step(pols, [0], [peer_c])
    (g,) = slots
    assert g.n == G and g.source == "own"
    (pos,) = injected(g)
    assert g.advantages[pos] == pytest.approx(2.4749, abs=1e-4)
    assert [a for i, a in enumerate(g.advantages) if i != pos] == pytest.approx([-0.35355] * 7, abs=1e-5)
    r = g.rollouts[pos]
    # a verified peer success, re-tokenized into the learner's tokenizer, scored under its theta_old
    assert r.correct and r.model_id == GPT2 and r.text == "2+3=5"
    assert r.token_ids == pols[QWEN].encode_text(r.text) + [pols[QWEN].eos_id]
    assert r.prompt_token_ids == pols[QWEN].encode_prompt(P)
    assert all(g.rollouts[i] is groups[0].rollouts[i] for i in range(G) if i != pos)
    assert (ctx.metrics["peer/rescued_groups"], ctx.metrics["peer/admitted"], ctx.metrics["peer/rejected"]) == (1, 1, 0)
    assert ctx.metrics["peer/s_mean"] == pytest.approx(math.exp(r.mean_logp - r.origin.mean_logp))

    batch = learner.build_batch(ctx, slots)
    rows = {id(row.rollout): row for row in batch.rows}
    assert rows[id(r)].is_peer and sum(rows[id(r)].kl_mask) == 0
    assert sum(row.is_peer for row in batch.rows) == 1
    loss, met = micro_batch_loss(ctx, pols[QWEN], learner, batch.minibatch(range(len(batch))))
    assert met["ratio/mean"] == pytest.approx(1.0, abs=1e-5)  # pi_old = the learner's own log-probs
    assert met["tokens/peer_share"] == pytest.approx(len(r.token_ids) / sum(len(x.token_ids) for x in g.rollouts))


def test_k_inj_caps_the_rescue_set(pols):
    peer_c = [False, True, False, True, True, False, False, False]
    _, ctx, _, (g,) = step(pols, [0], [peer_c], "algo.k_inj=2")
    pos = injected(g)
    assert len(pos) == 2 and ctx.metrics["peer/admitted"] == 2
    # two successes in eight: mean 1/4, unbiased std sqrt(8/7 * 3/16)
    sd = (8 / 7 * 3 / 16) ** 0.5
    assert [g.advantages[i] for i in pos] == pytest.approx([0.75 / sd] * 2, rel=1e-5)
    _, ctx, _, (g,) = step(pols, [0], [peer_c], "algo.k_inj=5")  # only 3 peer successes exist
    assert len(injected(g)) == 3 and all(g.rollouts[i].correct for i in injected(g))


@pytest.mark.parametrize("peer_c", [[True] * 3 + [False] * 5, [True] * G], ids=["mixed", "all_success"])
def test_k_inj_caps_mixed_and_all_success_peer_groups_alike(pols, peer_c):
    _, ctx, _, (g,) = step(pols, [0], [peer_c], "algo.k_inj=2")
    assert len(injected(g)) == 2 and ctx.metrics["peer/admitted"] == 2


def test_gate_all_fail_versus_threshold(pols):
    peer_c = [True] * G  # an all-success peer group may be transferred (an SGT edge case, docs/algorithms.md#sgt)
    _, ctx, groups, slots = step(pols, [1, 0], [peer_c, peer_c])
    assert injected(slots[0]) == [] and slots[0].advantages == groups[0].advantages  # 1/8 solved: not rescued
    assert len(injected(slots[1])) == 1 and ctx.metrics["peer/rescued_groups"] == 1
    _, ctx, _, slots = step(pols, [1, 0], [peer_c, peer_c], "algo.gate=threshold", "algo.tau=0.125")
    assert len(injected(slots[0])) == 1 and ctx.metrics["peer/rescued_groups"] == 2
    assert slots[0].num_correct == 2 and slots[0].rollouts[0].model_id == QWEN  # replaced a failure
    _, ctx, _, slots = step(pols, [1, 0], [peer_c, peer_c], "algo.gate=threshold", "algo.tau=0.1")
    assert injected(slots[0]) == [] and ctx.metrics["peer/rescued_groups"] == 1


def test_nothing_is_transferred_without_a_verified_peer_success(pols):
    _, ctx, groups, slots = step(pols, [0, 0], [[False] * G, None])  # peer all-fail; peer group missing
    assert [injected(g) for g in slots] == [[], []] and ctx.metrics["peer/rescued_groups"] == 0
    assert [g.advantages for g in slots] == [[0.0] * G] * 2


def test_aux_nll_mode_and_lambda(pols):
    peer_c = [False, True, False, False, False, False, False, False]

    def run(*ov):
        learner, ctx, groups, slots = step(pols, [0, 2], [peer_c, peer_c], "algo.mode=aux_nll", *ov)
        batch = learner.build_batch(ctx, slots)
        loss, met = micro_batch_loss(ctx, pols[QWEN], learner, batch.minibatch(range(len(batch))))
        return groups, slots, float(loss.detach()), met

    groups, slots, loss1, met = run()
    # the learner's groups stay untouched; the rescue response follows its group as a separate slot
    assert [g.source for g in slots] == ["own", "peer", "own"]
    assert slots[0].rollouts == groups[0].rollouts and slots[0].advantages == [0.0] * G
    assert slots[2].advantages == groups[1].advantages
    (r,) = slots[1].rollouts
    assert r.correct and r.model_id == GPT2 and r.role == "aux"
    pol = pols[QWEN]
    ids = torch.tensor([r.prompt_token_ids + r.token_ids])
    logp, _ = pol.logprobs(ids, torch.ones_like(ids), len(r.token_ids))
    nll = -float(sequence_mean_logp(logp, torch.ones_like(logp)).detach())
    assert met["loss/aux_nll"] == pytest.approx(nll, abs=1e-5)
    _, _, loss3, _ = run("algo.lam=3")
    assert loss3 - loss1 == pytest.approx(2 * nll, rel=1e-4)
    learner, ctx, _, slots = step(pols, [0, 2], [peer_c, peer_c], "algo.mode=aux_nll", "algo.lam=0")
    batch = learner.build_batch(ctx, slots)
    loss0, _ = micro_batch_loss(ctx, pol, learner, batch.minibatch(range(len(batch))))
    loss0 = float(loss0.detach())
    assert loss1 - loss0 == pytest.approx(nll, rel=1e-4)
    # the rescue rows carry no policy-gradient loss and stay out of its token-mean denominator
    learner, ctx, _, slots = step(pols, [0, 2], [peer_c, peer_c], "algo.mode=aux_nll")
    batch = learner.build_batch(ctx, slots)
    own = [i for i, row in enumerate(batch.rows) if row.role != "aux"]
    assert len(own) == len(batch) - 1

    def loss_of(idx):
        return float(micro_batch_loss(ctx, pol, learner, batch.minibatch(idx))[0].detach())

    assert loss_of(range(len(batch))) - nll == pytest.approx(loss_of(own), abs=1e-6)
    for row in batch.rows:  # the same rows as policy-gradient rows: another loss
        row.role = "peer" if row.role == "aux" else row.role
    assert loss_of(range(len(batch))) - nll != pytest.approx(loss_of(own), abs=1e-6)


def test_config_and_peer_source_errors(pols):
    for bad, match in (("algo.gate=some_fail", "algo.gate"), ("algo.mode=replace", "algo.mode"),
                       ("algo.k_inj=0", "algo.k_inj"), ("algo.tau=1.0", "algo.tau")):
        with pytest.raises(ConfigError, match=match):
            run_cfg(bad)
    with pytest.raises(ConfigError, match="needs a peer source.*--peer online"):  # at load (needs_peer)
        load_config(pair="micro", algo="sgt", overrides=["run.track=false"])
    learner = SGT(SGTConfig(), LearnerFacts.of(run_cfg()))
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(run_cfg()), policy=pols[QWEN], engine=None, env=None)
    with pytest.raises(ConfigError, match="needs a peer source"):
        learner.exchange(ctx, [own_group(pols[QWEN], P, 0)], None)


def test_cotrain_micro_pair_end_to_end(tmp_path):
    """Two models, two tokenizers, online exchange, through the CLI: rescues happen exactly where the peer
    solved one of the learner's all-fail prompts."""
    from graftzoo.apps.cli import main
    args = ["train", "--algo", "sgt", "--pair", "micro", "--peer", "online", "--no-track", "--run-dir", str(tmp_path),
            "--set", "run.steps=2", "--set", "run.eval_at_end=false", "--set", "run.progress=false",
            "--set", "task.difficulty=1", "--set", "rollout.n=8", "--set", "task.prompts_per_step=8"]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {(r["step"], r["model"]) for r in recs} == {(s, m) for s in (0, 1) for m in (QWEN, GPT2)}
    for r in recs:
        solved = round((r["peer/solved_all_fail_frac"] or 0) * r["peer/all_fail_count"])
        assert r["peer/rescued_groups"] + r["peer/rejected"] == solved  # k_inj = 1: one response per rescue
        assert r["peer/admitted"] == r["peer/rescued_groups"]
        assert (r["tokens/peer_share"] > 0) == (r["peer/admitted"] > 0)
        if r["peer/admitted"]:
            assert r["clip/frac_peer"] is not None and r["peer/s_min"] > 0 and r["xt/responses"] == solved
    assert sum(r["peer/rescued_groups"] for r in recs) > 0, "no peer success on an all-fail prompt: the exchange " \
        "never happened; pick a task setting where the micro models sometimes succeed"
