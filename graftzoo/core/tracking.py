"""Tracking: a local metrics JSONL (always) and wandb (offline when no API key; ``run.track=false`` turns it off).

The metric vocabulary is the same for every algorithm (cleanRL's habit): every key of ``METRICS``
is present in every record, ``None`` where it does not apply (e.g. peer metrics of a GRPO run).
"""
from __future__ import annotations

import json
import math
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
    # responses and throughput
    "response/len_mean", "response/trunc_rate", "perf/tokens_per_s", "rollouts/generated",
    "time/generate", "time/score", "time/logprob", "time/exchange", "time/update", "time/step",
]


def _clean(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


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
        """On resume: drop records of steps after the checkpoint, so replayed steps are not doubled."""
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", -1) <= step]
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

