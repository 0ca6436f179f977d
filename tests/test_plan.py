"""``graftzoo plan`` and its model (graftzoo.training.memory): parameter counts equal the real models'; the activation
formulas are within a stated error of the peaks small models really allocate on CPU (bench/plan_check.py); the
memory parts follow the settings (micro-batch budget, gradient checkpointing, KL reference, sleep level); every
phase's peak is printed; the GPU count is the smallest that fits; ``--gpus N`` places the models (separate groups,
colocated, and on one GPU the resident / offload layouts) or exits 1 naming what does not fit; the step-time
formulas; the trainer's entry points (``gpu_layout``, ``host_peak_bytes``)."""
import json
import math
import runpy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import load_config
from graftzoo.tiny.build import build_tiny
from graftzoo.training import memory as M
from graftzoo.training import policy as policy_mod
from graftzoo.training.models import tiny_spec

GIB = M.GIB
SMOL, QWEN = "HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base"


def pair1(*overrides):
    return load_config(pair="pair1", algo="grpo", overrides=["run.track=false", *overrides])


def run_plan(*args):
    return CliRunner().invoke(main, ["plan", *args])


def placed(*args) -> dict:
    res = run_plan(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def smol(cfg=None):
    return next(m for m in M.model_memory(cfg or pair1()) if m.model == SMOL)


@pytest.mark.parametrize("pair", ["micro", "tiny"])
def test_param_count_equals_the_real_models(pair):
    for spec in load_config(pair=pair, algo="grpo").pair.models:
        model, _ = build_tiny(tiny_spec(spec), seed=0)
        assert M.param_count(M.architecture(spec)) == sum(p.numel() for p in model.parameters()), spec.id


# ------------------------------------------------------------------------------------------------
# calibration: the formulas against the peaks measured on CPU
# ------------------------------------------------------------------------------------------------

CHECK = runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "plan_check.py"))
UPDATE_ERROR, LOGPROB_ERROR = 0.06, 0.15  # bench/plan_check.py over its 11 cases: -4.3..+2.8 % and -12.3..+5.9 %


@pytest.mark.parametrize("case", [("tiny-qwen-char", "fp32", False, 8, 64, 64),
                                  ("tiny-qwen-char", "fp32", True, 8, 64, 64),
                                  ("tiny-gpt2-pair", "fp32", True, 8, 64, 64),
                                  ("llama", "fp32", False, 4, 128, 128),
                                  ("qwen3", "fp32", True, 4, 128, 128),
                                  ("llama", "bf16-mixed", True, 4, 128, 128)])
def test_the_activation_formulas_match_the_measured_peaks(case):
    chunk = policy_mod.LOGIT_CHUNK
    r = CHECK["measure"](*case)
    assert policy_mod.LOGIT_CHUNK == chunk  # the bench's smaller pieces do not leak into the trainer
    up, lp = r["update_plan"] / r["update"] - 1, r["logprob_plan"] / r["logprob"] - 1
    assert abs(up) <= UPDATE_ERROR, (f"{case}: update micro-batch planned {r['update_plan'] / 2**20:.2f} MiB, "
                                     f"measured {r['update'] / 2**20:.2f} MiB: error {up:+.1%}")
    assert abs(lp) <= LOGPROB_ERROR, (f"{case}: logprob pass planned {r['logprob_plan'] / 2**20:.2f} MiB, "
                                      f"measured {r['logprob'] / 2**20:.2f} MiB: error {lp:+.1%}")


def test_the_layer_table_covers_every_family_and_precision():
    a = M.architecture(load_config(pair="pair1", algo="grpo").pair.models[0])
    assert a.family == "smollm3" and M.layer_bytes(a, "bf16-mixed", "saved") == pytest.approx(
        26 * 2048 + 8 * 11008 + 4 * 2048 + 4 * 512 + 4 * 16)
    assert M.layer_bytes(a, "model", "saved") == pytest.approx(
        (24 * 2048 + 16 * 11008 + 8 * 2048 + 8 * 512) / 2 + 4 * 16)  # pure bf16: the float32 row halved
    for kind in ("saved", "backward", "recompute", "forward"):
        assert all(len(getattr(row, kind)) == 4 for row in M.LAYER_BYTES.values())
    # checkpointed under bf16-mixed, a layer's input is float32: 4 bytes a value
    assert M.residual_bytes("bf16-mixed") == 4 and M.residual_bytes("model") == 2


# ------------------------------------------------------------------------------------------------
# the parts of each model
# ------------------------------------------------------------------------------------------------

def test_the_memory_parts_follow_the_settings():
    base = {p["model"]: p for p in M.plan(pair1())}
    s = base[SMOL]
    assert 3.0e9 < s["params"] < 3.1e9 and 1.7e9 < base[QWEN]["params"] < 1.75e9
    assert s["precision"] == "bf16-mixed" and s["checkpointing"]
    assert s["state_gib_1gpu"] == pytest.approx(16 * s["params"] / GIB)  # fp32 weights, grads, AdamW moments
    assert M.train_state_bytes(1000, "bf16-mixed", 4) == 16 * 1000 / 4
    assert s["activations_other_gib"] > 4 * s["activations_gib"]  # checkpointing saves most of it
    # logits and their gradient for the response positions (2/3 of a micro-batch), bf16
    m = smol()
    assert m.logit_tokens == 16384 * 4096 // 6144
    assert M.logits_bytes(m.arch, m.logit_tokens, m.precision) == m.logit_tokens * 128256 * 2
    half = M.update_bytes(smol(pair1("optim.max_tokens_per_micro=8192")))
    assert half < 0.55 * M.update_bytes(m)
    for p in base.values():  # the smallest GPU count that fits 90 % of the GPU
        assert p["peak_gib_per_gpu"] <= 0.9 * 80 and p["peak_gib_per_gpu"] == max(p["phases_gib"].values())
        fewer = M.plan(pair1(), gpu_gb=80 * p["gpus"] / (p["gpus"] - 0.5)) if p["gpus"] > 1 else None
        assert fewer is None or all(q["gpus"] <= p["gpus"] for q in fewer)
    unsplit = M.plan(pair1("optim.max_tokens_per_micro=null", "model.gradient_checkpointing=false"))
    assert all(p["gpus"] is None for p in unsplit)  # a 1.5 M-token minibatch in one pass fits no GPU


def test_the_kl_reference_is_counted_when_the_coefficient_is_positive():
    plain, kl = smol(), smol(pair1("algo.beta_kl=0.01"))
    assert not plain.ref and kl.ref
    for phase in M.PHASES:  # a float32 copy of the master weights, in every phase
        extra = (sum(M.phase_parts(kl, phase, 2, 0.0).values()) - sum(M.phase_parts(plain, phase, 2, 0.0).values()))
        assert extra == pytest.approx(4 * kl.params / 2)
    assert M.ref_bytes(1000, "model", True, 1) == 2000  # a 16-bit model trained in its dtype: a 16-bit copy


def test_the_phases_hold_what_each_phase_needs():
    m = smol(pair1("rollout.vllm.kv_cache_gb=10", "rollout.vllm.sleep_level=2"))
    kv = 10 * GIB
    gen, lp, upd, sync = (M.phase_parts(m, p, 1, kv) for p in M.PHASES)
    assert "grads" not in gen and "activations" not in gen  # the gradients are freed after every step
    assert gen["kv_cache"] == kv and gen["engine_weights"] == 2 * m.params
    assert lp["activations"] == M.forward_bytes(m) and "grads" not in lp
    assert upd["grads"] == 4 * m.params and upd["activations"] == M.update_bytes(m)
    assert "kv_cache" not in upd and "engine_weights" not in upd  # asleep: levels 1 and 2 free the GPU
    awake = M.phase_parts(smol(pair1("rollout.vllm.kv_cache_gb=10")), "update", 1, kv)  # sleep level 0
    assert awake["kv_cache"] == kv and awake["engine_weights"] == 2 * m.params
    assert sync["engine_weights"] == 2 * m.params and "grads" not in sync
    # level 1 backs the weights up in host memory: moved there and back around each update
    one = smol(pair1("rollout.vllm.sleep_level=1"))
    assert M.sleep_bytes_per_step([one]) == 4 * one.params and M.sleep_bytes_per_step([m]) == 0


def test_the_command_prints_pair1_s_plan_and_names_a_model_it_cannot_size(tmp_path):
    res = run_plan("configs/pairs/pair1.yaml")
    assert res.exit_code == 0, res.output
    assert f"{SMOL}: 3.075 B parameters" in res.output
    assert "needs 2 x 80 GiB GPU(s), by phase: generate" in res.output and "total: 3 GPU(s)" in res.output
    cfg = tmp_path / "nohub.yaml"
    cfg.write_text("name: nohub\nmodels:\n  - {id: someone/not-here-7B, kind: hf}\ntemplate: plain\n")
    res = run_plan(str(cfg))
    assert res.exit_code == 2 and "someone/not-here-7B" in res.output and "arch" in res.output, res.output


# ------------------------------------------------------------------------------------------------
# graftzoo plan --gpus 1: two models on one GPU
# ------------------------------------------------------------------------------------------------

def test_pair1_on_one_141_gib_gpu_is_resident_with_the_per_phase_peaks():
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-gb", "141")
    assert res.exit_code == 0, res.output
    p = placed("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-gb", "141")
    assert p["layout"] == "resident" and p["fits"] and "resident" in M.LAYOUTS_ONE_GPU
    gpu = p["per_gpu"][0]
    assert set(gpu["phases"]) == set(M.PHASES) and gpu["peak_gb"] == max(v["peak_gb"] for v in gpu["phases"].values())
    assert gpu["peak_gb"] <= p["usable_gb"]
    state = 12 * sum(g["params"] for g in p["placement"]) / GIB  # both models' weights and AdamW moments stay
    for ph in gpu["phases"].values():
        assert ph["parts"]["weights"] + ph["parts"]["adamw_moments"] == pytest.approx(state)
    upd = gpu["phases"]["update"]["parts"]
    assert upd["grads"] == pytest.approx(4 * 3075098624 / GIB)  # SmolLM3's update, its engine asleep
    # the KV cache sized by the plan (kv_cache_gb null): what the fullest phase leaves, and said so
    assert p["kv_sized_by_plan"] and p["kv_cache_gb"] > 5 and p["sleep_level"] == 2
    assert p["settings"] == {"run.backend": "inprocess", "run.device": "cuda", "run.layout": "resident",
                             "rollout.vllm.kv_cache_gb": round(p["kv_cache_gb"], 1), "rollout.vllm.sleep_level": 2}
    assert f"{p['kv_cache_gb']:.1f} GiB per engine, sized by the plan" in res.output
    assert "--set run.layout=resident" in res.output and f"--set rollout.vllm.kv_cache_gb={p['kv_cache_gb']:.1f}" \
        in res.output
    for name in M.PHASES:
        assert f"    {name:<8} {gpu['phases'][name]['peak_gb']:7.2f} GiB" in res.output
    assert f"step peak {gpu['peak_gb']:.2f} GiB" in res.output
    assert p["alternatives"]["offload"]["fits"] and p["moved_gb_per_step"] == 0


def test_pair1_on_one_80_gib_gpu_is_offloaded():
    p = placed("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-gb", "80")
    assert p["layout"] == "offload" and p["fits"] and not p["alternatives"]["resident"]["fits"]
    assert "update phase of " + SMOL in p["alternatives"]["resident"]["error"]
    n = sum(g["params"] for g in p["placement"])
    assert p["moved_gb_per_step"] == pytest.approx(2 * M.OFFLOAD_SWITCHES * 12 * n / GIB)
    assert p["step_time"]["transfer_s"] == pytest.approx(p["moved_gb_per_step"] * GIB / M.PCIE_BYTES_PER_S)
    assert p["host_gb"] == pytest.approx(12 * n / GIB)  # pinned buffers for both models' weights and moments
    upd = p["per_gpu"][0]["phases"]["update"]
    assert upd["during"] == SMOL and upd["parts"]["weights"] == pytest.approx(4 * 3075098624 / GIB)
    assert p["settings"]["run.layout"] == "offload" and p["per_gpu"][0]["peak_gb"] <= p["usable_gb"]


def test_a_gpu_too_small_exits_non_zero_naming_what_does_not_fit():
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-mem-gb", "24")
    assert res.exit_code == 1, res.output
    assert "21.6 GiB available" in res.output and f"offload: the update phase of {SMOL} needs" in res.output
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-mem-gb", "24", "--json")
    p = json.loads(res.output)
    assert res.exit_code == 1 and not p["fits"] and SMOL in p["error"] and p["settings"] == {}
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "2")  # SmolLM3 alone needs 2 GPUs: no 1 + 1 split
    assert res.exit_code == 1 and f"{SMOL} needs 84.7 GiB per GPU even over 1 rank(s)" in res.output, res.output


def test_the_layout_in_the_config_is_the_one_planned_and_an_explicit_kv_cache_is_kept():
    p = placed("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-gb", "141", "--set", "run.layout=offload")
    assert p["layout"] == "offload" and p["alternatives"] == {} and "run.layout offload" in p["why"]
    p = placed("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-gb", "141", "--set", "rollout.vllm.kv_cache_gb=4")
    assert p["layout"] == "resident" and p["kv_cache_gb"] == pytest.approx(4) and not p["kv_sized_by_plan"]
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "1", "--gpu-gb", "141", "--set", "rollout.vllm.kv_cache_gb=60")
    assert res.exit_code == 1 and "KV cache 120.00" in res.output  # two engines' 60 GiB do not fit beside the state


def test_the_trainer_s_entry_points():
    p = M.gpu_layout(pair1(), 1, 141.0)
    assert p["layout"] in M.LAYOUTS_ONE_GPU and p["fits"] and p["error"] is None
    assert {g["model"] for g in p["placement"]} == {SMOL, QWEN}
    assert all(set(g["phases_gb"]) == set(M.PHASES) for g in p["placement"])
    json.dumps(p)  # plain data
    micro = load_config(pair="micro", algo="grpo")
    parts = 0.0
    for m in M.model_memory(micro):  # every model's state, update micro-batch and engine at once
        parts += (16 * m.params + max(M.update_bytes(m) + M.working_copy_bytes(m.arch, m.precision, m.checkpointing, 1),
                                      4 * m.params) + M.hf_generate_bytes(m))
    assert M.host_peak_bytes(micro) == pytest.approx(parts) and 0 < M.host_peak_bytes(micro) < 2 * GIB
    assert M.host_peak_bytes(pair1()) > 16 * (3075098624 + 1720574976)


# ------------------------------------------------------------------------------------------------
# graftzoo plan --gpus N: the placement on a node
# ------------------------------------------------------------------------------------------------

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
    for g in p["placement"]:
        k, n, q = g["num_workers"], g["params"], g["parts"]
        assert g["engine_per_rank"] == "vllm" and not g["engine_sleeps"] and sum(g["prompts_per_rank"]) in (
            128 // k * 2, 128 // k * 2 + 1)
        assert g["peak_phase"] == "update"  # the engine awake (sleep level 0) beside the update
        assert q["weights"] == pytest.approx(4 * n / k / GIB) and q["adamw_moments"] == pytest.approx(8 * n / k / GIB)
        assert q["engine_weights"] == pytest.approx(2 * n / GIB)
        assert q["kv_cache"] == pytest.approx(0.35 * 80 - 2 * n / GIB)
        assert g["per_gpu_peak_gb"] == pytest.approx(sum(q.values())) and g["per_gpu_peak_gb"] <= 0.9 * 80
        # the text says the same
        assert f"ranks {g['ranks'][0]}-{g['ranks'][-1]}: {g['model']}, FSDP2 over {k} ranks" in res.output
        assert f"= {g['per_gpu_peak_gb']:.2f} GiB peak of 72.0" in res.output
        assert f"update {g['phases_gb']['update']:.2f}" in res.output
    assert [r["peak_gb"] for r in p["per_gpu"]] == [by[SMOL]["per_gpu_peak_gb"]] * 5 + [by[QWEN]["per_gpu_peak_gb"]] * 3
    assert p["settings"]["ray.gpus_per_worker"] == 1 and p["settings"][f"pair.models[{QWEN}].num_workers"] == 3
    # on GPUs of their own the models step at once: the step is the slower model's
    st = p["step_time"]
    assert st["step_s"] == pytest.approx(max(sum(t.values()) for t in st["per_model_s"].values()))


def test_explicit_num_workers_are_honoured(tmp_path):
    p = placed(pair_file(tmp_path, **{QWEN: 6}), "--gpus", "8")  # SmolLM3 gets what is left
    assert [(g["model"], g["ranks"], g["num_workers_from_config"]) for g in p["placement"]] == [
        (SMOL, [0, 1], False), (QWEN, [2, 3, 4, 5, 6, 7], True)]
    p = placed("configs/pairs/pair1.yaml", "--gpus", "8", "--set", "ray.num_workers=3")
    assert [g["ranks"] for g in p["placement"]] == [[0, 1, 2], [3, 4, 5]] and p["per_gpu"][7]["models"] == []
    res = run_plan(pair_file(tmp_path, **{SMOL: 1}), "--gpus", "8")  # one rank cannot hold SmolLM3's state
    assert res.exit_code == 1 and f"{SMOL} needs 84.7 GiB per GPU over its 1 rank(s) (num_workers)" in res.output


def test_more_ranks_shard_the_training_state_proportionally():
    m = smol()
    two, four = M.phase_parts(m, "update", 2, GIB), M.phase_parts(m, "update", 4, GIB)
    for k in ("weights", "grads", "adamw_moments"):
        assert four[k] == pytest.approx(two[k] / 2)
    assert all(four[k] == two[k] for k in ("working_copy", "activations", "engine_weights", "kv_cache"))
    assert sum(two.values()) - sum(four.values()) == pytest.approx(16 * m.params / 4)
    by_cli = [placed("configs/pairs/pair1.yaml", "--gpus", "8", "--set", f"ray.num_workers={k}")["placement"][0]
              for k in (2, 4)]
    assert by_cli[1]["parts"]["weights"] == pytest.approx(by_cli[0]["parts"]["weights"] / 2)
    assert by_cli[0]["per_gpu_peak_gb"] - by_cli[1]["per_gpu_peak_gb"] == pytest.approx(16 * m.params / 4 / GIB)


def test_split_and_colocation_rules():
    assert M.split_gpus([3, 1], [1, 1], 8) == [6, 2] and M.split_gpus([1, 100], [5, 1], 8) == [5, 3]
    assert M.split_gpus([3075, 1721], [2, 1], 8) == [5, 3]
    # ray.gpus_per_worker < 1 asks for shared GPUs: each GPU holds both models' parts of the same phase at once
    p = placed("configs/pairs/pair1.yaml", "--gpus", "4", "--set", "ray.gpus_per_worker=0.5", "--set",
               "run.device=cuda", "--set", "rollout.vllm.sleep_level=1", "--set", "rollout.vllm.kv_cache_gb=4")
    assert p["layout"] == "colocated" and all(g["ranks"] == [0, 1, 2, 3] for g in p["placement"])
    assert p["settings"]["ray.gpus_per_worker"] == 0.5
    ms = M.model_memory(pair1("rollout.vllm.sleep_level=1", "rollout.vllm.kv_cache_gb=4"))
    for ph, v in p["per_gpu"][0]["phases"].items():
        assert v["peak_gb"] == pytest.approx(sum(sum(M.phase_parts(m, ph, 4, 4 * GIB).values()) for m in ms) / GIB)
    assert "kv_cache" not in p["per_gpu"][0]["phases"]["update"]["parts"]  # both engines asleep in the update


# ------------------------------------------------------------------------------------------------
# step time
# ------------------------------------------------------------------------------------------------

def test_the_step_time_formulas():
    assert M.update_flops(10, 100, False) == 6000 and M.update_flops(10, 100, True) == 8000
    assert M.forward_flops(10, 100) == 2000
    chip = M.CHIPS["h200"]
    assert M.compute_seconds(chip.bf16_flops * 0.5, chip, 0.5) == pytest.approx(1.0)
    assert M.decode_step_bytes(1000, 4, 10, 2) == 1000 + 4 * 10 * 2
    assert M.decode_batch(math.inf, 100, 10, 256, 1024) == 256 and M.decode_batch(math.inf, 100, 10, 256, 8) == 8
    assert M.decode_batch(50_000, 100, 10, 256, 1024) == 50 and M.decode_batch(10, 100, 10, 256, 1024) == 1
    m = smol()
    cal = M.calibration_of(None)
    t = M.generate_seconds(m, 256, math.inf, chip, cal)  # one wave of max_num_seqs: prefill + 4096 decode steps
    read = M.decode_step_bytes(2 * m.params, 256, 2048 + 2048, m.kv_per_token)
    assert t == pytest.approx(M.compute_seconds(M.forward_flops(m.params, 256 * 2048), chip, 0.35)
                              + 4096 * read / (chip.hbm_bytes_per_s * 0.5))
    faster = M.generate_seconds(m, 256, math.inf, chip, M.calibration_of({"generate_bw_fraction": 1.0}))
    assert faster < t
    assert M.transfer_seconds(M.PCIE_BYTES_PER_S) == 1.0
    assert M.step_seconds({"a": {"x": 1.0}, "b": {"x": 2.0}}, together=False, moved=M.PCIE_BYTES_PER_S) == 4.0
    assert M.step_seconds({"a": {"x": 1.0}, "b": {"x": 2.0}}, together=True) == 2.0
    with pytest.raises(ValueError, match="update_mfu"):
        M.calibration_of({"update_mfu": 1.5})
    with pytest.raises(ValueError, match="not one of"):
        M.calibration_of({"mfu": 0.4})


def test_the_json_has_a_step_time_from_the_chip_and_the_calibration(tmp_path):
    base = placed("configs/pairs/pair1.yaml", "--gpus", "8")
    assert base["chip"] == "h200" and base["calibration"] == M.DEFAULT_CALIBRATION
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"update_mfu": 0.7, "generate_bw_fraction": 0.5}))
    fast = placed("configs/pairs/pair1.yaml", "--gpus", "8", "--calibration", str(cal))
    for m in (SMOL, QWEN):
        assert fast["step_time"]["per_model_s"][m]["update"] == pytest.approx(
            base["step_time"]["per_model_s"][m]["update"] / 2)
    slow = placed("configs/pairs/pair1.yaml", "--gpus", "8", "--chip", "a100")
    assert slow["step_time"]["step_s"] > base["step_time"]["step_s"]
    rows = placed("configs/pairs/pair1.yaml")
    assert rows["step_time"]["step_s"] > 0 and {r["model"] for r in rows["models"]} == {SMOL, QWEN}
    cal.write_text(json.dumps({"update_mfu": 2}))
    res = run_plan("configs/pairs/pair1.yaml", "--gpus", "8", "--calibration", str(cal))
    assert res.exit_code == 2 and "update_mfu" in res.output
