"""Device placement that cannot surprise (graftzoo.training.planner.placement): run.device auto, the refusal of a
GPU-sized config on the CPU unless run.device=cpu is given, one vLLM engine per process where two would share a
GPU, run.layout auto picking plan's layout, and the placement record printed before the first step and kept in
summary.json."""
import json
import logging

import pytest
import torch
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import ConfigError, load_config
from graftzoo.training.planner import placement
from graftzoo.training.trainer import Trainer

PAIR1 = "configs/pairs/pair1.yaml"


def pair1(*overrides):
    """The paper's pair as configured, co-trained with GRAFT."""
    return load_config(pair=PAIR1, algo="graft", overrides=["run.track=false", "peer.source=online", *overrides])


def test_auto_is_cuda_only_where_a_gpu_is_visible(monkeypatch):
    assert load_config(pair="micro", algo="grpo").run.device == "auto"  # the default
    assert placement.resolve_device("auto") == "cpu"  # no GPU here
    assert placement.resolve_device("cuda:1") == "cuda:1" and placement.resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert placement.resolve_device("auto") == "cuda"


def test_a_gpu_sized_config_refuses_the_cpu_unless_asked(tmp_path):
    cfg = pair1()
    with pytest.raises(ConfigError) as e:
        placement.resolve(cfg)
    msg = str(e.value)
    assert "run.device' (auto) resolved to the CPU" in msg and "run.device=cpu" in msg
    assert "rollout.vllm.kv_cache_gb null" in msg
    # plan's host-memory figure is a reason of its own: pair1 without its GPU-only settings, on a 24 GiB host
    sized = pair1("rollout.vllm.kv_cache_gb=2")
    why = placement.cpu_refusal(sized, 24 * 2.0 ** 30)
    assert why and "GiB of memory, this machine has 24.0 GiB" in why
    assert placement.cpu_refusal(sized, 1e15) is None  # a host that holds it
    # given explicitly, the CPU is used as asked
    explicit = placement.resolve(pair1("run.device=cpu"))
    assert explicit.run.device == "cpu"
    # through the command: refused before anything is loaded or written
    out = tmp_path / "runs"
    r = CliRunner().invoke(main, ["train", "--pair", PAIR1, "--algo", "graft", "--peer", "online",
                                  "--set", f"run.out_dir={out}",
                                  "--set", "run.track=false"])
    assert r.exit_code != 0 and "run.device=cpu" in r.output, r.output
    assert not out.exists()


def test_a_tiny_config_runs_on_the_cpu_and_records_where(tmp_path, caplog):
    cfg = load_config(pair="micro", algo="graft", overrides=[f"run.out_dir={tmp_path}", "run.track=false",
                                                             "run.eval_at_end=false", "peer.source=online",
                                                             "run.steps=1"])
    with caplog.at_level(logging.INFO, logger="graftzoo"):
        tr = Trainer(cfg)
        try:
            tr.run()
        finally:
            tr.close()
    assert tr.cfg.run.device == "cpu" and tr.cfg.run.layout == "resident"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("placement of model")]
    assert len(lines) == 2 and all("resident layout" in line and "on cpu" in line for line in lines)
    summary = json.loads((tr.run_dir / "summary.json").read_text())
    for m, where in summary["placement"].items():
        assert where["device"] == "cpu" and where["weights"] == "float32 on cpu"
        assert where["engine"].startswith("hf on cpu") and where["optimizer_state"] == "cpu"


def gpu_pair(monkeypatch, gpu_gb, *overrides):
    """pair1 with both models on cuda:0 of a GPU of ``gpu_gb`` GiB (the memory query and the device count answered
    here)."""
    monkeypatch.setattr(placement, "gpu_gb_of", lambda device: gpu_gb)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return pair1("run.device=cuda:0", *overrides)


def test_two_engines_on_one_gpu_get_a_process_each(monkeypatch):
    cfg = placement.resolve(gpu_pair(monkeypatch, 141))
    assert cfg.rollout.vllm.multiprocessing is True
    one = placement.resolve(load_config(pair=PAIR1, algo="grpo", overrides=[
        "run.track=false", "run.device=cuda:0", "pair.train=[Qwen/Qwen3-1.7B-Base]"]))
    assert one.rollout.vllm.multiprocessing is False and one.run.layout == "resident"
    given = placement.resolve(gpu_pair(monkeypatch, 141, "rollout.vllm.multiprocessing=false"))
    assert given.rollout.vllm.multiprocessing is False  # as given


@pytest.mark.parametrize("gpu_gb, layout", [(141, "resident"), (80, "offload")])
def test_layout_auto_is_plans_choice_for_the_gpu(monkeypatch, gpu_gb, layout):
    assert placement.resolve(gpu_pair(monkeypatch, gpu_gb)).run.layout == layout
    assert placement.resolve(gpu_pair(monkeypatch, gpu_gb, "run.layout=resident")).run.layout == "resident"


def test_offload_needs_the_in_process_backend():
    cfg = load_config(pair="micro", algo="grpo", overrides=["run.layout=offload", "run.backend=ray",
                                                             "run.device=cpu"])
    with pytest.raises(ConfigError, match="run.layout' \\(offload\\).*run.backend=inprocess"):
        placement.resolve(cfg)


def test_models_sharing_a_gpu_collect_at_once_only_where_it_cannot_change_the_rollouts(monkeypatch):
    ids = ["HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base"]
    assert placement.collect_at_once(placement.resolve(gpu_pair(monkeypatch, 141)), ids)  # resident, vLLM
    for extra in (["run.layout=offload"], ["rollout.engine=hf"], ["ray.concurrent_models=false"],
                  ["rollout.vllm.multiprocessing=false"]):
        assert not placement.collect_at_once(placement.resolve(gpu_pair(monkeypatch, 141, *extra)), ids), extra
    assert not placement.collect_at_once(placement.resolve(gpu_pair(monkeypatch, 141)), ids[:1])


@pytest.mark.parametrize("gpu_gb", [141, 80])
def test_the_update_is_sized_by_the_plan_where_the_config_leaves_it_open(monkeypatch, gpu_gb):
    from graftzoo.training.planner import memory
    cfg = placement.resolve(gpu_pair(monkeypatch, gpu_gb, "optim.max_tokens_per_micro=null",
                                     "model.gradient_checkpointing=false"))
    tokens, ckpt = cfg.optim.max_tokens_per_micro, cfg.model.gradient_checkpointing
    assert tokens in placement.MICRO_TOKENS
    assert memory.gpu_layout(cfg, 1, gpu_gb)["fits"]
    larger = [t for t in placement.MICRO_TOKENS if t > tokens]
    if larger:  # the largest budget that fits: the next one up does not
        bigger = placement.with_values(cfg, {"optim.max_tokens_per_micro": min(larger)})
        assert not memory.gpu_layout(bigger, 1, gpu_gb)["fits"]
    if ckpt:  # turned on only because nothing fits without it
        off = [placement.with_values(cfg, {"optim.max_tokens_per_micro": t, "model.gradient_checkpointing": False})
               for t in placement.MICRO_TOKENS]
        assert not any(memory.gpu_layout(c, 1, gpu_gb)["fits"] for c in off)
    given = placement.resolve(gpu_pair(monkeypatch, gpu_gb, "optim.max_tokens_per_micro=4096"))
    assert given.optim.max_tokens_per_micro == 4096  # a given budget is kept


def test_plans_choice_brings_the_engine_settings_it_was_planned_with(monkeypatch):
    cfg = placement.resolve(gpu_pair(monkeypatch, 141))  # pair1: kv_cache_gb null, sleep_level not given
    from graftzoo.training.planner import memory
    planned = memory.gpu_layout(gpu_pair(monkeypatch, 141), 1, 141)["settings"]
    assert cfg.rollout.vllm.kv_cache_gb == planned["rollout.vllm.kv_cache_gb"] > 0
    assert cfg.rollout.vllm.sleep_level == planned["rollout.vllm.sleep_level"]
    given = placement.resolve(gpu_pair(monkeypatch, 141, "rollout.vllm.kv_cache_gb=20", "rollout.vllm.sleep_level=2"))
    assert (given.rollout.vllm.kv_cache_gb, given.rollout.vllm.sleep_level) == (20, 2)  # as given
    kept = placement.resolve(gpu_pair(monkeypatch, 141, "run.layout=resident"))
    assert (kept.rollout.vllm.kv_cache_gb, kept.rollout.vllm.sleep_level) == (None, 0)  # a layout given: as is
