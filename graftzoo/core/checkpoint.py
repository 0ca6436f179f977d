"""Checkpoint / resume: both models and optimizers, learner state, data cursor, RNG states, the
step, peer cursors and the wandb run id. Written atomically (temp dir, then rename); the newest
``keep`` checkpoints are kept.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir, step: int, policies: dict, learners: dict, extra: dict, keep: int = 2) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for mid, pol in policies.items():
        torch.save({"policy": pol.state_dict(), "learner": learners[mid].state_dict()},
                   tmp / f"{mid.replace('/', '__')}.pt")
    torch.save({"step": step, "rng": _rng_state(), **extra}, tmp / "trainer.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(root.glob("step_*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir) -> Optional[Path]:
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob("step_*") if (p / "trainer.pt").exists()) if root.is_dir() else []
    return done[-1] if done else None


def load_checkpoint(path, policies: dict, learners: dict) -> dict:
    path = Path(path)
    for mid, pol in policies.items():
        state = torch.load(path / f"{mid.replace('/', '__')}.pt", weights_only=False)
        pol.load_state_dict(state["policy"])
        learners[mid].load_state_dict(state["learner"])
    trainer = torch.load(path / "trainer.pt", weights_only=False)
    _set_rng_state(trainer["rng"])
    return trainer
