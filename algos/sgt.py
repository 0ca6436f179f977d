"""SGT [sgt] (spec algos_peer §3.2, DERIVED): success-gated transfer of verified peer successes.

On a prompt where the learner's group passes the gate (``gate=all_fail``: every response failed;
``gate=threshold``: success rate <= ``tau``) and the peer has verified successes, up to ``k_inj``
of them, drawn at random, form the prompt's rescue set. They arrive as text, localized into the
learner's tokenizer and scored under its theta_old (spec §1.4), so their token ratio starts at 1
and the usual GRPO clipping applies (§3.2 step 4). Peer failures are never transferred.

``mode=augment`` (default): the rescue responses replace as many of the learner's failed responses,
chosen at random; the group keeps its size and GRPO advantages are recomputed on it (§3.2 step 3).
``mode=aux_nll``: the learner's groups stay as they are and the loss gains
``lam * (-1/|Rescue|) * sum l(y; theta)``, a length-normalized NLL on the rescue responses
(``lam`` is the spec's ``sgt.lambda``; ``lambda`` is a Python keyword).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from graftzoo.algos.base import Learner, LearnerConfig, MiniBatch, StepContext, TrainBatch
from graftzoo.algos.functional import sequence_mean_logp, sgt_augment, sgt_aux_nll_loss, sgt_rescue
from graftzoo.algos.functional.peer import SGT_GATES
from graftzoo.algos.base import require_peer
from graftzoo.algos.hacpo import log_compatibility
from graftzoo.core.config import ConfigError
from graftzoo.core.registry import register_algo
from graftzoo.core.types import Group

SGT_MODES = ("augment", "aux_nll")


@dataclass
class SGTConfig(LearnerConfig):
    """``algo.*`` keys of SGT (spec algos_peer §6 ``sgt.*``); the GRPO keys are the base's."""

    gate: str = "all_fail"     # all_fail | threshold
    tau: float = 0.0           # threshold gate: rescue when c_L / G <= tau
    k_inj: int = 1             # rescue responses per prompt, at most
    mode: str = "augment"      # augment | aux_nll
    lam: float = 1.0           # aux_nll weight (sgt.lambda)

    def __post_init__(self):
        if self.gate not in SGT_GATES:
            raise ConfigError(f"algo.gate must be one of {SGT_GATES}, got {self.gate!r}")
        if self.mode not in SGT_MODES:
            raise ConfigError(f"algo.mode must be one of {SGT_MODES}, got {self.mode!r}")
        if int(self.k_inj) < 1:
            raise ConfigError(f"algo.k_inj must be >= 1, got {self.k_inj}")
        if not 0.0 <= self.tau < 1.0:
            raise ConfigError(f"algo.tau must be in [0, 1) (a rescued group needs a failure to replace), "
                              f"got {self.tau}")


def subset(mb: MiniBatch, idx: list) -> MiniBatch:
    """Rows ``idx`` of a minibatch (same padded layout)."""
    t = torch.tensor(idx, dtype=torch.long)
    return MiniBatch(mb.input_ids[t], mb.attention_mask[t], mb.resp_len, mb.old_logp[t], mb.loss_mask[t],
                     mb.kl_mask[t], mb.advantages[t], mb.weights[t], mb.is_peer[t], mb.slot[t],
                     [mb.rows[i] for i in idx])


@register_algo("sgt")
class SGT(Learner):
    Config = SGTConfig

    def __init__(self, cfg: SGTConfig, run_cfg: dict):
        super().__init__(cfg, run_cfg)
        require_peer(self.name, run_cfg)
        self._n_rescue = 0  # |Rescue| of the current step (aux_nll normalization)

    def exchange(self, ctx: StepContext, groups, peer: Optional[dict]) -> list:
        require_peer(self.name, ctx.cfg, peer)
        c = self.cfg
        successes = []
        for g in groups:
            pg = peer.get(g.prompt.id)
            successes.append(None if pg is None else [i for i, r in enumerate(pg.rollouts) if r.correct])
        rescue = sgt_rescue([g.num_correct for g in groups], [g.n for g in groups], successes, ctx.rng,
                            int(c.k_inj), c.gate, float(c.tau))
        picked = []
        for x, idx in rescue.items():
            pg = peer[groups[x].prompt.id]
            picked.append(Group(pg.prompt, pg.model_id, [pg.rollouts[i] for i in idx], source="peer"))
        local = ctx.localize(picked)

        out = [[g] for g in groups]
        rescue_set, rejected, rescued = [], 0, 0
        for x, lg in zip(rescue, local):
            g = groups[x]
            inj = [r for r in lg.rollouts if not r.meta.get("dropped")]  # a truncated answer loses its proof
            rejected += lg.n - len(inj)
            inj = inj[:g.n - g.num_correct]  # one per failed response at most (threshold gate)
            if not inj:
                continue
            rescued += 1
            rescue_set += inj
            if c.mode == "augment":
                for r in inj:
                    r.meta["sgt_injected"] = True
                pos, _, adv = sgt_augment(g.rewards, [r.correct for r in g.rollouts], [r.reward for r in inj],
                                          ctx.rng, c.adv_eps)
                rolls = list(g.rollouts)
                for p, r in zip(pos, inj):
                    rolls[p] = r
                out[x] = [Group(g.prompt, g.model_id, rolls, adv.tolist(), g.source, None,
                                {**g.meta, "sgt_rescued": len(inj)})]
            else:
                for r in inj:
                    r.meta["sgt_aux"] = True
                out[x].append(Group(lg.prompt, lg.model_id, inj, [0.0] * len(inj), "peer", [1.0] * len(inj),
                                    {"sgt": "aux_nll"}))
        self._n_rescue = len(rescue_set)
        log_compatibility(ctx, rescue_set)
        ctx.log("peer/rescued_groups", rescued)
        ctx.log("peer/admitted", len(rescue_set))
        ctx.log("peer/rejected", rejected)
        return [g for slot in out for g in slot]

    def build_batch(self, ctx: StepContext, slots) -> TrainBatch:
        """Injected responses sit in the learner's own groups: mark them as peer tokens, without KL."""
        batch = super().build_batch(ctx, slots)
        for row in batch.rows:
            if row.rollout.meta.get("sgt_injected"):
                row.is_peer = True
                row.kl_mask = [0.0] * len(row.kl_mask)
        return batch

    def loss(self, ctx: StepContext, policy, mb: MiniBatch):
        aux = [i for i, r in enumerate(mb.rows) if r.rollout.meta.get("sgt_aux")]
        if not aux:
            return super().loss(ctx, policy, mb)
        pg = [i for i in range(len(mb)) if i not in set(aux)]
        loss, metrics = super().loss(ctx, policy, subset(mb, pg)) if pg else (0.0, {})
        rows = subset(mb, aux)
        logp, _ = policy.logprobs(rows.input_ids, rows.attention_mask, rows.resp_len)
        ell = sequence_mean_logp(logp, rows.loss_mask)
        # this minibatch's share of lam * (-1/|Rescue|) * sum over the step's rescue set
        term = sgt_aux_nll_loss(ell, float(self.cfg.lam)) * (len(aux) / max(1, self._n_rescue))
        metrics["sgt/aux_nll"] = float(-ell.detach().mean())
        return loss + term, metrics
