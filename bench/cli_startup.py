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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
# the cases tests/test_cli_fast.py checks (no torch imported, one or two lines naming the culprit), timed here
from test_cli_fast import HELPS, REFUSALS, make_bad_files  # noqa: E402

CONFIG_ERRORS = {"config error (unknown algo)": ["train", "--pair", "micro", "--algo", "nope"],
                 "config error (unknown key)": ["train", "--pair", "micro", "--algo", "grpo", "--set", "optim.lrr=1"]}


def graftzoo() -> list:
    exe = Path(sys.executable).with_name("graftzoo")
    return [str(exe)] if exe.exists() else [shutil.which("graftzoo") or "graftzoo"]


def cases(d: Path) -> dict:
    """name -> argv of every timed command."""
    out = {f"{' '.join(c) or 'graftzoo'} --help": c + ["--help"] for c in HELPS}
    out.update(CONFIG_ERRORS)
    out.update({name: [a.format(d=d) for a in args] for name, (args, _, _) in REFUSALS.items()})
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
        d = make_bad_files(Path(tmp))
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
