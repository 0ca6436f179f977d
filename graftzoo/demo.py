"""``graftzoo demo``: GRAFT against GRPO on a heterogeneous tiny pair, on CPU, reported as the paper would.

1. builds and warms up the tiny pair (different architectures and tokenizers; cached on disk);
2. measures complementarity on held-out prompts: the fraction of each model's all-fail prompts that
   the peer solves, and the fraction where the peer's group is mixed;
3. runs GRPO n=8 and GRAFT n=8 co-training, plus GRAFT n=8 from the stored trajectories of the GRPO run
   (``--full`` adds GRPO n=16/32, the named ablations and more seeds);
4. prints the Table-1-style report with Delta, writes the PNG plots and the wandb offline runs;
5. ends with a plain-language paragraph saying what the numbers show.

The plan (steps, prompts per step, seeds, eval size per mode) lives in configs/demo.yaml.
"""
from __future__ import annotations

import json
import multiprocessing
import statistics
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import click

from graftzoo.config import find_config, load_config, read_yaml


@dataclass
class Cell:
    label: str
    algo: str
    seed: int
    overrides: list = field(default_factory=list)
    after: list = field(default_factory=list)   # names of cells that must finish first

    @property
    def name(self) -> str:
        slug = "".join(c if c.isalnum() else "-" for c in self.label.lower()).strip("-")
        while "--" in slug:
            slug = slug.replace("--", "-")
        return f"{slug}-s{self.seed}"


def demo_plan(mode: str, plan_cfg: dict, model_ids: list, out: Path, seeds=None) -> list:
    p = plan_cfg[mode]
    seeds = seeds or p["seeds"]
    base = [f"run.steps={p['steps']}", f"task.prompts_per_step={p['prompts_per_step']}",
            f"eval.size={p['eval_size']}", f"eval.k={p['eval_k']}", "run.progress=false",
            f"run.out_dir={out / 'runs'}", "run.wandb_group=demo", "run.save_every=0"]
    base += [f"{k}={v}" for k, v in (p.get("set") or {}).items()]
    cells = []
    a, b = model_ids
    for s in seeds:
        common = base + [f"run.seed={s}"]
        grpo = Cell("GRPO (n=8)", "grpo_n8", s, common)
        cells.append(grpo)
        cells.append(Cell("GRAFT", "graft", s, common + ["peer.source=online", "run.variant=GRAFT"]))
        for learner, peer in ((a, b), (b, a)):
            cells.append(Cell(f"GRAFT (stored) {learner}", "graft", s, common + [
                f"pair.train=[{learner}]", "peer.source=stored", f"peer.path={out / 'runs' / grpo.name}",
                f"peer.model={peer}", "run.variant=GRAFT (stored)"], after=[grpo.name]))
        if mode == "full":
            for n in (16, 32):
                cells.append(Cell(f"GRPO (n={n})", f"grpo_n{n}", s, common))
            for label, sets in (("GRAFT w/o gate", ["algo.delta=0.0"]), ("GRAFT w/o balance", ["algo.balance=none"]),
                                ("GRAFT w/o token ratio", ["algo.token_ratio=none"]),
                                ("GRAFT peer first", ["algo.peer_position=first"])):
                cells.append(Cell(label, "graft", s, common + ["peer.source=online", f"run.variant={label}"] + sets))
    for c in cells:
        c.overrides.append(f"run.name={c.name}")
    return cells


def _run_cell(pair: str, algo: str, overrides: list, track: bool) -> str:
    import torch
    torch.set_num_threads(1)
    from graftzoo.trainer import train
    cfg = load_config(pair=pair, algo=algo, overrides=overrides + ([] if track else ["run.track=false"]))
    return str(train(cfg))


def _done(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status") == "done"
    except (OSError, ValueError):
        return False


def run_cells(cells: list, pair: str, out: Path, jobs: int, track: bool, console) -> list:
    """Run cells (dependencies first), ``jobs`` at a time, with a rich progress bar per cell."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    runs_dir = out / "runs"
    pending = list(cells)
    running, failed = {}, []
    ctx = multiprocessing.get_context("spawn")
    with Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar, ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        tasks = {}
        for c in cells:
            steps = int(next(o for o in c.overrides if o.startswith("run.steps=")).split("=")[1])
            tasks[c.name] = bar.add_task(c.label + f" s{c.seed}", total=steps)
            if _done(runs_dir / c.name):
                bar.update(tasks[c.name], completed=steps, description=f"{c.label} s{c.seed} (cached)")
        pending = [c for c in pending if not _done(runs_dir / c.name)]
        while pending or running:
            finished = {n for n in (c.name for c in cells) if _done(runs_dir / n)}
            ready = [c for c in pending if all(a in finished for a in c.after)]
            while ready and len(running) < jobs:
                c = ready.pop(0)
                pending.remove(c)
                running[pool.submit(_run_cell, pair, c.algo, c.overrides, track)] = c
            if not running:
                failed += [c.name for c in pending]
                break
            done, _ = wait(list(running), timeout=1.0, return_when=FIRST_COMPLETED)
            for c in running.values():
                mfile = runs_dir / c.name / "metrics.jsonl"
                if mfile.exists():
                    steps_seen = {json.loads(x)["step"] for x in mfile.read_text().splitlines() if x.strip()}
                    bar.update(tasks[c.name], completed=len([s for s in steps_seen if s >= 0]))
            for f in done:
                c = running.pop(f)
                try:
                    f.result()
                except Exception as e:  # a failed cell is reported by name; the others go on
                    failed.append(c.name)
                    console.print(f"[red]run {c.name} failed: {type(e).__name__}: {e}")
    return failed


def measure_complementarity(pair: str, n: int = 8, size: int = 128, seed: int = 0) -> dict:
    """Per model: fraction of its all-fail held-out prompts that the peer solves / where the peer's group is mixed."""
    import torch

    from graftzoo.models import build_engine, build_policy
    from graftzoo.trainer import make_env
    cfg = load_config(pair=pair, algo="grpo", overrides=["run.track=false"])
    env = make_env(cfg, "test", size=size)
    prompts = list(env.dataset)
    groups = {}
    for spec in cfg["pair"]["models"]:
        pol = build_policy(spec, cfg, seed)
        torch.manual_seed(seed)
        groups[spec["id"]] = {g.prompt.id: g for g in env.score_groups(build_engine(pol, cfg).generate(prompts, n))}
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
        f = Path(d) / "eval" / f"{model.replace('/', '__')}.json"
        if f.exists():
            bench = json.loads(f.read_text())["benchmarks"]
            vals.append(statistics.fmean(v["avg"] for v in bench.values()))
    return vals


def _charge(run_dirs: list, model: str):
    from graftzoo.eval.compute import joint_charge
    vals = []
    for d in run_dirs:
        f = Path(d) / "summary.json"
        if f.exists():
            s = json.loads(f.read_text())
            charge = joint_charge(s["compute"]).get(model) if s.get("compute") else None
            if charge:
                vals.append(charge["cpu_s"])
    return statistics.fmean(vals) if vals else None


def conclusion(cells: list, out: Path, model_ids: list) -> str:
    """A plain-language paragraph stating the comparisons, whatever they turn out to be."""
    runs = out / "runs"
    by_label: dict = {}
    for c in cells:
        by_label.setdefault(c.label.split(" tiny")[0].split(" micro")[0], []).append(runs / c.name)
    lines = []
    for m in model_ids:
        grpo = _avg(by_label.get("GRPO (n=8)", []), m)
        graft = _avg(by_label.get("GRAFT", []), m)
        stored = _avg([d for k, v in by_label.items() if k.startswith("GRAFT (stored)") for d in v], m)
        if not grpo or not graft:
            continue
        g0, g1 = statistics.fmean(grpo), statistics.fmean(graft)
        sd = max(statistics.stdev(grpo) if len(grpo) > 1 else 0.0, statistics.stdev(graft) if len(graft) > 1 else 0.0)
        verdict = "beats" if g1 - g0 > sd and len(grpo) > 1 else ("is above" if g1 > g0 else "does not beat")
        txt = (f"For {m}, GRAFT n=8 scores {100 * g1:.1f} against GRPO n=8's {100 * g0:.1f} on held-out accuracy "
               f"(Δ {100 * (g1 - g0):+.1f} points; seed s.d. {100 * sd:.1f} over {len(grpo)} seed(s)), so GRAFT {verdict} GRPO"
               + (" by more than the seeds' s.d." if verdict == "beats" else
                  (" but not by more than the seeds' s.d." if len(grpo) > 1 and g1 > g0 else
                   " (one seed: no claim beyond this run)" if len(grpo) == 1 and g1 > g0 else "")) + ".")
        if stored:
            s1 = statistics.fmean(stored)
            share = (s1 - g0) / (g1 - g0) if abs(g1 - g0) > 1e-9 else float("nan")
            txt += (f" Stored-trajectory GRAFT scores {100 * s1:.1f}"
                    + (f", {100 * share:.0f}% of the online gain." if g1 > g0 else "; online GRAFT showed no gain to share."))
        g32 = _avg(by_label.get("GRPO (n=32)", []), m)
        if g32:
            c8, c32 = _charge(by_label["GRAFT"], m), _charge(by_label["GRPO (n=32)"], m)
            frac = f"{c8 / c32:.2f}" if c8 and c32 else "?"
            txt += (f" GRPO n=32 reaches {100 * statistics.fmean(g32):.1f}; GRAFT n=8 "
                    f"{'reaches' if g1 >= statistics.fmean(g32) else 'does not reach'} it, at {frac}× its CPU time "
                    f"(co-trained runs charged the joint cost of both models).")
        lines.append(txt)
    return "\n".join(lines) if lines else "No comparison available (runs missing or failed)."


@click.command("demo")
@click.option("--quick", is_flag=True, help="a < 2 minute smoke version (tests use it)")
@click.option("--full", is_flag=True, help="adds GRPO n=16/32, the named ablations and 3 seeds")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path())
@click.option("--jobs", default=2, show_default=True, help="runs in parallel (one torch thread each)")
@click.option("--seeds", default=None, help="comma-separated seeds (default: from configs/demo.yaml)")
@click.option("--track/--no-track", default=True, help="wandb offline runs")
def demo_cmd(quick, full, out, jobs, seeds, track):
    """GRAFT vs GRPO on a heterogeneous tiny pair, on CPU, with the paper's table and plots."""
    from rich.console import Console

    from graftzoo.eval.artifacts import load_runs
    from graftzoo.eval.plots import plot_fractions, plot_score_vs_compute
    from graftzoo.eval.report import build_table1, clip_fraction_table, to_csv, to_latex, to_markdown
    from graftzoo.tiny import TinyModelSpec
    from graftzoo.warmup import warmup_pair
    console = Console()
    t0 = time.time()
    mode = "full" if full else "quick" if quick else "default"
    plan_cfg = read_yaml(find_config("demo", "demo") or Path("configs/demo/demo.yaml"))
    pair = plan_cfg["pair"] if mode != "quick" else plan_cfg.get("quick_pair", plan_cfg["pair"])
    out = Path(out) / mode
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(pair=pair, algo="grpo", overrides=["run.track=false"])
    specs = [s for s in cfg["pair"]["models"]]
    model_ids = [s["id"] for s in specs]
    console.rule(f"[bold]graftzoo demo ({mode}) — pair '{pair}': {' ↔ '.join(model_ids)}")
    console.print("1. warming up the tiny pair (cached after the first time) ...")
    from graftzoo.models import split_spec
    paths = warmup_pair([TinyModelSpec.from_dict(split_spec(s)[0]) for s in specs])
    for m, p in zip(model_ids, paths):
        info = json.loads((Path(p) / "warmup.json").read_text())
        console.print(f"   {m}: warm-up {info.get('wall_s', info.get('train_s', 0)):.0f} s, probe {info.get('probe_greedy')}")
    console.print(f"2. complementarity on held-out prompts (n=8) ...")
    comp = measure_complementarity(pair, n=8, size=plan_cfg[mode]["complementarity_size"])
    (out / "complementarity.json").write_text(json.dumps(comp, indent=1))
    for m, c in comp.items():
        def pct(x):
            return "n/a" if x is None else f"{100 * x:.0f}%"
        console.print(f"   {m}: pass@1 {pct(c['pass@1'])} "
                      f"({', '.join(f'{k} {pct(v)}' for k, v in c['pass@1_by_skill'].items())}); all-fail prompts "
                      f"{pct(c['all_fail_frac'])}; the peer solves {pct(c['peer_solves_all_fail'])} of them and its group is "
                      f"mixed on {pct(c['peer_mixed_on_all_fail'])}")
    seed_list = [int(s) for s in seeds.split(",")] if seeds else None
    cells = demo_plan(mode, plan_cfg, model_ids, out.resolve(), seed_list)
    console.print(f"3. {len(cells)} training runs, {jobs} at a time ...")
    failed = run_cells(cells, pair, out, jobs, track, console)
    console.print("4. report")
    runs = load_runs([out / "runs"])
    table = build_table1(runs, baseline="GRPO (n=8)")
    rep = out / "report"
    rep.mkdir(exist_ok=True)
    md = to_markdown(table)
    (rep / "table1.md").write_text(md)
    (rep / "table1.csv").write_text(to_csv(table))
    (rep / "table1.tex").write_text(to_latex(table))
    (rep / "clip_table.md").write_text(to_markdown(clip_fraction_table(runs)))
    plot_score_vs_compute(runs, rep / "score_vs_compute.png")
    plot_fractions(runs, rep / "fractions.png")
    console.print(md)
    text = conclusion(cells, out, model_ids)
    (rep / "conclusion.txt").write_text(text + "\n")
    console.rule("5. what the numbers show")
    console.print(text)
    console.print(f"\nreport: {rep}  (table1.md/.csv/.tex, clip_table.md, score_vs_compute.png, fractions.png); "
                  f"wandb offline runs under {out / 'runs'}/*/wandb; total {time.time() - t0:.0f} s")
    if failed:
        raise click.ClickException(f"failed runs: {', '.join(failed)}")
