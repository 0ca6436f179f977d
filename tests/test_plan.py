"""``graftzoo plan``: parameter counts equal the real models'; the memory parts follow the settings
(micro-batch budget, gradient checkpointing, precision, vLLM sleep mode); the GPU count is the smallest that fits;
the command prints pair1's plan from the architecture in its config (no weights, no network); ``--gpus N`` places
the models on a node (every rank once per group, within the GPU memory, explicit num_workers kept) or exits 1 naming
the model that does not fit."""
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.apps.plan import (GIB, architecture, model_memory, param_count, peak_bytes, per_gpu_parts, plan,
                                split_gpus, train_state_bytes)
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


# ------------------------------------------------------------------------------------------------
# graftzoo plan --gpus N: the placement on a node
# ------------------------------------------------------------------------------------------------

SMOL, QWEN = "HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base"


def run_plan(*args):
    return CliRunner().invoke(main, ["plan", *args])


def placed(*args) -> dict:
    res = run_plan(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def pair_file(tmp_path, **workers) -> str:
    """pair1 with ``num_workers`` set per model id."""
    data = yaml.safe_load(Path("configs/pairs/pair1.yaml").read_text())
    for spec in data["models"]:
        if spec["id"] in workers:
            spec["num_workers"] = workers[spec["id"]]
    path = tmp_path / "pair1w.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_pair1_on_8_gpus_covers_every_rank_once_within_the_gpu_memory():
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "8")
    assert res.exit_code == 0, res.output
    p = placed("configs/pairs/pair1.yaml", "--gpus", "8")
    assert p["layout"] == "separate" and p["fits"] and p["usable_gb"] == pytest.approx(0.9 * 80)
    ranks = [r for g in p["placement"] for r in g["ranks"]]
    assert sorted(ranks) == list(range(8))  # every rank once, each group on GPUs of its own
    by = {g["model"]: g for g in p["placement"]}
    assert by[SMOL]["ranks"] == [0, 1, 2, 3, 4] and by[QWEN]["ranks"] == [5, 6, 7]  # ~ 3.075 B : 1.721 B
    sizes = {q["model"]: q for q in plan(pair1())}
    for g in p["placement"]:
        k, n, q = g["num_workers"], sizes[g["model"]]["params"], g["parts"]
        assert g["engine_per_rank"] == "vllm" and not g["engine_sleeps"] and sum(g["prompts_per_rank"]) in (
            128 // k * 2, 128 // k * 2 + 1)
        assert q["weights"] == pytest.approx(4 * n / k / GIB) and q["adamw_moments"] == pytest.approx(8 * n / k / GIB)
        assert q["working_copy"] == pytest.approx(2 * n / GIB) and q["engine_weights"] == pytest.approx(2 * n / GIB)
        assert q["activations"] == pytest.approx(sizes[g["model"]]["activations_gib"])
        assert q["kv_cache"] == pytest.approx(0.35 * 80 - 2 * n / GIB)
        assert g["per_gpu_peak_gb"] == pytest.approx(sum(q.values())) and g["per_gpu_peak_gb"] <= 0.9 * 80
        # the text says the same
        assert f"ranks {g['ranks'][0]}-{g['ranks'][-1]}: {g['model']}, FSDP2 over {k} ranks" in res.output
        assert f"= {g['per_gpu_peak_gb']:.2f} GiB peak of 72.0" in res.output
        assert f"weights {q['weights']:.2f} + grads {q['grads']:.2f}" in res.output
    assert [r["peak_gb"] for r in p["per_gpu"]] == [by[SMOL]["per_gpu_peak_gb"]] * 5 + [by[QWEN]["per_gpu_peak_gb"]] * 3
    assert p["settings"]["ray.gpus_per_worker"] == 1 and p["settings"][f"pair.models[{QWEN}].num_workers"] == 3


def test_a_node_too_small_exits_non_zero_naming_the_model():
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-mem-gb", "24")
    assert res.exit_code == 1, res.output
    assert f"{SMOL} needs 67.2 GiB per GPU" in res.output and "21.6 GiB available per GPU" in res.output
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-mem-gb", "24", "--json")
    p = json.loads(res.output)
    assert res.exit_code == 1 and not p["fits"] and SMOL in p["error"] and p["settings"] == {}
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "2")  # SmolLM3 alone needs 2 GPUs: no 1 + 1 split
    assert res.exit_code == 1 and f"{SMOL} needs 86.8 GiB per GPU even over 1 rank(s)" in res.output, res.output


def test_explicit_num_workers_are_honoured(tmp_path):
    p = placed(pair_file(tmp_path, **{QWEN: 6}), "--gpus", "8")  # SmolLM3 gets what is left
    assert [(g["model"], g["ranks"], g["num_workers_from_config"]) for g in p["placement"]] == [
        (SMOL, [0, 1], False), (QWEN, [2, 3, 4, 5, 6, 7], True)]
    p = placed("configs/pairs/pair1.yaml", "--gpus", "8", "--set", "ray.num_workers=3")
    assert [g["ranks"] for g in p["placement"]] == [[0, 1, 2], [3, 4, 5]] and p["per_gpu"][7]["models"] == []
    res = run_plan(pair_file(tmp_path, **{SMOL: 1}), "--gpus", "8")  # one rank cannot hold SmolLM3's state
    assert res.exit_code == 1 and f"{SMOL} needs 86.8 GiB per GPU over its 1 rank(s) (num_workers)" in res.output


def test_more_ranks_shard_the_training_state_proportionally():
    smol = next(m for m in model_memory(pair1(), 80.0) if m.model == SMOL)
    two, four = per_gpu_parts(smol, 2), per_gpu_parts(smol, 4)
    for k in ("weights", "grads", "adamw_moments"):
        assert four[k] == pytest.approx(two[k] / 2)
    assert all(four[k] == two[k] for k in ("working_copy", "activations", "engine_weights", "kv_cache"))
    assert peak_bytes(two, False) - peak_bytes(four, False) == pytest.approx(16 * smol.params / 4)
    by_cli = [placed("configs/pairs/pair1.yaml", "--gpus", "8", "--set", f"ray.num_workers={k}")["placement"][0]
              for k in (2, 4)]
    assert by_cli[1]["parts"]["weights"] == pytest.approx(by_cli[0]["parts"]["weights"] / 2)
    assert by_cli[0]["per_gpu_peak_gb"] - by_cli[1]["per_gpu_peak_gb"] == pytest.approx(16 * smol.params / 4 / GIB)


def test_split_and_colocation_rules():
    assert split_gpus([3, 1], [1, 1], 8) == [6, 2] and split_gpus([1, 100], [5, 1], 8) == [5, 3]
    assert split_gpus([3075, 1721], [2, 1], 8) == [5, 3]
    # one GPU for two models: colocated on rank 0, the GPU holding both peaks
    p = placed("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-gb", "141", "--set", "rollout.vllm.kv_cache_gb=4")
    assert p["layout"] == "colocated" and [g["ranks"] for g in p["placement"]] == [[0], [0]]
    assert p["per_gpu"][0]["peak_gb"] == pytest.approx(sum(g["per_gpu_peak_gb"] for g in p["placement"]))
    assert p["settings"]["ray.gpus_per_worker"] == 0.5
    # ray.gpus_per_worker < 1 asks for shared GPUs; an engine asleep during the update: state + max(act, engine)
    p = placed("configs/pairs/pair1.yaml", "--gpus", "4", "--set", "ray.gpus_per_worker=0.5", "--set",
               "run.device=cuda", "--set", "rollout.vllm.sleep_level=1", "--set", "rollout.vllm.kv_cache_gb=4")
    assert p["layout"] == "colocated" and all(g["ranks"] == [0, 1, 2, 3] for g in p["placement"])
    for g in p["placement"]:
        q = g["parts"]
        state = q["weights"] + q["grads"] + q["adamw_moments"] + q["working_copy"]
        assert g["engine_sleeps"] and g["per_gpu_peak_gb"] == pytest.approx(
            state + max(q["activations"], q["engine_weights"] + q["kv_cache"]))
