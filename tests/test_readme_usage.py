"""The README's quick-start block runs as written, top to bottom, in an empty directory; and default run names
tell configurations apart, so no command of the block resumes another's run.

The block's commands run through the CLI in this process (an interpreter per command would spend most of the test
importing torch), each made cheap: the micro pair for the tiny one (the same two kinds of model, warmed up in
seconds, not minutes; model ids and run names follow), a one-model micro pair in ./configs for the quickstart pair,
a few prompts for two steps, a few eval problems, one cell of the grid (the full grid is 51 runs). `make demo` comes
first, as `demo --quick` (its runs in runs/demo: other settings, and a GRPO (n=8) run of the same model and seed as
the grid's), so the block's last line, `report runs/`, reports runs of several settings and folders together."""
import json
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.config import as_dict, load_config, packaged_configs, read_yaml
from graftzoo.training.run.rundir import RunDirUsageError, check_resume_config, default_run_name
from graftzoo.eval.artifacts import write_config

README = Path(__file__).resolve().parents[1] / "README.md"
# what makes the README's runs cheap and changes what they train goes into the local pair files (a --set of such a key
# would add a hash to the run names the README gives); rollout.n as the tiny pair's (8): the default method labels then
# include the report's baseline, "grpo (n=8)"
CHEAP_PAIR = {"task": {"prompts_per_step": 2}, "optim": {"minibatches": 2}, "rollout": {"n": 8}}
CHEAP = {
    "train": ["--set", "run.steps=2", "--set", "eval.size=8", "--set", "run.progress=false", "--no-track"],
    "eval": ["--k", "2", "--limit", "8"],  # the last --k wins
    "grid": ["--only", "grpo-n8-micro-s0", "--in-process"],  # one cell of 51; the report at the end as always
}


def usage_commands() -> list:
    """The graftzoo commands of the README's "Quick start" ```bash block, as argument lists (comments dropped)."""
    section = README.read_text().split("\n## Quick start\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    cmds = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [c for c in cmds if c and c[0] == "graftzoo"]


def test_readme_usage_block_runs_top_to_bottom(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # ./configs comes first: quickstart as micro's first model, with micro's eval settings (as quickstart has tiny's);
    # both made cheap there
    quick, micro = (read_yaml(packaged_configs() / "pairs" / f"{p}.yaml") for p in ("quickstart", "micro"))
    (tmp_path / "configs" / "pairs").mkdir(parents=True)
    for name, pair in (("quickstart", {**quick, "models": micro["models"][:1], "eval": micro["eval"]}),
                       ("micro", micro)):
        for section, values in CHEAP_PAIR.items():
            pair[section] = {**(pair.get(section) or {}), **values}
        (tmp_path / "configs" / "pairs" / f"{name}.yaml").write_text(yaml.safe_dump(pair))
    cmds = usage_commands()
    assert [c[1] for c in cmds[:3]] == ["--help", "algos", "env"] and sum(c[1] == "train" for c in cmds) == 4
    res = CliRunner().invoke(main, ["demo", "--quick"])  # `make demo` first: the README allows either order
    assert res.exit_code == 0, f"demo --quick\n{res.output[-3000:]}\n{res.exception!r}"
    ran = []
    for cmd in cmds:
        args = cmd[1:]
        if args[0] == "demo":
            continue  # a minute even with --quick: tests/test_packaging.py runs it from an installed wheel
        if args[0] in ("train", "eval", "export"):  # the micro pair for the tiny one: no minutes of tiny warm-up
            args = [a.replace("tiny", "micro") for a in args]
        args = args + CHEAP.get(args[0], [])
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, f"{shlex.join(cmd)}\n{res.output[-3000:]}\n{res.exception!r}"
        ran.append((args[0], res.output))

    runs = {p.parent.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "runs").glob("*/config.yaml")}
    stored_name = "graft-micro-qwen-char-micro-stored-grpo-micro-s0-s0"
    online_name = "graft-micro-online-8e4649cc-s0"  # --set optim.lr=5e-5: the hash the README's comment gives
    assert set(runs) == {"grpo-quickstart-s0", "grpo-micro-s0", online_name, stored_name}
    quick_evals = [json.loads(x) for x in (tmp_path / "runs" / "grpo-quickstart-s0" / "metrics.jsonl").read_text()
                   .splitlines() if "eval/avg" in x]
    assert [r["step"] for r in quick_evals] == [-1, 2]  # scored before and after training
    online, stored = runs[online_name], runs[stored_name]
    assert online["peer"]["source"] == "online" and online["optim"]["lr"] == 5e-5
    assert runs["grpo-micro-s0"]["peer"]["source"] == "none" and runs["grpo-micro-s0"]["pair"]["train"] is None
    assert stored["peer"] == {**stored["peer"], "source": "stored", "path": "runs/grpo-micro-s0"}
    assert stored["pair"]["train"] == ["micro-qwen-char"]
    stored_dir = tmp_path / "runs" / stored_name
    steps = [json.loads(x) for x in (stored_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in steps if "batch/tokens" in r]  # it trained its own two steps, micro-qwen-char only
    assert [(r["step"], r["model"]) for r in trained] == [(0, "micro-qwen-char"), (1, "micro-qwen-char")]
    for name in runs:
        assert json.loads((tmp_path / "runs" / name / "summary.json").read_text())["status"] == "done", name

    assert list((tmp_path / "runs" / online_name / "eval" / "cli").rglob("*.json"))  # the eval line
    assert (tmp_path / "hf" / "micro-qwen-char" / "config.json").is_file()  # the export line
    listed = dict(ran)["algos"].splitlines()
    assert listed[0].split() == ["NAME", "SOURCE", "MODULE"]
    assert any(x.split() == ["grpo_n8", "preset", "algo.name=grpo", "rollout.n=8", 'run.variant="GRPO', '(n=8)"']
               for x in listed)
    cell = tmp_path / "runs" / "tiny_table1" / "grpo-n8-micro-s0"
    assert json.loads((cell / "summary.json").read_text())["status"] == "done"
    # the block's last line reported every run below runs/: the quick start's (2 steps), the grid's cell (6 steps,
    # eval k=2 on 32 problems) and the demo's (eval k=1 on 16), one section of Table 1 per group of settings
    table = (tmp_path / "report" / "table1.md").read_text()
    for name in runs:
        variant = runs[name]["run"]["variant"]
        assert variant in table, (name, variant)
    sections = [line for line in table.splitlines() if line.startswith("### ")]
    assert len(sections) == 3 and any("steps 6" in x for x in sections), sections
    assert "GRAFT (stored)" in table  # a demo row
    assert (tmp_path / "report" / "table1.csv").is_file() and list((tmp_path / "report").rglob("learning_curve.png"))
    # one table of everything: the demo's and the grid's GRPO (n=8) on the same model and seed are two rows, each
    # named by its folder
    res = CliRunner().invoke(main, ["report", "runs/", "--out", "mixed/", "--mixed"])
    assert res.exit_code == 0, res.output[-3000:]
    rows = [line for line in (tmp_path / "mixed" / "table1.md").read_text().splitlines()
            if line.startswith("| GRPO (n=8) [")]
    assert sorted(r.split("]")[0] for r in rows) == sorted(2 * [  # a block per model; the quick start's grpo-micro-s0
        "| GRPO (n=8) [runs", "| GRPO (n=8) [runs/demo/quick", "| GRPO (n=8) [runs/tiny_table1"]), rows  # n=8 too


def test_default_run_names_tell_configurations_apart():
    def name(algo, *sets, pair="micro"):
        return default_run_name(load_config(pair=pair, algo=algo, overrides=list(sets)))
    assert name("grpo") == "grpo-micro-s0"
    assert name("grpo", "run.seed=3") == "grpo-micro-s3"
    assert name("grpo_n8") == "grpo-n8-micro-s0"            # a preset's variant stands for the bare algorithm
    assert name("grpo_n8_ds") == "grpo-n8-ds-micro-s0"  # a label names the method, as in a grid
    assert name("grpo", "run.variant='My (odd) / label'") == "my-odd-label-micro-s0"
    assert name("grpo", "pair.train=[micro-gpt2-pair]") == "grpo-micro-gpt2-pair-micro-s0"
    assert name("grpo", "pair.train=[micro-gpt2-pair,micro-qwen-char]") == "grpo-micro-s0"  # the whole pair
    assert name("graft", "peer.source=online") == "graft-micro-online-s0"
    assert name("graft", "peer.source=stored", "peer.path=runs/grpo-B") == "graft-micro-stored-grpo-B-s0"
    assert name("graft", "peer.source=mixed", "peer.path=runs/old run/store/") == "graft-micro-mixed-old-run-s0"
    assert name("graft", "peer.source=online", pair="tiny") == "graft-tiny-online-s0"
    assert name("grpo", "task.dataset=data/my.v2.jsonl") == "grpo-micro-my.v2-s0"   # the data's name
    assert name("grpo", "task.dataset=openai/gsm8k") == "grpo-micro-gsm8k-s0"


@pytest.mark.parametrize("change", [["pair.train=[micro-qwen-char]", "peer.source=stored", "peer.path=runs/B"],
                                    ["peer.source=stored", "peer.path=runs/B"],
                                    ["peer.model=micro-gpt2-pair"], ["optim.lr=5e-5"]])
def test_resuming_under_another_config_is_refused(tmp_path, change):
    """A run directory resumed under a config that trains something else (other models, another peer, ...) is
    refused, naming the keys; run length, cadence, logging and labels stay free to change."""
    base = ["peer.source=online"]
    write_config(tmp_path, as_dict(load_config(pair="micro", algo="graft", overrides=base)))
    free = ["run.steps=50", "run.save_every=1", "run.track=false", "run.variant=X", "eval.size=4", "run.name=other"]
    assert check_resume_config(tmp_path, load_config(pair="micro", algo="graft", overrides=base + free)) == {}
    with pytest.raises(RunDirUsageError) as e:
        check_resume_config(tmp_path, load_config(pair="micro", algo="graft", overrides=base + change))
    for key in (c.split("=")[0] for c in change):
        assert key in str(e.value)
