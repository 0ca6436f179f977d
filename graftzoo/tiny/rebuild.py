"""Warm the shipped tiny models' recipes up anew on this machine and compare them with the shipped ones
(graftzoo.tiny.shipped, docs/guide.md#shipped-tiny-weights):

    python -m graftzoo.tiny.rebuild              # every shipped model: probe of the shipped and the rebuilt model
    python -m graftzoo.tiny.rebuild --write      # maintainers: the rebuilt folders replace the shipped ones
    python -m graftzoo.tiny.rebuild --check      # verify the shipped files against the manifest

Exit 1 when a rebuilt model's greedy probe is more than ``QUALITY_TOLERANCE`` from the shipped model's on a skill.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from graftzoo.tiny.build import TinyModelSpec
from graftzoo.tiny.shipped import QUALITY_TOLERANCE, manifest, ship, verified, weights_hash
from graftzoo.tiny.warmup import load_or_warmup, load_tiny, probe


def rebuild(model_ids=None, write: bool = False, threads: int = 1) -> dict:
    """Warm every shipped recipe (or ``model_ids``) up anew on this machine, in a fresh cache, and probe the shipped
    and the rebuilt model alike (greedy, the recipe's probe split and size). model id -> {"shipped", "rebuilt":
    probe by skill, "same_quality": every skill within ``QUALITY_TOLERANCE``, "same_weights": identical bytes}.
    ``write``: the rebuilt folders replace the shipped ones."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="graftzoo-rebuild-") as cache:
        for model_id, entry in manifest().items():
            if model_ids and model_id not in model_ids:
                continue
            spec = TinyModelSpec.from_dict({**entry["recipe"]["spec"], "id": model_id})
            seed = entry["recipe"]["seed"]
            path = load_or_warmup(spec, seed, cache_dir=cache, threads=threads, shipped=False)
            w = spec.warmup.then or spec.warmup
            probes = {}
            for which, folder in (("shipped", verified(model_id)), ("rebuilt", Path(path))):
                model, tok = load_tiny(str(folder))
                probes[which] = probe(model, tok, w, seed, vocab=spec.tokenizer)
            out[model_id] = {**probes, "same_weights": weights_hash(path) == weights_hash(verified(model_id)),
                             "same_quality": all(abs(probes["rebuilt"][k] - v) <= QUALITY_TOLERANCE
                                                 for k, v in probes["shipped"].items())}
            if write:
                ship(path, model_id)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graftzoo.tiny.rebuild", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="model ids (default: every shipped model)")
    parser.add_argument("--check", action="store_true", help="only verify the shipped files against the manifest")
    parser.add_argument("--write", action="store_true", help="replace the shipped copies with the rebuilt ones")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.check:
        for model_id in manifest():
            print(f"{model_id}: {weights_hash(verified(model_id))[:12]} ok")
        return 0
    res = rebuild(args.models, args.write, args.threads)
    for model_id, r in res.items():
        print(f"{model_id}: shipped {r['shipped']}  rebuilt {r['rebuilt']}  same quality {r['same_quality']}  "
              f"identical weights {r['same_weights']}")
    print(json.dumps(res, indent=1))
    return 0 if all(r["same_quality"] for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
