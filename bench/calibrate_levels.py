"""Trace a tiny model's skill profile through its warm-up, to choose ``warmup.stop_when`` levels.

Warms one model of a pair file (its recipe, or only ``--phase then`` from its first-phase checkpoint) and, every
``--every`` steps, measures on ``--per-skill`` held-out problems of ``--skill``: greedy accuracy (what
``stop_when`` reads) and T=1 pass@1 and pass@n (what the regime map's rows are named by). Nothing is cached.
The mul-* pairs (configs/pairs/mul-*.yaml) were set from its output.

    python bench/calibrate_levels.py --pair mul-l3-same --model qwen-mul-l3 [--skill mul] [--every 50]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from graftzoo.contract.config import find_config, model_spec, read_yaml
from graftzoo.training.planner.build import tiny_spec
from graftzoo.envs.arithmetic import generate_prompts, is_correct
from graftzoo.tiny.build import build_tiny
from graftzoo.tiny.warmup import CONTINUE_START, generate, load_or_warmup, load_tiny, max_new_tokens_for, sft_train


def profile(model, tok, prompts, n: int) -> dict:
    """Greedy accuracy, T=1 pass@1 and pass@n of ``model`` on ``prompts``."""
    mnt = max_new_tokens_for(tok, [p.metadata["solution"] for p in prompts])
    qs = [p.text for p in prompts]
    greedy = generate(model, tok, qs, mnt)
    sampled = generate(model, tok, qs, mnt, num_samples=n, do_sample=True)
    ok = [[is_correct(s, p.gold) for s in ss] for ss, p in zip(sampled, prompts)]
    return {"greedy": statistics.fmean(is_correct(g[0], p.gold) for g, p in zip(greedy, prompts)),
            "pass@1": statistics.fmean(statistics.fmean(x) for x in ok),
            f"pass@{n}": statistics.fmean(any(x) for x in ok)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--skill", default="mul")
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--per-skill", type=int, default=200)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="override the phase's step cap")
    ap.add_argument("--phase", choices=["first", "then"], default="first")
    ap.add_argument("--eval-seed", type=int, default=999)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = read_yaml(find_config("pairs", args.pair))
    entry = next(m for m in pair["models"] if m["id"] == args.model)
    spec = tiny_spec(model_spec(entry))
    w, seed = spec.warmup, spec.warmup.seed
    start = 0
    if args.phase == "then":
        model, tok = load_tiny(load_or_warmup(replace(spec, warmup=w.first_phase())))
        w, start = w.then, CONTINUE_START
    else:
        model, tok = build_tiny(spec, seed)
        w = w.first_phase()
    w = replace(w, stop_when=None, steps=args.steps or w.steps)
    prompts = generate_prompts(args.per_skill, args.eval_seed, {args.skill: 1.0}, w.difficulty, "test")
    trace, t0 = [], time.perf_counter()

    def probe(info):
        if info["step"] % args.every == 0:
            model.eval()
            with torch.no_grad():
                row = {"step": info["step"], **profile(model, tok, prompts, args.samples)}
            model.train()
            trace.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)

    sft_train(model, tok, w, seed, probe, start=start)
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
