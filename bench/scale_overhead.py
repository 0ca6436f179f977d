"""Ray orchestration overhead on the co-trained tiny pair: the same seeded GRAFT run in-process, with
``--backend ray`` (one worker per model) and with ``--backend ray`` + FSDP2 over 2 gloo ranks per model, run in
alternation; median step time of each (the first step of a run left out: warm-up), its ratio to in-process, and the
start-up time (building the models; Ray: starting the cluster and the workers).

    python bench/scale_overhead.py [--steps 6] [--rounds 2] [--pair tiny]

Run it on a quiet machine. As root it re-runs itself in a loopback-only network and PID namespace (as the tests do),
so that the private Ray cluster reaches nothing but 127.0.0.1 and ends with the benchmark.
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if os.geteuid() == 0 and not os.environ.get("GRAFTZOO_NS") and shutil.which("unshare"):
    env = dict(os.environ, GRAFTZOO_NS="1")
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    sys.exit(subprocess.call(["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c",
                              f"ip link set lo up && {cmd}"], env=env))

import torch  # noqa: E402

from graftzoo.contract.config import load_config  # noqa: E402
from graftzoo.api import train_run as train  # noqa: E402

VARIANTS = {"in-process": [], "ray": ["run.backend=ray"], "ray + FSDP2 x2": ["run.backend=ray", "ray.num_workers=2"]}
CORE = ("time/generate", "time/score", "time/logprob", "time/update")


def one_run(pair: str, steps: int, extra: list, out: Path) -> dict:
    cfg = load_config(pair=pair, algo="graft", overrides=[
        "peer.source=online", "run.track=false", "run.progress=false", f"run.out_dir={out}", f"run.steps={steps}",
        "run.save_every=0", "run.eval_at_end=false", *extra])
    t = time.perf_counter()
    run = train(cfg)
    total = time.perf_counter() - t
    per_step: dict = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("time/step") is not None:
            per_step.setdefault(r["step"], []).append(r)
    steps_s = [max(x["time/step"] for x in rows) for _, rows in sorted(per_step.items())]
    core = [sum(x.get(k) or 0.0 for x in rows for k in CORE) for _, rows in sorted(per_step.items())]
    return {"steps": steps_s[1:], "core": core[1:], "startup": total - sum(steps_s),
            "loss": [x["loss"] for _, rows in sorted(per_step.items()) for x in rows]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pair", default="tiny")
    a = ap.parse_args()
    torch.set_num_threads(1)
    res = {k: {"steps": [], "core": [], "startup": [], "loss": None} for k in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                got = one_run(a.pair, a.steps, VARIANTS[name], Path(tmp) / f"{r}-{len(res[name]['startup'])}"
                              f"-{name.replace(' ', '_')}")
                res[name]["steps"] += got["steps"]
                res[name]["core"] += got["core"]
                res[name]["startup"].append(got["startup"])
                res[name]["loss"] = got["loss"]
                print(f"round {r} {name}: median step {statistics.median(got['steps']):.3f} s, "
                      f"start-up {got['startup']:.1f} s", flush=True)
    base = statistics.median(res["in-process"]["steps"])
    print(f"\n{a.pair} pair, GRAFT (online), {a.steps} steps x {a.rounds} rounds, {os.cpu_count()} CPUs")
    print("| run | median step (s) | vs in-process | outside generate/score/logprob/update | start-up (s) |")
    print("|---|---|---|---|---|")
    for name, v in res.items():
        med = statistics.median(v["steps"])
        outside = statistics.median([1 - c / s for c, s in zip(v["core"], v["steps"]) if s > 0])
        print(f"| {name} | {med:.3f} | {med / base:.3f} | {outside:.1%} | {statistics.median(v['startup']):.1f} |")
    same = all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(res["ray"]["loss"], res["in-process"]["loss"]))
    print(f"\nray losses equal in-process: {same}")


if __name__ == "__main__":
    main()
