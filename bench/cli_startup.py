"""How fast the command line answers what it can answer without torch: the ``--help`` of every command and
subcommand, a config error, and every refusal of a bad path, file or checkpoint (a missing or broken data file, model
folder, peer store, config, grid or calibration file, run directory or checkpoint), each the median of ``--repeat``
fresh ``graftzoo`` processes (wall seconds), with the exit code and the first line it printed. The bad files are made
in a temporary folder; the machine's load average is printed with the table (the figures scale with it).

    python bench/cli_startup.py [--repeat 3] [--only SUBSTRING] [--json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from graftzoo.contract.config import as_dict, load_config

HELPS = [[], ["train"], ["grid"], ["eval"], ["plan"], ["demo"], ["report"], ["export"], ["env"], ["env", "check"],
         ["algos"], ["algos", "list"], ["config"], ["config", "show"], ["config", "keys"]]
TRAIN = ["train", "--pair", "micro", "--algo", "grpo"]
MATH = "graftzoo/MathReasoning-v0"
# name -> arguments ({d}: the folder of bad files made by ``bad_files``)
REFUSALS = {
    "config error (unknown algo)": ["train", "--pair", "micro", "--algo", "nope"],
    "train: missing data file": TRAIN + ["--set", "task.dataset={d}/missing.jsonl"],
    "train: broken JSONL row": TRAIN + ["--set", "task.dataset={d}/broken.jsonl"],
    "train: missing eval.dataset": TRAIN + ["--set", "eval.dataset={d}/held.jsonl"],
    "train: missing model folder": ["train", "--pair", "{d}/byo_pair.yaml", "--algo", "grpo"],
    "train: missing pair file": ["train", "--pair", "{d}/nopair.yaml", "--algo", "grpo"],
    "train: --peer stored:MISSING": ["train", "--pair", "micro", "--algo", "graft", "--peer", "stored:{d}/nostore"],
    "train: --peer mixed:NOT-A-STORE": ["train", "--pair", "micro", "--algo", "graft", "--peer", "mixed:{d}/notarun"],
    "train: -c MISSING.yaml": TRAIN + ["-c", "{d}/more.yaml"],
    "train: --plugin MISSING.py": TRAIN + ["--plugin", "{d}/my_algo.py"],
    "train: --run-dir under a file": TRAIN + ["--run-dir", "{d}/afile/run"],
    "config show -c MISSING.yaml": ["config", "show", "micro", "-c", "{d}/more.yaml"],
    "eval --ckpt MISSING": ["eval", "--ckpt", "{d}/gone"],
    "eval --ckpt NOT-A-RUN": ["eval", "--ckpt", "{d}/notarun"],
    "eval --ckpt RUN-WITHOUT-CHECKPOINT": ["eval", "--ckpt", "{d}/nockpt"],
    "eval --benchmarks BROKEN.jsonl": ["eval", "--ckpt", "{d}/run1", "--benchmarks", "{d}/broken.jsonl"],
    "eval --benchmarks MISSING.jsonl": ["eval", "--ckpt", "{d}/run1", "--benchmarks", "{d}/bench.jsonl"],
    "export MISSING": ["export", "{d}/gone"],
    "export NOT-A-RUN": ["export", "{d}/notarun"],
    "export RUN-WITHOUT-CHECKPOINT": ["export", "{d}/nockpt"],
    "export RUN --step MISSING": ["export", "{d}/run1", "--step", "9"],
    "grid MISSING.yaml": ["grid", "{d}/nogrid.yaml"],
    "grid INVALID-YAML": ["grid", "{d}/broken_grid.yaml"],
    "grid UNKNOWN-KEY": ["grid", "{d}/badkey_grid.yaml"],
    "grid MISSING-CONFIG-FILE (6 cells)": ["grid", "{d}/badfiles_grid.yaml"],
    "plan MISSING.yaml": ["plan", "{d}/nopair.yaml"],
    "plan: missing model folder": ["plan", "{d}/byo_pair.yaml"],
    "plan --calibration NOT-JSON": ["plan", "micro", "--calibration", "{d}/bad.json"],
    "plan --calibration MISSING": ["plan", "micro", "--calibration", "{d}/cal.json"],
    "env check: missing data file": ["env", "check", MATH, "--kw", "dataset={d}/missing.jsonl"],
    "env check: broken JSONL row": ["env", "check", MATH, "--kw", "dataset={d}/broken.jsonl"],
    "report MISSING": ["report", "{d}/gone"],
}


def bad_files(d: Path) -> Path:
    """The files the refusals name (as tests/test_cli_fast.py makes them)."""
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
    (d / "run1" / "checkpoints" / "step_000002").mkdir(parents=True)
    (d / "run1" / "checkpoints" / "step_000002" / "manifest.json").write_text("{}")
    return d


def graftzoo() -> list:
    exe = Path(sys.executable).with_name("graftzoo")
    return [str(exe)] if exe.exists() else [shutil.which("graftzoo") or "graftzoo"]


def cases(d: Path) -> dict:
    """name -> argv of every timed command."""
    out = {f"{' '.join(c) or 'graftzoo'} --help": c + ["--help"] for c in HELPS}
    out.update({name: [a.format(d=d) for a in args] for name, args in REFUSALS.items()})
    return out


def timed(argv: list, repeat: int, cwd: Path) -> dict:
    times, res = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        res = subprocess.run(graftzoo() + argv, capture_output=True, text=True, cwd=cwd)
        times.append(time.perf_counter() - t)
    said = (res.stderr.strip() or res.stdout.strip()).splitlines()
    return {"median_s": round(statistics.median(times), 3), "runs_s": [round(x, 3) for x in times],
            "exit": res.returncode, "lines": len(res.stderr.strip().splitlines()) if res.returncode else 0,
            "first": said[0] if said else ""}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=None, help="time only the cases whose name holds this")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = bad_files(Path(tmp))
        todo = {k: v for k, v in cases(d).items() if args.only is None or args.only in k}
        width = max(len(k) for k in todo)
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
              f"median of {args.repeat} fresh processes each")
        print(f"{'command':<{width}}  median  exit  lines  first line")
        for name, argv in todo.items():
            r = out[name] = timed(argv, args.repeat, d)
            first = r["first"].replace(str(d), "D")
            print(f"{name:<{width}}  {r['median_s']:5.2f}s  {r['exit']:>4}  {r['lines']:>5}  {first[:70]}")
    slowest = max(out, key=lambda k: out[k]["median_s"])
    print(f"slowest: {slowest} {out[slowest]['median_s']:.2f} s; over 2 s: "
          f"{[k for k, r in out.items() if r['median_s'] > 2.0] or 'none'}; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
