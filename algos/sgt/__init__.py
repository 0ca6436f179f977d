"""SGT [sgt] (docs/algorithms.md#sgt, DERIVED): success-gated transfer of verified peer successes.

On a prompt where the learner's group passes the gate (``gate=all_fail``: every response failed;
``gate=threshold``: success rate <= ``tau``) and the peer has verified successes, up to ``k_inj``
of them, drawn at random, form the prompt's rescue set. They arrive as text, localized into the
learner's tokenizer and scored under its theta_old (docs/algorithms.md#cross-tokenizer-exchange), so their token ratio starts at 1
and the usual GRPO clipping applies (docs/algorithms.md#sgt). Peer failures are never transferred.

``mode=augment`` (default): the rescue responses replace as many of the learner's failed responses,
chosen at random; the group keeps its size and GRPO advantages are recomputed on it (docs/algorithms.md#sgt).
``mode=aux_nll``: the learner's groups stay as they are and the loss gains
``lam * (-1/|Rescue|) * sum l(y; theta)``, a length-normalized NLL on the rescue responses
(``lam`` is the spec's ``sgt.lambda``; ``lambda`` is a Python keyword).
"""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

from graftzoo.algos.config import GROUP_WHY, LearnerConfig
from graftzoo.contract.config import LearnerFacts, MAX_N
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key


SGTGate = Literal["all_fail", "threshold"]


@register_config("sgt")
class SGTConfig(LearnerConfig):
    """SGT (docs/algorithms.md#sgt); the GRPO keys are the base's."""

    needs_peer: ClassVar[bool] = True

    gate: SGTGate = key("all_fail", "which learner groups are rescued")
    tau: float = key(0.0, "threshold gate: rescue when c_L / G <= tau", ge=0, lt=1)
    k_inj: Int = key(1, "rescue responses per prompt, at most", ge=1, le=MAX_N)
    mode: Literal["augment", "aux_nll"] = key("augment", "augment the group | an auxiliary NLL term")
    lam: float = key(1.0, "aux_nll weight")

    def group_needed(self, run: LearnerFacts) -> Optional[str]:
        """augment: a rescued success joins the learner's group, whose advantages are recomputed (a group of one gets
        0; identical responses still learn from a rescue); aux_nll: the NLL of the rescued successes learns alone."""
        if self.mode == "aux_nll" and self.lam != 0:
            return None
        if self.mode == "aux_nll":
            return GROUP_WHY + " (and algo.lam=0 turns the rescue NLL off)"
        if run.n < 2:
            return ("rescued peer successes join the learner's group and its advantages are recomputed there: a group "
                    "of one response gets advantage 0 and the update is 0")
        return None
