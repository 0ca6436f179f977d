"""Tracking: a local metrics JSONL (always) and wandb (offline when no API key; ``run.track=false`` turns it off).

The metric vocabulary is the same for every algorithm (cleanRL's habit): every key of ``METRICS``
is present in every record, ``None`` where it does not apply (e.g. peer metrics of a GRPO run).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional

METRICS = [
    # outcomes
    "reward/mean", "reward/acc", "groups/all_fail", "groups/all_success", "groups/mixed", "groups/count",
    # peer exchange (paper Fig. 1 right, Table 9)
    "peer/solved_all_fail_frac", "peer/mixed_on_all_fail_frac", "peer/rescued_groups", "peer/admitted",
    "peer/rejected", "peer/s_mean", "peer/s_median", "peer/s_min", "peer/s_max", "tokens/peer_share",
    "clip/frac", "clip/frac_own", "clip/frac_peer", "clip/frac_low", "clip/frac_high",
    # optimisation
    "loss", "grad_norm", "lr", "entropy", "kl", "ratio/mean",
    # theta_old: max |decoding log-prob - training-path log-prob| over own response tokens (engine/trainer mismatch)
    "rollout/logp_diff_max",
    # verifier calls that ran out of time (per call or the batch budget): such responses score as wrong
    "verifier/timeouts",
    # responses and throughput
    "response/len_mean", "response/trunc_rate", "perf/tokens_per_s", "rollouts/generated",
    "time/generate", "time/score", "time/logprob", "time/exchange", "time/update", "time/step",
]


def _clean(v):
    """A metric value as JSON data. NaN and inf stay visible (written as ``NaN`` / ``Infinity``, which Python's
    json and pandas read back as floats): a run that diverges must not look like one that logged nothing."""
    if hasattr(v, "item"):
        return v.item()
    return v


log = logging.getLogger("graftzoo")


class MetricsFileError(ValueError):
    """``metrics.jsonl`` holds an unreadable record that is not a torn last line."""


class Tracker:
    def __init__(self, run_dir: str | os.PathLike, cfg: dict, resume_id: Optional[str] = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.wandb_run = None
        run = cfg["run"]
        if run.get("track"):
            import wandb
            mode = run.get("wandb_mode") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            self.wandb_run = wandb.init(
                project=run.get("wandb_project") or "graftzoo", group=run.get("wandb_group"),
                name=self.run_dir.name, dir=str(self.run_dir), mode=mode, config=cfg, id=resume_id,
                resume="allow" if resume_id else None, reinit="create_new",
                tags=[str(t) for t in (run.get("tags") or [])], settings=wandb.Settings(silent=True))

    @property
    def run_id(self) -> Optional[str]:
        return self.wandb_run.id if self.wandb_run else None

    def log(self, step: int, model: str, metrics: dict):
        rec = {"step": step, "model": model}
        rec.update({k: None for k in METRICS})
        rec.update({k: _clean(v) for k, v in metrics.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log({f"{model}/{k}": v for k, v in rec.items()
                                if k not in ("step", "model") and isinstance(v, (int, float))}, step=step)

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
        keep = [line for rec, line in records if rec.get("step", -1) <= step]
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

