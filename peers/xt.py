"""Cross-tokenizer exchange "XT" (docs/algorithms.md#cross-tokenizer-exchange, edge cases docs/algorithms.md#graft-edge-cases,
real vocabularies docs/algorithms.md#exchange-rules-for-real-vocabularies).

Peer responses travel as text. The learner re-renders the prompt with its own template, re-tokenizes the response
literally (``Policy.encode_literal``: no added token, special or not, is matched, so a peer that writes
``<|endoftext|>`` or ``<think>`` as text never puts an added id or an EOS into the learner's tokens) and scores it once
under its current (theta_old) parameters. Mean log-probs are per tokenizer, each over its own token count, EOS
excluded.

The learner's EOS is appended to a response the peer stopped (not to one cut for length) and counts toward the
learner's max response; the peer's stop text (the first of the learner's stop strings in a stopped response, and
what follows it) is cut off first. ``xt.overflow`` (docs/algorithms.md#graft-edge-cases): a response longer than the
learner's max response, or whose prompt in the learner's template is longer than ``rollout.max_prompt_tokens``, is
dropped (``drop``, default; reasons ``overflow`` / ``prompt_overflow``, counted in ``xt/dropped``), cut to the limit
(``truncate``: HACPO's code; a response keeps its first tokens, without EOS, a prompt its last tokens) or an error
(``error``). A stored response (``origin`` set) carries no token ids: it is always re-tokenized from its text.

``xt.lossy`` (docs/algorithms.md#exchange-rules-for-real-vocabularies): a response whose learner ids do not decode to
its text (reasons ``normalized``: the learner's normalizer changed it; ``partial_char``: cut for length
mid-character, its text ending in U+FFFD; ``other``) is dropped (``drop``, default) or kept as the learner's tokens of
the text they decode to (``keep``). A response carried with another text than the one the peer's verdict was given on
(its stop text cut, or lossy and kept) is verified again (``rescore``: the task's ``score_batch``); one whose verdict
changes is dropped (``verdict_changed``). Everything is counted per step (``xt/*``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from graftzoo.contract import metrics as M
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.types import Origin, Rollout

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole UTF-8 character
LOSSY_REASONS = tuple(M.XT_LOSSY)  # normalized, partial_char, other


class XTOverflowError(ValueError):
    pass


def cut_stop_text(text: str, stop_strings) -> str:
    """``text`` before the first occurrence of any of ``stop_strings`` (itself when none occurs)."""
    found = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
    return text[:min(found)] if found else text


def transfer_text(policy, r: Rollout, added: frozenset = frozenset()) -> tuple[str, list, Optional[str]]:
    """``(text, ids, lossy reason or None)``: the peer response ``r`` as the learner carries it
    (docs/algorithms.md#exchange-rules-for-real-vocabularies). A stopped response loses its stop text; ids are the
    literal encoding of what is left (without a trailing U+FFFD of a response cut for length); ``text`` is their
    decoding. The reason is ``partial_char`` (that U+FFFD), ``normalized`` (the decoding is the learner's normalization
    of the text) or ``other`` (any other decoding, or an added id among the ids: ``added``)."""
    text = cut_stop_text(r.text, policy.stop_strings) if r.finish_reason == "stop" else r.text
    reason = None
    if r.finish_reason == "length" and text.endswith(REPLACEMENT):
        reason, text = "partial_char", text.rstrip(REPLACEMENT)
    ids = policy.encode_literal(text)
    back = policy.decode(ids)
    if reason is None and added.intersection(ids):
        reason = "other"
    elif reason is None and back != text:
        reason = "normalized" if back == policy.normalize_text(text) else "other"
    return back, ids, reason


def localize_rollout(policy, prompt_ids: list, r: Rollout, max_response: int, overflow: str = "drop",
                     append_eos: bool = True, prompt_overflow: bool = False, lossy: str = "drop",
                     added: frozenset = frozenset()) -> tuple[Rollout, Optional[str]]:
    """One peer rollout as a learner rollout (role "peer"; logprobs filled in by ``score_rollouts``) and its lossy
    reason (None: lossless). ``prompt_overflow``: the learner's rendering of the prompt is over its limit
    (``prompt_ids`` are its last tokens)."""
    text, ids, reason = transfer_text(policy, r, added)
    eos = r.finish_reason == "stop" and (append_eos or not ids)  # a stopped response ends in the learner's EOS
    dropped = None
    if not ids and r.finish_reason != "stop":
        dropped = "empty"
    if prompt_overflow:
        if overflow == "error":
            raise XTOverflowError(f"prompt {r.prompt_id} is longer than {policy.model_id}'s max prompt "
                                  f"{policy.max_prompt_tokens} tokens (xt.overflow=error)")
        if overflow != "truncate":
            dropped = "prompt_overflow"  # truncating would change what the reward verified (docs/algorithms.md#graft-edge-cases)
    finish = r.finish_reason
    if len(ids) + eos > max_response:  # the appended EOS counts toward the learner's limit
        if overflow == "error":
            raise XTOverflowError(f"peer response of {len(ids) + eos} tokens{' (EOS included)' if eos else ''} for "
                                  f"prompt {r.prompt_id} exceeds {policy.model_id}'s max response {max_response} "
                                  f"(xt.overflow=error)")
        if overflow == "truncate":  # its first max_response tokens; a cut response did not stop: no EOS
            ids, eos, finish = ids[:max_response], False, "length"
        elif dropped is None:
            dropped = "overflow"
    if reason is not None and lossy == "drop" and dropped is None:
        dropped = f"lossy_{reason}"
    if eos:  # a terminal-only response becomes [EOS]
        ids = ids + [policy.eos_id]
    origin = Origin(model_id=r.model_id, tokenizer_id=r.tokenizer_id, mean_logp=r.mean_logp,
                    token_count=r.token_count, stored_step=r.origin.stored_step if r.origin else None)
    return Rollout(prompt_id=r.prompt_id, model_id=r.model_id, policy_version=r.policy_version, text=text,
                   token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish,
                   prompt_token_ids=list(prompt_ids), eos_id=policy.eos_id, reward=r.reward, correct=r.correct,
                   extracted=r.extracted, status=r.status, tokenizer_id=policy.tokenizer_id, role="peer",
                   origin=origin, dropped=dropped), reason


def score_rollouts(policy, rollouts: list, chunk: int = 256) -> list:
    """The rollouts (learner token ids) with ``logprobs`` the policy's current log-probs (new rollouts; one without
    tokens as it is)."""
    todo = [i for i, r in enumerate(rollouts) if r.token_ids]
    out = list(rollouts)
    if todo:
        logps, _ = policy.score_sequences([rollouts[i].prompt_token_ids for i in todo],
                                          [rollouts[i].token_ids for i in todo], chunk=chunk)
        for i, lp in zip(todo, logps):
            out[i] = dataclasses.replace(rollouts[i], logprobs=lp)
    return out


def check_verdicts(done: list, rescore: Optional[Callable]) -> tuple[list, set]:
    """Verify again the carried responses whose text is not the one the peer's verdict was given on (``done``:
    ``(prompt, peer rollout, localized rollout, lossy reason)``; a lossy response dropped is not carried). Returns, for
    each carried response, whether its verdict held, and the indices in ``done`` of those whose verdict changed (to
    be dropped: ``verdict_changed``). ``rescore(prompts, texts)``: the task's ``score_batch`` (results with
    ``.correct``)."""
    carried = [(k, p, r, lr) for k, (p, r, lr, _) in enumerate(done) if not (lr.dropped or "").startswith("lossy_")]
    again = [(k, p, r, lr) for k, p, r, lr in carried if lr.text != r.text]
    if again and rescore is None:
        raise ValueError(f"{len(again)} peer response(s) are carried with another text than the one their verdict "
                         f"was given on; verifying them again needs the task's scorer (StepContext.env)")
    changed = set()
    if again:
        results = rescore([p for _, p, _, _ in again], [lr.text for *_, lr in again])
        changed = {k for (k, _, r, _), res in zip(again, results) if bool(res.correct) != bool(r.correct)}
    return [k not in changed for k, *_ in carried], changed


def localize_groups(policy, groups: list, run: LearnerFacts, rescore: Optional[Callable] = None):
    """Localize every rollout of ``groups`` for ``policy``; returns (groups, ``Carried``: what it re-tokenized, for
    the step's ``xt/*`` statistics).

    A rollout already in the learner's model and tokenizer keeps its ids and log-probs (it only takes
    the role "peer"); every other one is re-tokenized (``localize_rollout``), verified again where its text changed
    (``check_verdicts``) and scored under theta_old.
    """
    xt = run.xt
    max_response = int(getattr(policy, "max_response_tokens", run.max_new_tokens))
    added = policy.added_ids
    out, done, where = [], [], []  # done: (prompt, peer rollout, localized rollout, lossy reason), at out[gi][j]
    same_tok, mismatch = 0, 0
    for gi, g in enumerate(groups):
        full = policy.encode_text(policy.render(g.prompt))  # = Policy.encode_prompt before its cut
        prompt_ids, long_prompt = full[-policy.max_prompt_tokens:], len(full) > policy.max_prompt_tokens
        rolls = []
        for r in g.rollouts:
            if r.model_id == policy.model_id and r.tokenizer_id == policy.tokenizer_id and r.origin is None:
                rolls.append(dataclasses.replace(r, role="peer"))  # a live rollout of this very model
                continue
            lr, reason = localize_rollout(policy, prompt_ids, r, max_response, xt.overflow, xt.append_eos_if_stopped,
                                          long_prompt, xt.lossy, added)
            if r.tokenizer_id == policy.tokenizer_id and r.origin is None:
                same_tok += 1
                mismatch += int(policy.encode_literal(r.text) != list(r.body_ids))
            where.append((gi, len(rolls)))
            rolls.append(lr)
            done.append((g.prompt, r, lr, reason))
        out.append(dataclasses.replace(g, rollouts=rolls))
    held, changed = check_verdicts(done, rescore)
    done = [(p, r, dataclasses.replace(lr, dropped=lr.dropped or "verdict_changed") if k in changed else lr, why)
            for k, (p, r, lr, why) in enumerate(done)]
    kept = [k for k, d in enumerate(done) if not d[2].dropped]
    for k, lr in zip(kept, score_rollouts(policy, [done[k][2] for k in kept])):  # theta_old of the carried ones
        done[k] = (*done[k][:2], lr, done[k][3])
    for (gi, j), (_, _, lr, _) in zip(where, done):
        out[gi].rollouts[j] = lr
    return out, Carried(done, list(held), same_tok, mismatch)


@dataclasses.dataclass(frozen=True)
class Carried:
    """What localize calls re-tokenized (``localize_groups``), added up over a learner's step: (prompt, peer
    rollout, localized rollout, lossy reason) of each response, whether each carried response kept its verdict,
    and of the responses already in the learner's tokenizer, how many and how many re-encode to other ids."""

    done: list = dataclasses.field(default_factory=list)
    held: list = dataclasses.field(default_factory=list)
    same_tok: int = 0
    mismatch: int = 0

    def __add__(self, other: "Carried") -> "Carried":
        return Carried(self.done + other.done, self.held + other.held, self.same_tok + other.same_tok,
                       self.mismatch + other.mismatch)

    def stats(self) -> dict:
        """The ``xt/*`` metrics of everything carried (``xt_stats``)."""
        stats = xt_stats(self.done, self.held)
        if self.same_tok:
            stats[M.XT_ID_MISMATCH_RATE] = self.mismatch / self.same_tok
        return stats


def xt_stats(done: list, held: list) -> dict:
    """The step's ``xt/*`` counts and fractions of the re-tokenized responses ``done`` (``localize_groups``);
    ``held``: whether each carried response kept its verdict (``check_verdicts``)."""
    todo = [lr for _, _, lr, _ in done]
    reasons = [reason for *_, reason in done]
    stats = {M.XT_RESPONSES: len(todo), M.XT_DROPPED: sum(1 for r in todo if r.dropped),
             M.XT_DROPPED_PROMPT_OVERFLOW: sum(1 for r in todo if r.dropped == "prompt_overflow"),
             M.XT_VERDICT_CHANGED: len(held) - sum(held)}
    stats.update({M.XT_LOSSY[k]: reasons.count(k) for k in LOSSY_REASONS})
    if todo:
        stats[M.XT_LOSSLESS_FRAC] = reasons.count(None) / len(todo)
        peer_tok = sum(r.origin.token_count for r in todo)
        stats[M.XT_TOKEN_COUNT_RATIO] = sum(r.token_count for r in todo) / peer_tok if peer_tok else None
    if held:
        stats[M.XT_VERDICT_KEPT_FRAC] = sum(held) / len(held)
    return stats
