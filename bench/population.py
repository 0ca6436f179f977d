"""What a third peer costs (docs/results.md#a-third-peer): the step time of GRAFT (online peers) on the tiny pair
(N = 2) against the tiny population of three (N = 3: the pair and tiny-llama-rpair), at the same prompts per step,
n and task, every model training every step, steps taken alternately on one process; the first ``--skip`` left out.
Also the third model's first-use warm-up, as its cached ``warmup.json`` records it (run any tiny3 command once
first, or this warms it up and the time is the warm-up's).

Run: python bench/population.py [--steps 6 --skip 1 --set task.prompts_per_step=16 ...] [--out FILE.json]
"""
from __future__ import annotations

import os

import mini_pair  # bench/: the step-time measurement of the miniature pair
from graftzoo.contract.config import load_config
from graftzoo.tiny.warmup import load_or_warmup, warmup_info
from graftzoo.training.planner.build import tiny_spec

PAIRS = {"tiny": 2, "tiny3": 3}
SAME_TASK = ['task.mix={"add": 1, "sub": 1, "mul": 1}', "task.difficulty=3"]


def third_warmup() -> dict:
    spec = load_config(pair="tiny3", algo="grpo").pair.models[2]
    info = warmup_info(load_or_warmup(tiny_spec(spec)))
    return {"model": spec.id, **{k: info.get(k) for k in ("steps", "max_steps", "train_s", "probe_greedy")}}


def step_times(steps: int, skip: int, extra: list) -> dict:
    """``bench/mini_pair.py``'s measurement, on the tiny pair and tiny3 with the same task."""
    res = mini_pair.step_times(list(PAIRS), steps, skip, [*SAME_TASK, *extra])
    out = {k: v for k, v in res.items() if k not in PAIRS}
    out.update({f"N={n} ({p})": res[p] for p, n in PAIRS.items()})
    out["ratio_3_over_2"] = round(res["tiny3"]["median_s"] / res["tiny"]["median_s"], 2)
    return out


def main():
    args = mini_pair.step_args(__doc__, 16, "both populations")
    res = {"cpus": len(os.sched_getaffinity(0)), "load_before": os.getloadavg()[0], "warmup": third_warmup(),
           "step": step_times(args.steps, args.skip, args.overrides), "load_after": os.getloadavg()[0]}
    mini_pair.report(res, args.out)


if __name__ == "__main__":
    main()
