"""Calibrate the tiny pair: warm both models (cached), then measure their skill profile.

Prints, per model and skill, on held-out problems: greedy accuracy, T=1 pass@1 (mean over the
samples), pass@n, and the all-fail fraction at n; then, for each model as learner, the fraction
of its all-fail prompts on which the peer's group is mixed / all-success / all-fail
(docs/results.md explain why those are the numbers that matter for GRAFT).
Sampling is plain ``model.generate`` at T=1, top-k 0, top-p 1.

    python bench/calibrate_tiny.py [--config configs/pairs/tiny.yaml] [--per-skill 200] [--samples 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import yaml

from graftzoo.contract.config import model_spec, packaged_configs
from graftzoo.envs.arithmetic import generate_prompts, is_correct
from graftzoo.tiny.warmup import generate, load_tiny, max_new_tokens_for, warmup_info, warmup_pair
from graftzoo.training.planner.build import tiny_spec



def evaluate(model, tok, prompts, samples: int) -> dict:
    """Greedy correctness and T=1 per-sample correctness for each prompt."""
    solutions = [p.metadata["solution"] for p in prompts]
    mnt = max_new_tokens_for(tok, solutions)
    questions = [p.text for p in prompts]
    greedy = generate(model, tok, questions, mnt)
    sampled = generate(model, tok, questions, mnt, num_samples=samples, do_sample=True)
    lengths = [len(ids) + 1 for ids in tok(solutions, add_special_tokens=False)["input_ids"]]
    return {"greedy": [is_correct(g[0], p.gold) for g, p in zip(greedy, prompts)],
            "sampled": [[is_correct(s, p.gold) for s in ss] for ss, p in zip(sampled, prompts)],
            "target_tokens": lengths, "max_new_tokens": mnt}


def mean(xs) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(packaged_configs() / "pairs" / "tiny.yaml"))
    ap.add_argument("--per-skill", type=int, default=200, help="held-out prompts per skill")
    ap.add_argument("--samples", type=int, default=8, help="T=1 samples per prompt")
    ap.add_argument("--eval-seed", type=int, default=999)
    ap.add_argument("--warmup-seed", type=int, default=None, help="default: each spec's warmup.seed")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = yaml.safe_load(Path(args.config).read_text())  # the pair file as plain data
    specs = [tiny_spec(model_spec(m)) for m in pair["models"]]
    task = pair["task"]
    skills = [k for k, v in task["mix"].items() if v > 0]

    t0 = time.perf_counter()
    paths = warmup_pair(specs, args.warmup_seed, args.cache_dir)
    print(f"warm-up (or cache hit): {time.perf_counter() - t0:.1f} s wall")
    for s, p in zip(specs, paths):
        info = warmup_info(p)
        print(f"  {s.id}: {info['steps']} steps, train {info['train_s']:.1f} s, final loss {info['final_loss']:.4f}, "
              f"probe greedy {info['probe_greedy']}  [{p}]")

    prompts = {k: generate_prompts(args.per_skill, args.eval_seed, {k: 1.0}, task["difficulty"], "test")
               for k in skills}
    res = {}
    for s, p in zip(specs, paths):
        torch.manual_seed(args.eval_seed)
        model, tok = load_tiny(p)
        t = time.perf_counter()
        res[s.id] = {k: evaluate(model, tok, prompts[k], args.samples) for k in skills}
        print(f"  eval {s.id}: {time.perf_counter() - t:.1f} s")

    n = args.samples
    print(f"\nheld-out: {args.per_skill} prompts per skill, {n} samples at T=1; difficulty {task['difficulty']}")
    print(f"{'model':<18}{'skill':<7}{'greedy':>8}{'pass@1':>8}{'pass@' + str(n):>8}{'allfail':>9}"
          f"{'tgt tok':>9}{'max tok':>9}")
    out = {"per_skill": {}, "complementarity": {}}
    for mid, by_skill in res.items():
        for k, r in by_skill.items():
            row = {"greedy": mean(r["greedy"]),
                   "pass@1": mean([mean(x) for x in r["sampled"]]),
                   f"pass@{n}": mean([any(x) for x in r["sampled"]]),
                   "all_fail": mean([not any(x) for x in r["sampled"]]),
                   "target_tokens_mean": statistics.mean(r["target_tokens"]),
                   "target_tokens_max": max(r["target_tokens"])}
            out["per_skill"].setdefault(mid, {})[k] = row
            print(f"{mid:<18}{k:<7}{row['greedy']:>8.3f}{row['pass@1']:>8.3f}{row[f'pass@{n}']:>8.3f}"
                  f"{row['all_fail']:>9.3f}{row['target_tokens_mean']:>9.1f}{row['target_tokens_max']:>9d}")

    ids = list(res)
    print(f"\nlearner all-fail prompts (n={n}): the peer's group on them")
    print(f"{'learner':<18}{'skill':<7}{'#allfail':>9}{'peer mixed':>12}{'peer all-succ':>15}{'peer all-fail':>15}")
    for learner, peer in ((ids[0], ids[1]), (ids[1], ids[0])):
        for k in skills + ["all"]:
            ks = skills if k == "all" else [k]
            pairs = [(a, b) for kk in ks for a, b in zip(res[learner][kk]["sampled"], res[peer][kk]["sampled"])
                     if not any(a)]
            mixed = mean([any(b) and not all(b) for _, b in pairs])
            succ = mean([all(b) for _, b in pairs])
            fail = mean([not any(b) for _, b in pairs])
            out["complementarity"].setdefault(learner, {})[k] = {"all_fail": len(pairs), "peer_mixed": mixed,
                                                                 "peer_all_success": succ, "peer_all_fail": fail}
            print(f"{learner:<18}{k:<7}{len(pairs):>9d}{mixed:>12.3f}{succ:>15.3f}{fail:>15.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
