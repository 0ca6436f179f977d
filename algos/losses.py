"""A policy loss is a pure function, registered by name (as verl's and prime-rl's are): from the tensors of a
micro-batch (``LossInputs``) to its per-token policy-gradient loss and the clip statistics (``PolicyLoss``).

    @register_loss("clipped")
    def clipped_loss(x: LossInputs, cfg, clip: dict) -> PolicyLoss: ...

A learner names its loss (``Learner.loss = "clipped"``). The step (graftzoo.training.learning.step) does the rest, once, for
every loss: the forward pass, the ratio base (theta_old), the per-sequence weights, the aggregation
(``algo.loss_agg``), the entropy bonus and the KL term (docs/algorithms.md#loss-aggregation,
docs/algorithms.md#kl-and-entropy). ``cfg`` is the learner's ``algo.*`` section and ``clip`` the run's one clip
(``Learner.clip``: ``eps_low``, ``eps_high``, ``dual_clip_c``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from graftzoo.algos.functional import clipped_surrogate
from graftzoo.contract.batch import ByRole
from graftzoo.contract.registry import FunctionRegistry


@dataclass(frozen=True)
class LossInputs(ByRole):
    """A micro-batch as a policy loss reads it. ``[B, R]``: B responses, R response tokens (right-padded)."""

    logp: torch.Tensor              # [B, R] log-probs under the current weights (carries the gradient)
    old_logp: torch.Tensor          # [B, R] the ratio base: theta_old, or a given base (GRAFT's aligned peer values)
    advantages: torch.Tensor        # [B]
    mask: torch.Tensor              # [B, R] tokens of the policy-gradient term (0: padding, given prefix, aux rows)
    weights: torch.Tensor           # [B] per-sequence loss weights (the step applies them to ``token_loss``)
    role: torch.Tensor              # [B] graftzoo.contract.batch.ROLE_ID of own | peer | aux
    loss_mask: torch.Tensor         # [B, R] every row's token mask, aux rows included
    origin_mean_logp: torch.Tensor  # [B] the peer's mean log-prob l_P of a localized response (0 elsewhere)
    update: int = 0                 # the optimizer update within the step (HACPO's stepwise floor)


@dataclass
class PolicyLoss:
    """A loss's output. ``token_loss`` ``[B, R]`` is weighted and aggregated by the step; ``seq_loss`` ``[B]``
    replaces it on the rows of ``seq_rows`` (one value per sequence, spread over its tokens, e.g. HACPO's cross
    samples); ``extra`` is a scalar term already aggregated, added as it is (SGT's NLL). ``ratio``,
    ``clipped_low``, ``clipped_high``, ``dual_clipped`` feed the clip metrics; ``metrics`` are the loss's own."""

    token_loss: torch.Tensor
    ratio: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    dual_clipped: torch.Tensor
    seq_loss: Optional[torch.Tensor] = None
    seq_rows: Optional[torch.Tensor] = None
    extra: Optional[torch.Tensor] = None
    metrics: dict = field(default_factory=dict)

    @classmethod
    def of(cls, token_loss: torch.Tensor, info: dict, **kw) -> "PolicyLoss":
        """From a surrogate's ``(token loss, info)`` (``graftzoo.algos.functional.ratio_surrogate``)."""
        return cls(token_loss, info["ratio"], info["clipped_low"], info["clipped_high"], info["dual_clipped"], **kw)


LOSSES = FunctionRegistry("policy loss")
register_loss = LOSSES.register
"""``@register_loss(name)``: register a policy loss under ``name`` (a taken name is an error naming both)."""
get_loss = LOSSES.lookup


@register_loss("clipped")
def clipped_loss(x: LossInputs, cfg, clip: dict) -> PolicyLoss:
    """PPO's clipped surrogate with the run's shared clip (docs/algorithms.md#clipped-surrogate): GRPO and every
    learner that does not name another loss."""
    return PolicyLoss.of(*clipped_surrogate(x.logp, x.old_logp, x.advantages, clip["eps_low"], clip["eps_high"],
                                            clip["dual_clip_c"]))
