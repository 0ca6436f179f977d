"""A regular install works like the editable one: a wheel of the project, installed into a fresh virtual
environment and run from another directory, finds its configs, presets, grids, demo plans and bundled data inside
the package (importlib.resources), not in the source tree; `graftzoo demo --quick` runs end to end from it.

The fresh venv reuses this environment's third-party packages without reinstalling them: a ``.pth`` file holding the
path of this environment's site-packages (a plain path line adds the folder to ``sys.path`` without processing the
``.pth`` files inside it, so the repository's editable-install finder stays inactive)."""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from graftzoo.contract import config as config_mod
from test_demo_output import NOISE

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

ROOT = Path(__file__).resolve().parents[1]
# everything setup.py builds from: itself and the package roots of its ROOTS mapping
ROOTS_LINE = re.search(r"^ROOTS = (\{.*?\})$", (ROOT / "setup.py").read_text(), re.M | re.S)
SOURCES = ("setup.py", *sorted(set(ast.literal_eval(ROOTS_LINE.group(1)).values())))
CHEAP = ["--set", "run.steps=1", "--set", "task.prompts_per_step=2", "--set", "rollout.n=2", "--set", "eval.size=8",
         "--no-track"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, wheel, a working directory outside the repository) with the project's wheel installed in venv."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"  # built from a copy: no build/ folder in the repository, no clash with a concurrent build
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True, text=True)
    wheel = next((tmp / "dist").glob("graftzoo-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "graftzoo_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, text=True)
    work = tmp / "elsewhere"
    work.mkdir()
    return venv, wheel, work


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(WANDB_MODE="offline", PYTHONUNBUFFERED="1", COLUMNS="200")  # GRAFTZOO_CACHE passes through
    return env


def test_the_wheel_holds_every_config_and_data_file(installed):
    _, wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    packaged = config_mod.packaged_configs()
    for f in sorted(packaged.rglob("*.yaml")):
        assert f"graftzoo/configs/{f.relative_to(packaged).as_posix()}" in names, f
    data = ROOT / "envs" / "data"
    for f in sorted(p for p in data.rglob("*") if p.is_file()):
        assert f"graftzoo/envs/data/{f.relative_to(data).as_posix()}" in names, f
    weights = ROOT / "graftzoo" / "tiny" / "weights"  # the shipped tiny models: their manifest and every file
    shipped = sorted(p for p in weights.rglob("*") if p.is_file())
    assert len(shipped) >= 3
    for f in shipped:
        assert f"graftzoo/tiny/weights/{f.relative_to(weights).as_posix()}" in names, f


def test_installed_wheel_trains_runs_grids_and_finds_the_demo_from_another_directory(installed):
    venv, _, work = installed
    # the package, its configs and the demo's plans come from the fresh venv; algos list and a grid dry-run through
    # the CLI (one interpreter for all of it: an import of graftzoo costs seconds)
    script = r"""
import json, graftzoo, graftzoo.envs
from click.testing import CliRunner
from graftzoo.apps.cli import main
from graftzoo.apps.demo import _config_file
from graftzoo.apps.grid import load_grid
from graftzoo.contract.config import packaged_configs, read_yaml
from graftzoo.envs.datasets import load_dataset
from graftzoo.tiny.shipped import manifest, verified
plan = read_yaml(_config_file("demo", "demo"))
grids = {mode: len(load_grid(_config_file("demo", p["grid"]), out="runs/demo").cells) for mode, p in plan.items()}
grids.update({name: len(load_grid(_config_file("grids", name)).cells) for p in plan.values() for name in p.get("also", [])})
listed = CliRunner().invoke(main, ["algos", "list"])
dry = CliRunner().invoke(main, ["grid", "configs/grids/tiny_table1.yaml", "--dry-run"])
print(json.dumps({"file": graftzoo.__file__, "envs": graftzoo.envs.__file__, "configs": str(packaged_configs()),
                  "math500": len(load_dataset("math500")), "grids": grids,
                  "shipped": {m: str(verified(m)) for m in manifest()},
                  "list": [listed.exit_code, listed.output], "dry": [dry.exit_code, dry.output]}))
"""
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=work, env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("file", "envs", "configs"):
        assert Path(got[key]).resolve().is_relative_to(venv.resolve()), (key, got[key])
    assert got["math500"] == 500  # the bundled data, read from the installed package
    # the shipped tiny models, checked by hash where the wheel installed them
    assert set(got["shipped"]) == {"tiny-qwen-char", "tiny-gpt2-pair"}
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in got["shipped"].values()), got["shipped"]
    # the demo's plans and --full's extra grids (the positive control, the regime map) with their mul-* pairs
    assert set(got["grids"]) == {"quick", "default", "full", "control", "regime_map"}
    assert all(n > 0 for n in got["grids"].values()) and got["grids"]["default"] == 8  # 2 seeds x 4 runs
    code, listed = got["list"]
    assert code == 0 and listed.splitlines()[0].split() == ["NAME", "SOURCE", "MODULE"]
    assert any(line.split()[:3] == ["grpo_n8", "preset", "algo.name=grpo"] for line in listed.splitlines())
    code, dry = got["dry"]
    assert code == 0, dry
    assert "[new] grpo-n8-micro-s0" in dry and "graftzoo train --algo grpo_n8 --pair micro" in dry

    run = subprocess.run([str(venv / "bin" / "graftzoo"), "train", "--algo", "grpo_n8", "--pair", "micro", *CHEAP],
                         cwd=work, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    # CHEAP's task.prompts_per_step and rollout.n differ from the pair and preset: a hash before -s0 stands for them
    [run_dir] = (work / "runs").glob("grpo-n8-micro-*-s0")
    assert f"run name {run_dir.name}: rollout.n=2, task.prompts_per_step=2 (" in run.stderr, run.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "done"
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert raw["run"]["variant"] == "GRPO (n=8)" and raw["rollout"]["n"] == 2 and raw["algo"]["name"] == "grpo"


def test_named_configs_come_from_the_package_and_a_local_configs_folder_comes_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./configs here: everything from the package
    packaged = config_mod.packaged_configs()
    assert packaged == Path(config_mod.__file__).resolve().parents[1] / "configs"
    for form in ("tiny_table1", "tiny_table1.yaml", "grids/tiny_table1.yaml", "configs/grids/tiny_table1.yaml"):
        assert config_mod.find_config("grids", form) == packaged / "grids" / "tiny_table1.yaml", form
    assert config_mod.find_config("grids", "elsewhere/tiny_table1.yaml") is None
    assert config_mod.find_config("demo", "demo") == packaged / "demo" / "demo.yaml"
    assert config_mod.load_config(pair="configs/pairs/micro.yaml", algo="grpo").pair.name == "micro"
    with pytest.raises(config_mod.ConfigError, match=r"unknown pair 'nope'.*pairs: .*micro"):
        config_mod.load_config(pair="nope", algo="grpo")

    mine = tmp_path / "configs" / "algos"  # a user's own presets: theirs win a name, the rest stay the package's
    mine.mkdir(parents=True)
    (mine / "grpo_n8.yaml").write_text("algo: {name: grpo}\nrollout: {n: 4}\n")
    (mine / "grpo_n4.yaml").write_text("algo: {name: grpo}\nrollout: {n: 4}\nrun: {variant: GRPO (n=4)}\n")
    assert config_mod.load_config(pair="micro", algo="grpo_n8").rollout.n == 4
    assert config_mod.load_config(pair="micro", algo="grpo_n16").rollout.n == 16
    presets = {name: (source, sets) for name, source, sets in config_mod.algo_presets()}
    assert presets["grpo_n4"] == ("preset:./configs", ["algo.name=grpo", "rollout.n=4", 'run.variant="GRPO (n=4)"'])
    assert presets["grpo_n8"][0] == "preset:./configs" and presets["grpo_n16"][0] == "preset"


def test_installed_wheel_runs_the_quick_demo_end_to_end_from_another_directory(installed, tmp_path):
    """`graftzoo demo --quick` of the installed wheel, run elsewhere: warm-up, complementarity, GRPO / GRAFT / stored
    GRAFT runs, report, figures and the conclusion. It prints its own progress only: with an empty model cache (the
    warm-up builds the models, where the libraries print) and none of the settings that quiet the libraries, none of
    their warnings or progress bars."""
    venv, _, work = installed
    env = {k: v for k, v in _env().items() if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS",
                                                        "PYTHONWARNINGS", "GRAFTZOO_DEBUG")}
    env.update(COLUMNS="120", GRAFTZOO_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([str(venv / "bin" / "graftzoo"), "demo", "--quick", "--out", str(tmp_path)], cwd=work,
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "1. building and warming up" in text and "[done] grpo-n8-micro-s0" in text, text[-3000:]
    assert not [n for n in NOISE if n in text], text[-3000:]
    root = tmp_path / "quick"
    comp = json.loads((root / "complementarity.json").read_text())
    assert set(comp) == {"micro-qwen-char", "micro-gpt2-pair"}
    assert all(0.0 <= c["all_fail_frac"] <= 1.0 for c in comp.values())
    rep = root / "report"
    for f in ("table1.md", "table1.csv", "table1.tex", "clip_table.md", "score_vs_compute.png", "fractions.png",
              "learning_curve.png", "conclusion.txt"):
        assert (rep / f).stat().st_size > 0, f
    table = (rep / "table1.md").read_text()
    for label in ("GRPO (n=8)", "GRAFT", "GRAFT (stored)"):
        assert label in table
    runs = [d for d in root.iterdir() if (d / "summary.json").exists()]
    assert len(runs) == 4
    assert all(json.loads((d / "summary.json").read_text())["status"] == "done" for d in runs)
    assert all(list(d.glob("wandb/offline-run-*")) for d in runs)
    stored = [json.loads((d / "summary.json").read_text()) for d in runs if "stored" in d.name]
    assert stored and all(s["peer_source"] == "stored" for s in stored)
    assert "what the numbers show" in out.stdout
    # whatever the quick runs learn: a comparison, or (every score 0) no verdict at all
    said = (rep / "conclusion.txt").read_text().splitlines()
    assert len(said) == 2 and all(("GRAFT n=8 scores" in line) != ("every score is 0" in line) for line in said), said
    if "All scores are 0" in table:
        rows = [line for line in table.splitlines() if line.startswith("|")]
        assert not any("**" in r or "†" in r for r in rows), rows  # no bold or marks on an all-zero table
