"""``graftzoo demo``: GRAFT against GRPO on a heterogeneous tiny pair, on CPU, reported as the paper would.

1. builds and warms up the tiny pair (different architectures and tokenizers; cached on disk);
2. measures complementarity on held-out prompts: the fraction of each model's all-fail prompts that
   the peer solves, and the fraction where the peer's group is mixed;
3. runs GRPO n=8 and GRAFT n=8 co-training, plus GRAFT n=8 from the stored trajectories of the GRPO run
   (``--full`` adds GRPO n=16/32, the named ablations and more seeds);
4. prints the Table-1-style report with Delta, writes the PNG plots and the wandb offline runs;
5. ends with a plain-language paragraph saying what the numbers show.

The plan (steps, prompts per step, seeds, eval size per mode) lives in configs/demo/demo.yaml (packaged in
graftzoo/configs; a ./configs/demo/ of the current directory overrides it).
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import click
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from graftzoo.apps.grid import load_grid, run_grid, write_report
from graftzoo.core.config import find_config, load_config, read_yaml
from graftzoo.core.models import build_engine, build_policy, split_spec
from graftzoo.envs.task import Task
from graftzoo.eval.artifacts import eval_path
from graftzoo.eval.compute import joint_charge
from graftzoo.tiny.build import TinyModelSpec
from graftzoo.tiny.warmup import warmup_info, warmup_pair


def _steps_logged(run_dir: Path) -> int:
    f = run_dir / "metrics.jsonl"
    if not f.exists():
        return 0
    steps = set()
    for line in f.read_text().splitlines():
        try:
            steps.add(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return len([s for s in steps if s >= 0])


def run_with_progress(grid, cells, jobs: int, console) -> dict:
    """``graftzoo.apps.grid.run_grid`` with a rich progress bar per run (steps logged / steps)."""
    stop = threading.Event()
    with Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        tasks = {c.name: bar.add_task(c.name, total=int(c.config()["run"]["steps"])) for c in cells}

        def poll():
            while not stop.wait(1.0):
                for c in cells:
                    bar.update(tasks[c.name], completed=min(_steps_logged(c.run_dir), bar.tasks[tasks[c.name]].total))

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            result = run_grid(grid, cells, jobs=jobs, echo=bar.console.print)
        finally:
            stop.set()
            t.join()
            for c in cells:
                bar.update(tasks[c.name], completed=min(_steps_logged(c.run_dir), bar.tasks[tasks[c.name]].total))
    return result


def measure_complementarity(pair: str, n: int = 8, size: int = 128, seed: int = 0) -> dict:
    """Per model: fraction of its all-fail held-out prompts that the peer solves / where the peer's group is mixed."""
    cfg = load_config(pair=pair, algo="grpo", overrides=["run.track=false"])
    env = Task(cfg).make_env("test", size=size)
    prompts = list(env.dataset)
    groups = {}
    for spec in cfg["pair"]["models"]:
        pol = build_policy(spec, cfg, seed)
        engine = build_engine(pol, cfg)
        try:
            torch.manual_seed(seed)
            groups[spec["id"]] = {g.prompt.id: g for g in env.score_groups(engine.generate(prompts, n))}
        finally:
            engine.close()
    ids = list(groups)
    out = {}
    for m in ids:
        other = groups[ids[1 - ids.index(m)]]
        dead = [pid for pid, g in groups[m].items() if g.all_fail]
        by_skill = {}
        for p in prompts:
            by_skill.setdefault(p.metadata.get("skill", "all"), []).append(groups[m][p.id].num_correct / n)
        out[m] = {"pass@1": statistics.fmean(g.num_correct / n for g in groups[m].values()),
                  "pass@1_by_skill": {k: statistics.fmean(v) for k, v in by_skill.items()},
                  "all_fail_frac": len(dead) / len(prompts),
                  "peer_solves_all_fail": (sum(other[p].num_correct > 0 for p in dead) / len(dead)) if dead else None,
                  "peer_mixed_on_all_fail": (sum(other[p].mixed for p in dead) / len(dead)) if dead else None}
    return out


def _avg(run_dirs: list, model: str):
    vals = []
    for d in run_dirs:
        f = eval_path(d, model)
        if f.exists():
            bench = json.loads(f.read_text())["benchmarks"]
            vals.append(statistics.fmean(v["avg"] for v in bench.values()))
    return vals


def _charge(run_dirs: list, model: str):
    vals = []
    for d in run_dirs:
        f = Path(d) / "summary.json"
        if f.exists():
            charge = joint_charge(json.loads(f.read_text())).get(model)
            if charge:
                vals.append(charge["charged"]["cpu_s"])
    return statistics.fmean(vals) if vals else None


def conclusion(cells: list, model_ids: list) -> str:
    """A plain-language paragraph stating the comparisons, whatever they turn out to be."""
    by_label: dict = {}
    for c in cells:
        by_label.setdefault(c.label, []).append(c.run_dir)
    lines = []
    for m in model_ids:
        grpo = _avg(by_label.get("GRPO (n=8)", []), m)
        graft = _avg(by_label.get("GRAFT", []), m)
        stored = _avg(by_label.get("GRAFT (stored)", []), m)
        if not grpo or not graft:
            continue
        g0, g1 = statistics.fmean(grpo), statistics.fmean(graft)
        if not any(grpo + graft + stored):  # nothing learned to compare: say so, no verdict
            lines.append(f"For {m}, every score is 0 (GRPO n=8, GRAFT n=8"
                         f"{', stored GRAFT' if stored else ''}): these runs are too short to learn the task, so they "
                         f"check the pipeline, not the methods; no method is compared.")
            continue
        sd = max(statistics.stdev(grpo) if len(grpo) > 1 else 0.0, statistics.stdev(graft) if len(graft) > 1 else 0.0)
        spread = f"seed s.d. {100 * sd:.1f} over {len(grpo)} seeds" if len(grpo) > 1 else "one seed"
        gain = g1 - g0 > 0.005  # half a point: below that the runs tie on a 200-prompt eval
        if gain and len(grpo) > 1 and g1 - g0 > sd:
            verdict = "GRAFT beats GRPO by more than the seeds' standard deviation"
        elif gain:
            verdict = ("GRAFT is above GRPO, but not by more than the seeds' standard deviation" if len(grpo) > 1
                       else "GRAFT is above GRPO in this single seed (no claim beyond this run)")
        else:
            verdict = "GRAFT does not beat GRPO (the two tie within half a point)" if g1 >= g0 else \
                "GRAFT does not beat GRPO"
        txt = (f"For {m}, GRAFT n=8 scores {100 * g1:.1f} against GRPO n=8's {100 * g0:.1f} on held-out accuracy "
               f"(Δ {100 * (g1 - g0):+.1f} points; {spread}), so {verdict}.")
        if stored:
            s1 = statistics.fmean(stored)
            txt += f" Stored-trajectory GRAFT scores {100 * s1:.1f}" + (
                f", {100 * (s1 - g0) / (g1 - g0):.0f}% of the online gain." if gain else
                "; online GRAFT showed no gain to share.")
        g32 = _avg(by_label.get("GRPO (n=32)", []), m)
        if g32:
            c8, c32 = _charge(by_label["GRAFT"], m), _charge(by_label["GRPO (n=32)"], m)
            frac = f"{c8 / c32:.2f}" if c8 and c32 else "?"
            txt += (f" GRPO n=32 reaches {100 * statistics.fmean(g32):.1f}; GRAFT n=8 "
                    f"{'reaches' if g1 >= statistics.fmean(g32) else 'does not reach'} it, at {frac}× its CPU time "
                    f"(co-trained runs charged the joint cost of both models).")
        lines.append(txt)
    return "\n".join(lines) if lines else "No comparison available (runs missing or failed)."


def _demo_file(name: str) -> Path:
    """configs/demo/NAME.yaml: a user's ./configs first, then the package's (graftzoo.core.config.find_config)."""
    path = find_config("demo", name)
    if path is None:
        raise click.ClickException(f"no demo config {name!r}: configs/demo/{name}.yaml is neither in ./configs nor "
                                   f"in the installed package")
    return path


@click.command("demo")
@click.option("--quick", is_flag=True, help="a < 2 minute smoke version on the micro pair (tests use it)")
@click.option("--full", is_flag=True, help="adds GRPO n=16/32, the named ablations and 3 seeds")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(), help="parent folder of the demo runs")
@click.option("--jobs", default=2, show_default=True, help="runs in parallel (one torch thread each)")
def demo_cmd(quick, full, out, jobs):
    """GRAFT vs GRPO on a heterogeneous tiny pair, on CPU, with the paper's table and plots."""
    console = Console()
    t0 = time.time()
    mode = "full" if full else "quick" if quick else "default"
    plan = read_yaml(_demo_file("demo"))[mode]
    grid = load_grid(_demo_file(plan["grid"]), out=str(Path(out) / mode))
    pair = grid.cells[0].pair
    cfg = load_config(pair=pair, algo="grpo", overrides=["run.track=false"])
    specs = cfg["pair"]["models"]
    model_ids = [s["id"] for s in specs]
    console.rule(f"[bold]graftzoo demo ({mode}): pair '{pair}' = {' ↔ '.join(model_ids)}")
    console.print("1. building and warming up the tiny pair (cached after the first time) ...")
    paths = warmup_pair([TinyModelSpec.from_dict(split_spec(s)[0]) for s in specs])
    for m, p in zip(model_ids, paths):
        info = warmup_info(p)
        console.print(f"   {m}: {info.get('spec', {}).get('family')} + {info.get('spec', {}).get('tokenizer')} tokenizer, "
                      f"probe after warm-up {info.get('probe_greedy')}")
    console.print("2. complementarity on held-out prompts (n=8 samples per prompt) ...")
    comp = measure_complementarity(pair, n=8, size=plan["complementarity_size"])
    grid.root.mkdir(parents=True, exist_ok=True)
    (grid.root / "complementarity.json").write_text(json.dumps(comp, indent=1))

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.0f}%"
    for m, c in comp.items():
        console.print(f"   {m}: pass@1 {pct(c['pass@1'])} "
                      f"({', '.join(f'{k} {pct(v)}' for k, v in c['pass@1_by_skill'].items())}); all-fail prompts "
                      f"{pct(c['all_fail_frac'])}; the peer solves {pct(c['peer_solves_all_fail'])} of them and its "
                      f"group is mixed on {pct(c['peer_mixed_on_all_fail'])}")
    console.print(f"3. {len(grid.cells)} training runs, {jobs} at a time (logs in {grid.root / 'logs'}) ...")
    result = run_with_progress(grid, grid.cells, jobs, console)
    console.print("4. report")
    report = write_report(grid, grid.cells, echo=console.print)
    text = conclusion(grid.cells, model_ids)
    if report is not None:
        (report / "conclusion.txt").write_text(text + "\n")
    console.rule("5. what the numbers show")
    console.print(text)
    console.print(f"\nwandb offline runs: {grid.root}/*/wandb; total {time.time() - t0:.0f} s")
    failed = [n for n, r in result.items() if r in ("failed", "blocked")]
    if failed:
        raise click.ClickException(f"failed runs: {', '.join(failed)}")
