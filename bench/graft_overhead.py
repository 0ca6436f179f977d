"""Step-time overhead of GRAFT over GRPO at the same n, co-training the same pair.

Two trainers, one per algorithm (``--peer online`` for GRAFT), with the same seeds, prompt stream and n,
take their steps alternately (GRPO step t, GRAFT step t, GRPO step t+1, ...); both models of the pair train
in every step. The first ``--skip`` steps are left out (start-up: verifier workers, allocator). Reported: the
median seconds per step of each, the median of the per-step ratios GRAFT/GRPO (target <= 1.15), and GRAFT's
exchange time (the runs' trajectories part after step 0, so the step ratio also carries their different lengths).
GRAFT's extra work is the exchange (selection, re-tokenization and theta_old scoring of grafted text) and
the grafted rows in the update (replacement keeps the slot count, so the number of optimizer steps is GRPO's).

Run: python bench/graft_overhead.py [--pair tiny --steps 8 --skip 2 -c extra.yaml --set rollout.n=8 ...]
(--pair tiny falls back to micro when configs/pairs/tiny.yaml is absent.)
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from graftzoo.contract.config import find_config, load_config
from graftzoo.training.trainer import Trainer


def trainer(pair: str, algo: str, out: str, steps: int, files: list, extra: list) -> Trainer:
    peer = ["peer.source=online"] if algo == "graft" else []
    cfg = load_config(pair=pair, algo=algo, files=files, overrides=[
        "run.track=false", "run.progress=false", f"run.out_dir={out}", f"run.name={algo}", f"run.steps={steps}",
        *peer, *extra])
    return Trainer(cfg, resume=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="tiny")
    ap.add_argument("--steps", type=int, default=8, help="steps per algorithm, including the skipped ones")
    ap.add_argument("--skip", type=int, default=2, help="start-up steps left out of the medians")
    ap.add_argument("-c", "--config", dest="files", action="append", default=[], help="extra YAML config file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override applied to both runs (e.g. rollout.n=8)")
    args = ap.parse_args()
    pair = args.pair if find_config("pairs", args.pair) else "micro"
    if pair != args.pair:
        print(f"configs/pairs/{args.pair}.yaml not found: using the micro pair")
    with tempfile.TemporaryDirectory() as out:
        runs = {a: trainer(pair, a, out, args.steps, args.files, args.overrides) for a in ("grpo", "graft")}
        cfg = runs["graft"].cfg
        times = {a: [] for a in runs}
        rescued, exchange = [], []
        for step in range(args.steps):
            for algo, tr in runs.items():
                t0 = time.perf_counter()
                mets = tr.train_step(step)
                times[algo].append(time.perf_counter() - t0)
                if algo == "graft":
                    rescued.append(sum(m.get("peer/rescued_groups") or 0 for m in mets.values()))
                    exchange.append(sum(m["time/exchange"] for m in mets.values()))
    kept = slice(args.skip, None)
    ratios = [b / a for a, b in zip(times["grpo"][kept], times["graft"][kept])]
    print(f"pair {pair} ({', '.join(runs['graft'].model_ids)}), {cfg.task.prompts_per_step} prompts x "
          f"n={cfg.rollout.n}, optim.minibatches={cfg.optim.minibatches}, "
          f"{args.steps - args.skip} timed steps each (of {args.steps}), alternating")
    for algo in runs:
        print(f"  {algo:5s} s/step: median {statistics.median(times[algo][kept]):.3f}  "
              f"all: {' '.join(f'{t:.2f}' for t in times[algo])}")
    print(f"  GRAFT grafted groups per step (both models): {' '.join(map(str, rescued))}")
    xs, gs = statistics.median(exchange[kept]), statistics.median(times["graft"][kept])
    print(f"  GRAFT exchange s/step (selection, re-tokenization, theta_old scoring; both models): median "
          f"{xs:.3f} = {xs / gs:.1%} of its step")
    print(f"step-time ratio GRAFT/GRPO (median of per-step ratios): {statistics.median(ratios):.3f}  (target <= 1.15)")


if __name__ == "__main__":
    main()
