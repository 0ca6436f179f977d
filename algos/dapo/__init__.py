"""DAPO [dapo] (docs/algorithms.md#dapo): clip-higher, dynamic sampling, overlong shaping, token-mean."""
from __future__ import annotations

from typing import Literal

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.config import MAX_TOKENS
from graftzoo.contract.metrics import Metric
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key


# ---- its metrics (docs/metrics.md) ----
DAPO_GEN_BATCHES = Metric("dapo/gen_batches", "count", "generation batches dynamic sampling drew", "DAPO")
DAPO_KEPT_GROUPS = Metric("dapo/kept_groups", "count", "informative groups kept for the batch", "DAPO")


@register_config("dapo")
class DAPOConfig(LearnerConfig):
    """DAPO (docs/algorithms.md#dapo). Its clip-higher (0.28, dual clip 10) is the preset configs/algos/dapo.yaml,
    which sets the shared ``optim.clip``: never a private default that a comparison would silently inherit."""
    dynamic_sampling: bool = key(True, "refill the batch with prompts whose group is mixed")
    max_gen_batches: Int = key(10, "generation batches per step before giving up (0: unlimited)", ge=0,
                                le=10_000)
    on_shortfall: Literal["keep", "error"] = key("keep", "keep (train on what was found) | error (verl raises)")
    overlong_cache_len: Int = key(0, "soft overlong buffer in tokens (0 = shaping off)", ge=0, le=MAX_TOKENS)
    overlong_penalty: float = key(1.0, "overlong penalty at the hard limit")
