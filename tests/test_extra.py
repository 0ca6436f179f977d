"""ExTra learner (docs/algorithms.md#extra): novelty bonus, prefix mining and regeneration with the micro
policy, prefix tokens out of the loss, embedders, state, and an end-to-end CLI run."""
from dataclasses import replace
import copy
import json
import sys

import pytest
from helpers import Spy, one_run
import torch
from click.testing import CliRunner

from graftzoo.algos.base import StepContext
from graftzoo.algos.extra import ExTraConfig
from graftzoo.algos.extra.learner import ExTra
from graftzoo.algos.extra.formulas import (most_confident_rollout, prefix_cut_points, prefix_entropy_scores,
                                           select_prefix)
from graftzoo.contract.config import ConfigError, LearnerFacts, load_config
from graftzoo.algos.extra.embedders import HashedNgramEmbedder, make_embedder
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.planner.build import build_engine, build_policy
from graftzoo.envs.task import Task
from graftzoo.contract.types import Group, Prompt, Rollout

# the micro models' scratchpads have no newlines: these tests cut after '=' / '+' (algo.fallback_cut_chars;
# the default "" makes no cut without a newline, docs/algorithms.md#extra-prefix-regeneration)
OVERRIDES = ["pair.train=[micro-qwen-char]", "algo.regen_warmup_steps=0", "algo.prefix_min_gap=3",
             "algo.regen_batch_size=1", "eval.size=2", "algo.fallback_cut_chars==+"]


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(pair="micro", algo="extra", overrides=OVERRIDES)
    spec = next(s for s in cfg.pair.models if s.id == "micro-qwen-char")
    policy = build_policy(spec, cfg, seed=0)
    return cfg, policy, build_engine(policy, cfg), Task(cfg).train_env


def learner_for(cfg, **algo):
    keys = cfg.algo.model_dump(exclude={"name"})
    keys.update(algo)
    return ExTra(ExTraConfig(**keys), LearnerFacts.of(cfg))


def context(setup, step=0):
    cfg, policy, engine, env = setup
    return StepContext(step=step, epoch=0, run=LearnerFacts.of(cfg), policy=policy, engine=engine, env=env)


def rollout(policy, prompt, text, correct, reward=None):
    ids = policy.encode_text(text) + [policy.eos_id]
    return Rollout(prompt_id=prompt.id, model_id=policy.model_id, policy_version=0, text=text, token_ids=ids,
                   logprobs=[-0.5] * len(ids), prompt_token_ids=policy.encode_prompt(prompt), eos_id=policy.eos_id,
                   correct=correct, reward=float(correct) if reward is None else reward)


def group(policy, prompt, texts, correct):
    return Group(prompt=prompt, model_id=policy.model_id,
                 rollouts=[rollout(policy, prompt, t, c) for t, c in zip(texts, correct)])


P = Prompt(id="q1", text="12+34", gold="46")


# ---------------------------------------------------------------- novelty (docs/algorithms.md#extra-novelty-bonus)

@pytest.mark.parametrize("mode", ["after_norm", "before_norm"])
def test_correct_novel_response_beats_correct_duplicate(setup, mode):
    cfg, policy = setup[0], setup[1]
    learner = learner_for(cfg, novelty_mode=mode, novelty_alpha=0.5)
    ctx = context(setup)
    first = learner.advantages(ctx, [group(policy, P, ["12+34=46", "12+34=46", "12+34=10+30+2+4=46", "1"],
                                           [True, True, True, False])])
    assert ctx.metrics["extra/novelty_warm_frac"] == 0.0      # first visit: memory below G, no bonus
    texts = ["12+34=46", "12+34=46", "34+12=4*6+0*0*9999=46", "7"]
    g = learner.advantages(context(setup, 1), [group(policy, P, texts, [True, True, True, False])])[0]
    a = g.advantages
    assert a[0] == pytest.approx(a[1]) and a[2] > a[0] > 0 > a[3]
    if mode == "after_norm":   # Option B: the duplicates (novelty 0) keep exactly their GRPO advantage
        assert a[0] == pytest.approx(first[0].advantages[0])
        assert a[3] == pytest.approx(first[0].advantages[3])        # no bonus for a wrong response


def test_all_correct_group_gets_a_pure_diversity_signal(setup):
    cfg, policy = setup[0], setup[1]
    learner = learner_for(cfg)
    texts = ["12+34=46", "12+34=10+30+2+4=46", "34+12=46", "12+34=40+6=46"]
    learner.advantages(context(setup), [group(policy, P, texts, [True] * 4)])
    g = learner.advantages(context(setup, 1), [group(policy, P, ["12+34=46"] * 3 + ["4*9*9*9*1=46"], [True] * 4)])[0]
    assert g.advantages[:3] == [0.0, 0.0, 0.0] and g.advantages[3] > 0


# -------------------------------------------------------- prefixes (docs/algorithms.md#extra-prefix-regeneration)

def test_hard_prompt_prefix_is_mined_from_the_most_confident_rollout(setup):
    cfg, policy = setup[0], setup[1]
    learner = learner_for(cfg)
    ctx = context(setup)
    texts = ["12+34=10+30+2+4=46", "12+34=99", "12+34=10+30=40+6=47"]
    g = group(policy, P, texts, [False, False, False])
    learner._mine(ctx, [g])
    assert ctx.metrics["extra/hard_prompts"] == 1 and len(learner.queue) == 1
    guided, prefix = learner.queue[0]
    # the same pipeline by hand: entropies under theta_old, fallback cuts after '=' / '+', smoothing
    _, ents = policy.score_sequences([r.prompt_token_ids for r in g.rollouts], [r.token_ids for r in g.rollouts],
                                     with_entropy=True)
    width = max(len(e) for e in ents)
    H = torch.zeros(3, width)
    M = torch.zeros(3, width)
    for i, e in enumerate(ents):
        H[i, :len(e)], M[i, :len(e)] = e, 1
    best = most_confident_rollout(H, M)
    ids = g.rollouts[best].token_ids
    cut_ids = {policy.encode_text("=")[0], policy.encode_text("+")[0]}
    cuts = prefix_cut_points(ids, cut_ids, min_gap=3)
    scores = prefix_entropy_scores(ents[best], cuts)
    emb = HashedNgramEmbedder().embed([policy.decode(ids[:b]) for b in cuts])
    k, _ = select_prefix(scores, emb, tau=0.1)
    assert prefix == ids[:cuts[k]] and policy.decode(prefix)[-1] in "=+"
    assert guided.gold == "46" and guided.text == P.text and guided.id != P.id
    assert guided.metadata["extra_origin"] == "q1"


def test_no_prefix_without_cut_tokens_and_easy_prompts_skipped(setup):
    """By default a response without a newline gives no prefix (docs/algorithms.md#extra-prefix-regeneration)."""
    cfg, policy = setup[0], setup[1]
    assert cfg.algo.fallback_cut_chars == "=+" and ExTraConfig().fallback_cut_chars == ""
    learner = learner_for(cfg, fallback_cut_chars=ExTraConfig().fallback_cut_chars)
    ctx = context(setup)
    learner._mine(ctx, [group(policy, P, ["12+34=46", "12+34=47"], [False, False]),
                        group(policy, Prompt(id="q2", text="1+1", gold="2"), ["1+1=2", "1+1=2"], [True, True])])
    assert ctx.metrics["extra/hard_prompts"] == 1 and len(learner.queue) == 0


def test_guided_prompt_regenerates_from_its_prefix_and_prefix_carries_no_gradient(setup):
    cfg, policy = setup[0], setup[1]
    learner = learner_for(cfg)
    prefix = policy.encode_text("12+34=10+")
    learner.queue.append((Prompt(id="q1#pre", text=P.text, gold="46"), prefix))
    prompts = [Prompt(id="a", text="5+6", gold="11"), Prompt(id="b", text="7+8", gold="15")]
    ctx = context(setup, step=1)
    torch.manual_seed(0)
    groups = learner.collect(ctx, prompts)
    assert [g.prompt.id for g in groups] == ["a", "q1#pre"] and ctx.metrics["extra/guided_prompts"] == 1
    guided = groups[1]
    for r in guided.rollouts:
        assert r.prefix_len == len(prefix) > 0 and r.token_ids[:len(prefix)] == prefix
        assert r.text.startswith("12+34=10+")
    assert all(r.prefix_len == 0 for r in groups[0].rollouts)

    groups = learner.advantages(ctx, groups)
    for g in groups:
        g.advantages = [1.0 + i for i in range(g.n)]   # nonzero everywhere, so every unmasked token has a gradient
    batch = learner.build_batch(ctx, groups)
    mb = batch.minibatch(list(range(len(batch))))
    spy = Spy(policy)
    loss, _ = micro_batch_loss(ctx, spy, learner, mb)
    loss.backward()
    grad = spy.logp.grad
    for b, row in enumerate(mb.rows):
        n, k = len(row.response_ids), row.rollout.prefix_len
        assert mb.loss_mask[b, :k].sum() == 0 and mb.loss_mask[b, k:n].eq(1).all()
        assert grad[b, :k].abs().sum() == 0 and grad[b, k:n].abs().min() > 0
    policy.model.zero_grad(set_to_none=True)

    # a response made only of prefix tokens: its advantage cannot change the loss
    only = replace(copy.deepcopy(guided.rollouts[0]), token_ids=list(prefix), logprobs=[0.0] * len(prefix))
    losses = []
    for adv in (5.0, -5.0):
        extra = Group(prompt=guided.prompt, model_id=policy.model_id, rollouts=[only], advantages=[adv])
        b2 = learner.build_batch(ctx, groups + [extra])
        with torch.no_grad():
            losses.append(float(micro_batch_loss(ctx, policy, learner, b2.minibatch(list(range(len(b2)))))[0]))
    assert losses[0] == losses[1]


# ---------------------------------------------------------------- embedders, state, config

def test_embedders(setup, tmp_path, monkeypatch):
    policy = setup[1]
    h = make_embedder("hashed_ngrams")
    e = h.embed(["12+34=46", "12+34=46", "9*9=81", ""])
    assert e.shape == (4, 384) and torch.allclose(e[0], e[1]) and e[0].norm() == pytest.approx(1.0)
    assert float(e[0] @ e[2]) < 0.9 and e[3].abs().sum() == 0
    assert torch.equal(h.embed(["12+34=46"])[0], e[0])           # deterministic (memories survive a resume)
    ph = make_embedder("policy_hidden")
    v = ph.embed(["12+34=46", "9*9=81", "12+34=46"], policy=policy)
    assert v.shape == (3, policy.model.config.hidden_size) and torch.allclose(v[0], v[2], atol=1e-6)
    with pytest.raises(ValueError, match="needs the policy"):
        ph.embed(["1"])
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)   # as if the package were missing
    with pytest.raises(ImportError, match="sentence-transformers"):
        make_embedder(str(tmp_path))
    with pytest.raises(ValueError, match="algo.embedder"):
        make_embedder("minilm")


def test_state_dict_round_trip_keeps_memories_and_queue(setup):
    cfg, policy = setup[0], setup[1]
    learner = learner_for(cfg)
    texts = ["12+34=46", "12+34=10+30+2+4=46", "1", "2"]
    learner.advantages(context(setup), [group(policy, P, texts, [True, True, False, False])])
    learner.queue.append((Prompt(id="q1#x", text=P.text, gold="46", metadata={"extra_origin": "q1"}), [1, 2]))
    state = learner.state_dict()
    fresh = learner_for(cfg)
    fresh.load_state_dict(copy.deepcopy(state))
    assert fresh.queue[0][0] == learner.queue[0][0] and fresh.queue[0][1] == [1, 2]
    ctx = context(setup, 1)
    fresh.advantages(ctx, [group(policy, P, texts, [True, True, False, False])])
    assert ctx.metrics["extra/novelty_warm_frac"] == 1.0


@pytest.mark.parametrize("algo,match", [({"memory_size": 2}, "memory_size"), ({"estimator": "rloo"}, "estimator"),
                                        ({"novelty_mode": "both"}, "novelty_mode"),
                                        ({"embedder": "nope"}, "algo.embedder")])
def test_bad_config_is_rejected_by_key(algo, match):
    with pytest.raises(ConfigError, match=match):  # at load, before any model is built
        load_config(pair="micro", algo="extra", overrides=OVERRIDES + [f"algo.{k}={v}" for k, v in algo.items()])


def test_cli_end_to_end_micro(tmp_path):
    from graftzoo.apps.cli import main
    args = ["train", "--algo", "extra", "--pair", "micro", "--no-track", "--no-resume", "--set", "run.steps=2",
            "--set", f"run.out_dir={tmp_path}"]
    for o in OVERRIDES:
        args += ["--set", o]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    recs = [json.loads(x) for x in (one_run(tmp_path, "extra-micro-qwen-char-micro-*-s0") / "metrics.jsonl").read_text().splitlines()]
    s0, s1 = [r for r in recs if r["step"] == 0][0], [r for r in recs if r["step"] == 1][0]
    assert s0["extra/guided_prompts"] == 0 and s0["extra/queue_len"] >= 1
    assert s1["extra/guided_prompts"] == 1 and s1["loss"] is not None
    assert s0["rollouts/generated"] == s1["rollouts/generated"] == 16
