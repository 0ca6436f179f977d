"""HORA [hora] (docs/algorithms.md#hora): hit-utility optimal rollout allocation, compute-matched to GRPO.

Per step (docs/algorithms.md#hora, RECOMMENDED instantiation): a probe of ``n0`` rollouts per prompt is scored; the rest
of the GRPO budget ``B_tot = rollout.n * prompts`` is spread over the prompts by the exact greedy
maximizer of the total posterior hit utility (``formulas.hora_allocate``), at most ``cap`` extra
rollouts per prompt; the extra rollouts are merged into the probe groups, so groups have different
sizes. Rewards, the estimator (``algo.estimator``: grpo | rloo) and the loss are unchanged.

``posterior_source: history`` replaces the probe by each prompt's outcome counts from earlier
steps (learner state, checkpointed; ``history_decay`` forgets old visits): every prompt still gets
``n0`` rollouts (the minimum group size) and the whole budget is generated in one call.
"""
from __future__ import annotations

from typing import Literal, Optional

from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.config import LearnerFacts, MAX_N
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.metrics import Metric
from graftzoo.contract.registry import register_config
from graftzoo.contract.schema import Int, key


# ---- its metrics (docs/metrics.md) ----
HORA_MIN_N = Metric("hora/min_n", "count", "fewest rollouts allocated to a prompt", "HORA")
HORA_MAX_N = Metric("hora/max_n", "count", "most rollouts allocated to a prompt", "HORA")
HORA_MEAN_N = Metric("hora/mean_n", "count", "mean rollouts per prompt", "HORA")
HORA_PROBE_FRAC = Metric("hora/probe_frac", "fraction", "rollouts spent on the probe round", "HORA")
HORA_UNUSED_BUDGET = Metric("hora/unused_budget", "count", "rollouts of the budget left unallocated", "HORA")
HORA_CAPPED_FRAC = Metric("hora/capped_frac", "fraction", "prompts whose allocation hit the cap", "HORA")
HORA_HIT_UTILITY = Metric("hora/hit_utility", "count", "expected prompts with at least one correct extra rollout",
                          "HORA")


@register_config("hora")
class HORAConfig(LearnerConfig):
    """HORA (docs/algorithms.md#hora): a probe, then extra rollouts where the posterior says they help most."""
    n0: Optional[Int] = key(None, "rollouts per prompt before allocation (null: max(2, rollout.n // 2))", ge=1,
                             le=MAX_N)
    cap: Optional[Int] = key(None, "most extra rollouts per prompt, m_max (null: 3 * rollout.n)", ge=0,
                              le=3 * MAX_N)
    a0: float = key(1.0, "Beta prior of every prompt's success rate", gt=0)
    b0: float = key(1.0, "Beta prior of every prompt's failure rate", gt=0)
    rounds: Int = key(1, "allocation rounds after the probe (posteriors refreshed)", ge=1, le=MAX_N)
    posterior_source: Literal["probe", "history"] = key("probe", "what the posterior is built from")
    history_decay: float = key(1.0, "history: old counts are multiplied by this at every visit", gt=0, le=1)
    skip_saturated: bool = key(False, "give no extra rollouts to prompts with only successes so far")

    def probe_size(self, G: int) -> int:
        return max(2, G // 2) if self.n0 is None else int(self.n0)

    def extra_cap(self, G: int) -> int:
        return 3 * G if self.cap is None else int(self.cap)

    def check(self, run: LearnerFacts) -> None:
        G = run.n
        if not 2 <= self.probe_size(G) <= G:
            raise ConfigError(f"config key 'algo.n0' must be in [2, rollout.n={G}] (groups of one have no "
                              f"baseline), got {self.probe_size(G)}")
