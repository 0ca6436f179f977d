"""The paper's families in miniature (pair1-mini untrained, tests/mini.py: SmolLM3 and Qwen3 with their real
tokenizers) through the vLLM engine, ``graftzoo export`` and ``graftzoo plan``
(docs/scaling.md#the-miniatures-families-in-vllm).

- vLLM runs Qwen3 with its own implementation and SmolLM3 through its Transformers backend; that backend's change to
  the transformers classes is undone in the trainer's process (the training model still runs, and another SmolLM3
  can still be built); the tokenizer vLLM loads to match stop strings encodes as the policy's (Qwen3's engine here,
  SmolLM3's tokenizer in vLLM through its exported folder).
- The engine's log-probs equal the training path's in float32 (measured <= 2e-6 on both families; tested at
  ``TOL``), before and after a weight sync; token ids in (the policy's encoding) and out, also the embedding rows past
  the tokenizer's length (Qwen3's 151,669 tokens in 151,936 rows), EOS and a stop string.
- ``graftzoo export`` of a 1-step run: each folder loads in transformers with the checkpoint's logits, its tokenizer
  encodes as the published one and as ``graftzoo.tiny.vocab.reference_encoder`` on the bundled benchmarks' problems,
  SmolLM3's ``tokenizer.json`` byte for byte a fresh build's; vLLM loads the folders as they are.
- ``graftzoo plan`` counts each miniature's parameters and tensors exactly, and pair1's from its ``arch``.

The engine tests are ``slow`` (one in-process engine per family for the module, on the exported run's policies, and
one per exported folder); the others need no engine."""
import copy
import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from mini import QWEN, SMOL, untrained_pair
from test_vllm_engine import max_diff, training_logprobs
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from graftzoo.apps.cli import main
from graftzoo.contract.config import load_config
from graftzoo.contract.names import model_slug
from graftzoo.envs.datasets import DATA_DIR
from graftzoo.envs.task import Task
from graftzoo.envs.templates import render_prompt
from graftzoo.tiny.vocab import build_vocab, cached_vocab_path, reference_encoder
from graftzoo.training.planner import memory as M
from graftzoo.training.run.checkpoint import load_weights
from graftzoo.training.eval_checkpoints import build_policies, load_run_config
from graftzoo.training import export
from graftzoo.training.export import export_policy
from graftzoo.training.planner.build import build_engine
from graftzoo.training.models.policy import token_logprobs

TEMP = 0.7
TOL = 1e-4  # float32 engine vs training path (measured <= 2e-6)
VOCAB = {SMOL: "smollm3", QWEN: "qwen3"}
# the published tokenizers' ids: "Hello world", then special tokens
PUBLISHED = {QWEN: ([9707, 1879], {"<|endoftext|>": 151643, "<|im_start|>": 151644}),
             SMOL: ([9906, 1917], {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001})}


def benchmark_problems(per_file: int = 25) -> list:
    """``per_file`` problems spread over each bundled benchmark file (envs/data/*.jsonl)."""
    out = []
    for path in sorted(DATA_DIR.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        out += [json.loads(x)["problem"] for x in lines[::max(1, len(lines) // per_file)][:per_file]]
    return out


@pytest.fixture(scope="module")
def pair_file(tmp_path_factory):
    return untrained_pair(tmp_path_factory.mktemp("pair"))


def vllm_cfg(pair_file):
    return load_config(pair=str(pair_file), algo="grpo", overrides=[
        "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625", f"rollout.temperature={TEMP}", "run.track=false"])


@pytest.fixture(scope="module")
def exported(pair_file):
    """(export folder, the run's policies loaded from its checkpoint, what export printed) of a 1-step GRPO run."""
    run_dir, out = pair_file.parent / "run", pair_file.parent / "hf"
    res = CliRunner().invoke(main, ["train", "--algo", "grpo", "--pair", str(pair_file), "--no-track", "--run-dir",
                                    str(run_dir), "--set", "run.steps=1", "--set", "task.prompts_per_step=2",
                                    "--set", "rollout.n=2", "--set", "run.eval_at_end=false"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["export", str(run_dir), "--out", str(out)])
    assert res.exit_code == 0, res.output
    pols = build_policies(load_run_config(run_dir))
    for pol in pols.values():
        load_weights(pol, run_dir / "checkpoints" / "step_000000")
        pol.model.eval()
    return out, pols, res.output


# ------------------------------------------------------------------------------------------------
# the vLLM engine (slow: one in-process engine per family for the module)
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engines(pair_file, exported):
    """model id -> (policy, vLLM engine): the exported run's policies, each with an in-process engine of the run's
    sampling settings at temperature ``TEMP``; and 8 held-out prompts."""
    pytest.importorskip("vllm")
    cfg = vllm_cfg(pair_file)
    out = {}
    try:
        for m, pol in exported[1].items():
            pol.temperature = TEMP  # the training path scores at the sampling temperature, as the trainer's does
            if m == SMOL:  # vLLM loads a tokenizer to match stop strings, seconds for a real vocabulary: Qwen3's
                pol.stop_strings = ()  # engine does; SmolLM3's own tokenizer in vLLM is the exported folder's test
            out[m] = (pol, build_engine(pol, cfg))
        yield out, list(Task(cfg).make_env("test", size=8).dataset)
    finally:
        for _, engine in out.values():
            engine.close()


def rollouts_of(groups) -> list:
    return [r for g in groups for r in g.rollouts]


def synced(pol, engine) -> None:
    pol.version += 1
    assert engine.sync_weights() > 0


@contextmanager
def likeliest(pol, engine, ids, c: float = 4.0):
    """The policy's weights changed so that the tokens ``ids`` take nearly all of the probability at every position,
    synced into the engine; put back and synced after. The (tied) embedding gets ``c`` in dimension 0, ``2c`` for
    ``ids``, and the final norm keeps dimension 0 alone: every hidden state points along it (an untrained model's
    layers add little), and the logits of ``ids`` lead the others' by about sqrt(hidden) * c."""
    saved = copy.deepcopy(pol.model.state_dict())
    with torch.no_grad():
        emb = pol.model.get_input_embeddings().weight
        emb[:, 0] = c
        emb[list(ids), 0] = 2 * c
        norm = pol.model.model.norm.weight
        norm.zero_()
        norm[0] = 1.0
    synced(pol, engine)
    try:
        yield
    finally:
        pol.model.load_state_dict(saved)
        synced(pol, engine)


@pytest.mark.slow
def test_vllm_runs_qwen3_itself_and_smollm3_through_its_transformers_backend_leaving_the_classes_alone(engines):
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3Model
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper

    from graftzoo.training.engines.engine import EngineConfigError
    from graftzoo.training.engines.vllm_engine import _Backend, config_beside_tokenizer, vllm_implementation
    models, prompts = engines
    assert config_beside_tokenizer("qwen3") and config_beside_tokenizer("smollm3")
    assert not config_beside_tokenizer("qwen2")  # transformers would load its own Qwen2Tokenizer instead
    assert vllm_implementation("Qwen3ForCausalLM") == "vllm"
    assert vllm_implementation("SmolLM3ForCausalLM") == "transformers"
    # on a GPU, in the trainer's process: Qwen3 compiled, SmolLM3 eager (its classes are put back), false refused
    for m, multiprocessing, setting, eager in ((QWEN, False, "auto", False), (SMOL, False, "auto", True),
                                               (SMOL, True, "auto", False), (SMOL, False, False, None)):
        backend = object.__new__(_Backend)
        backend.policy, backend.multiprocessing = models[m][0], multiprocessing
        backend.settings = {"enforce_eager": setting}
        if eager is None:
            with pytest.raises(EngineConfigError, match=r"'mini-smollm3'.*Transformers backend.*enforce_eager"):
                backend._eager("cuda")
        else:
            assert backend._eager("cuda") is eager, (m, multiprocessing)
    # the backend decorates SmolLM3Model for torch.compile in place; the engine's start put the class back
    assert TorchCompileWithNoGuardsWrapper not in SmolLM3Model.__mro__ and "__call__" not in vars(SmolLM3Model)
    for m, (pol, engine) in models.items():
        fresh = AutoModelForCausalLM.from_config(pol.model.config)  # a model of the family built after the start
        ids = torch.tensor([pol.encode_prompt(prompts[0])])
        with torch.no_grad():
            assert fresh(ids).logits.shape[-1] == pol.model(ids).logits.shape[-1] == pol.model.config.vocab_size
        if m == QWEN:  # the tokenizer vLLM matches stop strings with encodes as the policy's
            assert engine._backend.matches_stop  # read with the model's config beside it (config_beside_tokenizer)
            assert (Path(engine._backend.dir) / "tokenizer" / "config.json").is_file()
            theirs = engine._backend.llm.get_tokenizer()
            for text in benchmark_problems(5) + [pol.render(p) for p in prompts]:
                assert theirs.encode(text, add_special_tokens=False) == pol.encode_text(text), text


@pytest.mark.slow
def test_sampled_logprobs_equal_the_training_path_before_and_after_a_weight_sync(engines):
    models, prompts = engines
    for m, (pol, engine) in models.items():
        torch.manual_seed(0)
        rolls = rollouts_of(engine.generate(prompts, 4))
        for r in rolls:  # token ids in (the policy's own encoding of its template) and out
            assert r.prompt_token_ids == pol.encode_prompt(next(p for p in prompts if p.id == r.prompt_id))
            assert r.policy_version == pol.version and r.text == pol.decode(r.body_ids)
        assert max_diff(rolls, training_logprobs(pol, rolls)) <= TOL, m
        saved = copy.deepcopy(pol.model.state_dict())
        try:
            with torch.no_grad():
                for p in pol.model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            stale = rollouts_of(engine.generate(prompts[:4], 2))
            assert max_diff(stale, training_logprobs(pol, stale)) > 1e-3, m  # not synced yet: the old weights
            synced(pol, engine)
            fresh = rollouts_of(engine.generate(prompts[:4], 2))
            assert max_diff(fresh, training_logprobs(pol, fresh)) <= TOL, m
            assert {r.policy_version for r in fresh} == {pol.version}
        finally:
            pol.model.load_state_dict(saved)
            synced(pol, engine)


@pytest.mark.slow
def test_rows_past_the_tokenizer_eos_and_stop_strings_on_the_real_vocabularies(engines):
    models, prompts = engines
    torch.manual_seed(0)  # each sequence's seed: the others' tokens keep ~1e-9 of the probability
    for m, (pol, engine) in models.items():
        n, rows = len(pol.tokenizer), pol.model.config.vocab_size
        if rows > n:  # Qwen3: 267 embedding rows past its tokenizer; sampled, they decode to nothing
            with likeliest(pol, engine, range(n, rows)):
                rolls = rollouts_of(engine.generate(prompts[:4], 2))
                assert all(n <= t < rows for r in rolls for t in r.token_ids) and {r.text for r in rolls} == {""}
                assert max_diff(rolls, training_logprobs(pol, rolls)) <= TOL, m
        with likeliest(pol, engine, [pol.eos_id]):  # each response ends at its first token, the EOS
            rolls = rollouts_of(engine.generate(prompts[:4], 2))
            assert all(r.token_ids == [pol.eos_id] and r.finish_reason == "stop" for r in rolls), m
        if not engine._backend.matches_stop:
            continue
        world = pol.encode_text(" world")  # one token
        kept, pol.stop_strings = pol.stop_strings, ("orl",)
        try:
            with likeliest(pol, engine, world):  # vLLM stops at a stop string inside that token, on its decoding
                params = engine.sampling_params([0], False, TEMP, 16)
                out = engine._backend.llm.generate([{"prompt_token_ids": pol.encode_prompt(prompts[0])}], params,
                                                   use_tqdm=False)[0].outputs[0]
                rolls = rollouts_of(engine.generate(prompts[:2], 2))
        finally:
            pol.stop_strings = kept
        assert list(out.token_ids) == world and out.stop_reason == "orl", m
        assert all(r.token_ids == world and r.finish_reason == "stop" and r.text == " world" for r in rolls), m


# ------------------------------------------------------------------------------------------------
# graftzoo export of a pair1-mini run
# ------------------------------------------------------------------------------------------------

def test_exported_folders_load_in_transformers_with_the_published_tokenizers(exported):
    out, pols, output = exported
    problems = benchmark_problems()
    for m, pol in pols.items():
        folder = out / model_slug(m)
        assert f"{m}: step 0 -> {folder}" in output
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        assert type(model) is type(pol.model) and model.config.vocab_size == pol.model.config.vocab_size
        tok = AutoTokenizer.from_pretrained(folder)
        hello, specials = PUBLISHED[m]
        assert tok.encode("Hello world", add_special_tokens=False) == hello, m
        for text, i in specials.items():
            assert tok.encode(text, add_special_tokens=False) == [i] and tok.convert_ids_to_tokens(i) == text, m
        assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (pol.eos_id, pol.pad_id,
                                                                          pol.tokenizer.bos_token_id)
        ref = reference_encoder(VOCAB[m])
        for text in problems:
            assert tok.encode(text, add_special_tokens=False) == ref.encode_ordinary(text), (m, text)
        for text in problems[:8]:  # the training prompt, through the chat template, as graftzoo encodes it
            prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
            assert prompt == render_prompt(text, pol.template, pol.tokenizer), m
            assert tok(prompt)["input_ids"] == pol.encode_text(prompt), m
        ids = torch.tensor([pol.encode_text(prompt) + hello])
        with torch.no_grad():
            assert torch.equal(model(ids).logits, pol.model(ids).logits), m


def test_the_exported_tokenizer_json_is_byte_for_byte_a_fresh_build(exported, tmp_path, monkeypatch):
    out, pols, _ = exported
    build_vocab("smollm3").save_pretrained(tmp_path / "fresh")
    fresh = (tmp_path / "fresh" / "tokenizer.json").read_bytes()
    assert (out / model_slug(SMOL) / "tokenizer.json").read_bytes() == fresh
    assert (out / model_slug(QWEN) / "tokenizer.json").read_bytes() == \
        (cached_vocab_path("qwen3") / "tokenizer.json").read_bytes()
    # a tokenizer that has padded a batch (the warm-up's does, and saves it so beside the model) keeps that setting
    # in its tokenizer.json; the export writes the tokenizer without it
    pol = copy.copy(pols[SMOL])
    pol.tokenizer = copy.deepcopy(pol.tokenizer)
    pol.tokenizer(["12+34", "5"], padding=True)
    assert pol.tokenizer.backend_tokenizer.padding is not None
    monkeypatch.setattr(export, "_loads_back", lambda *a: None)  # the loading back is the test above's
    assert (export_policy(pol, tmp_path / "padded") / "tokenizer.json").read_bytes() == fresh
    assert pol.tokenizer.backend_tokenizer.padding is not None  # the policy's own tokenizer is left as it was


@pytest.mark.slow
def test_exported_folders_load_in_vllm_as_they_are(exported, monkeypatch):
    """vLLM started on each exported folder (its config, weights and tokenizer, text prompts through the folder's chat
    template) tokenizes as graftzoo and gives the checkpointed model's log-probs."""
    vllm = pytest.importorskip("vllm")
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3Model
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper

    from graftzoo.training.engines.vllm_engine import classes_kept
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out, pols, _ = exported
    problems = ("12+34", "What is $7 \\times 8$?")
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    for m, pol in pols.items():
        try:
            with classes_kept(pol.model):  # SmolLM3 runs through vLLM's Transformers backend (vllm_engine)
                llm = vllm.LLM(model=str(out / model_slug(m)), dtype="float32", enforce_eager=True, max_model_len=128,
                               kv_cache_memory_bytes=1 << 26, distributed_executor_backend="uni", seed=0)
            theirs = llm.get_tokenizer()
            texts = [theirs.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                add_generation_prompt=True) for p in problems]
            outs = llm.generate(texts, vllm.SamplingParams(temperature=0.0, max_tokens=8, logprobs=0), use_tqdm=False)
            llm.llm_engine.engine_core.shutdown()
            del llm
        finally:  # vLLM's CPU worker replaces torch.set_num_threads (graftzoo.training.engines.vllm_engine)
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        for p, text, o in zip(problems, texts, outs):
            assert text == render_prompt(p, pol.template, pol.tokenizer), m
            prompt, ids = list(o.prompt_token_ids), list(o.outputs[0].token_ids)
            assert prompt == pol.encode_text(text), m
            with torch.no_grad():
                want = token_logprobs(pol.model(torch.tensor([prompt + ids])).logits[:, len(prompt) - 1:-1],
                                      torch.tensor([ids]))[0].tolist()
            got = [d[t].logprob for d, t in zip(o.outputs[0].logprobs, ids)]
            assert len(got) == len(ids) == 8 and max(abs(a - b) for a, b in zip(got, want)) <= TOL, m
            assert o.outputs[0].text == pol.tokenizer.decode(ids, skip_special_tokens=True), m
    assert TorchCompileWithNoGuardsWrapper not in SmolLM3Model.__mro__


# ------------------------------------------------------------------------------------------------
# graftzoo plan
# ------------------------------------------------------------------------------------------------

def test_plan_counts_each_miniatures_parameters_and_state_exactly(pair_file, exported):
    cfg = load_config(pair=str(pair_file), algo="grpo", overrides=["run.track=false"])  # pair1-mini, untrained
    planned = {m.model: m for m in M.model_memory(cfg)}
    res = CliRunner().invoke(main, ["plan", str(pair_file), "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["model"]: r for r in json.loads(res.output)["models"]}
    for m, trained in exported[1].items():
        pol = copy.copy(trained)  # the exported run's policy, its model copied and given a fresh optimizer
        pol.model = copy.deepcopy(trained.model)
        pol.configure_optimizer(cfg.optim)
        params = list(pol.model.parameters())  # the tied embedding once
        a = planned[m].arch
        assert a.family == VOCAB[m] and a.tied and a.vocab == pol.model.config.vocab_size
        assert M.param_count(a) == sum(p.numel() for p in params) == rows[m]["params"], m
        # every tensor: Qwen3's q / k norms (head_dim 32, decoupled from hidden / heads), SmolLM3's NoPE layers
        assert sorted(M.param_tensor_sizes(a)) == sorted(p.numel() for p in params), m
        pol.step(pol.model(torch.tensor([[1, 2, 3]])).logits.float().pow(2).mean())  # AdamW's state exists
        state = pol._state_tensors()  # the parameters, the rotary tables (NoPE layers or not), AdamW's state
        assert M.movable_bytes(planned[m]) == sum(t.numel() * t.element_size() for t in state), m
    placed = CliRunner().invoke(main, ["plan", str(pair_file), "--gpus", "1", "--set", "rollout.engine=vllm",
                                       "--json"])
    assert placed.exit_code == 0, placed.output
    assert json.loads(placed.output)["fits"] and {g["model"] for g in json.loads(placed.output)["placement"]} == {
        SMOL, QWEN}


# the published totals: SmolLM3-3B counts its tied embedding once; Qwen3-1.7B's 2,031,739,904 counts it twice (the
# output head V·H again), so once it is 2,031,739,904 - 151,936 · 2,048
PUBLISHED_PARAMS = {"HuggingFaceTB/SmolLM3-3B-Base": 3_075_098_624,
                    "Qwen/Qwen3-1.7B-Base": 2_031_739_904 - 151_936 * 2_048}


def test_pair1_counts_come_from_each_arch_as_transformers_builds_it():
    cfg = load_config(pair="pair1", algo="grpo", overrides=["run.track=false"])
    for spec in cfg.pair.models:
        a = M.architecture(spec)
        fields = dict(spec.arch)
        with torch.device("meta"):  # the full-size model, without its memory
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
        params = list(model.parameters())
        assert M.param_count(a) == sum(p.numel() for p in params) == PUBLISHED_PARAMS[spec.id], spec.id
        assert sorted(M.param_tensor_sizes(a)) == sorted(p.numel() for p in params), spec.id
