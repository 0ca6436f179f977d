"""The verifier scales with the batch (docs/verifier.md#scaling-with-the-batch): the pool's size follows the CPUs
(``task.verifier_workers: auto``), the batch budget follows the number of calls (``task.verifier_budget: auto``), the
answers the budget cuts off are counted as unverified (``verifier/unverified``), not as judged wrong, and a step with
too many of them warns or fails before its update (``task.max_unverified_share``, ``task.on_unverified``).

Through the real math-verify pool, the real environment's scoring and the real trainer."""
import json
import logging
import os

import pytest

from graftzoo import api
from graftzoo.contract import metrics as M
from graftzoo.contract.config import load_config
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.types import Group, Prompt, Rollout
from graftzoo.envs import verifier as V
from graftzoo.envs import verify_pool as P
from graftzoo.envs.datasets import MathDataset
from graftzoo.envs.env import UNVERIFIED, MathReasoningEnv
from graftzoo.envs.task import Task, UnverifiedError, judge_unverified
from graftzoo.training.learning.step import outcome_metrics

# math-verify hangs on these (a tower of powers); with the soft timer off only the hard kill or the budget stops them
HUNG = ("\\boxed{9^{9^{9^9}}}", "\\boxed{8^{8^{8^8}}}")
GOLD = "12"
RESPONSES = ["\\boxed{12}", "\\boxed{13}", *HUNG]  # correct, wrong (both on the fast path), two for math-verify


def config(*overrides):
    return load_config(pair="micro", algo="grpo", overrides=["run.track=false", *overrides])


@pytest.fixture(autouse=True, scope="module")
def default_pool():
    """The tests resize the process's pool: it is back to ``DEFAULT_WORKERS`` afterwards, caches cleared."""
    V.clear_caches()
    yield
    V.configure_pool(V.DEFAULT_WORKERS)
    V.clear_caches()


def _env(**kw) -> MathReasoningEnv:
    ds = MathDataset("scaling", [Prompt(id="p0", text="What is 3 * 4?", gold=GOLD)])
    return MathReasoningEnv(dataset=ds, verifier_timeout=5.0, **kw)


def _groups(env: MathReasoningEnv) -> list:
    rollouts = [Rollout(prompt_id="p0", model_id="m", policy_version=0, text=t) for t in RESPONSES]
    return env.score_groups([Group(prompt=env.dataset[0], model_id="m", rollouts=rollouts)])


def _live_workers() -> list:
    return [w for w in P._pool()._workers if w.proc.poll() is None]


# ---- the scaling rules ----------------------------------------------------------------------------------------------

def test_auto_workers_follow_the_cpus(monkeypatch):
    assert [P.auto_workers(c) for c in (1, 2, 3, 4, 16, 17, 64)] == [1, 1, 1, 2, 8, 8, P.MAX_AUTO_WORKERS]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)  # taskset / cgroup CPUs
    assert P.available_cpus() == 6 and P.auto_workers() == 3 and P.resolve_workers("auto") == 3
    assert P.resolve_workers(5) == 5 and P.resolve_workers(None) is None
    for bad in (0, -1, 1.5, True, "many"):
        with pytest.raises(ValueError, match="workers"):
            P.resolve_workers(bad)


def test_auto_budget_follows_the_calls_the_timeout_and_the_workers():
    base = P.AUTO_BUDGET_BASE_S
    assert P.auto_budget(0, 2.0, 8) == base
    assert P.auto_budget(1024, 2.0, 8) == base + 2.0 * 128  # 128 prompts x 8 rollouts, all through math-verify
    assert P.auto_budget(1025, 2.0, 8) == base + 2.0 * 129  # a call more: one more turn of the workers
    assert P.auto_budget(1024, 2.0, 1) == base + 2.0 * 1024
    assert P.auto_budget(9, 0.5, 4) == base + 0.5 * 3
    assert P.auto_budget(1024, 2.0, 8) > 30.0  # the old fixed budget would cut such a batch


def test_the_pool_runs_the_worker_count_it_is_given(monkeypatch):
    """``workers: auto`` on 6 CPUs starts 3 workers; another size resizes the running pool in place, and the pool's
    other users (``reward_fn``, ``verify``) keep it and keep working."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    V.start_pool(workers=1)
    pool = P._pool()
    _env(verifier_workers="auto")
    assert P._pool() is pool and P.pool_size() == 3 and len(pool._workers) == 3 and len(_live_workers()) == 3
    assert len({w.proc.pid for w in pool._workers}) == 3
    gone = [w.proc for w in pool._workers[1:]]
    env = Task(config("task.verifier_workers=1", "task.verifier_budget=null")).scoring_env(_env().dataset)
    assert env.verifier_workers == 1 and env.verifier_budget is None
    assert P._pool() is pool and P.pool_size() == 1 and len(_live_workers()) == 1  # resized, not restarted
    assert all(p.poll() is not None for p in gone)  # the stopped workers exited
    reward = V.reward_fn()  # no size: the pool keeps its own
    assert P.pool_size() == 1
    assert reward(None, ["\\boxed{\\sqrt{144}}"], answer=[12]) == [1.0]
    assert V.verify_batch(["\\boxed{2 \\cdot 6}"], [GOLD], budget="auto")[0] == V.VerifyResult(True, "2 \\cdot 6", "ok")


# ---- unverified answers ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cut_groups():
    """The batch scored under a budget too small for its two math-verify calls: both are cut off."""
    V.clear_caches()
    mp = pytest.MonkeyPatch()
    mp.setattr(P, "SOFT_TIMEOUT_FRACTION", 20.0)  # the hung calls run until the budget stops them
    try:
        return _groups(_env(verifier_budget=0.5, verifier_workers=1))
    finally:
        mp.undo()


def test_answers_the_budget_cut_off_are_unverified_not_wrong(cut_groups):
    rolls = cut_groups[0].rollouts
    assert [r.status for r in rolls] == ["ok", "ok", UNVERIFIED, UNVERIFIED]
    assert [r.correct for r in rolls] == [True, False, False, False]  # scored as wrong (reward_wrong) ...
    judged_wrong = [r for r in rolls if not r.correct and r.status != UNVERIFIED]
    assert len(judged_wrong) == 1  # ... but only \boxed{13} was judged wrong
    met = outcome_metrics(cut_groups)  # what the trainer logs for the step
    assert met[M.VERIFIER_UNVERIFIED] == 2 and met[M.VERIFIER_UNVERIFIED_SHARE] == 0.5
    assert met[M.VERIFIER_TIMEOUTS] == 0 and met[M.REWARD_ACC] == 0.25


def test_a_call_out_of_its_own_time_is_a_timeout_not_unverified(monkeypatch):
    """The same hung answer without a budget: the per-call hard kill stops it, a genuine math-verify timeout."""
    monkeypatch.setattr(P, "SOFT_TIMEOUT_FRACTION", 20.0)
    env = _env(verifier_budget=None, verifier_workers=1)
    env.verifier_timeout = 0.5
    rollout = Rollout(prompt_id="p0", model_id="m", policy_version=0, text=HUNG[0])
    groups = env.score_groups([Group(prompt=env.dataset[0], model_id="m", rollouts=[rollout])])
    (scored,) = groups[0].rollouts
    assert scored.status == "timeout" and not scored.correct
    met = outcome_metrics(groups)
    assert met[M.VERIFIER_TIMEOUTS] == 1 and met[M.VERIFIER_UNVERIFIED] == 0


def test_a_step_over_the_share_warns_naming_the_numbers_and_keys(cut_groups, caplog):
    task = Task(config("task.verifier_budget=0.5", "task.verifier_workers=1"))
    with caplog.at_level(logging.WARNING, logger="graftzoo.envs.task"):
        task.check_unverified(7, "tiny-a", cut_groups)
    [record] = [r for r in caplog.records if "unverified" in r.getMessage()]
    text = record.getMessage()
    assert record.levelno == logging.WARNING
    for part in ("step 7", "'tiny-a'", "2 of 4", "50.0%", "task.verifier_budget=0.5 s", "1 math-verify workers",
                 "task.verifier_workers", "task.max_unverified_share=0.05", "task.on_unverified"):
        assert part in text, (part, text)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="graftzoo.envs.task"):  # 2 of 4 is not above a share of 0.5
        Task(config("task.max_unverified_share=0.5")).check_unverified(7, "tiny-a", cut_groups)
    assert not caplog.records


def test_the_error_mode_raises_naming_the_keys(cut_groups):
    task = Task(config("task.on_unverified=error"))
    with pytest.raises(UnverifiedError, match=r"step 3.*2 of 4.*task.on_unverified=error.*not trained on") as err:
        task.check_unverified(3, "tiny-a", cut_groups)
    text = str(err.value)
    assert "task.verifier_budget=auto: 10 s + 2 s x ceil(calls / 1 workers)" in text
    for key in ("task.verifier_budget", "task.verifier_workers", "task.max_unverified_share"):
        assert key in text


def test_the_decision_is_one_pure_function():
    spec = config("task.on_unverified=error", "task.max_unverified_share=0.25").task
    assert judge_unverified(0, "m", 0, 0, spec, 2) is None  # nothing scored
    assert judge_unverified(0, "m", 2, 8, spec, 2) is None  # a share of 0.25 is allowed
    action, message = judge_unverified(0, "m", 3, 8, spec, 2)
    assert action == "error" and "3 of 8 answers (37.5%)" in message and "at most 18 s" in message
    assert judge_unverified(0, "m", 3, 8, config().task, 2)[0] == "warn"


def test_the_trainer_logs_unverified_and_stops_before_the_update(tmp_path, caplog):
    """A real run whose budget verifies nothing: warn mode trains and logs ``verifier/unverified`` with a warning;
    error mode fails at step 0 before its update (no step record)."""
    over = {"run.steps": 1, "run.track": False, "run.progress": False, "run.eval_at_end": False,
            "task.prompts_per_step": 2, "task.verifier_budget": 1e-6, "task.verifier_workers": 1}
    with caplog.at_level(logging.WARNING, logger="graftzoo.envs.task"):
        res = api.train(algo="grpo", pair="micro", overrides={**over, "run.out_dir": str(tmp_path / "warn")})
    assert res.status == "done", res.error
    records = [json.loads(line) for line in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("step") == 0]
    assert steps and all(r[M.VERIFIER_UNVERIFIED] > 0 and r[M.VERIFIER_UNVERIFIED_SHARE] > 0.05 for r in steps)
    assert any("step 0" in r.getMessage() and "unverified" in r.getMessage() for r in caplog.records)
    with pytest.raises(UnverifiedError, match="step 0.*task.on_unverified=error"):
        api.train(algo="grpo", pair="micro", overrides={**over, "task.on_unverified": "error",
                                                        "run.out_dir": str(tmp_path / "error")})
    [run_dir] = (tmp_path / "error").iterdir()
    res = api.RunResult.from_dir(run_dir)
    assert res.status == "failed" and "UnverifiedError" in res.error and "task.verifier_budget" in res.error
    metrics = run_dir / "metrics.jsonl"
    assert not metrics.exists() or not any(json.loads(line).get("step") == 0
                                           for line in metrics.read_text().splitlines())


# ---- the config keys ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override,key,says", [
    ("task.verifier_budget=soon", "task.verifier_budget", "one of auto or a number or null"),
    ("task.verifier_budget=0", "task.verifier_budget", "in (0,"),
    ("task.verifier_workers=0", "task.verifier_workers", "in [1,"),
    ("task.verifier_workers=many", "task.verifier_workers", "one of auto or an integer"),
    ("task.verifier_workers=1.5", "task.verifier_workers", "one of auto or an integer"),
    ("task.max_unverified_share=1.5", "task.max_unverified_share", "in [0, 1]"),
    ("task.max_unverified_share=-0.1", "task.max_unverified_share", "in [0, 1]"),
    ("task.on_unverified=ignore", "task.on_unverified", "one of warn | error"),
    ("task.on_unverifed=warn", "task.on_unverifed", "did you mean 'task.on_unverified'"),
])
def test_bad_values_of_the_new_keys_are_refused(override, key, says):
    with pytest.raises(ConfigError) as err:
        config(override)
    assert f"'{key}'" in str(err.value) and says in str(err.value), str(err.value)


def test_the_new_keys_accept_auto_numbers_and_null():
    task = config().task
    assert (task.verifier_budget, task.verifier_workers, task.max_unverified_share, task.on_unverified) == \
        ("auto", "auto", 0.05, "warn")
    task = config("task.verifier_budget=12", "task.verifier_workers=4", "task.on_unverified=error").task
    assert (task.verifier_budget, task.verifier_workers, task.on_unverified) == (12, 4, "error")
    assert config("task.verifier_budget=null").task.verifier_budget is None
    with pytest.raises(ValueError, match="None or auto"):
        V.verify_batch(["\\boxed{1}"], ["1"], budget="soon")
