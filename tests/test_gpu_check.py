"""bench/gpu_check.py --dry-run: the device check's own code path on the CPU with tiny models of pair1's two
families (SmolLM3, Qwen3). Every stage runs in the order of its value and reports a status, none fails, the figures
the device run is read for are there and positive (MFU against both peaks, plan's seconds beside the measured, the
decode bandwidth from decode steps alone, the host buffers as plan counts them), the first minibatch's importance
ratio is 1, the peak-memory comparison says why it is skipped on the CPU, the calibration block is one that
``graftzoo plan --calibration`` reads, and every module the check imported is one the lent machine's image has or
a carried wheel provides."""
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from graftzoo.training.planner.memory import calibration_of

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("models", "step_resident", "step_offload", "generate", "ratio", "fsdp", "vllm")  # by value
CHECK = runpy.run_path(str(ROOT / "bench" / "gpu_check.py"))


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
    assert tuple(stages) == STAGES  # every stage ran or said why not, in the order of its value
    assert all(stages[s].get("expected_s") is not None for s in STAGES if stages[s]["status"] != "SKIP")
    assert all(stages[s]["status"] in ("PASS", "SKIP") for s in STAGES)
    assert report["mode"] == "dry-run" and report["missing"] == []

    models = stages["models"]["models"]
    assert {v["family"] for v in models.values()} == {"smollm3", "qwen3"}
    for v in models.values():
        assert positive(v["params"]) and v["params"] == v["params_plan"] and v["tokenizer_roundtrip"]
        assert v["model_vocab"] > v["tokenizer_vocab"]

    gen = stages["generate"]
    assert gen["status"] == "PASS" and positive(gen["bw_fraction"])
    for v in gen["models"].values():  # the decode steps alone, in the bf16 working copy
        assert positive(v["tokens_per_s"]) and 0 < v["decode_s"] < v["wall_s"] and v["compute_dtype_bytes"] == 2

    for name in ("step_resident", "step_offload"):
        step = stages[name]
        assert step["status"] == "PASS" and step["layout"] == name.split("_")[1]
        assert positive(step["update_mfu"])
        assert step["memory"]["status"] == "SKIP" and "CPU" in step["memory"]["reason"]
        assert set(step["models"]) == set(models)
        for v in step["models"].values():
            assert all(positive(v["phases"][ph]["wall_s"]) for ph in ("generate", "logprob", "update"))
            for key in ("generate_tokens_per_s", "logprob_tokens_per_s", "update_tokens_per_s", "update_mfu",
                        "update_mfu_measured_peak", "update_hfu_measured_peak"):
                assert positive(v[key]), (name, key, v)
            assert v["update_hfu_measured_peak"] > v["update_mfu_measured_peak"]  # checkpointing: the recompute
            assert positive(v["plan_s"]["update"]) and positive(v["plan_s"]["logprob"])
            last = v["last_step"]
            assert last["step"] == 1 and positive(last["update_tokens"]) and positive(last["generated_tokens"])
            assert last["weight_sync_s"] is not None and len(v["ratio_mean"]) == 2
    assert all(positive(v["last_step"]["offload_s"]) for v in stages["step_offload"]["models"].values())
    for h in stages["step_offload"]["host"].values():  # one host buffer per model, as plan counts it
        assert positive(h["moved_gb"]) and positive(h["gb_per_s"]) and h["pinned_gb"] == 0  # the CPU pins nothing
        assert positive(h["host_buffer_gb"]) and h["host_buffer_gb"] == h["host_buffer_plan_gb"]

    ratio = stages["ratio"]
    assert ratio["status"] == "PASS" and len(ratio["runs"]) == 4
    assert all(abs(x - 1.0) <= ratio["tolerance"] for r in ratio["runs"].values() for x in r["ratio_mean"])

    fsdp = stages["fsdp"]
    assert fsdp["status"] == "PASS" and fsdp["bitwise_equal"] and fsdp["backend"] == "gloo"
    assert positive(fsdp["save_s"]) and positive(fsdp["load_s"]) and positive(fsdp["saved_gb"])

    assert stages["vllm"]["status"] == "SKIP" and stages["vllm"]["reason"]
    assert positive(report["update_mfu"])
    cal = report["calibration"]
    assert positive(cal["update_hfu"]) and positive(cal["hf_decode_bw_fraction"]) and positive(cal["measured_bf16_flops"])
    assert calibration_of(report)["hf_decode_bw_fraction"] == cal["hf_decode_bw_fraction"]  # plan reads the JSON
    foreign = set(report["imported_modules"]) - set(CHECK["PRESENT"]) - set(CHECK["IMAGE_ALSO"]) - set(
        CHECK["OPTIONAL_HERE"]) - {module for _, _, module, _ in CHECK["WHEELS"]}
    assert not foreign, f"the check imports {sorted(foreign)}: not in the lent machine's image nor carried (WHEELS)"
    assert positive(report["device"]["peak_bf16_tflops"]) and positive(report["device"]["bandwidth_tb_s"])
