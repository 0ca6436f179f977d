"""Cross-tokenizer exchange "XT" (docs/algorithms.md#cross-tokenizer-exchange, edge cases docs/algorithms.md#graft-edge-cases).

Peer responses travel as text. The learner re-renders the prompt with its own template, re-tokenizes
the response (``add_special_tokens=False``) and scores it once under its current (theta_old)
parameters. Mean log-probs are per tokenizer, each over its own token count, EOS excluded.

The learner's EOS is appended to a response the peer stopped (not to one cut for length) and counts toward the
learner's max response. ``xt.overflow`` (docs/algorithms.md#graft-edge-cases): a response longer than the learner's
max response, or whose prompt in the learner's template is longer than ``rollout.max_prompt_tokens``, is dropped
(``drop``, default; reasons ``overflow`` / ``prompt_overflow``, counted in ``xt/dropped``), cut to the limit
(``truncate``: HACPO's code; a response keeps its first tokens, without EOS, a prompt its last tokens) or an error
(``error``). A stored response (``origin`` set) carries no token ids: it is always re-tokenized from its text.
"""
from __future__ import annotations

import copy
import dataclasses

from graftzoo.contract import metrics as M
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.types import Origin, Rollout


class XTOverflowError(ValueError):
    pass


def localize_rollout(policy, prompt_ids: list, r: Rollout, max_response: int, overflow: str = "drop",
                     append_eos: bool = True, prompt_overflow: bool = False) -> Rollout:
    """One peer rollout as a learner rollout (role "peer"; logprobs filled in by ``score_rollouts``).
    ``prompt_overflow``: the learner's rendering of the prompt is over its limit (``prompt_ids`` are its
    last tokens)."""
    ids = policy.encode_text(r.text)
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
    if eos:  # a terminal-only response becomes [EOS]
        ids = ids + [policy.eos_id]
    origin = Origin(model_id=r.model_id, tokenizer_id=r.tokenizer_id, mean_logp=r.mean_logp,
                    token_count=r.token_count, stored_step=r.origin.stored_step if r.origin else None)
    return Rollout(prompt_id=r.prompt_id, model_id=r.model_id, policy_version=r.policy_version, text=r.text,
                   token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish,
                   prompt_token_ids=list(prompt_ids), eos_id=policy.eos_id, reward=r.reward, correct=r.correct,
                   extracted=r.extracted, status=r.status, tokenizer_id=policy.tokenizer_id, role="peer",
                   origin=origin, dropped=dropped)


def score_rollouts(policy, rollouts: list, chunk: int = 256):
    """Fill ``logprobs`` of rollouts (learner token ids) with the policy's current log-probs."""
    todo = [r for r in rollouts if r.token_ids]
    if todo:
        logps, _ = policy.score_sequences([r.prompt_token_ids for r in todo], [r.token_ids for r in todo],
                                          chunk=chunk)
        for r, lp in zip(todo, logps):
            r.logprobs = lp


def localize_groups(policy, groups: list, run: LearnerFacts):
    """Localize every rollout of ``groups`` for ``policy``; returns (groups, stats).

    A rollout already in the learner's model and tokenizer keeps its ids and log-probs (it only takes
    the role "peer"); every other one is re-tokenized and scored under theta_old.
    """
    overflow = run.xt.overflow
    append_eos = run.xt.append_eos_if_stopped
    max_response = int(getattr(policy, "max_response_tokens", run.max_new_tokens))
    out, todo = [], []
    same_tok, mismatch = 0, 0
    for g in groups:
        full = policy.encode_text(policy.render(g.prompt))  # = Policy.encode_prompt before its cut
        prompt_ids, long_prompt = full[-policy.max_prompt_tokens:], len(full) > policy.max_prompt_tokens
        rolls = []
        for r in g.rollouts:
            if r.model_id == policy.model_id and r.tokenizer_id == policy.tokenizer_id and r.origin is None:
                rolls.append(dataclasses.replace(r, role="peer"))  # a live rollout of this very model
                continue
            lr = localize_rollout(policy, prompt_ids, r, max_response, overflow, append_eos, long_prompt)
            if r.tokenizer_id == policy.tokenizer_id and r.origin is None:
                same_tok += 1
                mismatch += int(policy.encode_text(r.text) != list(r.body_ids))
            rolls.append(lr)
            todo.append(lr)
        ng = copy.copy(g)
        ng.rollouts = rolls
        out.append(ng)
    score_rollouts(policy, [r for r in todo if not r.dropped])
    stats = {M.XT_RESPONSES: len(todo), M.XT_DROPPED: sum(1 for r in todo if r.dropped),
             M.XT_DROPPED_PROMPT_OVERFLOW: sum(1 for r in todo if r.dropped == "prompt_overflow")}
    if same_tok:
        stats[M.XT_ID_MISMATCH_RATE] = mismatch / same_tok
    if todo:
        peer_tok = sum(r.origin.token_count for r in todo)
        stats[M.XT_TOKEN_COUNT_RATIO] = sum(r.token_count for r in todo) / peer_tok if peer_tok else None
    return out, stats
