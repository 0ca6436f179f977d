"""The GSPO learner and its policy loss: the algorithm, its section and its metrics are graftzoo.algos.gspo."""
from graftzoo.algos.base import Learner
from graftzoo.algos.gspo import GSPOConfig
from graftzoo.algos.functional import gspo_sequence_ratio, gspo_token_ratio, ratio_surrogate
from graftzoo.algos.losses import LossInputs, PolicyLoss, register_loss
from graftzoo.contract.registry import register_algo


@register_loss("gspo")
def gspo_loss(x: LossInputs, cfg: GSPOConfig, clip: dict) -> PolicyLoss:
    """The clipped surrogate of GSPO's ratio (docs/algorithms.md#gspo): the sequence ratio on every token
    (``ratio_form: sequence``) or GSPO-token's (``token``), clipped at ``algo.seq_clip`` (``clip``)."""
    if cfg.ratio_form == "sequence":
        ratio = gspo_sequence_ratio(x.logp, x.old_logp, x.loss_mask).unsqueeze(1).expand_as(x.logp)
    elif cfg.ratio_form == "token":
        ratio = gspo_token_ratio(x.logp, x.old_logp, x.loss_mask)
    else:
        raise ValueError(f"algo.ratio_form must be token|sequence, got {cfg.ratio_form!r}")
    return PolicyLoss.of(*ratio_surrogate(ratio, x.advantages, clip["eps_low"], clip["eps_high"], None))


@register_algo("gspo")
class GSPO(Learner):
    Config = GSPOConfig
    loss = "gspo"
