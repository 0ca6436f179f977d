"""ExTra [extra] (docs/algorithms.md#extra): a novelty bonus on correct responses and entropy-guided prefix
regeneration, on top of GRPO.

Novelty (docs/algorithms.md#extra-novelty-bonus): every rollout's tail text is embedded (``algo.embedder``, graftzoo.algos.extra.embedders); each
prompt keeps a FIFO of its last ``memory_size`` rollout embeddings; once it holds ``rollout.n`` of
them, ``nov_i`` = nearest-neighbour cosine distance to that memory and the sibling rollouts.
Option B (``novelty_mode: after_norm``, RECOMMENDED): ``A_i = GRPO(r)_i + alpha * nov_i * 1[correct]``;
Option A (``before_norm``): the bonus, scaled by ``exp(-lambda * reward-variance EMA)``, is added to
the reward before GRPO normalization.

Prefix regeneration (docs/algorithms.md#extra-prefix-regeneration): for hard prompts (pass rate <= 1/G) the most confident rollout (lowest mean
token entropy under theta_old) is cut after newlines (no newline: no prefix, docs/algorithms.md#extra-prefix-regeneration; the option
``fallback_cut_chars``, e.g. "=+" for the tiny models' newline-free scratchpads, cuts after those tokens
instead); each prefix is scored by its mean entropy and kept in the prompt's prefix memory; the prefix
with the lowest similarity-smoothed score is queued with the prompt, which keeps its own gold answer (docs/algorithms.md#extra-prefix-regeneration).
After ``regen_warmup_steps`` steps, queued prompts replace the tail of the batch and are generated from
their prefix (``Rollout.prefix_len``; prefix tokens carry no loss). A guided prompt is its own group, with
its own memories.

Memories are keyed by prompt id (the spec keys them by prompt token ids: the same grouping whenever an
id names one text); duplicates of a prompt in one batch share and pool them.
"""
from __future__ import annotations

import os

from typing import Literal, Optional

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.config import LearnerFacts, MAX_BATCH, MAX_N, MAX_PROMPTS, MAX_STEPS, MAX_TEMPERATURE, MAX_TOKENS
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.metrics import Metric
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key


# ---- its metrics (docs/metrics.md) ----
EXTRA_GUIDED_PROMPTS = Metric("extra/guided_prompts", "count", "prompts of the step regenerated from a stored prefix",
                              "ExTra")
EXTRA_GUIDED_ACC = Metric("extra/guided_acc", "fraction", "correct responses of the prefix-guided prompts", "ExTra")
EXTRA_QUEUE_LEN = Metric("extra/queue_len", "count", "prefixes waiting in the regeneration queue", "ExTra")
EXTRA_HARD_PROMPTS = Metric("extra/hard_prompts", "count", "hard prompts mined for prefixes", "ExTra")
EXTRA_PREFIXES_ENQUEUED = Metric("extra/prefixes_enqueued", "count", "prefixes added to the queue", "ExTra")
EXTRA_NOVELTY_WARM_FRAC = Metric("extra/novelty_warm_frac", "fraction", "prompt keys whose embedding memory is "
                                 "full enough for novelty", "ExTra")
EXTRA_NOVELTY_MEAN = Metric("extra/novelty_mean", "value", "mean novelty of the correct responses", "ExTra")
EXTRA_BONUS_MEAN = Metric("extra/bonus_mean", "reward", "mean novelty bonus alpha * novelty over the responses",
                          "ExTra")


EMBEDDERS = ("hashed_ngrams", "policy_hidden")   # the builtin embedders (graftzoo.algos.extra.embedders)


@register_config("extra")
class ExTraConfig(LearnerConfig):
    """ExTra (docs/algorithms.md#extra). The paper runs' DAPO-style clip is the preset configs/algos/extra.yaml (the
    shared optim.clip)."""
    novelty_alpha: float = key(0.1, "novelty bonus weight alpha (paper runs; the released script uses 0.01)")
    novelty_mode: Literal["after_norm", "before_norm"] = key("after_norm", "where the bonus enters the advantage")
    novelty_lambda: float = key(1.0, "before_norm: gamma = exp(-lambda * reward-variance EMA)", ge=0)
    variance_momentum: float = key(0.1, "before_norm: EMA momentum", ge=0, le=1)
    memory_size: Int = key(16, "rollout embeddings kept per prompt (>= rollout.n)", ge=1, le=100 * MAX_N)
    memory_prompts: Int = key(100_000, "prompts with memories (least recently seen dropped beyond)", ge=1,
                               le=10 * MAX_PROMPTS)
    embedder: str = key("hashed_ngrams", "hashed_ngrams | policy_hidden | local sentence-transformers dir")
    embed_tokens: Int = key(512, "embed the last N response tokens", ge=1, le=MAX_TOKENS)
    prefix_regen: bool = key(True, "regenerate from prefixes of hard prompts' rollouts")
    regen_warmup_steps: Int = key(30, "mining and regeneration start after this many steps", ge=0, le=MAX_STEPS)
    hard_pass_rate: Optional[float] = key(None, "hard iff pass rate <= this (null: 1/G)", ge=0, le=1)
    fallback_cut_chars: str = key("", "no newline: cut after these tokens (\"\" = no prefix)")
    prefix_min_gap: Int = key(32, "tokens between kept cut points", ge=1, le=MAX_TOKENS)
    max_prefixes: Int = key(15, "cut points per rollout", ge=1, le=MAX_TOKENS)
    prefix_memory: Int = key(128, "prefixes kept per prompt", ge=1, le=100 * MAX_N)
    tau: float = key(0.1, "smoothing temperature of the prefix selection", gt=0, le=MAX_TEMPERATURE)
    regen_batch_size: Int = key(16, "guided prompts per step (they replace the batch's last rows)", ge=0,
                                 le=MAX_BATCH)
    queue_size: Int = key(512, "guided prompts waiting (most recent kept)", ge=1, le=MAX_PROMPTS)

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        return ("its advantage is GRPO's group advantage, 0 for a group of one response or of identical ones; only "
                "the novelty bonus of revisited prompts would remain")

    def check(self, run: LearnerFacts) -> None:
        if self.estimator != "grpo" or not self.std_normalize:
            raise ConfigError("ExTra's novelty bonus is defined on std-normalized GRPO advantages "
                              "(docs/algorithms.md#extra-novelty-bonus): config keys 'algo.estimator' must be grpo "
                              "and 'algo.std_normalize' true")
        if self.memory_size < run.n:
            raise ConfigError(f"config key 'algo.memory_size'={self.memory_size} is below rollout.n={run.n}: the "
                              "novelty memory could never warm up")
        if self.embedder not in EMBEDDERS and not os.path.isdir(self.embedder):
            raise ConfigError(f"config key 'algo.embedder' must be one of {' | '.join(EMBEDDERS)} or a local "
                              f"sentence-transformers model directory, got {self.embedder!r}")
