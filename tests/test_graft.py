"""GRAFT [graft] (docs/algorithms.md#graft): the learner path on hand-built groups with the real micro pair
(re-tokenization and theta_old scoring by ``ctx.localize``), every ablation switch, and an end-to-end
co-training run through the CLI."""
import dataclasses
import json
import math
import random

import pytest
import torch
from helpers import policy_loss

import graftzoo.peers.xt
from graftzoo.algos.base import StepContext
from graftzoo.algos.functional import align_peer_logprobs, group_advantages
from graftzoo.algos.graft import GRAFTConfig
from graftzoo.algos.graft.learner import GRAFT
from graftzoo.contract.config import ConfigError, LearnerFacts, load_config
from graftzoo.training.planner.build import build_policy
from graftzoo.contract.types import Group, Origin, Prompt, Rollout

LEARNER, PEER = "micro-qwen-char", "micro-gpt2-pair"

# A test-only variant of the micro pair: the same two models, warmed up longer on 1-digit problems, so that
# both have mixed and all-fail groups on difficulty-1 prompts (the stock micro models are almost always all-fail).
STRONG_PAIR = """
pair:
  models:
    - {id: micro-qwen-char, kind: tiny, family: qwen2, tokenizer: char, hidden: 64, layers: 2, heads: 4, kv_heads: 2,
       ffn: 128, max_new_tokens: 40,
       warmup: {steps: 150, batch: 32, lr: 3.0e-3, mix: {add: 0.7, mul: 0.3}, difficulty: 1, probe_per_skill: 8}}
    - {id: micro-gpt2-pair, kind: tiny, family: gpt2, tokenizer: digit_pair, hidden: 64, layers: 2, heads: 4, ffn: 128,
       max_new_tokens: 32,
       warmup: {steps: 150, batch: 32, lr: 3.0e-3, mix: {add: 0.3, mul: 0.7}, difficulty: 1, probe_per_skill: 8}}
task: {difficulty: 1, prompts_per_step: 8}
rollout: {n: 8}
run: {eval_at_end: false, save_every: 0}
"""


def make_cfg(*overrides, peer="online"):
    return load_config(pair="micro", algo="graft", overrides=[f"peer.source={peer}", *overrides])


@pytest.fixture(scope="module")
def pols():
    cfg = make_cfg()
    return {s.id: build_policy(s, cfg) for s in cfg.pair.models}


def learner(*overrides, peer="online"):
    cfg = make_cfg(*[f"algo.{o}" if "." not in o.split("=")[0] else o for o in overrides], peer=peer)
    assert isinstance(cfg.algo, GRAFTConfig)
    return GRAFT(cfg.algo, LearnerFacts.of(cfg)), cfg


def context(cfg, pol, seed=0):
    return StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=pol, engine=None, env=None,
                       rng=random.Random(seed))


def rollout(pol, prompt, text, correct, lp=-1.0):
    """A stopped response in ``pol``'s tokenizer; body log-probs ``lp`` (a float or one per token), EOS -0.1."""
    ids = pol.encode_text(text)
    lps = [lp] * len(ids) if isinstance(lp, float) else list(lp)
    return Rollout(prompt_id=prompt.id, model_id=pol.model_id, policy_version=0, text=text,
                   token_ids=ids + [pol.eos_id], logprobs=lps + [-0.1], finish_reason="stop",
                   prompt_token_ids=pol.encode_prompt(prompt), eos_id=pol.eos_id, reward=float(correct),
                   correct=bool(correct))


def group(pol, prompt, rewards, lp=-1.0, texts=None):
    """A group with GRPO advantages set as the trainer does."""
    a, b = (int(v) for v in prompt.text.split("+"))
    texts = texts or [f"{a}+{b}+0*{i}={a + b if r else a + b + 1}" for i, r in enumerate(rewards)]  # distinct
    rolls = [rollout(pol, prompt, t, r, lp) for t, r in zip(texts, rewards)]
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.zeros(len(rewards), dtype=torch.long))
    return Group(prompt=prompt, model_id=pol.model_id, rollouts=rolls, advantages=adv.tolist())


def prompts(k):
    return [Prompt(id=f"p{i}", text=f"{10 + i}+{20 + i}", gold=str(30 + 2 * i)) for i in range(k)]


MIXED = [1, 1, 0, 0, 0, 0, 0, 0]
FAIL = [0] * 8


def batch_of(pols, learner_rewards, peer_rewards, peer_lp=-1.0):
    """Hand-built learner and peer groups on the same prompts (``None`` = no peer group)."""
    ps = prompts(len(learner_rewards))
    own = [group(pols[LEARNER], p, r) for p, r in zip(ps, learner_rewards)]
    peer = {p.id: group(pols[PEER], p, r, peer_lp) for p, r in zip(ps, peer_rewards) if r is not None}
    return own, peer


def grafted_ids(slots):
    return sorted(g.prompt.id for g in slots if g.source == "peer")


# ------------------------------------------------------------------------------------------------
# the worked example (docs/algorithms.md#graft-compatibility-gate) through the learner path
# ------------------------------------------------------------------------------------------------

WORKED_L = {0: -0.70, 1: -0.90, 2: -0.50}  # response index -> l_L; the others equal l_P (s = 1)


def fixed_scores(monkeypatch, values: dict, default=None):
    """theta_old scoring that gives each grafted text the mean log-prob ``values[text]`` (or ``default``);
    EOS gets -5, which must not count: the convention excludes EOS on both sides."""
    def score(policy, rollouts, chunk=256):
        out = []
        for r in rollouts:
            n = len(r.token_ids)
            ends = r.token_ids and r.token_ids[-1] == policy.eos_id
            ell = values.get(r.text, default)
            out.append(dataclasses.replace(r, logprobs=[ell] * (n - 1 if ends else n) + ([-5.0] if ends else [])))
        return out
    monkeypatch.setattr(graftzoo.peers.xt, "score_rollouts", score)


def worked_setup(pols, monkeypatch, *overrides, ell=WORKED_L, peer_rewards=(1, 0, 0, 0, 0, 0, 0, 0)):
    """Prompt p0: learner all-fail, peer mixed (rewards ``peer_rewards``, l_P = -0.60); p1..p3: learner mixed."""
    own, peer = batch_of(pols, [FAIL, MIXED, MIXED, MIXED], [list(peer_rewards), MIXED, MIXED, MIXED], peer_lp=-0.60)
    fixed_scores(monkeypatch, {r.text: ell.get(i, -0.60) for i, r in enumerate(peer["p0"].rollouts)})
    algo, cfg = learner(*overrides)
    ctx = context(cfg, pols[LEARNER])
    return algo, ctx, own, peer


def test_worked_example_through_the_learner(pols, monkeypatch):
    algo, ctx, own, peer = worked_setup(pols, monkeypatch)
    slots = algo.exchange(ctx, own, peer)
    assert len(slots) == 4 and grafted_ids(slots) == ["p0"]            # replacement keeps the slot count
    g = slots[-1]                                                       # peer-last
    assert g.prompt.id == "p0" and g.n == 8 and g.model_id == PEER
    assert g.weights == pytest.approx([0.904837, 0.0, 1.0] + [1.0] * 5, abs=1e-6)
    assert g.advantages == pytest.approx([2.4749] + [-0.35355] * 7, abs=1e-4)
    assert g.advantages == peer["p0"].advantages                        # reused, not recomputed after the gate
    m = ctx.metrics
    assert (m["peer/rescued_groups"], m["peer/admitted"], m["peer/rejected"]) == (1, 7, 1)
    assert m["peer/s_min"] == pytest.approx(0.740818, abs=1e-6)
    assert m["peer/s_max"] == pytest.approx(1.105171, abs=1e-6)
    assert m["peer/s_median"] == pytest.approx(1.0)
    assert m["peer/admit_rate_succ"] == 1.0 and m["peer/admit_rate_fail"] == pytest.approx(6 / 7)
    batch = algo.build_batch(ctx, slots)
    peer_rows = [r for r in batch.rows if r.is_peer]
    assert len(peer_rows) == 7                                          # the rejected response leaves the loss
    assert sorted(r.weight for r in peer_rows)[0] == pytest.approx(0.904837, abs=1e-6)
    assert all(r.kl_mask == [0.0] * len(r.kl_mask) for r in peer_rows)  # KL on own tokens only


def test_a_response_exactly_at_the_floor_is_admitted(pols, monkeypatch):
    """The gate is s >= delta (docs/algorithms.md#graft-compatibility-gate): with l_P = 0 and l_L = log(0.8), s is
    exactly 0.8 (exp(log 0.8) == 0.8 in float64, and a mean of equal log-probs is exact), so the response is
    admitted, with w = min(s, 1) = 0.8; one with s a hair below the floor is rejected."""
    at, below = math.log(0.8), math.log(0.8) - 1e-12
    assert math.exp(at) == 0.8 and math.exp(below) < 0.8
    own, peer = batch_of(pols, [FAIL, MIXED, MIXED, MIXED], [[1, 0, 0, 0, 0, 0, 0, 0], MIXED, MIXED, MIXED],
                         peer_lp=0.0)
    texts = [r.text for r in peer["p0"].rollouts]
    fixed_scores(monkeypatch, {texts[0]: at, texts[1]: below}, default=0.0)
    algo, cfg = learner()                                              # the default floor, delta = 0.8
    assert cfg.algo.delta == 0.8
    ctx = context(cfg, pols[LEARNER])
    slots = algo.exchange(ctx, own, peer)
    g = slots[-1]
    assert g.prompt.id == "p0" and g.weights[:3] == [0.8, 0.0, 1.0]
    assert ctx.metrics["peer/s_min"] < 0.8 and (ctx.metrics["peer/admitted"], ctx.metrics["peer/rejected"]) == (7, 1)
    rows = {r.rollout.text: r for r in algo.build_batch(ctx, slots).rows if r.is_peer}
    assert rows[texts[0]].weight == 0.8 and texts[1] not in rows      # in the loss at the floor; out below it


def test_compatibility_uses_learner_theta_old_mean_logp_without_eos(pols):
    """Real scoring: s = exp(l_L - l_P), l_L = the learner's theta_old mean log-prob of the re-tokenized text."""
    own, peer = batch_of(pols, [FAIL, MIXED, MIXED, MIXED], [[1, 0, 0, 0, 0, 0, 0, 0], MIXED, MIXED, MIXED],
                         peer_lp=-0.60)
    algo, cfg = learner("delta=0")
    pol = pols[LEARNER]
    ctx = context(cfg, pol)
    slots = algo.exchange(ctx, own, peer)
    p = own[0].prompt
    expect = []
    for r in peer["p0"].rollouts:
        pids, body = pol.encode_prompt(p), pol.encode_text(r.text)
        ids = torch.tensor([pids + body + [pol.eos_id]])
        with torch.no_grad():
            lp, _ = pol.logprobs(ids, torch.ones_like(ids), len(body) + 1)
        expect.append(math.exp(lp[0, :len(body)].mean().item() + 0.60))   # EOS excluded; l_P = -0.60
    g = slots[-1]
    assert g.weights == pytest.approx([min(s, 1.0) for s in expect], rel=1e-4)
    assert ctx.metrics["peer/s_mean"] == pytest.approx(sum(expect) / len(expect), rel=1e-4)
    row = next(r for r in algo.build_batch(ctx, slots).rows if r.is_peer)
    assert row.response_ids[-1] == pol.eos_id                          # EOS appended for the loss (stopped)


def test_needs_a_peer_source(pols):
    with pytest.raises(ConfigError, match=r"--peer online\|stored:PATH\|mixed:PATH"):
        learner(peer="none")
    algo, cfg = learner()
    own, _ = batch_of(pols, [FAIL], [None])
    with pytest.raises(ConfigError, match="--peer"):
        algo.exchange(context(cfg, pols[LEARNER]), own, None)


def test_config_keys_are_checked():
    cfg = make_cfg()
    a = {**cfg.algo.model_dump(), "eps_high": cfg.optim.clip.eps_high}   # the shared clip: GRPO's 0.2
    assert (a["eps_high"], a["delta"], a["weight"], a["select"], a["balance"], a["max_peer_frac"], a["admission"],
            a["token_ratio"], a["peer_position"], a["peer_minibatches"], a["renorm_adv_after_gate"]) == \
        (0.2, 0.8, "min_s_1", "complementary", "none", 1.0, "gate", "learner_old", "last", "replace_slots", False)
    assert a["k_inj"] == 1 and "sgt_k_inj" not in a                  # SGT's key name and meaning
    with pytest.raises(ConfigError, match="algo.balance"):
        make_cfg("algo.balance=fair")
    with pytest.raises(ConfigError, match="max_peer_frac.*extension"):  # a cap without the extension that applies it
        make_cfg("algo.max_peer_frac=0.25")
    with pytest.raises(ConfigError, match="sgt_rescue.*no cap"):
        make_cfg("algo.select=sgt_rescue", "algo.balance=cap_pvar")
    with pytest.raises(ConfigError, match="peer_minibatches=replace_slots"):
        make_cfg("algo.peer_position=uniform", "algo.peer_minibatches=separate")


# ------------------------------------------------------------------------------------------------
# gate and weight switches
# ------------------------------------------------------------------------------------------------

def test_delta_zero_admits_everything(pols, monkeypatch):
    algo, ctx, own, peer = worked_setup(pols, monkeypatch, "delta=0")
    g = algo.exchange(ctx, own, peer)[-1]
    assert g.weights == pytest.approx([0.904837, 0.740818, 1.0] + [1.0] * 5, abs=1e-6)
    assert ctx.metrics["peer/rejected"] == 0


def test_weight_one(pols, monkeypatch):
    algo, ctx, own, peer = worked_setup(pols, monkeypatch, "weight=one")
    assert algo.exchange(ctx, own, peer)[-1].weights == [1.0, 0.0] + [1.0] * 6


def test_admission_all_and_random_count_matched(pols, monkeypatch):
    algo, ctx, own, peer = worked_setup(pols, monkeypatch, "admission=all")
    assert algo.exchange(ctx, own, peer)[-1].weights == pytest.approx([0.904837, 0.740818, 1.0] + [1.0] * 5,
                                                                       abs=1e-6)
    algo, _, own, peer = worked_setup(pols, monkeypatch, "admission=random_count_matched")
    rejected_idx = set()
    for seed in range(8):
        ctx = StepContext(step=0, epoch=0, run=ctx.run, policy=pols[LEARNER], engine=None, env=None,
                          rng=random.Random(seed))
        w = algo.exchange(ctx, own, peer)[-1].weights
        assert sum(1 for x in w if x > 0) == 7 and ctx.metrics["peer/admitted"] == 7   # the gate's count
        out = [i for i, x in enumerate(w) if x == 0]
        rejected_idx.update(out)
        s = [0.904837, 0.740818, 1.0] + [1.0] * 5
        assert [x for x in w if x > 0] == pytest.approx([min(v, 1) for i, v in enumerate(s) if i not in out], abs=1e-6)
    assert rejected_idx - {1}                                           # not the gate's choice


def test_renorm_adv_after_gate(pols, monkeypatch):
    rewards = (1, 1, 0, 0, 0, 0, 0, 0)
    ell = {0: -0.90}                                                    # the first success is rejected
    algo, ctx, own, peer = worked_setup(pols, monkeypatch, ell=ell, peer_rewards=rewards)
    reused = algo.exchange(ctx, own, peer)[-1]
    assert reused.advantages == peer["p0"].advantages
    algo, ctx, own, peer = worked_setup(pols, monkeypatch, "renorm_adv_after_gate=true", ell=ell,
                                        peer_rewards=rewards)
    g = algo.exchange(ctx, own, peer)[-1]
    want = group_advantages(torch.tensor(rewards[1:], dtype=torch.float64), torch.zeros(7, dtype=torch.long))
    assert g.advantages[1:] == pytest.approx(want.tolist(), abs=1e-9)
    assert g.advantages[1] != pytest.approx(reused.advantages[1], abs=1e-3)


# ------------------------------------------------------------------------------------------------
# selection and balance
# ------------------------------------------------------------------------------------------------

# p0..p3: learner all-fail, peer mixed with 4, 1, 2, 7 successes of 8 (p(1-p): .25, .11, .19, .11);
# p4: peer all-fail, learner mixed (the other direction's candidate); p5, p6: both mixed; p7: peer all-success
BAL_L = [FAIL, FAIL, FAIL, FAIL, MIXED, MIXED, MIXED, FAIL]
BAL_P = [[1] * 4 + [0] * 4, [1] + [0] * 7, [1] * 2 + [0] * 6, [1] * 7 + [0], FAIL, MIXED, MIXED, [1] * 8]


def test_balanced_exchange_replaces_every_candidate_with_the_whole_peer_group(pols):
    """The sourced default (docs/algorithms.md#graft-which-groups): every learner all-fail prompt with a mixed peer
    group is replaced by the whole peer group, successes and failures with their peer advantages; no cap."""
    own, peer = batch_of(pols, BAL_L, BAL_P)
    algo, cfg = learner("delta=0")
    slots = {g.prompt.id: g for g in algo.exchange(context(cfg, pols[LEARNER]), own, peer)}
    assert sorted(k for k, g in slots.items() if g.source == "peer") == ["p0", "p1", "p2", "p3"]
    for x in ("p0", "p1", "p2", "p3"):
        g = slots[x]
        assert g.n == 8 and [r.correct for r in g.rollouts] == [bool(v) for v in BAL_P[int(x[1])]]
        assert g.advantages == peer[x].advantages and min(g.advantages) < 0 < max(g.advantages)
    assert slots["p7"] is own[7]                          # peer all-success: zero peer advantage, not informative


@pytest.mark.parametrize("overrides, want", [             # EXTENSIONS (not in the sourced method)
    (("balance=cap_pvar", "max_peer_frac=0.25"), ["p0", "p2"]),   # cap floor(0.25 * 8) = 2, ranked by p(1-p)
    (("balance=cap_pvar",), ["p0", "p1", "p2", "p3"]),            # max_peer_frac 1: no cap in effect
    (("balance=symmetric", "max_peer_frac=0.25"), ["p0"]),        # min(|C^A| = 4, |C^B| = 1, cap 2)
    (("balance=cap_pvar", "max_peer_frac=0.5"), ["p0", "p1", "p2", "p3"]),   # cap 4
    (("balance=cap_pvar", "max_peer_frac=0.125"), ["p0"]),                   # cap 1
])
def test_cap_extensions(pols, overrides, want):
    own, peer = batch_of(pols, BAL_L, BAL_P)
    algo, cfg = learner(*overrides)
    slots = algo.exchange(context(cfg, pols[LEARNER]), own, peer)
    assert grafted_ids(slots) == want and len(slots) == 8


def test_missing_peer_group_means_no_replacement(pols):
    own, peer = batch_of(pols, BAL_L, [None] + BAL_P[1:])
    algo, cfg = learner()
    assert grafted_ids(algo.exchange(context(cfg, pols[LEARNER]), own, peer)) == ["p1", "p2", "p3"]
    algo, cfg = learner("balance=cap_pvar", "max_peer_frac=0.25")
    ids = grafted_ids(algo.exchange(context(cfg, pols[LEARNER]), own, peer))
    assert len(ids) == 2 and "p2" in ids and "p0" not in ids   # p1 and p3 tie on p(1-p): a seeded draw


def test_select_random_count_matched(pols):
    own, peer = batch_of(pols, BAL_L, BAL_P)
    algo, cfg = learner("select=random_count_matched")
    seen = set()
    for seed in range(6):
        ids = grafted_ids(algo.exchange(context(cfg, pols[LEARNER], seed), own, peer))
        assert len(ids) == 4                               # the balanced exchange's count (4 candidates)
        seen.update(ids)
    assert seen - {"p0", "p1", "p2", "p3"}                 # prompts outside the candidate set get picked


def test_sgt_graft_how(pols, monkeypatch):
    own, peer = batch_of(pols, BAL_L, BAL_P)             # peer l_P = -1.0
    fixed_scores(monkeypatch, {}, default=-0.6)           # s = e^0.4 > 1: every transferred success admitted
    algo, cfg = learner("select=sgt_rescue")
    ctx = context(cfg, pols[LEARNER])
    slots = {g.prompt.id: g for g in algo.exchange(ctx, own, peer)}
    # complementary GRAFT leaves p7 (peer all-success, zero peer advantage) alone; SGT's rescue set takes it
    assert {k for k, g in slots.items() if g.source == "peer"} == {"p0", "p1", "p2", "p3", "p7"}
    # mixed peer group: only its successes, with the peer's (positive) advantages
    g1 = slots["p1"]
    assert g1.n == 1 and g1.rollouts[0].correct and g1.advantages == pytest.approx([2.4749], abs=1e-4)
    assert all(r.correct for p in ("p0", "p2", "p3") for r in slots[p].rollouts)
    # all-success peer group: one success injected into the learner's group, advantages recomputed
    # (docs/algorithms.md#sgt)
    g7 = slots["p7"]
    assert g7.n == 8 and sum(r.correct for r in g7.rollouts) == 1
    assert sorted(g7.advantages) == pytest.approx([-0.35355] * 7 + [2.4749], abs=1e-4)
    assert ctx.metrics["peer/admit_rate_fail"] is None
    batch = algo.build_batch(ctx, list(slots.values()))
    rows7 = [r for r in batch.rows if r.rollout.prompt_id == "p7"]
    assert [r.is_peer for r in rows7] == [r.rollout.correct for r in rows7]   # own responses stay own
    assert all(any(r.kl_mask) for r in rows7 if not r.is_peer)
    # GRAFT's gate applies to the transferred successes: rejected, nothing is injected or grafted
    fixed_scores(monkeypatch, {}, default=-2.0)           # s = e^-1 < 0.8
    ctx = context(cfg, pols[LEARNER])
    slots = {g.prompt.id: g for g in algo.exchange(ctx, own, peer)}
    assert slots["p7"] is own[7] and ctx.metrics["peer/admitted"] == 0
    assert ctx.metrics["peer/rescued_groups"] == 4 and ctx.metrics["peer/admit_rate_succ"] == 0.0


@pytest.mark.parametrize("k_inj", [1, 3])
def test_sgt_graft_how_caps_every_rescued_prompt_at_sgts_k_inj(pols, monkeypatch, k_inj):
    """"SGT + GRAFT how" (= "w/o balanced exchange") takes SGT's rescue set (docs/algorithms.md#sgt): at most
    algo.k_inj of the peer's successes per prompt, drawn at random, from a mixed peer group (which keep their peer
    advantages) as from an all-success one (injected by augmentation)."""
    own, peer = batch_of(pols, BAL_L, BAL_P)           # peer successes: p0 4, p1 1, p2 2, p3 7, p7 8 (all)
    fixed_scores(monkeypatch, {}, default=-0.6)
    algo, cfg = learner("select=sgt_rescue", f"k_inj={k_inj}")
    drawn = set()
    for seed in range(6):
        slots = {g.prompt.id: g for g in algo.exchange(context(cfg, pols[LEARNER], seed), own, peer)}
        assert sum(r.correct for r in slots["p7"].rollouts) == k_inj and slots["p7"].n == 8
        for x, successes in (("p0", 4), ("p1", 1), ("p2", 2), ("p3", 7)):
            g = slots[x]
            assert g.source == "peer" and g.n == min(k_inj, successes) and all(r.correct for r in g.rollouts)
            texts = [r.text for r in peer[x].rollouts]
            assert g.advantages == [peer[x].advantages[texts.index(r.text)] for r in g.rollouts]
        drawn.add(tuple(r.text for r in slots["p3"].rollouts))
    assert len(drawn) > 1                                # a random draw among the peer's successes


# ------------------------------------------------------------------------------------------------
# slot order and minibatches
# ------------------------------------------------------------------------------------------------

def minibatch_peers(algo, ctx, slots):
    batch = algo.build_batch(ctx, slots)
    return [sorted({batch.rows[i].slot for i in mb if batch.rows[i].is_peer}) for mb in algo.schedule(ctx, batch)]


@pytest.mark.parametrize("overrides, want", [
    ((), [[], [6, 7]]),                                    # last
    (("peer_position=first",), [[0, 1], []]),
    (("peer_position=uniform",), [[3], [7]]),              # one per minibatch
    (("peer_minibatches=separate",), [[], [6, 7]]),        # own informative 3 slots: 1 minibatch of 4, then peer
    (("peer_minibatches=separate", "peer_position=first"), [[6, 7], []]),
])
def test_peer_position_and_minibatches(pols, overrides, want):
    own, peer = batch_of(pols, BAL_L, BAL_P)   # capped at 2 grafted groups (extension) for a mixed layout
    algo, cfg = learner(*overrides, "delta=0", "optim.minibatches=2", "balance=cap_pvar", "max_peer_frac=0.25")
    ctx = context(cfg, pols[LEARNER])
    slots = algo.exchange(ctx, own, peer)
    assert minibatch_peers(algo, ctx, slots) == want


def test_separate_minibatches_hold_only_informative_own_groups(pols):
    """peer_minibatches=separate (docs/algorithms.md#graft-peer-last-order, the alternative): own minibatches hold
    the own informative groups; an own group with zero advantages (here p7: learner all-fail, peer all-success, not
    replaced) is left out."""
    own, peer = batch_of(pols, BAL_L, BAL_P)
    scheduled = {}
    for layout in ("replace_slots", "separate"):
        algo, cfg = learner(f"peer_minibatches={layout}", "delta=0", "optim.minibatches=2")
        ctx = context(cfg, pols[LEARNER])
        batch = algo.build_batch(ctx, algo.exchange(ctx, own, peer))
        mbs = algo.schedule(ctx, batch)
        scheduled[layout] = {batch.groups[batch.rows[i].slot].prompt.id for mb in mbs for i in mb}
        if layout == "separate":
            assert [{batch.groups[batch.rows[i].slot].source for i in mb} for mb in mbs] == [{"own"}, {"peer"}]
    assert scheduled["replace_slots"] == {f"p{i}" for i in range(8)}
    assert scheduled["separate"] == {f"p{i}" for i in range(8)} - {"p7"}


# ------------------------------------------------------------------------------------------------
# token ratio and EOS
# ------------------------------------------------------------------------------------------------

def test_token_ratio_learner_old_is_ratio_one(pols):
    own, peer = batch_of(pols, BAL_L, BAL_P, peer_lp=-3.0)
    algo, cfg = learner("delta=0")
    ctx = context(cfg, pols[LEARNER])
    batch = algo.build_batch(ctx, algo.exchange(ctx, own, peer))
    mb = batch.minibatch([i for i, r in enumerate(batch.rows) if r.is_peer])
    with torch.no_grad():
        logp, _ = pols[LEARNER].logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
    assert torch.allclose(logp * mb.loss_mask, mb.old_logp * mb.loss_mask, atol=1e-5)


def test_token_ratio_none_drops_clipping_for_peer_tokens(pols):
    own, peer = batch_of(pols, BAL_L, BAL_P)
    losses = {}
    for mode in ("learner_old", "none"):
        algo, cfg = learner(f"token_ratio={mode}", "delta=0")
        ctx = context(cfg, pols[LEARNER])
        batch = algo.build_batch(ctx, algo.exchange(ctx, own, peer))
        mb = batch.minibatch(range(len(batch)))
        logp = mb.old_logp + math.log(2.0)                 # ratio 2 > 1 + eps_high everywhere
        tok = policy_loss(algo, logp, mb).token_loss
        losses[mode] = (tok, mb)
    (t_clip, mb), (t_free, _) = losses["learner_old"], losses["none"]
    peer_rows, adv = mb.is_peer, mb.advantages.unsqueeze(1)
    pos = (adv > 0).squeeze(1)
    assert torch.allclose(t_free[~peer_rows], t_clip[~peer_rows])                       # own tokens: clipped
    assert torch.allclose(t_clip[peer_rows & pos], (-1.2 * adv.expand_as(t_clip))[peer_rows & pos])  # 1 + eps_high
    assert torch.allclose(t_free[peer_rows], (-2.0 * adv.expand_as(t_free))[peer_rows])  # peer tokens: -rho*A


def test_token_ratio_cross_aligned(pols):
    """T2: old log-probs of grafted tokens = the peer's per-token log-probs mapped by character offsets."""
    lp, pl = pols[LEARNER], pols[PEER]
    p = prompts(1)[0]
    text = "10+20=30"
    ids = pl.encode_text(text)
    peer_lp = [-0.1 * (k + 1) for k in range(len(ids))]
    pg = Group(p, PEER, [rollout(pl, p, text, 1, peer_lp)] + [rollout(pl, p, f"10+20={31 + i}", 0) for i in range(7)],
               advantages=[2.4749] + [-0.35355] * 7)
    pg.rollouts[:] = [dataclasses.replace(r, char_offsets=pl.char_offsets(r.token_ids[:-1], r.text))
                      for r in pg.rollouts]
    own = [group(lp, p, FAIL)] + [group(lp, q, MIXED) for q in prompts(4)[1:]]
    algo, cfg = learner("token_ratio=cross_aligned", "delta=0")
    ctx = context(cfg, lp)
    batch = algo.build_batch(ctx, algo.exchange(ctx, own, {p.id: pg}))
    row = next(r for r in batch.rows if r.is_peer and r.rollout.text == text)
    body = lp.encode_text(text)
    want = align_peer_logprobs(lp.char_offsets(body, text), pg.rollouts[0].char_offsets, peer_lp)
    assert row.old_logp == pytest.approx(want + [-0.1])      # + the peer's EOS log-prob for the learner's EOS
    assert sum(row.old_logp[:-1]) == pytest.approx(sum(peer_lp))   # the peer's mass, spread over learner tokens
    assert len(body) != len(ids)                             # really two tokenizations
    assert row.rollout.logprobs != row.old_logp              # not the learner's theta_old
    # the same run with peer groups from a store (no offsets, no per-token log-probs): a config error
    pg.rollouts[:] = [dataclasses.replace(r, char_offsets=None, origin=Origin(
        model_id=PEER, tokenizer_id="", mean_logp=r.mean_logp, token_count=r.token_count, stored_step=0))
        for r in pg.rollouts]
    with pytest.raises(ConfigError, match="token_ratio"):
        algo.exchange(context(cfg, lp), own, {p.id: pg})
    with pytest.raises(ConfigError, match="token_ratio"):
        learner("token_ratio=cross_aligned", "peer.path=runs/any", peer="stored")


@pytest.mark.parametrize("append", [True, False])
def test_append_eos_if_stopped(pols, append):
    own, peer = batch_of(pols, BAL_L, BAL_P)
    algo, cfg = learner("delta=0", f"xt.append_eos_if_stopped={str(append).lower()}")
    ctx = context(cfg, pols[LEARNER])
    rows = [r for r in algo.build_batch(ctx, algo.exchange(ctx, own, peer)).rows if r.is_peer]
    eos = pols[LEARNER].eos_id
    assert rows and all((r.response_ids[-1] == eos) == append for r in rows)
    assert all(len(r.response_ids) == len(pols[LEARNER].encode_text(r.rollout.text)) + append for r in rows)


@pytest.mark.parametrize("overflow", ["drop", "truncate"])
def test_a_prompt_over_the_limit_is_dropped_not_truncated(pols, monkeypatch, overflow):
    """An edge case (docs/algorithms.md#graft-edge-cases): a grafted response whose prompt, in the learner's
    template, is longer than rollout.max_prompt_tokens is dropped and counted (default xt.overflow=drop); truncate
    (HACPO's code) keeps the prompt's last tokens."""
    own, peer = batch_of(pols, [FAIL, MIXED], [MIXED, MIXED])
    pol = pols[LEARNER]
    full = len(pol.encode_prompt(own[0].prompt))
    algo, cfg = learner("delta=0", f"xt.overflow={overflow}")
    monkeypatch.setattr(pol, "max_prompt_tokens", full)              # at the limit: kept
    ctx = context(cfg, pol)
    g = algo.exchange(ctx, own, peer)[-1]
    assert g.source == "peer" and not any(r.dropped for r in g.rollouts) and ctx.metrics["xt/dropped"] == 0
    monkeypatch.setattr(pol, "max_prompt_tokens", full - 1)          # one token over
    ctx = context(cfg, pol)
    g = algo.exchange(ctx, own, peer)[-1]
    if overflow == "drop":
        assert all(r.dropped == "prompt_overflow" for r in g.rollouts)
        assert ctx.metrics["xt/dropped"] == ctx.metrics["xt/dropped_prompt_overflow"] == 8
        assert ctx.metrics["peer/admitted"] == 0 and g.weights == [0.0] * 8
        assert not [r for r in algo.build_batch(ctx, [g]).rows if r.is_peer]   # out of the loss
    else:
        assert not any(r.dropped for r in g.rollouts) and ctx.metrics["xt/dropped_prompt_overflow"] == 0
        assert all(r.prompt_token_ids == pol.encode_prompt(own[0].prompt)[-(full - 1):] for r in g.rollouts)


# ------------------------------------------------------------------------------------------------
# end to end: a heterogeneous pair co-trained through the CLI
# ------------------------------------------------------------------------------------------------

def test_cli_cotrains_a_heterogeneous_pair(tmp_path):
    from click.testing import CliRunner

    from graftzoo.apps.cli import main
    (tmp_path / "strong.yaml").write_text(STRONG_PAIR)
    res = CliRunner().invoke(main, ["train", "--algo", "graft", "--pair", "micro", "-c", str(tmp_path / "strong.yaml"),
                                    "--peer", "online", "--no-track", "--set", f"run.out_dir={tmp_path}",
                                    "--set", "run.steps=2", "--set", "run.name=live"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (tmp_path / "live" / "metrics.jsonl").read_text().splitlines()]
    assert {r["model"] for r in recs} == {LEARNER, PEER} and len(recs) == 4
    for r in recs:
        for k in ("peer/rescued_groups", "peer/admitted", "peer/rejected", "peer/mixed_on_all_fail_frac"):
            assert k in r
        # no cap: every learner all-fail prompt with a mixed peer group is replaced
        assert r["peer/rescued_groups"] == round((r["peer/mixed_on_all_fail_frac"] or 0) * r["peer/all_fail_count"])
        if r["peer/admitted"] + r["peer/rejected"]:
            assert r["peer/s_min"] <= r["peer/s_median"] <= r["peer/s_max"]
        if r["peer/admitted"]:
            assert r["tokens/peer_share"] > 0
    assert sum(r["peer/rescued_groups"] for r in recs) > 0
    assert any(r["peer/admitted"] for r in recs)
