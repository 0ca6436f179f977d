"""Cross-tokenizer exchange "XT" (spec algos_peer §1.4, edge cases §4.5).

Peer responses travel as text. The learner re-renders the prompt with its own template, re-tokenizes
the response (``add_special_tokens=False``) and scores it once under its current (theta_old)
parameters. Mean log-probs are per tokenizer, each over its own token count, EOS excluded.
"""
from __future__ import annotations

import copy

import torch

from graftzoo.core.types import Group, Rollout


class XTOverflowError(ValueError):
    pass


def localize_rollout(policy, prompt_ids: list, r: Rollout, max_response: int, overflow: str = "drop",
                     append_eos: bool = True) -> Rollout:
    """One peer rollout as a learner rollout (logprobs filled in later by ``score_rollouts``)."""
    ids = policy.encode_text(r.text)
    stopped = r.finish_reason == "stop" and len(ids) <= max_response  # a truncated response did not stop
    dropped = None
    if not ids and r.finish_reason != "stop":
        dropped = "empty"
    if len(ids) > max_response:
        if overflow == "error":
            raise XTOverflowError(f"peer response of {len(ids)} tokens for prompt {r.prompt_id} exceeds "
                                  f"{policy.model_id}'s max response {max_response} (xt.overflow=error)")
        if overflow == "truncate":
            ids = ids[:max_response]
        else:
            dropped = "overflow"
    if stopped and (append_eos or not ids):  # a terminal-only response becomes [EOS]
        ids = ids + [policy.eos_id]
    meta = {"origin_model": r.model_id, "origin_mean_logp": r.mean_logp, "origin_token_count": r.token_count,
            "origin_tokenizer": r.meta.get("tokenizer_id"), "dropped": dropped}
    for key in ("advantage",):
        if key in r.meta:
            meta[key] = r.meta[key]
    return Rollout(prompt_id=r.prompt_id, model_id=r.model_id, policy_version=r.policy_version, text=r.text,
                   token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=r.finish_reason,
                   prompt_token_ids=list(prompt_ids), eos_id=policy.eos_id, reward=r.reward, correct=r.correct,
                   extracted=r.extracted, status=r.status, meta=meta)


@torch.no_grad()
def score_rollouts(policy, rollouts: list, chunk: int = 256):
    """Fill ``logprobs`` of rollouts (learner token ids) with the policy's current log-probs."""
    from graftzoo.algos.base import TrainBatch, TrainRow
    todo = [r for r in rollouts if r.token_ids]
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        rows = [TrainRow(r.prompt_token_ids, r.token_ids, [0.0] * len(r.token_ids), [1.0] * len(r.token_ids),
                         [0.0] * len(r.token_ids), 0.0, 1.0, True, 0, r) for r in part]
        mb = TrainBatch(rows, [], pad_id=policy.pad_id).minibatch(range(len(rows)))
        was = policy.model.training
        policy.model.eval()
        logp, _ = policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
        policy.model.train(was)
        for b, r in enumerate(part):
            r.logprobs = logp[b, :len(r.token_ids)].tolist()


def localize_groups(policy, groups: list, cfg: dict):
    """Localize every rollout of ``groups`` that another model generated; returns (groups, stats)."""
    overflow = cfg["xt"]["overflow"]
    append_eos = bool(cfg["xt"]["append_eos_if_stopped"])
    max_response = int(getattr(policy, "max_response_tokens", cfg["rollout"]["max_new_tokens"]))
    out, todo = [], []
    same_tok, mismatch = 0, 0
    for g in groups:
        prompt_ids = policy.encode_prompt(g.prompt)
        rolls = []
        for r in g.rollouts:
            if r.model_id == policy.model_id and r.meta.get("tokenizer_id") == policy.tokenizer_id:
                rolls.append(r)
                continue
            lr = localize_rollout(policy, prompt_ids, r, max_response, overflow, append_eos)
            if r.meta.get("tokenizer_id") == policy.tokenizer_id and "stored_step" not in r.meta:
                same_tok += 1
                body = r.body_ids
                mismatch += int(policy.encode_text(r.text) != list(body))
            rolls.append(lr)
            todo.append(lr)
        ng = copy.copy(g)
        ng.rollouts = rolls
        out.append(ng)
    score_rollouts(policy, [r for r in todo if not r.meta.get("dropped")])
    stats = {"xt/responses": len(todo), "xt/dropped": sum(1 for r in todo if r.meta.get("dropped"))}
    if same_tok:
        stats["xt/id_mismatch_rate"] = mismatch / same_tok
    if todo:
        peer_tok = sum(r.meta["origin_token_count"] for r in todo)
        stats["xt/token_count_ratio"] = sum(r.token_count for r in todo) / peer_tok if peer_tok else None
    return out, stats
