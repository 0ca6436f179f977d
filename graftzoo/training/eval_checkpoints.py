"""Run directories and checkpoints as evaluation targets: the run's config, the target a path
names, the trained models' specs and fresh policies for them (the checkpoint layout itself, and
loading weights, are ``graftzoo.training.run.checkpoint``'s)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from graftzoo.contract.config import RunConfig, read_yaml, validate
from graftzoo.contract.errors import ConfigError, did_you_mean
from graftzoo.training.run.checkpoint import MANIFEST, TRAINER_FILE, is_checkpoint
from graftzoo.training.planner.build import build_policy
from graftzoo.eval.artifacts import CONFIG, ArtifactError


def load_run_config(run_dir) -> RunConfig:
    """The resolved config a run was trained with (``RUN/config.yaml``), validated; a garbled one is an
    ``ArtifactError`` (a broken file of the run, not a usage error) whose one-line message names the file."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; {run_dir} is not a graftzoo run directory")
    try:
        raw = read_yaml(path)  # ConfigError naming the file for invalid YAML or a non-mapping
    except ConfigError as e:  # YAML's messages span lines (marks): one line
        raise ArtifactError(" ".join(str(e).split())) from None
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path}: not a text (UTF-8) YAML file: {e}") from None
    for section in ("pair", "run"):
        if not isinstance(raw.get(section), dict):
            raise ArtifactError(f"{path}: not a run config (no '{section}' section)")
    if not isinstance(raw["pair"].get("models"), list) or not all(
            isinstance(s, dict) and isinstance(s.get("id"), str) for s in raw["pair"]["models"]):
        raise ArtifactError(f"{path}: not a run config ('pair.models' must be a list of model specs with ids)")
    try:
        return validate(raw)
    except ConfigError as e:  # e.g. the run's algorithm is a plugin not loaded now (--plugin): a usage error
        raise ConfigError(f"{path}: {e}") from None


def resolve_target(path) -> tuple:
    """(run_dir, checkpoint or None) for a checkpoint directory or a run directory."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such directory (expected a run dir or RUN/checkpoints/step_N)")
    if is_checkpoint(p):
        return p.parent.parent, p
    if (p / CONFIG).is_file():
        return p, None
    raise ConfigError(f"{p}: neither a run directory ({CONFIG}) nor a checkpoint ({MANIFEST}, or {TRAINER_FILE} "
                     f"of an older graftzoo)")


def trained_specs(cfg: RunConfig, models: Optional[Sequence[str]] = None) -> list:
    """Model specs of the models a run trained (``pair.train``), or of ``models``."""
    specs = cfg.pair.models
    ids = [s.id for s in specs]
    wanted = list(models) if models else (cfg.pair.train or ids)
    unknown = [m for m in wanted if m not in ids]
    if unknown:
        raise ConfigError(f"--model {unknown[0]!r}: not in the run's pair.models{did_you_mean(unknown[0], ids)} "
                          f"(models: {', '.join(ids)})")
    return [s for s in specs if s.id in wanted]


def build_policies(cfg: RunConfig, models: Optional[Sequence[str]] = None) -> dict:
    """Fresh policies (model id -> Policy) for the run's trained models, from their pair specs."""
    return {s.id: build_policy(s, cfg, cfg.run.seed) for s in trained_specs(cfg, models)}
