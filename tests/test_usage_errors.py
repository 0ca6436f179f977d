"""A user's mistakes, through the command line as a user types it: each is one ``Error:`` line, usage and config
errors exit 2, an unknown name gets the closest known ones (keys, pairs, algorithms and presets, grid pairs,
benchmarks, models), a pair given as a path is that path, the fix an error suggests is a command that works (each
is run here), and a start refused while the models are built leaves no run folder behind.
"""
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from graftzoo.contract.config import load_config, packaged_configs
from graftzoo.contract.errors import ConfigError
from graftzoo.training.planner.build import usable_device
from graftzoo.training.trainer import train
from helpers import cli_here, one_line_error

SUGGESTION = re.compile(r"did you mean '([^']+)'")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 1-step micro run (its checkpoint, config.yaml): what eval and resume are tried on."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "run.track=false", "run.eval_at_end=false", "run.progress=false", "run.steps=1", "run.save_every=1"])
    return Path(train(cfg, run_dir=str(tmp_path_factory.mktemp("usage") / "x")))


def train_args(out, *sets, name="x"):
    args = ["train", "--algo", "grpo", "--pair", "micro", "--no-track", "--set", f"run.out_dir={out}",
            "--set", f"run.name={name}", "--set", "run.eval_at_end=false", "--set", "run.progress=false",
            "--set", "run.steps=1"]
    for s in sets:
        args += ["--set", s]
    return args


# ------------------------------------------------------------------------------------------------
# did you mean
# ------------------------------------------------------------------------------------------------

TYPOS = [  # (command with a typo, the typo, what it should have been)
    (["config", "show", "micro", "--set", "optim.lrr=1e-5"], "optim.lrr", "optim.lr"),
    (["config", "show", "micro", "--set", "rollout.vllm.enforce_eagr=true"], "rollout.vllm.enforce_eagr",
     "rollout.vllm.enforce_eager"),
    (["config", "show", "micro", "--set", "optimm.lr=1e-5"], "optimm", "optim"),
    (["config", "show", "micro", "--set", "algo.betta_kl=0.1"], "algo.betta_kl", "algo.beta_kl"),
    (["config", "show", "micro", "--set", "task.verifier.strictt=false"], "task.verifier.strictt",
     "task.verifier.strict"),
    (["config", "show", "tinyy"], "tinyy", "tiny"),
    (["config", "show", "micro", "--algo", "grpo_n88"], "grpo_n88", "grpo_n8"),
    (["config", "show", "micro", "--algo", "dr_grpoo"], "dr_grpoo", "dr_grpo"),
]


@pytest.mark.parametrize("args,typo,meant", TYPOS, ids=[t[1] for t in TYPOS])
def test_a_mistyped_name_gets_the_closest_and_the_closest_works(args, typo, meant):
    res = cli_here(*args)
    line = one_line_error(res, 2, typo)
    assert meant in SUGGESTION.findall(line), line
    fixed = [a.replace(typo, meant) for a in args]
    again = cli_here(*fixed)
    assert again.returncode == 0, (fixed, again.stderr)


def test_a_grid_with_a_mistyped_pair_or_key_is_one_line_exit_2(tmp_path):
    (tmp_path / "g.yaml").write_text("name: g\npairs: [micrro]\nalgorithms: [grpo]\n")
    line = one_line_error(cli_here("grid", tmp_path / "g.yaml", "--dry-run"), 2, "'micrro'")
    assert SUGGESTION.findall(line) == ["micro"], line
    (tmp_path / "g.yaml").write_text("name: g\npairs: [micro]\nalgorithms: [grpo]\nseed: [0]\n")
    line = one_line_error(cli_here("grid", tmp_path / "g.yaml", "--dry-run"), 2, "unknown key", "'seed'")
    assert "seeds" in line
    (tmp_path / "g.yaml").write_text("name: g\npairs: [micro]\nalgorithms: [grpo]\nseeds: [0]\n")
    assert cli_here("grid", tmp_path / "g.yaml", "--dry-run", "--out", tmp_path / "out").returncode == 0


def test_env_check_of_a_mistyped_env_id_is_one_line_exit_2():
    line = one_line_error(cli_here("env", "check", "graftzoo/MathReasonin-v0"), 2, "graftzoo/MathReasonin-v0")
    assert "MathReasoning" in line


# ------------------------------------------------------------------------------------------------
# a pair given as a path
# ------------------------------------------------------------------------------------------------

def test_a_pair_given_as_a_path_is_used_as_that_path(tmp_path):
    missing = cli_here("config", "show", "my_pairr.yaml", cwd=tmp_path)
    line = one_line_error(missing, 2, "my_pairr.yaml: no such file")
    assert ".yaml.yaml" not in line
    (tmp_path / "sub").mkdir()
    mine = yaml.safe_load((packaged_configs() / "pairs" / "micro.yaml").read_text())
    mine.pop("name")
    mine["rollout"]["n"] = 6
    (tmp_path / "sub" / "mine.yaml").write_text(yaml.safe_dump(mine))
    for given in ("sub/mine.yaml", "./sub/mine.yaml", str(tmp_path / "sub" / "mine.yaml")):
        res = cli_here("config", "show", given, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        shown = yaml.safe_load(res.stdout)
        assert shown["pair"]["name"] == "mine" and shown["rollout"]["n"] == 6
    one_line_error(cli_here("config", "show", "sub/nope.yaml", cwd=tmp_path), 2, "sub/nope.yaml: no such file")
    # train reads it too: the run is refused for the bad key, after the pair file was read
    one_line_error(cli_here("train", "--pair", "sub/mine.yaml", "--algo", "grpo", "--set", "optim.lrr=1", cwd=tmp_path),
                   2, "optim.lrr")


# ------------------------------------------------------------------------------------------------
# eval: an unknown benchmark or model is a usage error, named before any model is built
# ------------------------------------------------------------------------------------------------

def test_eval_names_an_unknown_benchmark_or_model_and_its_closest(run, tmp_path):
    out = tmp_path / "ev"
    line = one_line_error(cli_here("eval", "--ckpt", run, "--benchmarks", "math5000", "--out", out), 2, "math5000")
    assert "math500" in SUGGESTION.findall(line), line
    line = one_line_error(cli_here("eval", "--ckpt", run, "--model", "micro-qwen-chr", "--out", out), 2,
                          "micro-qwen-chr")
    assert SUGGESTION.findall(line) == ["micro-qwen-char"], line
    one_line_error(cli_here("eval", "--ckpt", run, "--out", run / "eval"), 2, "--out")
    assert not out.exists()  # nothing was written
    ok = cli_here("eval", "--ckpt", run, "--benchmarks", "arithmetic", "--limit", "1", "--k", "1", "--no-greedy",
                  "--max-new-tokens", "4", "--model", "micro-qwen-char", "--out", out)
    assert ok.returncode == 0, ok.stderr
    assert (out / "micro-qwen-char.json").is_file()


# ------------------------------------------------------------------------------------------------
# the fixes errors suggest are commands that work
# ------------------------------------------------------------------------------------------------

def test_the_suggested_allow_config_change_resumes(run, tmp_path):
    shutil.copytree(run, tmp_path / "x", ignore=shutil.ignore_patterns(".lock"))
    changed = train_args(tmp_path, "task.prompts_per_step=3", "optim.lr=3e-5", "run.steps=2")  # one more step
    line = one_line_error(cli_here(*changed), 2, "resuming with a changed config", "task.prompts_per_step",
                          "optim.lr")
    fix = re.search(r"pass (--allow-config-change \S+)", line).group(1).split()
    res = cli_here(*changed, *fix)
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load((tmp_path / "x" / "config.yaml").read_text())["task"]["prompts_per_step"] == 3
    assert res.stdout.startswith("done: 2 of 2 steps"), res.stdout


def test_the_suggested_overwrite_starts_over_and_keeps_the_old_run(run, tmp_path):
    shutil.copytree(run, tmp_path / "x", ignore=shutil.ignore_patterns(".lock"))
    args = [*train_args(tmp_path), "--no-resume"]
    line = one_line_error(cli_here(*args), 2, "holds a run")
    assert "pass --overwrite" in line
    res = cli_here(*args, "--overwrite")
    assert res.returncode == 0, res.stderr
    assert [p.name.split(".replaced-")[0] for p in tmp_path.glob("x.replaced-*")] == ["x"]


def test_the_suggested_peer_option_works():
    line = one_line_error(cli_here("config", "show", "micro", "--algo", "graft"), 2, "needs a peer source")
    assert "--peer online" in line.replace("online|", "online ")
    assert cli_here("config", "show", "micro", "--algo", "graft", "--peer", "online").returncode == 0


def test_a_store_of_other_runs_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(cli_here(*train_args(tmp_path / "runs"), "--peer", f"stored:{tmp_path / 'empty'}"), 2,
                   "no trajectory store here")
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------------
# a start refused while the models are built leaves nothing behind
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_start_refused_by_the_engine_exits_2_and_leaves_no_run_folder(tmp_path):
    pair = {"name": "h24", "models": [{"id": "h24", "kind": "tiny", "family": "gpt2", "tokenizer": "digit_pair",
                                       "hidden": 96, "layers": 1, "heads": 4, "ffn": 64, "warmup": {"steps": 0}}]}
    (tmp_path / "h24.yaml").write_text(yaml.safe_dump(pair))
    out = tmp_path / "runs" / "deep"
    res = cli_here("train", "--pair", tmp_path / "h24.yaml", "--algo", "grpo", "--no-track",
                   "--set", f"run.out_dir={out}", "--set", "rollout.engine=vllm", "--set", "run.steps=1")
    one_line_error(res, 2, "model 'h24': head size 24", "rollout.engine=hf")
    assert not (tmp_path / "runs").exists(), sorted(tmp_path.rglob("*"))


# ------------------------------------------------------------------------------------------------
# a device or dtype torch would refuse: one line naming the key, before anything is built
# ------------------------------------------------------------------------------------------------

GPUS = torch.cuda.device_count()
FORMS = "must be auto, cpu, cuda or cuda:N"
MISSING = "but this machine has"


@pytest.mark.parametrize("value, why", [
    ("gpu", FORMS), ("cuda:x", FORMS), ("''", FORMS), ("mps", FORMS), ("cuda:-1", FORMS), ("CUDA", FORMS),
    ("cpu:0", FORMS), ("cuda:0,1", FORMS), ("3", "must be a string"),
    (f"cuda:{GPUS}", MISSING),  # one past this machine's last GPU
    *([("cuda", MISSING), ("cuda:0", MISSING)] if GPUS == 0 else [])])
def test_a_device_this_machine_cannot_use_is_one_line_exit_2_and_no_run_folder(tmp_path, value, why):
    out = tmp_path / "runs"
    res = cli_here(*train_args(out, f"run.device={value}"))
    line = one_line_error(res, 2, "config key 'run.device'", why)
    if why == MISSING:
        assert ("use auto or cpu" if GPUS == 0 else f"{GPUS} GPU") in line, line
    assert not out.exists(), sorted(tmp_path.rglob("*"))


@pytest.mark.parametrize("key, value, why", [
    ("device", "tpu", FORMS), ("device", f"cuda:{GPUS}", MISSING), ("dtype", "bf16", "must be one of float32, "
                                                                              "bfloat16, float16")])
def test_a_models_own_device_or_dtype_is_checked_as_run_device_is(tmp_path, key, value, why):
    """A pair file's model entry: its ``device`` (checked as run.device is, named by the entry's key) and its
    ``dtype`` (the torch dtype its weights load in)."""
    pair = yaml.safe_load((packaged_configs() / "pairs" / "micro.yaml").read_text())
    pair["models"][1][key] = value
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pair))
    out = tmp_path / "runs"
    res = cli_here("train", "--pair", tmp_path / "p.yaml", "--algo", "grpo", "--no-track", "--set",
                   f"run.out_dir={out}", "--set", "run.steps=1", "--set", "run.eval_at_end=false")
    one_line_error(res, 2, f"config key 'pair.models[{pair['models'][1]['id']}].{key}'", why)
    assert not out.exists(), sorted(tmp_path.rglob("*"))


def test_a_private_ray_cluster_is_this_machine_so_its_gpus_are_checked_before_ray_starts(tmp_path):
    out = tmp_path / "runs"
    res = cli_here(*train_args(out, f"run.device=cuda:{GPUS}", "run.backend=ray"))
    one_line_error(res, 2, f"config key 'run.device' is 'cuda:{GPUS}', but this machine has")
    assert not out.exists(), sorted(tmp_path.rglob("*"))


def test_a_device_on_the_python_path_is_checked_too():
    """``load_config`` (what a researcher calls from Python) refuses the same values, with the same line."""
    with pytest.raises(ConfigError, match=r"config key 'run.device' must be auto, cpu, cuda or cuda:N"):
        load_config(pair="micro", algo="grpo", overrides=["run.device=gpu"])
    with pytest.raises(ConfigError, match=rf"config key 'run.device' is 'cuda:{GPUS}', but this machine has"):
        usable_device(f"cuda:{GPUS}", "run.device")
    assert usable_device("cpu", "run.device") == "cpu" and usable_device("auto", "run.device") in ("cpu", "cuda")
