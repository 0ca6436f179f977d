"""Peer-exchange formulas as pure functions: GRAFT, HACPO, SGT and cross-tokenizer alignment
(docs/algorithms.md#cross-tokenizer-exchange, docs/algorithms.md#hacpo, docs/algorithms.md#sgt, docs/algorithms.md#graft, docs/algorithms.md#peer-exchange).

Selection functions work on plain per-prompt outcome counts (prompt index = position in the shared
prompt batch B_t) and return sorted prompt indices, so a learner can apply them to any data layout.
Random choices take a ``random.Random`` so a seeded run is reproducible.
"""
from __future__ import annotations

import math
import random
from typing import Optional, Sequence

import torch
from torch import Tensor

from .core import _as_float, group_advantages, group_stats

# --------------------------------------------------------------------------------------------
# GRAFT (docs/algorithms.md#graft)
# --------------------------------------------------------------------------------------------

WEIGHT_MODES = ("min_s_1", "one")
BALANCE_MODES = ("cap_pvar", "none")
PEER_POSITIONS = ("last", "first", "uniform")


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


def graft_candidates(learner_correct: Sequence[int], peer_correct: Sequence[Optional[int]],
                     G_learner: Sequence[int], G_peer: Sequence[int]) -> list[int]:
    """GRAFT candidate prompts ``C = {x : c_L(x) = 0 and 0 < c_P(x) < G_P(x)}`` (docs/algorithms.md#graft-which-groups).

    Learner all-fail (and non-empty) and peer group informative (mixed). ``peer_correct[x] = None`` means
    the peer group is missing (stored mode, docs/algorithms.md#graft-edge-cases): never a candidate. Returns sorted prompt indices.
    """
    _check_lengths("graft_candidates", learner_correct=learner_correct, peer_correct=peer_correct,
                   G_learner=G_learner, G_peer=G_peer)
    out = []
    for x, (cl, cp, gl, gp) in enumerate(zip(learner_correct, peer_correct, G_learner, G_peer)):
        if not 0 <= cl <= gl:
            raise ValueError(f"graft_candidates: prompt {x}: learner_correct={cl} outside [0, G_learner={gl}]")
        if cp is not None and not 0 <= cp <= gp:
            raise ValueError(f"graft_candidates: prompt {x}: peer_correct={cp} outside [0, G_peer={gp}]")
        if gl > 0 and cl == 0 and cp is not None and 0 < cp < gp:
            out.append(x)
    return out


def graft_cap(batch_size: int, max_peer_frac: float = 0.25) -> int:
    """Balanced-exchange cap ``floor(rho_max * |B_t|)`` (docs/algorithms.md#graft-which-groups; rho_max DERIVED 0.25)."""
    if not 0.0 <= max_peer_frac <= 1.0:
        raise ValueError(f"graft_cap: max_peer_frac must be in [0, 1], got {max_peer_frac}")
    return int(math.floor(max_peer_frac * batch_size + 1e-9))


def symmetric_cap(n_candidates_a: int, n_candidates_b: int, cap: int) -> int:
    """Symmetric exchange (``graft.balance=symmetric``): both directions use ``min(|C^A|, |C^B|, cap)``
    (docs/algorithms.md#graft-which-groups). Feed the result as ``cap`` to :func:`graft_balance` for each learner.
    """
    return max(0, min(n_candidates_a, n_candidates_b, cap))


def graft_balance(candidates: Sequence[int], peer_p: Sequence[float], cap: int, rng: random.Random,
                  mode: str = "cap_pvar") -> list[int]:
    """Balanced exchange: which candidates get replaced (docs/algorithms.md#graft-which-groups, docs/algorithms.md#graft-ablations).

    ``mode="cap_pvar"``: keep all candidates if ``|C| <= cap``, else the ``cap`` candidates with the
    largest peer outcome balance ``p(1-p)`` (``p = c_P/G_P``; values compared rounded to 12 decimals,
    ties broken by a seeded random draw). ``mode="none"``: every candidate, no cap or ranking
    ("w/o balanced exchange"). ``peer_p`` is indexed by prompt index (same indexing as ``candidates``).
    Returns sorted prompt indices.
    """
    if mode not in BALANCE_MODES:
        hint = " (for balance=symmetric use mode='cap_pvar' with cap=symmetric_cap(...))" if mode == "symmetric" else ""
        raise ValueError(f"graft_balance: mode={mode!r}; expected one of {BALANCE_MODES}{hint}")
    if cap < 0:
        raise ValueError(f"graft_balance: cap must be >= 0, got {cap}")
    cands = list(candidates)
    if mode == "none" or len(cands) <= cap:
        return sorted(cands)
    keyed = []
    for x in cands:
        p = float(peer_p[x])
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"graft_balance: peer_p[{x}]={p} outside [0, 1]")
        keyed.append((-round(p * (1.0 - p), 12), rng.random(), x))
    keyed.sort()
    return sorted(x for _, _, x in keyed[:cap])


def random_count_matched_prompts(n_prompts: int, n_xfer: int, rng: random.Random) -> list[int]:
    """Count-matched random prompt selection: ``n_xfer`` prompts uniformly from ``B_t``
    (``graft.select=random_count_matched``, docs/algorithms.md#graft-ablations). Returns sorted prompt indices."""
    if not 0 <= n_xfer <= n_prompts:
        raise ValueError(f"random_count_matched_prompts: n_xfer={n_xfer} outside [0, n_prompts={n_prompts}]")
    return sorted(rng.sample(range(n_prompts), n_xfer))


def random_count_matched_admission(admitted_mask, rng: random.Random, eligible=None):
    """Count-matched random response admission (``graft.admission=random_count_matched``, see
    docs/algorithms.md#graft-ablations).

    Admits as many responses as ``admitted_mask`` (the gate's decision) does, chosen uniformly at
    random among the step's grafted responses (or among ``eligible`` ones, e.g. to leave out responses
    dropped for overflow). Returns a mask of the same kind as the input (bool tensor or list of bool);
    the learner then weights admitted ones by ``min(s, 1)``.
    """
    is_tensor = isinstance(admitted_mask, Tensor)
    mask = [bool(v) for v in (admitted_mask.tolist() if is_tensor else admitted_mask)]
    elig = [True] * len(mask) if eligible is None else [bool(v) for v in (
        eligible.tolist() if isinstance(eligible, Tensor) else eligible)]
    if len(elig) != len(mask):
        raise ValueError(f"random_count_matched_admission: eligible has {len(elig)} entries, mask {len(mask)}")
    pool = [i for i, e in enumerate(elig) if e]
    k = sum(mask)
    if k > len(pool):
        raise ValueError(f"random_count_matched_admission: {k} admitted but only {len(pool)} eligible")
    chosen = set(rng.sample(pool, k))
    out = [i in chosen for i in range(len(mask))]
    return torch.tensor(out, dtype=torch.bool) if is_tensor else out


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


def peer_order(n_own: int, n_peer: int, mode: str = "last", num_minibatches: int = 4) -> list[int]:
    """Slot order for one optimization epoch (docs/algorithms.md#graft-peer-last-order).

    Slots ``0..n_own-1`` are own groups, ``n_own..n_own+n_peer-1`` grafted peer groups. Returns a
    permutation: position -> slot; split it with :func:`minibatch_bounds`. ``last`` (default): own then
    peer; ``first``: peer then own; ``uniform``: peer groups dealt round-robin over the minibatches
    (a full minibatch passes its turn), own groups filling the remaining room in order; within a
    minibatch own slots come first.
    """
    if mode not in PEER_POSITIONS:
        raise ValueError(f"peer_order: mode={mode!r}; expected one of {PEER_POSITIONS}")
    if n_own < 0 or n_peer < 0:
        raise ValueError(f"peer_order: negative slot count (n_own={n_own}, n_peer={n_peer})")
    own = list(range(n_own))
    peer = list(range(n_own, n_own + n_peer))
    if mode == "last":
        return own + peer
    if mode == "first":
        return peer + own
    bounds = minibatch_bounds(n_own + n_peer, num_minibatches)
    room = [e - s for s, e in bounds]
    peer_in = [[] for _ in bounds]
    j = 0
    for slot in peer:
        while len(peer_in[j]) >= room[j]:
            j = (j + 1) % len(bounds)
        peer_in[j].append(slot)
        j = (j + 1) % len(bounds)
    order, it = [], iter(own)
    for mb, pslots in enumerate(peer_in):
        order.extend(next(it) for _ in range(room[mb] - len(pslots)))
        order.extend(pslots)
    return order


def separate_minibatches(n_own: int, n_peer: int, minibatch_size: int) -> list[list[int]]:
    """``graft.peer_minibatches=separate``: own slots in ``ceil(n_own/mb)`` minibatches, then peer slots in
    their own ``ceil(n_peer/mb)`` minibatches (docs/algorithms.md#graft-peer-last-order, alternative)."""
    if minibatch_size < 1:
        raise ValueError(f"separate_minibatches: minibatch_size must be >= 1, got {minibatch_size}")
    own = list(range(n_own))
    peer = list(range(n_own, n_own + n_peer))
    return ([own[i:i + minibatch_size] for i in range(0, n_own, minibatch_size)]
            + [peer[i:i + minibatch_size] for i in range(0, n_peer, minibatch_size)])


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


# --------------------------------------------------------------------------------------------
# HACPO (docs/algorithms.md#hacpo)
# --------------------------------------------------------------------------------------------

def capability_estimate(history: Sequence[float], window: int = 5, floor: float = 1e-8,
                        default: float = 1.0) -> float:
    """Smoothed capability ``P^_t`` = mean of the last ``window`` per-step accuracies (including the
    current step), floored at ``floor``; ``default`` (1.0 in the code) before any history exists
    (docs/algorithms.md#hacpo-capability-aware-advantage)."""
    if window < 1:
        raise ValueError(f"capability_estimate: window must be >= 1, got {window}")
    if not history:
        return default
    recent = list(history)[-window:]
    return max(floor, sum(recent) / len(recent))


def capability_ratio(p_source: float, p_target: float, clamp: tuple[float, float] = (0.1, 10.0)) -> float:
    """``ratio(source=j, target=k) = clip(P^_j / P^_k, 0.1, 10)`` (docs/algorithms.md#hacpo-capability-aware-advantage, CODE)."""
    return min(max(p_source / p_target, clamp[0]), clamp[1])


def hacpo_omegas(p_hat: Sequence[float], learner: int,
                 clamp: tuple[float, float] = (0.1, 10.0)) -> tuple[Tensor, Tensor]:
    """Per-source capability coefficients for ``learner`` k (docs/algorithms.md#hacpo-capability-aware-advantage).

    Returns ``(baseline_weight, grad_coef)`` as ``[n]`` tensors indexed by source j:
    ``baseline_weight[j] = omega^(k,j) = 1/ratio(j,k)`` (used in the baseline) and
    ``grad_coef[j] = omega^(j,k) = ratio(j,k)`` (the discrepancy coefficient); both are 1 for j = k.
    """
    if not 0 <= learner < len(p_hat):
        raise ValueError(f"hacpo_omegas: learner={learner} outside the {len(p_hat)} agents")
    ratio = torch.tensor([capability_ratio(p, p_hat[learner], clamp) for p in p_hat], dtype=torch.float64)
    ratio[learner] = 1.0
    return 1.0 / ratio, ratio


def hacpo_advantages(rewards, group_index, source, learner: int, baseline_weight, eps: float = 1e-6,
                     uniform_reward_guard: bool = True, binary_baseline_guard: bool = True) -> Tensor:
    """HACPO capability-aware advantage for learner k over pooled groups (docs/algorithms.md#hacpo-capability-aware-advantage).

    Per prompt group (all agents' responses, ``source[i]`` = the agent that generated response i):
    ``mu^ = (1/(nG)) sum_i omega^(k,source_i) r_i``, ``sigma = std_unbiased(all rewards)``,
    ``A_i = (r_i - mu^) / (sigma + eps)`` for self and cross responses alike.
    CODE guards: ``uniform_reward_guard`` (all rewards equal -> plain mean, so A = 0) and
    ``binary_baseline_guard`` (``mu^ > 1`` -> mean of the learner's own rewards in the group).
    A pooled group of one response gets 0.
    """
    r = _as_float(rewards, "rewards")
    src = torch.as_tensor(source)
    if src.shape != r.shape:
        raise ValueError(f"hacpo_advantages: source shape {tuple(src.shape)} != rewards shape {tuple(r.shape)}")
    bw = torch.as_tensor(baseline_weight, dtype=r.dtype)
    if r.numel() == 0:
        return r.clone()
    if int(src.max()) >= bw.numel() or int(src.min()) < 0:
        raise ValueError(f"hacpo_advantages: source ids must be in [0, {bw.numel()}), got {src.unique().tolist()}")
    st = group_stats(r, group_index)
    inv, k = st["inverse"], st["count"].numel()
    zeros = torch.zeros(k, dtype=r.dtype)
    mu = zeros.index_add(0, inv, bw[src] * r) / st["count"]
    if binary_baseline_guard:
        own = (src == learner).to(r.dtype)
        own_n = zeros.index_add(0, inv, own)
        own_mean = zeros.index_add(0, inv, own * r) / own_n.clamp(min=1)
        mu = torch.where((mu > 1.0) & (own_n > 0), own_mean, mu)
    adv = (r - mu[inv]) / (st["std"][inv] + eps)
    zero = st["count"] == 1
    if uniform_reward_guard:  # baseline = plain mean = every reward, so A = 0 exactly
        zero = zero | (st["max"] == st["min"])
    return torch.where(zero[inv], torch.zeros_like(adv), adv)


def hacpo_discrepancy(advantages: Tensor, source, learner: int, grad_coef) -> Tensor:
    """Capability discrepancy coefficient: ``A~ = A`` for self responses, ``omega^(j,k) * A`` for
    responses from agent j != k (docs/algorithms.md#hacpo-capability-aware-advantage)."""
    src = torch.as_tensor(source)
    coef = torch.as_tensor(grad_coef, dtype=advantages.dtype)[src]
    return advantages * torch.where(src == learner, torch.ones_like(coef), coef)


def cross_sequence_ratio(learner_mean_logp: Tensor, source_mean_logp, clamp: float = 10.0) -> Tensor:
    """HACPO cross ratio ``s^(k,j) = exp(clamp(l_k(y; theta) - l_j(y; theta_old^j), -10, 10))``, each mean
    over its own tokenizer's length (v2/CODE form, docs/algorithms.md#hacpo-cross-sample-loss). Differentiable in the
    learner's mean log-prob (see ``core.sequence_mean_logp``)."""
    return compatibility_score(learner_mean_logp, torch.as_tensor(source_mean_logp, dtype=learner_mean_logp.dtype),
                               clamp)


def stepwise_lower_bound(update_index: int, lower: float = 0.8, step: float = 0.025) -> float:
    """Stepwise cross clip floor ``lo_u = min(1, lower + u * step)`` for the u-th optimizer update of the
    step, 0-based (docs/algorithms.md#hacpo-cross-sample-loss; ``lower = 1 - delta`` = ``hacpo.cross_clip_lower``)."""
    if update_index < 0:
        raise ValueError(f"stepwise_lower_bound: update_index must be >= 0, got {update_index}")
    return min(1.0, lower + update_index * step)


def hacpo_cross_loss(seq_ratio: Tensor, advantages: Tensor, lower: float, alpha: float = 1.0,
                     upper: float = 1.0) -> Tensor:
    """HACPO cross-agent per-sequence loss (minimization form), docs/algorithms.md#hacpo-cross-sample-loss (CODE form):

    ``c = clip(s, lower, upper)``, ``loss = -c * sg[c]^alpha * A~`` with ``A~`` the discrepancy-scaled
    advantage. No PPO min: outside ``[lower, upper]`` the value is constant (no gradient).
    The self term is :func:`core.ratio_surrogate` on the GSPO sequence ratio with clips 3e-4 / 4e-4;
    the minibatch loss is the mean over all (self and cross) sequences.
    """
    c = seq_ratio.clamp(min=lower, max=upper)
    return -(c * c.detach() ** alpha * advantages.to(c.dtype))


# --------------------------------------------------------------------------------------------
# SGT (docs/algorithms.md#sgt, DERIVED)
# --------------------------------------------------------------------------------------------

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


__all__ = [
    "compatibility_weights", "graft_candidates", "graft_cap", "symmetric_cap", "graft_balance",
    "random_count_matched_prompts", "random_count_matched_admission", "minibatch_bounds", "peer_order",
    "separate_minibatches", "align_peer_logprobs", "capability_estimate", "capability_ratio", "hacpo_omegas",
    "hacpo_advantages", "hacpo_discrepancy", "cross_sequence_ratio", "stepwise_lower_bound", "hacpo_cross_loss",
    "sgt_rescue", "sgt_augment", "compatibility_score",
]
