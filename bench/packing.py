"""Padded vs packed micro-batches (``optim.packing``): forward + backward time of ``Policy.logprobs`` and the tokens
the model processes, for rows of very different lengths on a tiny Qwen2 built in code (nothing downloaded).

Rows: ``--rows`` prompt + response pairs, total lengths spread evenly over ``--min``..``--max`` tokens (a 20-token
prompt each), as one micro-batch. Each variant is timed ``--repeat`` times after one warm-up pass; the median is
printed, with the tokens per pass (padded: rows x longest row; packed: the real tokens).

    python bench/packing.py [--rows 8] [--min 50] [--max 1000] [--repeat 5] [--device cpu] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from graftzoo.contract.batch import pad_pairs
from graftzoo.tiny.build import TinyModelSpec, build_tiny
from graftzoo.training.models.policy import Policy


def timed(pol: Policy, ids, att, R: int, repeat: int, device: str) -> float:
    """The median seconds of ``repeat`` forward + backward passes of ``pol.logprobs`` (after one warm-up)."""
    times = []
    for i in range(repeat + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logp, _ = pol.logprobs(ids, att, R)
        logp.sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        pol.model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Run the measurement and print one JSON line per variant and the speed-up."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--min", type=int, default=50)
    ap.add_argument("--max", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    spec = TinyModelSpec(id="bench-qwen2", family="qwen2", tokenizer="char", hidden=128, layers=4, heads=4,
                         kv_heads=2, ffn=256, max_positions=a.max + 8, warmup={"steps": 0})
    model, tok = build_tiny(spec, seed=0)
    pol = Policy(spec.id, model.to(a.device).train(), tok)
    g = torch.Generator().manual_seed(0)
    lengths = [round(a.min + (a.max - a.min) * i / max(1, a.rows - 1)) for i in range(a.rows)]
    prompts = [torch.randint(4, len(tok), (20,), generator=g).tolist() for _ in lengths]
    resps = [torch.randint(4, len(tok), (n - 20,), generator=g).tolist() for n in lengths]
    ids, att, R = pad_pairs(prompts, resps, pol.pad_id)
    out = {}
    for packing in (False, True):
        pol.packing = packing
        sec = timed(pol, ids, att, R, a.repeat, a.device)
        tokens = int(att.sum()) if packing else int(att.numel())
        out[packing] = sec
        print(json.dumps({"packing": packing, "rows": a.rows, "lengths": f"{min(lengths)}..{max(lengths)}",
                          "tokens_per_pass": tokens, "median_s": round(sec, 4), "device": a.device}))
    print(json.dumps({"speedup": round(out[False] / out[True], 2),
                      "padding_share": round(1 - int(att.sum()) / int(att.numel()), 3)}))


if __name__ == "__main__":
    main()
