"""Tracking: a local metrics JSONL (always) and wandb (offline when no API key; ``run.track=false`` turns it off).

The metric vocabulary is the same for every algorithm (cleanRL's habit): every key of ``METRICS``
is present in every record, ``None`` where it does not apply (e.g. peer metrics of a GRPO run).

wandb settings: ``run.wandb_project`` / ``run.wandb_group`` / ``run.wandb_mode`` and ``tracking.entity``. The mode is
``run.wandb_mode``, else ``WANDB_MODE``, else online with ``WANDB_API_KEY`` set and offline without. An online run
first checks, within seconds, that the wandb server answers (``server_unreachable``); when it does not, or
``wandb.init`` fails online, the run logs offline (in ``RUN/wandb``, for ``wandb sync`` later) and says so in one
line: no network never holds a run up for wandb's minutes of retries. A resumed run continues the same wandb run
(its id is kept in the checkpoint: ``resume_id``).

wandb's step axis: every chart is drawn against ``train/step`` (``M.WANDB_STEP``, wandb's ``define_metric``), the
record's ``step`` as in metrics.jsonl, so the evaluation before training (step -1) is on the charts; wandb's own
step is ``wandb_step(step)`` = step + 1, never negative and never going back: one wandb row per step (both models'
records and the completions tables of the step), and a resumed run does not log again the steps that its wandb run
already holds (those the first attempt logged after its last checkpoint, replayed on resume; metrics.jsonl keeps
the replayed records, wandb the first ones; a finished run extended to more steps keeps its final evaluation at
that step on wandb, and the first new step's record is in metrics.jsonl only); a run resumed with tracking after
untracked attempts opens a new wandb run and logs the records metrics.jsonl keeps first, step -1 included. Every
``tracking.log_completions_every`` steps (0 = never) each model logs a completions table ``<model>/completions``
(``COMPLETION_COLUMNS``, at most ``tracking.completions_rows`` rows, peer rows first): the responses the step trains
on, from the exchange's slots, whatever the algorithm.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import torch

from graftzoo.algos.functional import compatibility_score
from graftzoo.contract import metrics as M
from graftzoo.contract.config import RunConfig, as_dict
from graftzoo.training.run.checkpoint import one_line

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


ONLINE_MODES = ("online", "run", "shared")  # wandb modes that talk to a server
PROBE_S = 5.0      # seconds the server has to accept a connection
INIT_TIMEOUT_S = 30.0  # seconds wandb.init may take online (wandb's default: 90)


def wandb_mode(run) -> str:
    """``run.wandb_mode``, else ``WANDB_MODE``, else online with ``WANDB_API_KEY`` set and offline without."""
    key = os.environ.get("WANDB_API_KEY")
    return run.wandb_mode or os.environ.get("WANDB_MODE") or ("online" if key else "offline")


def server_unreachable(url: str, timeout: float = PROBE_S) -> Optional[str]:
    """Why the server of ``url`` does not accept a TCP connection within ``timeout`` seconds (name lookup
    included), or None when it does."""
    parts = urlsplit(url)
    if not parts.hostname:
        return f"{url!r} is not a URL"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    result: list = []

    def connect():
        try:
            socket.create_connection((parts.hostname, port), timeout=timeout).close()
            result.append(None)
        except OSError as e:
            result.append(e.strerror or type(e).__name__)

    t = threading.Thread(target=connect, daemon=True)  # a name lookup has no timeout of its own
    t.start()
    t.join(timeout)
    return result[0] if result else f"no answer within {timeout:g} s"


def init_wandb(run_dir: Path, cfg: RunConfig, resume_id: Optional[str] = None, **settings):
    """``wandb.init`` in ``wandb_mode`` with ``cfg``'s project, entity, group, tags and config, into
    ``run_dir/wandb`` (``settings`` replace any of ``wandb.init``'s arguments, e.g. a grid's report run sets
    ``job_type``); an online run that cannot reach its server logs offline, said in one line."""
    import wandb
    run, tracking = cfg.run, cfg.tracking
    mode = wandb_mode(run)
    kw = dict(project=run.wandb_project or "graftzoo", entity=tracking.entity, group=run.wandb_group,
              name=run_dir.name, dir=str(run_dir), config=as_dict(cfg), id=resume_id,
              resume="allow" if resume_id else None, reinit="create_new", tags=[str(t) for t in (run.tags or [])])
    kw.update(settings)
    if mode in ONLINE_MODES:
        url = wandb.setup().settings.base_url  # WANDB_BASE_URL, `wandb login --host`, else wandb's server
        why = server_unreachable(url)
        if why is None:
            try:
                return wandb.init(mode=mode, settings=wandb.Settings(silent=True, init_timeout=INIT_TIMEOUT_S), **kw)
            except Exception as e:  # noqa: BLE001 - wandb's errors (auth, network) must not stop the run
                why = one_line(e)[:300]
        log.warning("wandb: cannot log online to %s (%s); logging offline in %s instead (upload it later with "
                    "`wandb sync %s/wandb/offline-run-*`; run.wandb_mode=offline or --no-track skips the server)",
                    url, why, run_dir / "wandb", run_dir)
        mode = "offline"
    return wandb.init(mode=mode, settings=wandb.Settings(silent=True), **kw)


def _wandb_data(rec: dict) -> dict:
    """A metrics.jsonl record's numeric values under their wandb keys (``<model>/<key>``)."""
    return {M.wandb_key(rec[M.MODEL], k): v for k, v in rec.items()
            if k not in (M.STEP, M.MODEL) and isinstance(v, (int, float))}


def wandb_step(step: int) -> int:
    """wandb's own step of a record of training step ``step`` (docs/metrics.md#wandb): ``step + 1``, so the
    evaluation before training (step -1) is wandb's step 0 and the final evaluation (step ``run.steps``) its last;
    the charts' x axis is ``train/step`` = ``step`` itself."""
    return step + 1


class MetricsFileError(ValueError):
    """``metrics.jsonl`` holds an unreadable record that is not a torn last line."""


class Tracker:
    def __init__(self, run_dir: str | os.PathLike, cfg: RunConfig, resume_id: Optional[str] = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.wandb_run = None
        self.resume_id = resume_id
        self.completions_every = cfg.tracking.log_completions_every
        self.completions_rows = cfg.tracking.completions_rows
        self.wandb_next = 0   # the lowest wandb step a record may go to: wandb's steps only go forward
        self.said_replayed = False   # a resumed run's steps that its wandb run already holds: said once
        if cfg.run.track:
            self.wandb_run = init_wandb(self.run_dir, cfg, resume_id)
            self.wandb_run.define_metric(M.WANDB_STEP)
            self.wandb_run.define_metric("*", step_metric=M.WANDB_STEP)   # every chart against train/step
            self.wandb_next = self.wandb_run.step   # a resumed run's wandb history goes on from there

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
            self._log_wandb(step, _wandb_data(rec))

    def _log_wandb(self, step: int, data: dict) -> bool:
        """Log ``data`` at wandb step ``wandb_step(step)`` with ``train/step`` = ``step``; a step below one wandb
        already holds (a resumed run replaying the steps after its last checkpoint) is left out, said once."""
        at = wandb_step(step)
        if at < self.wandb_next:
            if not self.said_replayed:
                self.said_replayed = True
                log.info("%s: wandb already holds this run's steps up to %d; the replayed steps keep their first "
                         "points there (metrics.jsonl has the replayed ones)", self.run_dir, self.wandb_next - 2)
            return False
        self.wandb_run.log({M.WANDB_STEP: step, **data}, step=at)
        self.wandb_next = at
        return True

    def log_completions(self, step: int, model: str, slots):
        """Log ``model``'s completions table of ``step`` (``completion_rows``) to wandb when the step is on the
        ``tracking.log_completions_every`` cadence; returns the ``wandb.Table`` logged, else None."""
        if self.wandb_run is None or self.completions_every <= 0 or step % self.completions_every:
            return None
        import wandb
        table = wandb.Table(columns=COMPLETION_COLUMNS,
                            data=completion_rows(step, model, slots, self.completions_rows))
        return table if self._log_wandb(step, {M.COMPLETIONS.of(model=model): table}) else None

    def truncate_after(self, step: int):
        """On resume: drop records of steps after the checkpoint, so replayed steps are not doubled. A torn
        trailing line (a write cut short by a kill) is dropped and said; an unreadable line before intact ones is
        a ``MetricsFileError`` naming the file and line (that is not a torn write). A run that continues its wandb
        run (``resume_id``) logs to wandb only the steps after the last one the file held: wandb has the others
        (an offline run's new folder too, so that ``wandb sync`` of both has each step once). A new wandb run
        (no ``resume_id``: the earlier attempts were not tracked) gets the kept records first, step -1 included."""
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
        kept = [(rec, line) for rec, line in records if rec.get(M.STEP, -1) <= step]
        keep = [line for _, line in kept]
        logged = [rec[M.STEP] for rec, _ in records if isinstance(rec.get(M.STEP), int)]
        if self.wandb_run is not None and self.resume_id is not None and logged:
            self.wandb_next = max(self.wandb_next, wandb_step(max(logged)) + 1)
        elif self.wandb_run is not None and self.resume_id is None:
            for rec, _ in kept:
                if isinstance(rec.get(M.STEP), int) and rec.get(M.MODEL):
                    self._log_wandb(rec[M.STEP], _wandb_data(rec))
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

