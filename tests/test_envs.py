"""graftzoo.envs: the Gymnasium environments, templates, the conformance check and its CLI."""
import json
import warnings

import gymnasium as gym
import pytest
from click.testing import CliRunner
from gymnasium.utils.env_checker import check_env

import graftzoo.envs  # noqa: F401  (registers the ids)
from graftzoo.envs import MathReasoningEnv, load_dataset, render_prompt
from graftzoo.envs.check import check_env_id
from graftzoo.apps.env import env_group, parse_kw
from graftzoo.envs.templates import INSTRUCTION, TEMPLATES
from graftzoo.contract.types import Group, Prompt, Rollout


@pytest.fixture(scope="module")
def chat_tokenizer():
    """A real Hugging Face fast tokenizer built in code, with a small chat template."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
                                  unk_token="[UNK]")
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
                         "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    return tok


@pytest.fixture(scope="module")
def amc():
    return MathReasoningEnv("amc23")


# ---------------------------------------------------------------- gymnasium conformance


@pytest.mark.parametrize("env_id, kwargs", [
    ("graftzoo/MathReasoning-v0", {"dataset": "math500"}),
    ("graftzoo/MathReasoning-v0", {"dataset": "gsm8k", "split": "test", "template": "qwen_boxed"}),
    ("graftzoo/Arithmetic-v0", {"size": 64, "seed": 3}),
])
def test_gymnasium_check_env_passes(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker reports soft problems as warnings
        check_env(env.unwrapped)
    obs, info = env.reset(seed=0)  # through the wrappers gym.make adds
    assert obs in env.observation_space
    assert env.step("no idea")[2] is True
    env.close()


def test_check_env_passes_with_a_chat_template(chat_tokenizer):
    env = gym.make("graftzoo/MathReasoning-v0", dataset="aime25", template="chat", tokenizer=chat_tokenizer)
    check_env(env.unwrapped)
    obs, _ = env.reset(seed=1)
    assert obs.endswith("<|assistant|>\n<think></think>") and INSTRUCTION in obs


def test_defaults_of_registered_ids():
    env = gym.make("graftzoo/MathReasoning-v0").unwrapped
    assert env.dataset.name == "math500" and env.template == "plain"
    arith = gym.make("graftzoo/Arithmetic-v0", size=10).unwrapped
    obs, info = arith.reset(seed=0)
    prompt = arith.dataset[info["index"]]
    assert obs == f"Q:{prompt.text}\n" and len(arith.dataset) == 10


# ---------------------------------------------------------------- reset / step


def test_reset_is_deterministic_given_seed(amc):
    ids = lambda seed: [amc.reset(seed=seed)[1]["prompt_id"]] + [amc.reset()[1]["prompt_id"] for _ in range(6)]
    assert ids(7) == ids(7)
    assert ids(7) != ids(8)
    assert len(set(ids(7))) > 1  # unseeded resets move on


def test_reset_info_and_options(amc):
    obs, info = amc.reset(seed=0, options={"index": 3})
    prompt = amc.dataset[3]
    assert obs == render_prompt(prompt.text, "plain")
    assert info == {"prompt_id": "amc23/amc23-3", "index": 3, "dataset": "amc23", "source": "AMC23"}
    assert "gold" not in info  # the gold answer is not leaked by default
    _, info = amc.reset(options={"index": -1, "with_gold": True})
    assert info["index"] == 39 and info["gold"] == amc.dataset[39].gold
    with pytest.raises(IndexError, match="index=40 is out of range.*40 prompts"):
        amc.reset(options={"index": 40})
    with pytest.raises(ValueError, match="unknown reset option.*'gold'"):
        amc.reset(options={"gold": True})


def test_step_info_and_episode_end(amc):
    with pytest.raises(RuntimeError, match="reset"):
        MathReasoningEnv("aime24").step("x")
    obs, _ = amc.reset(options={"index": 0})
    gold = amc.dataset[0].gold
    obs2, reward, terminated, truncated, info = amc.step(f"So the answer is $\\boxed{{{gold}}}$.")
    assert (obs2, reward, terminated, truncated) == (obs, 1.0, True, False)
    assert info == {"prompt_id": "amc23/amc23-0", "correct": True, "extracted": gold, "status": "ok"}
    with pytest.raises(RuntimeError, match="episode is over"):
        amc.step("again")
    amc.reset(options={"index": 0, "with_gold": True})
    _, reward, _, _, info = amc.step("I do not know.")
    assert reward == 0.0 and info["correct"] is False and info["status"] == "no_answer"
    assert info["gold"] == gold
    amc.reset()
    with pytest.raises(TypeError, match="response text"):
        amc.step(42)


def test_reward_convention_and_length_bound():
    env = MathReasoningEnv("aime24", reward_correct=1.0, reward_wrong=-1.0, max_response_chars=50)
    env.reset(options={"index": 0})
    assert env.step("\\boxed{0}")[1] == -1.0
    env.reset(options={"index": 0})
    with pytest.raises(ValueError, match="exceeds max_response_chars=50"):
        env.step("x" * 51)
    assert env.action_space.max_length == 50


# ---------------------------------------------------------------- batch scoring


def _rollout(prompt, text):
    return Rollout(prompt_id=prompt.id, model_id="m", policy_version=0, text=text)


def test_score_batch_agrees_with_step(amc):
    prompts = [amc.dataset[i] for i in range(6)]
    responses = [f"\\boxed{{{p.gold}}}" if i % 2 else f"The answer is {int(p.gold) + 1}." for i, p in enumerate(prompts)]
    batch = amc.score_batch(prompts, responses)
    for i, (resp, res) in enumerate(zip(responses, batch)):
        amc.reset(options={"index": i})
        _, reward, _, _, info = amc.step(resp)
        assert (info["correct"], info["extracted"], info["status"]) == (res.correct, res.extracted, res.status)
        assert reward == float(res.correct)
    assert [r.correct for r in batch] == [False, True, False, True, False, True]


def test_score_groups_returns_scored_copies_and_leaves_the_rollouts_as_they_were():
    env = MathReasoningEnv("aime24", reward_wrong=-1.0)
    p, q = env.dataset[0], env.dataset[1]
    groups = [Group(prompt=p, model_id="m", rollouts=[_rollout(p, f"\\boxed{{{p.gold}}}"), _rollout(p, "\\boxed{1}")]),
              Group(prompt=q, model_id="m", rollouts=[_rollout(q, "no answer here")])]
    before = [[(r.reward, r.correct, r.extracted, r.status) for r in g.rollouts] for g in groups]
    out = env.score_groups(groups)
    r0, r1 = out[0].rollouts
    assert (r0.reward, r0.correct, r0.extracted, r0.status) == (1.0, True, p.gold, "ok")
    assert (r1.reward, r1.correct, r1.extracted, r1.status) == (-1.0, False, "1", "ok")
    assert out[1].rollouts[0].status == "no_answer" and out[0].mixed and out[1].all_fail
    assert [[(r.reward, r.correct, r.extracted, r.status) for r in g.rollouts] for g in groups] == before
    assert [r.text for r in out[0].rollouts] == [r.text for r in groups[0].rollouts]


def test_label_free_prompts_cannot_be_scored(amc):
    free = Prompt(id="u/1", text="1+1?", gold=None)
    with pytest.raises(ValueError, match=r"no gold answer \(label-free\).*u/1.*score their own"):
        amc.score_batch([free], ["\\boxed{2}"])
    with pytest.raises(ValueError, match="label-free"):
        amc.score_groups([Group(prompt=free, model_id="m", rollouts=[_rollout(free, "2")])])
    with pytest.raises(ValueError, match="2 prompts and 1 responses"):
        amc.score_batch([amc.dataset[0], amc.dataset[1]], ["x"])


def test_env_over_a_dataset_object_and_a_user_file(tmp_path):
    ds = load_dataset("arithmetic", size=8, seed=5)
    env = MathReasoningEnv(ds, template="compact")
    assert env.dataset is ds
    with pytest.raises(ValueError, match="MathDataset object"):
        MathReasoningEnv(ds, split="test")
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "Café costs 3€ twice. Total?", "answer": "6"}) + "\n")
    env = MathReasoningEnv(str(path))
    obs, info = env.reset(seed=0)
    assert info["prompt_id"] == "mine/0" and obs in env.observation_space  # non-ASCII in the charset
    check_env(env, skip_render_check=True)  # no spec (not made by gym.make): render modes untestable


# ---------------------------------------------------------------- templates


def test_templates(chat_tokenizer):
    problem = "What is $1+1$?"
    assert render_prompt(problem, "compact") == "Q:What is $1+1$?\n"
    plain = render_prompt(problem)
    assert problem in plain and "\\boxed{}" in plain and "step by step" in plain
    chat = render_prompt(problem, "chat", chat_tokenizer)
    assert chat == f"<|user|>\n{problem}\n{INSTRUCTION}\n<|assistant|>\n<think></think>"
    for name in ("qwen_boxed", "r1"):
        assert problem in render_prompt(problem, name) and "\\boxed{}" in render_prompt(problem, name)
    assert {"plain", "chat", "compact", "qwen_boxed", "r1"} <= set(TEMPLATES)
    # auto: the tokenizer's chat template when it has one, else plain
    assert render_prompt(problem, "auto", chat_tokenizer) == chat and render_prompt(problem, "auto") == plain


def test_template_errors(chat_tokenizer):
    with pytest.raises(ValueError, match="unknown prompt template 'fancy'; known: auto, chat, compact, plain"):
        render_prompt("x", "fancy")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        render_prompt("x", "chat")
    no_template = chat_tokenizer.__class__(tokenizer_object=chat_tokenizer.backend_tokenizer, unk_token="[UNK]")
    with pytest.raises(ValueError, match="has no chat template; use template='plain'"):
        render_prompt("x", "chat", no_template)
    with pytest.raises(ValueError, match="has no chat template"):
        MathReasoningEnv("aime24", template="chat", tokenizer=no_template)


# ---------------------------------------------------------------- check_env_id and CLI


def test_check_env_id_reports_ok_and_gold_failures(tmp_path):
    report = check_env_id("graftzoo/MathReasoning-v0", dataset="aime25")
    assert report.ok and report.n_prompts == report.gold_checked == 30 and not report.gold_failures
    assert "OK" in str(report)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"problem": "Which?", "answer": "3 or 4"}) + "\n"
                    + json.dumps({"problem": "Sum?", "answer": "7"}) + "\n")
    report = check_env_id("graftzoo/MathReasoning-v0", dataset=str(path))
    assert not report.ok and report.reset_deterministic and not report.gym_error
    assert [(f.prompt_id, f.status) for f in report.gold_failures] == [("bad/0", "multiple_answers")]
    assert "bad/0" in str(report) and str(report).endswith("FAILED")


def test_cli_check(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(env_group, ["check", "graftzoo/Arithmetic-v0", "--kw", "size=20", "--kw", "seed=4"])
    assert ok.exit_code == 0, ok.output
    assert "arithmetic: 20 prompts" in ok.output and ok.output.rstrip().endswith("OK")
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"problem": "Which?", "answer": "3 or 4"}) + "\n")
    bad = runner.invoke(env_group, ["check", "graftzoo/MathReasoning-v0", "--kw", f"dataset={path}"])
    assert bad.exit_code == 1 and "FAILED" in bad.output
    usage = runner.invoke(env_group, ["check", "graftzoo/Arithmetic-v0", "--kw", "size"])
    assert usage.exit_code == 2 and "expected key=value" in usage.output


def test_parse_kw():
    assert parse_kw(("dataset=math500", "size=64", "x=1.5", "flag=true", "split=null", "e=")) == {
        "dataset": "math500", "size": 64, "x": 1.5, "flag": True, "split": None, "e": ""}
