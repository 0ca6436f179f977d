"""One rank of a model's worker group: a Ray actor holding the model's policy (its shard, under FSDP2), optimizer and
rollout engine. It knows nothing of the algorithm's step: the driver runs the learner hooks on plain data and
calls these methods, each with plain data in and out (prompts, token ids, minibatch tensors, metrics).

Every rank of a group receives every call that runs the model (generate with the HF engine, scoring, the update,
weight sync, checkpoints) at the same time and with the same inputs, so that FSDP2's collectives match; the driver
keeps rank 0's answer. A vLLM engine lives on every rank (in its own process) and decodes that rank's share of
the prompts; after each update every rank streams it the gathered weights, in memory.

With rollout workers apart (``ray.rollout_workers``) the training ranks hold no engine: a ``RolloutWorker`` holds a
copy of the model and its engine, decodes, and takes the weights the training ranks send after each update over a
collective of their own (graftzoo.distributed.transfer).
"""
from __future__ import annotations

import os
import time
from functools import partial

import torch
import torch.distributed as dist

from graftzoo.contract.config import LearnerFacts, ModelSpec, RunConfig, with_values
from graftzoo.algos.base import StepContext
from graftzoo.training.planner.build import (ENGINES, build_engine, build_policy, build_sharded_policy, make_ref, resolve_device,
                                      wants_ref)
from graftzoo.contract.registry import get_algo
from graftzoo.training.models.loss import optimize
from graftzoo.training.models import fsdp
from graftzoo.distributed.cluster import free_port
from graftzoo.distributed.transfer import Transfer, drain, layout_of, signature
from graftzoo.eval.compute import ComputeMeter


def peak_memory_gb(device) -> float:
    """The peak memory of this rank so far: allocated on its GPU, else the process's peak resident set (GiB)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def group_max(device, x: int) -> int:
    """The largest ``x`` over the ranks of this process's group (a collective: every rank calls it at once)."""
    t = torch.tensor([int(x)], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def node_id() -> str:
    """The Ray node this process runs on."""
    import ray
    return ray.get_runtime_context().get_node_id()


class Decoder:
    """What a process holding a rollout engine answers: generate, seed, memory, close (``engines``: one view per
    sampling override, ``Engine.with_sampling``)."""

    policy = engine = None
    rank = 0
    transfer = None

    def __init__(self, cfg: RunConfig, cwd: str):
        torch.set_num_threads(cfg.run.threads)
        if os.path.isdir(cwd):  # relative paths of the config (models, caches) as the driver sees them
            os.chdir(cwd)
        self.engines: dict = {}

    def address(self) -> tuple:
        """Where this process can listen (a group's rendezvous, a transfer's store): its node's address and a free
        port."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def pid(self) -> int:
        return os.getpid()

    def seed(self, seed: int) -> None:
        """Seed this rank's sampling: the same on every rank decoding in lockstep, one stream per rank where each
        decodes its own share with the HF engine (a vLLM engine seeds each sequence from the driver's seeds)."""
        torch.manual_seed(seed + 1000003 * self.rank if getattr(self.engine, "group_max", None) else seed)

    def generate(self, greedy, temperature, max_new_tokens, max_prompt_tokens, sampling, *, prompts, n, prefixes=None,
                 prompt_seeds=None):
        """``Engine.generate`` with the driver's prompt budget and sampling overrides (``with_sampling``): the whole
        request on every rank in lockstep, or this rank's share of it (``prompt_seeds``: each prompt's seed)."""
        key = tuple(sorted(sampling.items()))
        if key not in self.engines:
            self.engines[key] = self.engine.with_sampling(**sampling)
        self.policy.max_prompt_tokens = int(max_prompt_tokens)
        seeded = {} if prompt_seeds is None else {"prompt_seeds": prompt_seeds}
        return self.engines[key].generate(prompts, n, prefixes=prefixes, greedy=greedy, temperature=temperature,
                                          max_new_tokens=max_new_tokens, **seeded)

    def release_memory(self) -> None:
        if self.engine is not None:
            self.engine.release_memory()

    def engine_info(self) -> dict:
        eng = self.engine
        return None if eng is None else {
            "uses_training_model": bool(eng.uses_training_model), "temperature": eng.temperature,
            "top_p": eng.top_p, "top_k": eng.top_k, "max_new_tokens": eng.max_new_tokens,
            "min_new_tokens": getattr(eng, "min_new_tokens", 0)}

    def close_engines(self) -> None:
        try:
            for engine in {id(e): e for e in self.engines.values()}.values():
                engine.close()
        finally:
            self.engines.clear()
            if self.transfer is not None:
                self.transfer.close()
                self.transfer = None


class RolloutWorker(Decoder):
    """A rollout worker of a model (``ray.rollout_workers``): a copy of the model (its adapters merged: LoRA
    trains in the group, the copy takes the merged weights) with the rollout engine, apart from the training ranks.
    It decodes what the driver sends and, after each update, takes the weights over the model's transfer group."""

    def __init__(self, spec: ModelSpec, cfg: RunConfig, index: int, cwd: str):
        super().__init__(cfg, cwd)
        self.spec, self.cfg, self.index = spec.model_copy(update={"lora": None}), cfg, int(index)
        self.layout, self.targets = None, None

    def setup(self, seed: int) -> dict:
        torch.manual_seed(seed)
        self.policy = pol = build_policy(self.spec, self.cfg, seed)
        self.engines[()] = self.engine = build_engine(pol, self.cfg)
        self.targets = dict(pol.model.state_dict())  # views of the parameters and buffers, filled in place
        self.layout = layout_of(pol.iter_weights())
        return {"pid": os.getpid(), "node_id": node_id(), "signature": signature(self.layout),
                "engine": self.engine_info()}

    def seed(self, seed: int) -> None:
        """Seed this worker's sampling: one stream per rollout worker (the first one's is one process's), as each
        decodes its own share (a vLLM engine seeds each sequence from the driver's seeds)."""
        torch.manual_seed(seed + 1000003 * self.index)

    def open_transfer(self, host: str, port: int, world: int, timeout_s: float) -> None:
        self.transfer = Transfer(host, port, self.index + 1, world, timeout_s)

    def receive_weights(self, version: int) -> float:
        """The weights of policy version ``version`` from the training group (a collective: its rank 0 sends at
        the same time), then into the engine; seconds taken."""
        t = time.perf_counter()
        self.transfer.receive(self.layout, self.targets)
        self.policy.version = int(version)
        self.engine.sync_weights()
        return time.perf_counter() - t

    def close(self) -> float:
        t = time.perf_counter()
        self.close_engines()
        return time.perf_counter() - t


class PolicyWorker(Decoder):
    def __init__(self, spec: ModelSpec, cfg: RunConfig, rank: int, world: int, cwd: str, decodes: bool = True):
        super().__init__(cfg, cwd)
        self.spec, self.cfg, self.rank, self.world, self.decodes = spec, cfg, rank, world, bool(decodes)
        self.ref = self.learner = None

    # ---- set-up ------------------------------------------------------------------------------

    def setup(self, addr: str, port: int, seed: int) -> dict:
        """Join the group (FSDP2 when it has more than one rank), build the policy, its engine and the learner
        whose loss the updates use; returns what the driver's view of the policy needs."""
        cfg, spec = self.cfg, self.spec
        device = resolve_device(spec.device)
        if self.world > 1:
            fsdp.init_group(self.rank, self.world, addr, port, device, cfg.ray.collective_timeout_s)
        torch.manual_seed(seed)
        if self.world > 1:  # FSDP2: the model built on the meta device, each rank loading only its own shards
            pol, self.ref = build_sharded_policy(spec, cfg, seed, ref=wants_ref(cfg))
        else:
            pol = build_policy(spec, cfg, seed)
            self.ref = make_ref(pol) if wants_ref(cfg) else None
        self.policy = pol
        self.learner = get_algo(cfg.algo.name)(cfg.algo, LearnerFacts.of(cfg))
        info = {"pid": os.getpid(), "node_id": node_id(), "device": str(pol.device),
                "param_dtype": str(pol.param_dtype),
                "autocast_dtype": str(pol.autocast_dtype) if pol.autocast_dtype else None,
                "context_window": pol.context_window, "lr": pol.lr, "version": pol.version,
                "max_response_tokens": pol.max_response_tokens, "max_tokens_per_micro": pol.max_tokens_per_micro,
                "hidden_size": int(pol.model.config.hidden_size), "engine": None}
        if not self.decodes:  # rollout workers apart decode: this rank sends them its weights (``send_weights``)
            self.layout = layout_of(self._weights())
            return {**info, "signature": signature(self.layout)}
        # every rank holds a rollout engine: one that decodes with the training model itself runs in lockstep (FSDP's
        # collectives); one with its own copy of the weights (vLLM) decodes this rank's share of the prompts
        if self.world > 1 and not ENGINES[cfg.rollout.engine].uses_training_model:
            # vLLM's engine core would join this process's torch.distributed group (the FSDP ranks) and wait for
            # ranks that never come: it runs in its own process, and takes the weights streamed in memory
            cfg = with_values(cfg, {"rollout.vllm.multiprocessing": True})
        self.engines[()] = self.engine = build_engine(pol, cfg)
        if self.world > 1 and self.engine.uses_training_model and cfg.ray.hf_split_generate:
            self.engine.group_max = partial(group_max, pol.device)  # every rank as many passes as the busiest
        return {**info, "engine": self.engine_info()}

    # ---- weights to rollout workers apart (graftzoo.distributed.transfer) -------------------------------------------
    def _weights(self):
        """The weights the rollout workers load (every rank walks them: a sharded group gathers each tensor)."""
        return self.policy.iter_weights()

    def open_transfer(self, host: str, port: int, world: int, timeout_s: float) -> None:
        """Rank 0 joins the model's transfer group as its sender (the store on its node); the other ranks have no
        part in it."""
        if self.rank == 0:
            self.transfer = Transfer(host, port, 0, world, timeout_s)

    def send_weights(self) -> float:
        """The current weights to the rollout workers (they receive at the same time); seconds taken."""
        t = time.perf_counter()
        with torch.no_grad():
            drain(self._weights(), self.transfer, self.layout)
        return time.perf_counter() - t

    def score_sequences(self, prompts, responses, with_entropy: bool):
        return self.policy.score_sequences(prompts, responses, with_entropy=with_entropy)

    def mean_hidden(self, texts, batch: int):
        return self.policy.mean_hidden(texts, batch=batch)

    def sync_weights(self) -> float:
        """The engine takes the current weights (a sharded group gathers each tensor as it streams, every rank at
        once); seconds taken."""
        return self.engine.sync_weights()

    # ---- update ------------------------------------------------------------------------------
    def update(self, step: int, epoch: int, model_index: int, learner_state: dict, *, mbs: list,
               base_from_forward: bool, where: str) -> dict:
        """This rank's share of every minibatch (``mbs``: one list of micro-batches per minibatch; a stand-in of
        scale 0 where it holds fewer than the others): per minibatch the gradients and one optimizer step, the
        optimizer loop (``graftzoo.training.models.loss.optimize``; FSDP2 sums the ranks' gradients). Returns per minibatch the loss sum and the metrics of the
        micro-batches it trained, the gradient norm, the learning rate and the time of each phase."""
        pol, learner = self.policy, self.learner
        learner.load_state_dict(learner_state)
        meter = ComputeMeter()
        ctx = StepContext(step=step, epoch=epoch, run=self.learner.run, policy=pol, engine=self.engine, env=None,
                          ref_policy=self.ref, meter=meter, model_index=model_index)
        ctx.max_response = int(pol.max_response_tokens)
        mbs = [[mb.to(pol.device) for mb in micros] for micros in mbs]
        out = optimize(ctx, pol, learner, mbs, base_from_forward, where)
        pol.version += 1
        phases = meter.summary()["models"].get(pol.model_id, {}).get("phases", {})
        return {"minibatches": out, "lr": pol.lr, "metrics": ctx.metrics, "peak_mem_gb": peak_memory_gb(pol.device),
                "phases": {k: (v["wall_s"], v["cpu_s"]) for k, v in phases.items()}}

    def apply_optim_settings(self, optim: dict) -> None:
        self.policy.apply_optim_settings(optim)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return self.policy.state_dict()

    def full_state_dict(self) -> dict:
        """The whole weights (rank 0's answer; every rank takes part in the gather of a sharded policy)."""
        try:
            return {k: v.detach().cpu() for k, v in self.policy.full_state_dict().items()}
        finally:
            self.policy.release_gathered()

    def checkpoint_state(self, folder: str, stem: str) -> tuple:
        return self.policy.checkpoint_state(folder, stem)

    def load_state_dict(self, state: dict, folder) -> dict:
        self.policy.load_state_dict(state, folder=folder)
        return {"version": self.policy.version, "lr": self.policy.lr}

    def close(self) -> float:
        """End the engine and leave the group; seconds taken."""
        t = time.perf_counter()
        try:
            self.close_engines()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        return time.perf_counter() - t
