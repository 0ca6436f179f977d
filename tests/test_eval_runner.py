"""The evaluation runner (graftzoo eval) on a micro checkpoint, its protocol and checkpoint selection."""
import json
import math

import pytest
import torch
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import load_config
from graftzoo.training.engines.engine import Engine
from graftzoo.envs.datasets import BENCHMARKS, load_dataset
from graftzoo.envs.verifier import VERIFIER_VERSION
from graftzoo.training.run.checkpoint import load_weights
from graftzoo.envs.task import DEFAULT_VAL_SIZE, Task, resolve_benchmarks, validation_slice
from graftzoo.eval import evaluate
from graftzoo.training import selection
from graftzoo.training.eval_checkpoints import build_policies, load_run_config
from graftzoo.training.planner.build import make_eval_engine
from graftzoo.eval.artifacts import load_run, validate_eval
from graftzoo.eval.metrics import bootstrap_ci, pass_at_k
from graftzoo.eval.protocol import summarize
from graftzoo.training.trainer import train

MODELS = ("micro-qwen-char", "micro-gpt2-pair")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A two-step micro GRPO run that keeps both checkpoints (step 0 and step 1)."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "run.steps=2", "run.save_every=1", "run.keep_checkpoints=0", "run.track=false", "run.progress=false",
        "run.eval_at_end=false", "task.prompts_per_step=2", "eval.size=4", "eval.k=1"])
    return train(cfg, run_dir=str(tmp_path_factory.mktemp("evalrun") / "run"))


def test_summarize_protocol():
    # one run, k = 2 samples, 3 items: sample 0 gets items 0, 2 right, sample 1 gets item 2 right
    s = summarize([[[True, False, True], [False, False, True]]])
    assert s["avg"] == pytest.approx(0.5)
    assert s["per_seed_run"] == pytest.approx([2 / 3, 1 / 3]) and s["spread_over"] == "samples"
    assert s["sd"] == pytest.approx(math.sqrt(2 * (1 / 6) ** 2))
    assert s["pass_at_k"] == pytest.approx({"1": 0.5, "2": 2 / 3})
    # two runs of k = 5 on one item with 3 of the n = 10 samples right: the worked example of docs/algorithms.md#evaluation-metrics
    s = summarize([[[True], [True], [False], [False], [False]], [[True], [False], [False], [False], [False]]])
    assert s["pass_at_k"]["5"] == pytest.approx(0.916667, abs=1e-6) == pass_at_k(10, 3, 5)
    assert s["per_seed_run"] == pytest.approx([0.4, 0.2]) and s["spread_over"] == "runs"
    assert s["ci"] is None  # one item: no interval over items
    s = summarize([[[True, False]]])
    assert s["sd"] is None and s["ci"] == [0.0, 1.0]


def test_accuracy_interval_stays_in_0_1():
    """k = 4 samples of 4 problems, one sample right: a t-interval over the 4 sample seeds would be
    [-13.7%, 26.2%]; the bootstrap over problems is the worked example of docs/algorithms.md#evaluation-metrics."""
    one_right = [[[j == 0 and i == 3 for i in range(4)] for j in range(4)]]
    s = summarize(one_right)
    assert s["avg"] == pytest.approx(0.0625)
    assert s["ci"] == pytest.approx([0.0, 0.1875]) and "bootstrap over prompts" in s["ci_method"]
    assert bootstrap_ci([0, 0, 0, 0.25]) == pytest.approx((0.0, 0.1875))
    assert bootstrap_ci([1.0] * 5) == (1.0, 1.0) and bootstrap_ci([0.0] * 5) == (0.0, 0.0)
    vals = [i % 3 / 2 for i in range(50)]
    lo, hi = bootstrap_ci(vals)
    assert 0 <= lo < sum(vals) / 50 < hi <= 1 and bootstrap_ci(vals) == (lo, hi)  # reproducible
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci([])


def test_resolve_benchmarks():
    assert resolve_benchmarks("all") == list(BENCHMARKS)
    assert resolve_benchmarks("amc23, all,heldout") == ["amc23"] + [b for b in BENCHMARKS if b != "amc23"] \
        + ["heldout"]
    with pytest.raises(ValueError, match="no benchmark"):
        resolve_benchmarks(" , ")


def test_cli_eval_artifact_fields(run_dir):
    ckpt = run_dir / "checkpoints" / "step_000000"
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(ckpt), "--benchmarks", "arithmetic,heldout", "--k", "2",
                                    "--limit", "3", "--greedy", "--temperature", "0.7"])
    assert res.exit_code == 0, res.output
    for m in MODELS:
        path = run_dir / "eval" / "cli" / "step_0-arithmetic+heldout-k2-limit3" / f"{m}.json"
        payload = json.loads(path.read_text())
        validate_eval(payload, str(path))
        assert payload["model"] == m and payload["step"] == 0
        assert payload["checkpoint"] == "checkpoints/step_000000" and payload["model_spec"]["id"] == m
        assert set(payload["benchmarks"]) == {"arithmetic", "heldout"}
        for rec in payload["benchmarks"].values():
            assert rec["k"] == 2 and rec["n_items"] == 3 and rec["limit"] == 3 and len(rec["per_seed_run"]) == 2
            assert rec["prompts_too_long"] == 0
            assert set(rec["pass_at_k"]) == {"1", "2"} and 0 <= rec["avg"] <= 1 and "greedy" in rec
            assert rec["pass_at_k"]["1"] == pytest.approx(rec["avg"])
            assert 0 <= rec["ci"][0] <= rec["avg"] <= rec["ci"][1] <= 1 and "bootstrap" in rec["ci_method"]
        assert payload["dataset_hashes"]["arithmetic"] == load_dataset("arithmetic").hash
        assert payload["verifier"] == VERIFIER_VERSION and payload["engine"] == "hf"
        samp = payload["sampling"]
        assert samp["temperature"] == 0.7 and samp["k"] == 2 and samp["greedy"] is True and samp["seeds"] == 1
        assert samp["top_p"] == 1.0 and samp["max_new_tokens"] > 0
        assert payload["selection"] == {"rule": "given"}
    assert f"{MODELS[0]}  arithmetic" in res.output
    # math500's problems are longer than the micro models' prompt limit: left out (never cut), none left to score
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(ckpt), "--benchmarks", "math500", "--k", "1", "--limit",
                                    "3", "--out", str(run_dir / "math500-eval")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "benchmark 'math500': none of its 3 prompts is within model" in res.output
    assert "prompt limit of 88 tokens" in res.output


def test_cli_eval_runs_on_the_runs_threads(run_dir, monkeypatch):
    """``graftzoo eval`` sets torch's threads from the run's ``run.threads`` as ``train`` does (torch's default, a
    thread per core, made it several times slower on a shared CPU)."""
    before = torch.get_num_threads()
    recording = _ThreadRecorder(torch.set_num_threads)
    monkeypatch.setattr(torch, "set_num_threads", recording)
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(run_dir / "checkpoints" / "step_000000"),
                                    "--benchmarks", "heldout", "--k", "1", "--limit", "2", "--out",
                                    str(run_dir.parent / "threads-eval")])
    assert res.exit_code == 0, res.output
    assert recording.calls and set(recording.calls) == {1}, recording.calls  # the run's run.threads
    recording.original(before)


class _ThreadRecorder:
    def __init__(self, original):
        self.original, self.calls = original, []

    def __call__(self, n):
        self.calls.append(n)
        self.original(n)


def test_run_dir_target_selects_last_and_leaves_the_report_its_trainer_files(run_dir):
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(run_dir), "--benchmarks", "heldout", "--k", "1",
                                    "--limit", "2", "--no-greedy", "--model", MODELS[0]])
    assert res.exit_code == 0, res.output
    payload = json.loads((run_dir / "eval" / "cli" / "step_1-heldout-k1-limit2" / f"{MODELS[0]}.json").read_text())
    assert payload["step"] == 1 and payload["selection"] == {"rule": "last", "candidates": [0, 1]}
    assert payload["request"]["benchmarks"] == ["heldout"] and "greedy" not in payload["benchmarks"]["heldout"]
    assert load_run(run_dir).evals == {}  # run.eval_at_end=false: no trainer evaluation; graftzoo eval's is apart


def test_load_weights_restores_the_checkpoint(run_dir):
    cfg = load_run_config(run_dir)
    pol = build_policies(cfg, [MODELS[1]])[MODELS[1]]
    with torch.no_grad():
        for p in pol.model.parameters():
            p.add_(1.0)
    ckpt = run_dir / "checkpoints" / "step_000001"
    load_weights(pol, ckpt)
    saved = torch.load(ckpt / f"{MODELS[1]}.pt", weights_only=True)["policy"]
    for k, v in pol.model.state_dict().items():
        assert torch.equal(v, saved["model"][k]), k
    assert pol.version == saved["version"] == 2


def test_val_avg_picks_the_best_validation_checkpoint(run_dir, monkeypatch):
    cfg = load_run_config(run_dir)
    pols = build_policies(cfg)
    engines = {m: make_eval_engine(p, cfg) for m, p in pols.items()}
    seen = []

    def fake_score(policy, engine, bench, k, **kw):   # checkpoint of step s has policy.version s + 1
        seen.append((bench.name, bench.split, len(bench.prompts)))
        return {"avg": {1: 0.5, 2: 0.25}[policy.version] if policy.model_id == MODELS[0] else 0.1 * policy.version}

    monkeypatch.setattr(selection, "score_benchmark", fake_score)
    out = selection.select_checkpoints(run_dir, cfg, pols, engines, rule="val_avg", val_size=5, k=1)
    assert out[MODELS[0]][0].name == "step_000000" and out[MODELS[0]][1]["selected_step"] == 0
    assert out[MODELS[1]][0].name == "step_000001"
    assert out[MODELS[0]][1]["scores"] == {"0": 0.5, "1": 0.25} and out[MODELS[0]][1]["dataset"] == "val"
    assert set(seen) == {("val", "val", 5)}   # never the test split
    last = selection.select_checkpoints(run_dir, cfg, pols, engines, rule="last")
    assert all(c.name == "step_000001" for c, _ in last.values())


@pytest.mark.parametrize("val", ["math500", "heldout", "aime24"])
def test_selecting_on_a_test_set_raises_unless_allowed(run_dir, monkeypatch, val):
    cfg = load_run_config(run_dir)
    with pytest.raises(selection.SelectionError, match="test set"):
        selection.select_checkpoints(run_dir, cfg, {}, {}, rule="val_avg", val_dataset=val, val_size=2)
    monkeypatch.setattr(selection, "score_benchmark", lambda *a, **kw: {"avg": 0.0})
    pols = {MODELS[0]: object()}
    monkeypatch.setattr(selection, "load_weights", lambda pol, ckpt: None)
    out = selection.select_checkpoints(run_dir, cfg, pols, {MODELS[0]: Engine()}, rule="val_avg", val_dataset=val,
                                    val_size=2, allow_test=True)
    assert out[MODELS[0]][1]["dataset"] == val


def test_cli_refuses_test_selection(run_dir):
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(run_dir), "--select", "val_avg",
                                    "--val-dataset", "math500", "--k", "1"])
    assert res.exit_code != 0 and "test set" in res.output


def test_validation_slice_of_a_training_file():
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "task.env=graftzoo/MathReasoning-v0", "task.dataset=math_train"])
    ids = Task(cfg).validation_ids()
    assert len(ids) == DEFAULT_VAL_SIZE and ids == Task(cfg).validation_ids()
    train_ids = {p.id for p in load_dataset("math_train")}
    assert ids <= train_ids
    val = Task(cfg).validation(size=10)
    assert val.split == "val" and len(val.prompts) == 10 and not Task(cfg).is_test_set(val)
    arith = load_config(pair="micro", algo="grpo")
    assert Task(arith).validation_ids() == set()
    with pytest.raises(ValueError, match="validation slice"):
        validation_slice(load_dataset("amc23"), 40)


class RecordingEngine:
    """An engine wrapper that keeps every response text it generates."""

    def __init__(self, engine):
        self.engine, self.texts = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, *args, **kw):
        groups = self.engine.generate(*args, **kw)
        self.texts += [r.text for g in groups for r in g.rollouts]
        return groups


def test_trainer_final_eval_and_graftzoo_eval_are_one_path(tmp_path, monkeypatch):
    """The trainer's final evaluation and ``graftzoo eval --benchmarks heldout`` on its checkpoint score
    through the same function with the same samples, and eval.top_p (not rollout.top_p) reaches the engine."""
    calls = []
    score = evaluate.score_benchmark

    def spy(policy, engine, bench, k, **kw):
        rec_engine = RecordingEngine(engine)
        rec = score(policy, rec_engine, bench, k, **kw)
        calls.append({"model": policy.model_id, "top_p": engine.top_p, "bench": bench.name, "texts": rec_engine.texts})
        return rec

    monkeypatch.setattr(evaluate, "score_benchmark", spy)
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "run.steps=1", "run.track=false", "run.progress=false", "task.prompts_per_step=2", "eval.size=6",
        "eval.k=3", "eval.top_p=0.9", "rollout.top_p=1.0"])
    run_dir = train(cfg, run_dir=str(tmp_path / "run"))
    assert [c["model"] for c in calls] == list(MODELS)
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(run_dir / "checkpoints" / "step_000000"),
                                    "--benchmarks", "heldout"])
    assert res.exit_code == 0, res.output
    assert len(calls) == 4 and all(c["top_p"] == 0.9 and c["bench"] == "heldout" for c in calls)
    for trained, evaluated in zip(calls[:2], calls[2:]):
        assert trained["model"] == evaluated["model"] and len(trained["texts"]) == 6 * 4   # k = 3 + greedy
        assert trained["texts"] == evaluated["texts"]
    for m in MODELS:
        final = json.loads((run_dir / "eval" / f"{m}.json").read_text())
        ckpt = json.loads((run_dir / "eval" / "cli" / "step_0-heldout-k3" / f"{m}.json").read_text())
        held = ckpt["benchmarks"]["heldout"]
        for key in ("avg", "sd", "ci", "per_seed_run", "pass_at_k", "greedy", "n_items", "k", "seeds"):
            assert final["overall"][key] == held[key], key
        assert final["sampling"] == ckpt["sampling"] and final["sampling"]["top_p"] == 0.9
        assert set(final["benchmarks"]) == {"add", "mul"}   # the trainer reports the held-out split per skill
        assert sum(b["n_items"] for b in final["benchmarks"].values()) == held["n_items"]
    logged = [r for r in load_run(run_dir).metrics if "eval/avg" in r]
    assert {r["model"]: r["eval/avg"] for r in logged} == {m: json.loads(
        (run_dir / "eval" / f"{m}.json").read_text())["overall"]["avg"] for m in MODELS}
