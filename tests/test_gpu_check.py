"""bench/gpu_check.py --dry-run: the device check's own code path on the CPU with tiny models of pair1's two
families (SmolLM3, Qwen3). Every stage reports a status, none fails, the figures the device run is read for are
there and positive, the first minibatch's importance ratio is 1, and the peak-memory comparison says why it is
skipped on the CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("models", "generate", "step_resident", "step_offload", "ratio", "fsdp", "vllm")


def positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


@pytest.mark.slow
def test_dry_run_passes_every_stage_with_its_figures(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.is_file(), res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(out.read_text())
    stages = report["stages"]
    assert res.returncode == 0 and report["failed"] == [], json.dumps(stages, indent=1)[-4000:] + res.stderr[-2000:]
    assert set(STAGES) <= set(stages)
    assert all(stages[s]["status"] in ("PASS", "SKIP") for s in STAGES)
    assert report["mode"] == "dry-run" and report["missing"] == []

    models = stages["models"]["models"]
    assert {v["family"] for v in models.values()} == {"smollm3", "qwen3"}
    for v in models.values():
        assert positive(v["params"]) and v["params"] == v["params_plan"] and v["tokenizer_roundtrip"]
        assert v["model_vocab"] > v["tokenizer_vocab"]

    gen = stages["generate"]
    assert gen["status"] == "PASS" and positive(gen["bw_fraction"])
    assert all(positive(v["tokens_per_s"]) and positive(v["generated_tokens"]) for v in gen["models"].values())

    for name in ("step_resident", "step_offload"):
        step = stages[name]
        assert step["status"] == "PASS" and step["layout"] == name.split("_")[1]
        assert positive(step["update_mfu"])
        assert step["memory"]["status"] == "SKIP" and "CPU" in step["memory"]["reason"]
        assert set(step["models"]) == set(models)
        for v in step["models"].values():
            assert all(positive(v["phases"][ph]["wall_s"]) for ph in ("generate", "logprob", "update"))
            for key in ("generate_tokens_per_s", "logprob_tokens_per_s", "update_tokens_per_s", "update_mfu"):
                assert positive(v[key]), (name, key, v)
            last = v["last_step"]
            assert last["step"] == 1 and positive(last["update_tokens"]) and positive(last["generated_tokens"])
            assert last["weight_sync_s"] is not None and len(v["ratio_mean"]) == 2
    assert all(positive(v["last_step"]["offload_s"]) for v in stages["step_offload"]["models"].values())

    ratio = stages["ratio"]
    assert ratio["status"] == "PASS" and len(ratio["runs"]) == 4
    assert all(abs(x - 1.0) <= ratio["tolerance"] for r in ratio["runs"].values() for x in r["ratio_mean"])

    fsdp = stages["fsdp"]
    assert fsdp["status"] == "PASS" and fsdp["bitwise_equal"] and fsdp["backend"] == "gloo"
    assert positive(fsdp["save_s"]) and positive(fsdp["load_s"]) and positive(fsdp["saved_gb"])

    assert stages["vllm"]["status"] == "SKIP" and stages["vllm"]["reason"]
    assert positive(report["update_mfu"]) and positive(report["generate_bw_fraction"])
    assert positive(report["device"]["peak_bf16_tflops"]) and positive(report["device"]["bandwidth_tb_s"])
