"""Inputs that used to run to the end without learning, or crash without naming the culprit, driven as a user types
them: a stored peer that does not cover the run (too short, killed early, other prompts), training settings whose
update is identically zero (groups of one, greedy sampling, a learning rate of 0), and prompts that do not fit the
model's context (docs/reliability.md#values-that-cannot-train, docs/guide.md#bring-your-own-data)."""
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import load_config
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.types import Prompt
from graftzoo.peers.store import TrajectoryStore
from helpers import cli_here as run_here

A, B = "micro-qwen-char", "micro-gpt2-pair"
QUIET = ["--no-track", "--set", "run.eval_at_end=false", "--set", "run.save_every=0"]


def cli_here(*args):
    """``graftzoo ARGS`` through click's runner (errors raised before any model is built)."""
    return CliRunner().invoke(main, [str(a) for a in args], env={"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"})


def error_line(code: int, out: str, rc: int) -> str:
    assert rc == code, (rc, out[-3000:])
    assert "Traceback" not in out, out[-3000:]
    lines = [x for x in out.splitlines() if x.startswith("Error:")]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


def records(run_dir: Path) -> list:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------------------------------------
# 1. a stored peer must cover the run
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def short_peer(tmp_path_factory) -> Path:
    """A GRPO run of model B whose store holds step 0 only: a run of 1 step, or one killed after its first step."""
    out = tmp_path_factory.mktemp("peer")
    res = cli_here("train", "--algo", "grpo", "--pair", "micro", *QUIET, "--set", f"run.out_dir={out}",
                   "--set", "run.steps=1", "--set", f"pair.train=[{B}]", "--set", "run.name=peerB")
    assert res.exit_code == 0, res.output
    return out / "peerB"


def stored_graft(tmp_path, peer, *sets, source="stored"):
    train = ["--set", f"pair.train=[{A}]"] if source == "stored" else ["--set", "peer.mix_ratio=1.0"]
    args = ["train", "--algo", "graft", "--pair", "micro", *QUIET, "--peer", f"{source}:{peer}", *train,
            "--set", f"run.out_dir={tmp_path}", "--set", "run.name=g", "--set", "run.steps=3"]
    for s in sets:
        args += ["--set", s]
    return args


@pytest.mark.parametrize("source", ["stored", "mixed"])
def test_a_store_shorter_than_the_run_is_refused_before_any_model_is_built(short_peer, tmp_path, source):
    res = cli_here(*stored_graft(tmp_path, short_peer, source=source))
    line = error_line(2, res.output, res.exit_code)
    assert "'peer.path'" in line and "holds steps 0," in line and "needs steps 0-2" in line
    assert "steps 1-2 are not in the store" in line and "peer.missing=skip" in line
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("key", ["peer.missing", "peers.stored.missing"])  # the second: its other spelling
def test_skip_trains_the_missing_steps_without_a_peer_and_counts_them(short_peer, tmp_path, key):
    res = run_here(*stored_graft(tmp_path, short_peer, f"{key}=skip"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "steps 1-2 are not in the store" in res.stderr and "peer.missing=skip" in res.stderr
    recs = records(tmp_path / "g")
    assert [r["peer/stored_missing"] for r in recs] == [0, 1, 1]   # summed: 2 steps trained without a peer


def test_a_store_of_other_prompts_is_refused_and_of_other_questions_before_any_model(short_peer, tmp_path):
    data = tmp_path / "d40.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"{i % 9}+{i % 7}", "answer": str(i % 9 + i % 7)})
                            + "\n" for i in range(40)))
    on_data = ["--set", f"task.dataset={data}", "--set", "eval.dataset=math500"]
    res = cli_here("train", "--algo", "grpo", "--pair", "micro", *QUIET, *on_data, "--set", f"run.out_dir={tmp_path}",
                   "--set", "run.steps=3", "--set", f"pair.train=[{B}]", "--set", "run.name=seed1",
                   "--set", "run.seed=1")
    assert res.exit_code == 0, res.output
    res = cli_here(*stored_graft(tmp_path, tmp_path / "seed1", *on_data[1::2]))
    line = error_line(2, res.output, res.exit_code)
    assert "hold other prompts" in line and "run.seed" in line          # same steps, another sampling of the data
    assert not (tmp_path / "g").exists()
    # the same prompt ids with other questions (another task.difficulty): refused at start, not at the first step
    res = cli_here(*stored_graft(tmp_path, short_peer, "task.difficulty=1", "run.steps=1"))
    line = error_line(2, res.output, res.exit_code)  # the peer.path of another task: a usage error
    assert "arith-train-0-0" in line and "in the store but" in line
    assert not (tmp_path / "g").exists()


# ------------------------------------------------------------------------------------------------
# 2. settings whose update is identically zero
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo,sets", [
    ("grpo", []), ("rloo", []), ("dr_grpo", []), ("gspo", []), ("dapo", []), ("extra", []), ("hora", []),
    ("om_grpo", []), ("grpo_n8", []), ("sgt", ["--peer", "online"]),
    ("sgt", ["--peer", "online", "--set", "algo.mode=aux_nll", "--set", "algo.lam=0"]),
    ("graft", ["--peer", "online"]),
])
def test_groups_of_one_are_refused_for_every_learner_whose_advantage_needs_a_group(tmp_path, algo, sets):
    res = cli_here("train", "--algo", algo, "--pair", "micro", *QUIET, *sets, "--set", "rollout.n=1",
                   "--set", f"run.out_dir={tmp_path}")
    line = error_line(2, res.output, res.exit_code)
    assert "rollout.n" in line and ("advantage" in line or "baseline" in line or "consensus" in line)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("algo,sets", [("grpo", []), ("gspo", []), ("graft", ["--peer", "online"])])
def test_greedy_sampling_is_refused_where_every_group_would_be_identical(tmp_path, algo, sets):
    res = cli_here("train", "--algo", algo, "--pair", "micro", *QUIET, *sets, "--set", "rollout.top_k=1",
                   "--set", f"run.out_dir={tmp_path}")
    line = error_line(2, res.output, res.exit_code)
    assert "rollout.top_k" in line and "greedily" in line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("algo,sets", [
    ("hacpo", ["rollout.n=1", "peer.source=online"]),                                    # pooled with the peer's
    ("sgt", ["rollout.n=1", "peer.source=online", "algo.mode=aux_nll"]),                 # the rescue NLL learns
    ("graft", ["rollout.n=1", "peer.source=stored", "peer.path=runs/p", f"pair.train=[{A}]"]),  # the peer's groups
    ("sgt", ["rollout.top_k=1", "peer.source=online"]),                                  # rescues make groups mixed
    ("grpo", ["rollout.top_k=2"]),
])
def test_learners_that_learn_without_a_group_of_their_own_keep_those_settings(algo, sets):
    load_config(pair="micro", algo=algo, overrides=sets)


def test_the_check_reads_the_learners_declaration_not_its_name():
    from graftzoo import Learner, LearnerConfig, register_algo

    class PooledConfig(LearnerConfig):
        def group_needed(self, run):
            return None   # e.g. a baseline from outside the group

    @register_algo("test_silent_faults_pooled")
    class Pooled(Learner):
        Config = PooledConfig

    @register_algo("test_silent_faults_inherits")
    class Inherits(Learner):
        Config = LearnerConfig   # the base learner's advantage: GRPO's

    assert load_config(pair="micro", algo="test_silent_faults_pooled", overrides=["rollout.n=1"]).rollout.n == 1
    with pytest.raises(ConfigError, match="'rollout.n' must be >= 2 for algorithm 'test_silent_faults_inherits'"):
        load_config(pair="micro", algo="test_silent_faults_inherits", overrides=["rollout.n=1"])


def test_a_learning_rate_of_zero_is_said_at_start(tmp_path):
    res = run_here("train", "--algo", "grpo", "--pair", "micro", *QUIET, "--set", f"run.out_dir={tmp_path}",
                   "--set", "run.steps=1", "--set", f"pair.train=[{A}]", "--set", "optim.lr=0")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"model '{A}': optim.lr is 0: its weights never change" in res.stderr


# ------------------------------------------------------------------------------------------------
# 3. prompts that do not fit the model's context
# ------------------------------------------------------------------------------------------------

def rows(n, long=()):
    out = [{"id": f"q{i}", "problem": f"{i % 9}+{i % 7}", "answer": str(i % 9 + i % 7)} for i in range(n)]
    return out + [{"id": f"long{j}", "problem": text, "answer": "1"} for j, text in enumerate(long)]


def test_a_huge_problem_is_dropped_cheaply_and_counted(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(12, long=["1+" * 2_500_000 + "1"])))  # one 5 MB row
    t = time.perf_counter()
    res = run_here("train", "--algo", "grpo", "--pair", "micro", *QUIET, "--set", f"run.out_dir={tmp_path}",
                   "--set", "run.name=r", "--set", f"task.dataset={data}", "--set", "eval.dataset=math500",
                   "--set", "task.prompts_per_step=13", "--set", "optim.minibatches=1", "--set", "run.steps=1")
    took = time.perf_counter() - t
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mine.jsonl: dropped 1 of 13 training prompts that do not fit" in res.stderr, res.stderr[-3000:]
    assert f"model '{A}': 1 over its 88 prompt tokens" in res.stderr
    assert {r["step"] for r in records(tmp_path / "r")} == {0}
    trained = set(TrajectoryStore(tmp_path / "r" / "store", create=False).read(A)["prompt_id"])
    assert "long0" not in trained and len(trained) == 12
    print(f"run with a 5 MB problem: {took:.1f} s")


def test_a_text_that_cannot_fit_is_never_tokenized():
    from graftzoo.training.engines.engine import fitting_prompts
    seen = []

    class CharTokenizer:  # records what it is asked to tokenize
        def get_vocab(self):
            return {c: i for i, c in enumerate("0123456789+Q:\n")}

        def __call__(self, texts, add_special_tokens=False):
            seen.extend(texts)
            return {"input_ids": [list(t) for t in texts]}

    prompts = [Prompt(id="a", text="1+1", gold="2"), Prompt(id="b", text="1+" * 10**6, gold="0"),
               Prompt(id="c", text="1+" * 15, gold="0")]
    kept, dropped = fitting_prompts(prompts, {"m": (CharTokenizer(), "compact", 20)})
    assert [p.id for p in kept] == ["a"] and dropped == {"m": 2}
    assert max(map(len, seen)) < 100   # "c" was tokenized (and is too long), "b" never was


def test_a_dataset_without_a_prompt_that_fits_is_refused_naming_the_file(tmp_path):
    data = tmp_path / "toolong.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(0, long=["1+" * (50 + i) + "1" for i in range(12)])))
    res = cli_here("train", "--algo", "grpo", "--pair", "micro", *QUIET, "--set", f"run.out_dir={tmp_path}",
                   "--set", f"task.dataset={data}", "--set", "eval.dataset=math500")
    line = error_line(2, res.output, res.exit_code)
    assert "'task.dataset'" in line and "toolong.jsonl" in line and "none of its 12 training prompts fit" in line
    assert "88 prompt tokens" in line
    assert not any(p.is_dir() for p in tmp_path.iterdir())
