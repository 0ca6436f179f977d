"""DAPO's formulas as pure functions (docs/algorithms.md#dapo); the formulas several algorithms share are
graftzoo.algos.functional's."""
from __future__ import annotations

import torch
from torch import Tensor

from graftzoo.algos.functional.core import _as_float, group_stats



def zero_variance_groups(rewards: Tensor, group_index: Tensor, drop_singletons: bool = True) -> Tensor:
    """DAPO dynamic-sampling predicate: True for groups with no reward contrast (docs/algorithms.md#dapo
    step 3 and edge cases).

    Returns ``BoolTensor[K]`` over groups in ascending id order. DAPO keeps a group iff its std > 0 or it
    has exactly one response; the spec RECOMMENDS dropping singletons instead (``drop_singletons=True``);
    ``drop_singletons=False`` gives verl's keep rule. Pass correctness (``acc`` metric) or sequence
    rewards as ``rewards``; equality is tested exactly (max == min), not through a float std.
    """
    st = group_stats(_as_float(rewards, "rewards"), group_index)
    flat = st["max"] == st["min"]
    if not drop_singletons:
        flat = flat & (st["count"] > 1)
    return flat


def dapo_overlong_penalty(lengths, max_len: int, cache_len: int, penalty_factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment R_len(L) times ``penalty_factor`` (docs/algorithms.md#dapo).

    0 for ``L <= max_len - cache_len``; ``((max_len - cache_len) - L) / cache_len`` inside the buffer;
    -1 beyond ``max_len``. Added to the correctness reward of every response, correct or not.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"dapo_overlong_penalty: need 0 < cache_len <= max_len, got cache_len={cache_len}, "
                         f"max_len={max_len}")
    L = torch.as_tensor(lengths, dtype=torch.get_default_dtype())
    expected = max_len - cache_len
    pen = ((expected - L) / cache_len).clamp(min=-1.0, max=0.0)
    return penalty_factor * pen
