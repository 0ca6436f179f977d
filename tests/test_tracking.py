"""wandb tracking: the completions table (rows from the step's slots, any algorithm) and resuming into the same
wandb run, with real wandb in offline mode."""
import json
import math

import pytest

from graftzoo.contract.config import load_config
from graftzoo.training.eval_checkpoints import load_run_config
from graftzoo.training.tracking import COMPLETION_COLUMNS, Tracker, completion_rows
from graftzoo.training.trainer import train
from graftzoo.contract.types import Group, Origin, Prompt, Rollout


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


def test_completions_table_and_resume_into_the_same_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    overrides = ["run.track=true", "run.steps=2", "task.prompts_per_step=2", "rollout.n=2", "eval.size=2",
                 "run.eval_at_end=false", "tracking.log_completions_every=1", "tracking.completions_rows=3",
                 "tracking.entity=graftzoo-lab", "peer.source=online"]
    train(load_config(pair="micro", algo="graft", overrides=overrides), run_dir=str(run_dir))
    tables = _tables(run_dir)
    models = ["micro-qwen-char", "micro-gpt2-pair"]
    assert sorted(tables) == sorted((s, m) for s in (0, 1) for m in models)
    columns, rows = tables[(1, "micro-gpt2-pair")]
    assert columns == COMPLETION_COLUMNS and len(rows) == 3             # tracking.completions_rows
    assert all(r["prompt"] and r["source"] in ("own", "peer") and r["reward"] in (0.0, 1.0) for r in rows)
    first = _offline_run_ids(run_dir)
    assert len(first) == 1
    run_id = first[0]
    # tracking.entity: the run's wandb path (entity/project/id) as wandb records it in the offline run's config
    tracker = Tracker(tmp_path / "entity", load_run_config(run_dir))
    try:
        assert tracker.wandb_run.entity == "graftzoo-lab" and tracker.wandb_run.path.startswith("graftzoo-lab/")
    finally:
        tracker.wandb_run.finish()

    # rerun the command with more steps: it resumes from the checkpoint into the same wandb run
    train(load_config(pair="micro", algo="graft", overrides=overrides[:1] + ["run.steps=3"] + overrides[2:]),
          run_dir=str(run_dir))
    assert _offline_run_ids(run_dir) == [run_id, run_id]
    assert (2, "micro-qwen-char") in _tables(run_dir)
