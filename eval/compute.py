"""Compute accounting: phase timers for the trainer and the charging rule for the report.

Convention (docs/algorithms.md#evaluation-protocol-and-compute, DERIVED): ``GPU-h = Σ_phases #GPUs held × wall-clock hours``.
Each phase is recorded per model: wall seconds, process CPU seconds (``time.process_time``: all
threads of this process) and GPU-hours; on a CUDA device also the phase's peak of allocated GPU memory
(``peak_gb``: the allocator's peak since the phase began, the largest over the run's calls of that phase). Phases of one model should not nest or overlap (nested
phases are counted twice); co-located models that share GPUs sequentially (offload, vLLM sleep)
therefore sum correctly. On a CUDA device in use a phase synchronises the device at its start and its end (CUDA
kernels run after the call that queued them returns): its wall time is its kernels' time, not what earlier phases
left queued, nor less than what it queued itself; on the CPU nothing is synchronised. The device is the model's in
``devices`` (the meter's), else the current CUDA device: a process whose models sit on GPUs of their own names
them there. Log-prob recompute of grafted text, update and evaluation are separate
phase names, e.g. "generate", "logprob", "update", "eval".

Phases of different models may overlap when each model's phases run in a thread of their own (the trainer with
``ray.concurrent_models``: each model in its own Ray worker group, on its own devices). A meter built with
``per_thread=True`` then counts each phase's CPU as the seconds of the thread that ran it (``time.thread_time``),
so that two overlapping phases do not each count the other's; the CPU of a model's workers is what they report
(``add``). Each phase is recorded under the model named, whatever thread records it. Overlapping phases on one
device wait, at their ends, for each other's kernels too (a device's synchronisation waits for all its work).

Summary format (``ComputeMeter.summary()``, stored as ``summary.json["compute"]``)::

    {"models": {"<model>": {"phases": {"generate": {"wall_s": .., "cpu_s": .., "gpu_h": .., "peak_gb": ..}, ...},
                            "total": {"wall_s": .., "cpu_s": .., "gpu_h": ..}}, ...},
     "total": {"wall_s": .., "cpu_s": .., "gpu_h": ..}}
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Mapping, Optional

from graftzoo.contract.peer_sources import pays_for_peer

FIELDS = ("wall_s", "cpu_s", "gpu_h")
GIB = float(1 << 30)


def _zero() -> dict:
    return {k: 0.0 for k in FIELDS}


def _add(a: Mapping, b: Mapping) -> dict:
    return {k: float(a.get(k, 0.0)) + float(b.get(k, 0.0)) for k in FIELDS}


def _default_gpus() -> int:
    import torch  # late: the reports import this module, and torch only where a meter runs
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cuda_in_use() -> bool:
    """Whether this process has put anything on a CUDA device (no CUDA context is created to find out)."""
    import torch  # late: the reports import this module, and torch only where a meter runs
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _cuda_sync(device=None) -> None:
    """Wait until every kernel queued on CUDA ``device`` (None: the current one) has run."""
    import torch  # late: the reports import this module, and torch only where a meter runs
    torch.cuda.synchronize(device)


class ComputeMeter:
    """Accumulates wall / CPU / GPU time per (model, phase).

    ``gpus``: GPUs held by this process (default: all visible CUDA devices, 0 without CUDA);
    a phase may override it. ``per_thread``: phases of different models run at once in threads of their own, and
    each phase's CPU is its thread's (``time.thread_time``) instead of the process's (``time.process_time``).
    ``devices``: model id -> the device its kernels run on, which its phases synchronise when CUDA is in use (a model
    not named: the current CUDA device; a model on the CPU: none). ``clock``, ``cpu_clock`` and ``sync`` (called with
    the device to synchronise, None for the current one) are injectable for tests (``cpu_clock`` overrides
    ``per_thread``'s choice).
    """

    def __init__(self, gpus: Optional[int] = None, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Optional[Callable[[], float]] = None, per_thread: bool = False,
                 devices: Optional[Mapping[str, object]] = None, sync: Callable[[object], None] = _cuda_sync):
        self.gpus = _default_gpus() if gpus is None else int(gpus)
        self.per_thread = per_thread
        self.devices = dict(devices or {})
        self._sync = sync
        self._clock = clock
        self._cpu_clock = cpu_clock or (time.thread_time if per_thread else time.process_time)
        self._rec: dict = {}
        self._lock = threading.Lock()

    def add(self, model_id: str, phase: str, wall_s: float = 0.0, cpu_s: float = 0.0,
            gpu_h: float = 0.0, peak_gb: Optional[float] = None, reserved_gb: Optional[float] = None) -> None:
        """Record an already measured amount (e.g. reported back by a Ray actor); ``peak_gb`` (GPU memory
        allocated) and ``reserved_gb`` (held by the caching allocator) keep the largest value recorded for the
        phase."""
        if min(wall_s, cpu_s, gpu_h) < 0:
            raise ValueError(f"negative compute for {model_id}/{phase}: "
                             f"wall_s={wall_s} cpu_s={cpu_s} gpu_h={gpu_h}")
        with self._lock:
            per = self._rec.setdefault(model_id, {})
            old = per.get(phase, _zero())
            per[phase] = _add(old, {"wall_s": wall_s, "cpu_s": cpu_s, "gpu_h": gpu_h})
            for key, new in (("peak_gb", peak_gb), ("reserved_gb", reserved_gb)):
                peaks = [p for p in (old.get(key), new) if p is not None]
                if peaks:
                    per[phase][key] = max(peaks)

    def _cuda_device(self, model_id: str) -> tuple:
        """(whether ``model_id``'s phases run on a CUDA device, that device: None for the current one)."""
        import torch  # late: the reports import this module, and torch only where a meter runs
        device = self.devices.get(model_id)
        if device is None:
            return True, None
        return torch.device(device).type == "cuda", device

    @contextmanager
    def phase(self, model_id: str, name: str, gpus: Optional[int] = None):
        """Time the body as phase ``name`` of ``model_id`` (recorded even if the body raises); on a CUDA device in
        use, the device synchronised at both ends of the timed span (``sync``) and the phase's peak of allocated
        memory and of the memory the caching allocator reserved (both peaks reset when the phase begins). A synchronisation failing at the end (a
        kernel's error surfacing) is raised once the phase is recorded, unless the body raised first."""
        import torch  # late: the reports import this module, and torch only where a meter runs
        held = self.gpus if gpus is None else int(gpus)
        cuda, device = self._cuda_device(model_id)
        began = cuda and _cuda_in_use()
        if began:
            self._sync(device)
            torch.cuda.reset_peak_memory_stats(device)
        w0, c0 = self._clock(), self._cpu_clock()
        ok, error = False, None
        try:
            yield
            ok = True
        finally:
            ended = began or (cuda and _cuda_in_use())  # the body may have put the model on the GPU
            if ended:
                try:
                    self._sync(device)
                except Exception as e:  # noqa: BLE001 - raised below, after the phase is recorded
                    error = e
            wall = max(self._clock() - w0, 0.0)
            cpu = max(self._cpu_clock() - c0, 0.0)
            read = ended and error is None
            peak = torch.cuda.max_memory_allocated(device) / GIB if read else None
            reserved = torch.cuda.max_memory_reserved(device) / GIB if read else None
            self.add(model_id, name, wall, cpu, held * wall / 3600.0, peak, reserved)
            if error is not None and ok:
                raise error

    def summary(self) -> dict:
        """Per-model per-phase figures, per-model totals and the grand total (format above)."""
        with self._lock:
            models, total = {}, _zero()
            for m, phases in self._rec.items():
                m_total = _zero()
                for rec in phases.values():
                    m_total = _add(m_total, rec)
                models[m] = {"phases": {p: dict(r) for p, r in phases.items()}, "total": m_total}
                total = _add(total, m_total)
            return {"models": models, "total": total}


def model_total(compute: Mapping, model_id: str, exclude=("eval",)) -> dict:
    """One model's figures summed over its phases, leaving out the phases in ``exclude``."""
    models = compute.get("models", {})
    if model_id not in models:
        raise KeyError(f"no compute recorded for model {model_id!r} (have {sorted(models)})")
    out = _zero()
    for phase, rec in models[model_id]["phases"].items():
        if phase not in exclude:
            out = _add(out, rec)
    return out


def joint_charge(summary: Mapping, exclude=("eval",)) -> dict:
    """Compute charged to each model of a run (docs/algorithms.md#evaluation-protocol-and-compute, the conservative rule).

    ``summary`` is a ``summary.json`` payload (``compute``, ``peers``, ``peer_source``,
    ``peer_run_compute``). Phases in ``exclude`` (evaluation by default) are not training cost.
    Per model ``m`` the result is ``{"charged": {...}, "amortized": {...} or None, "rule": ...}``:

    - no peer (``peers[m]`` is null): ``rule="own"``, charged = m's own cost;
    - live co-training (``peer_source`` "live"): ``rule="joint"``, charged = m's cost + its
      peer's cost, i.e. both models' rollout and training (each model of a pair pays the pair);
    - stored peer logs (a source that is not live): ``rule="stored"``, charged = m's own cost (the peer run is sunk);
    - mixed (live peer with stored fallback): as live;
    - stored or mixed: amortized = charged + ``peer_run_compute`` when the summary gives it
      (the original peer run's cost), else None.
    """
    compute = summary.get("compute") or {}
    source = summary.get("peer_source")
    extra = summary.get("peer_run_compute")
    out = {}
    for m, peer in summary["peers"].items():
        own = model_total(compute, m, exclude)
        if peer is None:
            out[m] = {"charged": own, "amortized": None, "rule": "own"}
            continue
        live = pays_for_peer(source)  # the source's registered kind (graftzoo.contract.peer_sources)
        charged = own
        if live:  # the whole joint run: every live peer of a population too (docs/algorithms.md#populations)
            for p in ([peer] if isinstance(peer, str) else peer):
                charged = _add(charged, model_total(compute, p, exclude))
        out[m] = {"charged": charged, "amortized": None if extra is None else _add(charged, extra),
                  "rule": "joint" if live else "stored"}
    return out
