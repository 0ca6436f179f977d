"""OM-GRPO [om_grpo] (docs/algorithms.md#om-grpo): label-free RLVR with a soft consensus reward and no gradient
on the answer span.

Per step (docs/algorithms.md#om-grpo-consensus-reward): G trajectories per question; each one's final answer ``z_i`` (the last ``\boxed{}``,
or with ``answer_format: any`` whatever the verifier's extractor finds, e.g. the number after the last
'=' of a tiny-model scratchpad); with contrast-augmented rewards (CAR) every ordered pair (i, j) of
trajectories is shown to the policy, which answers once more: these G(G-1) short answers only vote.
``r_i = #{z in pool : z == z_i} / |pool| + format_weight * 1[z_i exists]``, equivalence decided by the
verifier (``answers_equivalent``). The tokens of the answer span get loss weight ``answer_grad_scale``
(0 = OM-GRPO) through ``Rollout.loss_mask``, and the same weight in the KL term when
``mask_kl`` (RECOMMENDED). Contrast prompts keep the tail of each solution so that they fit the model's
context (``contrast_template: compact`` suits tiny models).

Rollouts are never marked correct (there are no labels): accuracy comes from evaluation. The learner never reads gold answers: it works on copies of the prompts without gold or metadata and
never calls the environment's label-based scoring, so it may train on unlabelled data (``task.label_free``, which
its section declares: ``OMGRPOConfig.label_free``). ``ttt: true`` (docs/algorithms.md#om-grpo-consensus-reward) trains on the held-out
evaluation prompts (``eval.dataset``, else the task's test split of ``eval.size`` prompts), one
seeded pass after another, so the final evaluation measures test-time training on those same questions.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.config import LearnerFacts, MAX_TEMPERATURE, MAX_TOKENS
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.metrics import Metric
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key


# ---- its metrics (docs/metrics.md) ----
OM_GRPO_FORMAT_RATE = Metric("om_grpo/format_rate", "fraction", "responses with an extractable answer", "OM-GRPO")
OM_GRPO_ANSWER_DIVERSITY = Metric("om_grpo/answer_diversity", "fraction", "distinct answers per response, mean over "
                                  "groups", "OM-GRPO")
OM_GRPO_CONTRAST_SKIPPED_GROUPS = Metric("om_grpo/contrast_skipped_groups", "count", "groups whose contrast prompts "
                                         "do not fit the context", "OM-GRPO")
OM_GRPO_CONTRAST_GENERATED = Metric("om_grpo/contrast_generated", "count", "contrast answers generated", "OM-GRPO")
OM_GRPO_CONTRAST_TOKENS = Metric("om_grpo/contrast_tokens", "tokens", "tokens of the contrast answers", "OM-GRPO")
OM_GRPO_MASKED_TOKEN_FRAC = Metric("om_grpo/masked_token_frac", "fraction", "response tokens under the answer mask",
                                   "OM-GRPO")


ContrastTemplate = Literal["spec", "compact"]


@register_config("om_grpo")
class OMGRPOConfig(LearnerConfig):
    """OM-GRPO (docs/algorithms.md#om-grpo): label-free, rewarded by the group's consensus."""

    label_free: ClassVar[bool] = True  # never reads gold: may train on the unlabelled rows of task.label_free

    beta_kl: float = key(0.005, "k3 KL to the initial policy", ge=0)
    answer_grad_scale: float = key(0.0, "loss weight of answer-span tokens (0 = OM-GRPO, 1 = vanilla)", ge=0, le=1)
    mask_kl: bool = key(True, "mask the KL term like the policy term")
    mask_all_boxed: bool = key(False, "mask every \\boxed{} content, not only the last")
    answer_format: Literal["boxed", "any"] = key("boxed", "boxed | any (the verifier's extractor, e.g. after '=')")
    format_weight: float = key(1.0, "weight of the format reward")
    contrast: bool = key(True, "contrast-augmented reward")
    contrast_max_new_tokens: Int = key(64, "response limit of the contrast judgement", ge=1, le=MAX_TOKENS)
    contrast_template: ContrastTemplate = key("spec", "the judgement prompt: spec wording | compact (tiny models)")
    contrast_temperature: float = key(1.0, "sampling temperature of the contrast judgement", gt=0,
                                      le=MAX_TEMPERATURE)
    ttt: bool = key(False, "test-time training on the held-out evaluation prompts")

    def trains_on_heldout(self) -> bool:
        return self.ttt

    def check(self, run: LearnerFacts) -> None:
        if run.n < 2:
            raise ConfigError("config key 'rollout.n' must be >= 2 for OM-GRPO: a group of one has a trivial "
                              "consensus")
