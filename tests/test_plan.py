"""``graftzoo plan``: parameter counts equal the real models'; the memory parts follow the settings
(micro-batch budget, gradient checkpointing, precision, vLLM sleep mode); the GPU count is the smallest that fits;
the command prints pair1's plan from the architecture in its config (no weights, no network)."""
import pytest
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.apps.plan import GIB, architecture, param_count, plan, train_state_bytes
from graftzoo.contract.config import load_config
from graftzoo.tiny.build import TinyModelSpec, build_tiny


@pytest.mark.parametrize("pair", ["micro", "tiny"])
def test_param_count_equals_the_real_models(pair):
    for spec in load_config(pair=pair, algo="grpo").pair.models:
        model, _ = build_tiny(TinyModelSpec.from_dict({k: v for k, v in spec.items()
                                                       if k not in ("max_new_tokens",)}), seed=0)
        assert param_count(architecture(spec)) == sum(p.numel() for p in model.parameters()), spec["id"]


def pair1(*overrides):
    return load_config(pair="pair1", algo="grpo", overrides=["run.track=false", *overrides])


def test_the_memory_parts_follow_the_settings():
    base = {p["model"]: p for p in plan(pair1())}
    smol = base["HuggingFaceTB/SmolLM3-3B-Base"]
    assert 3.0e9 < smol["params"] < 3.1e9 and 1.7e9 < base["Qwen/Qwen3-1.7B-Base"]["params"] < 1.75e9
    assert smol["precision"] == "bf16-mixed" and smol["checkpointing"]
    assert smol["state_gib_1gpu"] == pytest.approx(train_state_bytes(smol["params"], "bf16-mixed", 1) / GIB)
    assert train_state_bytes(1000, "bf16-mixed", 4) == 16 * 1000 / 4 + 2 * 1000
    assert smol["activations_other_gib"] > 4 * smol["activations_gib"]  # checkpointing saves most of it
    half = {p["model"]: p for p in plan(pair1("optim.max_tokens_per_micro=8192"))}["HuggingFaceTB/SmolLM3-3B-Base"]
    assert half["activations_gib"] == pytest.approx(smol["activations_gib"] / 2, rel=1e-6)
    for p in base.values():  # the smallest GPU count that fits 90 % of the GPU
        assert p["peak_gib_per_gpu"] <= 0.9 * 80
        fewer = plan(pair1(), gpu_gb=80 * p["gpus"] / (p["gpus"] - 0.5)) if p["gpus"] > 1 else None
        assert fewer is None or all(q["gpus"] <= p["gpus"] for q in fewer)
    asleep = {p["model"]: p for p in plan(pair1("run.device=cuda", "rollout.vllm.sleep_level=2"))}
    assert all(asleep[m]["peak_gib_per_gpu"] < base[m]["peak_gib_per_gpu"] for m in base)  # max, not sum
    unsplit = plan(pair1("optim.max_tokens_per_micro=null", "model.gradient_checkpointing=false"))
    assert all(p["gpus"] is None for p in unsplit)  # a 1.5 M-token minibatch in one pass fits no GPU


def test_the_command_prints_pair1_s_plan_and_names_a_model_it_cannot_size(tmp_path):
    res = CliRunner().invoke(main, ["plan", "configs/pairs/pair1.yaml"])
    assert res.exit_code == 0, res.output
    assert "HuggingFaceTB/SmolLM3-3B-Base: 3.075 B parameters" in res.output
    assert "needs 2 x 80 GiB GPU(s)" in res.output and "total: 3 GPU(s)" in res.output
    cfg = tmp_path / "nohub.yaml"
    cfg.write_text("name: nohub\nmodels:\n  - {id: someone/not-here-7B, kind: hf}\ntemplate: plain\n")
    res = CliRunner().invoke(main, ["plan", str(cfg)])
    assert res.exit_code == 2 and "someone/not-here-7B" in res.output and "arch" in res.output, res.output
