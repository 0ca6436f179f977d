"""FSDP2 within a model's worker group: the process group, the sharding, and sharded checkpoints.

Every rank of a group holds a shard of each parameter, gradient and AdamW state (``fully_shard`` per decoder block
and at the root: torch.distributed.fsdp, gloo on CPU, NCCL on GPU). Under ``bf16-mixed`` the parameters are
gathered and computed in bf16 and the gradients reduced in float32 (``mixed_precision``). Gradients are summed over the ranks, not
averaged: each rank's micro-batch losses already use the whole minibatch's denominators (``Learner.norms``), so
the sum over ranks is the minibatch's gradient, exactly as one process accumulates it.

Checkpoints: each rank writes its shards through ``torch.distributed.checkpoint`` (DCP) into
``<checkpoint>/<model>.dcp/``; the model's ``.pt`` file holds ``{"sharded": "<model>.dcp", "scheduler", "version"}``.
DCP reshards on load, so a checkpoint resumes on any number of ranks, or in one process (``load_sharded`` without a
process group).

Loading a model onto a group without the whole model on any rank (``materialize``, used by
``graftzoo.training.planner.build.build_sharded_policy``): the model is built on the meta device, sharded, given empty
storage on its device (``to_empty``), and each rank reads only its rows of every tensor from the model's safetensors
files (``safe_open(...).get_slice``), cast through the dtype the whole model would have been loaded in.
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def init_group(rank: int, world: int, addr: str, port: int, device: str, timeout_s: float) -> None:
    """Join the model's process group (every rank calls it at once): NCCL on a GPU, gloo on the CPU. A rank that
    dies makes the others' collectives fail after ``timeout_s`` instead of hanging."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=float(timeout_s)))


def mixed_precision(compute_dtype) -> MixedPrecisionPolicy:
    """FSDP2's precision for a model trained under ``bf16-mixed`` (``compute_dtype`` the 16-bit dtype): the
    parameters all-gathered and computed in 16 bits (half the traffic of float32 gathers), the gradients
    reduce-scattered in float32, the sharded master weights and AdamW's state float32. None: float32 throughout."""
    if compute_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def shard_model(model, compute_dtype=None) -> None:
    """``fully_shard`` each decoder block (the model's ``_no_split_modules`` classes) and then the root, under
    ``mixed_precision(compute_dtype)``; gradients summed over the ranks (divide factor 1, plain sum reductions).
    Each block frees its gathered parameters after its forward except the last one, whose backward comes first
    and would gather them again at once."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    policy = mixed_precision(compute_dtype)
    for i, module in enumerate(blocks):
        fully_shard(module, mp_policy=policy, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)


def shard_policy(policy, ref=None) -> None:
    """Shard a rank's ``policy`` (and its KL reference ``ref``) over the group, in the policy's precision (its
    ``autocast_dtype`` under ``bf16-mixed``), and build AdamW over the sharded parameters."""
    shard_model(policy.model, policy.autocast_dtype)
    if ref is not None:
        shard_model(ref.model, policy.autocast_dtype)
    policy.configure_optimizer(policy.optim_cfg)
    policy.sharded = True


def full_model_state(model) -> dict:
    """The whole parameters and buffers on rank 0's CPU, an empty dict on the other ranks (a collective)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(policy, folder, stem: str) -> tuple[dict, list]:
    """Every rank writes its shards of the model and AdamW state to ``folder/<stem>.dcp`` (all ranks call it at
    once). Returns the state for the model's ``.pt`` file and the files written (relative to ``folder``)."""
    target = Path(folder) / f"{stem}.dcp"
    msd, osd = get_state_dict(policy.model, policy.optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(target))
    dist.barrier()
    files = sorted(str(p.relative_to(folder)) for p in target.rglob("*") if p.is_file())
    state = {"sharded": target.name, "scheduler": policy.scheduler.state_dict() if policy.scheduler else None,
             "version": policy.version}
    return state, files


def load_sharded(policy, state: dict, folder, weights_only: bool = False) -> None:
    """Restore a sharded checkpoint's state into ``policy``: the group's ranks (``policy.sharded``, all at once) or
    one process without a process group (a resume in-process, an evaluation). ``weights_only``: the model only."""
    source = str(Path(folder) / state["sharded"])
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{source}: the sharded checkpoint's folder is missing")
    if weights_only or policy.optimizer is None:
        msd = get_model_state_dict(policy.model)
        dcp.load({"model": msd}, checkpoint_id=source)
        set_model_state_dict(policy.model, msd)
    else:
        msd, osd = get_state_dict(policy.model, policy.optimizer)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=source)
        set_state_dict(policy.model, policy.optimizer, model_state_dict=msd, optim_state_dict=osd)
        if policy.scheduler is not None and state.get("scheduler"):
            policy.scheduler.load_state_dict(state["scheduler"])
    policy.version = int(state.get("version", 0))


def load_full(policy, state: dict) -> None:
    """Load a whole (unsharded) ``Policy.state_dict()`` into a sharded policy (all ranks at once): a checkpoint of
    one process resumed on a worker group."""
    opts = StateDictOptions(full_state_dict=True)
    if policy.optimizer is not None and state.get("optimizer"):
        # the optimizer's state keyed by parameter names, as set_state_dict expects a whole one
        names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
        osd = state["optimizer"]
        named = {"state": {names[i]: v for i, v in osd["state"].items()},
                 "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}
        set_state_dict(policy.model, policy.optimizer, model_state_dict=state["model"], optim_state_dict=named,
                       options=opts)
    else:
        set_model_state_dict(policy.model, state["model"], options=opts)
    if policy.scheduler is not None and state.get("scheduler"):
        policy.scheduler.load_state_dict(state["scheduler"])
    policy.version = int(state.get("version", 0))


SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_FILE = "model.safetensors"


def weight_files(folder) -> dict:
    """Tensor name -> the safetensors file in ``folder`` that holds it: the files of ``model.safetensors.index.json``
    (a sharded checkpoint), else ``model.safetensors``; empty when the folder has neither."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        return {name: folder / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    single = folder / SAFETENSORS_FILE
    if not single.is_file():
        return {}
    with safe_open(str(single), "pt") as f:
        return {name: single for name in f.keys()}


def tensor_sources(model, names, prefix: str = "") -> tuple[dict, list]:
    """Where each tensor of ``model``'s state (its parameters and persistent buffers) is read from: (model name ->
    file key, the names found nowhere). Tied tensors (an ``lm_head`` sharing the input embedding) are one tensor,
    read once under whichever of their names the file holds; a key without the model's ``prefix`` (its
    ``base_model_prefix``, which older checkpoints leave out) also counts."""
    aliases: dict = {}
    for name, t in model.state_dict(keep_vars=True).items():
        aliases.setdefault(id(t), []).append(name)
    head = f"{prefix}." if prefix else None
    found, missing = {}, []
    for group in aliases.values():
        keys = group + [n[len(head):] for n in group if head and n.startswith(head)]
        key = next((k for k in keys if k in names), None)
        if key is None:
            missing.append(group[0])
        else:
            found[group[0]] = key
    return found, missing


def local_rows(t: torch.Tensor) -> tuple:
    """The slices of the whole tensor that this rank holds of ``t``: a DTensor's shard (its local shape and offset
    under its placements), all of a plain tensor."""
    if isinstance(t, DTensor):
        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    else:
        shape, offset = tuple(t.shape), (0,) * t.dim()
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


@torch.no_grad()
def load_local_shards(model, sources: dict, files: dict, load_dtypes: dict, what: str = "the model") -> None:
    """Read this rank's rows of every tensor in ``sources`` (model name -> key, ``tensor_sources``) from its file
    (``files``: key -> path) into ``model``'s sharded parameters and buffers. Each value is cast to the dtype the whole
    model was loaded in (``load_dtypes``) and then to the parameter's, the roundings of loading it whole and casting it.
    A file is opened per tensor: the pages a memory-mapped file has touched count in the resident set until it is
    closed, and this rank's rows of the whole model would otherwise stay there beside its shards."""
    state = model.state_dict(keep_vars=True)
    for name, key in sources.items():
        target = state[name]
        local = target.to_local() if isinstance(target, DTensor) else target
        with safe_open(str(files[key]), "pt") as f:
            part = f.get_slice(key)
            if tuple(part.get_shape()) != tuple(target.shape):
                raise ValueError(f"{what}: {key} in {files[key]} has shape {tuple(part.get_shape())}, the model's "
                                 f"{name} {tuple(target.shape)}")
            value = part[local_rows(target)]
        local.copy_(value.to(load_dtypes[name]).to(local.dtype))


def materialize(model, device, compute_dtype, sources: dict, files: dict, load_dtypes: dict,
                what: str = "the model") -> None:
    """Shard a model built on the meta device (``shard_model``), give it empty storage on ``device`` (this rank's
    shards only) and fill it: each rank's rows from the weight files (``load_local_shards``), the buffers that are
    not in the files (e.g. rotary ``inv_freq``, built for real beside the meta parameters) copied back after
    ``to_empty``."""
    shard_model(model, compute_dtype)
    buffers = {n: b for n, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)
    load_local_shards(model, sources, files, load_dtypes, what)
