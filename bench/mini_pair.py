"""What the paper's families in miniature cost on this machine (docs/results.md#the-papers-families-in-miniature).

1. Building each real tokenizer from its rank file (graftzoo.tiny.vocab.build_vocab), uncached.
2. The warm-up of each pair1-mini model, as recorded in its cached ``warmup.json`` (steps, seconds, greedy probe);
   run any pair1-mini command once first, or this warms them up (and the time is the warm-up's).
3. The step time of GRAFT (online peer) on pair1-mini against the tiny pair at the same prompts per step and n, both
   models training every step, steps taken alternately; the first ``--skip`` left out.

Run: python bench/mini_pair.py [--steps 6 --skip 1 --set task.prompts_per_step=8 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from graftzoo.contract.config import load_config
from graftzoo.tiny import vocab
from graftzoo.tiny.warmup import load_or_warmup, warmup_info
from graftzoo.training.planner.build import tiny_spec
from graftzoo.training.trainer import Trainer


def tokenizer_builds() -> dict:
    out = {}
    for name in vocab.VOCABS:
        t0 = time.perf_counter()
        tok = vocab.build_vocab(name)
        out[name] = {"build_s": round(time.perf_counter() - t0, 2), "tokens": len(tok)}
    return out


def warmups(pair: str) -> dict:
    cfg = load_config(pair=pair, algo="grpo")
    out = {}
    for spec in cfg.pair.models:
        info = warmup_info(load_or_warmup(tiny_spec(spec)))
        out[spec.id] = {k: info.get(k) for k in ("steps", "max_steps", "train_s", "stop_probe_s", "probe_s",
                                                 "probe_greedy", "final_loss")}
    return out


def step_times(pairs: list, steps: int, skip: int, extra: list) -> dict:
    with tempfile.TemporaryDirectory() as out:
        runs = {}
        for pair in pairs:
            cfg = load_config(pair=pair, algo="graft", overrides=[
                "run.track=false", "run.progress=false", f"run.out_dir={out}", f"run.name={pair}",
                f"run.steps={steps}", "peer.source=online", *extra])
            runs[pair] = Trainer(cfg, resume=False)
        times = {p: [] for p in runs}
        for step in range(steps):
            for pair, tr in runs.items():
                t0 = time.perf_counter()
                tr.train_step(step)
                times[pair].append(time.perf_counter() - t0)
        cfg = runs[pairs[0]].cfg
        for tr in runs.values():
            tr.close()
    kept = {p: t[skip:] for p, t in times.items()}
    return {"prompts_per_step": cfg.task.prompts_per_step, "n": cfg.rollout.n, "timed_steps": steps - skip,
            **{p: {"median_s": round(statistics.median(t), 2), "all_s": [round(x, 2) for x in times[p]]}
               for p, t in kept.items()}}


def step_args(description: str, prompts_per_step: int, what: str) -> argparse.Namespace:
    """The command line of a step-time bench: --steps, --skip, --set (after ``task.prompts_per_step``), --out."""
    ap = argparse.ArgumentParser(description=description.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[f"task.prompts_per_step={prompts_per_step}"],
                    metavar="KEY=VALUE", help=f"config override applied to {what}")
    ap.add_argument("--out", help="write the figures as JSON here")
    return ap.parse_args()


def report(res: dict, out) -> None:
    """The figures on stdout, and as JSON in ``out`` where given."""
    print(json.dumps(res, indent=1))
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)


def main():
    args = step_args(__doc__, 8, "both pairs")
    res = {"cpus": len(os.sched_getaffinity(0)), "load_before": os.getloadavg()[0],
           "tokenizers": tokenizer_builds(), "warmup": warmups("pair1-mini"),
           "step": step_times(["pair1-mini", "tiny"], args.steps, args.skip, args.overrides),
           "load_after": os.getloadavg()[0]}
    report(res, args.out)


if __name__ == "__main__":
    main()
