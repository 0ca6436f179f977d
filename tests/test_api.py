"""The Python API: graftzoo.load_config -> graftzoo.train -> RunResult (metrics as a DataFrame) ->
graftzoo.evaluate, as a notebook uses it; and ``import graftzoo`` stays light (no torch) until an API name is used."""
import json
import subprocess
import sys

import pandas as pd
import pytest

import graftzoo
from graftzoo.contract.config import ConfigError


def test_import_graftzoo_is_light_until_the_api_is_used():
    code = ("import graftzoo, sys; assert 'torch' not in sys.modules and 'graftzoo.api' not in sys.modules; "
            "import graftzoo.envs.verify_worker; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert graftzoo.load_config is sys.modules["graftzoo.api"].load_config  # the API, imported on first use
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        graftzoo.nope


def test_load_config_takes_override_lists_and_dicts():
    from_dict = graftzoo.load_config(pair="micro", algo="grpo", overrides={"optim.lr": 3e-5, "run.name": "x1",
                                                                           "pair.train": ["micro-qwen-char"]})
    from_list = graftzoo.load_config(pair="micro", algo="grpo",
                                     overrides=["optim.lr=3e-5", "run.name=x1", "pair.train=[micro-qwen-char]"])
    assert from_dict == from_list and from_dict.optim.lr == 3e-5 and from_dict.run.name == "x1"
    with pytest.raises(ConfigError, match="rollout.n"):
        graftzoo.load_config(pair="micro", algo="grpo", overrides={"rollout.n": 0})


def test_notebook_train_then_evaluate(tmp_path):
    cfg = graftzoo.load_config(pair="micro", algo="grpo", overrides={
        "run.steps": 1, "task.prompts_per_step": 2, "rollout.n": 2, "eval.size": 4, "eval.k": 1, "run.track": False})
    result = graftzoo.train(cfg, run_dir=tmp_path / "run")
    assert isinstance(result, graftzoo.RunResult)
    assert result.run_dir == tmp_path / "run" and result.status == "done" and result.steps == 1
    assert result.config["run"]["steps"] == 1 and result.error is None
    trainer = {m: json.loads((result.run_dir / "eval" / f"{m}.json").read_text()) for m in result.scores}
    assert result.scores == {m: p["overall"]["avg"] for m, p in trainer.items()}
    assert set(result.scores) == {"micro-qwen-char", "micro-gpt2-pair"}
    m = result.metrics
    assert isinstance(m, pd.DataFrame)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(m) == len(lines) and set(m["model"]) == set(result.scores)
    trained = m[m["time/step"].notna()]
    assert list(trained["step"]) == [0, 0] and trained["reward/acc"].between(0, 1).all()
    scores = graftzoo.evaluate(result, benchmarks=["heldout"], k=1, limit=2, greedy=False)
    assert set(scores) == set(result.scores)
    for model, by_bench in scores.items():
        payload = json.loads((result.run_dir / "eval" / "cli" / "step_0-heldout-k1-limit2" / f"{model}.json")
                             .read_text())
        assert by_bench == {"heldout": payload["benchmarks"]["heldout"]["avg"]}
    with pytest.raises(ConfigError, match="not both"):
        graftzoo.train(cfg, algo="grpo")
