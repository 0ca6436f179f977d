"""Default run names, through ``graftzoo train`` and ``graftzoo grid`` as a user types them:

- what the user set beyond the pair file and the algorithm preset (``--set``, ``-c FILE``) that changes the trajectory
  is a hash in the name, so an lr sweep trains in one run directory per value (no "changed config" refusal), and
  the trainer says once what the hash stands for;
- keys free to change on resume (``run.steps``, ``--no-track``, ...) and keys set to the pair's or preset's own value
  leave the plain name (``grpo-micro-s0``);
- a preset on a pair and seed gets the same name from ``train`` and from a grid cell (one label-to-name rule);
- the hash is the same in every process (the same command names the same directory).
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import load_config
from graftzoo.training.run.rundir import default_run_name

HASH = re.compile(r"[0-9a-f]{8}")
NOTE = "(set beyond the pair and preset; --set run.name=NAME to choose one)"


def train_args(out, *sets, algo="grpo"):
    """``graftzoo train`` of one micro step into ``out``: every option here is free to change (not in the name)."""
    args = ["train", "--algo", algo, "--pair", "micro", "--no-track", "--set", f"run.out_dir={out}",
            "--set", "run.steps=1", "--set", "run.eval_at_end=false", "--set", "run.progress=false"]
    for s in sets:
        args += ["--set", s]
    return args


def cli(*args, hash_seed="1") -> subprocess.CompletedProcess:
    """The command in a process of its own (``PYTHONHASHSEED`` chosen: nothing may hang on Python's ``hash``)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONHASHSEED=hash_seed)
    return subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=600)


def cli_here(*args):
    res = CliRunner().invoke(main, [str(a) for a in args], env={"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"})
    assert res.exit_code == 0, res.output[-3000:] + repr(res.exception)
    return res


def run_dir_of(output: str) -> Path:
    """The run directory ``graftzoo train`` printed."""
    return Path(next(x for x in output.splitlines() if x.startswith("run directory: ")).split(": ", 1)[1])


def done(run: Path) -> bool:
    return json.loads((run / "summary.json").read_text())["status"] == "done"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """An lr sweep (3e-4, then 5e-4) and a plain run on micro, in one runs folder; the first in a process of its
    own (its log line on stderr)."""
    out = tmp_path_factory.mktemp("sweep")
    first = cli(*train_args(out, "optim.lr=3e-4"))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    second = cli_here(*train_args(out, "optim.lr=5e-4"))
    # free keys (run.steps, --no-track, ...) and micro's own lr (the default, 1e-4): the plain name
    plain = cli_here(*train_args(out, "optim.lr=1e-4", "run.save_every=1"))
    return out, first, second, plain


@pytest.mark.slow
def test_an_lr_sweep_trains_one_run_directory_per_value(sweep):
    out, first, second, _ = sweep
    a, b = run_dir_of(first.stdout), run_dir_of(second.output)
    assert a.parent == b.parent == out and a != b
    assert done(a) and done(b)  # the second is a run of its own, not a refused resume of the first
    assert "changed config" not in first.stderr + second.output
    head_a, hash_a, tail_a = a.name.rsplit("-", 2)
    head_b, hash_b, tail_b = b.name.rsplit("-", 2)
    assert (head_a, tail_a) == (head_b, tail_b) == ("grpo-micro", "s0")  # they differ by the hash only
    assert HASH.fullmatch(hash_a) and HASH.fullmatch(hash_b) and hash_a != hash_b
    for cfg_dir, lr in ((a, 3e-4), (b, 5e-4)):
        stored = yaml.safe_load((cfg_dir / "config.yaml").read_text())
        assert stored["optim"]["lr"] == lr and stored["run"]["name"] == cfg_dir.name
    # the trainer says, once, which keys the hash stands for
    said = [x for x in first.stderr.splitlines() if x.startswith("run name ")]
    assert said == [f"run name {a.name}: optim.lr=0.0003 {NOTE}"], first.stderr[-3000:]


def test_free_keys_and_the_pairs_own_values_keep_the_plain_name(sweep):
    out, _, _, plain = sweep
    run = run_dir_of(plain.output)
    assert run == out / "grpo-micro-s0" and done(run)
    others = sorted(p.name for p in out.iterdir() if p != run)  # the sweep's two, hashed
    assert len(others) == 2 and all(HASH.fullmatch(x.rsplit("-", 2)[1]) for x in others), others


@pytest.mark.parametrize("sets", [
    ["rollout.engine=vllm"],
    ["rollout.top_k=5"],
    ["algo.loss_agg=seq-mean-token-sum"],  # an algo.* key the preset does not set: against the algorithm's default
    ["model.lora={r: 4}"],
])
def test_a_changed_trajectory_key_changes_the_name(sets):
    """The name the trainer gives (its ``default_run_name``) for what ``graftzoo train --set`` loads: a key that
    changes what is trained adds a hash; free keys and the pair's own values added to it keep it (the sweep above
    trains through the CLI)."""
    if sets == ["rollout.engine=vllm"] and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: rollout.engine=vllm does not load")

    def name(*extra):
        return default_run_name(load_config(pair="micro", algo="grpo", overrides=[*extra]))
    plain = name("run.steps=1", "run.track=false", "optim.lr=1e-4", "rollout.n=4")  # micro's own lr and n
    assert plain == "grpo-micro-s0"
    changed = name(*sets)
    head, digest, seed = changed.rsplit("-", 2)
    assert (head, seed) == ("grpo-micro", "s0") and HASH.fullmatch(digest)
    assert name(*sets, "run.steps=7", "run.track=false", "run.backend=inprocess", "eval.size=3") == changed
    assert name(*sets, "optim.lr=1e-4") == changed  # a key at its pair value adds nothing
    assert name(*sets, "optim.lr=2e-4") != changed


def test_train_and_a_grid_cell_name_a_preset_run_alike(tmp_path):
    """grpo_n8 (run.variant "GRPO (n=8)") on micro, seed 0: ``graftzoo train`` and the grid's cell of that preset
    name the same directory."""
    spec = tmp_path / "g.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "pairs": ["micro"], "seeds": [0], "algorithms": ["grpo_n8"],
                                    "variants": [{"label": "SGT (aux_nll)", "algo": "grpo"}]}))
    dry = cli_here("grid", str(spec), "--out", str(tmp_path / "grid"), "--dry-run").output
    cells = re.findall(r"\[new\] (\S+)", dry)
    assert cells == ["grpo-n8-micro-s0", "sgt-aux_nll-micro-s0"], dry
    res = cli_here(*train_args(tmp_path / "runs", algo="grpo_n8"))
    run = run_dir_of(res.output)
    assert run.name == cells[0] and done(run)


@pytest.mark.slow
def test_the_hash_is_the_same_in_every_process(sweep):
    """The command of the sweep's first run, named again in this process and in another one (other hash seeds)."""
    out, first, _, _ = sweep
    want = run_dir_of(first.stdout).name
    assert default_run_name(load_config(pair="micro", algo="grpo", overrides=[
        f"run.out_dir={out}", "run.steps=1", "run.eval_at_end=false", "run.progress=false", "run.track=false",
        "optim.lr=3e-4"])) == want
    script = ("from graftzoo.contract.config import load_config\nfrom graftzoo.training.run.rundir import default_run_name\n"
              "print(default_run_name(load_config(pair='micro', algo='grpo', overrides=['optim.lr=3e-4'])))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    got = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0 and got.stdout.strip() == want, got.stderr[-2000:]
