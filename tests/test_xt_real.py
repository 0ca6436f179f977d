"""The cross-tokenizer exchange on real vocabularies (docs/algorithms.md#exchange-rules-for-real-vocabularies), in both
directions of pair1-mini (SmolLM3 -> Qwen3 and Qwen3 -> SmolLM3), untrained, through the learner's real call path:
the peer's rollouts made by the engine's own ``rollout_from_tokens`` from the peer's token ids and scored by the
task's environment, then GRAFT's ``exchange`` (``ctx.localize``) and ``build_batch``.

Each rule has a test that fails when it is broken: a special token's string written as text stays text (never an
added id or an EOS), NFC and a cut mid-character are lossy (``xt.lossy`` drop or keep, counted by reason), a stopped
response loses its stop text and ends in the learner's EOS, a leading space stays, ``\\boxed{}`` split otherwise keeps
its verdict, a kept response whose verdict changes is dropped; and the ``xt/*`` metrics of a worked example."""
from dataclasses import replace
import math
import random
import unicodedata
from types import SimpleNamespace

import pytest
import torch
import yaml
from mini import QWEN, SMOL, untrained_pair

from graftzoo.algos.base import StepContext
from graftzoo.algos.functional import group_advantages
from graftzoo.algos.graft.learner import GRAFT
from graftzoo.contract.config import LearnerFacts, load_config
from graftzoo.contract.types import Group, Prompt
from graftzoo.envs.task import Task
from graftzoo.training.engines.engine import rollout_from_tokens
from graftzoo.training.planner.build import build_policy

PROMPT = Prompt(id="p0", text="12+34", gold="46")
DIRECTIONS = [pytest.param(SMOL, QWEN, id="smollm3->qwen3"), pytest.param(QWEN, SMOL, id="qwen3->smollm3")]
CUT_CHAR = {SMOL: "😀", QWEN: "\U0002A6B2"}  # a character each peer's vocabulary spells in several byte tokens
NFD = "e\u0301"  # é decomposed: NFC composes it into U+00E9


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """pair1-mini untrained (tests/mini.py) with room for the responses below (64 new tokens), its policies and the
    task's training environment (the scorer of the step)."""
    path = untrained_pair(tmp_path_factory.mktemp("pair"))
    spec = yaml.safe_load(path.read_text())
    for m in spec["models"]:
        m["max_new_tokens"] = 64
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cfg = load_config(pair=str(path), algo="graft", overrides=["peer.source=online", "run.track=false"])
    return SimpleNamespace(path=path, pols={s.id: build_policy(s, cfg) for s in cfg.pair.models},
                           env=Task(cfg).train_env)


def says(pol, *parts, eos=True) -> list:
    """The peer's token ids: each part a text (spelled literally) or a list of ids, then its EOS unless ``eos`` is
    False (a response that runs on: the engine ends it at a stop string or at the length limit)."""
    ids = [i for part in parts for i in (pol.encode_literal(part) if isinstance(part, str) else part)]
    return ids + ([pol.eos_id] if eos else [])


def peer_group(mini, peer, seqs) -> Group:
    """The peer's group for PROMPT as the step makes it: each id sequence ended as the engine ends it (EOS, a stop
    string, else the length limit), then scored by the task and given GRPO advantages. Two fillers, one right and one
    wrong, come last, so that the group is mixed and GRAFT grafts it."""
    pol = mini.pols[peer]
    seqs = list(seqs) + [says(pol, "12+34=46"), says(pol, "12+34=47")]
    rolls = [replace(rollout_from_tokens(pol, pol.encode_prompt(PROMPT), [], toks, [-1.0] * len(toks), 0),
                     prompt_id=PROMPT.id) for toks in seqs]
    g = mini.env.score_groups([Group(PROMPT, peer, rolls)])[0]
    return replace(g, advantages=group_advantages(torch.tensor([r.reward for r in g.rollouts], dtype=torch.float64),
                                                  torch.zeros(g.n, dtype=torch.long)).tolist())


def exchange(mini, learner, group, *overrides):
    """GRAFT (every response admitted unless ``algo.delta`` says otherwise) on an all-fail learner group of PROMPT
    and the peer's ``group``: (the localized peer rollouts in order, their rows by index, the step's metrics)."""
    cfg = load_config(pair=str(mini.path), algo="graft",
                      overrides=["peer.source=online", "run.track=false", "algo.delta=0", *overrides])
    pol = mini.pols[learner]
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=pol, engine=None, env=mini.env,
                      rng=random.Random(0))
    wrong = [rollout_from_tokens(pol, pol.encode_prompt(PROMPT), [], says(pol, f"12+34={40 + i}"), [-1.0] * 9, 0)
             for i in range(4)]
    own = replace(mini.env.score_groups([Group(PROMPT, learner, wrong)])[0], advantages=[0.0] * 4)
    algo = GRAFT(cfg.algo, LearnerFacts.of(cfg))
    slots = algo.exchange(ctx, [own], {PROMPT.id: group})
    batch = algo.build_batch(ctx, slots)
    (slot,) = [g for g in slots if g.source == "peer"]
    rows = {i: row for i, r in enumerate(slot.rollouts) for row in batch.rows if row.rollout is r}
    return slot.rollouts, rows, ctx.metrics


# ------------------------------------------------------------------------------------------------
# 1. a special token's string written as text
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("peer,learner", DIRECTIONS)
def test_a_special_tokens_string_stays_text(mini, peer, learner):
    """The EOS, chat and think markers of both vocabularies, written by the peer as text, reach the learner as the
    ordinary tokens that spell them: no added id (special or not) in the body, the only EOS the appended last one, and
    the body decodes to the peer's text. A Qwen3 peer's own ``<think>`` token (151667, not special) decodes to the
    text ``<think>``, which the SmolLM3 learner must not read as its ``<think>`` (128002)."""
    ppol, lpol = mini.pols[peer], mini.pols[learner]
    marks = ["<|endoftext|>", "<|im_start|>", "<|end_of_text|>", "<think>", "</think>", "<|im_end|>"]
    seqs = [says(ppol, "12+34=46", m) for m in marks] + [says(ppol, "<|im_start|>assistant\n12+34=47<|endoftext|>")]
    if peer == QWEN:
        think = ppol.tokenizer.convert_tokens_to_ids("<think>")
        seqs.append(says(ppol, [think], "12+34=46", [ppol.tokenizer.convert_tokens_to_ids("</think>")]))
    group = peer_group(mini, peer, seqs)
    if peer == QWEN:
        assert group.rollouts[len(seqs) - 1].text == "<think>12+34=46</think>"
    local, rows, met = exchange(mini, learner, group)
    added = lpol.added_ids
    own = [m for m in marks if lpol.tokenizer.convert_tokens_to_ids(m) in added]
    assert own and all(set(lpol.encode_text(f"x{m}")) & added for m in own)  # its own encoding would match them
    for i, r in enumerate(group.rollouts[:len(seqs)]):
        if i < len(marks):
            assert r.text.endswith(marks[i]) and r.finish_reason == "stop"
        ids = rows[i].response_ids
        assert ids[-1] == lpol.eos_id and not set(ids[:-1]) & (added | set(lpol.eos_ids)), (r.text, ids)
        assert lpol.decode(ids[:-1]) == r.text == local[i].text
        assert ids[:-1] == lpol.encode_literal(r.text)
    assert met["xt/lossless_frac"] == 1.0 and met["xt/dropped"] == 0


def test_literal_encoding_round_trips_every_added_token(mini):
    """``Policy.encode_literal`` of each added token's string of both vocabularies: no added id, decoded back."""
    strings = {t.content for pol in mini.pols.values() for t in pol.tokenizer.added_tokens_decoder.values()}
    assert len(strings) > 250
    for pol in mini.pols.values():
        for s in sorted(strings):
            ids = pol.encode_literal(f" x{s}y")
            assert not set(ids) & pol.added_ids and pol.decode(ids) == f" x{s}y", (pol.model_id, s)


# ------------------------------------------------------------------------------------------------
# 2. NFC, 3. a response cut mid-character: lossy, xt.lossy drop | keep
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lossy", ["drop", "keep"])
def test_nfd_text_is_lossy_for_the_nfc_learner_only(mini, lossy):
    """SmolLM3 -> Qwen3: a decomposed é comes back composed (Qwen3 normalizes NFC): lossy ``normalized``, dropped or
    kept as Qwen3's tokens of the composed text. Qwen3 -> SmolLM3: SmolLM3 has no normalizer, the same text (Qwen3's
    ids of e and of U+0301) is lossless."""
    text = f"caf{NFD}: 12+34=47"
    group = peer_group(mini, SMOL, [says(mini.pols[SMOL], text)])
    assert group.rollouts[0].text == text
    local, rows, met = exchange(mini, QWEN, group, f"xt.lossy={lossy}")
    qwen = mini.pols[QWEN]
    assert met["xt/lossy_normalized"] == 1 and met["xt/lossless_frac"] == pytest.approx(2 / 3)
    if lossy == "drop":
        assert local[0].dropped == "lossy_normalized" and 0 not in rows and met["xt/dropped"] == 1
    else:
        composed = unicodedata.normalize("NFC", text)
        assert local[0].text == composed and not local[0].dropped and met["xt/dropped"] == 0
        assert rows[0].response_ids == qwen.encode_literal(composed) + [qwen.eos_id]
        assert met["xt/verdict_kept_frac"] == 1.0                       # re-verified: still wrong

    qpol = mini.pols[QWEN]
    nfd = says(qpol, "caf", "e", "\u0301", ": 12+34=47")
    back = peer_group(mini, QWEN, [nfd])
    assert back.rollouts[0].text == text                                  # a Qwen3 peer can write NFD too
    local, rows, met = exchange(mini, SMOL, back, f"xt.lossy={lossy}")
    smol = mini.pols[SMOL]
    assert met["xt/lossy_normalized"] == 0 and met["xt/lossless_frac"] == 1.0
    assert smol.decode(rows[0].response_ids[:-1]) == text


@pytest.mark.parametrize("peer,learner", DIRECTIONS)
@pytest.mark.parametrize("lossy", ["drop", "keep"])
def test_a_response_cut_mid_character(mini, peer, learner, lossy):
    """The peer's length limit falls inside a character: its text ends in U+FFFD, which the peer never wrote (lossy
    ``partial_char``). drop: dropped and counted; keep: the learner's tokens of the text without it, no EOS (the
    response did not stop), ``finish_reason`` still "length"."""
    ppol, lpol = mini.pols[peer], mini.pols[learner]
    first = ppol.encode_literal(CUT_CHAR[peer])[:1]
    group = peer_group(mini, peer, [says(ppol, "12+34=47 ", first, eos=False)])
    cut = group.rollouts[0]
    assert cut.finish_reason == "length" and cut.text == "12+34=47 \ufffd"
    local, rows, met = exchange(mini, learner, group, f"xt.lossy={lossy}")
    assert met["xt/lossy_partial_char"] == 1 and met["xt/lossy_normalized"] == met["xt/lossy_other"] == 0
    if lossy == "drop":
        assert local[0].dropped == "lossy_partial_char" and 0 not in rows
    else:
        assert local[0].text == "12+34=47 " and local[0].finish_reason == "length"
        assert rows[0].response_ids == lpol.encode_literal("12+34=47 ")      # no U+FFFD, no EOS
        assert met["xt/verdict_kept_frac"] == 1.0 and met["xt/verdict_changed"] == 0


@pytest.mark.parametrize("peer,learner", DIRECTIONS)
def test_a_kept_response_whose_verdict_changes_is_dropped(mini, peer, learner):
    """``12+34=46`` + a cut character reads as no answer (the peer's verdict: wrong); kept without the U+FFFD it reads
    46 (right): the peer's advantage was for the other verdict, so it is dropped, and counted."""
    ppol = mini.pols[peer]
    group = peer_group(mini, peer, [says(ppol, "12+34=46", ppol.encode_literal(CUT_CHAR[peer])[:1], eos=False)])
    assert not group.rollouts[0].correct
    local, rows, met = exchange(mini, learner, group, "xt.lossy=keep")
    assert local[0].dropped == "verdict_changed" and 0 not in rows
    assert met["xt/verdict_changed"] == 1 and met["xt/verdict_kept_frac"] == pytest.approx(2 / 3)


def test_a_character_the_learners_vocabulary_cannot_spell_is_lossy_other(mini):
    """A vocabulary that cannot spell a character (the micro pair's character tokenizer, which has no é) decodes to
    another text: lossy ``other``, dropped, never an UNK id trained on."""
    cfg = load_config(pair="micro", algo="graft", overrides=["peer.source=online", "run.track=false", "algo.delta=0"])
    char = build_policy(next(m for m in cfg.pair.models if m.id == "micro-qwen-char"), cfg)
    assert char.decode(char.encode_literal("café")) != "café"
    group = peer_group(mini, SMOL, [says(mini.pols[SMOL], "café 12+34=47")])
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=char, engine=None, env=mini.env,
                      rng=random.Random(0))
    local = ctx.localize([group])[0].rollouts
    assert local[0].dropped == "lossy_other" and not local[1].dropped
    assert ctx.metrics["xt/lossy_other"] == 1 and ctx.metrics["xt/dropped"] == 1


# ------------------------------------------------------------------------------------------------
# 4. EOS and stop strings, leading whitespace, \boxed{} split otherwise
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("peer,learner", DIRECTIONS)
def test_eos_and_stop_strings(mini, peer, learner):
    """A response the peer ended with its EOS has no EOS in its text and gets the learner's; one the engine ended at
    a stop string (the plain template's ``\\nProblem:``) loses the stop text and gets the learner's EOS; one cut for
    length gets none."""
    ppol, lpol = mini.pols[peer], mini.pols[learner]
    assert lpol.stop_strings == ppol.stop_strings and "\nProblem:" in lpol.stop_strings
    seqs = [says(ppol, "12+34=46"), says(ppol, "12+34=\\boxed{46}\nProblem: 7+8=15", eos=False),
            says(ppol, "12+34=4", eos=False)]
    group = peer_group(mini, peer, seqs)
    eos_r, stop_r, long_r = group.rollouts[:3]
    assert (eos_r.finish_reason, stop_r.finish_reason, long_r.finish_reason) == ("stop", "stop", "length")
    assert eos_r.token_ids[-1] == ppol.eos_id and eos_r.text == "12+34=46"
    assert stop_r.text.startswith("12+34=\\boxed{46}\nProblem:") and stop_r.token_ids[-1] != ppol.eos_id
    local, rows, met = exchange(mini, learner, group)
    eos = lpol.eos_id
    assert rows[0].response_ids == lpol.encode_literal("12+34=46") + [eos]
    assert local[1].text == "12+34=\\boxed{46}"
    assert rows[1].response_ids == lpol.encode_literal("12+34=\\boxed{46}") + [eos]
    assert rows[2].response_ids == lpol.encode_literal("12+34=4") and eos not in rows[2].response_ids
    assert met["xt/lossless_frac"] == 1.0 and met["xt/verdict_kept_frac"] == 1.0   # the cut one verified again


@pytest.mark.parametrize("peer,learner", DIRECTIONS)
def test_leading_whitespace_is_kept_and_none_is_added(mini, peer, learner):
    """`` 12+34=46`` keeps its leading space as the learner's first token; ``12+34=46`` gets no prefix space."""
    ppol, lpol = mini.pols[peer], mini.pols[learner]
    group = peer_group(mini, peer, [says(ppol, " 12+34=46"), says(ppol, "  12+34=46"), says(ppol, "12+34=46")])
    _, rows, _ = exchange(mini, learner, group)
    for i, text in enumerate([" 12+34=46", "  12+34=46", "12+34=46"]):
        body = rows[i].response_ids[:-1]
        assert lpol.decode(body) == text
    assert lpol.decode(rows[0].response_ids[:1]) == " "
    assert not lpol.decode(rows[2].response_ids[:1]).startswith(" ")


@pytest.mark.parametrize("peer,learner", DIRECTIONS)
def test_boxed_split_otherwise_keeps_its_verdict(mini, peer, learner):
    """``\\boxed{46}`` is 5 SmolLM3 tokens (46 one token) and 6 Qwen3 tokens (one a digit): the learner's text is the
    peer's, and the task's verdict on it is the peer's."""
    ppol, lpol = mini.pols[peer], mini.pols[learner]
    assert {len(p.encode_literal("\\boxed{46}")) for p in (ppol, lpol)} == {5, 6}
    texts = ["So 12+34=\\boxed{46}", "So 12+34=\\boxed{47}", "\\boxed{ 46 }"]
    group = peer_group(mini, peer, [says(ppol, t) for t in texts])
    _, rows, met = exchange(mini, learner, group)
    for i, text in enumerate(texts):
        carried = lpol.decode(rows[i].response_ids[:-1])
        assert carried == text
        assert mini.env.score_batch([PROMPT], [carried])[0].correct == group.rollouts[i].correct
    assert [r.correct for r in group.rollouts[:3]] == [True, False, True]
    assert met["xt/verdict_kept_frac"] == 1.0


# ------------------------------------------------------------------------------------------------
# the metrics on a worked example (docs/algorithms.md#exchange-rules-for-real-vocabularies)
# ------------------------------------------------------------------------------------------------

def worked_group(mini, peer):
    """Six responses and the two fillers: right; right, ended at a stop string; wrong, NFD; wrong with a leading
    space; 46 + a cut character (no answer: wrong; without it right); wrong + a cut character."""
    p = mini.pols[peer]
    cut = p.encode_literal(CUT_CHAR[peer])[:1]
    return peer_group(mini, peer, [
        says(p, "12+34=46"), says(p, "12+34=\\boxed{46}\nProblem: 1+1", eos=False),
        says(p, "caf", "e", "\u0301", " 47"), says(p, " 12+34=48"), says(p, "12+34=46", cut, eos=False),
        says(p, "12+34=49 ", cut, eos=False)])


WORKED = {  # (direction, xt.lossy) -> the xt/* metrics of worked_group's 8 responses
    (SMOL, "drop"): {"xt/responses": 8, "xt/lossless_frac": 5 / 8, "xt/lossy_normalized": 1,
                     "xt/lossy_partial_char": 2, "xt/lossy_other": 0, "xt/dropped": 3, "xt/verdict_changed": 0,
                     "xt/verdict_kept_frac": 1.0},
    (SMOL, "keep"): {"xt/responses": 8, "xt/lossless_frac": 5 / 8, "xt/lossy_normalized": 1,
                     "xt/lossy_partial_char": 2, "xt/lossy_other": 0, "xt/dropped": 1, "xt/verdict_changed": 1,
                     "xt/verdict_kept_frac": 7 / 8},
    (QWEN, "drop"): {"xt/responses": 8, "xt/lossless_frac": 6 / 8, "xt/lossy_normalized": 0,
                     "xt/lossy_partial_char": 2, "xt/lossy_other": 0, "xt/dropped": 2, "xt/verdict_changed": 0,
                     "xt/verdict_kept_frac": 1.0},
    (QWEN, "keep"): {"xt/responses": 8, "xt/lossless_frac": 6 / 8, "xt/lossy_normalized": 0,
                     "xt/lossy_partial_char": 2, "xt/lossy_other": 0, "xt/dropped": 1, "xt/verdict_changed": 1,
                     "xt/verdict_kept_frac": 7 / 8},
}


@pytest.mark.parametrize("peer,learner", DIRECTIONS)
@pytest.mark.parametrize("lossy", ["drop", "keep"])
def test_the_worked_example_metrics(mini, peer, learner, lossy):
    """SmolLM3 -> Qwen3: lossless 5 of 8 (the NFD one is normalized, two cut mid-character). drop: those 3 dropped,
    the 5 carried keep their verdicts (the stop-cut one verified again). keep: the 8 carried, the one that reads 46
    without its U+FFFD changes verdict and is dropped: 7/8. Qwen3 -> SmolLM3: the NFD text is lossless (6 of 8)."""
    group = worked_group(mini, peer)
    assert [r.correct for r in group.rollouts] == [True, True, False, False, False, False, True, False]
    local, rows, met = exchange(mini, learner, group, f"xt.lossy={lossy}")
    assert {k: met[k] for k in WORKED[peer, lossy]} == pytest.approx(WORKED[peer, lossy])
    assert len(rows) == 8 - WORKED[peer, lossy]["xt/dropped"]
    assert met["xt/token_count_ratio"] == pytest.approx(sum(r.token_count for r in local)
                                                        / sum(r.origin.token_count for r in local))


def quantile(values: list, q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation between the order statistics."""
    xs = sorted(values)
    at = q * (len(xs) - 1)
    lo = int(at)
    return xs[lo] + (at - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def test_graft_logs_the_admitted_fraction_and_the_score_spread(mini):
    """GRAFT's gate (delta 0.8) on the worked group, the peer's mean log-probs set so that l_L - l_P of the 5 carried
    responses is +0.1, -0.1, -0.3, 0, -0.2 (s = 1.105, 0.905, 0.741, 1, 0.819): 4 of the 8 grafted responses
    admitted (``peer/admit_rate`` 0.5; the 3 lossy ones are dropped, the 0.741 one rejected), ``peer/s_admitted_*``
    the mean, min and max of the admitted s, ``peer/s_q10`` / ``peer/s_q90`` the percentiles of the 5 scored."""
    group = worked_group(mini, SMOL)
    local, _, _ = exchange(mini, QWEN, group)  # the learner's l_L of each response (delta 0)
    offsets = {0: 0.1, 1: -0.1, 3: -0.3, 6: 0.0, 7: -0.2}
    for i, off in offsets.items():
        r = group.rollouts[i]
        group.rollouts[i] = replace(r, logprobs=[local[i].mean_logp - off] * len(r.token_ids))
    _, rows, met = exchange(mini, QWEN, group, "algo.delta=0.8")
    s = [math.exp(v) for v in offsets.values()]
    admitted = [v for v in s if v >= 0.8]
    assert met["peer/admitted"] == len(admitted) == len(rows) == 4
    assert met["peer/admit_rate"] == pytest.approx(0.5)
    assert met["peer/s_admitted_min"] == pytest.approx(math.exp(-0.2))
    assert met["peer/s_admitted_max"] == pytest.approx(math.exp(0.1))
    assert met["peer/s_admitted_mean"] == pytest.approx(sum(admitted) / 4)
    assert met["peer/s_q10"] == pytest.approx(quantile(s, 0.1)) and met["peer/s_q90"] == pytest.approx(quantile(s, 0.9))
    assert met["peer/s_min"] == pytest.approx(math.exp(-0.3))
