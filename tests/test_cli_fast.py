"""The command line answers before the heavy imports: ``--help``, ``train --help`` and config errors never import
torch or transformers (each is checked in a fresh interpreter, as a shell runs it); ``graftzoo config keys`` is the
key list of docs/config.md and ``graftzoo config show`` the resolved config. Timings: bench/cli_startup.py."""
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
