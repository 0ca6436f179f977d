"""Asynchronous rollouts with bounded staleness (``rollout.max_staleness: k``, docs/scaling.md#asynchronous-rollouts;
the loss's truncated importance weight, docs/algorithms.md#stale-rollouts):

1. the loss (``micro_batch_loss``, rows built by a learner's ``build_batch``): stale rows whose behaviour log-probs
   are theta_old's give today's loss and gradients bit for bit; otherwise each token's term is weighed by
   ``min(pi_old / pi_behaviour, rollout.tis_cap)``; tokens out of the loss mask (a given prefix, a masked token)
   enter neither a denominator nor the ``async/is_*`` metrics;
2. ``check_policy_version``: rollouts up to k versions old reach the update, older ones are refused;
3. seeded runs of the micro pair (``train``, as a researcher drives it): a run with k = 1 or 2 repeats exactly, its
   step 0 is the synchronous loop's, step s trains on rollouts of policy version max(0, s - k); every builtin algorithm
   trains with k = 1;
4. ``graftzoo train`` killed with kill -9 during a step resumes, from the rollouts its checkpoint holds ahead, to the
   metrics of a run never interrupted.

The vLLM engine core in its own process (the collect truly overlapping the update) is in tests/test_vllm_runs.py,
the Ray backend in tests/test_ray_backend.py."""
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import loss_and_grads, cli_here, scored_rollout

from graftzoo.algos import BUILTIN
from graftzoo.algos.base import StepContext
from graftzoo.contract.config import LearnerFacts, load_config
from graftzoo.contract.registry import get_algo
from graftzoo.contract.types import Group, Prompt, Rollout
from graftzoo.training.run.checkpoint import list_checkpoints
from graftzoo.training.engines.engine import EngineError
from graftzoo.training.models.loss import denominators, stale_metrics
from graftzoo.training.planner.build import build_policy
from graftzoo.training.learning.step import check_policy_version
from graftzoo.training.trainer import Trainer, train

torch.set_num_threads(1)
LEARNER = "micro-qwen-char"
PEER = {"hacpo", "sgt", "graft"}
UNSEEDED = ("time/", "perf/", "async/overlap_s")   # wall-clock figures differ from run to run
CAP = 2.0                       # rollout.tis_cap's default
# as tests/test_step_metrics.py (two minibatches, micro-batches, a KL, an entropy bonus), with more rollouts of easy
# prompts so that some groups are mixed (a policy-gradient term for the importance weights to scale)
SETTINGS = ["run.track=false", "run.eval_at_end=false", "run.eval_at_start=false", "task.difficulty=1",
            "task.prompts_per_step=6", "rollout.n=8", "optim.lr=3e-3", "optim.minibatches=2",
            "optim.max_tokens_per_micro=400", "algo.beta_kl=0.02", "algo.entropy_coeff=0.001"]
STEPS = 4


# ------------------------------------------------------------------------------------------------
# 1. the loss of stale rows
# ------------------------------------------------------------------------------------------------

PROMPTS = [Prompt(id=f"p{i}", text=f"{10 + i}+{20 + i}", gold=str(30 + 2 * i)) for i in range(3)]
MIXED = [1, 0, 0, 1]


@pytest.fixture(scope="module")
def pol():
    cfg = load_config(pair="micro", algo="grpo")
    return build_policy(next(s for s in cfg.pair.models if s.id == LEARNER), cfg)


@pytest.fixture(scope="module")
def grpo():
    """(learner, step context maker) as the trainer builds them, GRPO's token-mean loss with no KL, no entropy."""
    cfg = load_config(pair="micro", algo="grpo", overrides=["run.track=false"])
    learner = get_algo("grpo")(cfg.algo, LearnerFacts.of(cfg))
    assert learner.cfg.loss_agg == "token-mean" and not learner.cfg.beta_kl and not learner.cfg.entropy_coeff
    return learner, lambda p: StepContext(step=1, epoch=0, run=LearnerFacts.of(cfg), policy=p, engine=None, env=None,
                                          rng=random.Random(0))


def fresh_groups(pol, learner, ctx) -> list:
    """Mixed groups of ``pol``'s responses with their real theta_old log-probs (the policy's weights are theta_old:
    every ratio is 1) and GRPO's advantages."""
    groups = []
    for p in PROMPTS:
        a, b = (int(v) for v in p.text.split("+"))
        texts = [f"{a}+{b}{' ' * i}={a + b if c else a + b + 1 + i}" for i, c in enumerate(MIXED)]
        groups.append(Group(p, pol.model_id, [scored_rollout(pol, p, t, bool(c)) for t, c in zip(texts, MIXED)]))
    return learner.advantages(ctx, groups)


def aged(groups, shift=lambda g, i, j: 0.0) -> list:
    """The same rollouts as if an older policy version had decoded them (what the step's theta_old pass makes of a
    rollout collected ahead): ``staleness`` 1, ``theta_old`` the log-probs, and the behaviour log-probs (the
    engine's, ``logprobs``) theta_old's plus ``shift(group, row, token)``."""
    return [dataclasses.replace(g, rollouts=[
        dataclasses.replace(r, staleness=1, theta_old=list(r.logprobs),
                            logprobs=[lp + shift(gi, i, j) for j, lp in enumerate(r.logprobs)])
        for i, r in enumerate(g.rollouts)]) for gi, g in enumerate(groups)]


def whole(learner, ctx, slots):
    """The step's training batch (``build_batch``) and its rows as one minibatch."""
    batch = learner.build_batch(ctx, slots)
    return batch, batch.minibatch(list(range(len(batch))))


def test_stale_rows_whose_behaviour_is_theta_old_give_todays_loss_bit_for_bit(pol, grpo):
    """(a) fresh rows against (b) the same rows marked stale, their behaviour log-probs theta_old's: every weight is
    exp(0) = 1, so the loss and every gradient are the same to the last bit, though (b) takes the weighed path."""
    learner, context = grpo
    ctx = context(pol)
    groups = fresh_groups(pol, learner, ctx)
    _, mb_a = whole(learner, ctx, groups)
    _, mb_b = whole(learner, ctx, aged(groups))
    assert mb_a.stale is None and mb_b.stale is not None and bool(mb_b.stale.all())
    assert torch.equal(mb_b.behaviour_logp, mb_b.old_logp)
    loss_a, glogp_a, gpar_a, _ = loss_and_grads(learner, ctx, pol, mb_a)
    loss_b, glogp_b, gpar_b, _ = loss_and_grads(learner, ctx, pol, mb_b)
    assert float(glogp_a.abs().max()) > 1e-3 and float(gpar_a.norm()) > 1e-3   # a real policy-gradient term
    assert torch.equal(loss_a, loss_b) and torch.equal(glogp_a, glogp_b) and torch.equal(gpar_a, gpar_b)


def shift_tokens(g, i, j):
    """Behaviour log-probs off theta_old's by a cycle of shifts: weights e^-0.5 = 0.61, e^1 = 2.72 (cut to the cap),
    e^-0.2 = 0.82 and 1."""
    return (0.5, -1.0, 0.2, 0.0)[(i + j) % 4]


def hand_loss(logp, rows, adv, eps_low, eps_high, cap):
    """GRPO's token-mean loss with each token's term weighed, written out in float64: ``sum_t m_t w_t
    (-min(rho_t A, clip(rho_t) A)) / sum_t m_t``, rho_t = exp(logp_t - old_t), w_t = min(exp(old_t - beh_t), cap)
    on a stale row and 1 on a fresh one; and the weights ``[B, R]``."""
    B, R = logp.shape
    num, den, ws = 0.0, 0.0, torch.ones(B, R, dtype=torch.float64)
    for b, row in enumerate(rows):
        for t in range(len(row.response_ids)):
            w = 1.0 if row.behaviour_logp is None else min(math.exp(row.old_logp[t] - row.behaviour_logp[t]), cap)
            rho = math.exp(float(logp[b, t]) - row.old_logp[t])
            term = -min(rho * adv[b], min(max(rho, 1 - eps_low), 1 + eps_high) * adv[b])
            num += row.loss_mask[t] * w * term
            den += row.loss_mask[t]
            ws[b, t] = w
    return num / den, ws


def test_stale_rows_weigh_each_token_by_its_truncated_importance_weight(pol, grpo):
    """(c) behaviour log-probs off theta_old's, one group fresh among stale ones: the loss is the hand-computed
    weighed loss, and the gradient of each token's log-prob is its weight times the unweighed one."""
    learner, context = grpo
    ctx = context(pol)
    groups = fresh_groups(pol, learner, ctx)
    _, mb_fresh = whole(learner, ctx, groups)
    batch, mb = whole(learner, ctx, [groups[0], *aged(groups[1:], shift_tokens)])
    assert mb.stale.tolist() == [False] * 4 + [True] * 8
    loss, glogp, _, logp = loss_and_grads(learner, ctx, pol, mb)
    want, w = hand_loss(logp, batch.rows, mb.advantages.tolist(), learner.clip["eps_low"], learner.clip["eps_high"],
                        CAP)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    _, glogp_fresh, _, _ = loss_and_grads(learner, ctx, pol, mb_fresh)
    assert torch.allclose(glogp.double(), w * glogp_fresh.double(), rtol=1e-5, atol=1e-9)
    on = mb.loss_mask[4:] > 0
    assert {round(float(x), 4) for x in w[4:][on]} == {0.6065, 2.0, 0.8187, 1.0}   # below 1, the cap, 1
    assert float(loss) != pytest.approx(float(loss_and_grads(learner, ctx, pol, mb_fresh)[0]), rel=1e-3)


def test_masked_tokens_enter_no_denominator_and_no_importance_metric(pol, grpo):
    """(d) a given prefix of 2 tokens (loss mask 0) on every stale row and the last token of each masked by the
    learner (``Rollout.loss_mask``), their behaviour log-probs far off (weight 0.007 or the cap if they counted):
    the loss and its denominators are those of the same rows with theta_old there, the ``async/is_*`` metrics
    count the trained tokens only."""
    learner, context = grpo
    ctx = context(pol)
    groups = fresh_groups(pol, learner, ctx)

    def masked(off):
        def shift(g, i, j):
            n = len(groups[g].rollouts[i].token_ids)
            return (off if i % 2 else -off) if j < 2 or j == n - 1 else shift_tokens(g, i, j)
        out = aged(groups, shift)
        for g in out:
            for i, r in enumerate(g.rollouts):
                g.rollouts[i] = dataclasses.replace(r, prefix_len=2, loss_mask=[1.0] * (len(r.token_ids) - 1) + [0.0])
        return out

    batch, mb = whole(learner, ctx, masked(5.0))
    batch_0, mb_0 = whole(learner, ctx, masked(0.0))
    on = mb.loss_mask > 0
    assert int((~on & (mb.attention_mask[:, -mb.resp_len:] > 0)).sum()) == 3 * len(mb)   # 2 prefix + 1 masked each
    assert torch.equal(loss_and_grads(learner, ctx, pol, mb)[0], loss_and_grads(learner, ctx, pol, mb_0)[0])
    assert denominators(ctx, learner, mb) == denominators(ctx, learner, mb_0) == {"pg": float(on.sum())}
    w = torch.where(on, torch.exp(mb.old_logp.double() - mb.behaviour_logp.double()).clamp(max=CAP), 0.0)[on]
    got = stale_metrics(batch, CAP)
    assert got["async/is_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-6)
    assert got["async/is_weight_max"] == pytest.approx(CAP)
    assert got["async/is_capped_frac"] == pytest.approx(float((w >= CAP - 1e-6).double().mean()), rel=1e-6)
    assert got == pytest.approx(stale_metrics(batch_0, CAP))
    assert stale_metrics(learner.build_batch(ctx, groups), CAP) == {
        "async/is_weight_mean": None, "async/is_weight_max": None, "async/is_capped_frac": None}


# ------------------------------------------------------------------------------------------------
# 2. the policy version an update accepts
# ------------------------------------------------------------------------------------------------

def versions(*vs, model="m") -> list:
    return [Group(PROMPTS[0], model, [Rollout(prompt_id="p0", model_id=model, policy_version=v, text="")
                                      for v in vs])]


def test_rollouts_up_to_max_staleness_versions_old_reach_the_update():
    policy = SimpleNamespace(version=5)
    check_policy_version("m", policy, versions(5, 4), max_staleness=1)            # theta_old's own and 1 older
    check_policy_version("m", policy, versions(3), max_staleness=2)
    check_policy_version("m", policy, versions(4) + versions(0, model="peer"), max_staleness=1)   # not this model's
    with pytest.raises(EngineError, match=r"version\(s\) \[3\].*versions 4\.\.5, rollout\.max_staleness=1"):
        check_policy_version("m", policy, versions(5, 4, 3), max_staleness=1)
    with pytest.raises(EngineError, match=r"version\(s\) \[4\].*version 5, rollout\.max_staleness=0"):
        check_policy_version("m", policy, versions(4))                           # the synchronous loop
    with pytest.raises(EngineError, match=r"version\(s\) \[6\]"):
        check_policy_version("m", policy, versions(6), max_staleness=1)          # decoded by weights not yet made


# ------------------------------------------------------------------------------------------------
# 3. seeded runs
# ------------------------------------------------------------------------------------------------

def run_config(algo, out, name, *more):
    return load_config(pair="micro", algo=algo, overrides=[
        *SETTINGS, f"run.steps={STEPS}", f"run.out_dir={out}", f"run.name={name}", *more,
        *(["peer.source=online"] if algo in PEER else [])])


def seeded(run_dir) -> list:
    """metrics.jsonl's records, wall-clock figures left out."""
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(UNSEEDED)} for r in rows]


def by_step(rows) -> dict:
    return {(r["step"], r["model"]): r for r in rows}


RUNS = [("grpo", 1), ("graft", 1), ("grpo", 2)]


@pytest.fixture(scope="module", params=RUNS, ids=[f"{a}-k{k}" for a, k in RUNS])
def twice(request, tmp_path_factory):
    """(algo, k, the seeded records of two runs of the same settings)."""
    algo, k = request.param
    out = tmp_path_factory.mktemp(f"{algo}-k{k}")
    runs = [train(run_config(algo, out, f"r{i}", f"rollout.max_staleness={k}")) for i in range(2)]
    return algo, k, [seeded(r) for r in runs]


def test_a_seeded_run_with_rollouts_ahead_repeats_exactly(twice):
    _, _, (a, b) = twice
    assert len(a) == 2 * STEPS and sorted({r["step"] for r in a}) == list(range(STEPS))
    assert a == b


def test_every_step_trains_on_rollouts_of_the_version_the_schedule_names(twice):
    """Step s's own rollouts all come from policy version max(0, s - k): k updates old once the run is k steps in."""
    _, k, (rows, _) = twice
    for r in rows:
        age = min(r["step"], k)
        assert (r["async/staleness_max"], r["async/staleness_mean"]) == (age, age), r["step"]


def test_stale_steps_weigh_their_rows_and_step_0_has_none(twice):
    """No weight at step 0 (its rollouts are theta_old's); after it, the weights moved between the version that decoded
    and theta_old (lr 3e-3): weights other than 1, none over the cap."""
    _, _, (rows, _) = twice
    for r in rows:
        if r["step"] == 0:
            assert r["async/is_weight_mean"] is None and r["async/is_capped_frac"] is None
        else:
            assert 0 < r["async/is_weight_mean"] and r["async/is_weight_max"] <= CAP
            assert 0 <= r["async/is_capped_frac"] <= 1
    assert any(r["step"] > 0 and abs(r["async/is_weight_mean"] - 1) > 1e-3 for r in rows)
    assert any(r["step"] > 0 and r["groups/mixed"] > 0 for r in rows)   # a policy-gradient term the weights scale


@pytest.mark.parametrize("twice", RUNS[:2], ids=[f"{a}-k{k}" for a, k in RUNS[:2]], indirect=True)
def test_step_0_is_the_synchronous_step_and_later_steps_are_not(twice, tmp_path):
    """Step 0 decodes and trains as k = 0 does (collecting step 1 ahead changes nothing of it); step 1 trains on
    rollouts of version 0, not 1: its numbers differ from the synchronous run's."""
    algo, _, (rows, _) = twice
    sync = by_step(seeded(train(run_config(algo, tmp_path, "sync", "run.steps=2"))))
    ahead = {key: r for key, r in by_step(rows).items() if key[0] < 2}
    assert sorted(ahead) == sorted(sync)
    assert not any(key.startswith("async/") for r in sync.values() for key in r)   # k = 0 logs none
    for key, r in ahead.items():
        mine = {m: v for m, v in r.items() if not m.startswith("async/")}
        if key[0] == 0:
            assert mine == sync[key], key
        else:
            assert mine["loss"] != sync[key]["loss"], key


@pytest.mark.parametrize("algo", BUILTIN)
def test_every_builtin_algorithm_trains_with_rollouts_one_step_ahead(algo, tmp_path):
    """Three steps with k = 1: every model's own rollouts are theta_old's at step 0 and one version old after, every
    loss finite. DAPO's dynamic sampling (its refills drawn ahead too) may find no informative group of a model in a
    step: that model has no own rollouts and no update then."""
    tr = Trainer(load_config(pair="micro", algo=algo, overrides=[
        "run.track=false", "run.steps=3", "task.difficulty=1", "task.prompts_per_step=4", "rollout.max_staleness=1",
        f"run.out_dir={tmp_path}", *(["peer.source=online"] if algo in PEER else []),
        *(["algo.max_gen_batches=4"] if algo == "dapo" else [])]))
    try:
        mets = [tr.train_step(s) for s in range(3)]
    finally:
        tr.close()
    rows = {(s, m): met for s, by_model in enumerate(mets) for m, met in by_model.items()}
    assert sorted(rows) == [(s, m) for s in range(3) for m in sorted(tr.model_ids)]
    assert algo == "dapo" or all(met["groups/count"] for met in rows.values())
    assert any(met["groups/count"] for (s, _), met in rows.items() if s > 0)
    for (s, m), met in rows.items():
        age = min(s, 1) if met["groups/count"] else None
        assert met["async/staleness_max"] == age and met["async/staleness_mean"] == age, (s, m)
        assert age is None or math.isfinite(met["loss"]), (s, m)


# ------------------------------------------------------------------------------------------------
# 4. kill -9 during a step, then the same command again
# ------------------------------------------------------------------------------------------------

# a local plugin (GRAFTZOO_PLUGINS) that kills its own process with SIGKILL in the update of step 2: after the step-1
# checkpoint, with step 3's rollouts collected ahead and held only in memory
KILL_IN_STEP_2 = """
import os
import signal

from graftzoo.training.models import policy

optimize = policy.optimize


def killed_in_step_2(ctx, *args, **kwargs):
    if ctx.step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return optimize(ctx, *args, **kwargs)


policy.optimize = killed_in_step_2
"""


@pytest.mark.slow
def test_kill_9_during_a_step_and_the_same_command_gives_an_uninterrupted_runs_metrics(tmp_path):
    """``graftzoo train`` with k = 1 killed by SIGKILL in step 2's update. Its step-1 checkpoint holds step 2's
    rollouts (``ahead.pt``), decoded by version 1, which no weights of the checkpoint (version 2) could decode again;
    the same command resumes from them, and the run's seeded records are those of a run never interrupted."""
    sets = [*SETTINGS, "task.prompts_per_step=4", "rollout.n=4", "run.steps=4", "run.save_every=1",
            "rollout.max_staleness=1"]
    args = ["train", "--algo", "grpo", "--pair", "micro", "--no-track", "--set", f"run.out_dir={tmp_path}"]
    for s in sets:
        args += ["--set", s]
    killer = tmp_path / "kill_in_step_2.py"
    killer.write_text(KILL_IN_STEP_2)
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", *args, "--set", "run.name=x"]
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                            env=dict(env, GRAFTZOO_PLUGINS=str(killer)))
    run = tmp_path / "x"
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert sorted({r["step"] for r in seeded(run)}) == [0, 1]
    ck = list_checkpoints(run)[-1]
    assert ck.name == "step_000001"
    assert "ahead.pt" in json.loads((ck / "manifest.json").read_text())["files"]   # sized and hashed as the rest
    assert list(torch.load(ck / "ahead.pt", weights_only=True)) == ["2"]   # step 2's rollouts, collected in step 1

    lowered = tmp_path / "lowered"
    shutil.copytree(run, lowered / "x")  # the killed run, resumed below with rollouts in turn

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from step_000001 (2 of 4 steps done)" in rerun.stderr, rerun.stderr[-3000:]
    ref = cli_here(*args, "--set", "run.name=ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    got, want = seeded(run), seeded(tmp_path / "ref")
    assert len(want) == 8 and got == want

    # resumed with rollout.max_staleness lowered to 0: step 2's batch, decoded by version 1, is too old for the update
    # of version 2 now: dropped (said once), the step collects anew in its turn and the run ends
    turn = subprocess.run([*cmd, "--set", f"run.out_dir={lowered}", "--set", "rollout.max_staleness=0",
                           "--allow-config-change", "rollout.max_staleness,run.out_dir"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert turn.returncode == 0, turn.stderr[-3000:]
    assert turn.stderr.count("older than rollout.max_staleness=0 allows: dropped") == 1, turn.stderr[-3000:]
    later = [r for r in seeded(lowered / "x") if r["step"] >= 2]
    assert len(later) == 4 and all(r.get("async/staleness_mean") is None for r in later)
