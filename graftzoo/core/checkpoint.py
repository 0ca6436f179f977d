"""Checkpoint / resume: both models and optimizers, learner state, data cursor, RNG states, the
step, peer cursors and the wandb run id. Written atomically (temp dir, then rename); the newest
``keep`` checkpoints are kept.

The layout is defined here and only here::

    RUN/checkpoints/step_000012/          checkpoint_dir(RUN, 12); checkpoint_step(...) == 12
        trainer.pt                        step, RNG states, trainer extras; present = complete
        <model id, "/" -> "__">.pt        weights_file(ckpt, model_id): {"policy": ..., "learner": ...}
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


CHECKPOINTS = "checkpoints"   # folder of a run directory holding its checkpoints
TRAINER_FILE = "trainer.pt"   # written last: a checkpoint directory holding it is complete
_PREFIX = "step_"


def checkpoint_dir(run_dir, step: int) -> Path:
    """``RUN/checkpoints/step_000012`` for step 12."""
    return Path(run_dir) / CHECKPOINTS / f"{_PREFIX}{int(step):06d}"


def checkpoint_step(ckpt) -> int:
    """The training step of ``.../checkpoints/step_N``."""
    name = Path(ckpt).name
    try:
        if not name.startswith(_PREFIX):
            raise ValueError
        return int(name[len(_PREFIX):])
    except ValueError:
        raise ValueError(f"{ckpt}: not a checkpoint directory (expected a name like step_000012)") from None


def weights_file(ckpt, model_id: str) -> Path:
    """The file of ``model_id``'s policy and learner state in a checkpoint (hub ids contain "/")."""
    return Path(ckpt) / f"{model_id.replace('/', '__')}.pt"


def is_checkpoint(path) -> bool:
    """Whether ``path`` is a complete checkpoint directory (``RUN/checkpoints/step_N`` with its trainer file)."""
    p = Path(path)
    return p.parent.name == CHECKPOINTS and p.name.startswith(_PREFIX) and (p / TRAINER_FILE).is_file()


def list_checkpoints(run_dir) -> list:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(p for p in root.glob(f"{_PREFIX}*") if (p / TRAINER_FILE).is_file()) if root.is_dir() else []


def latest_checkpoint(run_dir) -> Optional[Path]:
    """The newest complete checkpoint of a run, or None."""
    done = list_checkpoints(run_dir)
    return done[-1] if done else None


def save_checkpoint(run_dir, step: int, policies: dict, learners: dict, extra: dict, keep: int = 2) -> Path:
    final = checkpoint_dir(run_dir, step)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for mid, pol in policies.items():
        torch.save({"policy": pol.state_dict(), "learner": learners[mid].state_dict()}, weights_file(tmp, mid))
    torch.save({"step": step, "rng": _rng_state(), **extra}, tmp / TRAINER_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(root.glob(f"{_PREFIX}*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path, policies: dict, learners: dict) -> dict:
    path = Path(path)
    for mid, pol in policies.items():
        state = torch.load(weights_file(path, mid), weights_only=False)
        pol.load_state_dict(state["policy"])
        learners[mid].load_state_dict(state["learner"])
    trainer = torch.load(path / TRAINER_FILE, weights_only=False)
    _set_rng_state(trainer["rng"])
    return trainer


def load_weights(policy, ckpt) -> None:
    """Load ``policy``'s model weights (only: no optimizer or learner state) from a checkpoint directory."""
    path = weights_file(ckpt, policy.model_id)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint {ckpt} holds no weights for model {policy.model_id!r}")
    state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    policy.model.load_state_dict(state["policy"]["model"])
    policy.version = int(state["policy"].get("version", 0))
