"""How fast the command line answers: ``graftzoo --help``, ``graftzoo train --help`` and a config error
(``graftzoo train --pair micro --algo nope``), each the median of ``--repeat`` fresh processes (wall seconds).

    python bench/cli_startup.py [--repeat 3]
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {"--help": ["--help"], "train --help": ["train", "--help"],
            "config error": ["train", "--pair", "micro", "--algo", "nope"]}


def graftzoo() -> list:
    exe = Path(sys.executable).with_name("graftzoo")
    return [str(exe)] if exe.exists() else [shutil.which("graftzoo") or "graftzoo"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = {}
    for name, argv in COMMANDS.items():
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run(graftzoo() + argv, capture_output=True)
            times.append(time.perf_counter() - t)
        out[name] = {"median_s": round(statistics.median(times), 3), "runs_s": [round(x, 3) for x in times]}
        print(f"{name:<14} median {out[name]['median_s']:.2f} s  ({', '.join(f'{x:.2f}' for x in times)})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
