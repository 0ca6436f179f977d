"""The DAPO learner: the algorithm, its section and its metrics are graftzoo.algos.dapo."""
import torch

from graftzoo.algos.base import Learner
from graftzoo.algos.dapo.formulas import dapo_overlong_penalty, zero_variance_groups
from graftzoo.algos.dapo import DAPOConfig, DAPO_GEN_BATCHES, DAPO_KEPT_GROUPS
from graftzoo.contract.registry import register_algo


@register_algo("dapo")
class DAPO(Learner):
    Config = DAPOConfig

    def collect(self, ctx, prompts):
        groups = super().collect(ctx, prompts)
        if not self.cfg.dynamic_sampling:
            return groups
        want = len(prompts)
        kept = self._informative(groups)
        batches = 1
        while len(kept) < want and (self.cfg.max_gen_batches <= 0 or batches < self.cfg.max_gen_batches):
            kept += self._informative(super().collect(ctx, ctx.more_prompts(want)))
            batches += 1
        ctx.log(DAPO_GEN_BATCHES, batches)
        ctx.log(DAPO_KEPT_GROUPS, min(len(kept), want))
        if len(kept) < want and self.cfg.on_shortfall == "error":
            raise RuntimeError(f"DAPO dynamic sampling found {len(kept)}/{want} informative groups "
                               f"in {batches} generation batches (algo.max_gen_batches)")
        return kept[:want]

    @staticmethod
    def _informative(groups):
        if not groups:
            return []
        correct = torch.tensor([float(r.correct) for g in groups for r in g.rollouts])
        index = torch.tensor([i for i, g in enumerate(groups) for _ in g.rollouts])
        flat = zero_variance_groups(correct, index)
        return [g for g, f in zip(groups, flat.tolist()) if not f]

    def shaped_rewards(self, ctx, group):
        if self.cfg.overlong_cache_len <= 0:
            return group.rewards
        lengths = [len(r.token_ids) - r.prefix_len for r in group.rollouts]
        pen = dapo_overlong_penalty(lengths, ctx.max_response, self.cfg.overlong_cache_len, self.cfg.overlong_penalty)
        return [r + p for r, p in zip(group.rewards, pen.tolist())]
