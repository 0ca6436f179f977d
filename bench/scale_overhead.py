"""Ray orchestration overhead on the co-trained tiny pair: the same seeded GRAFT run in-process, with
``--backend ray`` (one worker per model) and with ``--backend ray`` + FSDP2 over 2 gloo ranks per model, run in
alternation; median step time of each (the first step of a run left out: warm-up), its ratio to in-process, and the
start-up time (building the models; Ray: starting the cluster and the workers).

    python bench/scale_overhead.py [--steps 6] [--rounds 2] [--pair tiny] [--json out.json]

``--concurrent``: instead, the pair's step on Ray with the models one after the other (``ray.concurrent_models=false``)
against both models at once (the default), in strict alternation (in turn, at once, in turn, at once, ...;
``--rounds`` of each, at least 3): median step time of each and their ratio, and whether the losses are equal.

    python bench/scale_overhead.py --concurrent [--steps 6] [--rounds 3] [--json out.json]

``--sync``: instead, the weight sync of a vLLM engine whose engine core runs in its own process (as on every rank
of a sharded group), streamed in memory against the ``save_pretrained`` folder (bench/weight_sync.py; the modes
alternate, medians and their ratio).

    python bench/scale_overhead.py --sync [--rounds 5] [--json out.json]

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
import weight_sync  # noqa: E402  (bench/weight_sync.py, beside this file)

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


def alternate(variants: dict, rounds: int, pair: str, steps: int, tmp: Path, reverse_odd: bool) -> dict:
    """Every variant once per round (the order reversed on odd rounds when ``reverse_odd``); per variant the
    steps' wall times, their core (generate/score/logprob/update) seconds, the start-ups and the last losses."""
    res = {k: {"steps": [], "core": [], "startup": [], "loss": None} for k in variants}
    for r in range(rounds):
        order = list(reversed(variants)) if reverse_odd and r % 2 else list(variants)
        for name in order:
            got = one_run(pair, steps, variants[name], tmp / f"{r}-{name.replace(' ', '_').replace(',', '')}")
            res[name]["steps"] += got["steps"]
            res[name]["core"] += got["core"]
            res[name]["startup"].append(got["startup"])
            res[name]["loss"] = got["loss"]
            print(f"round {r} {name}: median step {statistics.median(got['steps']):.3f} s, "
                  f"start-up {got['startup']:.1f} s", flush=True)
    return res


def same_losses(a: list, b: list, rel: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * max(1.0, abs(y)) for x, y in zip(a, b))


def overhead(a, tmp: Path) -> dict:
    """In-process against Ray and Ray + FSDP2: the table of the scaling page's cost paragraph."""
    res = alternate(VARIANTS, a.rounds, a.pair, a.steps, tmp, reverse_odd=True)
    base = statistics.median(res["in-process"]["steps"])
    print(f"\n{a.pair} pair, GRAFT (online), {a.steps} steps x {a.rounds} rounds, {os.cpu_count()} CPUs")
    print("| run | median step (s) | vs in-process | outside generate/score/logprob/update | start-up (s) |")
    print("|---|---|---|---|---|")
    for name, v in res.items():
        med = statistics.median(v["steps"])
        outside = statistics.median([1 - c / s for c, s in zip(v["core"], v["steps"]) if s > 0])
        v.update(median_step_s=med, vs_in_process=med / base, outside_core=outside,
                 median_startup_s=statistics.median(v["startup"]))
        print(f"| {name} | {med:.3f} | {med / base:.3f} | {outside:.1%} | {v['median_startup_s']:.1f} |")
    same = same_losses(res["ray"]["loss"], res["in-process"]["loss"], 1e-5)
    print(f"\nray losses equal in-process: {same}")
    return {"variants": res, "ray_losses_equal_in_process": same}


def concurrent(a, tmp: Path) -> dict:
    """The pair's step on Ray, the models in turn against both at once (strict alternation)."""
    variants = {"in turn": ["run.backend=ray", "ray.concurrent_models=false"],
                "at once": ["run.backend=ray", "ray.concurrent_models=true"]}
    res = alternate(variants, a.rounds, a.pair, a.steps, tmp, reverse_odd=False)
    for v in res.values():
        v.update(median_step_s=statistics.median(v["steps"]), median_startup_s=statistics.median(v["startup"]))
    seq, conc = res["in turn"]["median_step_s"], res["at once"]["median_step_s"]
    same = res["in turn"]["loss"] == res["at once"]["loss"]
    print(f"\n{a.pair} pair on Ray (1 worker per model), GRAFT (online), {a.steps} steps x {a.rounds} rounds each, "
          f"{os.cpu_count()} CPUs")
    print("| models | median step (s) | steps measured | start-up (s) |")
    print("|---|---|---|---|")
    for name, v in res.items():
        print(f"| {name} | {v['median_step_s']:.3f} | {len(v['steps'])} | {v['median_startup_s']:.1f} |")
    print(f"\nat once / in turn: {conc / seq:.3f} (speed-up {seq / conc:.2f}x); losses exactly equal: {same}")
    return {"variants": res, "ratio_at_once_to_in_turn": conc / seq, "losses_equal": same}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every variant (2; --concurrent: 3, at least 3)")
    ap.add_argument("--pair", default="tiny")
    ap.add_argument("--concurrent", action="store_true", help="Ray with the models in turn against at once")
    ap.add_argument("--sync", action="store_true", help="vLLM weight sync: streamed in memory against disk")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    if a.sync:  # bench/weight_sync.py's measurement, on its default models
        weight_sync.main(["--rounds", str(a.rounds or 5)] + (["--json", a.json] if a.json else []))
        return
    a.rounds = a.rounds or (3 if a.concurrent else 2)
    if a.concurrent and a.rounds < 3:
        ap.error("--concurrent needs --rounds 3 or more")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        results = concurrent(a, Path(tmp)) if a.concurrent else overhead(a, Path(tmp))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"settings": vars(a), "cpus": os.cpu_count(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
