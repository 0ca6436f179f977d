"""The command line answers before the heavy imports: the ``--help`` of every command, config errors and every
refusal of a bad path, file or checkpoint never import torch or transformers (each is checked in a fresh
interpreter, as a shell runs it), and a refusal is one or two lines naming its culprit; the light copies that make
this possible agree with the modules they stand in for; ``graftzoo config keys`` is the key list of docs/config.md
and ``graftzoo config show`` the resolved config. Timings: bench/cli_startup.py."""
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import keys_text, main
from graftzoo.contract.config import as_dict, load_config

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import sys
from graftzoo.apps.cli import main
try:
    main(sys.argv[1:], prog_name="graftzoo")
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "vllm", "ray") if m in sys.modules)
print("HEAVY", heavy, "EXIT", code, file=sys.stderr)
"""


def probe(*args):
    res = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    *lines, last = res.stderr.strip().splitlines()
    return res.stdout, lines, last


@pytest.mark.parametrize("args,exit_code", [
    (["--help"], 0), (["train", "--help"], 0),
    (["train", "--pair", "micro", "--algo", "nope"], 2),
    (["train", "--pair", "micro", "--algo", "grpo", "--set", "optim.lr=-1"], 2),
    (["train", "--pair", "micro", "--algo", "graft", "--set", "algo.delta=-1", "--peer", "online"], 2),
    (["train", "--pair", "micro", "--algo", "grpo", "--set", "optim.lrr=1"], 2),
    (["train", "--pair", "nope", "--algo", "grpo"], 2),
], ids=["help", "train-help", "unknown-algo", "bad-value", "bad-algo-value", "unknown-key", "unknown-pair"])
def test_help_and_config_errors_import_no_torch(args, exit_code):
    out, errors, last = probe(*args)
    assert last == f"HEAVY [] EXIT {exit_code}", (last, errors)
    if exit_code:
        assert len(errors) == 1 and errors[0].startswith("Error: config key '") or errors[0].startswith("Error: "), errors
        assert "Traceback" not in "\n".join(errors)
    else:
        assert "Usage: graftzoo" in out


HELPS = [[], ["train"], ["grid"], ["eval"], ["plan"], ["demo"], ["report"], ["export"], ["env"], ["env", "check"],
         ["algos"], ["algos", "list"], ["config"], ["config", "show"], ["config", "keys"]]


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "graftzoo")
def test_every_help_imports_no_torch(command):
    out, errors, last = probe(*command, "--help")
    assert last == "HEAVY [] EXIT 0", (last, errors)
    assert f"Usage: graftzoo {' '.join(command)}".rstrip() in out and not errors, (out, errors)


def make_bad_files(d: Path) -> Path:
    """The bad paths, files and checkpoints the refusal cases name, made once: a JSONL file whose second row is
    broken, grid files (invalid YAML, an unknown key, a missing config file), a pair whose model folder is missing,
    a calibration file that is not JSON, a plain file, a folder that is not a run, a run without a checkpoint and a
    run with one (its manifest only: what is checked before torch)."""
    (d / "broken.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer"\n')
    (d / "broken_grid.yaml").write_text("name: x\npairs: [micro\n")
    (d / "badkey_grid.yaml").write_text("name: y\npairs: [micro]\nalgorithms: [grpo]\nbogus: 1\n")
    (d / "badfiles_grid.yaml").write_text(f"name: z\npairs: [micro]\nseeds: 3\nfiles: [{d / 'extra.yaml'}]\n"
                                          f"algorithms: [grpo, rloo]\n")
    model = {"id": "my-base", "kind": "hf", "path": str(d / "nope-model"), "dtype": "float32"}
    (d / "byo_pair.yaml").write_text(yaml.safe_dump({"name": "mine", "models": [model]}))
    (d / "bad.json").write_text("{bad")
    (d / "afile").write_text("")
    (d / "notarun").mkdir()
    config = yaml.safe_dump(as_dict(load_config(pair="micro", algo="grpo")), sort_keys=False)
    for run in ("nockpt", "run1"):
        (d / run).mkdir()
        (d / run / "config.yaml").write_text(config)
    (d / "garbled" / "checkpoints" / "step_000000").mkdir(parents=True)
    (d / "garbled" / "config.yaml").write_text("run: {steps: [1, 2\n")
    ckpt = d / "run1" / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text("{}")
    return d


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """The bad files, made once for the module (``make_bad_files``; bench/cli_startup.py times the same cases)."""
    return make_bad_files(tmp_path_factory.mktemp("bad"))


TRAIN = ["train", "--pair", "micro", "--algo", "grpo"]
MATH = "graftzoo/MathReasoning-v0"
# id -> (arguments, {d}: the ``bad`` folder; exit code; what the error must name)
REFUSALS = {
    "train-missing-data": (TRAIN + ["--set", "task.dataset={d}/missing.jsonl"], 2, "missing.jsonl: no such file"),
    "train-broken-row": (TRAIN + ["--set", "task.dataset={d}/broken.jsonl"], 2, "broken.jsonl:2"),
    "train-missing-eval-data": (TRAIN + ["--set", "eval.dataset={d}/held.jsonl"], 2, "held.jsonl: no such file"),
    "train-missing-model-folder": (["train", "--pair", "{d}/byo_pair.yaml", "--algo", "grpo"], 2, "nope-model"),
    "train-missing-pair-file": (["train", "--pair", "{d}/nopair.yaml", "--algo", "grpo"], 2, "nopair.yaml"),
    "train-stored-peer": (["train", "--pair", "micro", "--algo", "graft", "--peer", "stored:{d}/nostore"], 2,
                          "nostore: no trajectory store"),
    "train-mixed-peer": (["train", "--pair", "micro", "--algo", "graft", "--peer", "mixed:{d}/notarun"], 2,
                         "notarun: no trajectory store"),
    "train-missing-config-file": (TRAIN + ["-c", "{d}/more.yaml"], 2, "more.yaml"),
    "train-missing-plugin": (TRAIN + ["--plugin", "{d}/my_algo.py"], 2, "my_algo.py': no such file"),
    "train-run-dir-in-a-file": (TRAIN + ["--run-dir", "{d}/afile/run"], 1, "afile"),
    "config-show-missing-file": (["config", "show", "micro", "-c", "{d}/more.yaml"], 2, "more.yaml"),
    "eval-missing": (["eval", "--ckpt", "{d}/gone"], 2, "gone"),
    "eval-not-a-run": (["eval", "--ckpt", "{d}/notarun"], 2, "notarun: neither a run directory"),
    "eval-no-checkpoint": (["eval", "--ckpt", "{d}/nockpt"], 1, "nockpt/checkpoints: no complete checkpoint"),
    "eval-broken-benchmark": (["eval", "--ckpt", "{d}/run1", "--benchmarks", "{d}/broken.jsonl"], 2,
                              "broken.jsonl:2"),
    "eval-missing-benchmark": (["eval", "--ckpt", "{d}/run1", "--benchmarks", "{d}/bench.jsonl"], 2,
                               "bench.jsonl: no such file"),
    "export-missing": (["export", "{d}/gone"], 2, "gone"),
    "export-not-a-run": (["export", "{d}/notarun"], 2, "notarun: neither a run directory"),
    "export-no-checkpoint": (["export", "{d}/nockpt"], 1, "nockpt: no intact checkpoint"),
    "export-no-such-step": (["export", "{d}/run1", "--step", "9"], 2, "--step 9"),
    "grid-missing": (["grid", "{d}/nogrid.yaml"], 2, "nogrid.yaml: no such grid file"),
    "grid-invalid-yaml": (["grid", "{d}/broken_grid.yaml"], 2, "broken_grid.yaml: invalid YAML"),
    "grid-unknown-key": (["grid", "{d}/badkey_grid.yaml"], 2, "bogus"),
    "grid-missing-config-file": (["grid", "{d}/badfiles_grid.yaml"], 2, "extra.yaml"),
    "plan-missing-pair-file": (["plan", "{d}/nopair.yaml"], 2, "nopair.yaml"),
    "plan-missing-model-folder": (["plan", "{d}/byo_pair.yaml"], 2, "nope-model"),
    "plan-calibration-not-json": (["plan", "micro", "--calibration", "{d}/bad.json"], 2, "bad.json"),
    "plan-missing-calibration": (["plan", "micro", "--calibration", "{d}/cal.json"], 2, "cal.json"),
    "env-check-missing-data": (["env", "check", MATH, "--kw", "dataset={d}/missing.jsonl"], 1, "missing.jsonl"),
    "env-check-broken-row": (["env", "check", MATH, "--kw", "dataset={d}/broken.jsonl"], 1, "broken.jsonl:2"),
    "report-missing": (["report", "{d}/gone"], 2, "gone"),
    "report-no-runs": (["report", "{d}/notarun"], 1, "notarun: no run directory"),
    "eval-garbled-config": (["eval", "--ckpt", "{d}/garbled"], 1, "garbled/config.yaml: invalid YAML"),
    "train-no-resume-into-a-run": (TRAIN + ["--no-resume", "--run-dir", "{d}/nockpt"], 2, "nockpt: holds a run"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_bad_path_is_refused_in_a_line_before_torch(case, bad):
    """Each refusal exits with its code (usage 2, a missing file at run time 1) in at most two lines naming the
    culprit (the file, and the line of a broken row), with neither torch nor transformers imported."""
    args, code, culprit = REFUSALS[case]
    out, errors, last = probe(*(a.format(d=bad) for a in args))
    assert last == f"HEAVY [] EXIT {code}", (last, errors)
    assert 1 <= len(errors) <= 2 and errors[0].startswith(("Error: ", "config error in cell ")), errors
    assert culprit in " ".join(errors) and "Traceback" not in " ".join(errors), errors
    assert not out, out


def test_a_cell_config_error_is_one_line_for_all_its_cells(bad):
    res = CliRunner().invoke(main, ["grid", str(bad / "badfiles_grid.yaml")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "config error in cell grpo-micro-s0 (and 5 more: grpo-micro-s1, grpo-micro-s2, rloo-micro-s0" in res.stderr


def test_the_light_copies_agree_with_the_modules_they_stand_in_for(tmp_path):
    """What the commands check before torch (graftzoo.apps.checks, plan's chips, a grid's eval options) is what the
    heavy modules define; a checkpoint folder is complete by the same rule."""
    from graftzoo.apps import checks
    from graftzoo.apps.grid.load import EVAL_OPTIONS
    from graftzoo.apps.plan_command import CHIP_NAMES
    from graftzoo.eval import artifacts
    from graftzoo.training.run import checkpoint
    from graftzoo.training.planner import memory
    from graftzoo.training.run import rundir
    from graftzoo.training.eval_runner import evaluate_checkpoint
    assert CHIP_NAMES == tuple(sorted(memory.CHIPS))
    assert EVAL_OPTIONS == set(inspect.signature(evaluate_checkpoint).parameters) - {"path", "out", "log", "models"}
    assert (checks.CONFIG, checks.SUMMARY, checks.METRICS, checks.CHECKPOINTS, checks.MANIFEST, checks.TRAINER_FILE,
            checks.STORE) == (artifacts.CONFIG, artifacts.SUMMARY, artifacts.METRICS, checkpoint.CHECKPOINTS,
                              checkpoint.MANIFEST, checkpoint.TRAINER_FILE, rundir.STORE)
    for name, files in [("step_000003", ["manifest.json"]), ("step_4", ["trainer.pt"]), ("step_000005", []),
                        ("step_x", ["manifest.json"]), ("step_000006.corrupt", ["manifest.json"])]:
        folder = tmp_path / "checkpoints" / name
        folder.mkdir(parents=True)
        for f in files:
            (folder / f).write_text("{}")
        assert checks.is_checkpoint(folder) == checkpoint.is_checkpoint(folder), name
    assert checks.checkpoint_steps(tmp_path) == [checkpoint.checkpoint_step(c)
                                                 for c in checkpoint.list_checkpoints(tmp_path)] == [3, 4]


def test_an_unknown_algorithm_names_the_closest():
    res = CliRunner().invoke(main, ["train", "--pair", "micro", "--algo", "graftt"])
    assert res.exit_code == 2 and "did you mean 'graft'?" in res.stderr


def test_every_command_is_listed_and_runs_its_help():
    res = CliRunner().invoke(main, ["--help"])
    names = ["algos", "config", "demo", "env", "eval", "export", "grid", "plan", "report", "train"]
    assert res.exit_code == 0 and all(f"  {n} " in res.output for n in names), res.output
    for name in names:  # a lazy command is imported when asked for
        sub = CliRunner().invoke(main, [name, "--help"])
        assert sub.exit_code == 0 and "Usage:" in sub.output, (name, sub.output)


def test_config_keys_page_is_current():
    assert (REPO / "docs" / "config.md").read_text() == keys_text(markdown=True) + "\n", \
        "docs/config.md is stale: graftzoo config keys --markdown > docs/config.md"
    text = keys_text(markdown=False)
    for k in ("run.steps", "optim.clip.eps_low", "task.verifier.strict", "algo[grpo].loss_agg", "algo[graft].delta"):
        assert k in text


def test_config_show_prints_the_resolved_config():
    res = CliRunner().invoke(main, ["config", "show", "micro", "--algo", "graft", "--peer", "online",
                                    "--set", "optim.lr=3e-5"])
    assert res.exit_code == 0, res.output
    shown = yaml.safe_load(res.output)
    want = as_dict(load_config(pair="micro", algo="graft", overrides=["peer.source=online", "optim.lr=3e-5"]))
    assert shown == want and shown["optim"]["lr"] == 3e-5 and shown["algo"]["delta"] == 0.8
