"""The grid runner (graftzoo grid): expansion, dependencies, skipping finished cells, failures, report."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import wandb_records

from graftzoo.apps import grid as G
from graftzoo.apps.cli import main
from graftzoo.apps.options import PeerOptionError, parse_peer
from graftzoo.contract.config import load_config, packaged_configs

CONFIGS = packaged_configs() / "grids"  # graftzoo/configs/grids, as installed
# the rows of the GRAFT paper's Tables 1, 2, 6, 7 and 8 for pair 1, under their labels (docs/algorithms.md#graft-ablations)
TABLE_ROWS = ["GRPO (n=8)", "GRPO (n=16)", "GRPO (n=32)", "GRPO (n=8) + DS", "HACPO", "SGT", "GRAFT",
              "GRAFT (stored)", "w/o compatibility gate", "w/o balanced exchange", "w/o token-level ratio",
              "Count-matched random prompt selection", "Count-matched random response admission",
              "First", "Uniform", "Last", "SGT + GRAFT how", "HACPO + GRAFT which"]
TINY = {
    "name": "t",
    "pairs": ["micro"],
    "seeds": [0, 1],
    "set": {"run.steps": 1, "run.track": False, "run.progress": False, "task.prompts_per_step": 2,
            "eval": {"size": 4, "k": 1}},
    "algorithms": ["grpo"],
    "variants": [{"label": "RLOO", "algo": "rloo"}],
    "report": {"baseline": "grpo"},
}
CELLS = ["grpo-micro-s0", "grpo-micro-s1", "rloo-micro-s0", "rloo-micro-s1"]


def write_grid(path: Path, **changes) -> Path:
    data = json.loads(json.dumps(TINY))
    data.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The tiny grid (2 algorithms x micro x 2 seeds) run once from the CLI (in this process: fast;
    the child-process path is exercised by test_stored_peer_dependency_and_a_failed_cell)."""
    root = tmp_path_factory.mktemp("grid")
    spec = write_grid(root / "t.yaml")
    out = root / "out"
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(out), "--in-process"])
    return spec, out, res


def test_grid_trains_every_cell_and_writes_the_report(ran):
    _, out, res = ran
    assert res.exit_code == 0, res.output
    for name in CELLS:
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["status"] == "done" and f"[done] {name}" in res.output
        raw = yaml.safe_load((out / name / "config.yaml").read_text())
        algo, _, seed = name.split("-")
        assert raw["run"]["name"] == name and raw["run"]["wandb_group"] == "t"
        assert raw["run"]["variant"] == {"grpo": "grpo", "rloo": "RLOO"}[algo]
        assert raw["run"]["tags"] == [algo, "micro", seed] and raw["run"]["seed"] == int(seed[1:])
    for f in ("table1.md", "table1.csv", "table1.tex", "clip_table.md", "score_vs_compute.png", "fractions.png"):
        assert (out / "report" / f).stat().st_size > 0, f
    table = (out / "report" / "table1.md").read_text()
    assert "| RLOO | 4 |" in table and "| grpo | 4 |" in table and "micro-qwen-char" in table


def test_rerun_skips_finished_cells(ran):
    spec, out, _ = ran
    before = {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in CELLS}
    ckpts = {n: sorted(p.name for p in (out / n / "checkpoints").iterdir()) for n in CELLS}
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(out)])
    assert res.exit_code == 0, res.output
    for n in CELLS:
        assert f"[skipped] {n}: done" in res.output
        assert (out / n / "metrics.jsonl").stat().st_mtime_ns == before[n]
        assert sorted(p.name for p in (out / n / "checkpoints").iterdir()) == ckpts[n]
    assert "grid t: 4 skipped" in res.output and (out / "report" / "table1.md").is_file()


def test_a_second_grid_that_reopens_a_cell_the_first_finished_leaves_it_done(ran, tmp_path, monkeypatch):
    """Two grids on one folder: the second saw a cell unfinished ("resume") and runs it after the first finished
    it. The cell's trainer does nothing, so its summary never reads "running" and the first grid's report, written
    meanwhile, has every row."""
    from graftzoo.training import trainer
    spec, out, _ = ran
    grid = G.load_grid(spec, str(out))
    cell = grid.cell("rloo-micro-s1")
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in cell.run_dir.rglob("*")
             if p.is_file() and p.name != ".lock"}
    seen = []
    real_summary = trainer.write_summary
    monkeypatch.setattr(trainer, "write_summary", lambda d, s: (seen.append(s["status"]), real_summary(d, s)))
    assert G.run_cell_inprocess(cell, "resume", None, tmp_path) is None
    assert seen == []   # no status written, "running" included
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == files
    report = G.write_report(grid, G.select_cells(grid, ()), echo=lambda _: None, warn=lambda _: None)
    table = (report / "table1.md").read_text()
    assert "| RLOO | 4 |" in table and "| grpo | 4 |" in table


def _offline_report_runs(grid_dir: Path) -> list:
    """The offline wandb runs of a grid's report: (folder, its Table 1 as {"columns", "data"})."""
    out = []
    for run in sorted((grid_dir / "report" / "wandb").glob("offline-run-*")):
        tables = list(run.glob("files/media/table/table1_*.table.json"))
        out.append((run, json.loads(tables[0].read_text()) if len(tables) == 1 else None))
    return out


def test_the_grid_logs_its_report_to_wandb(ran, tmp_path):
    """A grid whose runs track to wandb (run.track, offline without an API key) logs its Table 1, Δ vs the baseline
    per method, to a wandb run of job_type "report" in the grid's group; ``report: {wandb: false}`` keeps it off."""
    wandb = pytest.importorskip("wandb")
    _, out, _ = ran
    for name in CELLS:   # the finished cells, rerun (skipped) under a grid that tracks them
        shutil.copytree(out / name, tmp_path / name, ignore=shutil.ignore_patterns(".lock"))
    tracked = {**TINY["set"], "run.track": True}
    spec = write_grid(tmp_path / "t.yaml", set=tracked, report={"baseline": "grpo", "wandb": False})
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path), "--in-process"])
    assert res.exit_code == 0, res.output
    assert "grid t: 4 skipped" in res.output and not (tmp_path / "report" / "wandb").exists()

    spec = write_grid(tmp_path / "t.yaml", set=tracked)
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path), "--in-process"])
    assert res.exit_code == 0, res.output
    [(run, table)] = _offline_report_runs(tmp_path)
    assert f"report logged to wandb: {run}" in res.output and "wandb sync" in res.output
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert sorted((r["model"], r["method"]) for r in rows) == sorted(
        (m, x) for m in ("micro-qwen-char", "micro-gpt2-pair") for x in ("grpo", "RLOO"))
    csv_rows = (tmp_path / "report" / "table1.csv").read_text().splitlines()   # the grid's Table 1, Δ included
    assert table["columns"] == csv_rows[0].split(",") and "delta" in table["columns"] and len(rows) == len(csv_rows) - 1
    wandb.teardown()   # wandb's service process writes the transaction log: stopped, it has written it all
    [info] = [r.run for r in wandb_records(next(run.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "run"]
    assert (info.job_type, info.run_group, info.display_name) == ("report", "t", "t-report")


def test_unfinished_cell_is_resumed(ran, tmp_path):
    spec, out, _ = ran
    grid = G.load_grid(spec, str(out))
    cell = grid.cell("rloo-micro-s1")
    assert G.cell_status(cell, None) == "done"
    fake = G.Cell(**{**cell.__dict__, "run_dir": tmp_path / "partial"})
    assert G.cell_status(fake, None) == "new"
    (fake.run_dir / "checkpoints").mkdir(parents=True)
    (fake.run_dir / "summary.json").write_text(json.dumps({"status": "running"}))
    assert G.cell_status(fake, None) == "resume"
    assert G.resume_note(fake) == "no checkpoint yet: training starts from the beginning"
    assert G.resume_note(cell) == "training resumes from its last checkpoint (step 0)"
    assert G.cell_status(cell, {"benchmarks": "heldout", "k": 1}) == "evaluate"   # no eval files for that request


@pytest.mark.slow
def test_stored_peer_dependency_and_a_failed_cell(ran):
    """Child processes, two at a time: a cell reads the stored trajectories of another cell's run; a
    failing cell is reported by name, the grid goes on and exits non-zero."""
    _, out, _ = ran
    spec = write_grid(out.parent / "t2.yaml", variants=[
        {"label": "RLOO", "algo": "rloo"},
        {"label": "GRPO (stored peer)", "algo": "grpo", "peer": "stored:{cell:grpo}", "each_model": True},
        {"label": "Broken", "algo": "grpo", "peer": "stored:no/such/run"}])
    stored = "grpo-stored-peer-micro-qwen-char-micro-s0"
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(out), "--only", "broken-micro-s0",
                                    "--only", stored, "--jobs", "2"])
    assert res.exit_code == 1, res.output
    assert "[FAILED] broken-micro-s0" in res.output and "failed or blocked cells: broken-micro-s0" in res.output
    assert "[skipped] grpo-micro-s0: done" in res.output   # the dependency, pulled in by --only
    assert res.output.index("[skipped] grpo-micro-s0") < res.output.index(f"[done] {stored}")
    summary = json.loads((out / stored / "summary.json").read_text())
    assert summary["status"] == "done" and summary["models"] == ["micro-qwen-char"]
    assert summary["peer_source"] == "stored" and summary["peers"] == {"micro-qwen-char": "micro-gpt2-pair"}
    raw = yaml.safe_load((out / stored / "config.yaml").read_text())
    assert Path(raw["peer"]["path"]) == out / "grpo-micro-s0"
    assert "no/such/run" in (out / "logs" / "broken-micro-s0.log").read_text()


@pytest.mark.slow
def test_eval_stage_on_a_trained_cell(ran, tmp_path):
    """With an eval block, a trained cell without matching eval files only gets evaluated
    (graftzoo eval in a child process); afterwards it counts as done."""
    _, out, _ = ran
    shutil.copytree(out / "grpo-micro-s0", tmp_path / "grpo-micro-s0")
    spec = write_grid(tmp_path / "t.yaml", eval={"benchmarks": ["heldout", "arithmetic"], "k": 1, "limit": 2,
                                                 "greedy": False, "seed": 3})
    grid = G.load_grid(spec, str(tmp_path))
    cell = grid.cell("grpo-micro-s0")
    assert G.cell_status(cell, grid.eval) == "evaluate"
    mtime = (cell.run_dir / "metrics.jsonl").stat().st_mtime_ns
    trainer_eval = (cell.run_dir / "eval" / "micro-qwen-char.json").read_bytes()
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path), "--only", "grpo-micro-s0"])
    assert res.exit_code == 0, res.output
    assert "[evaluate] grpo-micro-s0" in res.output and "[done] grpo-micro-s0" in res.output
    assert (cell.run_dir / "metrics.jsonl").stat().st_mtime_ns == mtime
    payload = json.loads((cell.run_dir / "eval" / "grid" / "micro-qwen-char.json").read_text())
    assert set(payload["benchmarks"]) == {"heldout", "arithmetic"} and payload["sampling"]["seed"] == 3
    assert payload["benchmarks"]["arithmetic"]["n_items"] == 2 and "greedy" not in payload["benchmarks"]["arithmetic"]
    assert G.cell_status(cell, grid.eval) == "done"
    assert (cell.run_dir / "eval" / "micro-qwen-char.json").read_bytes() == trainer_eval  # the trainer's, kept
    table = (tmp_path / "report" / "table1.md").read_text()
    assert "heldout" in table and "arithmetic" in table


def test_in_process_failure_is_reported(tmp_path):
    spec = write_grid(tmp_path / "t.yaml", algorithms=[], variants=[
        {"label": "Broken", "algo": "grpo", "peer": "stored:no/such/run"}])
    grid = G.load_grid(spec, str(tmp_path / "out"))
    lines = []
    assert G.run_grid(grid, grid.cells, in_process=True, echo=lines.append) == {
        "broken-micro-s0": "failed", "broken-micro-s1": "failed"}
    assert any(line.startswith("[FAILED] broken-micro-s1") and "no/such/run" in line for line in lines)


def test_dry_run_runs_nothing(tmp_path):
    spec = write_grid(tmp_path / "t.yaml")
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path / "out"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "4 cell(s)" in res.output and "[new] rloo-micro-s1" in res.output
    assert "graftzoo train --algo rloo --pair micro" in res.output
    assert not (tmp_path / "out").exists()
    bad = write_grid(tmp_path / "bad.yaml", variants=[{"label": "X", "algo": "grpo", "set": {"algo.nope": 1}}])
    res = CliRunner().invoke(main, ["grid", str(bad), "--out", str(tmp_path / "out"), "--dry-run"])
    assert res.exit_code == 2 and "config error in cell x-micro-s0" in res.output and "algo.nope" in res.output


def test_graft_table1_expansion():
    grid = G.load_grid(CONFIGS / "graft_table1.yaml")
    assert grid.name == "graft_table1" and grid.eval["benchmarks"] == "all"
    names = [c.name for c in grid.cells]
    assert len(names) == len(set(names)) == 3 * (4 + 11 + 2)
    labels = [m.label for m in grid.methods]
    assert labels[:4] == ["GRPO (n=8)", "GRPO (n=16)", "GRPO (n=32)", "GRPO (n=8) + DS"]
    assert set(labels) == set(TABLE_ROWS) and len(labels) == len(TABLE_ROWS)   # every paper row, spec labels
    ov = {m.label: m.overrides for m in grid.methods}
    assert ov["w/o compatibility gate"] == {"algo.delta": 0.0} and ov["w/o token-level ratio"] == {
        "algo.token_ratio": "none"}
    assert ov["w/o balanced exchange"] == {"algo.select": "sgt_rescue"}       # successes only
    assert ov["Count-matched random prompt selection"] == {"algo.select": "random_count_matched"}
    assert ov["Count-matched random response admission"] == {"algo.admission": "random_count_matched"}
    assert ov["First"] == {"algo.peer_position": "first"} and ov["Uniform"] == {"algo.peer_position": "uniform"}
    assert ov["HACPO + GRAFT which"] == {"algo.select": "graft_which"} and ov["GRAFT"] == {}
    alias = {m.label: m.same_as for m in grid.methods if m.same_as}
    assert alias == {"Last": "GRAFT", "SGT + GRAFT how": "w/o balanced exchange"}   # one configuration, two names
    assert not [c for c in grid.cells if c.label in alias]                          # no second set of runs
    which = grid.cell("hacpo-graft-which-pair1-s0").config()
    assert which.algo.name == "hacpo" and which.algo.select == "graft_which"
    graft = grid.cell("graft-pair1-s0").config().algo
    assert (graft.select, graft.balance, graft.max_peer_frac) == ("complementary", "none", 1.0)
    gate = grid.cell("w-o-compatibility-gate-pair1-s2")
    assert gate.overrides["algo.delta"] == 0.0 and gate.overrides["peer.source"] == "online"
    assert gate.overrides["run.tags"] == ["graft", "pair1", "s2"]
    assert gate.overrides["run.wandb_group"] == "graft_table1"
    stored = [c for c in grid.cells if c.label == "GRAFT (stored)"]
    assert len(stored) == 6 and {c.overrides["pair.train"][0] for c in stored} == {
        "HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base"}
    for c in stored:
        dep = f"grpo-n8-pair1-s{c.seed}"
        assert c.depends == [dep] and c.overrides["peer.path"] == str(grid.root / dep)
        assert names.index(dep) < names.index(c.name)
    assert G.check_configs(grid.cells) == {}


def test_tiny_table1_configs_load():
    grid = G.load_grid("tiny_table1")
    assert {c.pair for c in grid.cells} == {"micro"} and len(grid.cells) == 3 * (4 + 11 + 2)
    full = G.load_grid(CONFIGS / "graft_table1.yaml")
    budget = lambda o: {k: v for k, v in o.items() if k != "rollout.n"}  # noqa: E731 - the twin's n is set apart
    assert [(m.label, m.algo, budget(m.overrides), m.same_as) for m in grid.methods] == [
        (m.label, m.algo, m.overrides, m.same_as) for m in full.methods]    # the same rows as graft_table1
    assert G.check_configs(grid.cells) == {}
    # like for like: every method at the baseline's n=8 (the micro pair's own is 4), the larger budgets by design
    n = {c.label: load_config(pair=c.pair, algo=c.algo, overrides=c.override_args()).rollout.n for c in grid.cells}
    assert n == {label: {"GRPO (n=16)": 16, "GRPO (n=32)": 32}.get(label, 8) for label in n}, n


def test_alias_entry_and_its_report_rows(tmp_path):
    """``{label, same_as}``: no cells, listed by --dry-run, and the report repeats the runs under the alias."""
    spec = write_grid(tmp_path / "t.yaml", seeds=[0], variants=[{"label": "RLOO", "algo": "rloo"},
                                                                {"label": "RLOO again", "same_as": "RLOO"}])
    grid = G.load_grid(spec, str(tmp_path / "out"))
    assert [c.name for c in grid.cells] == ["grpo-micro-s0", "rloo-micro-s0"]
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path / "out"), "--dry-run"])
    assert res.exit_code == 0 and "  RLOO again: the runs of 'RLOO', under a second label" in res.output
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path / "out"), "--in-process"])
    assert res.exit_code == 0, res.output
    table = (tmp_path / "out" / "report" / "table1.md").read_text()
    line = next(x for x in table.splitlines() if x.startswith("| RLOO |"))
    assert line.replace("| RLOO |", "| RLOO again |", 1) in table and "RLOO again = RLOO (the same runs)." in table


@pytest.mark.parametrize("change, message", [
    ({"pairs": []}, "'pairs'"),
    ({"colour": 1}, "unknown key"),
    ({"variants": [{"label": "grpo", "algo": "rloo"}]}, "repeat"),
    ({"variants": [{"label": "A", "algo": "grpo", "peer": "stored:{cell:Nope}"}]}, "no method has that label"),
    ({"variants": [{"label": "A", "algo": "grpo", "peer": "stored:{cell:A}"}]}, "cycle"),
    ({"variants": [{"label": "A", "algo": "grpo", "peer": "stored"}]}, "needs a path"),
    ({"variants": [{"label": "A", "algo": "grpo", "sett": {}}]}, "unknown key"),
    ({"variants": [{"label": "G-R-P-O", "algo": "rloo"}], "algorithms": [{"label": "g r p o", "algo": "grpo"}]},
     "both name a run"),
    ({"eval": {"benchmark": "all"}}, "unknown option"),
    ({"variants": [{"label": "A", "same_as": "Nope"}]}, "not the label of a method with runs"),
    ({"variants": [{"label": "A", "same_as": "grpo"}, {"label": "B", "same_as": "A"}]}, "'A', which is not"),
    ({"variants": [{"label": "A", "same_as": "grpo", "algo": "grpo"}]}, "exactly 'label' and 'same_as'"),
    ({"variants": [{"label": "grpo", "same_as": "grpo"}]}, "repeat"),
    ({"report": {"wandb": "no"}}, "report.wandb must be true or false"),
])
def test_grid_file_errors_name_the_key(tmp_path, change, message):
    spec = write_grid(tmp_path / "bad.yaml", **change)
    with pytest.raises(G.GridError, match=message) as e:
        G.load_grid(spec)
    assert str(spec) in str(e.value)


def test_slug():
    assert G.slug("GRPO (n=8) + DS") == "grpo-n8-ds" and G.slug("GRAFT w/o gate") == "graft-w-o-gate"
    assert G.slug("SGT (aux_nll)") == "sgt-aux_nll" and G.slug("Qwen3-1.7B-Base") == "qwen3-1.7b-base"
    with pytest.raises(G.GridError, match="no letters or digits"):
        G.slug("(._.)")


@pytest.mark.parametrize("value, want", [
    ("online", {"peer.source": "online"}), ("none", {"peer.source": "none"}),
    ("stored:runs/a", {"peer.source": "stored", "peer.path": "runs/a"}),
    ("mixed:{cell:GRPO}", {"peer.source": "mixed", "peer.path": "{cell:GRPO}"}),
])
def test_peer_values_parse_in_one_place(value, want):
    assert parse_peer(value) == want


@pytest.mark.parametrize("value, message", [("stored:", "stored needs a path"), ("bogus", "must be online"),
                                            ("online:x", "online takes no path")])
def test_malformed_peer_is_one_line_naming_the_option(value, message):
    with pytest.raises(PeerOptionError, match=message):
        parse_peer(value)
    res = CliRunner().invoke(main, ["train", "--algo", "grpo", "--pair", "micro", "--peer", value])
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "'--peer'" in errors[0] and message in errors[0], res.output


def _first_line_error(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, output
    return errors[0]


def test_rerun_after_the_settings_changed_is_refused_or_reruns_the_changed_cells(ran, tmp_path):
    """Finished cells are compared with what the grid would run now: unchanged they are skipped; a changed
    trajectory key or run length is refused naming the cell and old -> new, unless --rerun-changed."""
    _, out, _ = ran
    for name in ("grpo-micro-s0", "rloo-micro-s0"):
        shutil.copytree(out / name, tmp_path / name)
    spec = write_grid(tmp_path / "t.yaml", seeds=[0])
    mtime = (tmp_path / "grpo-micro-s0" / "metrics.jsonl").stat().st_mtime_ns
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path), "--no-report"])
    assert res.exit_code == 0 and "[skipped] grpo-micro-s0: done" in res.output, res.output

    changed = write_grid(tmp_path / "t.yaml", seeds=[0], set={**TINY["set"], "optim.lr": 2e-5, "run.steps": 2})
    res = CliRunner().invoke(main, ["grid", str(changed), "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    line = _first_line_error(res.output)
    assert "grpo-micro-s0, rloo-micro-s0" in line and "--rerun-changed" in line
    assert "optim.lr: 0.0001 → 2e-05" in line and "run.steps: 1 → 2" in line
    assert (tmp_path / "grpo-micro-s0" / "metrics.jsonl").stat().st_mtime_ns == mtime   # nothing ran
    res = CliRunner().invoke(main, ["grid", str(changed), "--out", str(tmp_path), "--dry-run"])
    assert res.exit_code == 2 and "[changed] grpo-micro-s0: optim.lr: 0.0001 → 2e-05" in res.output

    res = CliRunner().invoke(main, ["grid", str(changed), "--out", str(tmp_path), "--only", "grpo-micro-s0",
                                    "--rerun-changed", "--in-process", "--no-report"])
    assert res.exit_code == 0, res.output
    assert "[changed] grpo-micro-s0" in res.output and "[done] grpo-micro-s0" in res.output
    raw = yaml.safe_load((tmp_path / "grpo-micro-s0" / "config.yaml").read_text())
    assert raw["optim"]["lr"] == 2e-5 and raw["run"]["steps"] == 2
    [old] = tmp_path.glob("grpo-micro-s0.replaced-*")                      # moved aside, as --overwrite does
    assert yaml.safe_load((old / "config.yaml").read_text())["optim"]["lr"] == 1e-4
    res = CliRunner().invoke(main, ["grid", str(changed), "--out", str(tmp_path), "--only", "grpo-micro-s0"])
    assert res.exit_code == 0 and "[skipped] grpo-micro-s0: done" in res.output, res.output


def _grid_process(tmp_path):
    """A one-cell grid started as a user types it, its train child (found under /proc) and its first checkpoint."""
    spec = write_grid(tmp_path / "t.yaml", seeds=[0], algorithms=[], variants=[{"label": "RLOO", "algo": "rloo"}],
                      set={**TINY["set"], "run.steps": 15, "run.save_every": 1})
    cmd = [str(Path(sys.executable).parent / "graftzoo"), "grid", str(spec), "--out", str(tmp_path / "out"),
           "--no-report"]
    grid = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpts, deadline = tmp_path / "out" / "rloo-micro-s0" / "checkpoints", time.time() + 180
    while time.time() < deadline:
        kids = [int(pid) for task in Path(f"/proc/{grid.pid}/task").glob("*")
                for pid in (task / "children").read_text().split()] if grid.poll() is None else []
        if kids and ckpts.is_dir() and any(p.name.startswith("step_") for p in ckpts.iterdir()):
            [child] = kids
            assert " train " in Path(f"/proc/{child}/cmdline").read_text().replace("\0", " ")
            return cmd, grid, child
        time.sleep(0.2)
    grid.kill()
    pytest.fail(f"the grid's train child never wrote a checkpoint:\n{grid.communicate()[0]}")


def _gone(pid: int, within: float) -> bool:
    """The process ended (no /proc entry, or a zombie no one reaps) within ``within`` seconds."""
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killed_grid_takes_its_train_child_along_and_the_rerun_resumes(tmp_path):
    cmd, grid, child = _grid_process(tmp_path)
    os.kill(grid.pid, signal.SIGKILL)
    grid.communicate()
    try:
        assert _gone(child, 5), "the train child outlived the killed grid"
    finally:
        if not _gone(child, 0.1):
            os.kill(child, signal.SIGKILL)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "[resume] rloo-micro-s0 (training resumes from its last checkpoint" in rerun.stdout
    assert "[done] rloo-micro-s0" in rerun.stdout and "FAILED" not in rerun.stdout


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the child under /proc")
def test_sigterm_to_a_grid_stops_its_child_with_a_checkpoint(tmp_path):
    _, grid, child = _grid_process(tmp_path)
    grid.send_signal(signal.SIGTERM)
    output = grid.communicate(timeout=120)[0]
    assert grid.returncode == 143, output
    assert _gone(child, 5)
    assert "[interrupted] rloo-micro-s0" in output and "FAILED" not in output
    assert "Error: grid interrupted by SIGTERM; stopped: rloo-micro-s0; rerun the same command to resume" in output
    summary = json.loads((tmp_path / "out" / "rloo-micro-s0" / "summary.json").read_text())
    assert summary["status"] == "interrupted"


def test_each_cell_says_its_place_as_it_starts_and_its_time_as_it_ends(ran, tmp_path):
    """The grid's progress: "cell i/N" as each cell starts, its outcome, time and "i of N cells ended" as it ends;
    a cell that does not run (done already) says its place too."""
    _, out, res = ran
    started = re.findall(r"^\[new\] (\S+) \(cell (\d)/4\)$", res.output, re.M)
    assert sorted(n for n, _ in started) == sorted(CELLS) and [int(i) for _, i in started] == [1, 2, 3, 4]
    ended = re.findall(r"^\[done\] (\S+) \(\d+ s; (\d) of 4 cells ended\)$", res.output, re.M)
    assert ended == [(n, str(i)) for i, (n, _) in enumerate(started, 1)], res.output   # one at a time, in order
    for name in CELLS:
        shutil.copytree(out / name, tmp_path / name, ignore=shutil.ignore_patterns(".lock"))
    again = CliRunner().invoke(main, ["grid", str(write_grid(tmp_path / "t.yaml")), "--out", str(tmp_path),
                                      "--in-process", "--no-report"])
    assert again.exit_code == 0, again.output
    assert re.findall(r"^\[skipped\] (\S+): done \(cell (\d)/4\)$", again.output, re.M) == \
        [(n, str(i)) for i, (n, _) in enumerate(started, 1)], again.output
