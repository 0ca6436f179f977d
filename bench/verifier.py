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
graftzoo passes start from empty caches and a freshly started (warmed) pool.

Run: python bench/verifier.py [--prompts 64 --group 8 --steps 4 --rounds 2 --workers 2]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from importlib import resources
from pathlib import Path

from graftzoo.envs import verifier as V

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


def equivalent_form(gold: str) -> str:
    """A rewrite of ``gold`` that a verifier should accept."""
    if re.fullmatch(r"-?\d+", gold):
        return gold + ".0"
    if "\\frac" in gold:
        return gold.replace("\\frac", "\\dfrac")
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


def run_plain(steps) -> tuple[float, list[float], list[bool]]:
    from math_verify import parse, verify
    lat, verdicts = [], []
    t0 = time.perf_counter()
    for step in steps:
        for response, gold in step:
            t = time.perf_counter()
            verdicts.append(bool(verify(parse(f"${gold}$"), parse(response))))
            lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, lat, verdicts


def fresh_pool(workers: int) -> None:
    V.configure_pool(workers)
    V.clear_caches()
    V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}")  # start the workers outside the timing (not a fast-path pair)
    V.clear_caches()


def run_single(steps, workers: int) -> tuple[float, list[float], list[bool]]:
    fresh_pool(workers)
    lat, verdicts = [], []
    t0 = time.perf_counter()
    for step in steps:
        for response, gold in step:
            t = time.perf_counter()
            verdicts.append(V.verify(response, gold).correct)
            lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, lat, verdicts


def run_batch(steps, workers: int) -> tuple[float, list[float], list[bool]]:
    fresh_pool(workers)
    step_times, verdicts = [], []
    t0 = time.perf_counter()
    for step in steps:
        t = time.perf_counter()
        verdicts += [r.correct for r in V.verify_batch([r for r, _ in step], [g for _, g in step])]
        step_times.append(time.perf_counter() - t)
    return time.perf_counter() - t0, step_times, verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=V.DEFAULT_WORKERS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None, help="math500.jsonl (default: the packaged copy)")
    args = ap.parse_args()

    golds = load_golds(args.data)
    warm = workload(golds, 4, args.group, 1, seed=args.seed + 1000)
    run_plain(warm)  # imports and math-verify's first-use costs, outside the timing
    steps = workload(golds, args.prompts, args.group, args.steps, args.seed)
    n = sum(len(s) for s in steps)
    uniq = sum(len(set(s)) for s in steps)
    print(f"{V.VERIFIER_VERSION}; {n} pairs ({args.steps} steps x {args.prompts} prompts x {args.group}), "
          f"{uniq} distinct (response, gold); {args.workers} workers")
    print(f"{'round':>5} {'mode':>7} {'pairs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  vs plain")
    for rnd in range(args.rounds):
        plain_s, plain_lat, plain_v = run_plain(steps)
        single_s, single_lat, single_v = run_single(steps, args.workers)
        batch_s, step_lat, batch_v = run_batch(steps, args.workers)
        for mode, secs, lat, unit in (("plain", plain_s, plain_lat, "pair"), ("single", single_s, single_lat, "pair"),
                                      ("batch", batch_s, step_lat, "step")):
            ms = [1000 * x for x in lat]
            print(f"{rnd:>5} {mode:>7} {n / secs:>9.0f} {pct(ms, .5):>8.2f} {pct(ms, .99):>8.2f} {max(ms):>8.2f}"
                  f"  {plain_s / secs:>5.1f}x{'  (latency per ' + unit + ')' if unit == 'step' else ''}")
        agree = sum(a == b for a, b in zip(plain_v, batch_v))
        assert batch_v == single_v, "verify and verify_batch disagree"
        print(f"      verdicts: ours {sum(batch_v)} correct, plain {sum(plain_v)} correct, agree on {agree}/{n}")
    V.close_pool()


if __name__ == "__main__":
    main()
