"""What a run already stored is never lost, names never leave their folder, values are bounded, and nothing is
computed only to be lost: through ``graftzoo train`` / ``eval`` / ``export`` as a user types them and the Python API.

- a run whose every checkpoint fails its check refuses to resume (its metrics, store and corrupt checkpoints kept);
  ``--overwrite`` moves it aside and starts over;
- ``run.name`` is one folder name under ``run.out_dir``;
- every integer key has a lower and an upper bound; a huge value or seed is one error line;
- wandb with an API key and no server logs offline at once, said in one line;
- leftovers of killed store writes are removed on resume;
- ``eval`` and ``export`` check their destination before computing anything;
- a stored peer is checked before ``--overwrite`` moves anything, and is never the run's own store.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import BaseModel

import graftzoo
from graftzoo.algos import BUILTIN
from graftzoo.contract.config import SECTIONS, ModelSpec, load_config
from graftzoo.contract.registry import get_config
from graftzoo.contract.schema import _unwrap, bounds_of
from graftzoo.training.run.checkpoint import list_checkpoints
from graftzoo.training.run.rundir import default_run_name
from graftzoo.training.trainer import train
from helpers import cli_here, one_line_error

ENV = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1")
MODELS = ("micro-qwen-char", "micro-gpt2-pair")


def cli(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", *map(str, args)], env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


def train_args(out, *sets, name="x", algo="grpo"):
    args = ["train", "--algo", algo, "--pair", "micro", "--no-track", "--set", f"run.out_dir={out}",
            "--set", f"run.name={name}", "--set", "run.eval_at_end=false", "--set", "run.progress=false"]
    for s in sets:
        args += ["--set", s]
    return args




def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (relative path -> bytes), the lock file left out."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 2-step micro run with both checkpoints kept; tests work on copies of it."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "run.track=false", "run.eval_at_end=false", "run.progress=false", "run.steps=2", "run.save_every=1",
        "run.keep_checkpoints=0"])
    return train(cfg, run_dir=str(tmp_path_factory.mktemp("safety") / "x"))


def copy_run(base: Path, out: Path, name: str = "x") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(base, out / name, ignore=shutil.ignore_patterns(".lock")))


# ------------------------------------------------------------------------------------------------
# a finished run stays finished
# ------------------------------------------------------------------------------------------------

def test_rerunning_a_finished_run_rewrites_nothing_and_builds_no_model(base, tmp_path, monkeypatch):
    """The same command on a finished run: exit 0 with its summary, no model built and not one byte or mtime
    changed, so that a report read meanwhile (a second grid on the same folder) never sees it "running". More
    steps or another final evaluation make it a run to resume, and an unfinished run resumes as before."""
    from graftzoo.training import trainer
    from graftzoo.training.run.rundir import rerun_plan
    run = copy_run(base, tmp_path)
    before = snapshot(run)
    stamps = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".lock"}

    def refuse(*a, **kw):
        raise AssertionError("a model was built for a finished run")
    monkeypatch.setattr(trainer.Trainer, "_build", refuse)
    res = cli_here(*train_args(tmp_path, "run.steps=2", "run.keep_checkpoints=0"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "this run is finished (summary.json says done), nothing to do" in res.stderr
    assert res.stdout.startswith("done: 2 of 2 steps"), res.stdout
    assert snapshot(run) == before
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    def plan(*sets):
        cfg = load_config(pair="micro", algo="grpo", overrides=[
            "run.track=false", "run.eval_at_end=false", "run.progress=false", "run.steps=2", "run.name=x",
            "run.variant=grpo (n=4)", *sets])
        return rerun_plan(run, cfg, lambda flat: flat["run.epochs"] if flat.get("run.epochs") else flat["run.steps"])
    # cadence, hosting, and the settings of a final evaluation that is not asked for: still finished
    assert plan("run.save_every=5", "run.threads=1", "eval.size=8").action == "nothing"
    for more in ("run.steps=3", "run.eval_at_end=true", "run.epochs=3"):
        assert plan(more).action == "continue", more
    stored = yaml.safe_load((run / "config.yaml").read_text())
    stored["run"]["eval_at_end"] = True   # a run that ended with its final evaluation
    (run / "config.yaml").write_text(yaml.safe_dump(stored))
    assert plan("run.eval_at_end=true").action == "nothing"
    summary = json.loads((run / "summary.json").read_text())
    for status in ("running", "interrupted", "failed"):
        (run / "summary.json").write_text(json.dumps({**summary, "status": status}))
        assert plan().action == "continue"
    (run / "summary.json").write_text("{")   # a torn summary is not a finished run
    assert plan().action == "continue"


# ------------------------------------------------------------------------------------------------
# every checkpoint corrupt
# ------------------------------------------------------------------------------------------------

def test_a_run_whose_every_checkpoint_is_corrupt_refuses_to_resume_and_keeps_everything(base, tmp_path):
    run = copy_run(base, tmp_path)
    for ck in list_checkpoints(run):
        f = ck / f"{MODELS[1]}.pt"
        f.write_bytes(f.read_bytes()[:1000])  # truncated
    before = snapshot(run)
    stored = {k: v for k, v in before.items() if not k.startswith("checkpoints")}

    res = cli_here(*train_args(tmp_path, "run.steps=3", "run.save_every=1"))
    line = one_line_error(res, 2, str(run), "no intact checkpoint", "step_000000.corrupt", "step_000001.corrupt",
                          "--overwrite")
    assert "previous intact" not in res.stderr and "resuming" not in res.stderr, res.stderr
    after = snapshot(run)
    assert {k: v for k, v in after.items() if not k.startswith("checkpoints")} == stored  # metrics, store, config
    for ck in ("step_000000", "step_000001"):  # the corrupt checkpoints are kept, byte for byte, renamed aside
        assert {k.replace(f"{ck}.corrupt", ck): v for k, v in after.items() if k.startswith(f"checkpoints/{ck}")} \
            == {k: v for k, v in before.items() if k.startswith(f"checkpoints/{ck}/")}

    again = cli_here(*train_args(tmp_path, "run.steps=3", "run.save_every=1"))  # renamed aside: still no start over
    assert one_line_error(again, 2, "no intact checkpoint") == line
    assert snapshot(run) == after

    res = cli_here(*train_args(tmp_path, "run.steps=1"), "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    aside, = [p for p in tmp_path.iterdir() if p.name.startswith("x.replaced-")]
    assert snapshot(aside) == after  # the old run, whole, beside the new one
    assert [p.name for p in list_checkpoints(run)] == ["step_000000"]


# ------------------------------------------------------------------------------------------------
# run.name stays inside run.out_dir
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["..", "../../x", "ABSOLUTE", ".", ".hidden", "a/b", "-x", "x" * 201, "a b", "x\ny"])
def test_a_run_name_is_one_folder_under_out_dir(tmp_path, name):
    work = tmp_path / "deep" / "work"
    (work / "runs").mkdir(parents=True)
    name = str(tmp_path / "elsewhere") if name == "ABSOLUTE" else name
    for extra in ([], ["--overwrite"]):
        res = cli_here("train", "--algo", "grpo", "--pair", "micro", "--no-track", "--set", f"run.name={name}",
                       *extra, cwd=work)
        one_line_error(res, 2, "config key 'run.name'")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["deep", "runs", "work"]  # nothing written, nothing moved


def test_valid_and_default_run_names_stay_one_folder():
    assert load_config(pair="micro", algo="grpo", overrides=["run.name=GRPO_n8+a-b.1"]).run.name == "GRPO_n8+a-b.1"
    long = load_config(pair="micro", algo="grpo", overrides=[f"task.dataset={'d' * 300}.jsonl"])
    name = default_run_name(long)
    assert len(name) <= 200 and "/" not in name and name.startswith("grpo-micro-ddd")


# ------------------------------------------------------------------------------------------------
# every integer key is bounded
# ------------------------------------------------------------------------------------------------

def _numeric_fields(model, prefix: str):
    """(key, number type, (low, high)) of every int and float field of ``model`` and of its nested sections; a
    union's int member counts with its own bounds (``task.difficulty``: a level, or skill -> level)."""
    for name, info in model.model_fields.items():
        tp, _ = _unwrap(info.annotation)
        members = typing.get_args(tp) if typing.get_origin(tp) is typing.Union else (tp,)
        nested = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            yield from _numeric_fields(nested[0], f"{prefix}{name}.")
            continue
        for m in members:
            inner, meta = _unwrap(m)
            if typing.get_origin(inner) is dict:  # skill -> level: its values' bounds
                inner, meta = _unwrap(typing.get_args(inner)[1])
            if inner in (int, float):
                lo, _, hi, _ = bounds_of([*info.metadata, *meta])
                yield f"{prefix}{name}", inner, (lo, hi)


def declared_numeric_keys():
    out = []
    for section, model in SECTIONS.items():
        out += _numeric_fields(model, f"{section}.")
    out += _numeric_fields(ModelSpec, "pair.models[].")
    for algo in BUILTIN:
        out += _numeric_fields(get_config(algo), f"algo[{algo}].")
    return out


def test_every_integer_key_has_a_lower_and_an_upper_bound():
    ints = [(k, b) for k, tp, b in declared_numeric_keys() if tp is int]
    assert len(ints) > 40 and {"rollout.n", "run.seed", "run.steps", "task.difficulty", "algo[extra].memory_size",
                               "pair.models[].max_new_tokens"} <= {k for k, _ in ints}
    unbounded = sorted(k for k, (lo, hi) in ints if lo is None or hi is None)
    assert not unbounded, f"integer keys without both bounds: {unbounded}"
    bounds = dict(ints)
    assert bounds["rollout.n"] == (1, 1024) and bounds["run.seed"] == (0, 2**32 - 1)  # numpy / vLLM seeds: 32 bits
    assert bounds["run.steps"] == (1, 10**7)


def test_keys_that_are_probabilities_rates_or_temperatures_are_bounded():
    floats = {k: b for k, tp, b in declared_numeric_keys() if tp is float}
    for key in ("peer.mix_ratio", "algo[graft].max_peer_frac", "algo[extra].hard_pass_rate",
                "algo[extra].variance_momentum", "rollout.top_p", "optim.clip.eps_low", "model.lora.dropout"):
        assert floats[key] == (0, 1), key
    for key in ("optim.lr", "pair.models[].lr", "rollout.temperature", "eval.temperature",
                "algo[om_grpo].contrast_temperature", "task.verifier_timeout", "ray.ready_timeout_s"):
        lo, hi = floats[key]
        assert lo is not None and hi is not None, key


@pytest.mark.parametrize("override,key", [
    ("rollout.n=100000000", "rollout.n"), (f"run.seed={2**70}", "run.seed"), ("run.seed=-1", "run.seed"),
    ("run.steps=1e30", "run.steps"), ("task.prompts_per_step=1000000000", "task.prompts_per_step"),
    ("optim.lr=1000", "optim.lr"), ("rollout.temperature=1e9", "rollout.temperature"),
    ("task.difficulty={mul: 100000}", "task.difficulty"), ("model.lora={r: 10000000}", "model.lora.r"),
])
def test_a_huge_value_is_one_error_line_naming_the_key(tmp_path, override, key):
    res = cli_here("train", "--algo", "grpo", "--pair", "micro", "--no-track", "--set", f"run.out_dir={tmp_path}",
                   "--set", override)
    one_line_error(res, 2, f"config key '{key}'", "must")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# wandb without a reachable server
# ------------------------------------------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_wandb_with_an_api_key_and_no_server_logs_offline_at_once(tmp_path):
    env = {k: v for k, v in ENV.items() if not k.startswith("WANDB_")}
    env.update(WANDB_API_KEY="0123456789abcdef0123456789abcdef01234567", WANDB_SILENT="true",
               WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}", WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
               WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"), WANDB_DATA_DIR=str(tmp_path / "wandb-data"))
    args = [a for a in train_args(tmp_path, "run.steps=1") if a != "--no-track"]
    t0 = time.monotonic()
    res = cli(*args, env=env, timeout=240)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "CommError" not in res.stderr, res.stderr[-3000:]
    said = [x for x in res.stderr.splitlines() if "logging offline" in x]
    assert len(said) == 1 and env["WANDB_BASE_URL"] in said[0] and "wandb sync" in said[0], res.stderr[-3000:]
    assert took < 75, f"{took:.0f} s (wandb's own retries take over 90 s)"
    assert list((tmp_path / "x" / "wandb").glob("offline-run-*"))
    assert json.loads((tmp_path / "x" / "summary.json").read_text())["status"] == "done"


def test_the_wandb_mode_of_a_run(monkeypatch):
    from graftzoo.training.run.tracking import wandb_mode
    run = SimpleNamespace(wandb_mode=None)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_mode(run) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode(run) == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")  # the user's environment wins over the key
    assert wandb_mode(run) == "offline"
    assert wandb_mode(SimpleNamespace(wandb_mode="disabled")) == "disabled"  # and the config over both


# ------------------------------------------------------------------------------------------------
# leftovers of killed store writes
# ------------------------------------------------------------------------------------------------

def test_leftovers_of_killed_store_writes_are_removed_on_resume(base, tmp_path):
    run = copy_run(base, tmp_path)
    part = run / "store" / MODELS[0] / ".tmp-4242-step_000002.parquet"
    part.write_bytes(b"PAR1" + b"0" * 5000)
    meta = run / "store" / ".tmp-4242-meta.json"
    meta.write_text('{"schema_')
    res = cli_here(*train_args(tmp_path, "run.steps=3", "run.save_every=1"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert not part.exists() and not meta.exists()
    assert str(part) in res.stderr and str(meta) in res.stderr  # said, with the file
    assert not list((run / "store").rglob(".tmp-*"))
    steps = sorted(int(p.stem.split("_")[1]) for p in (run / "store" / MODELS[0]).glob("step_*.parquet"))
    assert steps == [0, 1, 2]


# ------------------------------------------------------------------------------------------------
# eval and export check their destination before computing
# ------------------------------------------------------------------------------------------------

def _unwritable(run: Path) -> Path:
    """The run's eval folder made unwritable: read-only permissions, or (as root, whom permissions do not stop) a
    file where graftzoo eval's folder must go. Returns the folder that cannot be written."""
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval").chmod(0o555)
    if not os.access(run / "eval", os.W_OK):
        return run / "eval" / "cli"
    (run / "eval").chmod(0o755)
    (run / "eval" / "cli").write_text("a file, not a folder")
    return run / "eval" / "cli"


def _no_models(monkeypatch, module):
    def refuse(*a, **kw):
        raise AssertionError("a model was built before the destination was checked")
    monkeypatch.setattr(module, "build_policies", refuse)


def test_eval_into_an_unwritable_run_fails_before_computing_and_out_writes_elsewhere(base, tmp_path, monkeypatch):
    from graftzoo.training import eval_runner
    run = copy_run(base, tmp_path)
    blocked = _unwritable(run)
    try:
        res = cli_here("eval", "--ckpt", run, "--benchmarks", "heldout", "--k", "1", "--limit", "2")
        one_line_error(res, 1, str(blocked), "--out")
        assert "avg@" not in res.stdout and "wrote" not in res.stdout  # nothing computed, nothing lost
        with monkeypatch.context() as m:  # the Python API: the same check, before any model is built
            _no_models(m, eval_runner)
            with pytest.raises(OSError, match="out=DIR"):
                graftzoo.evaluate(str(run), benchmarks=["heldout"], k=1, limit=2)

        res = cli_here("eval", "--ckpt", run, "--benchmarks", "heldout", "--k", "1", "--limit", "2",
                       "--out", tmp_path / "scores")
        assert res.returncode == 0, res.stderr[-3000:]
        assert sorted(p.name for p in (tmp_path / "scores").iterdir()) == sorted(f"{m}.json" for m in MODELS)
    finally:
        (run / "eval").chmod(0o755)


def test_export_to_an_unwritable_folder_fails_before_building_the_models(base, tmp_path, monkeypatch):
    from graftzoo.training import export
    run = copy_run(base, tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = cli_here("export", run, "--out", blocker / "hf")
    one_line_error(res, 1, str(blocker), "--out")
    assert "->" not in res.stdout
    _no_models(monkeypatch, export)
    with pytest.raises(OSError, match=str(blocker)):
        graftzoo.export(str(run), out=str(blocker / "hf"))


# ------------------------------------------------------------------------------------------------
# a stored peer is checked before --overwrite moves anything
# ------------------------------------------------------------------------------------------------

def test_a_stored_peer_is_checked_before_overwrite_moves_the_run(base, tmp_path):
    run = copy_run(base, tmp_path)
    before = snapshot(run)
    graft = [*train_args(tmp_path, f"pair.train=[{MODELS[0]}]", "run.steps=1", algo="graft")]
    for extra in (["--overwrite"], []):  # its own store is not another run's, resumed or started over
        res = cli_here(*graft, "--peer", f"stored:{run}", *extra)
        one_line_error(res, 2, "peer.path", str(run), "own")
    res = cli_here(*graft, "--peer", f"stored:{tmp_path / 'nope'}", "--overwrite")  # no store there
    one_line_error(res, 2, str(tmp_path / "nope"))  # a peer.path with no store: a usage error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # nothing moved aside
    assert snapshot(run) == before
