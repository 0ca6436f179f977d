"""The cross-tokenizer exchange as the peer learners use it (docs/algorithms.md#cross-tokenizer-exchange,
docs/algorithms.md#graft-edge-cases), through their ``exchange`` and ``build_batch`` hooks with the micro pair: the
learner's EOS is appended to a peer response only if the peer stopped, and it counts toward the learner's length
limit, so that no training row is longer than ``max_response`` tokens (own, peer, stored and truncated rows alike);
``xt.overflow=truncate`` keeps a response's first tokens; a stored response is always re-tokenized from its text."""
from dataclasses import replace
import pytest
import torch
from helpers import scored_rollout, theta_old_base
from test_graft import FAIL, LEARNER, MIXED, PEER, STRONG_PAIR, context, learner, pols, prompts, rollout  # noqa: F401

from graftzoo.algos.functional import group_advantages
from graftzoo.contract.config import load_config
from graftzoo.contract.types import Group
from graftzoo.peers import StoredPeer, TrajectoryStore
from graftzoo.peers.xt import XTOverflowError
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.trainer import Trainer

MAX = 40  # micro-qwen-char's max response (rollout.max_new_tokens of the micro pair); one character = one token


def grpo_adv(rewards):
    return group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.zeros(len(rewards),
                                                                                    dtype=torch.long)).tolist()


def peer_group(pols, prompt, texts, correct, finish=None):
    """The peer's responses ``texts`` (its own tokenizer), stopped unless ``finish[i]`` is "length" (then without
    EOS, as an engine returns a response cut at its limit)."""
    rolls = [rollout(pols[PEER], prompt, t, c) for t, c in zip(texts, correct)]
    rolls = [replace(r, token_ids=r.token_ids[:-1], logprobs=r.logprobs[:-1], finish_reason="length")
             if f == "length" else r for r, f in zip(rolls, finish or ["stop"] * len(rolls))]
    return Group(prompt, PEER, rolls, grpo_adv([float(c) for c in correct]))


def grafted_rows(algo, ctx, pols, texts, correct, finish=None):
    """GRAFT (delta 0: every response admitted) replacing an all-fail learner group by the peer's ``texts``: the
    batch's peer rows by text, and every row of the batch."""
    p = prompts(1)[0]
    own = [Group(p, LEARNER, [rollout(pols[LEARNER], p, f"{p.text}={31 + i}", False) for i in range(8)],
                 [0.0] * 8)]
    slots = algo.exchange(ctx, own, {p.id: peer_group(pols, p, texts, correct, finish)})
    batch = algo.build_batch(ctx, slots)
    return {r.rollout.text: r for r in batch.rows if r.is_peer}, batch.rows


def text_of(n, head="10+20="):
    """A response text of exactly ``n`` characters (tokens for the learner), its positions told apart."""
    body = "".join(str((i * 7) % 10) for i in range(n))
    return (head + body)[:n]


def test_a_response_cut_for_length_is_not_terminated(pols):
    """finish_reason "length": the peer did not stop, so the learner learns no EOS after the text (xt.append_eos_if_
    stopped appends it only to a stopped response)."""
    algo, cfg = learner("delta=0")
    ctx = context(cfg, pols[LEARNER])
    texts = ["10+20=30", "10+20=31", "10+20=3333"]
    rows, _ = grafted_rows(algo, ctx, pols, texts, [True, False, False], finish=["stop", "stop", "length"])
    eos, enc = pols[LEARNER].eos_id, pols[LEARNER].encode_text
    assert rows["10+20=30"].response_ids == enc("10+20=30") + [eos]
    assert rows["10+20=3333"].response_ids == enc("10+20=3333")                 # no EOS
    assert rows["10+20=3333"].rollout.finish_reason == "length"


@pytest.mark.parametrize("overflow", ["drop", "truncate", "error"])
def test_the_appended_eos_counts_toward_the_learners_limit(pols, overflow):
    """A stopped response whose text takes exactly max_response learner tokens needs max_response + 1 with its EOS:
    over the limit (dropped, cut to its first max_response tokens without EOS, or an error); one token shorter, it
    fits with its EOS; a response cut for length (no EOS) fits at max_response."""
    algo, cfg = learner("delta=0", f"xt.overflow={overflow}")
    ctx = context(cfg, pols[LEARNER])
    assert int(pols[LEARNER].max_response_tokens) == MAX
    fits, full, cut = text_of(MAX - 1), text_of(MAX), text_of(MAX, head="10+20=9")
    texts, correct, finish = [fits, full, cut], [True, False, False], ["stop", "stop", "length"]
    if overflow == "error":
        with pytest.raises(XTOverflowError, match=f"{MAX + 1} tokens .EOS included. .* max response {MAX}"):
            grafted_rows(algo, ctx, pols, texts, correct, finish)
        return
    rows, every = grafted_rows(algo, ctx, pols, texts, correct, finish)
    eos, enc = pols[LEARNER].eos_id, pols[LEARNER].encode_text
    assert rows[fits].response_ids == enc(fits) + [eos] and len(rows[fits].response_ids) == MAX
    assert rows[cut].response_ids == enc(cut) and len(rows[cut].response_ids) == MAX
    if overflow == "drop":
        assert full not in rows and ctx.metrics["xt/dropped"] == 1
    else:
        assert rows[full].response_ids == enc(full) and rows[full].rollout.finish_reason == "length"
    assert max(len(r.response_ids) for r in every) <= MAX
    assert all(len(r.old_logp) == len(r.loss_mask) == len(r.response_ids) for r in every)


def test_truncate_keeps_the_first_max_response_tokens(pols):
    """xt.overflow=truncate (HACPO's code, its preset): a response longer than the learner's limit keeps its first
    max_response tokens, through GRAFT's exchange and HACPO's (which pools every peer response)."""
    long = text_of(MAX + 15)
    enc = pols[LEARNER].encode_text
    assert enc(long)[:MAX] != enc(long)[-MAX:]
    algo, cfg = learner("delta=0", "xt.overflow=truncate")
    rows, _ = grafted_rows(algo, context(cfg, pols[LEARNER]), pols, [long, "10+20=30"], [False, True])
    assert rows[long].response_ids == enc(long)[:MAX]

    from test_hacpo import make
    hcfg = load_config(pair="micro", algo="hacpo", overrides=["peer.source=online", "run.track=false"])
    assert hcfg.xt.overflow == "truncate"
    hacpo, ctx = make(hcfg, pols[LEARNER], history={"self": [0.4], "peer": [0.5]})
    p = prompts(1)[0]
    own = Group(p, LEARNER, [scored_rollout(pols[LEARNER], p, f"{p.text}={31 + i}", False) for i in range(2)])
    hacpo_rows = [r for r in hacpo.build_batch(ctx, hacpo.exchange(ctx, [own], {p.id: peer_group(
        pols, p, [long, "10+20=30"], [False, True])})).rows if r.is_peer]
    assert [r.response_ids for r in hacpo_rows if r.rollout.text == long] == [enc(long)[:MAX]]


def test_a_stored_response_of_the_learners_own_model_is_retokenized(pols, tmp_path):
    """A store of the learner's own earlier run (peer.model = the learner's model): its responses carry text and
    log-prob statistics, no token ids, so they are tokenized and scored like any stored peer response (the learner's
    EOS after a stopped one), never trained on the placeholder ids the store leaves."""
    lpol = pols[LEARNER]
    p = prompts(1)[0]
    correct = [True, False, True, False]
    logged = Group(p, LEARNER, [scored_rollout(lpol, p, t, c) for t, c in
                                zip(["10+20=30", "10+20=31", "10+20=030", "10+20=3"], correct)],
                   grpo_adv([float(c) for c in correct]))
    TrajectoryStore(tmp_path / "store", dataset="arithmetic").write(0, 0, [logged], tokenizer_id=lpol.tokenizer_id)
    peer = StoredPeer(tmp_path / "store", model=LEARNER).groups([p], 0, 0, LEARNER)
    assert peer[p.id].rollouts[0].token_ids != logged.rollouts[0].token_ids   # the store keeps text, not ids
    algo, cfg = learner("delta=0", "peer.source=stored", f"peer.path={tmp_path / 'store'}")
    ctx = context(cfg, lpol)
    own = [Group(p, LEARNER, [rollout(lpol, p, f"{p.text}={41 + i}", False) for i in range(4)], [0.0] * 4)]
    rows = [r for r in algo.build_batch(ctx, algo.exchange(ctx, own, peer)).rows if r.is_peer]
    assert len(rows) == 4
    for r in rows:
        assert r.response_ids == lpol.encode_text(r.rollout.text) + [lpol.eos_id]
        assert r.old_logp == pytest.approx(scored_rollout(lpol, p, r.rollout.text, False).logprobs, abs=1e-5)


def test_no_training_row_is_longer_than_its_models_max_response(tmp_path):
    """One co-training step of the micro pair with HACPO's preset (every peer response pooled, xt.overflow=truncate):
    every row the trainer builds, own or peer, fits its model's max response (the peer's digit-pair responses are up
    to twice as long in the learner's characters)."""
    (tmp_path / "strong.yaml").write_text(STRONG_PAIR)
    cfg = load_config(pair="micro", algo="hacpo", files=[tmp_path / "strong.yaml"],
                      overrides=[f"run.out_dir={tmp_path}", "run.track=false", "peer.source=online"])
    tr = Trainer(cfg)
    try:
        tr.train_step(0)
        for m, slots in tr.step_slots.items():
            rows = tr.learners[m].build_batch(tr.context(0, 0, m, 0), slots).rows
            limit = int(tr.policies[m].max_response_tokens)
            assert {r.role for r in rows} == {"own", "peer"}
            assert max(len(r.response_ids) for r in rows) <= limit, m
    finally:
        tr.close()


def test_a_peer_sharing_the_learners_tokenizer_gets_the_learners_theta_old(pols):
    """Peer rows take their ratio base from the learner, like own rows (docs/algorithms.md#cross-tokenizer-exchange
    step 3): even when the peer's token ids are the learner's (same tokenizer), the base is the learner's theta_old
    log-probs, never the peer's behaviour log-probs, and it is not a given base, so the first minibatch's base from
    its own forward (``base_from_forward``, ``ratio_base``) replaces it as it does an own row's."""
    lpol = pols[LEARNER]
    p = prompts(1)[0]
    texts, correct = ["10+20=30", "10+20=31", "10+20=300", "10+20=3"], [True, False, False, False]
    rolls = [rollout(lpol, p, t, c, lp=-3.0) for t, c in zip(texts, correct)]   # behaviour log-probs -3
    rolls = [replace(r, model_id="another-char-model", tokenizer_id=lpol.tokenizer_id) for r in rolls]
    peer = {p.id: Group(p, "another-char-model", rolls, grpo_adv([float(c) for c in correct]))}
    algo, cfg = learner("delta=0")
    ctx = context(cfg, lpol)
    own = [Group(p, LEARNER, [rollout(lpol, p, f"{p.text}={41 + i}", False) for i in range(4)], [0.0] * 4)]
    batch = algo.build_batch(ctx, algo.exchange(ctx, own, peer))
    idx = [i for i, r in enumerate(batch.rows) if r.is_peer]
    assert len(idx) == 4
    for i in idx:
        r = batch.rows[i]
        assert r.response_ids == rolls[texts.index(r.rollout.text)].token_ids        # the same ids
        assert not r.given_old_logp
        assert r.old_logp == pytest.approx(scored_rollout(lpol, p, r.rollout.text, False).logprobs, abs=1e-5)
    mb = batch.minibatch(idx)
    mb.old_logp = torch.full_like(mb.old_logp, -3.0)
    with torch.no_grad():
        want, _ = lpol.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
    assert torch.equal(theta_old_base(lpol, mb), want)                              # the base from a forward
    _, met = micro_batch_loss(ctx, lpol, algo, mb, base_from_forward=True)          # the loss's own forward
    assert met["ratio/mean"] == 1.0
    _, met = micro_batch_loss(ctx, lpol, algo, mb)                                  # the arrived base (-3) kept
    assert met["ratio/mean"] != pytest.approx(1.0, abs=1e-2)
    assert bool((mb.old_logp == -3.0).all())                                        # never rewritten
