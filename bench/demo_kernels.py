"""`make demo` under several CPU kernel sets (torch's ``ATEN_CPU_CAPABILITY``: this CPU's own, ``default`` = the generic
kernels), from the shipped tiny weights: the weight hashes each run printed, every run's held-out score per model,
and the demo's own conclusion (its paired test), into ``docs/results/demo_kernels.json``. Run by hand (about 25 min
per kernel set on 2 cores):

    python bench/demo_kernels.py                 # native and default kernels
    python bench/demo_kernels.py --caps default  # one set
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "demo_kernels.json"


def scores(grid_root: Path) -> dict:
    """method label -> model -> [held-out avg of each seed's run] (the runs' final evaluations)."""
    out: dict = {}
    for summary in sorted(grid_root.glob("*/summary.json")):
        run = summary.parent
        s = json.loads(summary.read_text())
        for model in s["models"]:
            ev = run / "eval" / f"{model}.json"
            if ev.is_file():
                out.setdefault(s["variant"], {}).setdefault(model, []).append(
                    round(100 * json.loads(ev.read_text())["overall"]["avg"], 2))
    return out


def one(cap: str, out_root: Path) -> dict:
    env = dict(os.environ)
    if cap != "native":
        env["ATEN_CPU_CAPABILITY"] = cap
    out = out_root / cap
    t = time.time()
    res = subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", "demo", "--out", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    log = res.stdout + res.stderr
    (out_root / f"{cap}.log").write_text(log)
    hashes = dict(re.findall(r"^\s+(\S+): .*sha256 ([0-9a-f]{12})", res.stdout, re.M))
    grid_root = out / "default"
    conclusion = next(grid_root.rglob("conclusion.txt"), None)
    by = scores(grid_root)
    return {"capability": cap, "exit": res.returncode, "wall_s": round(time.time() - t), "weights_sha256": hashes,
            "scores": by, "mean": {m: {k: round(statistics.mean(v), 2) for k, v in d.items()} for m, d in by.items()},
            "conclusion": conclusion.read_text().strip() if conclusion else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", nargs="+", default=["native", "default"])
    ap.add_argument("--out", default=str(ROOT / "runs" / "demo-kernels"))
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    cpu = next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("model name")), "?")
    flags = next((x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")), "")
    results = json.loads(OUT.read_text()) if OUT.is_file() else {"runs": []}
    for cap in args.caps:
        r = one(cap, root)
        r.update(cpu=cpu, avx512="avx512f" in flags, avx2="avx2" in flags, date=time.strftime("%Y-%m-%d"))
        print(json.dumps(r, indent=1))
        results["runs"].append(r)
        OUT.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
