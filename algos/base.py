"""The Learner interface and the per-step context the trainer hands it.

One training step, for each model (docs/architecture.md#one-training-step):

    groups = learner.collect(ctx, prompts)          # allocate -> generate -> score
    groups = learner.advantages(ctx, groups)        # Group.advantages: the one advantage channel
    slots  = learner.exchange(ctx, groups, peer)    # GRAFT / HACPO / SGT; identity here
    batch  = learner.build_batch(ctx, slots)        # Rollout fields -> TrainRows (graftzoo.contract.types)
    for u, idx in enumerate(learner.schedule(ctx, batch)):   # minibatch order (peer-last lives here)
        ctx.update = u
        loss, metrics = learner.loss(ctx, policy, batch.minibatch(idx))

The loss is built from parts: the policy-gradient surrogate over own and peer rows (``surrogate``:
token-level, or sequence-level values for some rows), an auxiliary length-normalized NLL over aux
rows, an entropy bonus and a k3 KL over own rows. What differs between algorithms is stated on the
data (Rollout.role / loss_mask / kl_mask / old_logp, Group.advantages / weights) or in a small hook,
never by re-patching rows. A Learner overrides only the hooks it changes; this base class is GRPO
(docs/algorithms.md#grpo). The trainer never branches on an algorithm's name.
"""
from __future__ import annotations

import contextlib
import random
import statistics
from dataclasses import dataclass
from typing import Optional

import torch

from graftzoo.algos.functional import (agg_denominator, agg_loss, aux_nll_loss, clipped_surrogate, compatibility_score,
                                       group_advantages, kl_k3,
                                       minibatch_bounds, rloo_advantages, sequence_mean_logp,
                                       sequence_terms_as_tokens)
from graftzoo.contract import metrics as M
from graftzoo.contract.batch import MiniBatch, TrainBatch
from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.config import LearnerFacts, needs_peer_error
from graftzoo.contract.types import Group, Rollout, TrainRow
from graftzoo.peers.xt import localize_groups


# ------------------------------------------------------------------------------------------------
# context
# ------------------------------------------------------------------------------------------------

class StepContext:
    """What a learner may use during one step. Built by the trainer for each model; ``update`` is the
    index of the optimizer update within the step (set by the trainer before each ``loss`` call)."""

    def __init__(self, *, step: int, epoch: int, run: LearnerFacts, policy, engine, env, sampler=None,
                 ref_policy=None, rng: Optional[random.Random] = None, meter=None, model_index: int = 0,
                 heldout=None):
        self.step, self.epoch, self.run = step, epoch, run
        self.heldout = heldout  # () -> the held-out prompts the trainer evaluates on (OM-GRPO's test-time training)
        self.policy, self.engine, self.env, self.sampler = policy, engine, env, sampler
        self.ref_policy = ref_policy
        self.rng = rng or random.Random(0)
        self.meter = meter
        self.model_index = model_index
        self.update = 0
        self.metrics: dict = {}
        self.n = run.n
        self.max_response = int(getattr(engine, "max_new_tokens", run.max_new_tokens))

    @property
    def model_id(self) -> str:
        return self.policy.model_id

    def log(self, key: str, value):
        self.metrics[key] = value

    def add(self, key: str, value: float):
        self.metrics[key] = self.metrics.get(key, 0.0) + value

    def phase(self, name: str):
        """A timed phase of this model's step (generate | score | logprob | ...), for compute accounting."""
        return self.meter.phase(self.model_id, name) if self.meter else contextlib.nullcontext()

    def generate(self, prompts, n, prefixes=None) -> list:
        """Sample ``n`` (an int or one count per prompt) responses per prompt."""
        with self.phase("generate"):
            groups = self.engine.generate(prompts, n, prefixes=prefixes)
        self.add(M.ROLLOUTS_GENERATED, sum(g.n for g in groups))
        self.add(M.ROLLOUTS_TOKENS, sum(len(r.token_ids) - r.prefix_len for g in groups for r in g.rollouts))
        return groups

    def score(self, groups) -> list:
        """Verifier rewards (label-free learners score themselves instead)."""
        with self.phase("score"):
            return self.env.score_groups(groups)

    def more_prompts(self, k: int) -> list:
        """Extra prompts beyond the step's batch (DAPO dynamic sampling refills)."""
        return self.sampler.extra(self.step, k)

    # -- cross-tokenizer exchange (docs/algorithms.md#cross-tokenizer-exchange) ---------------------------------------
    def localize(self, groups) -> list:
        """Re-tokenize other models' rollouts for this learner and score them under theta_old.

        Responses travel as text; the prompt is re-rendered with this learner's template. Each
        returned rollout has role "peer", keeps the origin's reward/correctness and carries
        ``origin`` (the peer's model, tokenizer and mean log-prob l_P) and ``dropped`` (overflow /
        empty). EOS is excluded from the mean log-probs on both sides and appended for the loss only
        if the peer stopped. Group advantages travel unchanged.
        """
        with self.phase("logprob"):
            out, stats = localize_groups(self.policy, groups, self.run)
        for k, v in stats.items():
            self.log(k, v)
        return out


class Learner:
    """GRPO. Subclasses override hooks; ``Config`` declares the ``algo.*`` keys."""

    name = "grpo"
    Config = LearnerConfig

    def __init__(self, cfg: LearnerConfig, run: LearnerFacts):
        self.cfg = cfg            # the learner's own typed algo.* section
        self.run = run            # the run facts it reads (rollout.n, optim.minibatches, the shared clip, ...)
        self.clip = cfg.effective_clip(run)   # eps_low, eps_high, dual_clip_c: the one clip of the run

    # ---- hooks ---------------------------------------------------------------------------
    def allocate(self, ctx: StepContext, prompts) -> list:
        """Rollouts per prompt (uniform G here; HORA and dynamic sampling change it)."""
        return [ctx.n] * len(prompts)

    def collect(self, ctx: StepContext, prompts) -> list:
        return ctx.score(ctx.generate(prompts, self.allocate(ctx, prompts)))

    def advantages(self, ctx: StepContext, groups) -> list:
        """Group-relative advantages (docs/algorithms.md#group-advantage, docs/algorithms.md#rloo for RLOO)."""
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

    kl_roles: tuple = ("own",)
    """Rows whose tokens carry the KL term (HACPO's ``kl_on_cross`` adds "peer")."""

    def build_batch(self, ctx: StepContext, slots) -> TrainBatch:
        """Rows from the slots' rollouts: masks, old log-probs and role as the rollouts state them."""
        rows = []
        for si, g in enumerate(slots):
            weights = g.weights or [1.0] * g.n
            advantages = g.advantages or [0.0] * g.n
            dead = self.cfg.drop_dead_groups and g.source == "own" and not any(advantages)
            for r, a, w in zip(g.rollouts, advantages, weights):
                if w <= 0 or r.dropped or dead:
                    continue  # rejected responses leave the loss and its denominator
                rows.append(self.train_row(r, float(a), float(w), si))
        return TrainBatch(rows, list(slots), pad_id=ctx.policy.pad_id)

    def train_row(self, r: Rollout, advantage: float, weight: float, slot: int) -> TrainRow:
        n = len(r.token_ids)
        lm = [0.0] * r.prefix_len + [1.0] * (n - r.prefix_len)
        if r.loss_mask is not None:
            lm = [a * b for a, b in zip(lm, r.loss_mask)]
        if self.cfg.mask_truncated and r.finish_reason == "length":
            lm = [0.0] * n
        if r.role not in self.kl_roles:
            km = [0.0] * n
        else:
            km = list(lm) if r.kl_mask is None or r.role != "own" else list(r.kl_mask)
        old = r.logprobs if r.old_logp is None else r.old_logp
        return TrainRow(r.prompt_token_ids, r.token_ids, old, lm, km, advantage, weight, r.role, slot,
                        r.origin.mean_logp if r.origin else None, r.old_logp is not None, r)

    def schedule(self, ctx: StepContext, batch: TrainBatch) -> list:
        """Row indices of each minibatch: ``slot_chunks`` in order, repeated for ``optim.epochs``."""
        chunks = self.slot_chunks(ctx, batch)
        out = []
        for _ in range(ctx.run.epochs):
            for chunk in chunks:
                members = set(chunk)
                idx = [i for i, r in enumerate(batch.rows) if r.slot in members]
                if idx:
                    out.append(idx)
        return out

    def slot_chunks(self, ctx: StepContext, batch: TrainBatch) -> list:
        """Slots, in order, split into ``optim.minibatches`` contiguous minibatches."""
        k = max(1, ctx.run.minibatches)
        return [list(range(start, end)) for start, end in minibatch_bounds(len(batch.groups), k)]

    def surrogate(self, ctx: StepContext, logp: torch.Tensor, mb: MiniBatch) -> Surrogate:
        """The policy-gradient part for own and peer rows (docs/algorithms.md#clipped-surrogate): the clipped surrogate with
        the run's shared clip (``self.clip``, config keys ``optim.clip.*``)."""
        c = self.clip
        tok, info = clipped_surrogate(logp, mb.old_logp, mb.advantages, c["eps_low"], c["eps_high"], c["dual_clip_c"])
        return Surrogate(tok, info)

    def loss(self, ctx: StepContext, policy, mb: MiniBatch):
        """Policy gradient (own + peer rows, per-sequence weights) + aux NLL (aux rows) - entropy bonus + KL. The
        policy, entropy and KL terms share one normaliser, the policy term's (docs/algorithms.md#loss-aggregation):
        the KL sums over its own tokens (``kl_mask``) and divides as the policy term does."""
        c = self.cfg
        # the update's forward code for a micro-batch: on the first minibatch it also sets theta_old
        # (MiniBatch.logprobs, docs/algorithms.md#notation-and-conventions)
        logp, ent = mb.logprobs(policy, with_entropy=True, entropy_grad=bool(c.entropy_coeff))
        pg = self.surrogate(ctx, logp, mb)
        tok = sequence_terms_as_tokens(pg.token_loss, pg.seq_loss, pg.seq_rows)
        mask = self.pg_mask(mb)
        # a micro-batch: its minibatch's denominator, so the micro losses add up exactly
        den = mb.norm["pg"] if mb.norm is not None else self.agg_normalizer(ctx, mb)
        loss = agg_loss(tok * mb.weights.unsqueeze(1), mask, c.loss_agg, den)
        metrics = token_metrics(pg.info, mask, mb.is_peer, ent)
        if bool(mb.is_aux.any()):
            ell = sequence_mean_logp(logp[mb.is_aux], mb.loss_mask[mb.is_aux])
            loss = loss + aux_nll_loss(ell, mb.weights[mb.is_aux])
            metrics[M.LOSS_AUX_NLL] = float(-ell.detach().mean())
        if c.entropy_coeff:
            loss = loss - c.entropy_coeff * agg_loss(ent, mask, c.loss_agg, den)
        if c.beta_kl > 0:
            with torch.no_grad():
                ref, _ = ctx.ref_policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
            kl = kl_k3(logp, ref)
            loss = loss + c.beta_kl * agg_loss(kl, mb.kl_mask, c.loss_agg, den, den_mask=mask)
            metrics[M.KL] = float(agg_loss(kl.detach(), mb.kl_mask, c.loss_agg))  # the mean over the KL tokens
        return loss, metrics

    @staticmethod
    def pg_mask(mb: MiniBatch) -> torch.Tensor:
        """The token mask of the policy-gradient (and entropy) terms: the loss mask of every row but aux rows."""
        return mb.loss_mask * (~mb.is_aux).unsqueeze(1).to(mb.loss_mask.dtype)

    def agg_normalizer(self, ctx: StepContext, mb: MiniBatch) -> Optional[float]:
        if self.cfg.loss_agg == "seq-mean-token-sum-norm":
            return float(int((~mb.is_aux).sum()) * ctx.max_response)
        return None

    def norms(self, ctx: StepContext, mb: MiniBatch) -> dict:
        """The denominator of ``loss``'s aggregated terms over a whole minibatch (``agg_denominator``), which each
        of its micro-batches divides by (``optim.max_tokens_per_micro``): ``pg``, shared by the policy-gradient,
        entropy and KL terms. A learner that aggregates other terms in ``loss`` adds theirs."""
        return {"pg": agg_denominator(self.pg_mask(mb), self.cfg.loss_agg, self.agg_normalizer(ctx, mb))}

    # ---- state (for checkpoints) ------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass


@dataclass
class Surrogate:
    """A learner's policy-gradient terms for a minibatch: a token loss ``[B, R]``; optionally one value per
    sequence for the rows in ``seq_rows`` (e.g. HACPO's cross samples); ``info`` holds ``ratio``,
    ``clipped_low``, ``clipped_high``, ``dual_clipped`` for the clip metrics."""

    token_loss: torch.Tensor
    info: dict
    seq_loss: Optional[torch.Tensor] = None
    seq_rows: Optional[torch.Tensor] = None


def token_metrics(info: dict, mask: torch.Tensor, is_peer: torch.Tensor, ent: Optional[torch.Tensor]) -> dict:
    """Clip fractions split own vs peer tokens (the paper's Table 9), entropy, ratio."""
    clipped = (info["clipped_low"] | info["clipped_high"]).float()
    m = mask.float()
    peer = is_peer.float().unsqueeze(1) * m
    own = m - peer

    def frac(x, w):
        d = float(w.sum())
        return float((x * w).sum()) / d if d > 0 else None

    out = {M.CLIP_FRAC: frac(clipped, m), M.CLIP_FRAC_OWN: frac(clipped, own), M.CLIP_FRAC_PEER: frac(clipped, peer),
           M.CLIP_FRAC_LOW: frac(info["clipped_low"].float(), m),
           M.CLIP_FRAC_HIGH: frac(info["clipped_high"].float(), m),
           M.RATIO_MEAN: frac(info["ratio"].expand_as(m), m),
           M.TOKENS_PEER_SHARE: frac(peer, m) if m.sum() > 0 else None}
    if ent is not None:
        out[M.ENTROPY] = frac(ent.detach(), m)
    return out


# ------------------------------------------------------------------------------------------------
# helpers shared by the peer-exchange learners (GRAFT, HACPO, SGT)
# ------------------------------------------------------------------------------------------------

def require_peer(name: str, run: LearnerFacts, peer=()):
    """The error for a peer-exchange learner that meets no peer at exchange time (``peer`` None); a run
    config without a peer source is refused at load (``needs_peer``, graftzoo.contract.config)."""
    if run.peer_source == "none" or peer is None:
        raise needs_peer_error(name)


def log_compatibility(ctx: StepContext, rollouts):
    """``peer/s_*`` of localized peer responses: ``s = exp(l_L - l_P)`` under theta_old (docs/algorithms.md#cross-tokenizer-exchange)."""
    if rollouts:
        s = compatibility_score(torch.tensor([r.mean_logp for r in rollouts], dtype=torch.float64),
                                torch.tensor([r.origin.mean_logp for r in rollouts], dtype=torch.float64))
        log_s_stats(ctx, s.tolist())


def log_s_stats(ctx: StepContext, s: list):
    """``peer/s_*``: statistics of the compatibility scores s of this step's peer responses."""
    if s:
        ctx.log(M.PEER_S_MEAN, statistics.fmean(s))
        ctx.log(M.PEER_S_MEDIAN, statistics.median(s))
        ctx.log(M.PEER_S_MIN, min(s))
        ctx.log(M.PEER_S_MAX, max(s))
