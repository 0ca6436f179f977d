"""The paper's families in miniature for tests (docs/guide.md#the-papers-families-in-miniature): ``pair1-mini``
untrained (a warm-up of 0 steps: the real architectures and tokenizers, no skill), in runs small enough for CI.

Every test module that trains or scores a miniature writes its pair file with ``untrained_pair``; the models and the
tokenizers are built once per machine and cached (``$GRAFTZOO_CACHE``), so modules share them across the session."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

from graftzoo.contract.config import pair_file

SMOL, QWEN = "mini-smollm3", "mini-qwen3"
# Both families 64 wide in CI: the trained pair's SmolLM3 is 128 wide (a 64-wide one learns no arithmetic from its
# Llama-3 vocabulary's three-digit number tokens), which would double the cost of its output layer in every test.
CI_WIDTH = {"hidden": 64, "heads": 2, "kv_heads": 1, "ffn": 256}


def untrained_spec(model: dict) -> dict:
    """A pair1-mini model entry 64 wide with a warm-up of 0 steps (the seeded initial weights, cached as a warm-up
    is)."""
    out = {**copy.deepcopy(model), **CI_WIDTH}
    out["warmup"] = {"steps": 0, "seed": 0}
    return out


def untrained_pair(folder, name: str = "pair1-mini-untrained", **sections) -> Path:
    """Write pair1-mini with untrained models and a small run (4 prompts x 4 rollouts of up to 16 tokens, 2 steps,
    an 8-prompt evaluation) to ``folder/NAME.yaml``; ``sections`` update its top-level sections key by key."""
    cfg = yaml.safe_load(Path(pair_file("pair1-mini")).read_text())
    cfg["name"] = name
    cfg["models"] = [untrained_spec(m) for m in cfg["models"]]
    for m in cfg["models"]:
        m["max_new_tokens"] = 16
    small = {"task": {"prompts_per_step": 4}, "rollout": {"n": 4}, "optim": {"minibatches": 2, "warmup_steps": 0},
             "run": {"steps": 2, "save_every": 1}, "eval": {"size": 8, "k": 1}}
    for sec, vals in {**small, **sections}.items():
        cfg.setdefault(sec, {}).update(vals) if isinstance(vals, dict) else cfg.__setitem__(sec, vals)
    path = Path(folder) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
