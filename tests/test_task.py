"""The task of a run (graftzoo.envs.task): training env, stream vs finite, held-out and validation
splits (disjoint from training), benchmark loading; one home used by the trainer, OM-GRPO and eval."""
import json
import time

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import ConfigError, load_config
from graftzoo.training.eval_checkpoints import load_run_config
from graftzoo.training.trainer import Trainer
from graftzoo.training.learning.sampler import PromptSampler
from graftzoo.envs.arithmetic import is_heldout
from graftzoo.envs.datasets import load_dataset
from graftzoo.envs.env import ArithmeticEnv
from graftzoo.envs.task import DEFAULT_VAL_SIZE, HELDOUT, Task, load_benchmark


def arith(*overrides):
    return load_config(pair="micro", algo="grpo", overrides=list(overrides))


def from_file(*overrides):
    return arith("task.env=graftzoo/MathReasoning-v0", "task.dataset=math_train", *overrides)


def test_procedural_stream_and_finite():
    task = Task(arith())
    assert task.procedural and task.stream and task.train_dataset is None and task.dataset_id == "arithmetic"
    finite = Task(arith("task.size=20"))
    assert finite.procedural and not finite.stream and len(finite.train_dataset) == 20
    assert finite.dataset_id == "arithmetic" and finite.train_dataset.split == "train"
    file_task = Task(from_file())
    assert not file_task.procedural and not file_task.stream
    assert file_task.dataset_id == "math_train" and len(file_task.train_dataset) == len(load_dataset("math_train"))


def test_procedural_is_a_property_of_the_registered_env_not_of_its_name():
    class Drills(ArithmeticEnv):
        pass

    if "graftzoo-test/Drills-v0" not in gym.registry:
        gym.register(id="graftzoo-test/Drills-v0", entry_point=Drills, kwargs={"template": "compact"})
    task = Task(arith("task.env=graftzoo-test/Drills-v0"))
    assert task.procedural and task.stream and isinstance(task.train_env, Drills)


def test_env_settings_come_from_the_task_config():
    task = Task(arith("task.reward_wrong=-1.0", "task.verifier_timeout=3.0", "task.verifier_budget=12",
                      "eval.dataset=amc23"))
    for env in (task.train_env, task.heldout().env, task.benchmark("math500").env, task.validation().env):
        assert (env.reward_correct, env.reward_wrong, env.verifier_timeout, env.verifier_budget) == (1.0, -1.0, 3.0, 12)


def test_procedural_splits_are_disjoint_from_training():
    task = Task(arith("task.size=300", "eval.size=50", "eval.val_size=40"))
    train = {p.text for p in task.train_dataset}
    held, val = task.heldout(), task.validation()
    assert len(held.prompts) == 50 and held.name == HELDOUT and held.split == "test"
    assert len(val.prompts) == 40 and val.name == "val" and val.split == "val" and not task.is_test_set(val)
    assert not train & {p.text for p in held.prompts} and not train & {p.text for p in val.prompts}
    assert all(is_heldout(p.text) for p in held.prompts + val.prompts)
    assert task.is_test_set(held) and task.reserved_ids == set()
    # a stream draws from the same train partition
    stream = PromptSampler(arith(), None, stream=Task(arith()).train_env.generate).batch(0)[0]
    assert not any(is_heldout(p.text) for p in stream)


def test_file_validation_slice_is_left_out_of_training():
    cfg = from_file("eval.select=val_avg", "eval.val_size=16", "eval.dataset=math500")
    task = Task(cfg)
    ids = task.validation_ids()
    assert len(ids) == 16 and task.reserved_ids == ids
    val = task.validation()
    assert {p.id for p in val.prompts} == ids and val.split == "val" and not task.is_test_set(val)
    sampler = PromptSampler(cfg, task.train_dataset, task.reserved_ids)
    assert not ids & {p.id for p in sampler.dataset} and len(sampler.dataset) == len(task.train_dataset) - 16
    held = task.heldout()
    assert held.dataset == "math500" and len(held.prompts) == cfg.eval.size
    assert not {p.id for p in held.prompts} & {p.id for p in task.train_dataset}
    # only val_avg selection reserves the slice; a separate validation set reserves nothing
    assert Task(from_file("eval.val_size=16", "eval.dataset=math500")).reserved_ids == set()
    assert Task(from_file("eval.select=val_avg", "eval.val_dataset=amc23")).validation_ids() == set()
    assert len(Task(from_file()).validation_ids()) == DEFAULT_VAL_SIZE


def test_heldout_of_a_dataset_task():
    gsm = Task(arith("task.env=graftzoo/MathReasoning-v0", "task.dataset=gsm8k", "eval.size=7"))
    held = gsm.heldout()
    assert held.dataset == "gsm8k_test" and len(held.prompts) == 7
    assert not {p.id for p in held.prompts} & {p.id for p in gsm.train_dataset}
    # math_train has no test split: the held-out split is a slice of it (eval.size prompts, at most a tenth),
    # which training leaves out
    task = Task(from_file("eval.size=30"))
    held = task.heldout()
    assert held.name == HELDOUT and held.dataset == "math_train" and held.split == "test" and len(held.prompts) == 30
    ids = {p.id for p in held.prompts}
    assert ids <= {p.id for p in task.train_dataset} and task.reserved_ids == ids and task.is_test_set(held)
    sampler = PromptSampler(task.cfg, task.train_dataset, task.reserved_ids)
    assert not ids & {p.id for p in sampler.dataset} and len(sampler.dataset) == len(task.train_dataset) - 30
    smaller = {p.id for p in Task(from_file("eval.size=10")).heldout().prompts}
    assert smaller < ids                                                     # a smaller eval.size takes a subset
    assert len(Task(from_file("eval.size=null")).heldout().prompts) == 750   # at most a tenth of the 7500
    assert gsm.reserved_ids == set()                                         # a test split reserves nothing


def test_benchmark_loading():
    task = Task(arith("eval.size=6"))
    b = load_benchmark("amc23", task, limit=3)
    full = load_dataset("amc23")
    assert (b.name, b.dataset, b.split, b.hash) == ("amc23", "amc23", "test", full.hash)
    assert [p.id for p in b.prompts] == [p.id for p in full][:3] and task.is_test_set(b)
    assert len(load_benchmark("amc23").prompts) == len(full)            # no task: default rewards
    held = load_benchmark(HELDOUT, task, limit=4)
    assert [p.id for p in held.prompts] == [p.id for p in task.heldout().prompts][:4]
    with pytest.raises(ValueError, match="heldout"):
        load_benchmark(HELDOUT)


def ttt_heldout(cfg, run_dir):
    """The held-out prompts an OM-GRPO learner's test-time training reads through the trainer's step context, and
    the ids of one pass of its ``ttt_prompts`` over them."""
    tr = Trainer(cfg, run_dir=str(run_dir))
    try:
        m = next(iter(tr.learners))
        ctx = tr.context(0, 0, m, 0)
        held = list(ctx.heldout())
        return [p.id for p in held], [p.id for p in tr.learners[m].ttt_prompts(ctx, len(held))]
    finally:
        tr.close()


def test_om_grpo_test_time_training_uses_the_task_heldout_split(tmp_path):
    def om(*overrides):
        return load_config(pair="micro", algo="om_grpo", overrides=[
            "run.track=false", "run.progress=false", "algo.ttt=true", *overrides])

    cfg = om("eval.size=5")
    held, ttt = ttt_heldout(cfg, tmp_path / "a")
    assert held == [p.id for p in Task(cfg).heldout().prompts] and sorted(ttt) == sorted(held)
    cfg = om("eval.dataset=arithmetic", "eval.size=3")  # prompts that fit the micro models (never cut)
    held, ttt = ttt_heldout(cfg, tmp_path / "b")
    assert held == [p.id for p in load_dataset("arithmetic")][:3] and sorted(ttt) == sorted(held)


# ------------------------------------------------------------------------------------------------
# Task.check: everything the run loads that needs files but no model, before any model is built
# ------------------------------------------------------------------------------------------------

def jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def rows(n, start=0):
    return [{"id": f"q{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(start, start + n)]


def test_check_returns_the_task_and_keeps_what_it_loaded():
    task = Task(arith())
    assert task.check() is task and "train_env" in task.__dict__ and "_heldout" in task.__dict__
    file_task = Task(from_file("eval.dataset=amc23", "eval.benchmarks=all", "eval.select=val_avg")).check()
    assert file_task.train_env.dataset.name == "math_train" and file_task.heldout().dataset == "amc23"


def test_a_user_file_is_a_training_set_without_extra_keys(tmp_path):
    train, held = jsonl(tmp_path / "mine.jsonl", rows(40)), jsonl(tmp_path / "held.jsonl", rows(5, 100))
    cfg = arith("task.env=graftzoo/MathReasoning-v0", f"task.dataset={train}", f"eval.dataset={held}")
    assert cfg.task.split == "train"                      # the default: the file itself
    task = Task(cfg).check()
    assert len(task.train_dataset) == 40 and task.dataset_id == "mine" and len(task.heldout().prompts) == 5
    assert PromptSampler(cfg, task.train_dataset).batch(0)[0][0].id.startswith("mine/")
    assert Task(arith("task.env=graftzoo/MathReasoning-v0", f"task.dataset={train}", "task.split=null",
                      f"eval.dataset={held}")).check().train_dataset.hash == task.train_dataset.hash
    # no task.env (auto: a dataset is read), no eval.dataset: the held-out split is a tenth of the file, left out
    cfg = arith(f"task.dataset={train}")
    assert cfg.task.env == "graftzoo/MathReasoning-v0"
    task = Task(cfg).check()
    held = {p.id for p in task.heldout().prompts}
    assert len(held) == 4 and task.reserved_ids == held                 # min(eval.size=8, 40 // 10)
    assert not held & {p.id for p in PromptSampler(cfg, task.train_dataset, task.reserved_ids).dataset}
    with pytest.raises(ConfigError, match="config key 'eval.dataset' is required: .*'tiny' has no test split, and "
                                          "its 9 prompts are too few"):
        Task(arith(f"task.dataset={jsonl(tmp_path / 'tiny.jsonl', rows(9))}")).check()


@pytest.mark.parametrize("key", ["task.dataset", "eval.dataset", "eval.benchmarks", "eval.val_dataset"])
def test_a_broken_file_is_one_line_naming_the_key_file_and_line(tmp_path, key):
    bad = jsonl(tmp_path / "broken.jsonl", rows(3) + ["{not json"])
    good = jsonl(tmp_path / "good.jsonl", rows(8))
    over = {"task.dataset": [f"task.dataset={bad}", f"eval.dataset={good}"],
            "eval.dataset": [f"task.dataset={good}", f"eval.dataset={bad}"],
            "eval.benchmarks": [f"task.dataset={good}", f"eval.dataset={good}", f"eval.benchmarks=[amc23, {bad}]"],
            "eval.val_dataset": [f"task.dataset={good}", f"eval.dataset={good}", "eval.select=val_avg",
                                 f"eval.val_dataset={bad}"]}[key]
    task = Task(arith("task.env=graftzoo/MathReasoning-v0", *over))
    with pytest.raises(ConfigError) as e:
        task.check()
    msg = str(e.value)
    assert msg.startswith(f"config key '{key}'") and "broken.jsonl:4: invalid JSON" in msg and "\n" not in msg


@pytest.mark.parametrize("overrides,match", [
    (["run.epochs=2"], "'run.epochs' needs a finite training set"),
    (["task.env=nope/Nothing-v0"], "'task.env'"),
    (["task.mix={fizz: 1}"], "'task.mix'.*'fizz' is not a skill"),
    (["pair.template=fancy"], "'pair.template' must be a prompt template"),
    (["task.env=graftzoo/MathReasoning-v0"], "'task.dataset' is required"),
    (["task.env=graftzoo/MathReasoning-v0", "task.dataset=math500"], "'task.split' \\('train'\\).*only the 'test'"),
    (["task.env=graftzoo/MathReasoning-v0", "task.dataset=no/such.jsonl", "eval.dataset=amc23"],
     "'task.dataset'.*no such file"),
    (["task.env=graftzoo/Arithmetic-v0", "task.dataset=math_train"],
     "'task.dataset' \\('math_train'\\) is set, but task.env=graftzoo/Arithmetic-v0 generates its problems"),
    (["eval.dataset=math5000"], "'eval.dataset'.*unknown dataset 'math5000'"),
    (["eval.benchmarks=[amc23, nope]"], "'eval.benchmarks' \\('nope'\\)"),
    (["eval.select=val_avg", "eval.val_dataset=amc23"], "'eval.val_dataset'.*test set"),
    (["task.env=graftzoo/MathReasoning-v0", "task.dataset=amc23", "task.split=null", "eval.dataset=aime24",
      "eval.select=val_avg", "eval.val_size=40"], "'eval.val_size' \\(40\\)"),
])
def test_check_rejects_in_one_line_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        Task(arith(*overrides)).check()
    assert "\n" not in str(e.value)


def test_check_loads_only_what_the_run_uses(tmp_path):
    # no evaluation during the run and no eval.dataset: a file too small for a held-out slice is fine
    small = jsonl(tmp_path / "small.jsonl", rows(9))
    Task(arith(f"task.dataset={small}", "run.eval_at_end=false")).check()
    with pytest.raises(ConfigError, match="'eval.dataset' is required"):   # unless an evaluation needs it
        Task(arith(f"task.dataset={small}", "run.eval_at_end=false", "run.eval_every=5")).check()
    with pytest.raises(ConfigError, match="'eval.dataset' is required"):   # or test-time training reads it
        Task(load_config(pair="micro", algo="om_grpo", overrides=[
            f"task.dataset={small}", "run.eval_at_end=false", "algo.ttt=true"])).check()
    Task(arith("task.size=40", "run.epochs=2")).check()                   # a finite procedural set has epochs
    Task(arith("eval.select=val_avg", "eval.val_dataset=amc23", "eval.allow_test_selection=true")).check()


def test_check_is_fast_on_the_default_task():
    t0 = time.perf_counter()
    Task(arith()).check()
    assert time.perf_counter() - t0 < 10


# ------------------------------------------------------------------------------------------------
# bring your own data: task.env auto, task.fields, held-out and validation slices
# ------------------------------------------------------------------------------------------------

def test_task_env_auto_follows_task_dataset():
    assert load_config(pair="micro", algo="grpo").task.env == "graftzoo/Arithmetic-v0"
    assert arith("task.dataset=math500", "task.split=test").task.env == "graftzoo/MathReasoning-v0"
    assert arith("task.env=auto").task.env == "graftzoo/Arithmetic-v0"       # stored resolved: resumes match
    assert arith("task.env=graftzoo/MathReasoning-v0", "task.dataset=amc23").task.env == \
        "graftzoo/MathReasoning-v0"


def test_task_fields_map_the_run_own_files(tmp_path):
    mine = [{"uid": f"u{i}", "q": f"{i}+2", "sol": {"final": str(i + 2)}} for i in range(30)]
    train, held = jsonl(tmp_path / "mine.jsonl", mine), jsonl(tmp_path / "held.jsonl", mine[:3])
    fields = ["task.fields.problem=q", "task.fields.answer=sol.final", "task.fields.id=uid"]
    task = Task(arith(f"task.dataset={train}", f"eval.dataset={held}", *fields)).check()
    assert [(p.id, p.text, p.gold) for p in task.train_dataset][:2] == [("mine/u0", "0+2", "2"), ("mine/u1", "1+2", "3")]
    assert [p.gold for p in task.heldout().prompts] == ["2", "3", "4"]                    # eval.dataset: same fields
    dev = jsonl(tmp_path / "dev.jsonl", mine[3:5])
    val = Task(arith(f"task.dataset={train}", f"eval.dataset={held}", "eval.select=val_avg", f"eval.val_dataset={dev}",
                     *fields)).check().validation()
    assert [p.id for p in val.prompts] == ["dev/u3", "dev/u4"]
    # a bundled eval.dataset keeps its own fields; whole-mapping overrides work too
    task = Task(arith(f"task.dataset={train}", "eval.dataset=amc23", "task.fields={problem: q, answer: sol.final}"))
    assert task.check().heldout().dataset == "amc23" and task.train_dataset[0].id == "mine/0"
    with pytest.raises(ConfigError, match=r"^config key 'task.dataset' .*mine\.jsonl:1: field 'problem' is missing"):
        Task(arith(f"task.dataset={train}", "eval.dataset=amc23")).check()
    with pytest.raises(ConfigError, match=r"mine\.jsonl:1: field 'sol.answer' is missing"):
        Task(arith(f"task.dataset={train}", "task.fields.problem=q", "task.fields.answer=sol.answer")).check()


def test_heldout_and_validation_slices_of_a_file_are_disjoint(tmp_path):
    train = jsonl(tmp_path / "mine.jsonl", rows(100))
    cfg = arith(f"task.dataset={train}", "eval.size=10", "eval.select=val_avg", "eval.val_size=20")
    task = Task(cfg).check()
    held, val = {p.id for p in task.heldout().prompts}, {p.id for p in task.validation().prompts}
    assert len(held) == 10 and len(val) == 20 and not held & val and task.reserved_ids == held | val
    sampler = PromptSampler(cfg, task.train_dataset, task.reserved_ids)
    assert len(sampler.dataset) == 70 and not (held | val) & {p.id for p in sampler.dataset}
    assert not task.is_test_set(task.validation())


# ------------------------------------------------------------------------------------------------
# the real call path: `graftzoo train` on the micro pair with the user's own data, no other key
# ------------------------------------------------------------------------------------------------

def sums(n=30):
    """Problems the micro models' tokenizers can encode (digits and + only)."""
    return [(a, b) for a, b in ((3 * i % 17 + 1, 5 * i % 13 + 2) for i in range(n))]


def train_cli(tmp_path, *sets):
    args = ["train", "--algo", "grpo", "--pair", "micro", "--no-track", "--set", f"run.out_dir={tmp_path / 'runs'}",
            "--set", "run.name=byod", "--set", "run.steps=1", "--set", "run.save_every=0", "--set", "rollout.n=2",
            "--set", "task.prompts_per_step=2", "--set", "eval.k=1"]
    for s in sets:
        args += ["--set", s]
    return CliRunner().invoke(main, args)


def trained(tmp_path, res, dataset, n_held):
    assert res.exit_code == 0, res.output[-3000:]
    run = tmp_path / "runs" / "byod"
    raw = yaml.safe_load((run / "config.yaml").read_text())
    assert raw["task"]["env"] == "graftzoo/MathReasoning-v0" and raw["eval"]["dataset"] is None
    held = Task(load_run_config(run)).heldout()
    assert held.dataset == dataset and len(held.prompts) == n_held
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {m["model"] for m in metrics if "reward/mean" in m} == {"micro-qwen-char", "micro-gpt2-pair"}
    return metrics


def test_train_on_a_jsonl_with_custom_fields(tmp_path):
    path = jsonl(tmp_path / "drill.jsonl", [{"key": f"d{i}", "ask": f"{a}+{b}", "res": {"val": a + b}}
                                             for i, (a, b) in enumerate(sums())])
    res = train_cli(tmp_path, f"task.dataset={path}", "task.fields={problem: ask, answer: res.val, id: key}")
    trained(tmp_path, res, "drill", 3)


def test_train_on_a_datasets_folder(tmp_path):
    import datasets
    pairs = sums()
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"question": [f"{a}+{b}" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]})}).save_to_disk(
        str(tmp_path / "drills"))
    trained(tmp_path, train_cli(tmp_path, f"task.dataset={tmp_path / 'drills'}"), "drills", 3)


def test_train_on_a_verl_parquet(tmp_path):
    pq.write_table(pa.Table.from_pylist([{
        "data_source": "drills", "prompt": [{"role": "user", "content": f"{a}+{b}"}], "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)}, "extra_info": {"index": i}}
        for i, (a, b) in enumerate(sums())]), tmp_path / "verl.parquet")
    trained(tmp_path, train_cli(tmp_path, f"task.dataset={tmp_path / 'verl.parquet'}"), "verl", 3)


def test_a_bad_row_stops_train_before_any_model_in_one_line(tmp_path):
    bad = tmp_path / "BAD.jsonl"
    bad.write_text('{"question": "1+2", "answer": "3"}\n{"question": "2+2", "answer": "4"}\n{"question": "3+4"}\n')
    res = train_cli(tmp_path, "task.env=graftzoo/MathReasoning-v0", f"task.dataset={bad}")
    errors = [x for x in res.output.splitlines() if x.startswith("Error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "Traceback" not in res.output, res.output[-3000:]
    assert "config key 'task.dataset'" in errors[0] and "BAD.jsonl:3: field 'answer' is missing" in errors[0]
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.rglob("*"))   # no run directory with anything in it
