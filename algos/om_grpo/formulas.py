"""OM-GRPO's formulas as pure functions (docs/algorithms.md#om-grpo); the formulas several algorithms share are
graftzoo.algos.functional's."""
from __future__ import annotations

from typing import Hashable, Optional, Sequence

import torch
from torch import Tensor



def soft_consensus_rewards(answer_clusters: Sequence[Optional[Hashable]],
                           contrast_clusters: Sequence[Optional[Hashable]] = (),
                           formatted: Optional[Sequence[bool]] = None,
                           format_weight: float = 1.0) -> list[float]:
    """OM-GRPO reward ``r_i = r^q_i + format_weight * r^f_i`` (docs/algorithms.md#om-grpo-consensus-reward, docs/algorithms.md#om-grpo-answer-mask).

    Pool ``Z`` = the G trajectory answers plus the contrast (CAR) answers; answers are given as
    equivalence-cluster ids (None = no extractable answer). ``r^q_i = #{z in Z : z == z_i} / |Z|``;
    None never matches (not even another None) but still counts in ``|Z|``. ``r^f_i`` defaults to
    ``answer_clusters[i] is not None``.
    """
    pool = list(answer_clusters) + list(contrast_clusters)
    if not pool:
        return []
    fmt = [c is not None for c in answer_clusters] if formatted is None else list(formatted)
    if len(fmt) != len(answer_clusters):
        raise ValueError(f"soft_consensus_rewards: {len(fmt)} format flags for {len(answer_clusters)} answers")
    votes: dict = {}
    for z in pool:
        if z is not None:
            votes[z] = votes.get(z, 0) + 1
    return [(votes[z] / len(pool) if z is not None else 0.0) + format_weight * float(f)
            for z, f in zip(answer_clusters, fmt)]


def majority_vote_rewards(answer_clusters: Sequence[Optional[Hashable]], formatted: Optional[Sequence[bool]] = None,
                          format_weight: float = 1.0) -> list[float]:
    """TTRL majority-vote baseline reward ``r_i = 1[z_i == z_maj] + format_weight * r^f_i``
    (docs/algorithms.md#om-grpo-answer-mask). Ties for the majority go to the answer seen first; None never wins."""
    fmt = [c is not None for c in answer_clusters] if formatted is None else list(formatted)
    votes: dict = {}
    for z in answer_clusters:
        if z is not None:
            votes[z] = votes.get(z, 0) + 1
    maj = max(votes, key=lambda z: votes[z]) if votes else None  # max keeps the first of equal counts
    return [float(z is not None and z == maj) + format_weight * float(f) for z, f in zip(answer_clusters, fmt)]


def contrast_pairs(group_size: int) -> list[tuple[int, int]]:
    """All ordered pairs (i, j), i != j, of a group: the G(G-1) CAR contrast prompts (docs/algorithms.md#om-grpo-consensus-reward
    step 3)."""
    return [(i, j) for i in range(group_size) for j in range(group_size) if i != j]


def contrast_prompt(problem: str, solution_a: str, solution_b: str) -> str:
    """User-turn text of the RECOMMENDED CAR contrast prompt (docs/algorithms.md#om-grpo-consensus-reward); render it with the
    model's chat template and truncate each solution to the rollout cap before calling."""
    return (f"Problem: {problem}\n\nSolution A:\n{solution_a}\n\nSolution B:\n{solution_b}\n\n"
            "Compare the two solutions and decide the correct final answer to the problem. "
            "Reply with only the final answer in \\boxed{}.")


def boxed_spans(text: str, last_only: bool = True) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the contents of ``\\boxed{...}`` (braces balanced, the
    ``\\boxed{`` / ``}`` format tokens excluded), docs/algorithms.md#om-grpo-answer-mask. ``last_only=True``
    keeps only the last one (``mask_all_boxed=False``). An unclosed ``\\boxed{`` is ignored."""
    spans, key, pos = [], "\\boxed{", 0
    while True:
        start = text.find(key, pos)
        if start < 0:
            break
        i, depth = start + len(key), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            break
        spans.append((start + len(key), i - 1))
        pos = i
    return spans[-1:] if last_only else spans


def answer_span_mask(token_offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]],
                     answer_grad_scale: float = 0.0) -> Tensor:
    """OM-GRPO outcome mask ``m^o`` over response tokens (docs/algorithms.md#om-grpo-answer-mask).

    Every token whose character span ``[a, b)`` overlaps an answer span gets ``answer_grad_scale``
    (0 = OM-GRPO, 1 = vanilla, the paper sweeps 0.25/0.5/0.75); all others 1. Zero-width tokens hold no
    characters and stay 1. Multiply into the loss mask (policy and KL terms alike).
    """
    if not 0.0 <= answer_grad_scale <= 1.0:
        raise ValueError(f"answer_span_mask: answer_grad_scale must be in [0, 1], got {answer_grad_scale}")
    out = torch.ones(len(token_offsets), dtype=torch.float32)
    for t, (a, b) in enumerate(token_offsets):
        if b > a and any(a < e and s < b for s, e in spans):
            out[t] = answer_grad_scale
    return out
