"""The spine through its real call path: config, engine log-probs, trainer, resume, kill -9, store, tracking."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from graftzoo.contract.config import ConfigError, load_config
from graftzoo.training.run.tracking import METRICS
from graftzoo.peers.store import TrajectoryStore
from graftzoo.training.trainer import Trainer, train

ROOT = Path(__file__).resolve().parents[1]


def micro_cfg(tmp_path, *overrides, algo="grpo"):
    return load_config(pair="micro", algo=algo, overrides=[f"run.out_dir={tmp_path}", "run.track=false", *overrides])


def test_unknown_config_key_is_rejected_with_its_name(tmp_path):
    with pytest.raises(ConfigError, match="optim.lrr"):
        micro_cfg(tmp_path, "optim.lrr=1")
    with pytest.raises(ConfigError, match="algo.eps_hi"):
        micro_cfg(tmp_path, "algo.eps_hi=0.3")
    cfg = micro_cfg(tmp_path, "optim.lr=3e-5", "optim.clip.eps_high=0.28")
    assert cfg.optim.lr == 3e-5 and cfg.optim.clip.eps_high == 0.28


def test_presets_are_configs_of_the_family(tmp_path):
    cfg = micro_cfg(tmp_path, algo="grpo_n16")
    assert cfg.algo.name == "grpo" and cfg.rollout.n == 16
    ds = micro_cfg(tmp_path, algo="grpo_n8_ds")
    assert ds.algo.name == "dapo" and ds.algo.dynamic_sampling and ds.rollout.n == 8


def test_behaviour_logprobs_match_the_loss_so_first_ratio_is_one(tmp_path):
    tr = Trainer(micro_cfg(tmp_path, "rollout.temperature=0.7"))
    m = tr.model_ids[0]
    prompts, _ = tr.sampler.batch(0)
    torch.manual_seed(0)
    groups = tr.engines[m].generate(prompts, 3)
    learner = tr.learners[m]
    ctx = tr.context(0, 0, m, 0)
    for g in groups:
        g.advantages = [0.0] * g.n
    batch = learner.build_batch(ctx, groups)
    mb = batch.minibatch(range(len(batch)))
    with torch.no_grad():
        logp, _ = tr.policies[m].logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
    diff = ((logp - mb.old_logp).abs() * (mb.loss_mask > 0)).max()
    assert diff < 1e-4, diff
    assert all(r.finish_reason in ("stop", "length") and r.policy_version == 0 for g in groups for r in g.rollouts)


def _metric_rows(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "async/overlap_s"))} for r in rows]


def test_resume_gives_identical_metrics_and_weights(tmp_path):
    full = train(micro_cfg(tmp_path / "a", "run.steps=3", "run.eval_at_end=false"))
    part = tmp_path / "b"
    train(micro_cfg(part, "run.steps=1", "run.eval_at_end=false"))
    resumed = train(micro_cfg(part, "run.steps=3", "run.eval_at_end=false"))
    assert _metric_rows(full) == _metric_rows(resumed)
    for m in ("micro-qwen-char", "micro-gpt2-pair"):
        a = torch.load(full / "checkpoints/step_000002" / f"{m}.pt", weights_only=True)["policy"]["model"]
        b = torch.load(resumed / "checkpoints/step_000002" / f"{m}.pt", weights_only=True)["policy"]["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_kill_9_loses_at_most_the_current_step(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", "grpo", "--pair", "micro", "--no-track",
           "--set", f"run.out_dir={tmp_path}", "--set", "run.steps=50", "--set", "run.save_every=1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    run_dir = tmp_path / "grpo-micro-s0"
    deadline = time.time() + 240
    while time.time() < deadline:
        ck = sorted((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").exists() else []
        if len(ck) >= 1 and int(ck[-1].name.split("_")[1]) >= 2:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    store = TrajectoryStore(run_dir / "store", create=False)
    logged = max(json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip())
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step_*"))
    last_ck = int(ckpts[-1].name.split("_")[1])
    assert last_ck >= logged - 1          # at most the step in flight is lost
    df = pd.read_parquet(run_dir / "store" / "micro-qwen-char")  # readable with pandas
    assert set(df["step"]) >= set(range(last_ck + 1))
    assert store.steps("micro-qwen-char")
    out = train(micro_cfg(tmp_path, f"run.steps={last_ck + 2}", "run.eval_at_end=false"))
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert steps == sorted(steps) and steps.count(last_ck + 1) == 2  # one record per model, no duplicates


def test_store_schema_and_pandas(tmp_path):
    out = train(micro_cfg(tmp_path, "run.steps=1", "run.eval_at_end=false"))
    df = pd.read_parquet(out / "store" / "micro-gpt2-pair")
    for col in ("prompt_id", "step", "epoch", "model_id", "tokenizer_id", "policy_version", "text", "reward", "correct",
                "advantage", "logp_sum", "token_count", "finish_reason"):
        assert col in df.columns
    assert len(df) == 4 * 4 and (df["token_count"] > 0).all()
    meta = json.loads((out / "store" / "meta.json").read_text())
    assert meta["schema_version"] == 1 and meta["dataset"] == "arithmetic"


# metrics every algorithm logs on every step (the tracker fills each name of METRICS, with None
# where it does not apply, so presence alone proves nothing: these must have values)
EVERY_STEP = ("reward/mean", "reward/acc", "groups/all_fail", "groups/all_success", "groups/mixed", "groups/count",
              "clip/frac", "clip/frac_own", "clip/frac_low", "clip/frac_high", "loss", "grad_norm", "lr", "entropy",
              "ratio/mean", "rollout/logp_diff_max", "response/len_mean", "response/trunc_rate", "perf/tokens_per_s",
              "rollouts/generated",
              "time/generate", "time/score", "time/logprob", "time/exchange", "time/update", "time/step")
EXCHANGE = ("peer/admitted", "peer/rejected", "peer/rescued_groups", "tokens/peer_share")  # GRAFT, every step
CANDIDATES = ("peer/s_mean", "peer/s_median", "peer/s_min", "peer/s_max")  # when a peer response was gated


def _records(run_dir) -> list:
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert rows and all(set(METRICS) <= set(r) for r in rows), "a metric name of the vocabulary is missing"
    return rows


def _assert_logged(rows, names):
    missing = {f"step {r['step']} {r['model']}": [k for k in names if r[k] is None] for r in rows}
    assert not any(missing.values()), f"metrics that apply but were logged as None: {missing}"


def _assert_complementarity(rows):
    """Co-trained pairs measure complementarity: defined exactly when the learner has all-fail groups."""
    for r in rows:
        for k in ("peer/solved_all_fail_frac", "peer/mixed_on_all_fail_frac"):
            assert (r[k] is not None) == (r["groups/all_fail"] > 0), (r["step"], r["model"], k, r[k])


def test_wandb_offline_run_and_metric_vocabulary(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    out = train(load_config(pair="micro", algo="grpo", overrides=[f"run.out_dir={tmp_path}", "run.steps=1",
                                                                   "run.eval_at_end=false", "algo.beta_kl=0.01"]))
    rows = _records(out)
    assert len(rows) == 2
    _assert_logged(rows, EVERY_STEP + ("kl",))   # kl: the KL term applies with beta_kl > 0
    _assert_complementarity(rows)
    assert list(out.glob("wandb/offline-run-*")), "wandb offline run directory missing"


def test_graft_run_logs_the_peer_metrics(tmp_path):
    """A GRAFT step on a pair where exchange happens (addition only, 8 x 8: each micro model has
    all-fail groups its peer solves; delta 0 admits every candidate) logs the peer metrics."""
    out = train(micro_cfg(tmp_path, "peer.source=online", "run.steps=1", "run.eval_at_end=false", "task.mix={add: 1}",
                          "task.difficulty=1", "task.prompts_per_step=8", "rollout.n=8", "algo.delta=0.0",
                          algo="graft"))
    rows = _records(out)
    _assert_logged(rows, EVERY_STEP + EXCHANGE)
    _assert_complementarity(rows)
    gated = [r for r in rows if r["peer/admitted"] + r["peer/rejected"] > 0]
    admitted = [r for r in rows if r["peer/admitted"] > 0]
    assert admitted, "no peer response was admitted: the run does not exercise the exchange"
    _assert_logged(gated, CANDIDATES)
    _assert_logged(admitted, ("clip/frac_peer",))
