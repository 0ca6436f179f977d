"""The SGT learner and its policy loss: the algorithm, its section and its metrics are graftzoo.algos.sgt."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from graftzoo.algos.base import StepContext
from graftzoo.algos.sgt import SGTConfig
from graftzoo.algos.functional import aux_nll_loss, sequence_mean_logp
from graftzoo.algos.functional import sgt_rescue
from graftzoo.algos.losses import LossInputs, PolicyLoss, clipped_loss, register_loss
from graftzoo.algos.peer import (PeerLearner, augment_group, log_compatibility, log_by_peer, peer_groups,
                                pooled_group, require_peer)
from graftzoo.contract import metrics as M
from graftzoo.contract.registry import register_algo
from graftzoo.contract.types import Group

@register_algo("sgt")
class SGT(PeerLearner):
    Config = SGTConfig
    loss = "sgt"

    def exchange(self, ctx: StepContext, groups, peer: Optional[dict]) -> list:
        require_peer(self.name, ctx.run, peer)
        c = self.cfg
        peers = peer_groups(peer)
        # the union of every peer's responses to the prompt (docs/algorithms.md#populations; one peer: its group)
        pooled = [pooled_group([p.get(g.prompt.id) for p in peers.values()]) for g in groups]
        successes = [None if pg is None else [i for i, r in enumerate(pg.rollouts) if r.correct] for pg in pooled]
        rescue = sgt_rescue([g.num_correct for g in groups], [g.n for g in groups], successes, ctx.rng,
                            int(c.k_inj), c.gate, float(c.tau))
        picked = []
        for x, idx in rescue.items():
            pg = pooled[x]
            picked.append(Group(pg.prompt, pg.model_id, [pg.rollouts[i] for i in idx], source="peer"))
        local = ctx.localize(picked)

        out = [[g] for g in groups]
        rescue_set, aux, rejected, rescued = [], [], 0, 0
        for x, lg in zip(rescue, local):
            g = groups[x]
            inj = [r for r in lg.rollouts if not r.dropped]  # a truncated answer loses its proof
            rejected += lg.n - len(inj)
            inj = inj[:g.n - g.num_correct]  # one per failed response at most (threshold gate)
            if not inj:
                continue
            rescued += 1
            rescue_set += inj
            if c.mode == "augment":
                out[x] = [augment_group(g, inj, ctx.rng, c.adv_eps)]
            else:
                aux.append((x, lg, inj))
        for x, lg, inj in aux:  # loss lam * (-1/|Rescue|) * sum l(y) over the step's rescue set
            inj = [replace(r, role="aux") for r in inj]
            out[x].append(Group(lg.prompt, lg.model_id, inj, [0.0] * len(inj), "peer",
                                [float(c.lam) / len(rescue_set)] * len(inj)))
        log_compatibility(ctx, rescue_set)
        log_by_peer(ctx, peers, rescue_set)
        ctx.log(M.PEER_RESCUED_GROUPS, rescued)
        ctx.log(M.PEER_ADMITTED, len(rescue_set))
        ctx.log(M.PEER_ADMITTED_SUCC, len(rescue_set))  # SGT transfers verified successes only
        ctx.log(M.PEER_ADMITTED_FAIL, 0)
        ctx.log(M.PEER_REJECTED, rejected)
        return [g for slot in out for g in slot]


@register_loss("sgt")
def sgt_loss(x: LossInputs, cfg: SGTConfig, clip: dict) -> PolicyLoss:
    """The clipped surrogate on own and injected rows (``clipped_loss``); with ``mode: aux_nll`` the rescue rows
    (role aux) add ``-sum_i w_i l(y_i)`` over their length-normalized log-probs, ``w_i = lam / |Rescue|``
    (docs/algorithms.md#sgt)."""
    pg = clipped_loss(x, cfg, clip)
    aux = x.is_aux
    if bool(aux.any()):
        ell = sequence_mean_logp(x.logp[aux], x.loss_mask[aux])
        pg.extra = aux_nll_loss(ell, x.weights[aux])
        pg.metrics[M.LOSS_AUX_NLL] = float(-ell.detach().mean())
    return pg
