"""A rerun never rewrites what a run did (docs/reliability.md#what-a-rerun-may-change): rerun on a finished run, the
command continues it (more steps, the final evaluation it lacks), does nothing (saying so) or is refused in one line
naming the key, through ``graftzoo train`` as a user types it.

- fewer steps than the run has trained, or no final evaluation on a run that has one: no file changes (bytes and
  modification times), one line;
- every key of the rule's list (``rundir.RERUN_KEYS``, expanded over the declared keys): a test case each, so a key
  added to the list without one fails here;
- a finished run with ``rollout.max_staleness=1`` extended from 2 to 4 steps equals a 4-step run on every seeded
  metric (its last checkpoint holds the rollouts of step 2, collected ahead as a longer run collects them), and its
  2-step final evaluation is kept aside; a change of k on a rerun is refused (lowering it to 0, named, continues).
"""
import fnmatch
import json
import shutil
from pathlib import Path

import pytest
import torch

from graftzoo.contract.config import defaults, load_config
from graftzoo.training.run.checkpoint import list_checkpoints
from graftzoo.training.run.rundir import RERUN_KEYS, RunDirUsageError, flatten, rerun_plan
from helpers import cli_here, one_line_error

UNSEEDED = ("time/", "perf/", "async/overlap_s")


def train_args(out, name, *sets):
    args = ["train", "--algo", "grpo", "--pair", "micro", "--no-track", "--set", f"run.out_dir={out}",
            "--set", f"run.name={name}", "--set", "run.keep_checkpoints=0"]
    for s in sets:
        args += ["--set", s]
    return args


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (relative path -> (bytes, mtime)), the lock file left out."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def records(run: Path) -> list:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def seeded(run: Path) -> list:
    return [{k: v for k, v in r.items() if not k.startswith(UNSEEDED)} for r in records(run)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-step micro GRPO run with its final evaluation (8 held-out prompts, k 2)."""
    out = tmp_path_factory.mktemp("rerun")
    res = cli_here(*train_args(out, "x"))
    assert res.returncode == 0, res.stderr[-3000:]
    return out / "x"


def copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / run.name, ignore=shutil.ignore_patterns(".lock")))


def test_fewer_steps_on_a_finished_run_is_refused_and_no_file_changes(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = snapshot(run)
    res = cli_here(*train_args(tmp_path, "x", "run.steps=1"))
    one_line_error(res, 2, str(run), "'run.steps'", "asks for 1 steps and the run has trained 2", "--overwrite",
                   "run.name")
    assert snapshot(run) == before


def test_no_final_evaluation_on_a_finished_run_does_nothing_and_keeps_the_evaluation(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = snapshot(run)
    assert any(r["step"] == 2 and r.get("eval/avg") is not None for r in records(run))  # the final evaluation
    res = cli_here(*train_args(tmp_path, "x", "run.eval_at_end=false"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "nothing to do: it has trained its 2 steps and has its final evaluation; run.eval_at_end=false takes " \
           "nothing away" in res.stderr, res.stderr
    assert snapshot(run) == before


# each key of the rule's list: the rerun's setting, and what it gives ("refused" with the key named, or "nothing")
CASES = {
    "run.steps": (["run.steps=1"], "refused"),
    "run.epochs": (None, "refused"),  # needs a finite training set: test_fewer_epochs_is_refused_by_the_same_rule
    "run.eval_at_end": (["run.eval_at_end=false"], "nothing"),
    "run.variant": (["run.variant=GRPO (n=4)"], "refused"),
    "rollout.max_staleness": (["rollout.max_staleness=1"], "refused"),
    "eval.dataset": (["eval.dataset=math500"], "refused"),
    "eval.size": (["eval.size=4"], "refused"),
    "eval.min_heldout": (["eval.min_heldout=2"], "refused"),
    "eval.k": (["eval.k=1"], "refused"),
    "eval.greedy": (["eval.greedy=false"], "refused"),
    "eval.temperature": (["eval.temperature=0.5"], "refused"),
    "eval.max_new_tokens": (["eval.max_new_tokens=8"], "refused"),
    "eval.benchmarks": (["eval.benchmarks=[math500]"], "refused"),
    "eval.select": (["eval.select=val_avg", "eval.val_dataset=math500", "eval.allow_test_selection=true"],
                    "refused"),
    "eval.val_dataset": (["eval.val_dataset=math500"], "refused"),
    "eval.val_size": (["eval.val_size=8"], "refused"),
    "eval.allow_test_selection": (["eval.allow_test_selection=true"], "refused"),
    "eval.top_p": (["eval.top_p=0.9"], "refused"),
}


def rule_keys() -> list:
    return sorted(k for k in flatten(defaults()) if any(fnmatch.fnmatchcase(k, p) for p in RERUN_KEYS))


def test_every_key_of_the_rule_has_a_case():
    assert sorted(CASES) == rule_keys()


@pytest.mark.parametrize("key", [k for k in CASES if CASES[k][0]])
def test_each_key_of_the_rule_on_a_finished_run(finished, tmp_path, key):
    """With the run's length asked again, and with more steps: refused in one line naming the key (no file
    changed), or nothing to do."""
    sets, outcome = CASES[key]
    for more in ([], ["run.steps=3"]) if key != "run.steps" else ([],):
        run = copy_of(finished, tmp_path / str(len(more)))
        before = snapshot(run)
        res = cli_here(*train_args(run.parent, "x", *sets, *more))
        if outcome == "refused":
            one_line_error(res, 2, str(run), f"'{key}'" if not key.startswith("eval.") else key)
            assert snapshot(run) == before, key
        elif not more:
            assert res.returncode == 0 and "nothing to do" in res.stderr, res.stderr[-3000:]
            assert snapshot(run) == before, key
        else:  # more steps and no final evaluation: it continues, its 2-step final evaluation kept aside
            assert res.returncode == 0, res.stderr[-3000:]
            assert sorted(p.name for p in (run / "eval" / "after_2_steps").glob("*.json")) == \
                sorted(f"{m}.json" for m in ("micro-gpt2-pair", "micro-qwen-char"))
            assert max(r["step"] for r in records(run)) == 2 and not list((run / "eval").glob("*.json"))


def test_fewer_epochs_is_refused_by_the_same_rule(finished):
    """``run.epochs`` counts steps as the epochs of a finite set: asking for fewer than the run has trained is
    refused naming it (the run's config read as the trainer reads it; 1 epoch = 1 step here)."""
    cfg = load_config(pair="micro", algo="grpo", overrides=["run.track=false", "run.keep_checkpoints=0",
                                                            f"run.name={finished.name}", "run.variant=grpo (n=4)"])
    epochs = cfg.model_copy(update={"run": cfg.run.model_copy(update={"epochs": 1})})

    def total_of(flat):
        return flat["run.epochs"] if flat.get("run.epochs") else flat["run.steps"]
    with pytest.raises(RunDirUsageError, match=r"'run\.epochs' \(1\) asks for 1 steps and the run has trained 2"):
        rerun_plan(finished, epochs, total_of)
    assert rerun_plan(finished, cfg, total_of).action == "nothing"


# ------------------------------------------------------------------------------------------------
# rollout.max_staleness: extending a finished run keeps its schedule
# ------------------------------------------------------------------------------------------------

ASYNC = ["rollout.max_staleness=1", "run.save_every=1", "eval.size=4", "eval.k=1", "eval.greedy=false"]


def test_a_finished_k1_run_extended_to_4_steps_equals_a_4_step_run(tmp_path):
    res = cli_here(*train_args(tmp_path, "short", *ASYNC, "run.steps=2"))
    assert res.returncode == 0, res.stderr[-3000:]
    short = tmp_path / "short"
    last = list_checkpoints(short)[-1]
    assert last.name == "step_000001"
    assert list(torch.load(last / "ahead.pt", weights_only=True)) == ["2"]  # collected as a longer run does
    final = sorted((short / "eval").glob("*.json"))
    kept = {p.name: p.read_bytes() for p in final}

    res = cli_here(*train_args(tmp_path, "short", *ASYNC, "run.steps=4"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from step_000001 (2 of 4 steps done)" in res.stderr, res.stderr[-3000:]
    ref = cli_here(*train_args(tmp_path, "long", *ASYNC, "run.steps=4"))
    assert ref.returncode == 0, ref.stderr[-3000:]
    got, want = seeded(short), seeded(tmp_path / "long")
    assert len(want) == 2 * 4 + 2 and got == want  # 4 steps of 2 models and the final evaluation, every metric
    assert {r.get("async/staleness_mean") for r in want if 1 <= r["step"] < 4} == {1.0}
    assert {p.name: p.read_bytes() for p in (short / "eval" / "after_2_steps").glob("*.json")} == kept


def test_a_change_of_k_on_a_rerun_is_refused_and_lowering_it_to_0_by_name_continues(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = snapshot(run)
    for sets, allow in ((["rollout.max_staleness=2", "run.steps=3"], []),
                        (["rollout.max_staleness=2", "run.steps=3"], ["--allow-config-change",
                                                                       "rollout.max_staleness"])):
        res = cli_here(*train_args(tmp_path, "x", *sets), *allow)
        one_line_error(res, 2, "'rollout.max_staleness' cannot change on a rerun (0 -> 2)")
        assert snapshot(run) == before
