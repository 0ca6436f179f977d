"""Bring your own model: a ``kind: hf`` model from a local folder trains with its own chat template
(``template: auto``), a base model on the ``plain`` template ends its responses at stop strings (HF and vLLM
engines alike: ids, text, log-probs and finish reason consistent), a model that cannot be loaded fails in one line
before any run directory exists, and no run file is ever written into a model's folder.

The model is graftzoo.tiny.hf's: a 2-layer Llama (hidden 64, head size 32) with a character-level fast tokenizer over the
printable ASCII characters, saved with ``save_pretrained`` (random weights: it only has to load, decode and train).
A Llama, not a Qwen2: transformers 5 loads a qwen2 folder's tokenizer as its own Qwen2Tokenizer (graftzoo.tiny)."""
import time

import pytest
import torch
import yaml
from click.testing import CliRunner
from huggingface_hub import constants as hf_constants

from graftzoo.apps.cli import main
from graftzoo.contract.config import ConfigError, load_config
from graftzoo.training.engines.engine import stop_cut
from graftzoo.training.planner.build import build_engine, build_policy
from graftzoo.contract.names import model_slug
from graftzoo.contract.types import Prompt
from graftzoo.envs.task import Task
from graftzoo.envs.templates import INSTRUCTION
from graftzoo.peers.store import TrajectoryStore
from graftzoo.tiny.hf import CHAT_TEMPLATE, save_hf_model

CHAT = CHAT_TEMPLATE


def make_hf_model(folder, chat_template=CHAT):
    return save_hf_model(folder, chat_template=chat_template)


def listing(folder) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def byo_pair(tmp_path, spec: dict) -> str:
    """A pair file with one ``kind: hf`` model (micro-sized run settings)."""
    path = tmp_path / "byo.yaml"
    path.write_text(yaml.safe_dump({
        "name": "byo", "models": [{"kind": "hf", "dtype": "float32", **spec}],
        "task": {"env": "graftzoo/Arithmetic-v0", "mix": {"add": 1}, "difficulty": 1, "prompts_per_step": 2},
        "rollout": {"n": 2, "max_new_tokens": 6}, "eval": {"size": 2, "k": 1},
        "run": {"steps": 1, "save_every": 1, "progress": False, "eval_at_end": True}}))
    return str(path)


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("byo")
    return make_hf_model(root / "chat-model"), make_hf_model(root / "base-model", chat_template=None)


# ---- templates and stop strings per model -------------------------------------------------------------------

def test_auto_template_is_the_models_chat_template_or_plain_with_stop_strings_and_compact_for_tiny(hf_models,
                                                                                                   tmp_path):
    chat, base = hf_models
    cfg = load_config(pair=byo_pair(tmp_path, {"id": str(chat)}), algo="grpo")
    assert cfg.pair.template == "auto" and cfg.rollout.stop == "auto"
    pol = build_policy(cfg.pair.models[0], cfg)
    assert pol.template == "chat" and pol.stop_strings == []
    text = pol.render(Prompt(id="p", text="2+3", gold="5"))
    assert text == f"<|user|>2+3\n{INSTRUCTION}\n<|assistant|>"  # the model's own template, not compact
    spec = {"id": "base", "path": str(base), "stop": ["<|user|>"]}
    cfg = load_config(pair=byo_pair(tmp_path, spec), algo="grpo")
    pol = build_policy(cfg.pair.models[0], cfg)
    assert pol.template == "plain" and pol.stop_strings == ["<|user|>"]  # the model's own stop strings win
    assert pol.render(Prompt(id="p", text="2+3", gold="5")).startswith("Problem: 2+3\n")
    cfg = load_config(pair=byo_pair(tmp_path, {"id": "base", "path": str(base)}), algo="grpo")
    assert build_policy(cfg.pair.models[0], cfg).stop_strings == ["\nProblem:", "\n\nProblem"]
    micro = load_config(pair="micro", algo="grpo", overrides=["pair.template=auto"])
    pol = build_policy(micro.pair.models[0], micro)  # tiny tokenizers have a chat template: still compact
    assert pol.template == "compact" and pol.stop_strings == []


@pytest.mark.parametrize("override, why", [
    ("rollout.stop=[\"\"]", "empty stop string"),
    ("rollout.stop=Problem", "must be one of auto or a list"),
    ("pair.models=[{id: a/b, kind: tiny}, {id: a__b, kind: tiny}]", "name the same run files"),
])
def test_bad_stop_strings_and_clashing_file_names_are_refused_naming_the_key(override, why):
    with pytest.raises(ConfigError, match=why):
        load_config(pair="micro", algo="grpo", overrides=[override])


def test_file_names_from_model_ids_never_leave_the_folder_they_are_made_in():
    assert model_slug("Qwen/Qwen3-1.7B-Base") == "Qwen__Qwen3-1.7B-Base"  # the names hub ids always had
    for mid in ("/data/models/my-model", "./my-model", "../../etc", ".", "..", "C:\\models\\m", "a b/c:d", "x" * 300):
        slug = model_slug(mid)
        assert "/" not in slug and "\\" not in slug and not slug.startswith(".") and 0 < len(slug) <= 120, slug
    assert model_slug("x" * 300) != model_slug("x" * 299 + "y")


def test_stop_cut_keeps_the_token_that_completes_the_stop_string(hf_models, tmp_path):
    cfg = load_config(pair=byo_pair(tmp_path, {"id": str(hf_models[1])}), algo="grpo")
    pol = build_policy(cfg.pair.models[0], cfg)
    ids = pol.encode_text("x=5\n\nProblem: 7")
    assert stop_cut(pol, [], ids, ["\nProblem:"]) == len("x=5\n\nProblem:")
    assert stop_cut(pol, [], ids, ["\n\nProblem", "=5"]) == len("x=5")  # the first occurrence of any
    assert stop_cut(pol, [], ids, ["Solution:"]) is None and stop_cut(pol, [], ids, []) is None
    pre = pol.encode_text("=5 and")  # a stop string inside a given response prefix does not count
    assert stop_cut(pol, pre, pol.encode_text(" y=5"), ["=5"]) == 4
    assert stop_cut(pol, pre, pol.encode_text(" y"), ["=5"]) is None


# ---- both engines stop at stop strings ----------------------------------------------------------------------

STOP = ["=1", "Q"]  # strings the micro-qwen-char model writes often (multi- and single-character)


def check_stopped_like_cut(pol, plain_groups, stop_groups, stop) -> int:
    """Every rollout decoded with stop strings is the one decoded without them (same seeds) cut right after the
    first completed stop string: ids, log-probs and text consistent, finish "stop". Returns how many a stop string
    ended."""
    ended = 0
    for g0, g1 in zip(plain_groups, stop_groups):
        for r0, r1 in zip(g0.rollouts, g1.rollouts):
            body0 = r0.body_ids
            cut = min([len(body0) + 1] + [k for k in range(1, len(body0) + 1)
                                          if any(s in pol.decode(body0[:k]) for s in stop)])
            if cut <= len(body0):  # a stop string in the free-running response: the stopped one ends there
                ended += 1
                assert r1.token_ids == body0[:cut] and r1.finish_reason == "stop", (r0.text, r1.text)
                assert r1.text == pol.decode(r1.token_ids) and any(s in r1.text for s in stop)
                assert not any(s in pol.decode(r1.token_ids[:-1]) for s in stop)  # the last token completes it
                assert r1.body_ids == r1.token_ids and r1.token_count == len(r1.token_ids)
                assert r1.logprobs == pytest.approx(r0.logprobs[:cut], abs=1e-5)
            else:
                assert (r1.token_ids, r1.finish_reason, r1.text) == (r0.token_ids, r0.finish_reason, r0.text)
    return ended


def generate_both(pol, engine, prompts, stop):
    pol.stop_strings = []
    torch.manual_seed(3)
    plain = engine.generate(prompts, 4)
    pol.stop_strings = list(stop)
    torch.manual_seed(3)
    return plain, engine.generate(prompts, 4)


def test_the_hf_engine_ends_a_response_at_the_token_completing_a_stop_string():
    cfg = load_config(pair="micro", algo="grpo", overrides=["run.track=false"])
    pol = build_policy(cfg.pair.models[0], cfg)
    prompts = list(Task(cfg).make_env("test", size=6).dataset)
    plain, stopped = generate_both(pol, build_engine(pol, cfg), prompts, STOP)
    assert check_stopped_like_cut(pol, plain, stopped, STOP) >= 6


@pytest.mark.slow
def test_the_vllm_engine_ends_a_response_at_the_token_completing_a_stop_string():
    pytest.importorskip("vllm")
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "run.track=false", "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625", f"rollout.stop={STOP}"])
    spec = cfg.pair.models[1]  # micro-gpt2-pair: digit-pair tokens, so a token may complete "=1" and go on
    pol = build_policy(spec, cfg)
    assert pol.stop_strings == STOP
    engine = build_engine(pol, cfg)  # started with the policy's tokenizer: vLLM matches stop strings on text
    try:
        prompts = list(Task(cfg).make_env("test", size=6).dataset)
        plain, stopped = generate_both(pol, engine, prompts, STOP)
        assert check_stopped_like_cut(pol, plain, stopped, STOP) >= 6
    finally:
        engine.close()


# ---- a run with a model given by its folder -----------------------------------------------------------------

def test_a_run_with_a_folder_as_model_id_trains_and_writes_nothing_into_the_model_folder(hf_models, tmp_path):
    chat = hf_models[0]
    before = listing(chat)
    out = tmp_path / "runs"
    res = CliRunner().invoke(main, ["train", "--algo", "grpo", "--pair", byo_pair(tmp_path, {"id": str(chat)}),
                                    "--no-track", "--set", f"run.out_dir={out}", "--set", "run.name=byo"])
    assert res.exit_code == 0, res.output
    assert listing(chat) == before  # nothing written into (or changed in) the model's folder
    run, slug = out / "byo", model_slug(str(chat))
    store = TrajectoryStore(run / "store", create=False)
    assert store.steps(str(chat)) == [0] and (run / "store" / slug / "step_000000.parquet").is_file()
    assert set(store.read(str(chat))["model_id"]) == {str(chat)}  # the id itself is kept as given
    assert (run / "checkpoints" / "step_000000" / f"{slug}.pt").is_file() and (run / "eval" / f"{slug}.json").is_file()


# ---- a model that cannot be loaded: one line, in seconds, no run directory ----------------------------------

def _no_weights(tmp_path):
    folder = make_hf_model(tmp_path / "no-weights")
    for f in folder.glob("*.safetensors"):
        f.unlink()
    return {"id": "mine", "path": str(folder)}


@pytest.mark.parametrize("case", ["missing folder", "no weights", "offline hub id", "unreachable hub"])
def test_a_model_that_cannot_be_loaded_fails_in_one_line_before_any_run_directory(case, tmp_path, monkeypatch):
    spec, why = {
        "missing folder": ({"id": str(tmp_path / "nowhere" / "model")}, "no such folder"),
        "no weights": (None, "holds no weights"),
        "offline hub id": ({"id": "graftzoo-test/not-a-cached-model"}, "HF_HUB_OFFLINE is set"),
        "unreachable hub": ({"id": "graftzoo-test/not-a-cached-model"}, "the hub cannot be reached"),
    }[case]
    spec = spec or _no_weights(tmp_path)
    if case == "offline hub id":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hf_constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    out = tmp_path / "runs"
    t = time.perf_counter()
    res = CliRunner().invoke(main, ["train", "--algo", "grpo", "--pair", byo_pair(tmp_path, spec), "--no-track",
                                    "--set", f"run.out_dir={out}"])
    assert time.perf_counter() - t < 10
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: model '{spec['id']}': ") and why in lines[0], lines
    assert not out.exists()  # checked before the run directory is made
