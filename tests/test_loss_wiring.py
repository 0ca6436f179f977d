"""Mechanisms pinned to the loss (wiring that no other test pins): each test drives a learner's
real hooks (collect / advantages / exchange / build_batch / schedule) and the step's loss (``micro_batch_loss``) as
the step does, with the micro models, and fails when its mechanism is disconnected:

1. GRAFT's grafted sequence weights ``min{s, 1}`` scale the loss and the gradient of the grafted rows;
2. DAPO's dynamic sampling decides which groups reach the loss;
3. DAPO's overlong shaping changes the rewards that reach the advantages;
4. Dr.GRPO's constant normaliser ``N * L_max`` sets the loss value;
5. a peer's advantages are reused as they are (a stored peer with planted advantages that no learner-side
   recomputation gives), and ``renorm_adv_after_gate`` replaces them.
"""
from dataclasses import replace
import math
import random

import pytest
import torch
from helpers import Spy, loss_and_grads, scored_rollout

from graftzoo.algos.base import StepContext
from graftzoo.algos.functional import group_advantages
from graftzoo.contract.config import LearnerFacts, load_config
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.planner.build import build_policy
from graftzoo.contract.registry import get_algo
from graftzoo.contract.types import Group, Prompt
from graftzoo.peers import StoredPeer, TrajectoryStore

torch.set_num_threads(1)
LEARNER, PEER = "micro-qwen-char", "micro-gpt2-pair"
PROMPTS = [Prompt(id=f"p{i}", text=f"{10 + i}+{20 + i}", gold=str(30 + 2 * i)) for i in range(4)]


@pytest.fixture(scope="module")
def pols():
    cfg = load_config(pair="micro", algo="grpo")
    return {s.id: build_policy(s, cfg) for s in cfg.pair.models}


def make(algo, *overrides):
    """(learner, run config) as the trainer builds them."""
    cfg = load_config(pair="micro", algo=algo, overrides=["run.track=false", *overrides])
    return get_algo(algo)(cfg.algo, LearnerFacts.of(cfg)), cfg


def context(cfg, pol, **kw):
    return StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=pol, rng=random.Random(0),
                       **{"engine": None, "env": None, **kw})


def answers(prompt, correct, pad=""):
    """Distinct response texts of different lengths: the right sum for a correct one, else a wrong one."""
    a, b = (int(v) for v in prompt.text.split("+"))
    return [f"{a}+{b}{pad * i}={a + b if c else a + b + 1 + i}" for i, c in enumerate(correct)]


def group(pol, prompt, correct, advantages=None):
    """Responses of ``pol`` with their real theta_old log-probs (so the first ratio is 1)."""
    rolls = [scored_rollout(pol, prompt, t, c) for t, c in zip(answers(prompt, correct, pad=" "), correct)]
    return Group(prompt, pol.model_id, rolls, advantages)


def grpo_adv(correct):
    r = torch.tensor([float(c) for c in correct], dtype=torch.float64)
    return group_advantages(r, torch.zeros(len(r), dtype=torch.long)).tolist()


MIXED = [1, 0, 1, 0, 0, 0, 1, 0]
FAIL = [0] * 8


def minibatches(learner, ctx, slots):
    """build_batch -> schedule -> MiniBatches, as the trainer's step does."""
    batch = learner.build_batch(ctx, slots)
    return [batch.minibatch(idx) for idx in learner.schedule(ctx, batch)]


# ------------------------------------------------------------------------------------------------
# 1. GRAFT's grafted sequence weights min{s, 1}
# ------------------------------------------------------------------------------------------------

def test_grafted_weight_scales_the_loss_and_gradient_of_its_rows(pols):
    """Every grafted response gets s = exp(l_L - l_P) = e^-0.1 (its peer l_P planted 0.1 above the learner's
    theta_old l_L): admitted by the gate (delta 0.8) with w = min(s, 1) = 0.905. Against the same rows with
    w = 1 (``weight=one``), the grafted minibatch's loss and gradients are exactly w times as large."""
    lpol, ppol = pols[LEARNER], pols[PEER]
    own = [group(lpol, p, FAIL if i == 0 else MIXED, grpo_adv(FAIL if i == 0 else MIXED))
           for i, p in enumerate(PROMPTS)]
    out = {}
    for weight in ("min_s_1", "one"):
        learner, cfg = make("graft", "peer.source=online", "optim.minibatches=4", "algo.delta=0.8",
                            f"algo.weight={weight}", "algo.token_ratio=learner_old", "algo.peer_position=last")
        ctx = context(cfg, lpol)
        peer = group(ppol, PROMPTS[0], MIXED, grpo_adv(MIXED))
        ell_l = [r.mean_logp for r in ctx.localize([peer])[0].rollouts]   # the learner's theta_old l_L
        peer.rollouts[:] = [replace(r, logprobs=[ell + 0.1] * (len(r.token_ids) - 1) + [r.logprobs[-1]])
                            for r, ell in zip(peer.rollouts, ell_l)]  # plant l_P = l_L + 0.1 (EOS excluded)
        slots = learner.exchange(ctx, own, {PROMPTS[0].id: peer})
        grafted = [g for g in slots if g.source == "peer"]
        assert len(grafted) == 1 and grafted[0].prompt.id == "p0"
        mbs = minibatches(learner, ctx, slots)
        mb = mbs[-1]                                       # peer-last: the grafted group's minibatch
        assert bool(mb.is_peer.all()) and len(mb) == 8
        out[weight] = (grafted[0].weights, *loss_and_grads(learner, ctx, lpol, mb)[:3], mb)
    w_s, loss_s, glogp_s, gpar_s, mb = out["min_s_1"]
    w_1, loss_1, glogp_1, gpar_1, _ = out["one"]
    w = math.exp(-0.1)
    assert w_s == pytest.approx([w] * 8, abs=1e-5) and w_1 == [1.0] * 8
    assert mb.weights.tolist() == pytest.approx([w] * 8, abs=1e-5)   # the weights reached the minibatch
    assert abs(float(loss_1)) > 1e-3 and float(gpar_1.norm()) > 1e-3   # a real policy-gradient term
    assert float(loss_s) == pytest.approx(w * float(loss_1), rel=1e-4)
    assert torch.allclose(glogp_s, w * glogp_1, rtol=1e-4, atol=1e-9)
    assert torch.allclose(gpar_s, w * gpar_1, rtol=1e-3, atol=1e-6 * float(gpar_1.abs().max()))  # float32 rounding


# ------------------------------------------------------------------------------------------------
# 2. and 3. DAPO: dynamic sampling, overlong shaping
# ------------------------------------------------------------------------------------------------

class PlantedEngine:
    """An engine whose groups have planted correctness per prompt id (real token ids and theta_old log-probs)."""

    def __init__(self, pol, outcomes):
        self.pol, self.outcomes, self.max_new_tokens = pol, outcomes, 40

    def generate(self, prompts, n, prefixes=None, **_):
        return [group(self.pol, p, self.outcomes[p.id]) for p in prompts]


class ScoredAlready:
    def score_groups(self, groups):
        return groups


class Refills:
    """``ctx.more_prompts``: the refill prompts x0, x1, ..."""

    def __init__(self):
        self.drawn = 0

    def extra(self, step, k):
        out = [Prompt(id=f"x{self.drawn + i}", text=f"{40 + self.drawn + i}+1", gold="0") for i in range(k)]
        self.drawn += k
        return out


@pytest.mark.parametrize("dynamic", [True, False])
def test_dapo_dynamic_sampling_decides_which_groups_reach_the_loss(pols, dynamic):
    """p0's group has no reward contrast (all wrong); p1's is mixed. With dynamic sampling p0 is dropped and a
    refill (x0, mixed) takes its place in the loss; without it p0's rows reach the loss."""
    pol = pols[LEARNER]
    learner, cfg = make("dapo", "rollout.n=4", f"algo.dynamic_sampling={str(dynamic).lower()}",
                        "algo.overlong_cache_len=0")
    outcomes = {"p0": [0, 0, 0, 0], "p1": [1, 0, 1, 0], "x0": [0, 1, 0, 0], "x1": [0, 0, 1, 1]}
    ctx = context(cfg, pol, engine=PlantedEngine(pol, outcomes), env=ScoredAlready(), sampler=Refills())
    groups = learner.advantages(ctx, learner.collect(ctx, PROMPTS[:2]))
    mbs = minibatches(learner, ctx, learner.exchange(ctx, groups, None))
    reached = sorted({row.rollout.prompt_id for mb in mbs for row in mb.rows})
    assert reached == (["p1", "x0"] if dynamic else ["p0", "p1"])
    loss, _ = micro_batch_loss(ctx, pol, learner, mbs[0])
    assert torch.isfinite(loss)


def test_dapo_overlong_shaping_changes_the_advantages_that_reach_the_loss(pols):
    """Four correct responses, one 36 tokens long: in DAPO's soft buffer (L_max 40, cache 8 -> penalty
    (32 - 36) / 8 = -0.5). Shaped, its advantage is negative and the others' positive; unshaped they are 0."""
    pol = pols[LEARNER]
    p = PROMPTS[0]
    texts = ["10+20=30", "10+20=30 ", "10+20=30  ", "10+20=" + " " * 27 + "30"]
    rolls = [scored_rollout(pol, p, t, True) for t in texts]
    assert [len(r.token_ids) for r in rolls] == [9, 10, 11, 35 + 1]
    adv = {}
    for cache in (8, 0):
        learner, cfg = make("dapo", "rollout.n=4", "rollout.max_new_tokens=40", f"algo.overlong_cache_len={cache}")
        ctx = context(cfg, pol)
        assert ctx.max_response == 40
        groups = learner.advantages(ctx, [Group(p, pol.model_id, list(rolls))])
        mbs = minibatches(learner, ctx, learner.exchange(ctx, groups, None))
        adv[cache] = [row.advantage for mb in mbs for row in mb.rows]
    assert adv[0] == [0.0] * 4
    shaped = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.5], dtype=torch.float64),
                              torch.zeros(4, dtype=torch.long)).tolist()
    assert adv[8] == pytest.approx(shaped) and adv[8][3] < 0 < adv[8][0]


# ------------------------------------------------------------------------------------------------
# 4. Dr.GRPO's N * L_max normaliser
# ------------------------------------------------------------------------------------------------

def test_dr_grpo_loss_is_the_token_sum_over_n_times_l_max(pols):
    pol = pols[LEARNER]
    learner, cfg = make("dr_grpo", "rollout.n=4", "rollout.max_new_tokens=40")
    ctx = context(cfg, pol)
    groups = learner.advantages(ctx, [group(pol, PROMPTS[0], [1, 0, 1, 0]), group(pol, PROMPTS[1], [0, 1, 0, 0])])
    assert groups[0].advantages == pytest.approx([0.5, -0.5, 0.5, -0.5])   # Dr.GRPO: no std scaling
    mbs = minibatches(learner, ctx, learner.exchange(ctx, groups, None))
    assert len(mbs) == 1
    mb = mbs[0]
    spy = Spy(pol)
    loss, _ = micro_batch_loss(ctx, spy, learner, mb)
    loss = loss.detach()
    ratio = torch.exp(spy.logp.detach() - mb.old_logp)
    assert float(((ratio - 1).abs() * mb.loss_mask).max()) < 1e-3          # theta_old: nothing clipped
    tokens = (-mb.advantages.unsqueeze(1) * ratio * mb.loss_mask).sum()
    n, width = len(mb), mb.resp_len
    assert float(loss) == pytest.approx(float(tokens) / (n * 40), rel=1e-5)  # sum / (N * L_max)
    for other in (mb.loss_mask.sum(), n * width):                        # token mean; N * padded width
        assert float(loss) != pytest.approx(float(tokens) / float(other), rel=1e-2)


# ------------------------------------------------------------------------------------------------
# 5. the peer's advantages are reused (a stored peer with planted advantages)
# ------------------------------------------------------------------------------------------------

PLANTED = [0.9, 0.4, -0.2, -0.6, -0.1, -0.15, 0.05, -0.3]   # no group estimator of MIXED gives these


@pytest.mark.parametrize("renorm", [False, True])
def test_grafted_rows_carry_the_stored_peers_advantages(pols, tmp_path, renorm):
    lpol, ppol = pols[LEARNER], pols[PEER]
    assert PLANTED != pytest.approx(grpo_adv(MIXED), abs=1e-3)
    TrajectoryStore(tmp_path / "store", dataset="arithmetic").write(
        0, 0, [group(ppol, PROMPTS[0], MIXED, PLANTED)], tokenizer_id=ppol.tokenizer_id)
    peer = StoredPeer(tmp_path / "store", model=PEER).groups(PROMPTS, 0, 0, LEARNER)
    assert list(peer) == ["p0"] and peer["p0"].advantages == PLANTED   # read back from Parquet as written
    learner, cfg = make("graft", "peer.source=stored", f"peer.path={tmp_path / 'store'}", "optim.minibatches=4",
                        "algo.delta=0.0", f"algo.renorm_adv_after_gate={str(renorm).lower()}",
                        "algo.token_ratio=learner_old", "algo.peer_position=last")
    ctx = context(cfg, lpol)
    own = [group(lpol, p, FAIL if i == 0 else MIXED, grpo_adv(FAIL if i == 0 else MIXED))
           for i, p in enumerate(PROMPTS)]
    slots = learner.exchange(ctx, own, peer)
    mbs = minibatches(learner, ctx, slots)
    rows = [row for mb in mbs for row in mb.rows if row.role == "peer"]
    assert len(rows) == 8                                               # delta 0: every grafted row admitted
    got = [row.advantage for row in rows]
    in_loss = torch.cat([mb.advantages[mb.is_peer] for mb in mbs]).tolist()
    assert in_loss == pytest.approx(got, abs=1e-6)                     # the tensors the loss reads
    if renorm:  # recomputed over the admitted responses: GRPO of their rewards, not the planted values
        assert got == pytest.approx(grpo_adv(MIXED)) and got != pytest.approx(PLANTED, abs=1e-3)
    else:
        assert got == PLANTED


# 6. the advantage estimator a learner names decides the advantages that reach the batch
def test_the_estimator_a_learner_names_gives_the_advantages_rloo_a_plugin_and_an_unknown_name(pols):
    from graftzoo import AdvantageInputs, Learner, register_estimator
    from graftzoo.algos.advantages import ESTIMATORS
    pol = pols[LEARNER]
    groups = [group(pol, PROMPTS[0], [True, False, False, False]), group(pol, PROMPTS[1], [True, True, False, False])]
    learner, cfg = make("grpo", "algo.estimator=rloo")
    out = learner.advantages(context(cfg, pol), groups)
    # RLOO on [1, 0, 0, 0]: 1 - 0 = 1, 0 - 1/3 = -1/3 (docs/algorithms.md#rloo); the input groups are left as they were
    assert out[0].advantages == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert out[1].advantages == pytest.approx([2 / 3, 2 / 3, -2 / 3, -2 / 3])
    assert groups[0].advantages is None and out[0].rollouts == groups[0].rollouts

    @register_estimator("test_signs")
    def signs(x: AdvantageInputs, cfg) -> torch.Tensor:
        """+1 for a correct response, -1 for a wrong one, scaled by the group's number of responses."""
        n = torch.bincount(x.index).to(torch.float64)[x.index]
        return torch.where(x.correct, 1.0, -1.0).to(torch.float64) / n

    try:
        class Signs(Learner):
            estimator = "test_signs"
        grpo, cfg = make("grpo")
        plugin = Signs(grpo.cfg, grpo.run)
        batch = plugin.build_batch(context(cfg, pol), plugin.advantages(context(cfg, pol), groups))
        assert [r.advantage for r in batch.rows] == [0.25, -0.25, -0.25, -0.25, 0.25, 0.25, -0.25, -0.25]
        with pytest.raises(ValueError, match="test_signs.*already registered"):
            register_estimator("test_signs")(lambda x, c: x.rewards)

        class Unknown(Learner):
            estimator = "no_such_estimator"
        with pytest.raises(KeyError, match="no_such_estimator.*registered: .*'grpo'.*'rloo'"):
            Unknown(grpo.cfg, grpo.run).advantages(context(cfg, pol), groups)
    finally:
        ESTIMATORS.pop("test_signs", None)
