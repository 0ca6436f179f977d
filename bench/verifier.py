"""Throughput of graftzoo's verifier against plain math-verify on an RL-shaped workload.

Workload: ``--steps`` steps of ``--prompts`` MATH500 problems x ``--group`` responses. Each
prompt has a small answer pool (its gold, an equivalent rewrite of it, 1-3 wrong answers) and
every response draws its final answer from that pool, so answers repeat within a group as
they do in GRPO. Response texts are completion tails (mostly ``\\boxed{}``, some "The answer
is X.", a few with no answer).

Compared in one run, interleaved per round, on the same pairs:
  plain     math-verify in-process: parse("$gold$") + parse(response) + verify, per pair
  single    graftzoo verify(response, gold), one call per pair
  batch     graftzoo verify_batch over one step (prompts x group) at a time
Every pass starts fresh and is first warmed on one step of other problems: plain in a new
process, graftzoo with a new worker pool (all of its workers started and their parser warm-up
done, as it is once a trainer has loaded its model) and empty caches.

Run: python bench/verifier.py [--prompts 64 --group 8 --steps 3 --rounds 2 --workers 2]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import time
from importlib import resources
from pathlib import Path

from math_verify import parse, verify

from graftzoo.envs import verifier as V
from graftzoo.envs import verify_pool

DATA_CANDIDATES = (
    lambda: resources.files("graftzoo.envs") / "data" / "math500.jsonl",  # the packaged copy
    lambda: Path(__file__).resolve().parents[2] / "shared" / "data" / "math500.jsonl",  # beside the repo
)


def load_golds(path: str | None) -> list[str]:
    candidates = [Path(path)] if path else [Path(str(c())) for c in DATA_CANDIDATES]
    for p in candidates:
        if p.is_file():
            with open(p) as f:
                return [json.loads(line)["answer"] for line in f if line.strip()]
    raise FileNotFoundError(f"math500.jsonl not found; tried {[str(p) for p in candidates]} (use --data)")


_FRAC = r"\\[dt]?frac\{((?:[^{}]|\{[^{}]*\})+)\}\{((?:[^{}]|\{[^{}]*\})+)\}"


def equivalent_form(gold: str) -> str:
    """A rewrite of ``gold`` that a verifier should accept."""
    if re.fullmatch(r"-?\d+", gold):
        return gold + ".0"
    if re.search(_FRAC, gold):  # \frac{a}{b} -> a/b: needs math-verify, not the exact fast path
        return re.sub(_FRAC, lambda m: "/".join(x if x.isalnum() else f"({x})" for x in m.groups()), gold)
    if gold.startswith("(") and gold.endswith(")"):
        return "\\left" + gold[:-1] + "\\right)"
    return gold.replace(" ", "") if " " in gold else " " + gold + " "


def wrong_form(gold: str, rng: random.Random) -> str:
    """A plausible wrong answer: an integer off by a little, or one digit changed."""
    if re.fullmatch(r"-?\d+", gold):
        return str(int(gold) + rng.choice([-10, -2, -1, 1, 2, 3, 10]))
    digits = [m.start() for m in re.finditer(r"\d", gold)]
    if not digits:
        return gold + "+1"
    i = rng.choice(digits)
    return gold[:i] + str((int(gold[i]) + rng.randint(1, 9)) % 10) + gold[i + 1:]


def response_text(answer: str | None, rng: random.Random) -> str:
    work = f"First, {rng.randint(2, 99)} \\cdot {rng.randint(2, 9)} = {rng.randint(100, 900)}.\n"
    if answer is None:
        return work + "Then we continue the computation and"  # truncated, no answer
    if rng.random() < 0.1:
        return work + f"The answer is ${answer}$."
    return work + f"Therefore, the final answer is $\\boxed{{{answer}}}$."


def workload(golds: list[str], prompts: int, group: int, steps: int, seed: int) -> list[list[tuple[str, str]]]:
    """``steps`` lists of (response, gold) pairs, ``prompts * group`` pairs each."""
    rng = random.Random(seed)
    chosen = rng.sample(golds, prompts * steps) if prompts * steps <= len(golds) else \
        [rng.choice(golds) for _ in range(prompts * steps)]
    out = []
    for s in range(steps):
        step = []
        for gold in chosen[s * prompts:(s + 1) * prompts]:
            pool = [gold, equivalent_form(gold)] + [wrong_form(gold, rng) for _ in range(rng.randint(1, 3))]
            weights = [4, 1] + [2] * (len(pool) - 2)
            for _ in range(group):
                answer = None if rng.random() < 0.05 else rng.choices(pool, weights)[0]
                step.append((response_text(answer, rng), gold))
        out.append(step)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _plain_pass(warm, steps) -> tuple[float, float, list[float], list[bool]]:
    for step in warm:  # math-verify's first-use costs, outside the timing
        for response, gold in step:
            verify(parse(f"${gold}$"), parse(response))
    lat, verdicts = [], []
    t0, c0 = time.perf_counter(), time.process_time()
    for step in steps:
        for response, gold in step:
            t = time.perf_counter()
            verdicts.append(bool(verify(parse(f"${gold}$"), parse(response))))
            lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, time.process_time() - c0, lat, verdicts


def run_plain(warm, steps) -> tuple[float, float, list[float], list[bool]]:
    """A fresh process per pass, warmed like our fresh pool, so neither side has seen the data."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_plain_pass, (warm, steps))


def fresh_pool(warm, workers: int) -> None:
    V.configure_pool(workers)
    verify_pool.wait_ready()  # every worker started and warm (else one may still be starting in the timed steps)
    for step in warm:  # and warmed on other problems, outside the timing
        V.verify_batch([r for r, _ in step], [g for _, g in step])
    V.clear_caches()


def cpu_seconds() -> float | None:
    """CPU time of this process plus the verifier's worker processes (Linux /proc), else None."""
    total = time.process_time()
    for w in verify_pool._pool()._workers:
        try:
            with open(f"/proc/{w.proc.pid}/stat") as f:
                utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
        except OSError:
            return None
        total += (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
    return total


def run_ours(warm, steps, workers: int, batch: bool) -> tuple[float, float | None, list[float], list[bool]]:
    """verify() per pair (latency per pair), or verify_batch() per step (latency per step)."""
    fresh_pool(warm, workers)
    lat, verdicts = [], []
    t0, c0 = time.perf_counter(), cpu_seconds()
    for step in steps:
        if batch:
            t = time.perf_counter()
            verdicts += [r.correct for r in V.verify_batch([r for r, _ in step], [g for _, g in step])]
            lat.append(time.perf_counter() - t)
            continue
        for response, gold in step:
            t = time.perf_counter()
            verdicts.append(V.verify(response, gold).correct)
            lat.append(time.perf_counter() - t)
    wall, c1 = time.perf_counter() - t0, cpu_seconds()
    return wall, None if c0 is None or c1 is None else c1 - c0, lat, verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=V.DEFAULT_WORKERS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None, help="math500.jsonl (default: the packaged copy)")
    args = ap.parse_args()

    golds = load_golds(args.data)
    data = workload(golds, args.prompts, args.group, args.steps + 1, args.seed)
    warm, steps = data[:1], data[1:]  # the warm-up step uses other problems than the timed ones
    n = sum(len(s) for s in steps)
    print(f"{V.VERIFIER_VERSION}; {n} pairs ({args.steps} steps x {args.prompts} prompts x {args.group}); "
          f"{args.workers} workers; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    V.configure_pool(args.workers)
    t = time.perf_counter()
    V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}")  # starts the workers and waits for one to be ready
    print(f"first call on a new pool (worker start-up): {time.perf_counter() - t:.2f} s")
    verify_pool.wait_ready()
    print(f"every worker warm (parser warm-up in the background): {time.perf_counter() - t:.2f} s")
    print(f"{'round':>5} {'mode':>7} {'pairs/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU ms/pair':>11}"
          f"  {'speed-up':>8}  {'CPU ratio':>9}")
    for rnd in range(args.rounds):
        runs = {"plain": run_plain(warm, steps), "single": run_ours(warm, steps, args.workers, batch=False),
                "batch": run_ours(warm, steps, args.workers, batch=True)}
        plain_wall, plain_cpu = runs["plain"][:2]
        for mode, (wall, cpu, lat, _) in runs.items():
            ms = [1000 * x for x in lat]
            cpu_txt = f"{1000 * cpu / n:>11.2f}" if cpu is not None else f"{'n/a':>11}"
            ratio = f"{plain_cpu / cpu:>8.1f}x" if cpu else f"{'n/a':>9}"
            print(f"{rnd:>5} {mode:>7} {n / wall:>8.0f} {pct(ms, .5):>8.2f} {pct(ms, .99):>8.2f} {max(ms):>8.2f} "
                  f"{cpu_txt}  {plain_wall / wall:>7.1f}x  {ratio}" + ("  (latency per step)" if mode == "batch" else ""))
        plain_v, single_v, batch_v = (runs[m][3] for m in ("plain", "single", "batch"))
        assert batch_v == single_v, "verify and verify_batch disagree"
        agree = sum(a == b for a, b in zip(plain_v, batch_v))
        print(f"      verdicts: ours {sum(batch_v)} correct, plain {sum(plain_v)} correct, agree on {agree}/{n}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    V.close_pool()


if __name__ == "__main__":
    main()
