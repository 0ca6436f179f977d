"""The HORA learner: the algorithm, its section and its metrics are graftzoo.algos.hora."""
from __future__ import annotations


from graftzoo.algos.base import Learner
from graftzoo.algos.hora.formulas import hora_allocate, hora_objective
from graftzoo.algos.hora import (HORAConfig, HORA_CAPPED_FRAC, HORA_HIT_UTILITY, HORA_MAX_N, HORA_MEAN_N, HORA_MIN_N,
                                 HORA_PROBE_FRAC, HORA_UNUSED_BUDGET)
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.registry import register_algo
from graftzoo.contract.types import Group

@register_algo("hora")
class HORA(Learner):
    Config = HORAConfig

    def __init__(self, cfg: HORAConfig, run: LearnerFacts):
        super().__init__(cfg, run)
        G = run.n
        self.n0, self.cap = cfg.probe_size(G), cfg.extra_cap(G)
        self.history: dict = {}  # prompt id -> [successes, failures] over earlier steps

    # ---- allocation ----------------------------------------------------------------------
    def allocate_extra(self, counts, budget: int, used=None) -> list:
        """Extra rollouts per prompt for observed ``counts[i] = (s_i, f_i)`` and ``budget`` (docs/algorithms.md#hora):
        the greedy hit-utility allocation with cap ``m_max``; ``used[i]`` extra rollouts already given
        in earlier rounds lower that prompt's remaining cap (a round's share above it is not spent)."""
        c = self.cfg
        alloc = hora_allocate(counts, budget, cap=self.cap, a0=c.a0, b0=c.b0, skip_saturated=c.skip_saturated)
        if used is None:
            return alloc
        return [min(m, self.cap - u) for m, u in zip(alloc, used)]

    def _prior_counts(self, prompts) -> list:
        if self.cfg.posterior_source != "history":
            return [(0, 0)] * len(prompts)
        return [tuple(self.history.get(p.id, (0, 0))) for p in prompts]

    def collect(self, ctx, prompts):
        c = self.cfg
        P = len(prompts)
        if P == 0:
            return []
        total = ctx.n * P
        budget = total - self.n0 * P
        groups = [Group(prompt=p, model_id=ctx.model_id, rollouts=[]) for p in prompts]
        base = [self.n0] * P
        probe = 0
        if c.posterior_source == "probe":
            self._merge(groups, ctx.score(ctx.generate(prompts, base)))
            probe, base = self.n0 * P, [0] * P
        prior = self._prior_counts(prompts)
        used = [0] * P
        objective, spent = 0.0, 0
        for r in range(c.rounds):
            share = budget * (r + 1) // c.rounds - spent     # this round's budget, leftovers carried
            counts = [(s0 + g.num_correct, f0 + g.n - g.num_correct) for (s0, f0), g in zip(prior, groups)]
            extra = self.allocate_extra(counts, share, used)
            objective += hora_objective(counts, extra, c.a0, c.b0)
            spent += sum(extra)
            used = [u + m for u, m in zip(used, extra)]
            want = [m + b for m, b in zip(extra, base)]
            base = [0] * P
            if sum(want):
                self._merge(groups, ctx.score(ctx.generate(prompts, want)))
        if c.posterior_source == "history":
            self._remember(groups)
        sizes = [g.n for g in groups]
        ctx.log(HORA_MIN_N, min(sizes))
        ctx.log(HORA_MAX_N, max(sizes))
        ctx.log(HORA_MEAN_N, sum(sizes) / P)
        ctx.log(HORA_PROBE_FRAC, probe / max(1, sum(sizes)))
        ctx.log(HORA_UNUSED_BUDGET, budget - spent)
        ctx.log(HORA_CAPPED_FRAC, sum(u >= self.cap for u in used) / P)
        ctx.log(HORA_HIT_UTILITY, objective)
        return groups

    @staticmethod
    def _merge(groups, new):
        for g, ng in zip(groups, new):
            g.rollouts.extend(ng.rollouts)

    def _remember(self, groups):
        d = self.cfg.history_decay
        for g in groups:
            s, f = self.history.get(g.prompt.id, (0.0, 0.0))
            self.history[g.prompt.id] = (d * s + g.num_correct, d * f + g.n - g.num_correct)

    # ---- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict):
        self.history = {k: tuple(v) for k, v in state.get("history", {}).items()}
