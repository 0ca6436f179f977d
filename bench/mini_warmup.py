"""The learning curve of a ``pair1-mini`` model's warm-up under a recipe of your choosing
(docs/results.md#the-papers-families-in-miniature): the pair file's spec with some keys replaced, trained by the
warm-up's own code (graftzoo.tiny.warmup.sft_train, no early stop), the greedy probe of every skill every
``--probe-every`` steps. Nothing is cached: it is for choosing a recipe, not for making the pair's weights.

Run: python bench/mini_warmup.py mini-qwen3 --set warmup.difficulty=2 --set warmup.steps=500 --set hidden=128
     [--probe-every 100 --probe-per-skill 50 --out docs/results/mini_warmup.json]
Keys: the spec's own (hidden, layers, heads, kv_heads, ffn, ...) and ``warmup.*``; values are YAML.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from graftzoo.contract.config import load_config
from graftzoo.tiny.build import TinyModelSpec, build_tiny
from graftzoo.tiny.warmup import probe, sft_train
from graftzoo.training.planner.build import tiny_spec


def recipe(model: str, sets: list) -> TinyModelSpec:
    """``model``'s spec in pair1-mini with ``key=value`` replacements (``warmup.*`` inside its recipe)."""
    cfg = load_config(pair="pair1-mini", algo="grpo")
    spec = next((s for s in cfg.pair.models if s.id == model), None)
    if spec is None:
        raise SystemExit(f"no model {model!r} in pair1-mini: {[s.id for s in cfg.pair.models]}")
    d = tiny_spec(spec).to_dict()
    for item in sets:
        key, _, value = item.partition("=")
        if key.startswith("warmup."):
            d["warmup"] = {**d["warmup"], key.split(".", 1)[1]: yaml.safe_load(value)}
        else:
            d[key] = yaml.safe_load(value)
    d["warmup"] = {**d["warmup"], "stop_when": None}   # the whole curve, no early stop
    return TinyModelSpec.from_dict(d)


def curve(model, tok, spec: TinyModelSpec, seed: int, every: int, per_skill: int) -> list:
    """One record per probe: step, mean loss of the last ``every`` steps, greedy accuracy per skill, elapsed s."""
    w = spec.warmup
    skills = sorted(k for k, v in w.mix.items() if v > 0) or ["add", "mul"]
    probe_w = replace(w, probe_per_skill=per_skill)
    out, losses, t0 = [], [], time.perf_counter()

    def at(rec: dict) -> None:
        losses.append(rec["loss"])
        if rec["step"] % every and rec["step"] != rec["steps"]:
            return
        acc = probe(model, tok, probe_w, seed, skills=skills, vocab=spec.tokenizer)
        model.train()
        out.append({"step": rec["step"], "loss": round(sum(losses[-every:]) / len(losses[-every:]), 4),
                    **{k: round(v, 3) for k, v in acc.items()}, "elapsed_s": round(time.perf_counter() - t0, 1)})
        print(json.dumps(out[-1]), flush=True)

    sft_train(model, tok, w, seed, progress=at, vocab=spec.tokenizer)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="mini-smollm3 or mini-qwen3")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probe-every", type=int, default=100)
    ap.add_argument("--probe-per-skill", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="append the result to this JSON file (a list)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = recipe(args.model, args.set)
    model, tok = build_tiny(spec, args.seed)
    n = sum(p.numel() for p in model.parameters())
    print(f"{spec.id}: {n:,} parameters; warm-up {spec.warmup}", flush=True)
    res = {"model": spec.id, "sets": args.set, "parameters": n, "spec": spec.to_dict(), "seed": args.seed,
           "threads": args.threads, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
           "curve": curve(model, tok, spec, args.seed, args.probe_every, args.probe_per_skill)}
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(old + [res], indent=1) + "\n")


if __name__ == "__main__":
    main()
