"""Where a run's parts live (docs/scaling.md#one-gpu), decided once before any model is built:

- ``run.device: auto`` (``resolve_device``) is ``cuda`` when this process sees a GPU, else ``cpu``; a
  ``pair.models[i].device`` overrides it per model. On a Ray cluster whose driver has no GPU, give ``cuda``.
- A config sized for GPUs does not start on the CPU by accident (``cpu_refusal``): when ``auto`` resolved to the
  CPU and the config holds a GPU-only setting, or ``graftzoo plan`` puts its host-memory need over this machine's
  memory, the run is refused before anything is loaded; ``run.device=cpu`` starts it anyway.
- ``rollout.vllm.multiprocessing: auto`` gives each vLLM engine a process of its own (its engine core) where one
  process would hold two engines on a GPU: vLLM's sleep mode (``rollout.vllm.sleep_level``) and its memory
  accounting work for one engine per process.
- ``run.layout`` (two models on one GPU): ``resident`` keeps every model's training state on the device, the
  engines freeing their memory during updates (``sleep_level``); ``offload`` keeps one model active at a time, the
  other's parameters (float32 master weights under bf16-mixed) and AdamW moments in host memory (``Residency``);
  ``auto`` is ``graftzoo plan``'s choice for the GPU (``memory.gpu_layout``: resident where it fits with the
  plan's margin to spare, it is the faster), resident on the CPU and with the Ray backend.
- On GPUs (in-process), ``optim.max_tokens_per_micro: null`` becomes the largest micro-batch budget plan fits,
  and gradient checkpointing is turned on where plan fits only with it (``fit_update``).
- ``describe``: where each model's weights, optimizer state, engine and KV cache live; the trainer logs it before
  the first step and keeps it in ``summary.json`` (``placement``).
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Optional

import torch

from graftzoo.contract.config import ConfigError, ModelSpec, RunConfig, trained_ids, with_values
from graftzoo.training.planner import memory
from graftzoo.training.planner.build import device_of, resolve_device, usable_device

log = logging.getLogger("graftzoo")

GIB = float(1 << 30)
HOST_USABLE = 0.9  # of the host's memory, for a run on the CPU (the rest: the OS, the verifier's workers)


def host_memory_bytes() -> float:
    """This machine's physical memory (bytes)."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def gpu_only_settings(cfg: RunConfig) -> list:
    """The settings of ``cfg`` that only a GPU serves, each as ``"key (why)"``."""
    out, vl = [], cfg.rollout.vllm
    if cfg.rollout.engine == "vllm" and vl.kv_cache_gb is None:
        out.append(f"rollout.vllm.kv_cache_gb null (the KV cache sized as {vl.gpu_memory_utilization:g} of a GPU's "
                   f"memory)")
    if cfg.rollout.engine == "vllm" and vl.sleep_level:
        out.append(f"rollout.vllm.sleep_level {vl.sleep_level} (vLLM's sleep mode frees GPU memory)")
    if cfg.run.layout == "offload":
        out.append("run.layout offload (training state moved between a GPU and host memory)")
    return out


def sizable_here(cfg: RunConfig) -> bool:
    """Whether plan can size every trained model without asking a hub: tiny models, and ``kind: hf`` models with
    their ``arch`` or a local folder holding ``config.json``."""
    def local(spec: ModelSpec) -> bool:
        return spec.kind == "tiny" or bool(spec.arch) or os.path.isfile(
            os.path.join(str(spec.path or spec.id), "config.json"))
    return all(local(s) for s in cfg.pair.models if s.id in trained_ids(cfg))


def cpu_refusal(cfg: RunConfig, host_bytes: float) -> Optional[str]:
    """Why ``cfg`` should not start on the CPU when it was not asked to (None: it may): its GPU-only settings, or
    ``graftzoo plan``'s host-memory need for it over ``HOST_USABLE`` of ``host_bytes`` (where plan can size it
    without a hub, ``sizable_here``)."""
    reasons = gpu_only_settings(cfg)
    need = memory.host_peak_bytes(cfg) if sizable_here(cfg) else 0.0
    if need > HOST_USABLE * host_bytes:
        reasons.append(f"graftzoo plan puts its training on the CPU at {need / GIB:.1f} GiB of memory, this machine "
                       f"has {host_bytes / GIB:.1f} GiB")
    return "; ".join(reasons) or None


def _devices(cfg: RunConfig) -> dict:
    """model id -> (its device setting, where it was set) of the trained models."""
    return {spec.id: device_of(spec) for spec in cfg.pair.models if spec.id in trained_ids(cfg)}


def gpu_gb_of(device: str) -> float:
    """The memory of a CUDA device, GiB."""
    return torch.cuda.get_device_properties(torch.device(device)).total_memory / GIB


def shared_gpu(cfg: RunConfig, devices: dict) -> Optional[str]:
    """The CUDA device two or more trained models share in this process (the in-process backend), else None."""
    if cfg.run.backend != "inprocess":
        return None
    cuda = [torch.device(d) for d in devices.values() if d.startswith("cuda")]
    index = [d.index if d.index is not None else torch.cuda.current_device() for d in cuda]
    shared = [i for i in set(index) if index.count(i) > 1]
    return f"cuda:{shared[0]}" if shared else None


def choose_layout(cfg: RunConfig, gpu: Optional[str]) -> dict:
    """The settings of the layout: ``run.layout`` as given, or for ``auto`` plan's choice on the shared GPU ``gpu``
    (resident where it fits with the plan's margin to spare; when neither fits, offload, the smaller, with a
    warning), resident where no GPU is shared. With plan's choice come the engines' settings it was planned with,
    where the config leaves them open: ``rollout.vllm.kv_cache_gb`` null, and ``rollout.vllm.sleep_level`` when
    below the plan's (the layout fits only with the engines asleep during updates; give ``run.layout`` to keep the
    config's)."""
    if cfg.run.layout == "offload" and cfg.run.backend != "inprocess":
        raise ConfigError(f"config key 'run.layout' (offload) moves models in the trainer's process: it needs "
                          f"run.backend=inprocess, got {cfg.run.backend!r} (each Ray worker group holds its own GPUs)")
    if cfg.run.layout != "auto":
        return {"run.layout": cfg.run.layout}
    if gpu is None:
        return {"run.layout": "resident"}
    p = memory.gpu_layout(cfg, 1, gpu_gb_of(gpu))
    if not (p["fits"] and p["layout"] in memory.LAYOUTS_ONE_GPU):
        log.warning("graftzoo plan finds no layout of %s that fits %s (%s): training with run.layout offload, the "
                    "smaller", cfg.pair.name, gpu, p.get("error"))
        return {"run.layout": "offload"}
    vl, planned = cfg.rollout.vllm, p.get("settings", {})
    open_keys = {"rollout.vllm.kv_cache_gb": vl.kv_cache_gb is None,
                 "rollout.vllm.sleep_level": vl.sleep_level < planned.get("rollout.vllm.sleep_level", 0)}
    out = {"run.layout": p["layout"]}
    for key, is_open in open_keys.items():
        if is_open and key in planned:
            out[key] = planned[key]
            log.info("%s: %s (graftzoo plan's %s layout on %s)", key, planned[key], p["layout"], gpu)
    return out


MICRO_TOKENS = (65536, 32768, 16384, 8192, 4096, 2048, 1024)  # micro-batch budgets tried, the largest first


def fit_update(cfg: RunConfig, gpus: int, gpu_gb: float) -> dict:
    """The update's settings plan derives for ``gpus`` GPUs of ``gpu_gb`` GiB where the config leaves them open
    (``{}``: nothing to change): ``optim.max_tokens_per_micro`` null -> the largest of ``MICRO_TOKENS`` whose plan
    fits; ``model.gradient_checkpointing`` turned on where the plan fits only with it. Fewer tokens per
    micro-batch change only the micro-batching: a minibatch's loss and gradient are the same sums."""
    def fits(values: dict) -> bool:
        return bool(memory.gpu_layout(with_values(cfg, values), gpus, gpu_gb)["fits"])

    given = cfg.optim.max_tokens_per_micro
    for ckpt in dict.fromkeys((bool(cfg.model.gradient_checkpointing), True)):
        for tokens in (given,) if given else MICRO_TOKENS:
            values = {"optim.max_tokens_per_micro": tokens, "model.gradient_checkpointing": ckpt}
            if fits(values):
                return {k: v for k, v in values.items() if v != cfg.model_dump()[k.split(".")[0]][k.split(".")[1]]}
    return {}


def resolve(cfg: RunConfig, host_bytes: Optional[float] = None) -> RunConfig:
    """``cfg`` with its placement settings resolved (module docstring): ``run.device`` and every trained model's
    ``device``, ``rollout.vllm.multiprocessing`` and ``run.layout``. Raises ``ConfigError`` when a device setting
    of ``auto`` resolved to the CPU for a config ``cpu_refusal`` refuses there, or a GPU this machine does not have
    (``usable_device``)."""
    devices = _devices(cfg)
    if cfg.run.backend == "inprocess" or cfg.ray.address is None:  # this machine's GPUs (a private Ray cluster's
        for d, where in devices.values():  # too): one it lacks refused before anything is built; the workers of a
            usable_device(d, where)         # cluster at ray.address check the GPUs it gives them
    auto_cpu = [where for d, where in devices.values() if d == "auto" and resolve_device(d) == "cpu"]
    if auto_cpu:
        why = cpu_refusal(cfg, host_memory_bytes() if host_bytes is None else host_bytes)
        if why:
            raise ConfigError(f"config key '{auto_cpu[0]}' (auto) resolved to the CPU, as no GPU is visible, but "
                              f"{cfg.pair.name} is sized for GPUs: {why}. Run it on a GPU machine, or set "
                              f"{auto_cpu[0]}=cpu to train on the CPU anyway")
    resolved = {m: resolve_device(d) for m, (d, _) in devices.items()}
    models = [s.replace(device=resolved[s.id]) if s.id in resolved and s.sets("device") else s
              for s in cfg.pair.models]
    gpu = shared_gpu(cfg, resolved)
    values = {"run.device": resolve_device(cfg.run.device), "pair.models": models, **choose_layout(cfg, gpu)}
    if cfg.rollout.vllm.multiprocessing == "auto":
        values["rollout.vllm.multiprocessing"] = memory.engine_in_own_process(cfg, gpu is not None)
    cfg = with_values(cfg, values)
    cuda = sorted({d for d in resolved.values() if d.startswith("cuda")})
    if cuda and cfg.run.backend == "inprocess":
        derived = fit_update(cfg, len(cuda), min(gpu_gb_of(d) for d in cuda))
        for key, value in derived.items():
            log.info("%s: %s (graftzoo plan, for %s)", key, value, ", ".join(cuda))
        cfg = with_values(cfg, derived)
    return cfg


def collect_at_once(cfg: RunConfig, models: list) -> bool:
    """Whether the in-process trainer runs its models' phase 1 (generate, score, theta_old) at once, one thread
    per model: two or more models sharing a GPU in the resident layout, each generating through a vLLM engine in
    its own process (seeded per request, so the rollouts do not depend on the threads' timing), and
    ``ray.concurrent_models`` on."""
    devices = {m: d for m, (d, _) in _devices(cfg).items() if m in models}
    return (cfg.run.backend == "inprocess" and len(models) > 1 and cfg.run.layout == "resident"
            and cfg.rollout.engine == "vllm" and cfg.rollout.vllm.multiprocessing is True
            and bool(cfg.ray.concurrent_models) and all(d.startswith("cuda") for d in devices.values()))


def describe(cfg: RunConfig, policies: dict) -> dict:
    """model id -> where its parts live: ``weights`` (dtype and device), ``optimizer_state``, ``engine`` and
    ``kv_cache``, and the run's ``layout``."""
    vl, out = cfg.rollout.vllm, {}
    for m, pol in policies.items():
        dev = str(pol.device)
        offload = cfg.run.layout == "offload"
        state = (f"{dev} while the model is active, host memory otherwise (run.layout offload)" if offload else dev)
        if cfg.rollout.engine == "vllm":
            proc = "its own process" if vl.multiprocessing is True or cfg.run.backend != "inprocess" else \
                "the trainer's process"
            engine = f"vllm on {dev}, engine core in {proc}"
            size = (f"{vl.kv_cache_gb:g} GiB" if vl.kv_cache_gb is not None else
                    f"{vl.gpu_memory_utilization:g} of the GPU less the engine's weights")
            when = (f"freed during updates (sleep level {vl.sleep_level})" if vl.sleep_level else
                    "kept during updates")
            kv = f"{size} on {dev}, {when}"
        else:
            engine = f"hf on {dev}, decoding with the training weights"
            kv = f"{dev}, allocated per generate call and freed after it"
        if cfg.run.backend == "ray" and cfg.ray.rollout_workers:
            engine = (f"{cfg.rollout.engine} on {cfg.ray.rollout_workers} rollout worker(s) apart from the training "
                      f"ranks, each with a copy of the weights (sent over a collective after each update)")
        out[m] = {"device": dev, "weights": f"{str(pol.param_dtype).replace('torch.', '')} on {dev}",
                  "optimizer_state": state, "engine": engine, "kv_cache": kv, "layout": cfg.run.layout}
    return out


def placement_lines(where: dict) -> list:
    """``describe``'s answer as the lines the trainer logs before the first step."""
    return [f"placement of model {m!r} ({p['layout']} layout): weights {p['weights']}; optimizer state "
            f"{p['optimizer_state']}; engine {p['engine']}; KV cache {p['kv_cache']}" for m, p in where.items()]


class Residency:
    """``run.layout: offload``: at most one model's training state on the device at a time. ``active(m)`` offloads
    every other model (``Policy.offload``) and brings ``m`` back (``Policy.onload``), each move timed as phase
    ``offload`` of the model moved; with ``enabled`` False (``resident``) it does nothing."""

    def __init__(self, policies: dict, meter, enabled: bool):
        self.policies, self.meter, self.enabled = policies, meter, enabled
        self.moved = {m: 0 for m in policies}  # bytes moved per model, both ways, since the run began

    @contextmanager
    def active(self, m: str):
        if self.enabled:
            for other, pol in self.policies.items():
                if other != m and not pol.offloaded:
                    with self.meter.phase(other, "offload"):
                        self.moved[other] += pol.offload()
            if self.policies[m].offloaded:
                with self.meter.phase(m, "offload"):
                    self.moved[m] += self.policies[m].onload()
        yield self.policies[m]


__all__ = ["Residency", "cpu_refusal", "describe", "placement_lines", "resolve", "resolve_device"]
