"""One training step, top to bottom (docs/architecture.md#one-training-step). With graftzoo.training.models.loss (the loss
of a micro-batch) it is all of the learning path; the trainer around it holds the run (its directory and lock,
resume, threads, evaluation, summaries).

    1. rollouts    every model on the step's prompts: generate and score (``learner.collect``), theta_old
                   through the training path (``theta_old_pass``), advantages; the store records the groups
    2. exchange    every learner with its peer source, the groups of each of its peers (all decisions under
                   theta_old); rows for the loss
    3. update      per minibatch (``learner.schedule``): per micro-batch forward, loss and backward, then one
                   optimizer step (``Policy.update`` runs ``graftzoo.training.models.loss.optimize`` where the model lives:
                   here, or on each rank of its worker group)
    4. sync        the engine decodes the next step with the updated weights

Phases 1 and 3 run model by model, or for every model at once where the run allows it (``Trainer.each_model``).
The step reads only its ``StepState`` (what the trainer hands it, named and typed) and returns a ``StepResult`` (the
metrics and what each model trained on); it writes nothing back. The step never branches on an algorithm's name:
what differs lives in the learner's hooks and the loss it names.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Optional

from graftzoo.contract import metrics as M
from graftzoo.contract.errors import NonFiniteError
from graftzoo.envs.task import UNVERIFIED
from graftzoo.training.learning import diagnostics
from graftzoo.training.learning.ahead import Collected, steps_ahead
from graftzoo.training.engines.engine import EngineError
from graftzoo.training.models.loss import denominators, mean_metrics, minibatch_metrics, stale_metrics


@dataclass(frozen=True)
class StepState:
    """Everything a step reads (the trainer builds it: ``Trainer.step_state``). Per model id: its policy (training
    weights and optimizer, here or in a worker group), learner, rollout engine."""

    cfg: Any                      # the resolved RunConfig
    model_ids: list               # the trained models, in order
    policies: dict
    learners: dict
    engines: dict
    sampler: Any                  # PromptSampler: the step's prompts and epoch
    peers: Any                    # the peer source (graftzoo.peers.sources), or None
    task: Any                     # envs.task.Task: its check of the verifier's undecided answers
    ahead: Any                    # graftzoo.training.learning.ahead.Ahead: batches collected ahead (rollout.max_staleness)
    residency: Any                # graftzoo.training.planner.placement.Residency: which model's state is on the device
    context: Callable             # (step, epoch, model id, model index) -> the model's StepContext
    collect_each: Callable        # phase 1 of every model (seeded engines, the store's records)
    each_model: Callable          # phase 3 of every model, one by one or at once
    phase_wall: Callable          # model id -> wall seconds per phase so far (compute accounting)
    prompts_too_long: int = 0     # training prompts dropped at start-up for their length


@dataclass(frozen=True)
class StepResult:
    """What a step produced: model id -> its metrics, and model id -> the slots it trained on (own and peer groups
    after the exchange: the completions table)."""

    metrics: dict
    slots: dict


def train_step(run: StepState, step: int) -> StepResult:
    """Step ``step`` of every model of ``run``."""
    t0 = time.perf_counter()
    models = run.model_ids
    before = {m: run.phase_wall(m) for m in models}
    source = {m: old_logp_source(run.cfg, run.policies[m], run.engines[m]) for m in models}
    ahead = run.ahead.take(step)  # collected while an earlier step updated (rollout.max_staleness)
    if ahead is None:
        run.sampler.start_step(step)
        prompts, epoch = run.sampler.batch(step)
        ctxs = {m: run.context(step, epoch, m, i) for i, m in enumerate(models)}
    else:
        prompts, epoch, ctxs = ahead.prompts, ahead.epoch, ahead.ctxs

    # 1. rollouts: generate, score (unless collected ahead), theta_old, advantages (the store records them in
    # model order)
    groups = run.collect_each(ctxs, lambda ctx: rollouts(run.learners[ctx.model_id], ctx, prompts,
                                                         source[ctx.model_id],
                                                         ahead.groups[ctx.model_id] if ahead else None),
                              seed=ahead is None)
    for m in models:  # answers the verifier's budget left undecided: a warning, or no update on them
        run.task.check_unverified(step, m, groups[m])
        if run.ahead.k:
            ctxs[m].metrics.update(staleness_metrics(groups[m], m, run.policies[m].version))
    if run.peers is not None:
        run.peers.observe(groups)

    # 2. exchange: every learner with its peers' groups of these prompts; its rows for the loss
    batches, xtime, slots = {}, {}, {}
    for m in models:
        t, ctx = time.perf_counter(), ctxs[m]
        peer = run.peers.groups_by_peer(prompts, step, epoch, m) if run.peers is not None else None
        if peer is not None:
            ctx.metrics.update(diagnostics.complementarity(groups[m], peer))
            ctx.metrics.update(run.peers.step_metrics(step, m))
        elif len(models) >= 2:  # co-trained without exchange: still measure complementarity (Fig. 1 right)
            ctx.metrics.update(diagnostics.complementarity(groups[m], {o: {g.prompt.id: g for g in groups[o]}
                                                                       for o in models if o != m}))
        with run.residency.active(m):  # the exchange may score the peer's responses under this model
            slots[m] = run.learners[m].exchange(ctx, groups[m], peer)
            batches[m] = run.learners[m].build_batch(ctx, slots[m])
        xtime[m] = time.perf_counter() - t

    # the rollouts of the next steps, up to step + k, generated while this step updates (rollout.max_staleness)
    run.ahead.launch(steps_ahead(step, run.ahead.k, run.ahead.ready), partial(collect_ahead, run),
                     models)

    # 3. update and 4. weight sync, each model on its own batch
    out = run.each_model({m: partial(update, run, ctxs[m], batches[m], groups[m], source[m], before[m], xtime[m], t0)
                          for m in models})
    run.ahead.wait()
    return StepResult(out, slots)


def collect_ahead(run, step: int, finished) -> Collected:
    """Phase 1's collect (generate, score) of step ``step``'s prompts, run ahead of its turn (graftzoo.training.learning.ahead):
    the step's sampler draws, contexts and engine seeds, as its own turn would make them; ``finished(m)`` once model
    ``m``'s groups are in."""
    run.sampler.start_step(step)
    prompts, epoch = run.sampler.batch(step)
    ctxs = {m: run.context(step, epoch, m, i) for i, m in enumerate(run.model_ids)}

    def collect(ctx):
        groups = run.learners[ctx.model_id].collect(ctx, prompts)
        finished(ctx.model_id)
        return groups

    return Collected(step, epoch, prompts, ctxs, run.collect_each(ctxs, collect, store=False))


# ----------------------------------------------------------------------------------------------
# 1. rollouts and theta_old (docs/algorithms.md#notation-and-conventions: once per step, the training path)
# ----------------------------------------------------------------------------------------------

def rollouts(learner, ctx, prompts: list, source: str, collected: Optional[list] = None) -> list:
    """Phase 1 of one model: its groups collected (generated, scored; or ``collected`` ahead), theta_old of its own
    rollouts through the training path (``theta_old_pass``), their advantages."""
    groups = learner.collect(ctx, prompts) if collected is None else collected
    with ctx.phase("logprob"):
        groups, diff = theta_old_pass(ctx.policy, groups, source)
    ctx.log(M.ROLLOUT_LOGP_DIFF_MAX, diff)
    return learner.advantages(ctx, groups)


def old_logp_source(cfg, policy, engine) -> str:
    """Where theta_old of a model's own rollouts comes from (``rollout.recompute_old_logp``): ``training``, the
    update's forward code (``Policy.logprobs``), or ``engine``, the log-probs the engine recorded. ``auto`` takes
    the engine's only where they are the training path's (``Engine.records_training_logprobs``)."""
    want = cfg.rollout.recompute_old_logp
    if want == "auto":
        want = not engine.records_training_logprobs(policy)
    return "training" if want else "engine"


def theta_old_pass(policy, groups: list, source: str) -> tuple[list, Optional[float]]:
    """The training-path log-probs of the own rollouts of ``groups`` under theta_old (``Policy.score_sequences``: the
    update's forward code, one no-grad pass), and max |engine log-prob - training-path log-prob| over the sampled
    tokens of those the current policy version decoded (None without any). Returns the groups with, where ``source``
    is ``training`` and for every rollout an older version decoded (``rollout.max_staleness``: its engine log-probs
    are the behaviour policy's, not theta_old), each such rollout a copy carrying them as ``Rollout.theta_old``
    (given prefix tokens keep the engine's) and its ``staleness``, so the ratio base, the peer's l_P and the store's
    log-prob sums all read theta_old as the update computes it (``Rollout.old_logprobs``). It is the step's only
    theta_old pass over these rows; the update adds none (graftzoo.training.models.loss)."""
    rolls = [r for g in groups for r in g.rollouts
             if r.role == "own" and r.origin is None and len(r.token_ids) > r.prefix_len]
    if not rolls:
        return groups, None
    lps, _ = policy.score_sequences([r.prompt_token_ids for r in rolls], [r.token_ids for r in rolls])
    diff, scored, v = None, {}, policy.version
    for r, lp in zip(rolls, lps):
        k = r.prefix_len
        if r.policy_version == v:
            diff = max([diff or 0.0, *(abs(float(a) - b) for a, b in zip(r.logprobs[k:], lp[k:]))])
        if source == "training" or r.policy_version != v:
            scored[id(r)] = list(r.logprobs[:k]) + lp[k:]
    if not scored:
        return groups, diff
    return [replace(g, rollouts=[replace(r, theta_old=scored[id(r)], staleness=v - r.policy_version)
                                 if id(r) in scored else r for r in g.rollouts]) for g in groups], diff


# ----------------------------------------------------------------------------------------------
# 3. the update and 4. the weight sync
# ----------------------------------------------------------------------------------------------

def update(run, ctx, batch, groups: list, source: str, before: dict, xtime: float, t0: float) -> dict:
    """Phases 3 and 4 of one model, its training state on its device: the optimizer updates on ``batch``, the
    engine's weight sync; returns the step's metrics."""
    m, step, pol, learner = ctx.model_id, ctx.step, ctx.policy, run.learners[ctx.model_id]
    with run.residency.active(m):
        check_policy_version(m, pol, groups, run.ahead.k)
        if not run.ahead.overlap:  # an engine generating the next batches stays awake
            run.engines[m].release_memory()
        budget = run.cfg.optim.max_tokens_per_micro
        schedule = learner.schedule(ctx, batch)
        mbs = [[mb.to(pol.device) for mb in batch.micro_batches(idx, budget, partial(denominators, ctx, learner))]
               for idx in schedule]  # each minibatch as micro-batches
        from_forward = source == "training"  # the first minibatch's ratio base: its own forward (training.loss)
        diag = None
        if run.cfg.run.diagnostics:  # opt-in transfer-path measurements; the update is unchanged
            with ctx.phase("diagnostics"):
                diag = diagnostics.before_update(ctx, pol, learner, batch, schedule, budget, from_forward)
        u0 = time.perf_counter()
        try:
            parts = pol.update(ctx, learner, mbs, from_forward, where=f"model {m!r}, step {step}")
        except NonFiniteError as e:  # stopped before the optimizer step: the run fails, nothing saved
            e.model = m
            raise
        if diag is not None:
            with ctx.phase("diagnostics"):
                diag = diagnostics.after_update(pol, batch, diag)
        u1 = time.perf_counter()
        pol.version += 1
        run.ahead.wait(m)  # the rollouts ahead are decoded by the weights they began with, at step boundaries only
        ctx.log(M.ASYNC_OVERLAP_S, run.ahead.overlap_s(m, u0, u1))
        sync_s = run.engines[m].sync_weights()  # the next generate decodes with the updated weights
        return step_metrics(run, ctx, groups, batch, parts, diag, before, xtime, sync_s, t0)


def step_metrics(run, ctx, groups, batch, parts, diag, before, xtime, sync_s, t0) -> dict:
    """The model's metrics of the step (graftzoo.contract.metrics): its rollouts' outcomes, the update's (each
    minibatch's merged over the processes that trained it, then the mean over minibatches), what the hooks
    logged, the diagnostics, the time of each phase."""
    met = {**outcome_metrics(groups), **mean_metrics([minibatch_metrics(p) for p in parts]), **ctx.metrics,
           **(diag or {})}
    if run.ahead.k:
        met.update(stale_metrics(batch, run.cfg.rollout.tis_cap))
    dt = {k: v - before.get(k, 0.0) for k, v in run.phase_wall(ctx.model_id).items()}
    met.update({M.LR: ctx.policy.lr, M.TIME_GENERATE: dt.get("generate", 0.0), M.TIME_SCORE: dt.get("score", 0.0),
                M.TIME_LOGPROB: dt.get("logprob", 0.0), M.TIME_UPDATE: dt.get("update", 0.0),
                M.TIME_EXCHANGE: xtime, M.TIME_WEIGHT_SYNC: sync_s, M.TIME_OFFLOAD: dt.get("offload", 0.0),
                M.BATCH_TOKENS: sum(len(r.prompt_ids) + len(r.response_ids) for r in batch.rows),
                M.EPOCH: ctx.epoch, M.ROLLOUT_PROMPTS_TOO_LONG: run.prompts_too_long})
    toks = ctx.metrics.get(M.ROLLOUTS_TOKENS, 0)
    met[M.PERF_TOKENS_PER_S] = toks / met[M.TIME_GENERATE] if met[M.TIME_GENERATE] > 0 else None
    met[M.TIME_STEP] = time.perf_counter() - t0
    return met


def check_policy_version(model_id: str, policy, groups, max_staleness: int = 0) -> None:
    """Own rollouts are trained only by the policy version that generated them, or one at most ``max_staleness``
    updates older (``rollout.max_staleness``; their loss corrects for it): an engine that decoded with other weights
    (a weight sync that did not happen) fails the step (``EngineError``) instead of training off-policy data as
    on-policy."""
    v = policy.version
    stale = sorted({r.policy_version for g in groups for r in g.rollouts
                    if r.model_id == model_id and r.origin is None and not 0 <= v - r.policy_version <= max_staleness})
    if stale:
        allowed = f"version {v}" if not max_staleness else f"versions {max(0, v - max_staleness)}..{v}"
        raise EngineError(f"model {model_id!r}: rollouts generated by policy version(s) {stale} reached the update "
                          f"of version {v} (allowed: {allowed}, rollout.max_staleness={max_staleness}): the engine's "
                          f"weights were not synced after an update")


def staleness_metrics(groups, model_id: str, version: int) -> dict:
    """How many updates older than theta_old (policy ``version``) the step's own rollouts of ``model_id`` are."""
    ages = [version - r.policy_version for g in groups for r in g.rollouts if r.model_id == model_id and r.origin is None]
    return {M.ASYNC_STALENESS_MEAN: statistics.fmean(ages) if ages else None,
            M.ASYNC_STALENESS_MAX: max(ages) if ages else None}


def outcome_metrics(groups) -> dict:
    """The rollouts' outcomes: reward, accuracy, group kinds, lengths, truncation, the verifier's undecided."""
    rolls = [r for g in groups for r in g.rollouts]
    n = max(1, len(groups))
    lens = [len(r.token_ids) - r.prefix_len for r in rolls]
    return {
        M.REWARD_MEAN: statistics.fmean(r.reward for r in rolls) if rolls else None,
        M.REWARD_ACC: statistics.fmean(float(r.correct) for r in rolls) if rolls else None,
        M.GROUPS_COUNT: len(groups),
        M.GROUPS_ALL_FAIL: sum(g.all_fail for g in groups) / n,
        M.GROUPS_ALL_SUCCESS: sum(g.all_success for g in groups) / n,
        M.GROUPS_MIXED: sum(g.mixed for g in groups) / n,
        M.RESPONSE_LEN_MEAN: statistics.fmean(lens) if lens else None,
        M.RESPONSE_TRUNC_RATE: statistics.fmean(float(r.finish_reason == "length") for r in rolls) if rolls else None,
        M.VERIFIER_TIMEOUTS: sum(r.status == "timeout" for r in rolls),
        M.VERIFIER_UNVERIFIED: sum(r.status == UNVERIFIED for r in rolls),
        M.VERIFIER_UNVERIFIED_SHARE: statistics.fmean(r.status == UNVERIFIED for r in rolls) if rolls else None,
    }

