"""How long ``graftzoo eval --k 2 --limit 25`` takes on a trained run (held-out split, 25 prompts per model): the
median of ``--repeat`` fresh processes (wall seconds), each writing to a folder of its own. The run is trained first
(``graftzoo train --algo grpo --pair PAIR``, 2 steps; default the README's pair ``tiny``) unless ``--run`` names one.
``--graftzoo`` picks the command to time (another checkout's ``.venv/bin/graftzoo``, to compare releases on the same
run).

    python bench/eval_speed.py [--repeat 3] [--pair tiny] [--run RUN_DIR] [--graftzoo PATH]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def graftzoo() -> str:
    return str(Path(sys.executable).with_name("graftzoo"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pair", default="tiny", help="the pair of the run trained first")
    ap.add_argument("--run", default=None, help="a run directory (default: train a 2-step run of --pair)")
    ap.add_argument("--graftzoo", default=graftzoo(), help="the graftzoo command to time")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eval-speed-"))
    run = Path(args.run) if args.run else work / "runs" / f"grpo-{args.pair}-s0"
    if args.run is None:
        subprocess.run([graftzoo(), "train", "--algo", "grpo", "--pair", args.pair, "--no-track", "--set",
                        f"run.out_dir={work / 'runs'}", "--set", "run.steps=2", "--set", "run.eval_at_end=false",
                        "--set", "run.progress=false"], check=True, capture_output=True)
    times = []
    for i in range(args.repeat):
        t = time.perf_counter()
        subprocess.run([args.graftzoo, "eval", "--ckpt", str(run), "--k", "2", "--limit", "25", "--out",
                        str(work / f"eval-{i}")], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    out = {"command": "graftzoo eval --k 2 --limit 25", "median_s": round(statistics.median(times), 2),
           "runs_s": [round(x, 2) for x in times]}
    print(f"eval --k 2 --limit 25: median {out['median_s']:.1f} s  ({', '.join(f'{x:.1f}' for x in times)})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
