"""Run directories and checkpoints as evaluation targets: the run's config, the target a path
names, the trained models' specs and fresh policies for them (the checkpoint layout itself, and
loading weights, are ``graftzoo.core.checkpoint``'s)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import yaml

from graftzoo.core.checkpoint import is_checkpoint
from graftzoo.core.models import build_policy
from graftzoo.eval.artifacts import CONFIG


def load_run_config(run_dir) -> dict:
    """The resolved config a run was trained with (``RUN/config.yaml``)."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; {run_dir} is not a graftzoo run directory")
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(cfg, dict) or not isinstance(cfg.get("pair"), dict):
        raise ValueError(f"{path}: not a run config (no 'pair' section)")
    return cfg


def resolve_target(path) -> tuple:
    """(run_dir, checkpoint or None) for a checkpoint directory or a run directory."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such directory (expected a run dir or RUN/checkpoints/step_N)")
    if is_checkpoint(p):
        return p.parent.parent, p
    if (p / CONFIG).is_file():
        return p, None
    raise ValueError(f"{p}: neither a run directory (config.yaml) nor a checkpoint (trainer.pt)")


def trained_specs(cfg: dict, models: Optional[Sequence[str]] = None) -> list:
    """Model specs of the models a run trained (``pair.train``), or of ``models``."""
    specs = cfg["pair"]["models"]
    ids = [s["id"] for s in specs]
    wanted = list(models) if models else (cfg["pair"].get("train") or ids)
    unknown = [m for m in wanted if m not in ids]
    if unknown:
        raise ValueError(f"model(s) {unknown} are not in the run's pair.models {ids}")
    return [s for s in specs if s["id"] in wanted]


def build_policies(cfg: dict, models: Optional[Sequence[str]] = None) -> dict:
    """Fresh policies (model id -> Policy) for the run's trained models, from their pair specs."""
    return {s["id"]: build_policy(s, cfg, int(cfg["run"]["seed"])) for s in trained_specs(cfg, models)}
