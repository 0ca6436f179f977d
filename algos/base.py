"""The Learner interface and the per-step context the step hands it.

One training step, for each model (graftzoo.training.learning.step, docs/architecture.md#one-training-step):

    groups = learner.collect(ctx, prompts)          # allocate -> generate -> score
    groups = learner.advantages(ctx, groups)        # Group.advantages from the registered estimator it names
    slots  = learner.exchange(ctx, groups, peer)    # GRAFT / HACPO / SGT (graftzoo.algos.peer); identity here
    batch  = learner.build_batch(ctx, slots)        # Rollout fields -> TrainRows (graftzoo.contract.types)
    for u, idx in enumerate(learner.schedule(ctx, batch)):   # minibatch order (peer-last lives here)
        ... the step's loss: get_loss(learner.loss)(LossInputs, cfg, clip) -> PolicyLoss (graftzoo.algos.losses)

What differs between algorithms is stated on the data (Rollout.role / loss_mask / kl_mask / old_logp,
Group.advantages / weights), in a small hook, or by the policy loss the learner names; never by re-patching rows.
A Learner overrides only the hooks it changes; this base class is GRPO (docs/algorithms.md#grpo). The step and the
trainer never branch on an algorithm's name.
"""
from __future__ import annotations

import contextlib
import random
from dataclasses import replace
from typing import Optional

import torch

from graftzoo.algos.advantages import AdvantageInputs, get_estimator
from graftzoo.algos.functional import minibatch_bounds
from graftzoo.contract import metrics as M
from graftzoo.contract.batch import TrainBatch
from graftzoo.algos.config import LearnerConfig
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.types import Group, Rollout, TrainRow
from graftzoo.peers.xt import Carried, localize_groups


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
        self.heldout = heldout  # () -> the held-out prompts, for a section that trains_on_heldout (else None)
        self.policy, self.engine, self.env, self.sampler = policy, engine, env, sampler
        self.ref_policy = ref_policy
        self.rng = rng or random.Random(0)
        self.meter = meter
        self.model_index = model_index
        self.update = 0
        self.metrics: dict = {}
        self.carried = Carried()  # what this step's localize calls re-tokenized (xt/*)
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
        if the peer stopped. Group advantages travel unchanged. A response carried with another text than the one
        its verdict was given on (its stop text cut, or lossy and kept: ``xt.lossy``) is verified again by the task's
        scorer (docs/algorithms.md#exchange-rules-for-real-vocabularies).
        """
        rescore = None if self.env is None else self.env.score_batch
        with self.phase("logprob"):
            out, carried = localize_groups(self.policy, groups, self.run, rescore=rescore)
        self.carried = self.carried + carried  # the step's xt/* cover every call (a population's choice scores first)
        for k, v in self.carried.stats().items():
            self.log(k, v)
        return out


class Learner:
    """GRPO. Subclasses override hooks; ``Config`` declares the ``algo.*`` keys."""

    name = "grpo"
    Config = LearnerConfig
    loss = "clipped"
    """The policy loss (graftzoo.algos.losses, registered by name): a pure function of the micro-batch's tensors."""
    collect_reads_policy = False
    """Whether ``collect`` runs the training model itself (a forward pass, not only its tokenizer): then it never runs
    while the model updates (graftzoo.training.learning.ahead collects such a learner's batches ahead just before the update)."""

    def __init_subclass__(cls, **kwargs):
        """A learner written for the old loss hooks is refused by name: its ``surrogate`` / ``loss`` methods
        would be ignored, silently changing what it trains; a loss is now a registered function it names."""
        super().__init_subclass__(**kwargs)
        stale = [h for h in ("surrogate", "norms", "pg_mask", "agg_normalizer") if h in vars(cls)]
        if stale or not isinstance(cls.loss, str):
            hooks = ", ".join(stale or ["loss"])
            raise TypeError(f"learner {cls.__module__}.{cls.__qualname__}: {hooks} is no longer a Learner hook; "
                            f"write the policy loss as a function registered with "
                            f"graftzoo.algos.losses.register_loss(name) and set the class attribute loss = name "
                            f"(docs/architecture.md#add-an-algorithm)")

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
        """The groups with the advantages of the estimator this learner names (``estimator``; graftzoo.algos.advantages,
        docs/algorithms.md#group-advantage) on the inputs it builds (``advantage_inputs``)."""
        if not any(g.n for g in groups):
            return groups
        adv = get_estimator(self.estimator)(self.advantage_inputs(ctx, groups), self.cfg)
        out, pos = [], 0
        for g in groups:
            out.append(replace(g, advantages=adv[pos:pos + g.n].tolist()))
            pos += g.n
        return out

    @property
    def estimator(self) -> str:
        """The registered advantage estimator (graftzoo.algos.advantages) this learner uses: ``algo.estimator``."""
        return self.cfg.estimator

    def advantage_inputs(self, ctx: StepContext, groups) -> AdvantageInputs:
        """The step's groups as an estimator reads them: shaped rewards, group index and verdicts of every response;
        a learner whose estimator needs more adds it to ``extra``."""
        rewards = [x for g in groups for x in self.shaped_rewards(ctx, g)]
        return AdvantageInputs(torch.tensor(rewards, dtype=torch.float64),
                               torch.tensor([gi for gi, g in enumerate(groups) for _ in range(g.n)], dtype=torch.long),
                               torch.tensor([r.correct for g in groups for r in g.rollouts], dtype=torch.bool))

    def shaped_rewards(self, ctx: StepContext, group: Group) -> list:
        return group.rewards

    def exchange(self, ctx: StepContext, groups, peer: Optional[dict]) -> list:
        """Identity for single-model learners. ``peer`` maps prompt id -> the peer's Group."""
        return groups

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
        old = r.old_logprobs if r.old_logp is None else r.old_logp
        stale = r.staleness > 0 and r.role == "own" and r.origin is None
        return TrainRow(r.prompt_token_ids, r.token_ids, old, lm, self.kl_tokens(r, lm), advantage, weight, r.role,
                        slot, r.origin.mean_logp if r.origin else None, r.old_logp is not None, r,
                        list(r.logprobs) if stale else None)

    def kl_tokens(self, r: Rollout, loss_mask: list) -> list:
        """The tokens of ``r`` that carry the KL term: an own response's ``kl_mask`` (default: its loss mask)."""
        if r.role != "own":
            return [0.0] * len(r.token_ids)
        return list(loss_mask) if r.kl_mask is None else list(r.kl_mask)

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

    # ---- state (for checkpoints) ------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass
