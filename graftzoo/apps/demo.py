"""``graftzoo demo``: GRAFT against GRPO on a heterogeneous tiny pair, on CPU, reported as the paper would.

1. builds and warms up the tiny pair (different architectures and tokenizers; cached on disk);
2. measures complementarity on held-out prompts: the fraction of each model's all-fail prompts that
   the peer solves, and the fraction where the peer's group is mixed;
3. runs GRPO n=8 and GRAFT n=8 co-training, plus GRAFT n=8 from the stored trajectories of the GRPO runs,
   over 2 seeds (``--full``: 3 seeds, GRPO n=16/32 and the named ablations, then the plan's ``also`` grids:
   the positive control and the regime map);
4. prints the Table-1-style report with Delta, writes the PNG plots and the wandb offline runs;
5. ends with a plain-language paragraph: the seed means and spread, and the verdict of the paired test over seeds
   that the report's marks use (``verdict``): "no significant difference at n=2 seeds" unless it rejects, never a
   verdict from one seed.

The plan (steps, prompts per step, seeds, eval size per mode) lives in configs/demo/demo.yaml (packaged in
graftzoo/configs; a ./configs/demo/ of the current directory overrides it). The demo prints its own progress only:
the libraries' warnings, logging and progress bars are off, in it and in its child processes, unless ``--debug``.
"""
from __future__ import annotations

import json
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Mapping, Optional

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from graftzoo.apps.grid import load_grid, write_report
from graftzoo.apps.grid.load import method_algorithm, pair_models
from graftzoo.contract import output
from graftzoo.contract.config import find_config, load_config, named_configs, read_yaml
from graftzoo.contract.errors import ConfigError, did_you_mean
from graftzoo.envs.task import Task
from graftzoo.eval.artifacts import eval_path
from graftzoo.eval.compute import joint_charge
from graftzoo.eval.metrics import seed_test
from graftzoo.eval.report import is_report_baseline


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


STARTS = ("new", "resume", "changed", "evaluate")   # run_grid's "[STATUS] CELL" when a cell starts
ENDS = ("done", "FAILED", "interrupted")            # ... and when it ends


class RunBars:
    """A rich progress bar per run (steps logged / steps); each bar's clock starts when its run starts and stops
    when it ends, as ``run_grid``'s lines say (``echo``). ``get_time``: rich's clock (tests set one)."""

    def __init__(self, cells, console, get_time=None):
        self.progress = Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, get_time=get_time)
        self.tasks = {c.name: self.progress.add_task(c.name, total=int(c.config().run.steps), start=False)
                      for c in cells}

    def echo(self, line: str):
        """Print a line of ``run_grid`` as text ("[done]" is no rich markup); "[new] CELL" (or resume, changed,
        evaluate) starts CELL's clock, "[done] CELL" (or FAILED, interrupted) stops it."""
        self.progress.console.print(line, markup=False, highlight=False)
        m = re.match(r"\[(\w+)\] (\S+)", line)
        task = self.tasks.get(m.group(2)) if m else None
        if task is not None and m.group(1) in STARTS:
            self.progress.start_task(task)
        elif task is not None and m.group(1) in ENDS:
            self.progress.stop_task(task)

    def poll(self, cells):
        for c in cells:
            task = self.tasks[c.name]
            self.progress.update(task, completed=min(_steps_logged(c.run_dir), self.progress.tasks[task].total))


def run_with_progress(grid, cells, jobs: int, console, rerun_changed: bool = False) -> dict:
    """``graftzoo.apps.grid.run_grid`` with a rich progress bar per run (``RunBars``)."""
    from graftzoo.apps.grid.run import run_grid  # torch: the demo's modules load once it runs (demo --help, not)
    stop = threading.Event()
    bars = RunBars(cells, console)
    with bars.progress:
        def poll():
            while not stop.wait(1.0):
                bars.poll(cells)

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            result = run_grid(grid, cells, jobs=jobs, echo=bars.echo, rerun_changed=rerun_changed)
        finally:
            stop.set()
            t.join()
            bars.poll(cells)
    return result


QUIET_ENV = {**output.QUIET_ENV, "PYTHONWARNINGS": "ignore"}   # set for the demo's child processes too


def quiet_libraries(debug: bool = False):
    """Unless ``debug``: the libraries' warnings, logging and progress bars off, every Python warning included, in
    this process and its children; restored on exit (``graftzoo.contract.output.quiet_libraries``)."""
    return output.quiet_libraries(debug, every_warning=True)


def measure_complementarity(pair: str, n: int = 8, size: int = 128, seed: int = 0) -> dict:
    """Per model: fraction of its all-fail held-out prompts that the peer solves / where the peer's group is mixed."""
    import torch  # the demo's modules load once it runs (demo --help does not)
    from graftzoo.training.planner.build import build_engine, build_policy  # torch: the demo's modules load once it runs
    cfg = load_config(pair=pair, algo="grpo", overrides=["run.track=false"])
    env = Task(cfg).make_env("test", size=size)
    prompts = list(env.dataset)
    groups = {}
    for spec in cfg.pair.models:
        pol = build_policy(spec, cfg, seed)
        engine = build_engine(pol, cfg)
        try:
            torch.manual_seed(seed)
            groups[spec.id] = {g.prompt.id: g for g in env.score_groups(engine.generate(prompts, n))}
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


def _avg(cells: list, model: str) -> dict:
    """Seed -> the held-out Avg of ``model`` in each cell's run (cells without an eval file left out)."""
    vals = {}
    for c in cells:
        f = eval_path(c.run_dir, model)
        if f.exists():
            bench = json.loads(f.read_text())["benchmarks"]
            vals[c.seed] = statistics.fmean(v["avg"] for v in bench.values())
    return vals


def _charge(cells: list, model: str):
    vals = []
    for c in cells:
        f = Path(c.run_dir) / "summary.json"
        if f.exists():
            charge = joint_charge(json.loads(f.read_text())).get(model)
            if charge:
                vals.append(charge["charged"]["cpu_s"])
    return statistics.fmean(vals) if vals else None


def _by_seed(xs) -> dict:
    """Per-seed scores as seed -> score; a list is taken in seed order (its index is the seed)."""
    return dict(xs) if isinstance(xs, Mapping) else dict(enumerate(xs))


def _ms(xs) -> tuple:
    """(mean, sample s.d.) of per-seed scores; s.d. 0 for one seed."""
    xs = list(_by_seed(xs).values())
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def verdict(baseline, method, name: str = "GRAFT", base: str = "GRPO") -> str:
    """The comparison of two methods' per-seed scores (seed -> score, or lists in seed order) in words, from the
    test the report's marks use (``graftzoo.eval.metrics.seed_test``: a paired t-test over the seeds both have,
    docs/results.md#marks-of-significance): "significantly above/below" only where it rejects at p < 0.05, else "no
    significant difference at n=N seeds" (the words stay true on any CPU whatever its seeds' figures). One seed
    has no spread, so it gets no test and no verdict beyond that run."""
    baseline, method = _by_seed(baseline), _by_seed(method)
    test = seed_test(baseline, method)
    if test is None:
        gap = _ms(method)[0] - _ms(baseline)[0]
        side = "above" if gap > 0 else "below" if gap < 0 else "level with"
        return (f"{name} is {side} {base} in this single seed (one seed has no spread: no test, no verdict beyond "
                f"this run)")
    how = f"at n={test.n} seeds ({test.name}, p = {test.p:.2f})"
    if not test.significant:
        return f"there is no significant difference between {name} and {base} {how}"
    return f"{name} is significantly {'above' if test.diff > 0 else 'below'} {base} {how}"


def _seeds(xs: dict) -> str:
    return ", ".join(f"{100 * x:.1f}" for _, x in sorted(xs.items()))


def conclusion(cells: list, model_ids: list, baseline: str = "GRPO (n=8)", method: str = "GRAFT",
               stored: Optional[str] = "GRAFT (stored)", budget: Optional[str] = "GRPO (n=32)") -> str:
    """A plain-language paragraph per model comparing ``method`` with ``baseline`` from their seed means and
    spread and the paired test over seeds (``verdict``), whatever they turn out to be; plus the stored-trajectory
    and the budget rows if run."""
    by_label: dict = {}
    for c in cells:
        by_label.setdefault(c.label, []).append(c)
    lines = []
    for m in model_ids:
        grpo = _avg(by_label.get(baseline, []), m)
        graft = _avg(by_label.get(method, []), m)
        st = _avg(by_label.get(stored, []), m)
        if not grpo or not graft:
            continue
        if not any([*grpo.values(), *graft.values(), *st.values()]):  # nothing learned to compare: no verdict
            lines.append(f"For {m}, every score is 0 ({baseline}, {method}{', ' + stored if st else ''}): these runs "
                         f"are too short to learn the task, so they check the pipeline, not the methods; no method "
                         f"is compared.")
            continue
        (g0, s0), (g1, s1) = _ms(grpo), _ms(graft)
        n = min(len(grpo), len(graft))
        seeds = f"over {n} seeds" if n > 1 else "one seed"
        txt = (f"For {m} ({seeds}), {method}{' n=8' if method == 'GRAFT' else ''} scores {100 * g1:.1f} ± {100 * s1:.1f} (seeds: {_seeds(graft)}) "
               f"against {baseline}'s {100 * g0:.1f} ± {100 * s0:.1f} (seeds: {_seeds(grpo)}) on held-out accuracy, "
               f"Δ {100 * (g1 - g0):+.1f} points: {verdict(grpo, graft, method, baseline)}.")
        if st:
            (t1, ts) = _ms(st)
            txt += (f" Stored-trajectory {method} (learning from the GRPO runs' stored groups) scores "
                    f"{100 * t1:.1f} ± {100 * ts:.1f}: {verdict(grpo, st, 'stored ' + method, baseline)}.")
        g32 = _avg(by_label.get(budget, []), m)
        if g32:
            c8, c32 = _charge(by_label[method], m), _charge(by_label[budget], m)
            frac = f"{c8 / c32:.2f}" if c8 and c32 else "?"
            txt += (f" {budget} scores {100 * _ms(g32)[0]:.1f} ± {100 * _ms(g32)[1]:.1f} "
                    f"({verdict(grpo, g32, budget, baseline)}); {method} costs {frac}× its CPU time (co-trained "
                    f"runs charged the joint cost of both models).")
        lines.append(txt)
    return "\n".join(lines) if lines else "No comparison available (runs missing or failed)."


def learner_conclusion(grid) -> str:
    """The conclusion of a grid whose pairs' first model is the learner (the control, the regime map): per pair,
    each method other than the baselines (the methods of an algorithm that declares ``report_baseline``, such as
    GRPO's presets) against the baseline on that pair's learner (the baseline's runs of that learner may come from
    another pair of the grid: a method's ``pairs``)."""
    baseline = grid.report.get("baseline") or "GRPO (n=8)"
    budget = "GRPO (n=32)"
    learner = {}
    for c in grid.cells:
        if c.pair not in learner:  # the pair file's first model; no full config load per cell
            learner[c.pair] = pair_models(c.pair, grid.name)[0]
    methods = [m.label for m in grid.methods if m.same_as is None and m.label not in (baseline, budget)
               and not is_report_baseline(method_algorithm(m))]
    said = []
    compared = [p for p in learner if any(c.pair == p and c.label in methods for c in grid.cells)]
    for pair, m in ((p, learner[p]) for p in compared):
        cells = [c for c in grid.cells if c.pair == pair
                 or (c.label in (baseline, budget) and learner.get(c.pair) == m)]
        for i, method in enumerate(methods):
            text = conclusion(cells, [m], baseline=baseline, method=method, stored=None,
                              budget=budget if i == 0 else None)
            said.append(f"[{pair}] {text}")
    return "\n".join(said)


def _config_file(kind: str, name: str) -> Path:
    """configs/KIND/NAME.yaml (KIND: demo, grids): a user's ./configs first, then the package's
    (graftzoo.contract.config.find_config)."""
    path = find_config(kind, name)
    if path is None:
        raise ConfigError(f"no {kind} config {name!r}{did_you_mean(name, named_configs(kind))}: configs/{kind}/"
                          f"{name}.yaml is neither in ./configs nor in the installed package")
    return path


@click.command("demo")
@click.option("--quick", is_flag=True, help="a < 2 minute smoke version on the micro pair (tests use it)")
@click.option("--full", is_flag=True,
              help="3 seeds, GRPO n=16/32 and the named ablations, then the positive control and the regime map")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(), help="parent folder of the demo runs")
@click.option("--jobs", default=2, show_default=True, help="runs in parallel (one torch thread each)")
@click.option("--rerun-changed", is_flag=True,
              help="rerun finished runs whose settings differ from the demo's now (the old ones are moved aside)")
@click.option("--debug", is_flag=True, help="show the libraries' warnings, logging and progress bars (off otherwise)")
def demo_cmd(quick, full, out, jobs, rerun_changed, debug):
    """GRAFT vs GRPO on a heterogeneous tiny pair, on CPU, over seeds, with the paper's table and plots."""
    debug = debug or bool(click.get_current_context().find_root().params.get("debug"))  # also graftzoo --debug demo
    with quiet_libraries(debug):
        _demo(quick, full, out, jobs, rerun_changed)


def _demo(quick, full, out, jobs, rerun_changed):
    from graftzoo.tiny.shipped import WEIGHTS_DIR, weights_hash  # torch: the demo's modules load once it runs
    from graftzoo.tiny.warmup import warmup_info, warmup_pair  # torch: the demo's modules load once it runs
    from graftzoo.training.planner.build import tiny_spec  # torch: the demo's modules load once it runs
    console = Console()
    console.soft_wrap = not console.is_terminal  # piped output is not cut at 80 columns (a terminal: word-wrapped)
    t0 = time.time()
    mode = "full" if full else "quick" if quick else "default"
    plan = read_yaml(_config_file("demo", "demo"))[mode]
    grid = load_grid(_config_file("demo", plan["grid"]), out=str(Path(out) / mode))
    pair = grid.cells[0].pair
    cfg = load_config(pair=pair, algo="grpo", overrides=["run.track=false"])
    specs = cfg.pair.models
    model_ids = [s.id for s in specs]
    console.rule(f"[bold]graftzoo demo ({mode}): pair '{pair}' = {' ↔ '.join(model_ids)}")
    console.print("1. building and warming up the tiny pair (shipped models load as they are, others are warmed up "
                  "once and cached) ...")
    paths = warmup_pair([tiny_spec(s) for s in specs])
    for m, p in zip(model_ids, paths):
        info = warmup_info(p)
        where = "shipped" if Path(p).parent == WEIGHTS_DIR else "warmed up here"
        console.print(f"   {m}: {info.get('spec', {}).get('family')} + {info.get('spec', {}).get('tokenizer')} tokenizer, "
                      f"probe after warm-up {info.get('probe_greedy')}; weights {where}, sha256 {weights_hash(p)[:12]}")
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
    result = run_with_progress(grid, grid.cells, jobs, console, rerun_changed)
    console.print("4. report")
    report = write_report(grid, grid.cells, echo=console.print)
    text = conclusion(grid.cells, model_ids)
    if report is not None:
        (report / "conclusion.txt").write_text(text + "\n")
    for name in plan.get("also") or []:  # --full: the positive control and the regime map, each its own grid
        extra = load_grid(_config_file("grids", name), out=str(Path(out) / mode / name))
        console.rule(f"[bold]{name}: {len(extra.cells)} runs ({extra.root})")
        result.update(run_with_progress(extra, extra.cells, jobs, console, rerun_changed))
        rep = write_report(extra, extra.cells, echo=console.print)
        said = learner_conclusion(extra)
        if rep is not None:
            (rep / "conclusion.txt").write_text(said + "\n")
        text += f"\n{name}: {said}"
    console.rule("5. what the numbers show")
    console.print(text, markup=False)  # the conclusion names pairs in brackets: not rich markup
    console.print(f"\nwandb offline runs: {grid.root}/*/wandb; total {time.time() - t0:.0f} s")
    failed = [n for n, r in result.items() if r in ("failed", "blocked")]
    if failed:
        raise click.ClickException(f"failed runs: {', '.join(failed)}")
