"""GRAFT's formulas as pure functions (docs/algorithms.md#graft); the formulas several algorithms share are
graftzoo.algos.functional's."""
from __future__ import annotations

import math
import random
from typing import Optional, Sequence

import torch
from torch import Tensor

from graftzoo.algos.functional.peer import _check_lengths, minibatch_bounds



BALANCE_MODES = ("cap_pvar", "none")


PEER_POSITIONS = ("last", "first", "uniform")


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


PEER_CHOICES = ("compatible", "informative", "random")


def choose_peer(peer_correct: Sequence[Optional[int]], G_peer: Sequence[int], s_mean: Sequence[Optional[float]],
                rule: str, rng: random.Random, mixed_only: bool = True) -> Optional[int]:
    """Which peer's group a learner of a population grafts on one candidate prompt (docs/algorithms.md#populations,
    ``algo.peer_choice``). Eligible: the peers whose group is informative, ``0 < c_P < G_P`` (``mixed_only=False``:
    any group with a success, ``c_P > 0``); ``peer_correct[j] = None`` means peer ``j`` has no group.
    ``compatible``: the eligible group with the highest mean compatibility ``s_mean[j]`` (None, nothing scored,
    ranks last); ``informative``: the largest ``p(1 - p)``, ``p = c_P/G_P``; ties of both go to the lower index.
    ``random``: uniform among the eligible, one draw of ``rng`` (none with a single eligible peer).
    Returns the peer's index, None when no peer is eligible.

    Worked example: ``G = 4``, peers A (c = 2, s = 0.91), B (c = 1, s = 0.97), C (c = 4, all success):
    ``compatible`` -> B (1), ``informative`` -> A (0: 0.25 > 0.1875), C is never chosen."""
    if rule not in PEER_CHOICES:
        raise ValueError(f"choose_peer: rule={rule!r}; expected one of {PEER_CHOICES}")
    _check_lengths("choose_peer", peer_correct=peer_correct, G_peer=G_peer, s_mean=s_mean)
    ok = [j for j, (c, G) in enumerate(zip(peer_correct, G_peer))
          if c is not None and (0 < c < G if mixed_only else 0 < c <= G)]
    if len(ok) <= 1:
        return ok[0] if ok else None
    if rule == "random":
        return ok[rng.randrange(len(ok))]
    if rule == "informative":
        key = [round((c / G) * (1 - c / G), 12) for c, G in ((peer_correct[j], G_peer[j]) for j in ok)]
    else:
        key = [-math.inf if s_mean[j] is None else float(s_mean[j]) for j in ok]
    return ok[max(range(len(ok)), key=lambda i: (key[i], -i))]


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
