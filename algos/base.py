"""The Learner interface and the per-step context the trainer hands it.

One training step, for each model (DESIGN.md "The data that flows"):

    groups = learner.collect(ctx, prompts)          # allocate -> generate -> score
    groups = learner.advantages(ctx, groups)
    slots  = learner.exchange(ctx, groups, peer)    # GRAFT / HACPO / SGT; identity here
    batch  = learner.build_batch(ctx, slots)
    for idx in learner.schedule(ctx, batch):        # minibatch order (peer-last lives here)
        loss, metrics = learner.loss(ctx, policy, batch.minibatch(idx))

A Learner overrides only the hooks it changes; this base class is GRPO (spec algos_single §1.1).
The trainer never branches on an algorithm's name.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
from dataclasses import dataclass, field
from typing import Optional

import torch

from graftzoo.algos.functional import (agg_loss, clipped_surrogate, group_advantages, kl_k3, minibatch_bounds,
                                       rloo_advantages)
from graftzoo.core.types import Group, Prompt, Rollout


# ------------------------------------------------------------------------------------------------
# batches
# ------------------------------------------------------------------------------------------------

@dataclass
class TrainRow:
    """One response as the learner trains on it, in the learner's own tokenizer."""

    prompt_ids: list
    response_ids: list
    old_logp: list
    loss_mask: list
    kl_mask: list
    advantage: float
    weight: float
    is_peer: bool
    slot: int
    rollout: Rollout


@dataclass
class MiniBatch:
    input_ids: torch.Tensor       # [B, P+R]: left-padded prompt | right-padded response
    attention_mask: torch.Tensor  # [B, P+R]
    resp_len: int                 # R
    old_logp: torch.Tensor        # [B, R] behaviour (theta_old) log-probs
    loss_mask: torch.Tensor       # [B, R] 1 where a token carries policy-gradient loss
    kl_mask: torch.Tensor         # [B, R]
    advantages: torch.Tensor      # [B]
    weights: torch.Tensor         # [B] per-sequence weights (GRAFT w_i; 1 for own)
    is_peer: torch.Tensor         # [B] bool
    slot: torch.Tensor            # [B] group slot index
    rows: list

    def __len__(self):
        return self.input_ids.shape[0]

    def to(self, device) -> "MiniBatch":
        """The tensors on ``device`` (the policy's); rows stay as they are."""
        if self.input_ids.device == torch.device(device):
            return self
        moved = {f: (v.to(device) if isinstance(v, torch.Tensor) else v)
                 for f, v in self.__dict__.items()}
        return MiniBatch(**moved)


@dataclass
class TrainBatch:
    """Own groups and admitted peer groups, flattened to rows; slot order = group order."""

    rows: list
    groups: list
    pad_id: int = 0

    def __len__(self):
        return len(self.rows)

    def minibatch(self, idx) -> MiniBatch:
        rows = [self.rows[i] for i in idx]
        P = max(len(r.prompt_ids) for r in rows)
        R = max(1, max(len(r.response_ids) for r in rows))
        pad = self.pad_id
        ids, att, old, lm, km = [], [], [], [], []
        for r in rows:  # padded as Python lists, converted once (one tensor per field, not per row)
            p, n = len(r.prompt_ids), len(r.response_ids)
            ids.append([pad] * (P - p) + list(r.prompt_ids) + list(r.response_ids) + [pad] * (R - n))
            att.append([0] * (P - p) + [1] * (p + n) + [0] * (R - n))
            tail = [0.0] * (R - n)
            for out, name, seq in ((old, "old_logp", r.old_logp), (lm, "loss_mask", r.loss_mask),
                                   (km, "kl_mask", r.kl_mask)):
                if n and len(seq) != n:
                    raise ValueError(f"train row (slot {r.slot}): {name} has {len(seq)} entries "
                                     f"for {n} response tokens")
                out.append(list(seq[:n]) + tail)
        return MiniBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(att, dtype=torch.long), R,
                         torch.tensor(old, dtype=torch.float32), torch.tensor(lm, dtype=torch.float32),
                         torch.tensor(km, dtype=torch.float32),
                         torch.tensor([r.advantage for r in rows], dtype=torch.float32),
                         torch.tensor([r.weight for r in rows], dtype=torch.float32),
                         torch.tensor([r.is_peer for r in rows], dtype=torch.bool),
                         torch.tensor([r.slot for r in rows], dtype=torch.long), rows)


# ------------------------------------------------------------------------------------------------
# config and context
# ------------------------------------------------------------------------------------------------

@dataclass
class LearnerConfig:
    """``algo.*`` keys shared by every learner (GRPO defaults, spec algos_single §1.1.4)."""

    estimator: str = "grpo"          # grpo | rloo  (advantage estimator)
    std_normalize: bool = True       # False = Dr.GRPO (spec §1.2)
    adv_eps: float = 1e-6
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip_c: Optional[float] = None
    loss_agg: str = "token-mean"     # see functional.agg_loss
    beta_kl: float = 0.0             # k3 KL to the initial policy, own tokens only
    entropy_coeff: float = 0.0
    mask_truncated: bool = False     # zero the loss of responses that hit max length (DAPO overlong filter)
    drop_dead_groups: bool = False   # drop zero-advantage groups from the loss denominator


class StepContext:
    """What a learner may use during one step. Built by the trainer for each model."""

    def __init__(self, *, step: int, epoch: int, cfg: dict, policy, engine, env, sampler=None, ref_policy=None,
                 rng: Optional[random.Random] = None, peer_policy_ids=(), meter=None, model_index: int = 0):
        self.step, self.epoch, self.cfg = step, epoch, cfg
        self.policy, self.engine, self.env, self.sampler = policy, engine, env, sampler
        self.ref_policy = ref_policy
        self.rng = rng or random.Random(0)
        self.meter = meter
        self.model_index = model_index
        self.metrics: dict = {}
        self.n = int(cfg["rollout"]["n"])
        self.max_response = int(getattr(engine, "max_new_tokens", cfg["rollout"]["max_new_tokens"]))

    @property
    def model_id(self) -> str:
        return self.policy.model_id

    def log(self, key: str, value):
        self.metrics[key] = value

    def add(self, key: str, value: float):
        self.metrics[key] = self.metrics.get(key, 0.0) + value

    def _phase(self, name: str):
        import contextlib
        return self.meter.phase(self.model_id, name) if self.meter else contextlib.nullcontext()

    def generate(self, prompts, n, prefixes=None) -> list:
        """Sample ``n`` (an int or one count per prompt) responses per prompt."""
        with self._phase("generate"):
            groups = self.engine.generate(prompts, n, prefixes=prefixes)
        self.add("rollouts/generated", sum(g.n for g in groups))
        self.add("rollouts/tokens", sum(len(r.token_ids) - r.prefix_len for g in groups for r in g.rollouts))
        return groups

    def score(self, groups) -> list:
        """Verifier rewards (label-free learners score themselves instead)."""
        with self._phase("score"):
            return self.env.score_groups(groups)

    def more_prompts(self, k: int) -> list:
        """Extra prompts beyond the step's batch (DAPO dynamic sampling refills)."""
        return self.sampler.extra(self.step, k)

    # -- cross-tokenizer exchange (spec algos_peer §1.4) ---------------------------------------
    def localize(self, groups) -> list:
        """Re-tokenize other models' rollouts for this learner and score them under theta_old.

        Responses travel as text; the prompt is re-rendered with this learner's template. Each
        returned rollout keeps the origin's reward/correctness and records ``meta["origin_mean_logp"]``
        (the peer's l_P) and ``meta["dropped"]`` (overflow / empty). EOS is excluded from the mean
        log-probs on both sides and appended for the loss only if the peer stopped.
        """
        from graftzoo.core.xt import localize_groups
        with self._phase("logprob"):
            out, stats = localize_groups(self.policy, groups, self.cfg)
        for k, v in stats.items():
            self.log(k, v)
        return out


class Learner:
    """GRPO. Subclasses override hooks; ``Config`` declares the ``algo.*`` keys."""

    name = "grpo"
    Config = LearnerConfig

    def __init__(self, cfg: LearnerConfig, run_cfg: dict):
        self.cfg = cfg
        self.run_cfg = run_cfg

    # ---- hooks ---------------------------------------------------------------------------
    def allocate(self, ctx: StepContext, prompts) -> list:
        """Rollouts per prompt (uniform G here; HORA and dynamic sampling change it)."""
        return [ctx.n] * len(prompts)

    def collect(self, ctx: StepContext, prompts) -> list:
        return ctx.score(ctx.generate(prompts, self.allocate(ctx, prompts)))

    def advantages(self, ctx: StepContext, groups) -> list:
        """Group-relative advantages (spec algos_single §1.1 step 3, §1.4 for RLOO)."""
        rewards, index = [], []
        for gi, g in enumerate(groups):
            rewards += self.shaped_rewards(ctx, g)
            index += [gi] * g.n
        if not rewards:
            return groups
        r = torch.tensor(rewards, dtype=torch.float64)
        idx = torch.tensor(index, dtype=torch.long)
        if self.cfg.estimator == "rloo":
            adv = rloo_advantages(r, idx)
        elif self.cfg.estimator == "grpo":
            adv = group_advantages(r, idx, std_normalize=self.cfg.std_normalize, eps=self.cfg.adv_eps)
        else:
            raise ValueError(f"algo.estimator must be grpo|rloo, got {self.cfg.estimator!r}")
        pos = 0
        for g in groups:
            g.advantages = adv[pos:pos + g.n].tolist()
            pos += g.n
        return groups

    def shaped_rewards(self, ctx: StepContext, group: Group) -> list:
        return group.rewards

    def exchange(self, ctx: StepContext, groups, peer: Optional[dict]) -> list:
        """Identity for single-model learners. ``peer`` maps prompt id -> the peer's Group."""
        return groups

    def build_batch(self, ctx: StepContext, slots) -> TrainBatch:
        rows = []
        for si, g in enumerate(slots):
            weights = g.weights or [1.0] * g.n
            for r, a, w in zip(g.rollouts, g.advantages or [0.0] * g.n, weights):
                if w <= 0 or r.meta.get("dropped"):
                    continue  # rejected responses leave the loss and its denominator
                if self.cfg.drop_dead_groups and g.source == "own" and all(x == 0 for x in g.advantages or [0]):
                    continue
                n = len(r.token_ids)
                lm = [0.0] * r.prefix_len + [1.0] * (n - r.prefix_len)
                if "loss_mask" in r.meta:
                    lm = [a_ * b_ for a_, b_ in zip(lm, r.meta["loss_mask"])]
                if self.cfg.mask_truncated and r.finish_reason == "length":
                    lm = [0.0] * n
                km = list(r.meta.get("kl_mask", lm)) if g.source == "own" else [0.0] * n
                rows.append(TrainRow(r.prompt_token_ids, r.token_ids, r.logprobs, lm, km, float(a), float(w),
                                     g.source != "own", si, r))
        return TrainBatch(rows, list(slots), pad_id=ctx.policy.pad_id)

    def schedule(self, ctx: StepContext, batch: TrainBatch) -> list:
        """Split slots, in order, into ``optim.minibatches`` contiguous minibatches, for ``optim.epochs``."""
        k = max(1, int(ctx.cfg["optim"]["minibatches"]))
        out = []
        for _ in range(int(ctx.cfg["optim"].get("epochs", 1))):
            for start, end in minibatch_bounds(len(batch.groups), k):
                idx = [i for i, r in enumerate(batch.rows) if start <= r.slot < end]
                if idx:
                    out.append(idx)
        return out

    def surrogate(self, logp: torch.Tensor, mb: MiniBatch):
        """Token loss [B, R] and clip info (spec algos_single §1.1.2)."""
        c = self.cfg
        return clipped_surrogate(logp, mb.old_logp, mb.advantages, c.eps_low, c.eps_high, c.dual_clip_c)

    def loss(self, ctx: StepContext, policy, mb: MiniBatch):
        c = self.cfg
        logp, ent = policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len, with_entropy=True)
        tok, info = self.surrogate(logp, mb)
        tok = tok * mb.weights.unsqueeze(1)
        mask = mb.loss_mask
        loss = agg_loss(tok, mask, c.loss_agg, self.agg_normalizer(ctx, mb))
        metrics = token_metrics(info, mask, mb.is_peer, ent)
        if c.entropy_coeff:
            loss = loss - c.entropy_coeff * agg_loss(ent, mask, c.loss_agg)
        if c.beta_kl > 0:
            with torch.no_grad():
                ref, _ = ctx.ref_policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
            kl = kl_k3(logp, ref)
            kl_term = agg_loss(kl, mb.kl_mask, c.loss_agg)
            loss = loss + c.beta_kl * kl_term
            metrics["kl"] = float(kl_term.detach())
        return loss, metrics

    def agg_normalizer(self, ctx: StepContext, mb: MiniBatch) -> Optional[float]:
        if self.cfg.loss_agg == "seq-mean-token-sum-norm":
            return float(len(mb) * ctx.max_response)
        return None

    # ---- state (for checkpoints) ------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass


def token_metrics(info: dict, mask: torch.Tensor, is_peer: torch.Tensor, ent: Optional[torch.Tensor]) -> dict:
    """Clip fractions split own vs peer tokens (the paper's Table 9), entropy, ratio."""
    clipped = (info["clipped_low"] | info["clipped_high"]).float()
    m = mask.float()
    peer = is_peer.float().unsqueeze(1) * m
    own = m - peer

    def frac(x, w):
        d = float(w.sum())
        return float((x * w).sum()) / d if d > 0 else None

    out = {"clip/frac": frac(clipped, m), "clip/frac_own": frac(clipped, own), "clip/frac_peer": frac(clipped, peer),
           "clip/frac_low": frac(info["clipped_low"].float(), m), "clip/frac_high": frac(info["clipped_high"].float(), m),
           "ratio/mean": frac(info["ratio"].expand_as(m), m), "tokens/peer_share": frac(peer, m) if m.sum() > 0 else None}
    if ent is not None:
        out["entropy"] = frac(ent.detach(), m)
    return out


def config_from(cls, algo_cfg: dict):
    """The learner's Config from the ``algo`` config section (name removed)."""
    keys = {f.name for f in dataclasses.fields(cls.Config)}
    return cls.Config(**{k: v for k, v in algo_cfg.items() if k in keys})


# ------------------------------------------------------------------------------------------------
# helpers shared by the peer-exchange learners (GRAFT, HACPO, SGT)
# ------------------------------------------------------------------------------------------------

def require_peer(name: str, run_cfg: dict, peer=()):
    """The clear error for a peer-exchange learner without a peer source (``peer`` None at exchange time)."""
    if (run_cfg.get("peer") or {}).get("source", "none") == "none" or peer is None:
        from graftzoo.core.config import ConfigError
        raise ConfigError(f"algorithm '{name}' trains on the peer's rollouts and needs a peer source: "
                          f"pass --peer online|stored:PATH|mixed:PATH (config key peer.source)")


def log_s_stats(ctx: StepContext, s: list):
    """``peer/s_*``: statistics of the compatibility scores s of this step's peer responses."""
    if s:
        ctx.log("peer/s_mean", statistics.fmean(s))
        ctx.log("peer/s_median", statistics.median(s))
        ctx.log("peer/s_min", min(s))
        ctx.log("peer/s_max", max(s))
