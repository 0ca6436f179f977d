"""HACPO learner (docs/algorithms.md#hacpo): the worked example through the learner, every switch, state,
and the micro pair (two tokenizers) co-trained end to end through the CLI."""
import copy
import json
import math
import random

import pytest
from helpers import policy_loss, scored_rollout
import torch
from click.testing import CliRunner

from graftzoo.algos.base import StepContext
from graftzoo.algos.functional import sequence_mean_logp, sequence_terms_as_tokens
from graftzoo.contract.batch import TrainBatch
from graftzoo.algos.hacpo import HACPOConfig
from graftzoo.algos.hacpo.learner import HACPO, cross_lower
from graftzoo.contract.config import ConfigError, LearnerFacts, load_config
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.planner.build import build_policy
from graftzoo.contract.types import Group, Prompt, TrainRow

torch.set_num_threads(1)
QWEN, GPT2 = "micro-qwen-char", "micro-gpt2-pair"


@pytest.fixture(scope="module")
def pols():
    cfg = load_config(pair="micro", algo="hacpo", overrides=["peer.source=online", "run.track=false"])
    return {s.id: build_policy(s, cfg) for s in cfg.pair.models}


def run_cfg(*overrides):
    return load_config(pair="micro", algo="hacpo",
                       overrides=["peer.source=online", "run.track=false", "algo.beta_kl=0", *overrides])


rollout = scored_rollout


def group(pol, prompt, texts, correct):
    return Group(prompt, pol.model_id, [rollout(pol, prompt, t, c) for t, c in zip(texts, correct)])


def make(cfg, pol, history=None, ref=None):
    assert isinstance(cfg.algo, HACPOConfig)
    learner = HACPO(cfg.algo, LearnerFacts.of(cfg))
    if history:
        learner.load_state_dict({"history": history})
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=pol, engine=None, env=None,
                      rng=random.Random(0), ref_policy=ref)
    return learner, ctx


P = Prompt("p0", "2+3", gold="5")


def worked_example(pols, cfg):
    """The worked example (docs/algorithms.md#hacpo-capability-aware-advantage): learner rewards [0, 0], peer
    rewards [1, 0], P^_L = 0.2, P^_P = 0.5 (current step included)."""
    learner, ctx = make(cfg, pols[QWEN], history={"self": [0.4], "peer": [0.5]})
    own = group(pols[QWEN], P, ["2+3=4", "2+3=6"], [False, False])
    peer = group(pols[GPT2], P, ["2+3=5", "2+3=7"], [True, False])
    return learner, ctx, learner.exchange(ctx, [own], {P.id: peer})


def grads(loss, model):
    gs = torch.autograd.grad(loss, [p for p in model.parameters()], allow_unused=True)
    return torch.cat([torch.zeros_like(p).flatten() if g is None else g.flatten()
                      for g, p in zip(gs, model.parameters())])


def test_worked_example_through_the_learner(pols):
    cfg = run_cfg("optim.minibatches=2")
    learner, ctx, slots = worked_example(pols, cfg)
    pol = pols[QWEN]
    assert learner.capabilities() == pytest.approx((0.2, 0.5))
    assert ctx.metrics["hacpo/omega"] == pytest.approx(2.5)
    # self first, cross last; the cross samples are re-tokenized into the learner's tokenizer
    assert [g.source for g in slots] == ["own", "peer"]
    cross = slots[1].rollouts
    assert cross[0].token_ids == pol.encode_text("2+3=5") + [pol.eos_id]
    assert cross[0].loss_mask[-1] == 0.0 and sum(cross[0].loss_mask) == len(cross[0].token_ids) - 1
    # A = [-0.2, -0.2 | 1.8, -0.2]; cross advantages times omega^(P,L) = 2.5
    assert slots[0].advantages == pytest.approx([-0.2, -0.2], rel=1e-5)
    assert slots[1].advantages == pytest.approx([4.5, -0.5], rel=1e-5)
    assert ctx.metrics["peer/admitted"] == 2 and ctx.metrics["peer/rescued_groups"] == 1

    batch = learner.build_batch(ctx, slots)
    mbs = learner.schedule(ctx, batch)
    assert [[batch.rows[i].is_peer for i in mb] for mb in mbs] == [[False, False], [True, True]]
    lows = []
    for u, mb in enumerate(mbs):  # updates u = 0 and 1: floors 0.8 and 0.825
        ctx.update = u
        lows.append(micro_batch_loss(ctx, pol, learner, batch.minibatch(mb))[1]["hacpo/cross_lower"])
    assert lows == pytest.approx([0.8, 0.825]) and cross_lower(learner.cfg, 2) == pytest.approx(0.85)

    success = [i for i in mbs[1] if batch.rows[i].rollout.correct]
    mb = batch.minibatch(success)
    ell_old = cross[0].mean_logp  # l_L(theta_old), EOS excluded
    logp, _ = pol.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
    ell = sequence_mean_logp(logp, mb.loss_mask).detach()
    assert float(ell) == pytest.approx(ell_old, abs=1e-5)

    def loss_at_u2():
        ctx.update = 2
        mb = learner.build_batch(ctx, slots).minibatch(success)  # the peer's l_P is sequence-level row data
        return micro_batch_loss(ctx, pol, learner, mb)

    cross[0].origin.mean_logp = ell_old - math.log(0.9)  # s = 0.9 at theta_old
    loss, met = loss_at_u2()
    assert float(loss.detach()) == pytest.approx(-0.9 * 0.9 * 2.5 * 1.8, rel=1e-4)  # objective 3.645
    assert met["hacpo/cross_lower"] == pytest.approx(0.85)
    g_loss = grads(loss_at_u2()[0], pol.model)
    g_ell = grads(sequence_mean_logp(pol.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)[0],
                                     mb.loss_mask).sum(), pol.model)
    assert torch.allclose(g_loss, -(0.9 ** 2) * 2.5 * 1.8 * g_ell, rtol=1e-3, atol=1e-6)

    cross[0].origin.mean_logp = ell_old - math.log(0.8)  # s = 0.8 < 0.85: a constant
    loss, met = loss_at_u2()
    assert float(loss.detach()) == pytest.approx(-0.85 * 0.85 * 4.5, rel=1e-4)
    assert met["clip/frac_peer"] == 1.0
    assert float(grads(loss_at_u2()[0], pol.model).abs().max()) == 0.0


def cross_minibatch(s_values, adv):
    """Cross rows with sequence ratio s at logp = 0 (origin l_P = -log s), for the policy loss alone."""
    rows = []
    for i, (s, a) in enumerate(zip(s_values, adv)):
        rows.append(TrainRow([1], [5, 6], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0], a, 1.0, "peer", i, -math.log(s)))
    return TrainBatch(rows, []).minibatch(range(len(rows)))


def cross_values(cfg_overrides, u, s_values, adv):
    cfg = run_cfg(*cfg_overrides)
    learner = HACPO(cfg.algo, LearnerFacts.of(cfg))
    mb = cross_minibatch(s_values, adv)
    logp = torch.zeros(len(s_values), 2, requires_grad=True)
    pg = policy_loss(learner, logp, mb, update=u)
    tok = sequence_terms_as_tokens(pg.token_loss, pg.seq_loss, pg.seq_rows)
    tok[:, 0].sum().backward()
    return tok[:, 0].detach(), logp.grad.abs().sum(1)


def test_cross_clip_switches_gate_the_gradient():
    # u = 0: floor = cross_clip_lower
    _, g = cross_values([], 0, [0.82, 1.2], [1.0, 1.0])
    assert g[0] > 0 and g[1] == 0  # above 1: clipped, no gradient
    _, g = cross_values(["algo.cross_clip_lower=0.85"], 0, [0.82], [1.0])
    assert g[0] == 0
    # u = 1: floor rises by cross_clip_step
    _, g = cross_values([], 1, [0.82], [1.0])
    assert g[0] == 0
    _, g = cross_values(["algo.cross_clip_step=0"], 1, [0.82], [1.0])
    assert g[0] > 0
    # the hard clip gates both signs of A (no PPO min)
    _, g = cross_values([], 0, [0.7], [-1.0])
    assert g[0] == 0


def test_alpha_is_the_exponential_is_power():
    v1, _ = cross_values([], 0, [0.9], [2.0])
    v3, _ = cross_values(["algo.alpha=3"], 0, [0.9], [2.0])
    assert float(v1) == pytest.approx(-2.0 * 0.9 ** 2, rel=1e-5)
    assert float(v3) == pytest.approx(-2.0 * 0.9 ** 4, rel=1e-5)


def test_self_clip_sets_the_gspo_clip_of_self_samples():
    cfg = run_cfg("algo.self_clip=[0.1,0.2]")
    assert cfg.algo.seq_clip == [0.1, 0.2]
    with pytest.raises(ConfigError, match="self_clip"):
        run_cfg("algo.seq_clip=[0.2, 0.2]")
    with pytest.raises(ConfigError, match="capability-aware"):
        run_cfg("algo.estimator=rloo")

    def self_loss(*ov):
        cfg = run_cfg(*ov, "algo.ratio_form=sequence")
        learner = HACPO(cfg.algo, LearnerFacts.of(cfg))
        mb = cross_minibatch([1.0], [1.0])
        mb.role[:] = 0  # a self (own) row
        pg = policy_loss(learner, torch.full((1, 2), math.log(1.05)), mb, update=0)  # s = 1.05
        return float(pg.token_loss[0, 0]), bool(pg.clipped_high.all())

    assert self_loss() == (pytest.approx(-1.0004), True)
    assert self_loss("algo.self_clip=[0.1,0.2]") == (pytest.approx(-1.05), False)


def test_guards_and_ratio_clamp_switches(pols):
    q, g2 = pols[QWEN], pols[GPT2]

    def advantages(own_c, peer_c, history, *ov):
        learner, ctx = make(run_cfg(*ov), q, history=history)
        own = group(q, P, ["2+3=5" if c else "2+3=4" for c in own_c], own_c)
        peer = group(g2, P, ["2+3=5" if c else "2+3=9" for c in peer_c], peer_c)
        slots = learner.exchange(ctx, [own], {P.id: peer})
        return slots[0].advantages + slots[1].advantages, ctx.metrics["hacpo/omega"]

    # everyone succeeds and omega != 1: the uniform-reward guard gives A = 0
    weak = {"self": [0.2, 0.2, 0.2, 0.2], "peer": [0.5, 0.5, 0.5, 0.5]}
    a, _ = advantages([True, True], [True, True], weak)
    assert a == [0.0] * 4
    a, _ = advantages([True, True], [True, True], weak, "algo.uniform_reward_guard=false")
    assert min(abs(x) for x in a) > 1e3
    # the learner is much stronger: mu^ > 1, the binary-baseline guard falls back to the own mean 0.5
    strong = {"self": [1.0, 1.0, 1.0, 1.0], "peer": [0.0, 0.0, 0.0, 0.0]}
    a, omega = advantages([True, False], [True, False], strong)  # P^ = (0.9, 0.1): omega^(P,L) = 1/9
    assert omega == pytest.approx(1 / 9)
    sd = math.sqrt(1 / 3)
    assert a == pytest.approx([0.5 / sd, -0.5 / sd, 0.5 / sd / 9, -0.5 / sd / 9], rel=1e-5)
    a, _ = advantages([True, False], [True, False], strong, "algo.binary_baseline_guard=false")
    mu = (1 + 0 + 9 * 1 + 9 * 0) / 4
    assert a == pytest.approx([(1 - mu) / sd, -mu / sd, (1 - mu) / sd / 9, -mu / sd / 9], rel=1e-5)
    # ratio clamp: P^ = (1e-8, 0.5) -> ratio 5e7 clamped to 10 (default) or 100
    never = {"self": [0.0] * 4, "peer": [0.5] * 4}
    assert advantages([False, False], [True, False], never)[1] == 10.0
    assert advantages([False, False], [True, False], never, "algo.ratio_clamp=[0.01,100]")[1] == 100.0


def test_kl_on_cross(pols):
    pol = pols[QWEN]
    ref = copy.copy(pol)
    ref.model = copy.deepcopy(pol.model)
    with torch.no_grad():
        for p in ref.model.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def kl(flag):
        cfg = run_cfg("algo.beta_kl=0.01", f"algo.kl_on_cross={str(flag).lower()}")
        learner, ctx, slots = worked_example(pols, cfg)
        ctx.ref_policy = ref
        batch = learner.build_batch(ctx, slots)
        cross = [i for i, r in enumerate(batch.rows) if r.is_peer]
        assert all(sum(batch.rows[i].kl_mask) == (sum(batch.rows[i].loss_mask) if flag else 0) for i in cross)
        return micro_batch_loss(ctx, pol, learner, batch.minibatch(cross))[1]["kl"]

    assert kl(False) == 0.0
    assert kl(True) > 1e-4


def test_capability_state_window_and_checkpoint_roundtrip(pols):
    learner, ctx = make(run_cfg("algo.capability_window=2"), pols[QWEN])
    own = group(pols[QWEN], P, ["2+3=5", "2+3=4"], [True, False])
    peer = group(pols[GPT2], P, ["2+3=9", "2+3=9"], [False, False])
    for _ in range(3):
        learner.exchange(ctx, [own], {P.id: peer})
    assert learner.state_dict() == {"history": {"self": [0.5, 0.5], "peer": [0.0, 0.0]}}
    fresh, _ = make(run_cfg("algo.capability_window=2"), pols[QWEN])
    fresh.load_state_dict(learner.state_dict())
    assert fresh.capabilities() == (0.5, 1e-8)


def test_select_graft_which_pools_only_grafts_prompts(pols):
    """"HACPO + GRAFT which" (GRAFT Table 8): HACPO's update on GRAFT's prompts only (learner all-fail, peer
    mixed); default select=all pools every peer group (HACPO as published). The capabilities see every group."""
    q, g2 = pols[QWEN], pols[GPT2]
    ps = [Prompt(f"p{i}", f"{i}+3", gold=str(i + 3)) for i in range(4)]
    # p0: learner all-fail, peer mixed (GRAFT's candidate); p1: both all-fail; p2: both mixed; p3: peer all-success
    lc = [[False, False], [False, False], [True, False], [False, False]]
    pc = [[True, False], [False, False], [True, False], [True, True]]

    def texts(p, cs):
        a = int(p.text.split("+")[0])
        return [f"{p.text}={a + 3 if c else a + 4 + j}" for j, c in enumerate(cs)]

    own = [group(q, p, texts(p, c), c) for p, c in zip(ps, lc)]
    peer = {p.id: group(g2, p, texts(p, c), c) for p, c in zip(ps, pc)}
    out = {}
    for select in ("all", "graft_which"):
        learner, ctx = make(run_cfg(f"algo.select={select}"), q)
        slots = learner.exchange(ctx, own, peer)
        out[select] = [g.prompt.id for g in slots if g.source == "peer"]
        assert learner.history["peer"] == [pytest.approx(4 / 8)]            # every peer group counts
        assert [g.prompt.id for g in slots if g.source == "own"] == ["p0", "p1", "p2", "p3"]
        assert ctx.metrics["xt/responses"] == 2 * len(out[select])
    assert out == {"all": ["p0", "p1", "p2", "p3"], "graft_which": ["p0"]}
    with pytest.raises(ConfigError, match="algo.select"):
        run_cfg("algo.select=graft")


def test_needs_a_peer_source(pols):
    with pytest.raises(ConfigError, match="needs a peer source.*--peer online"):  # at load (needs_peer)
        load_config(pair="micro", algo="hacpo", overrides=["run.track=false"])
    learner, ctx = make(run_cfg(), pols[QWEN])
    with pytest.raises(ConfigError, match="needs a peer source"):
        learner.exchange(ctx, [group(pols[QWEN], P, ["2+3=5"], [True])], None)


def test_cotrain_micro_pair_end_to_end(tmp_path):
    """Two models, two tokenizers, online exchange, through the CLI; then a resume restores the capability state."""
    from graftzoo.apps.cli import main
    n, prompts = 8, 8
    args = ["train", "--algo", "hacpo", "--pair", "micro", "--peer", "online", "--no-track",
            "--run-dir", str(tmp_path), "--set", "run.eval_at_end=false", "--set", "run.progress=false",
            "--set", "task.difficulty=1", "--set", f"rollout.n={n}", "--set", f"task.prompts_per_step={prompts}",
            "--set", "optim.minibatches=2"]
    res = CliRunner().invoke(main, args + ["--set", "run.steps=2"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {(r["step"], r["model"]) for r in recs} == {(s, m) for s in (0, 1) for m in (QWEN, GPT2)}
    acc = {(r["step"], r["model"]): r["reward/acc"] for r in recs}
    for r in recs:
        other = GPT2 if r["model"] == QWEN else QWEN
        # every peer response is pooled (own + cross = 2G per prompt), cross samples re-tokenized
        assert r["peer/admitted"] + r["peer/rejected"] == n * prompts == r["xt/responses"]
        assert r["peer/admitted"] > 0 and 0 < r["tokens/peer_share"] < 1
        assert r["xt/token_count_ratio"] != pytest.approx(1.0, abs=0.05)
        assert r["hacpo/cross_lower"] == pytest.approx(0.8 + 0.025 / 2)  # mean over updates u = 0, 1
        # rescued = own all-fail prompts where the peer had a success
        assert r["peer/rescued_groups"] == round(r["peer/solved_all_fail_frac"] * r["peer/all_fail_count"])
        hist_self = [acc[(s, r["model"])] for s in range(r["step"] + 1)]
        hist_peer = [acc[(s, other)] for s in range(r["step"] + 1)]
        assert r["hacpo/capability_self"] == pytest.approx(max(1e-8, sum(hist_self) / len(hist_self)))
        assert r["hacpo/capability_peer"] == pytest.approx(max(1e-8, sum(hist_peer) / len(hist_peer)))
    assert sum(r["peer/rescued_groups"] for r in recs) > 0, "no peer success on an all-fail prompt: the exchange " \
        "never mattered; pick a task setting where the micro models sometimes succeed"

    res = CliRunner().invoke(main, args + ["--set", "run.steps=3"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    acc.update({(r["step"], r["model"]): r["reward/acc"] for r in recs})
    state = torch.load(tmp_path / "checkpoints" / "step_000002" / f"{QWEN}.pt", weights_only=True)["learner"]
    assert state["history"]["self"] == pytest.approx([acc[(s, QWEN)] for s in range(3)])
    assert state["history"]["peer"] == pytest.approx([acc[(s, GPT2)] for s in range(3)])
