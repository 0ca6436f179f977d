"""wandb tracking: the completions table (rows from the step's slots, any algorithm), resuming into the same
wandb run and the step axis (the evaluation before training on the charts), with real wandb in offline mode, read
back from wandb's own files."""
import json
import math
import shutil
from types import SimpleNamespace

import pytest
from helpers import wandb_records

from graftzoo.contract import metrics as M
from graftzoo.contract.config import load_config
from graftzoo.training.run.checkpoint import latest_checkpoint
from graftzoo.training.eval_checkpoints import load_run_config
from graftzoo.training.run.tracking import COMPLETION_COLUMNS, Tracker, completion_rows, wandb_step
from graftzoo.training.trainer import train
from graftzoo.contract.types import Group, Origin, Prompt, Rollout

MODELS = ["micro-qwen-char", "micro-gpt2-pair"]


def _roll(text, reward, logprobs, origin=None, role="own"):
    return Rollout(prompt_id="p", model_id="A", policy_version=0, text=text, token_ids=[1] * len(logprobs),
                   logprobs=logprobs, reward=reward, correct=reward > 0, origin=origin, role=role)


def test_completion_rows_own_and_peer():
    prompt = Prompt(id="p", text="2+3=", gold="5")
    own = Group(prompt, "A", [_roll("4", 0.0, [-1.0, -1.0]), _roll("6", 0.0, [-2.0])], advantages=[0.0, 0.0])
    origin = Origin(model_id="B", tokenizer_id="tokB", mean_logp=-1.5, token_count=3)
    peer = Group(prompt, "B", [_roll("5", 1.0, [-1.0, -1.0], origin, role="peer"),
                               _roll("7", 0.0, [-3.0], origin, role="peer")],
                 advantages=[0.5, -0.5], source="peer", weights=[1.0, 0.0])
    rows = completion_rows(4, "A", [own, peer], limit=10)
    assert [dict(zip(COMPLETION_COLUMNS, r)) for r in rows[:2]] == [
        {"step": 4, "model": "A", "prompt": "2+3=", "response": "5", "reward": 1.0, "advantage": 0.5, "weight": 1.0,
         "source": "peer", "s": pytest.approx(math.exp(-1.0 + 1.5))},       # s = exp(l_L - l_P)
        {"step": 4, "model": "A", "prompt": "2+3=", "response": "7", "reward": 0.0, "advantage": -0.5, "weight": 0.0,
         "source": "peer", "s": pytest.approx(math.exp(-3.0 + 1.5))}]
    assert [(r[3], r[7], r[8]) for r in rows[2:]] == [("4", "own", None), ("6", "own", None)]
    assert [r[3] for r in completion_rows(4, "A", [own, peer], limit=3)] == ["5", "7", "4"]  # peer rows kept first


def _tables(run_dir):
    """{(step, model): table} read back from the offline wandb run's media files."""
    out = {}
    for f in sorted(run_dir.glob("wandb/offline-run-*/files/media/table/**/*.table.json")):
        table = json.loads(f.read_text())
        rows = [dict(zip(table["columns"], r)) for r in table["data"]]
        out[(rows[0]["step"], rows[0]["model"])] = (table["columns"], rows)
    return out


def _offline_run_ids(run_dir) -> list:
    """The wandb run id of each offline run folder, read from its ``run-ID.wandb`` file (the folder's name ends with
    the id, or with ``-1`` after it when two runs start within the same second)."""
    return sorted(f.stem[len("run-"):] for f in run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def _wandb_history(run_dir) -> list:
    """Every history row (key -> value, ``_step`` included) of the run's offline wandb folders, oldest folder
    first, as wandb wrote them to its transaction logs (once its service process, which writes them after
    ``finish`` returns, has stopped: ``wandb.teardown``)."""
    import wandb
    wandb.teardown()
    rows = []
    for f in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for rec in wandb_records(f):
            if rec.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in rec.history.item})
    return rows


def _records(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


OVERRIDES = ["run.track=true", "run.steps=2", "task.prompts_per_step=2", "rollout.n=2", "eval.size=2",
             "run.eval_at_start=true", "run.eval_at_end=false", "tracking.log_completions_every=1",
             "tracking.completions_rows=3", "tracking.entity=graftzoo-lab", "peer.source=online"]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A GRAFT run of the micro pair (2 steps, evaluated before training) tracked to an offline wandb run, then
    the same command with 3 steps after the checkpoint of its last step was lost (a run killed between logging a
    step and saving it): it resumes from step 0, replays step 1 and trains step 2, into the same wandb run. Returns
    the run folder and what the first attempt left (tables, wandb ids, history, metrics.jsonl records)."""
    pytest.importorskip("wandb")
    tmp = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(tmp))
        mp.setenv("WANDB_SILENT", "true")
        run_dir = tmp / "run"
        train(load_config(pair="micro", algo="graft", overrides=OVERRIDES), run_dir=str(run_dir))
        first = SimpleNamespace(tables=_tables(run_dir), ids=_offline_run_ids(run_dir),
                                history=_wandb_history(run_dir), records=_records(run_dir))
        shutil.rmtree(latest_checkpoint(run_dir))   # step 1's checkpoint: the rerun resumes from step 0
        train(load_config(pair="micro", algo="graft", overrides=OVERRIDES[:1] + ["run.steps=3"] + OVERRIDES[2:]),
              run_dir=str(run_dir))
    return SimpleNamespace(run_dir=run_dir, first=first)


def test_completions_table_and_resume_into_the_same_wandb_run(tracked, tmp_path):
    run_dir, first = tracked.run_dir, tracked.first
    tables = first.tables
    assert sorted(tables) == sorted((s, m) for s in (0, 1) for m in MODELS)
    columns, rows = tables[(1, "micro-gpt2-pair")]
    assert columns == COMPLETION_COLUMNS and len(rows) == 3             # tracking.completions_rows
    assert all(r["prompt"] and r["source"] in ("own", "peer") and r["reward"] in (0.0, 1.0) for r in rows)
    assert len(first.ids) == 1
    run_id = first.ids[0]
    # tracking.entity: the run's wandb path (entity/project/id) as wandb records it in the offline run's config
    tracker = Tracker(tmp_path / "entity", load_run_config(run_dir))
    try:
        assert tracker.wandb_run.entity == "graftzoo-lab" and tracker.wandb_run.path.startswith("graftzoo-lab/")
    finally:
        tracker.wandb_run.finish()

    # the rerun with more steps resumed from a checkpoint into the same wandb run
    assert _offline_run_ids(run_dir) == [run_id, run_id]
    assert (2, "micro-qwen-char") in _tables(run_dir)
    files = list(run_dir.glob("wandb/offline-run-*/files/media/table/**/*.table.json"))
    assert len(files) == len(_tables(run_dir)) == 3 * len(MODELS)    # each step's table once: step 1 not again


def test_the_evaluation_before_training_is_on_wandbs_step_axis(tracked):
    """The step -1 evaluation of metrics.jsonl is wandb's first row, at train/step -1 (wandb's step 0), with the
    same values; every row's train/step is its metrics.jsonl step, wandb's steps only go forward, and the resumed
    attempt logs each step once (the replayed step 1 stays the first attempt's)."""
    assert wandb_step(-1) == 0 and wandb_step(4) == 5   # worked example: step -1 is wandb's step 0
    run_dir, first = tracked.run_dir, tracked.first
    before = {r["model"]: r for r in first.records if r["step"] == -1}
    assert sorted(before) == sorted(MODELS)
    row = first.history[0]
    assert row["_step"] == 0 and row[M.WANDB_STEP] == -1
    for model, rec in before.items():
        scores = {k: v for k, v in rec.items() if k.startswith("eval/") and isinstance(v, (int, float))}
        assert M.EVAL_AVG in scores
        assert {k: row[M.wandb_key(model, k)] for k in scores} == pytest.approx(scores)
    assert [r[M.WANDB_STEP] for r in first.history] == [-1, 0, 1]
    history = _wandb_history(run_dir)
    assert history[:len(first.history)] == first.history
    assert [r[M.WANDB_STEP] for r in history] == [-1, 0, 1, 2]           # each step once, in order
    assert all(r["_step"] == wandb_step(r[M.WANDB_STEP]) for r in history)
    # one row per step: both models' records (and their completions tables) share it
    assert all(M.wandb_key(m, M.LOSS) in r for r in history[1:] for m in MODELS)
    # metrics.jsonl keeps step -1 and holds the replayed step 1 once
    assert [(r["step"], r["model"]) for r in _records(run_dir)] == [(s, m) for s in (-1, 0, 1, 2) for m in MODELS]


def test_a_new_wandb_run_of_a_resumed_run_starts_with_its_kept_records(tmp_path):
    """A run resumed with tracking on after untracked attempts (its checkpoint holds no wandb id) opens a new wandb
    run: the records metrics.jsonl keeps go there first, the evaluation before training included, then the new
    steps (the trainer's calls: Tracker, truncate_after(checkpoint step), log)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old = [{"step": -1, "model": "m", "eval/avg": 0.25}, {"step": 0, "model": "m", "loss": 0.5},
           {"step": 1, "model": "m", "loss": 0.75}]   # step 1: after the checkpoint, replayed
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    tracker = Tracker(run_dir, load_config(pair="micro", algo="grpo", overrides=["run.track=true"]))
    tracker.truncate_after(0)
    tracker.log(1, "m", {"loss": 0.125})
    tracker.finish()
    history = _wandb_history(run_dir)
    assert [(r[M.WANDB_STEP], r["_step"]) for r in history] == [(-1, 0), (0, 1), (1, 2)]
    assert (history[0]["m/eval/avg"], history[1]["m/loss"], history[2]["m/loss"]) == (0.25, 0.5, 0.125)
    assert [(r["step"], r.get("loss")) for r in _records(run_dir)] == [(-1, None), (0, 0.5), (1, 0.125)]

