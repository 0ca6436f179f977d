"""OM-GRPO learner (docs/algorithms.md#om-grpo): hand-computed consensus reward with CAR votes, no gradient on
the answer span (policy and KL terms), gold never read (label-free and TTT), and an end-to-end CLI run."""
import copy
import json
from types import SimpleNamespace

import pandas as pd
import pytest
from helpers import Spy, one_run
import torch
from click.testing import CliRunner

import graftzoo.algos.om_grpo.learner as om
from graftzoo.algos.base import StepContext
from graftzoo.algos.om_grpo import OMGRPOConfig
from graftzoo.algos.om_grpo.learner import OMGRPO
from graftzoo.training.models.policy import Policy
from graftzoo.contract.config import ConfigError, LearnerFacts, load_config, with_values
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.planner.build import build_policy
from graftzoo.contract.types import Group, Prompt, Rollout


class TextPolicy:
    """One token per character; enough of the Policy interface for scoring and CAR prompts."""

    model_id = "text"
    eos_id = 0
    pad_id = 0
    max_prompt_tokens = 10_000
    tokenizer = None
    model = SimpleNamespace(config=SimpleNamespace())

    def render(self, p):
        return p.text

    def encode_text(self, s):
        return [ord(c) for c in s]

    def encode_prompt(self, p):
        return self.encode_text(p.text)

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i)

    char_offsets = Policy.char_offsets
    context_window = 1 << 30


class ScriptedEngine:
    """Main rollouts and CAR answers from scripts; fails if a prompt carrying gold or metadata reaches it."""

    max_new_tokens = 64

    def __init__(self, texts: dict, contrast: list = ()):
        self.texts, self.contrast = texts, list(contrast)
        self.asked = []

    def generate(self, prompts, n, prefixes=None, greedy=False, temperature=None, max_new_tokens=None):
        pol = TextPolicy()
        out = []
        for p in prompts:
            assert p.gold is None and not p.metadata, f"gold or metadata reached the engine: {p}"
            if "#car-" in p.id:
                self.asked.append(p)
                texts = [self.contrast.pop(0)]
            else:
                texts = list(self.texts[p.id])[:n if isinstance(n, int) else n[prompts.index(p)]]
            rs = [Rollout(prompt_id=p.id, model_id="text", policy_version=0, text=t,
                          token_ids=pol.encode_text(t) + [0], logprobs=[-1.0] * (len(t) + 1), eos_id=0)
                  for t in texts]
            out.append(Group(prompt=p, model_id="text", rollouts=rs))
        return out


class NoLabels:
    def score_groups(self, groups):
        raise AssertionError("OM-GRPO must not call the environment's label-based scoring")

    score_batch = score_groups


def text_ctx(texts, contrast=(), G=3, step=0):
    run = LearnerFacts(n=G, max_new_tokens=64, verifier_timeout=2.0, minibatches=1, seed=0)
    engine = ScriptedEngine(texts, contrast)
    return StepContext(step=step, epoch=0, run=run, policy=TextPolicy(), engine=engine, env=NoLabels()), engine


def learner(run: LearnerFacts, **algo):
    return OMGRPO(OMGRPOConfig(**algo), run)


def test_consensus_reward_matches_hand_computation():
    # answers 3, 3, 5; CAR votes (pairs (0,1),(0,2),(1,0),(1,2),(2,0),(2,1)): 3, 6/2, 5, none, 3, 7
    # pool of 9: class {3}: 2 own + 3 votes = 5 -> r^q = 5/9; class {5}: 1 + 1 = 2 -> 2/9; r^f = 1 for all
    own = ["so \\boxed{3}", "thus \\boxed{3}.", "\\boxed{5}"]
    votes = ["\\boxed{3}", "\\boxed{\\frac{6}{2}}", "\\boxed{5}", "no answer here", "\\boxed{3}", "\\boxed{7}"]
    ctx, engine = text_ctx({"x": own}, votes)
    lr = learner(ctx.run)
    groups = lr.collect(ctx, [Prompt(id="x", text="What is 1+2?", gold="3", metadata={"solution": "1+2=3"})])
    g = groups[0]
    assert g.rewards == pytest.approx([1 + 5 / 9, 1 + 5 / 9, 1 + 2 / 9], abs=1e-12)
    assert [r.extracted for r in g.rollouts] == ["3", "3", "5"] and not any(r.correct for r in g.rollouts)
    assert g.prompt.gold is None and len(engine.asked) == 6
    ask = engine.asked[0].text
    assert "Solution A:\nso \\boxed{3}" in ask and "Solution B:\nthus \\boxed{3}." in ask
    r = torch.tensor(g.rewards, dtype=torch.float64)
    g = lr.advantages(ctx, groups)[0]
    assert g.advantages == pytest.approx(((r - r.mean()) / (r.std() + 1e-6)).tolist(), abs=1e-9)
    # without CAR the pool is the 3 own answers: 2/3, 2/3, 1/3
    ctx, _ = text_ctx({"x": own})
    g = learner(ctx.run, contrast=False).collect(ctx, [Prompt(id="x", text="q", gold=None)])[0]
    assert g.rewards == pytest.approx([1 + 2 / 3, 1 + 2 / 3, 1 + 1 / 3])


def test_unformatted_answers_score_zero_and_any_format_reads_scratchpads():
    own = ["12+3=15", "12+3=15", "\\boxed{16}"]
    ctx, _ = text_ctx({"x": own})
    g = learner(ctx.run, contrast=False).collect(ctx, [Prompt(id="x", text="12+3", gold=None)])[0]
    assert g.rewards == pytest.approx([0.0, 0.0, 1 + 1 / 3])          # None never matches, still counts in |Z|
    ctx, _ = text_ctx({"x": own})
    g = learner(ctx.run, contrast=False, answer_format="any").collect(ctx, [Prompt(id="x", text="12+3")])[0]
    assert g.rewards == pytest.approx([1 + 2 / 3, 1 + 2 / 3, 1 + 1 / 3])


def test_answer_span_mask_on_the_rollout():
    own = ["x=\\boxed{12} so \\boxed{15}", "15", "no"]
    ctx, _ = text_ctx({"x": own})
    g = learner(ctx.run, contrast=False, answer_grad_scale=0.25).collect(ctx, [Prompt(id="x", text="q")])[0]
    m = g.rollouts[0].loss_mask
    text = own[0]
    start = text.rindex("15")
    assert len(m) == len(text) + 1 and m[-1] == 1.0                     # EOS keeps its gradient
    assert [i for i, v in enumerate(m) if v != 1.0] == [start, start + 1] and m[start] == 0.25
    assert g.rollouts[0].kl_mask == m
    assert g.rollouts[1].loss_mask == [1.0] * 3                 # unformatted: nothing to mask
    ctx, _ = text_ctx({"x": own})
    g = learner(ctx.run, contrast=False, mask_all_boxed=True, mask_kl=False).collect(ctx, [Prompt(id="x", text="q")])[0]
    m = g.rollouts[0].loss_mask
    assert sum(v == 0.0 for v in m) == 4 and g.rollouts[0].kl_mask == [1.0] * len(m)


# ---------------------------------------------------------------- gradients with the micro policy

@pytest.fixture(scope="module")
def micro():
    cfg = load_config(pair="micro", algo="om_grpo", overrides=["pair.train=[micro-qwen-char]",
                                                                "algo.answer_format=any", "eval.size=6"])
    spec = next(s for s in cfg.pair.models if s.id == "micro-qwen-char")
    policy = build_policy(spec, cfg, seed=0)
    ref = copy.copy(policy)
    ref.model = copy.deepcopy(policy.model).eval()
    with torch.no_grad():                     # a reference that differs, so the KL term has a gradient
        for p in ref.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return cfg, policy, ref


@pytest.mark.parametrize("mask_kl", [True, False])
def test_no_gradient_reaches_answer_tokens(micro, mask_kl):
    cfg, policy, ref = micro
    lr = learner(LearnerFacts.of(cfg), **{**cfg.algo.model_dump(exclude={"name"}), "mask_kl": mask_kl,
                                          "contrast": False})
    prompt = Prompt(id="p", text="12+3")
    texts = ["12+3=10+5=15", "12+3=10+5=16", "12+3=15", "12+3=10+3=13"]
    rolls = []
    for t in texts:
        ids = policy.encode_text(t) + [policy.eos_id]
        with torch.no_grad():
            full = torch.tensor([policy.encode_prompt(prompt) + ids])
            old, _ = policy.logprobs(full, torch.ones_like(full), len(ids))
        rolls.append(Rollout(prompt_id="p", model_id=policy.model_id, policy_version=0, text=t, token_ids=ids,
                             logprobs=old[0].tolist(), prompt_token_ids=policy.encode_prompt(prompt),
                             eos_id=policy.eos_id))
    groups = [Group(prompt=prompt, model_id=policy.model_id, rollouts=rolls)]
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=policy, engine=None, env=NoLabels(),
                      ref_policy=ref)
    lr.self_score(ctx, groups, [[]])
    lr.mask_answers(ctx, groups)
    groups = lr.advantages(ctx, groups)
    assert len(set(groups[0].advantages)) > 1
    batch = lr.build_batch(ctx, groups)
    mb = batch.minibatch(list(range(len(batch))))
    spy = Spy(policy)
    loss, met = micro_batch_loss(ctx, spy, lr, mb)
    assert lr.cfg.beta_kl > 0 and met["kl"] > 0
    loss.backward()
    grad = spy.logp.grad
    policy.model.zero_grad(set_to_none=True)
    for b, (row, t) in enumerate(zip(mb.rows, texts)):
        answer = t.rsplit("=", 1)[1]
        span = list(range(len(t) - len(answer), len(t)))            # char tokenizer: one token per character
        assert [i for i, v in enumerate(row.loss_mask) if v == 0.0] == span
        if mask_kl:
            assert grad[b, span].abs().sum() == 0                    # neither the policy nor the KL term
        else:
            assert grad[b, span].abs().sum() > 0                     # the KL term still reaches them
        others = [i for i in range(len(row.response_ids)) if i not in span]
        assert grad[b, others].abs().min() > 0


def test_token_offsets_fall_back_to_prefix_decoding(micro):
    policy = micro[1]
    ids = policy.encode_text("12+3=15")
    assert policy.char_offsets(ids, "12+3=15") == [(i, i + 1) for i in range(7)]
    non_canonical = SimpleNamespace(tokenizer=SimpleNamespace(is_fast=False), decode=lambda x: "ab"[:len(x)])
    assert Policy.char_offsets(non_canonical, [7, 8], "ab") == [(0, 1), (1, 2)]


def test_contrast_prompts_fit_the_context(micro):
    policy = micro[1]
    prompt = Prompt(id="p", text="12+34")
    sols = ["12+34=10+30+2+4=40+6=46", "12+34=46", "12+34=10+30+2+4=40+6=47"]
    g = Group(prompt=prompt, model_id="m", rollouts=[Rollout(prompt_id="p", model_id="m", policy_version=0, text=t)
                                                     for t in sols])
    texts = om.fit_contrast_prompts(policy, g, 40, om.CONTRAST_TEMPLATES["compact"])
    assert sorted(texts) == [(i, j) for i in range(3) for j in range(3) if i != j]
    for (i, j), t in texts.items():
        assert len(policy.encode_prompt(Prompt(id="", text=t))) <= 40
        a, b = t.split("\n")[1:]
        assert sols[i].endswith(a) and sols[j].endswith(b) and a                # the tails are kept
    assert texts[(1, 0)].split("\n")[1] == sols[1]                               # short ones whole
    assert om.fit_contrast_prompts(policy, g, 100) is None       # the spec wording alone overflows a tiny context


# ---------------------------------------------------------------- label-free guarantees

def test_ttt_trains_on_heldout_prompts_without_reading_gold(micro):
    cfg = with_values(micro[0], {"task.prompts_per_step": 4})
    held = [Prompt(id=f"h{i}", text=f"{i}+1", gold=f"LEAK-{i}", metadata={"solution": f"{i}+1=LEAK"})
            for i in range(6)]
    lr = learner(LearnerFacts.of(cfg), ttt=True, contrast=False, answer_format="any")
    seen = []
    for step in range(3):                      # 12 prompts: two seeded passes over the 6 held-out ones
        engine = ScriptedEngine({p.id: ["1+1=2"] * 4 for p in held})
        ctx = StepContext(step=step, epoch=0, run=LearnerFacts.of(cfg), policy=TextPolicy(), engine=engine,
                          env=NoLabels(), heldout=lambda: held)   # the held-out prompts, as the trainer passes them
        groups = lr.collect(ctx, [Prompt(id=f"train{j}", text="9+9", gold="18") for j in range(4)])
        for g in groups:
            assert g.prompt.gold is None and not g.prompt.metadata
            assert all("LEAK" not in repr(r) for r in g.rollouts)
        seen += [g.prompt.id for g in groups]
    assert sorted(seen[:6]) == sorted(seen[6:]) == [f"h{i}" for i in range(6)]
    assert seen[:6] != seen[6:]                  # a new permutation each pass


def test_heldout_prompts_are_the_evaluation_set(micro, tmp_path):
    """What test-time training reads (the step context's ``heldout``, from the trainer) is the evaluation set; the
    trainer hands it only to a learner whose section declares it trains on it (``trains_on_heldout``: ``ttt``)."""
    from graftzoo.training.trainer import Trainer
    cfg = with_values(micro[0], {"run.out_dir": str(tmp_path), "run.track": False, "algo.ttt": True})
    tr = Trainer(cfg)
    try:
        ps = tr.context(0, 0, tr.model_ids[0], 0).heldout()
    finally:
        tr.close()
    assert len(ps) == cfg.eval.size and all(p.id.startswith("arith-test-") for p in ps)
    tr = Trainer(with_values(cfg, {"algo.ttt": False, "run.name": "no-ttt"}))
    try:
        assert tr.context(0, 0, tr.model_ids[0], 0).heldout is None
    finally:
        tr.close()


@pytest.mark.parametrize("algo,match", [({"answer_format": "latex"}, "answer_format"),
                                        ({"answer_grad_scale": 1.5}, "answer_grad_scale"),
                                        ({"contrast_max_new_tokens": 0}, "contrast_max_new_tokens")])
def test_bad_config_is_rejected_by_key(algo, match):
    with pytest.raises(ConfigError, match=match):  # at load, before any model is built
        load_config(pair="micro", algo="om_grpo", overrides=[f"algo.{k}={v}" for k, v in algo.items()])
    with pytest.raises(ConfigError, match=match):  # direct construction checks the declared fields too
        learner(LearnerFacts(n=4), **algo)
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(pair="micro", algo="om_grpo", overrides=["rollout.n=1"])


def test_cli_end_to_end_micro_ttt(tmp_path):
    from graftzoo.apps.cli import main
    res = CliRunner().invoke(main, ["train", "--algo", "om_grpo", "--pair", "micro", "--no-track", "--no-resume",
                                    "--set", "pair.train=[micro-qwen-char]", "--set", "run.steps=2",
                                    "--set", f"run.out_dir={tmp_path}", "--set", "eval.size=4",
                                    "--set", "algo.answer_format=any", "--set", "algo.ttt=true",
                                    "--set", "algo.contrast_max_new_tokens=12",
                                    "--set", "algo.contrast_template=compact"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    run = one_run(tmp_path, "om_grpo-micro-qwen-char-micro-*-s0")  # pair.train: the trained model in the name
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["step"] in (0, 1)]
    assert len(train) == 2
    for r in train:
        assert r["om_grpo/contrast_generated"] == 4 * 4 * 3         # prompts x G(G-1)
        assert r["om_grpo/contrast_skipped_groups"] == 0
        assert r["rollouts/generated"] == 16 and r["kl"] is not None and r["loss"] is not None
        assert 0 < r["om_grpo/masked_token_frac"] < 1 and r["om_grpo/format_rate"] > 0
    store = pd.concat(pd.read_parquet(p) for p in sorted((run / "store" / "micro-qwen-char").glob("*.parquet")))
    assert store["prompt_id"].str.startswith("arith-test-").all() and store["gold"].isna().all()
