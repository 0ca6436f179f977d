"""graftzoo export: a 1-step micro run's models as Hugging Face folders that transformers and vLLM load
as they are (the same logits as the checkpointed model, the same tokenizer and training prompt through the chat
template, the same greedy text in vLLM); a LoRA model is saved merged. Also: the summary ``graftzoo train`` prints
at the end, and ``graftzoo eval`` writing its own file, never the trainer's."""
import copy
import json
import os

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from graftzoo.apps.cli import main
from graftzoo.training.export import EXPORT_META, export_policy, model_slug, template_jinja
from graftzoo.training.run.checkpoint import load_weights
from graftzoo.envs.task import Task
from graftzoo.envs.templates import render_prompt
from graftzoo.eval.artifacts import load_run
from graftzoo.training.eval_checkpoints import build_policies, load_run_config

MODELS = ("micro-qwen-char", "micro-gpt2-pair")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run dir, what ``graftzoo train`` printed) of a 1-step micro GRPO run with its final evaluation."""
    run_dir = tmp_path_factory.mktemp("export") / "run"
    res = CliRunner().invoke(main, ["train", "--algo", "grpo", "--pair", "micro", "--no-track", "--run-dir",
                                    str(run_dir), "--set", "run.steps=1", "--set", "task.prompts_per_step=2",
                                    "--set", "rollout.n=2", "--set", "eval.size=4", "--set", "eval.k=2"])
    assert res.exit_code == 0, res.output
    return run_dir, res.output


@pytest.fixture(scope="module")
def exported(run):
    run_dir, _ = run
    out = run_dir.parent / "hf"
    res = CliRunner().invoke(main, ["export", str(run_dir), "--out", str(out)])
    assert res.exit_code == 0, res.output
    cfg = load_run_config(run_dir)
    pols = build_policies(cfg)
    for pol in pols.values():
        load_weights(pol, run_dir / "checkpoints" / "step_000000")
        pol.model.eval()
    prompts = list(Task(cfg).make_env("test", size=3).dataset)
    return out, pols, prompts, res.output


def test_train_ends_with_a_summary(run):
    run_dir, output = run
    evals = {m: json.loads((run_dir / "eval" / f"{m}.json").read_text()) for m in MODELS}
    assert "done: 1 of 1 steps" in output
    for m in MODELS:
        whole = evals[m]["overall"]
        assert f"{m}  held-out avg@2 {100 * whole['avg']:.1f}  greedy {100 * whole['greedy']:.1f}" in output
        assert str(run_dir / "eval" / f"{m}.json") in output
    for line in (f"run directory: {run_dir}", f"summary  {run_dir / 'summary.json'}",
                 f"metrics  {run_dir / 'metrics.jsonl'}", f"graftzoo report {run_dir}", f"graftzoo export {run_dir}"):
        assert line in output


def test_export_loads_in_transformers_with_the_checkpoints_logits_and_prompt(run, exported):
    run_dir, _ = run
    out, pols, prompts, output = exported
    for m, pol in pols.items():
        folder = out / model_slug(m)
        assert f"{m}: step 0 -> {folder}" in output and (folder / "model.safetensors").is_file()
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        tok = AutoTokenizer.from_pretrained(folder)
        texts = [pol.render(p) for p in prompts]
        for p, text in zip(prompts, texts):
            assert text == f"Q:{p.text}\n"  # the micro pair's compact template
            assert tok.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                           add_generation_prompt=True) == text
            assert tok.encode(text, add_special_tokens=False) == pol.encode_prompt(p)
            assert tok.decode(pol.encode_prompt(p)) == text
        answer = pol.encode_text("12*3=36") + [pol.eos_id]
        assert tok.decode(answer, skip_special_tokens=True) == pol.decode(answer) == "12*3=36"
        assert (tok.eos_token_id, tok.pad_token_id, tok.padding_side) == (pol.eos_id, pol.pad_id, "left")
        ids = torch.tensor([pol.encode_prompt(prompts[0]) + answer])
        with torch.no_grad():
            assert torch.equal(model(ids).logits, pol.model(ids).logits)
        meta = json.loads((folder / EXPORT_META).read_text())
        trainer_eval = json.loads((run_dir / "eval" / f"{m}.json").read_text())
        assert meta["model"] == m and meta["step"] == 0 and meta["template"] == "compact"
        assert meta["checkpoint"] == "checkpoints/step_000000" and meta["run"] == load_run_config(run_dir).run.name
        assert meta["run"].startswith("grpo-micro-") and meta["run"].endswith("-s0")  # its default name
        assert meta["eval"][f"eval/{m}.json"]["overall"] == trainer_eval["overall"]["avg"]


@pytest.mark.slow
def test_exported_folders_generate_in_vllm_as_in_transformers(exported):
    vllm = pytest.importorskip("vllm")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    out, pols, prompts, _ = exported
    threads = torch.get_num_threads()
    set_threads = torch.set_num_threads
    for m in MODELS:
        folder = str(out / model_slug(m))
        tok = AutoTokenizer.from_pretrained(folder)
        texts = [tok.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                         add_generation_prompt=True) for p in prompts]
        hf = AutoModelForCausalLM.from_pretrained(folder).eval()
        want = []
        for text in texts:
            ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            gen = hf.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)
            want.append(tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
        try:  # vLLM's own tokenizer and chat-free text prompts: the folder as it is
            llm = vllm.LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=128,
                           kv_cache_memory_bytes=1 << 26, distributed_executor_backend="uni", seed=0)
            outs = llm.generate(texts, vllm.SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
            assert [o.outputs[0].text for o in outs] == want and any(want), m
            llm.llm_engine.engine_core.shutdown()
            del llm
        finally:  # vLLM's CPU worker replaces torch.set_num_threads (see graftzoo.training.engines.vllm_engine)
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)


def test_a_lora_model_is_exported_merged(exported, tmp_path):
    peft = pytest.importorskip("peft")
    _, pols, prompts, _ = exported
    pol = copy.copy(pols["micro-qwen-char"])
    torch.manual_seed(0)
    pol.model = peft.get_peft_model(copy.deepcopy(pol.model), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # B starts at zero: the adapter would change nothing
    folder = export_policy(pol, tmp_path / "lora")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert not any("lora" in k for k in model.state_dict())
    ids = torch.tensor([pol.encode_prompt(prompts[0])])
    with torch.no_grad():
        merged, adapted, base = model(ids).logits, pol.model(ids).logits, pols["micro-qwen-char"].model(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-5) and not torch.allclose(merged, base, atol=1e-3)
    assert hasattr(pol.model, "peft_config")  # the policy's own model stays a peft model


@pytest.mark.parametrize("template", ["compact", "plain", "qwen_boxed", "r1"])
def test_chat_template_renders_each_training_template(template, exported):
    _, pols, _, _ = exported
    tok = copy.deepcopy(pols["micro-gpt2-pair"].tokenizer)
    tok.chat_template = template_jinja(template, tok)
    for problem in ("12+345", 'Find {x} with "quotes", a \\ backslash\nand {{ braces }}.'):
        assert tok.apply_chat_template([{"role": "user", "content": problem}], tokenize=False,
                                       add_generation_prompt=True) == render_prompt(problem, template, tok)


def test_eval_writes_its_own_file_and_never_the_trainers(run):
    run_dir, _ = run
    trainer_files = {m: (run_dir / "eval" / f"{m}.json").read_bytes() for m in MODELS}
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(run_dir), "--benchmarks", "heldout", "--k", "1",
                                    "--limit", "2", "--no-greedy"])
    assert res.exit_code == 0, res.output
    for m in MODELS:
        assert (run_dir / "eval" / f"{m}.json").read_bytes() == trainer_files[m]
        path = run_dir / "eval" / "cli" / "step_0-heldout-k1-limit2" / f"{m}.json"
        assert f"wrote {path}" in res.output
        payload = json.loads(path.read_text())
        assert payload["step"] == 0 and payload["benchmarks"]["heldout"]["n_items"] == 2
    assert {m: json.dumps(p, indent=2).encode() for m, p in load_run(run_dir).evals.items()} == trainer_files
    refused = CliRunner().invoke(main, ["eval", "--ckpt", str(run_dir), "--k", "1", "--out", str(run_dir / "eval")])
    assert refused.exit_code == 2 and "never overwrites" in refused.output
    assert all((run_dir / "eval" / f"{m}.json").read_bytes() == trainer_files[m] for m in MODELS)
