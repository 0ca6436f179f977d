"""Tracking: a local metrics JSONL (always) and wandb (offline when no API key; ``run.track=false`` turns it off).

The metric vocabulary is the same for every algorithm (cleanRL's habit): every key of ``METRICS``
is present in every record, ``None`` where it does not apply (e.g. peer metrics of a GRPO run).

wandb settings: ``run.wandb_project`` / ``run.wandb_group`` / ``run.wandb_mode`` and ``tracking.entity``. A resumed
run continues the same wandb run (its id is kept in the checkpoint: ``resume_id``). Every
``tracking.log_completions_every`` steps (0 = never) each model logs a completions table ``<model>/completions``
(``COMPLETION_COLUMNS``, at most ``tracking.completions_rows`` rows, peer rows first): the responses the step trains
on, from the exchange's slots, whatever the algorithm.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional

import torch

from graftzoo.algos.functional import compatibility_score
from graftzoo.contract import metrics as M
from graftzoo.contract.config import RunConfig, as_dict

METRICS = list(M.EVERY_RECORD)  # the fixed vocabulary (graftzoo.contract.metrics: names, units, meanings)


def _clean(v):
    """A metric value as JSON data. NaN and inf stay visible (written as ``NaN`` / ``Infinity``, which Python's
    json and pandas read back as floats): a run that diverges must not look like one that logged nothing."""
    if hasattr(v, "item"):
        return v.item()
    return v


log = logging.getLogger("graftzoo")

COMPLETION_COLUMNS = ["step", "model", "prompt", "response", "reward", "advantage", "weight", "source", "s"]


def completion_rows(step: int, model: str, slots, limit: int) -> list:
    """Rows of the completions table (``COMPLETION_COLUMNS``) from one model's slots of a step (own and peer
    ``Group``s as the exchange left them): ``source`` is the response's role (own / peer / aux), ``weight`` its loss
    weight (``Group.weights``; 0 = not trained), ``s`` the compatibility score ``exp(l_L - l_P)`` of a localized
    peer response (None for the learner's own). Peer rows come first, then the rest in slot order; at most
    ``limit`` rows."""
    rows = []
    for g in slots:
        advantages = g.advantages or [None] * g.n
        weights = g.weights or [1.0] * g.n
        for r, a, w in zip(g.rollouts, advantages, weights):
            s = None
            if r.origin is not None:
                s = float(compatibility_score(torch.tensor(r.mean_logp, dtype=torch.float64),
                                              torch.tensor(r.origin.mean_logp, dtype=torch.float64)))
            source = "peer" if r.origin is not None else r.role
            rows.append([step, model, g.prompt.text, r.text, float(r.reward), None if a is None else float(a),
                         float(w), source, s])
    rows.sort(key=lambda row: row[7] != "peer")  # stable: peer rows first, each part in slot order
    return rows[:limit]


class MetricsFileError(ValueError):
    """``metrics.jsonl`` holds an unreadable record that is not a torn last line."""


class Tracker:
    def __init__(self, run_dir: str | os.PathLike, cfg: RunConfig, resume_id: Optional[str] = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.wandb_run = None
        run = cfg.run
        tracking = cfg.tracking
        self.completions_every = tracking.log_completions_every
        self.completions_rows = tracking.completions_rows
        if run.track:
            import wandb
            mode = run.wandb_mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            self.wandb_run = wandb.init(
                project=run.wandb_project or "graftzoo", entity=tracking.entity,
                group=run.wandb_group, name=self.run_dir.name, dir=str(self.run_dir), mode=mode, config=as_dict(cfg),
                id=resume_id, resume="allow" if resume_id else None, reinit="create_new",
                tags=[str(t) for t in (run.tags or [])], settings=wandb.Settings(silent=True))

    @property
    def run_id(self) -> Optional[str]:
        return self.wandb_run.id if self.wandb_run else None

    def log(self, step: int, model: str, metrics: dict):
        rec = {M.STEP: step, M.MODEL: model}
        rec.update({k: None for k in METRICS})
        rec.update({k: _clean(v) for k, v in metrics.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log({M.wandb_key(model, k): v for k, v in rec.items()
                                if k not in (M.STEP, M.MODEL) and isinstance(v, (int, float))}, step=step)

    def log_completions(self, step: int, model: str, slots):
        """Log ``model``'s completions table of ``step`` (``completion_rows``) to wandb when the step is on the
        ``tracking.log_completions_every`` cadence; returns the ``wandb.Table`` logged, else None."""
        if self.wandb_run is None or self.completions_every <= 0 or step % self.completions_every:
            return None
        import wandb
        table = wandb.Table(columns=COMPLETION_COLUMNS,
                            data=completion_rows(step, model, slots, self.completions_rows))
        self.wandb_run.log({M.COMPLETIONS.of(model=model): table}, step=step)
        return table

    def truncate_after(self, step: int):
        """On resume: drop records of steps after the checkpoint, so replayed steps are not doubled. A torn
        trailing line (a write cut short by a kill) is dropped and said; an unreadable line before intact ones is
        a ``MetricsFileError`` naming the file and line (that is not a torn write)."""
        if not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        records = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                if any(rest.strip() for rest in lines[i + 1:]):
                    raise MetricsFileError(f"{self.path}, line {i + 1}: unreadable record ({e}); fix or remove "
                                           f"that line to resume") from None
                log.warning("%s: dropped a torn last line (line %d, %d characters) written by an interrupted run",
                            self.path, i + 1, len(line))
                continue
            records.append((rec, line))
        keep = [line for rec, line in records if rec.get(M.STEP, -1) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, self.path)

    def log_summary(self, payload: dict):
        if self.wandb_run is not None:
            for k, v in payload.items():
                if isinstance(v, (int, float, str)):
                    self.wandb_run.summary[k] = v

    def finish(self):
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

