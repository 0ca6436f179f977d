"""The formulas the peer-exchange algorithms share, as pure functions: the compatibility score and weights, the
minibatch bounds, SGT's rescue set (SGT, and GRAFT's ``select: sgt_rescue``), the cross-tokenizer token alignment (docs/algorithms.md#cross-tokenizer-exchange,
docs/algorithms.md#peer-exchange). GRAFT's, HACPO's and SGT's own formulas are in their packages
(graftzoo.algos.<name>.formulas).
"""
from __future__ import annotations

import random
from typing import Optional, Sequence

import torch
from torch import Tensor

from .core import _as_float, group_advantages

WEIGHT_MODES = ("min_s_1", "one")


def compatibility_score(learner_mean_logp: Tensor, peer_mean_logp: Tensor, clip: float = 10.0) -> Tensor:
    """Sequence-level compatibility ``s = exp(clip(l_L - l_P, -clip, clip))`` of a response under the learner
    and under the model that generated it, each a mean log-prob over its own tokenizer's tokens, EOS
    excluded (docs/algorithms.md#cross-tokenizer-exchange, docs/algorithms.md#graft-compatibility-gate; HACPO's cross ratio docs/algorithms.md#hacpo-cross-sample-loss is the same quantity with the
    learner's current parameters). Differentiable in both arguments."""
    return torch.exp((learner_mean_logp - peer_mean_logp).clamp(min=-clip, max=clip))


def compatibility_weights(learner_mean_logp, peer_mean_logp, delta: float = 0.8, weight: str = "min_s_1",
                          clip: float = 10.0) -> tuple[Tensor, Tensor]:
    """GRAFT sequence-level compatibility score and weight (docs/algorithms.md#graft-compatibility-gate).

    ``s = exp(clip(l_L - l_P, -clip, clip))`` from the learner's and the peer's ``theta_old`` mean
    log-probs of the same text (each over its own tokenizer's length, EOS excluded). A response is
    admitted iff ``s >= delta``; ``w = min(s, 1)`` (``weight="min_s_1"``) or ``1`` (``weight="one"``)
    when admitted, else 0. ``delta = 0`` is the "w/o compatibility gate" ablation (docs/algorithms.md#graft-ablations).
    Returns detached ``(s, w)`` tensors.
    """
    if weight not in WEIGHT_MODES:
        raise ValueError(f"compatibility_weights: weight={weight!r}; expected one of {WEIGHT_MODES}")
    lL = torch.as_tensor(learner_mean_logp, dtype=torch.float64).detach()
    lP = torch.as_tensor(peer_mean_logp, dtype=torch.float64).detach()
    if lL.shape != lP.shape:
        raise ValueError(f"compatibility_weights: learner shape {tuple(lL.shape)} != peer shape {tuple(lP.shape)}")
    s = compatibility_score(lL, lP, clip)
    admitted = s >= delta
    w = s.clamp(max=1.0) if weight == "min_s_1" else torch.ones_like(s)
    return s, torch.where(admitted, w, torch.zeros_like(w))


def _check_lengths(where: str, **seqs) -> int:
    lens = {k: len(v) for k, v in seqs.items()}
    if len(set(lens.values())) > 1:
        raise ValueError(f"{where}: inputs differ in length: {lens}")
    return next(iter(lens.values()))


def minibatch_bounds(n_slots: int, num_minibatches: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` minibatch ranges over ``n_slots`` slots; sizes differ by at most one,
    larger ones first (docs/algorithms.md#graft-peer-last-order: 128 slots / 4 minibatches of 32)."""
    if num_minibatches < 1:
        raise ValueError(f"minibatch_bounds: num_minibatches must be >= 1, got {num_minibatches}")
    base, extra = divmod(n_slots, num_minibatches)
    bounds, start = [], 0
    for j in range(num_minibatches):
        end = start + base + (1 if j < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def align_peer_logprobs(learner_offsets: Sequence[tuple[int, int]], peer_offsets: Sequence[tuple[int, int]],
                        peer_logprobs: Sequence[float]) -> list[float]:
    """Peer log-probs mapped onto learner tokens by character-offset overlap (option T2, see
    docs/algorithms.md#graft-loss-and-token-ratio): for a learner token with span ``[a, b)``,
    ``log pi~P = sum_q log pi_P(q) * |[a,b) & span(q)| / |span(q)|``.

    Offsets are ``(start, end)`` character spans of the same text in each tokenizer, with starts and
    ends non-decreasing. Zero-width peer tokens (specials) carry no characters and contribute nothing;
    a zero-width learner token gets 0. Use the result as ``old_logp`` in :func:`clipped_surrogate`.
    """
    if len(peer_offsets) != len(peer_logprobs):
        raise ValueError(f"align_peer_logprobs: {len(peer_offsets)} peer offsets but {len(peer_logprobs)} "
                         f"peer log-probs")
    for name, offs in (("learner_offsets", learner_offsets), ("peer_offsets", peer_offsets)):
        for i, (a, b) in enumerate(offs):
            if b < a:
                raise ValueError(f"align_peer_logprobs: {name}[{i}]=({a}, {b}) has end < start")
            if i and (a < offs[i - 1][0] or b < offs[i - 1][1]):
                raise ValueError(f"align_peer_logprobs: {name}[{i}]=({a}, {b}) goes backwards after "
                                 f"{tuple(offs[i - 1])}")
    out, first = [], 0
    n_peer = len(peer_offsets)
    for a, b in learner_offsets:
        while first < n_peer and peer_offsets[first][1] <= a:
            first += 1
        total, q = 0.0, first
        while q < n_peer and peer_offsets[q][0] < b:
            qa, qb = peer_offsets[q]
            overlap = min(b, qb) - max(a, qa)
            if qb > qa and overlap > 0:
                total += float(peer_logprobs[q]) * overlap / (qb - qa)
            q += 1
        out.append(total)
    return out


SGT_GATES = ("all_fail", "threshold")


def sgt_rescue(learner_correct: Sequence[int], G_learner: Sequence[int],
               peer_successes: Sequence[Optional[Sequence[int]]], rng: random.Random, k_inj: int = 1,
               gate: str = "all_fail", tau: float = 0.0) -> dict[int, list[int]]:
    """SGT rescue set with the K_inj cap (docs/algorithms.md#sgt).

    A prompt is rescued iff the learner gate holds (``gate="all_fail"``: ``c_L = 0``;
    ``gate="threshold"``: ``c_L / G_L <= tau``) and the peer has at least one verified success.
    ``peer_successes[x]`` lists the peer response indices that are correct (None = peer group missing).
    Returns ``{prompt index: sorted peer response indices}``, at most ``k_inj`` drawn at random per prompt.
    """
    if gate not in SGT_GATES:
        raise ValueError(f"sgt_rescue: gate={gate!r}; expected one of {SGT_GATES}")
    if k_inj < 1:
        raise ValueError(f"sgt_rescue: k_inj must be >= 1, got {k_inj}")
    _check_lengths("sgt_rescue", learner_correct=learner_correct, G_learner=G_learner,
                   peer_successes=peer_successes)
    out = {}
    for x, (cl, gl, succ) in enumerate(zip(learner_correct, G_learner, peer_successes)):
        if gl <= 0 or not succ:
            continue
        gated = cl == 0 if gate == "all_fail" else cl / gl <= tau
        if gated:
            out[x] = sorted(rng.sample(list(succ), min(k_inj, len(succ))))
    return out


def sgt_augment(learner_rewards, learner_correct: Sequence[bool], injected_rewards, rng: random.Random,
                eps: float = 1e-6) -> tuple[list[int], Tensor, Tensor]:
    """SGT group augmentation (docs/algorithms.md#sgt, ``sgt.mode=augment``).

    Replaces ``len(injected_rewards)`` of the learner's failed responses, chosen at random, with the
    injected peer successes (group size unchanged) and recomputes GRPO advantages on the augmented
    group. Returns ``(replaced positions (sorted), augmented rewards [G], advantages [G])``; the
    injected responses take the returned positions in order.
    """
    r = _as_float(learner_rewards, "learner_rewards").clone()
    inj = _as_float(injected_rewards, "injected_rewards").to(r.dtype)
    if len(learner_correct) != r.numel():
        raise ValueError(f"sgt_augment: {len(learner_correct)} correctness flags for {r.numel()} rewards")
    failed = [i for i, c in enumerate(learner_correct) if not c]
    if inj.numel() > len(failed):
        raise ValueError(f"sgt_augment: {inj.numel()} injected responses but only {len(failed)} failures "
                         f"to replace")
    pos = sorted(rng.sample(failed, inj.numel()))
    if pos:
        r[pos] = inj
    adv = group_advantages(r, torch.zeros(r.numel(), dtype=torch.long), eps=eps)
    return pos, r, adv


__all__ = ["compatibility_weights", "minibatch_bounds", "align_peer_logprobs", "compatibility_score", "sgt_rescue",
           "sgt_augment"]
