"""LoRA (``model.lora``) on the micro pair: only the adapters train (the base weights stay bit-identical),
the KL reference is the base model (adapters disabled), a vLLM engine receives the merged weights under the base
model's names, checkpoints hold the adapters only and resume exactly, evaluation and export see the merged model."""
import json
import logging
import re
from pathlib import Path

import pytest
import torch

from graftzoo.training.run.checkpoint import CheckpointError, load_weights
from graftzoo.contract.config import ConfigError, LoraSection, load_config
from graftzoo.contract.schema import validate_section
from graftzoo.training.planner.build import build_engine, build_policy, load_model, make_ref
from graftzoo.training.trainer import Trainer, train
from graftzoo.envs.task import Task
from graftzoo.training.eval_checkpoints import build_policies, load_run_config
from graftzoo.training.eval_runner import evaluate_checkpoint

QWEN, GPT2 = "micro-qwen-char", "micro-gpt2-pair"
LORA = "model.lora={r: 4, alpha: 8}"


def micro_cfg(*overrides, algo="grpo"):
    return load_config(pair="micro", algo=algo, overrides=["run.track=false", *overrides])


def spec_of(cfg, model_id):
    return next(s for s in cfg.pair.models if s.id == model_id)


def perturb_adapters(pol, seed=0):
    """Non-zero B matrices (they start at zero): the adapters change the model, as an update would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def logits(model, ids):
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    finally:
        model.train(was)


def test_lora_settings_are_completed_merged_and_refused_over_fsdp_ranks():
    cfg = micro_cfg(LORA, "model.lora.dropout=0.1")  # a later override of one key keeps the others
    assert cfg.model.lora.model_dump() == {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.1}
    assert micro_cfg().model.lora is None and micro_cfg(LORA, "model.lora=null").model.lora is None
    assert validate_section(LoraSection, {"target_modules": ["q_proj"]}, "pair.models[a].lora.").r == 8
    with pytest.raises(ConfigError, match=r"config key 'model.lora' .*num_workers"):
        micro_cfg(LORA, "run.backend=ray", "ray.num_workers=2")
    assert micro_cfg(LORA, "run.backend=ray").model.lora.r == 4  # one worker per model: LoRA trains


@pytest.mark.parametrize("model_id", [QWEN, GPT2])  # nn.Linear and GPT-2's Conv1D projections
def test_merged_weights_ref_and_export_of_a_lora_policy(model_id):
    cfg = micro_cfg(LORA)
    spec = spec_of(cfg, model_id)
    plain, _, _ = load_model(spec)
    pol = build_policy(spec, cfg)
    trained = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained)
    assert [p for g in pol.optimizer.param_groups for p in g["params"]] == [
        p for p in pol.model.parameters() if p.requires_grad]
    assert pol.trainable_params == sum(p.numel() for p in pol.model.parameters() if p.requires_grad)
    ids = torch.tensor([pol.encode_text("Q:12+34=\n46")])
    assert torch.allclose(logits(pol.model, ids), logits(plain, ids), atol=1e-6)  # B = 0: the base model
    perturb_adapters(pol)
    base_before = {n: p.detach().clone() for n, p in pol.model.named_parameters() if ".lora_" not in n}
    lora_logits = logits(pol.model, ids)
    assert (lora_logits - logits(plain, ids)).abs().max() > 1e-2

    state = pol.full_state_dict()  # what a vLLM engine loads
    plain_state = plain.state_dict()
    assert set(state) == set(plain_state)
    changed = {k for k in state if not torch.equal(state[k], plain_state[k])}
    assert changed and all(k.endswith(".weight") for k in changed)
    synced = type(plain)(plain.config)
    synced.load_state_dict(state)
    assert torch.allclose(logits(synced, ids), lora_logits, atol=1e-5)

    exported = pol.merged_model()
    assert type(exported) is type(plain) and set(exported.state_dict()) == set(plain_state)
    assert torch.allclose(logits(exported, ids), lora_logits, atol=1e-5)

    ref = make_ref(pol)  # the KL reference: the same model, adapters off
    assert ref.model.lora_model is pol.model
    assert torch.allclose(ref.logprobs(ids, torch.ones_like(ids), 3)[0],
                          logits(plain, ids)[:, -4:-1].log_softmax(-1).gather(-1, ids[:, -3:, None])[..., 0],
                          atol=1e-5)
    assert pol.model.training  # the reference's forward ran in eval mode and left the training mode alone
    assert torch.equal(logits(pol.model, ids), lora_logits)  # adapters back on
    assert all(torch.equal(p, base_before[n]) for n, p in pol.model.named_parameters() if ".lora_" not in n)


@pytest.mark.slow
def test_vllm_decodes_with_the_merged_lora_weights_after_a_sync():
    pytest.importorskip("vllm")
    cfg = micro_cfg(LORA, "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625", "rollout.temperature=0.7")
    pol = build_policy(spec_of(cfg, QWEN), cfg)
    engine = build_engine(pol, cfg)
    try:
        perturb_adapters(pol)  # an update of the adapters
        pol.version += 1
        engine.sync_weights()
        torch.manual_seed(0)
        prompts = list(Task(cfg).make_env("test", size=4).dataset)
        rollouts = [r for g in engine.generate(prompts, 2) for r in g.rollouts]
        assert {r.policy_version for r in rollouts} == {1}
        args = [r.prompt_token_ids for r in rollouts], [r.token_ids for r in rollouts]
        lora_lp, _ = pol.score_sequences(*args)
        base_lp, _ = make_ref(pol).score_sequences(*args)
        diff = max(abs(a - b) for r, lp in zip(rollouts, lora_lp) for a, b in zip(r.logprobs, lp))
        base_diff = max(abs(a - b) for r, lp in zip(rollouts, base_lp) for a, b in zip(r.logprobs, lp))
        assert diff < 1e-4 < 1e-1 < base_diff, (diff, base_diff)
    finally:
        engine.close()


def metric_rows(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "async/overlap_s"))} for r in rows]


def test_grpo_with_lora_trains_checkpoints_resumes_and_evaluates_the_adapters(tmp_path, caplog):
    sets = [LORA, f"pair.train=[{QWEN}]", "run.eval_at_end=false", "optim.lr=1e-2", "algo.beta_kl=0.1",
            "algo.entropy_coeff=0.01", "task.prompts_per_step=2", "rollout.n=4"]  # the entropy bonus: a gradient
    # even when every group fails
    caplog.set_level(logging.INFO, logger="graftzoo")
    tr = Trainer(micro_cfg(f"run.out_dir={tmp_path / 'a'}", "run.steps=2", *sets))
    full = tr.run()
    assert re.search(rf"'{QWEN}': LoRA r=4 alpha=8 on all-linear: 8192 of 84032 parameters train", caplog.text)
    pol = tr.policies[QWEN]
    plain, _, _ = load_model(spec_of(tr.cfg, QWEN))
    base = pol.model.get_base_model().state_dict()
    for k, v in plain.state_dict().items():  # the base weights are bit-identical after two updates
        parts = k.rsplit(".", 1)
        assert torch.equal(base.get(f"{parts[0]}.base_layer.{parts[1]}", base.get(k)), v), k
    assert any(float(p.detach().abs().max()) > 0 for n, p in pol.model.named_parameters() if ".lora_B." in n)
    kl = [r["kl"] for r in metric_rows(full) if "kl" in r]
    assert kl[0] == 0 < kl[1]  # the reference is the base model: the adapters moved away from it after step 1

    ckpt = full / "checkpoints/step_000001"
    saved = torch.load(ckpt / f"{QWEN}.pt", weights_only=True)["policy"]
    assert saved["lora"] and saved["model"] and all(".lora_" in k for k in saved["model"])
    assert sum(v.numel() for v in saved["model"].values()) == pol.trainable_params
    torch.save(plain.state_dict(), tmp_path / "full.pt")  # the base weights alone, no optimizer state
    assert (ckpt / f"{QWEN}.pt").stat().st_size < 0.5 * (tmp_path / "full.pt").stat().st_size

    part = tmp_path / "b"  # interrupted after step 1, resumed: the same run
    train(micro_cfg(f"run.out_dir={part}", "run.steps=1", *sets))
    resumed = train(micro_cfg(f"run.out_dir={part}", "run.steps=2", *sets))
    assert metric_rows(full) == metric_rows(resumed)
    again = torch.load(resumed / "checkpoints/step_000001" / f"{QWEN}.pt", weights_only=True)["policy"]["model"]
    assert set(again) == set(saved["model"]) and all(torch.equal(again[k], saved["model"][k]) for k in again)

    evaluated = build_policies(load_run_config(full))[QWEN]  # evaluation builds the LoRA model and loads adapters
    load_weights(evaluated, ckpt)
    ids = torch.tensor([pol.encode_text("Q:3*4=\n12")])
    assert torch.allclose(logits(evaluated.model, ids), logits(pol.model, ids), atol=1e-6)
    (written,) = evaluate_checkpoint(ckpt, limit=2, k=1)
    assert Path(written).is_file()
    plain_cfg = micro_cfg()
    no_lora = build_policy(spec_of(plain_cfg, QWEN), plain_cfg)
    with pytest.raises(CheckpointError, match=r"LoRA adapters .*model.lora"):
        load_weights(no_lora, ckpt)
