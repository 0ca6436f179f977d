"""The CISPO learner and its policy loss: the algorithm and its section are graftzoo.algos.cispo."""
import torch

from graftzoo.algos.base import Learner
from graftzoo.algos.cispo import CISPOConfig
from graftzoo.algos.losses import LossInputs, PolicyLoss, register_loss
from graftzoo.contract.registry import register_algo


@register_loss("cispo")
def cispo_loss(x: LossInputs, cfg: CISPOConfig, clip: dict) -> PolicyLoss:
    """CISPO's token loss (docs/algorithms.md#cispo): ``-sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * log pi``,
    ``rho = exp(log pi - log pi_old)`` (log-ratio clamped to +-20). The weight is detached, so every token's
    gradient is ``-w * A`` through ``log pi``: a clipped token still learns, at the clipped weight."""
    ratio = torch.exp((x.logp - x.old_logp).detach().clamp(min=-20.0, max=20.0))
    lo, hi = 1.0 - clip["eps_low"], 1.0 + clip["eps_high"]
    weight = ratio.clamp(min=lo, max=hi)
    token_loss = -weight * x.advantages.unsqueeze(1).to(x.logp.dtype) * x.logp
    return PolicyLoss(token_loss, ratio, ratio < lo, ratio > hi, torch.zeros_like(ratio, dtype=torch.bool))


@register_algo("cispo")
class CISPO(Learner):
    """GRPO's advantages, batches and aggregation; CISPO's loss."""

    Config = CISPOConfig
    loss = "cispo"
