"""Plugins: a tiny package installed with pip (entry-point group graftzoo.algos), then used through the CLI."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from helpers import one_run

from graftzoo.contract.types import Group, Rollout
from graftzoo.peers import TrajectoryStore

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

PLUGIN = '''
from graftzoo import Learner, LearnerConfig, register_estimator
from graftzoo.algos.advantages import get_estimator


class HalfAdvConfig(LearnerConfig):
    scale: float = 0.5


@register_estimator("scaled_grpo")
def scaled_grpo(x, cfg):
    """GRPO's group advantage times algo.scale."""
    return get_estimator("grpo")(x, cfg) * cfg.scale


class HalfAdv(Learner):
    """GRPO with scaled advantages: a registered estimator and a metric."""
    Config = HalfAdvConfig
    estimator = "scaled_grpo"

    def advantages(self, ctx, groups):
        ctx.log("plugin/scale", self.cfg.scale)
        return super().advantages(ctx, groups)
'''


def _install(tmp_path, name, entry_points, body):
    src = tmp_path / f"src_{name}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(body)
    eps = ", ".join(f'"{e}"' for e in entry_points)
    (src / "setup.py").write_text(textwrap.dedent(f'''
        from setuptools import setup
        setup(name="{name.replace("_", "-")}", version="0.1", packages=["{name}"],
              entry_points={{"graftzoo.algos": [{eps}]}})
    '''))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True)
    return site


def _cli(site, *args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", *args], env=env, capture_output=True, text=True,
                          cwd=cwd)


def test_installed_plugin_trains_through_the_cli(tmp_path):
    site = _install(tmp_path, "gz_halfadv", ["half_adv = gz_halfadv:HalfAdv"], PLUGIN)
    out = _cli(site, "algos", "list")
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("half_adv"))
    assert "plugin:gz-halfadv" in line and "gz_halfadv" in line
    run = _cli(site, "train", "--algo", "half_adv", "--pair", "micro", "--no-track", "--set", f"run.out_dir={tmp_path}",
               "--set", "run.steps=1", "--set", "run.eval_at_end=false", "--set", "algo.scale=0.25",
               "--set", "pair.train=[micro-qwen-char]")
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = (one_run(tmp_path, "half_adv-micro-qwen-char-micro-*-s0") / "metrics.jsonl").read_text()  # algo.scale: a hash
    assert '"plugin/scale": 0.25' in metrics
    bad_key = _cli(site, "train", "--algo", "half_adv", "--pair", "micro", "--set", "algo.scal=1")
    assert bad_key.returncode != 0 and "algo.scal" in bad_key.stderr


def test_broken_plugin_is_reported_by_name_and_clash_is_an_error(tmp_path):
    site = _install(tmp_path, "gz_broken", ["broken_algo = gz_broken:Nope"], "raise ImportError('missing dep xyz')\n")
    out = _cli(site, "algos", "list")
    assert out.returncode == 1
    assert "broken_algo" in out.stderr and "missing dep xyz" in out.stderr
    assert "grpo" in out.stdout  # the others are still listed
    run = _cli(site, "train", "--algo", "broken_algo", "--pair", "micro")
    assert run.returncode != 0 and "broken_algo" in run.stderr and "failed to import" in run.stderr

    site2 = _install(tmp_path / "clash", "gz_clash", ["grpo = gz_clash:HalfAdv"], PLUGIN)
    out = _cli(site2, "algos", "list")
    assert out.returncode != 0 and "clash" in out.stderr and "grpo" in out.stderr


# the same learner as a local file: registered by its own decorator instead of an entry point
LOCAL_PLUGIN = PLUGIN.replace("register_estimator\n", "register_estimator, register_algo\n", 1).replace(
    "class HalfAdv(Learner):", '@register_algo("my_algo")\nclass HalfAdv(Learner):', 1)
TRAIN = ["train", "--algo", "my_algo", "--pair", "micro", "--no-track", "--set", "run.out_dir=out", "--set",
         "run.steps=1", "--set", "run.eval_at_end=false", "--set", "algo.scale=0.25", "--set",
         "pair.train=[micro-qwen-char]"]


def _local(tmp_path, *args, plugins=None):
    env = {k: v for k, v in os.environ.items() if k != "GRAFTZOO_PLUGINS"}
    if plugins is not None:
        env["GRAFTZOO_PLUGINS"] = plugins
    return subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", *args], env=env, capture_output=True, text=True,
                          cwd=tmp_path)


def _scale(tmp_path):
    return (one_run(tmp_path / "out", "my_algo-micro-qwen-char-micro-*-s0") / "metrics.jsonl").read_text()


def test_plugin_file_trains_through_the_cli(tmp_path):
    """--plugin FILE.py: the learner of a local file, in train (and config show, algos list), no package needed."""
    (tmp_path / "algos_here").mkdir()
    (tmp_path / "algos_here" / "my_algo.py").write_text(LOCAL_PLUGIN)
    run = _local(tmp_path, *TRAIN, "--plugin", "algos_here/my_algo.py")
    assert run.returncode == 0, run.stderr[-2000:]
    assert '"plugin/scale": 0.25' in _scale(tmp_path)
    shown = _local(tmp_path, "config", "show", "micro", "--algo", "my_algo", "--plugin", "algos_here/my_algo.py")
    assert shown.returncode == 0 and "scale: 0.5" in shown.stdout, shown.stderr[-2000:]
    listed = _local(tmp_path, "algos", "list", "--plugin", "algos_here/my_algo.py")
    line = next(x for x in listed.stdout.splitlines() if x.startswith("my_algo"))
    assert line.split()[1] == "plugin:my_algo.py", line
    unknown = _local(tmp_path, *TRAIN)  # without the plugin the algorithm is unknown, as before
    assert unknown.returncode == 2 and "unknown algorithm or preset 'my_algo'" in unknown.stderr


def test_plugins_from_the_environment_a_module_or_a_file(tmp_path):
    """GRAFTZOO_PLUGINS=a,b: modules (found from the current directory) or files, for every command."""
    (tmp_path / "my_algo_mod.py").write_text(LOCAL_PLUGIN)
    run = _local(tmp_path, *TRAIN, plugins="my_algo_mod")
    assert run.returncode == 0, run.stderr[-2000:]
    assert '"plugin/scale": 0.25' in _scale(tmp_path)
    shown = _local(tmp_path, "config", "show", "micro", "--algo", "my_algo", plugins=f" {tmp_path / 'my_algo_mod.py'} ,")
    assert shown.returncode == 0 and "scale: 0.5" in shown.stdout, shown.stderr[-2000:]


def test_a_plugin_that_fails_to_import_is_one_error_line(tmp_path):
    (tmp_path / "broken.py").write_text("import numpy\nraise ImportError('missing dep xyz')\n")
    for args, env, culprit, why in [
        (["train", "--algo", "grpo", "--pair", "micro", "--plugin", "broken.py"], None, "broken.py",
         "ImportError: missing dep xyz"),
        (["train", "--algo", "grpo", "--pair", "micro"], "broken.py", "broken.py", "ImportError: missing dep xyz"),
        (["config", "show", "micro", "--plugin", "nowhere.py"], None, "nowhere.py", "no such file"),
        (["algos", "list"], "no_such_module_xyz", "no_such_module_xyz", "ModuleNotFoundError"),
    ]:
        out = _local(tmp_path, *args, plugins=env)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, (args, out.stderr[-2000:])
        assert lines[0].startswith(f"Error: plugin '{culprit}'") and why in lines[0], lines
    assert not (tmp_path / "runs").exists()  # nothing ran


# a peer source as a plugin file: one module, registered by name, touching no core file
PEER_PLUGIN = '''
from graftzoo.contract.peer_sources import PeerSourceKind, register_peer_source
from graftzoo.peers.sources.online import OnlinePeer


class InformativePeer(OnlinePeer):
    """The partner's groups of the step, the informative ones only (some but not all responses correct)."""

    def groups(self, prompts, step, epoch, learner_id):
        out = {pid: g for pid, g in super().groups(prompts, step, epoch, learner_id).items() if g.mixed}
        self.offered = len(out)
        return out

    def step_metrics(self, step, learner_id):
        return {"peer/offered": self.offered}


def build(cfg, trained_ids, dataset_id=None, prompt_ids=None, plan=None):
    return InformativePeer(trained_ids)


register_peer_source(PeerSourceKind("informative", "the partner's informative groups", build, live=True,
                                    label=", informative peer"))
'''
GRAFT = ["train", "--algo", "graft", "--pair", "micro", "--no-track", "--set", "run.out_dir=out", "--set",
         "run.steps=1", "--set", "run.eval_at_end=false", "--set", "rollout.n=4"]
RG_ENV = Path(__file__).resolve().parents[1] / "docs" / "examples" / "reasoning_gym_env.py"
RG_TASK = ["--plugin", str(RG_ENV), "--set", "task.env=rg/ReasoningGym-v0", "--set",
           "task.difficulty={basic_arithmetic: {max_terms: 2, max_digits: 2, allow_parentheses: false}}", "--set",
           "task.mix={basic_arithmetic: 1}"]   # problems short enough for the micro models' 128-character window


def test_a_peer_source_and_a_task_from_plugin_files_train_and_every_reader_takes_them_from_the_registries(tmp_path):
    """--plugin FILE.py registering a peer source, and the documented reasoning-gym task (a Gymnasium env plugin):
    GRAFT trains on reasoning-gym's problems, scored by the env, with the plugin's peer groups (its metric in the
    run); the run directory's name, the report's label and the summary name the source; the keys it does not read
    are said to have no effect; without the plugin, or with a path it does not take, or with a generator
    reasoning-gym lacks, one line naming the choices or the key."""
    (tmp_path / "informative.py").write_text(PEER_PLUGIN)
    run = _local(tmp_path, *GRAFT, "--peer", "informative", "--plugin", "informative.py", *RG_TASK, "--set",
                 "peer.mix_ratio=0.5")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "peer.mix_ratio" in run.stderr and "peer.source is informative" in run.stderr
    rd = one_run(tmp_path / "out", "graft-micro-informative-*-s0")
    rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    assert {r["model"] for r in rows if "peer/offered" in r} == {"micro-qwen-char", "micro-gpt2-pair"}
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["peer_source"] == "informative" and summary["status"] == "done"
    assert summary["variant"] == "graft (n=4, informative peer)"
    assert summary["peers"] == {"micro-qwen-char": "micro-gpt2-pair", "micro-gpt2-pair": "micro-qwen-char"}
    store = TrajectoryStore(rd / "store", create=False)   # every rollout: reasoning-gym's prompts, the env's verdicts
    stored = pd.concat([store.read(m) for m in summary["models"]])
    assert (stored["prompt_id"].str.split("/").str[1] == "basic_arithmetic").all()
    assert stored["prompt_text"].str.startswith("Calculate ").all() and len(stored) > 0
    assert stored["prompt_text"].str.endswith("Answer in <answer></answer>.").all()
    assert set(stored["status"]) <= {"ok", "no_answer"} and set(stored["model_id"]) == set(summary["models"])
    path = _local(tmp_path, *GRAFT, "--peer", "informative:elsewhere", "--plugin", "informative.py")
    assert path.returncode == 2 and "informative takes no path" in path.stderr, path.stderr[-2000:]
    unknown = _local(tmp_path, *GRAFT, "--peer", "informative")
    assert unknown.returncode == 2 and "online, stored, mixed" in unknown.stderr, unknown.stderr[-2000:]
    bad = _local(tmp_path, *GRAFT, "--peer", "online", *RG_TASK[:-1], "task.mix={no_such_generator: 1}")
    assert bad.returncode == 2 and "task.mix" in bad.stderr and "no_such_generator" in bad.stderr, bad.stderr[-2000:]


def test_the_reasoning_gym_task_rewards_with_reasoning_gyms_scorer_through_the_gymnasium_interface():
    """The documented adapter, as Gymnasium sees it: reset gives a reasoning-gym problem, step's reward is
    reasoning-gym's score_answer of the answer (its partial credit included), score_groups gives the same verdicts;
    the test split draws other problems, and a slice of the stream is the same whatever its start."""
    import gymnasium as gym
    spec = importlib.util.spec_from_file_location("_rg_env", RG_ENV)
    rg = sys.modules["_rg_env"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rg)
    env = gym.make(rg.ENV_ID, size=6, mix={"countdown": 1}, disable_env_checker=True).unwrapped
    gen = env.generators["countdown"]
    obs, info = env.reset(options={"index": 2, "with_gold": True})
    assert gen[2]["question"] in obs and rg.INSTRUCTION in obs
    two = gym.make(rg.ENV_ID, size=40, mix={"countdown": 1, "chain_sum": 3}, disable_env_checker=True).unwrapped
    drawn = [p.metadata["rg_task"] for p in two.dataset]
    assert 20 <= drawn.count("chain_sum") <= 38 and 2 <= drawn.count("countdown")   # both, by their weights
    for answer in (info["gold"], "0", "abc"):
        env.reset(options={"index": 2})
        reward = env.step(f"let me think\n<answer>{answer}</answer>")[1]
        assert reward == pytest.approx(gen.score_answer(answer, gen[2]))
    assert env.step.__func__ is rg.MathReasoningEnv.step          # the library's own step: score_batch, reward
    assert [gen.score_answer(a, gen[2]) for a in (info["gold"], "0")] == [1.0, 0.05]   # full and partial credit
    env.reset(options={"index": 2})
    assert env.step("no answer here")[1:3] == (0.0, True)
    g = Group(env.dataset[2], "m", [Rollout("p", "m", 0, f"<answer>{t}</answer>") for t in (info["gold"], "0")])
    assert [(r.correct, r.reward) for r in env.score_groups([g])[0].rollouts] == [(True, 1.0), (False, 0.05)]
    assert env.generate(3, start=2) == env.generate(5)[2:] and env.generate(2) == list(env.dataset)[:2]
    test = gym.make(rg.ENV_ID, size=6, mix={"countdown": 1}, split="test", disable_env_checker=True).unwrapped
    assert not {p.text for p in test.dataset} & {p.text for p in env.dataset}
