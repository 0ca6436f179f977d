"""SGT's formulas as pure functions (docs/algorithms.md#sgt); the formulas several algorithms share are
graftzoo.algos.functional's."""
from __future__ import annotations

import random
from typing import Optional, Sequence

import torch
from torch import Tensor

from graftzoo.algos.functional.core import _as_float, group_advantages
from graftzoo.algos.functional.peer import _check_lengths



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
