"""Training on unlabelled data (config key ``task.label_free``, docs/guide.md#unlabelled-data), driven as a user types
it: a file with rows lacking a gold answer is refused with a fix that works, and that fix trains OM-GRPO end to end;
a learner that needs labels is refused the key, by its declaration (``AlgoSection.label_free``), not by its name; a
held-out or validation set that would hold unlabelled prompts is refused naming the labelled set to give."""
import json
from types import SimpleNamespace
from typing import ClassVar

import pandas as pd
import pytest
from click.testing import CliRunner

from graftzoo import Learner, LearnerConfig, register_algo
from graftzoo.apps.cli import main
from graftzoo.contract.config import ConfigError, load_config
from graftzoo.envs.task import Task
from helpers import one_line_error

MODEL = "micro-qwen-char"
# cheap and able to learn on the micro pair: one model, a short consensus judgement (as in tests/test_om_grpo.py)
CHEAP = ["--no-track", "--no-resume", "--set", f"pair.train=[{MODEL}]", "--set", "run.steps=2",
         "--set", "run.save_every=0", "--set", "eval.size=4", "--set", "algo.answer_format=any",
         "--set", "algo.contrast_max_new_tokens=12", "--set", "algo.contrast_template=compact"]


def sums(n):
    """Problems the micro models' tokenizers can encode (digits and + only)."""
    return [(3 * i % 17 + 1, 5 * i % 13 + 2) for i in range(n)]


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path):
    """``unl.jsonl``: 40 problems, only the first with a gold answer (so the first unlabelled one is line 2);
    ``held.jsonl``: 6 labelled problems."""
    rows = [{"id": f"q{i}", "problem": f"{a}+{b}", **({"answer": str(a + b)} if i == 0 else {})}
            for i, (a, b) in enumerate(sums(40))]
    held = [{"id": f"h{i}", "problem": f"{a}+{b}", "answer": str(a + b)} for i, (a, b) in enumerate(sums(6))]
    return jsonl(tmp_path / "unl.jsonl", rows), jsonl(tmp_path / "held.jsonl", held)


def train(tmp_path, algo, *sets):
    args = ["train", "--algo", algo, "--pair", "micro", "--set", f"run.out_dir={tmp_path / 'runs'}",
            "--set", "run.name=lf"]
    for s in sets:
        args += ["--set", str(s)]
    return CliRunner().invoke(main, args + (CHEAP if algo == "om_grpo" else CHEAP[:8]))


def error_line(res, code: int, *needles) -> str:
    """``helpers.one_line_error`` of a click runner's result."""
    return one_line_error(SimpleNamespace(returncode=res.exit_code, stdout=res.output, stderr=res.stderr), code,
                          *needles)


def no_run(tmp_path) -> bool:
    runs = tmp_path / "runs"
    return not runs.exists() or not any(runs.rglob("*"))


def test_unlabelled_rows_are_refused_with_a_fix_that_trains_om_grpo_end_to_end(tmp_path, data):
    unl, held = data
    res = train(tmp_path, "om_grpo", f"task.dataset={unl}")
    error_line(res, 2, "config key 'task.dataset'", "unl.jsonl:2: field 'answer' is missing",
               "set task.label_free: true", "om_grpo")
    assert "label_free=True" not in res.output and no_run(tmp_path)

    # the fix the line suggests, with a labelled evaluation set
    res = train(tmp_path, "om_grpo", f"task.dataset={unl}", "task.label_free=true", f"eval.dataset={held}")
    assert res.exit_code == 0, res.output[-3000:] + repr(res.exception)
    run = tmp_path / "runs" / "lf"
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if r.get("model") == MODEL and r.get("rollouts/generated") is not None]
    assert [r["step"] for r in steps] == [0, 1]                     # run.steps, then the final evaluation's record
    for r in steps:
        assert r["rollouts/generated"] == 4 * 4 and r["loss"] is not None and r["reward/acc"] == 0.0
    assert max(r["reward/mean"] for r in steps) > 0                 # the consensus reward, not a gold check
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done"
    # it trained on the unlabelled rows of the file (gold null in the store), and was evaluated on held.jsonl
    store = pd.concat(pd.read_parquet(p) for p in sorted((run / "store" / MODEL).glob("*.parquet")))
    assert store["prompt_id"].str.startswith("unl/").all() and store["gold"].isna().all()
    assert (store["prompt_id"] != "unl/q0").any()
    final = json.loads((run / "eval" / f"{MODEL}.json").read_text())
    assert final["benchmarks"]["held"]["n_items"] == 4   # eval.size prompts of held.jsonl, scored against gold


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo"])
def test_a_learner_that_needs_labels_is_refused_the_key_at_config_time(tmp_path, data, algo):
    unl, held = data
    res = train(tmp_path, algo, f"task.dataset={unl}", "task.label_free=true", f"eval.dataset={held}")
    error_line(res, 2, "config key 'task.label_free'", f"algorithm '{algo}'", "gold", "--algo om_grpo")
    assert no_run(tmp_path)
    with pytest.raises(ConfigError, match="'task.label_free'"):   # before any file is read
        load_config(pair="micro", algo=algo, overrides=["task.label_free=true"])


def test_evaluation_sets_carved_from_unlabelled_data_are_refused_naming_the_labelled_set(tmp_path, data):
    unl, held = data
    res = train(tmp_path, "om_grpo", f"task.dataset={unl}", "task.label_free=true")   # held-out: a tenth of it
    line = error_line(res, 2, "config key 'eval.dataset' is required", "unl.jsonl", "of its 4 prompts have no gold "
                      "answer", "give a labelled eval.dataset")
    assert "\n" not in line and no_run(tmp_path)

    def task(*overrides):
        return Task(load_config(pair="micro", algo="om_grpo",
                                overrides=[f"task.dataset={unl}", "task.label_free=true", *overrides]))

    # the validation slice of eval.select=val_avg too, with a labelled eval.dataset
    with pytest.raises(ConfigError, match=r"^config key 'eval.val_dataset' is required: the validation set .* "
                                          r"\d+ of its 10 prompts have no gold answer.*labelled eval.val_dataset$"):
        task(f"eval.dataset={held}", "eval.select=val_avg", "eval.val_size=10").check()
    dev = jsonl(tmp_path / "dev.jsonl", [{"problem": f"{a}+{b}", "answer": str(a + b)} for a, b in sums(12)[6:]])
    task(f"eval.dataset={held}", "eval.select=val_avg", f"eval.val_dataset={dev}").check()
    # a run that evaluates nothing needs no labelled set; its training set keeps the unlabelled rows
    free = task("run.eval_at_end=false").check()
    assert sum(p.gold is None for p in free.train_dataset) == 39
    # an evaluation set is read labelled whatever task.label_free says, and its error does not suggest the key
    with pytest.raises(ConfigError, match=r"^config key 'eval.dataset' .*unl\.jsonl:2: field 'answer' is missing "
                                          r".*an evaluation set needs a gold answer") as e:
        task(f"eval.dataset={unl}").check()
    assert "set task.label_free" not in str(e.value)
    with pytest.raises(ConfigError, match="'task.label_free'.*generates its problems"):   # no task.dataset: no rows
        Task(load_config(pair="micro", algo="om_grpo", overrides=["task.label_free=true"])).check()


def test_the_check_reads_the_learners_declaration_not_its_name(data):
    unl, _ = data

    class ConsensusConfig(LearnerConfig):
        label_free: ClassVar[bool] = True   # a plugin learner scoring its own groups, never reading gold

    @register_algo("test_label_free_consensus")
    class Consensus(Learner):
        Config = ConsensusConfig

    @register_algo("test_label_free_inherits")
    class Inherits(Learner):
        Config = LearnerConfig   # GRPO's section: rewards checked against gold

    sets = [f"task.dataset={unl}", "task.label_free=true", "run.eval_at_end=false"]
    cfg = load_config(pair="micro", algo="test_label_free_consensus", overrides=sets)
    assert cfg.task.label_free and type(cfg.algo).label_free
    assert sum(p.gold is None for p in Task(cfg).check().train_dataset) == 39
    with pytest.raises(ConfigError, match="'task.label_free': algorithm 'test_label_free_inherits'"):
        load_config(pair="micro", algo="test_label_free_inherits", overrides=sets)


def test_env_check_counts_label_free_rows_and_checks_the_labelled_ones(data):
    unl, _ = data
    res = CliRunner().invoke(main, ["env", "check", "graftzoo/MathReasoning-v0", "--kw", f"dataset={unl}",
                                    "--kw", "label_free=true"])
    assert res.exit_code == 0, res.output[-3000:] + repr(res.exception)
    assert "gymnasium check_env: ok" in res.output and "1/1 ok (39 label-free skipped)" in res.output
    res = CliRunner().invoke(main, ["env", "check", "graftzoo/MathReasoning-v0", "--kw", f"dataset={unl}"])
    error_line(res, 1, "unl.jsonl:2", "--kw label_free=true")
