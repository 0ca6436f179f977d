"""The memory and step-time model behind ``graftzoo plan`` (graftzoo/apps/plan.py) and the trainer's layout choice:
what each trained model of a run needs, phase by phase, on the GPUs it is given, from its architecture alone (no
weights are loaded). Every figure is one pure function below; the byte formulas are fitted to and checked against
what small models of the same families really allocate on CPU (bench/plan_check.py, tests/test_plan.py).

A step of a model runs four phases, each with its own peak (``PHASES``):

- ``generate``: the rollout engine's 16-bit weights, its KV cache and its forward workspace, beside the training
  state that stays resident (float32 master weights and AdamW moments; the gradients are freed after every
  optimizer step);
- ``logprob``: the theta_old pass, a forward micro-batch without gradients (no activations kept), the engines awake;
- ``update``: the training state with its gradients, one micro-batch's activations and its logits with their
  gradient; an engine with ``rollout.vllm.sleep_level`` > 0 frees its weights and KV cache meanwhile (level 1 keeps
  a copy of the weights in host memory, level 2 drops them: the weight sync after the update reloads them anyway);
- ``sync``: the weights streamed into the engine one tensor at a time, the engine awake again.

With ``rollout.max_staleness`` k >= 1 the engines generate the next k batches while the models update, where they
decode in a process of their own beside the trainer's (``generates_in_update``): no engine sleeps then, and its
weights, KV cache and forward workspace are counted in the update phase beside the training state; the k batches
wait in host memory (``ahead_host_bytes``). docs/scaling.md#asynchronous-rollouts.

With rollout workers apart (``ray.rollout_workers`` R >= 1) a model's training GPUs hold no engine: R GPUs of their
own per model hold each a copy of the weights and the engine (``rollout_worker_parts``), the weights go to them once
per step through host memory (``apart_sync_bytes``), and with k >= 1 their generation runs during the update
(``apart_seconds``). docs/scaling.md#rollout-workers-apart.

A step's peak is the largest of its phases. Layouts on a node: each model in a group of ranks of its own
(``separate``, training state sharded over the group by FSDP2), every model on every GPU (``colocated``), and for
two or more models on one GPU (``LAYOUTS_ONE_GPU``) ``resident`` (every model's training state stays on the GPU) or
``offload`` (one model's state on the GPU at a time, the others' in host memory; the bytes moved per step cost
``PCIE_BYTES_PER_S``). ``gpu_layout`` picks the layout and estimates a full-size step's time from a chip's limits
(``CHIPS``, ``DEFAULT_CALIBRATION``, ``model_seconds``); ``host_peak_bytes`` sizes a run on the CPU.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Optional

from transformers import AutoConfig

from graftzoo.contract.config import ConfigError, ModelSpec, RunConfig, trained_ids, with_values
from graftzoo.training.learning.ahead import overlaps
from graftzoo.training.planner.build import resolve_precision, tiny_spec, wants_ref
from graftzoo.training.models import policy
from graftzoo.tiny.build import tiny_config

GIB = 1 << 30
USABLE = 0.9  # of a GPU's memory, for the planned peak (the rest: CUDA contexts, allocator fragmentation)
# of a GPU's memory, kept free below USABLE where the plan can choose (margin_bytes): the plan's figures are not the
# allocator's. Each phase frees and allocates tensors of other sizes (a KV cache, activations, logits chunks), and the
# caching allocator's reserved-but-unused blocks grow with the memory in use (free blocks too small or split for the
# next request), besides the activation formulas' stated error (tests/test_plan.py: up to 6 % of the update's, 15 %
# of the logprob pass's activations). A chosen figure, not a measurement: 2.8 GiB on 141 GiB, 1.6 GiB on 80 GiB.
MARGIN = 0.02
PCIE_BYTES_PER_S = 25e9  # host <-> GPU copies of pinned memory, one direction (PCIe 4.0 x16 as measured in
#                          practice; PCIe 5.0 about doubles it): what offload's moves and level-1 sleep cost
ENGINE_BATCH_TOKENS = 16384  # tokens of one vLLM forward (its max_num_batched_tokens for the LLM class on large GPUs)
PHASES = ("generate", "logprob", "update", "sync")
LAYOUTS_ONE_GPU = ("resident", "offload")  # run.layout values for models sharing one GPU (run.layout auto: plan's)
OFFLOAD_SWITCHES = 3  # times per step the offload layout makes each model active: phase 1, the exchange, the update
KV_MIN_SEQUENCES = 1  # an engine's KV cache holds at least this many sequences at full length (vLLM's own minimum)
# the phases during which the batches ahead (rollout.max_staleness) are generated: launched after the exchange, waited
# for before each model's weight sync and at the step's end (graftzoo.training.learning.step)
AHEAD_PHASES = ("update", "sync")
# host bytes of a rollout held as Python lists (graftzoo.contract.types.Rollout), per token: a response token's id (an
# int object and its list slot, 28 + 8), log-prob (a float and its slot, 24 + 8) and its share of the decoded text,
# rounded up to pymalloc's 16-byte blocks (32 + 32 + 8 + 8 + a few characters); a prompt token, the slot of each
# rollout's own prompt_token_ids list (the ints are the prompt's, shared by its rollouts). tests/test_plan.py measures
# rollouts as the engines build them against these.
ROLLOUT_RESPONSE_TOKEN_BYTES = 88
ROLLOUT_PROMPT_TOKEN_BYTES = 12


# ------------------------------------------------------------------------------------------------
# architecture and parameters
# ------------------------------------------------------------------------------------------------

@dataclass
class Arch:
    """What the memory formulas need of a model's architecture."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    gated: bool  # Llama / Qwen MLP (gate, up, down) rather than GPT-2's (fc, proj)
    extra_per_layer: int = 0  # biases and per-head norms of the family
    extra: int = 0            # position embeddings, final norm bias
    family: str = "llama"     # transformers' model_type
    context: int | None = None  # the context window (max_position_embeddings), where the config gives it

    @classmethod
    def from_hf_config(cls, c) -> "Arch":
        get = (c.get if isinstance(c, dict) else lambda k, d=None: getattr(c, k, d))
        family = get("model_type")
        hidden = int(get("hidden_size") or get("n_embd"))
        heads = int(get("num_attention_heads") or get("n_head"))
        kv = int(get("num_key_value_heads") or heads)
        d = int(get("head_dim") or hidden // heads)
        ffn = int(get("intermediate_size") or get("n_inner") or 4 * hidden)
        # GPT-2: biases of its 4 projections and 2 layer norms; Qwen2: q/k/v biases; Qwen3: q/k norms
        extra_layer, extra = {
            "gpt2": (5 * hidden + ffn + 2 * hidden, int(get("n_positions") or 0) * hidden + hidden),
            "qwen2": (heads * d + 2 * kv * d, 0), "qwen3": (2 * d, 0)}.get(family, (0, 0))
        return cls(layers=int(get("num_hidden_layers") or get("n_layer")), hidden=hidden, heads=heads, kv_heads=kv,
                   head_dim=d, ffn=ffn, vocab=int(get("vocab_size")), tied=bool(get("tie_word_embeddings", True)),
                   gated=family != "gpt2", extra_per_layer=extra_layer, extra=extra, family=str(family),
                   context=get("max_position_embeddings") or get("n_positions"))


_TINY_ARCHS: dict = {}  # a tiny spec's architecture, by the spec's fields: tiny_config loads the tokenizer (seconds)


def architecture(spec: ModelSpec) -> Arch:
    """A pair.models entry's architecture: tiny models from their spec (worked out once per process: a real
    vocabulary's tokenizer takes seconds to load, and a plan asks several times); hf models from ``arch``
    (config.json's fields, for planning without the weights) or their config (local path or hub cache)."""
    if spec.kind == "tiny":
        tiny = tiny_spec(spec)
        key = json.dumps(tiny.to_dict(), sort_keys=True)
        if key not in _TINY_ARCHS:
            _TINY_ARCHS[key] = Arch.from_hf_config(tiny_config(tiny))
        return dataclasses.replace(_TINY_ARCHS[key])
    if spec.arch:
        return Arch.from_hf_config(spec.arch)
    try:
        return Arch.from_hf_config(AutoConfig.from_pretrained(spec.path or spec.id))
    except Exception as e:  # offline, no local copy
        raise ConfigError(f"model {spec.id!r}: its config is not available here ({type(e).__name__}); give its "
                          f"config.json fields as pair.models[].arch to plan without it") from None


def layer_params(a: Arch) -> int:
    """Parameters of one decoder layer: the attention projections H·(h·d) + 2·H·(k·d) + (h·d)·H, the MLP 3·H·F
    (gated) or 2·H·F, 2·H of norms and the family's biases / per-head norms."""
    attn = a.hidden * a.heads * a.head_dim * 2 + 2 * a.hidden * a.kv_heads * a.head_dim
    return attn + (3 if a.gated else 2) * a.hidden * a.ffn + 2 * a.hidden + a.extra_per_layer


def embedding_params(a: Arch) -> int:
    """The token embeddings V·H, twice when the output head is untied."""
    return a.vocab * a.hidden * (1 if a.tied else 2)


def param_count(a: Arch) -> int:
    """Parameters of a decoder-only transformer: embeddings, every layer, the final norm and the family's extras
    (GPT-2's position embeddings)."""
    return embedding_params(a) + a.layers * layer_params(a) + a.hidden + a.extra


# ------------------------------------------------------------------------------------------------
# training state
# ------------------------------------------------------------------------------------------------

def state_per_param(precision: str, low: bool = True) -> tuple[int, int, int]:
    """Bytes per parameter of the (weights, gradients, AdamW moments) an update keeps: float32 under ``fp32`` /
    ``bf16-mixed`` (4 + 4 + 8), 2 + 2 + 4 under ``model`` precision on a 16-bit model (``low``)."""
    return (2, 2, 4) if precision == "model" and low else (4, 4, 8)


def compute_bytes(precision: str, low: bool = True) -> int:
    """Bytes of one value the forward computes with: 2 under ``bf16-mixed`` (its bfloat16 working copy of the
    weights) and ``model`` on a 16-bit model, else 4."""
    return 2 if precision == "bf16-mixed" or (precision == "model" and low) else 4


def working_copy_bytes(a: Arch, precision: str, shards: int) -> float:
    """The bfloat16 weights the forward passes of ``bf16-mixed`` compute with, beside the float32 masters: in one
    process the whole working copy (``Policy.compute_weights``: 2 bytes a parameter, alive through a generation, a
    theta_old pass or an update's minibatch); sharded (FSDP2, bf16 gathers), the root's gathered embeddings and two
    gathered layers (the one computing and the one prefetched). 0 in other precisions."""
    if precision != "bf16-mixed":
        return 0.0
    if shards == 1:
        return 2.0 * param_count(a)
    return 2.0 * (embedding_params(a) + 2 * layer_params(a))


def train_state_bytes(n: int, precision: str, shards: int, low: bool = True) -> float:
    """Weights, gradients and AdamW moments of ``n`` parameters, per GPU over ``shards`` GPUs (FSDP2)."""
    return sum(state_per_param(precision, low)) * n / shards


def ref_bytes(n: int, precision: str, low: bool, shards: int) -> float:
    """The frozen KL reference (``algo.beta_kl`` > 0): a copy of the trained model's parameters, in the compute
    dtype in one process (float32 under ``fp32``; bfloat16 under ``bf16-mixed``, which has no use for frozen
    float32 masters: graftzoo.training.planner.build ``ref_of``; 16-bit under ``model``), as trained when sharded."""
    if shards == 1:
        return compute_bytes(precision, low) * n
    return state_per_param(precision, low)[0] * n / shards


# ------------------------------------------------------------------------------------------------
# activations (fitted to what the tiny models keep, bench/plan_check.py)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerBytes:
    """Bytes per token of one decoder layer, each as coefficients of (H, F, h·d, k·d): ``saved``, what autograd
    keeps for the backward pass (counted tensor by tensor); ``backward``, what the backward adds on top of them
    (its gradients' temporaries); ``recompute``, a checkpointed layer recomputed and run backward (its saved
    tensors and gradients at their peak); ``forward``, a layer's peak in a forward pass without gradients. The last
    three are fitted (non-negative least squares) to the peaks measured on CPU over 7 shapes per family
    (bench/plan_check.py; tests/test_plan.py checks them)."""

    saved: tuple
    backward: tuple
    recompute: tuple
    forward: tuple


# per family row, in float32 (a forward in 16 bits keeps the same tensors at half the bytes). GPT-2's h·d = k·d = H
# sit in the H column.
LAYER_BYTES = {
    "llama": LayerBytes((24, 16, 8, 8), (0, 4, 0, 8), (12, 23, 7, 10), (7, 8, 10, 18)),  # Llama, Qwen2, SmolLM3
    "qwen3": LayerBytes((24, 16, 16, 16), (0, 4, 0, 8), (12, 23, 15, 18), (7, 8, 10, 18)),  # + q / k norms
    "gpt2": LayerBytes((32, 20, 0, 0), (0, 5, 0, 0), (17, 28, 0, 0), (23, 16, 0, 0)),
}
# what a 16-bit forward keeps on top of the halved float32 row, per family, as (H, F, h·d, k·d) of ``saved``: the
# RMS norms' float32 upcasts of their inputs (the layer's two, and Qwen3's q / k norms), fitted to
# bench/plan_check.py's bf16-mixed cases without gradient checkpointing
SAVED_16BIT_EXTRA = {"llama": (4, 0, 0, 0), "qwen3": (4, 0, 2, 2), "gpt2": (0, 0, 0, 0)}


def layer_bytes(a: Arch, precision: str, kind: str, low: bool = True) -> float:
    """Bytes per token of one decoder layer of ``a``: ``LAYER_BYTES``'s ``kind`` row (saved, backward, recompute,
    forward) for its family, halved where the forward computes in 16 bits (``compute_bytes``: ``bf16-mixed``'s
    working copy, ``model`` on a 16-bit model; checked on CPU by bench/plan_check.py), plus the attention's float32
    log-sum-exp per head where the layer's tensors are kept."""
    half = compute_bytes(precision, low) == 2
    family = a.family if a.family in ("qwen3", "gpt2") else "llama"

    def bytes_of(ch, cf, cq, ckv):
        return ch * a.hidden + cf * a.ffn + cq * a.heads * a.head_dim + ckv * a.kv_heads * a.head_dim
    per = bytes_of(*getattr(LAYER_BYTES[family], kind)) * (0.5 if half else 1.0)
    if half and kind == "saved":
        per += bytes_of(*SAVED_16BIT_EXTRA[family])
    return per + (4 * a.heads if kind in ("saved", "recompute") else 0)


def residual_bytes(precision: str, low: bool = True) -> int:
    """Bytes of one value of the residual stream (a checkpointed layer's input): the compute dtype's."""
    return compute_bytes(precision, low)


def head_bytes(a: Arch, tokens: int, logit_tokens: int, precision: str, low: bool = True) -> float:
    """What the layers around the decoder keep per micro-batch: the final norm's input and output (residual dtype),
    the output head's input for the kept positions (compute dtype), the rotary tables and the token ids."""
    rb, cb = residual_bytes(precision, low), compute_bytes(precision, low)
    return tokens * (2 * a.hidden * rb + 2 * a.head_dim * 4 + 16) + logit_tokens * a.hidden * cb


def logits_bytes(a: Arch, logit_tokens: int, precision: str, low: bool = True) -> float:
    """The logits of the kept positions (only those that predict response tokens: ``logits_to_keep``) in the
    compute dtype; ``token_logprobs`` keeps them for its backward pass, which writes their gradient in the same
    dtype."""
    return float(logit_tokens) * a.vocab * compute_bytes(precision, low)


def logit_chunk_bytes(a: Arch, logit_tokens: int) -> float:
    """The float32 pieces ``token_logprobs`` and ``token_entropies`` work on at a time (at most
    ``policy.LOGIT_CHUNK`` entries): the upcast logits, their log-softmax and its exponential."""
    return 3 * 4.0 * min(policy.LOGIT_CHUNK, logit_tokens * a.vocab)


def head_grad_bytes(a: Arch, logit_tokens: int, precision: str, low: bool = True) -> float:
    """The output head's backward: the logits' gradient still alive beside the head's weight gradient (in the
    compute dtype, and its float32 cast under ``bf16-mixed`` before it is added to the master gradient)."""
    weight_grad = compute_bytes(precision, low) + (4 if precision == "bf16-mixed" else 0)
    return logits_bytes(a, logit_tokens, precision, low) + a.vocab * a.hidden * weight_grad


def update_activation_bytes(a: Arch, tokens: int, logit_tokens: int, precision: str, checkpointing: bool,
                            low: bool = True) -> float:
    """The peak an update's micro-batch of ``tokens`` padded tokens adds to the training state (its gradients
    already allocated): what stays kept through the backward pass — every layer's saved tensors, or with gradient
    checkpointing each layer's input in the residual dtype — and ``head_bytes``, plus the largest of what comes and
    goes: the logits with their gradient and a float32 piece of their log-softmax (the backward's start), the
    output head's backward (``head_grad_bytes``), and a layer's backward temporaries or, checkpointed, the layer
    recomputed and run backward (``layer_bytes``)."""
    if checkpointing:
        kept = tokens * a.layers * a.hidden * residual_bytes(precision, low)
        layer = tokens * layer_bytes(a, precision, "recompute", low)
    else:
        kept = tokens * a.layers * layer_bytes(a, precision, "saved", low)
        layer = tokens * layer_bytes(a, precision, "backward", low)
    logits = 2 * logits_bytes(a, logit_tokens, precision, low) + logit_chunk_bytes(a, logit_tokens)
    return (kept + head_bytes(a, tokens, logit_tokens, precision, low)
            + max(logits, head_grad_bytes(a, logit_tokens, precision, low), layer))


def forward_activation_bytes(a: Arch, tokens: int, logit_tokens: int, precision: str, low: bool = True) -> float:
    """The peak of a forward micro-batch without gradients (the theta_old and reference passes): the larger of one
    layer's (``layer_bytes`` forward) and the output's — the final norm's input and output, the logits of the kept
    positions and a float32 piece of their log-softmax. (``bf16-mixed``'s weights are cast once, for the whole
    pass: ``working_copy_bytes``.)"""
    out = (2 * tokens * a.hidden * residual_bytes(precision, low) + logits_bytes(a, logit_tokens, precision, low)
           + logit_chunk_bytes(a, logit_tokens))
    return max(tokens * layer_bytes(a, precision, "forward", low), out)


def optimizer_step_bytes(n: int, device: str) -> float:
    """What AdamW's step allocates on top of the state: nothing for the fused kernel (CUDA), one float32 copy of
    the parameters for the multi-tensor (``foreach``) one elsewhere (measured on CPU: 4.0 bytes per parameter)."""
    return 0.0 if device.startswith("cuda") else 4.0 * n


# ------------------------------------------------------------------------------------------------
# rollout engines
# ------------------------------------------------------------------------------------------------

def kv_bytes_per_token(a: Arch, dtype_bytes: int = 2) -> int:
    """KV cache bytes per token: keys and values of every layer's KV heads."""
    return 2 * a.layers * a.kv_heads * a.head_dim * dtype_bytes


def engine_workspace_bytes(a: Arch, max_num_seqs: int, tokens: int = ENGINE_BATCH_TOKENS) -> float:
    """A vLLM engine's forward workspace while it generates: one layer of a forward over ``tokens`` tokens in 16
    bits (``layer_bytes`` forward, the ``model`` precision row) and the float32 logits of the ``max_num_seqs``
    sequences it samples, with the sampler's probabilities (an estimate: not measured)."""
    return tokens * layer_bytes(a, "model", "forward") + 2 * 4.0 * max_num_seqs * a.vocab


# ------------------------------------------------------------------------------------------------
# one model's inputs
# ------------------------------------------------------------------------------------------------

@dataclass
class ModelMemory:
    """One trained model's memory inputs that do not depend on where it is placed (bytes, tokens)."""

    model: str
    arch: Arch
    params: int
    precision: str
    low: bool                 # loaded in 16 bits
    checkpointing: bool
    micro_tokens: int         # padded tokens of one update micro-batch
    logit_tokens: int         # of them, the positions whose logits are kept (those predicting response tokens)
    prompt_tokens: int        # rollout.max_prompt_tokens, at most what the context window leaves the response
    response_tokens: int
    sequences: int            # rollouts per step: prompts x n
    engine: str               # rollout.engine
    engine_dtype_bytes: int   # the vLLM engine's weights and KV cache: 2 (bf16) or 4
    kv_cache: float | None    # rollout.vllm.kv_cache_gb in bytes; None: sized by the plan (or the GPU share)
    kv_share: float           # rollout.vllm.gpu_memory_utilization
    sleep_level: int          # rollout.vllm.sleep_level (vLLM engines)
    max_num_seqs: int
    gen_batch_size: int       # the HF engine's sequences per generate call
    ref: bool                 # a frozen KL reference (algo.beta_kl > 0)
    epochs: int               # optim.epochs
    num_workers: int | None   # ranks the config fixes (its num_workers, or ray.num_workers above 1); None: open
    staleness: int = 0        # rollout.max_staleness: batches collected ahead of their step
    overlap: bool = False     # its engine generates them while the model updates, on one rank (generates_in_update)
    decodes: bool = True      # its training ranks hold its engine (False: rollout workers apart, ray.rollout_workers)

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + self.response_tokens

    @property
    def vllm(self) -> bool:
        return self.engine == "vllm"

    @property
    def engine_weights(self) -> float:
        """The vLLM engine's copy of the weights (0 for the HF engine: it decodes with the training weights)."""
        return float(self.engine_dtype_bytes * self.params) if self.vllm else 0.0

    @property
    def kv_per_token(self) -> int:
        return kv_bytes_per_token(self.arch, self.engine_dtype_bytes if self.vllm else compute_bytes(
            self.precision, self.low))

    @property
    def kv_all(self) -> float:
        """The KV cache every sequence of a step at full length would need at once."""
        return float(self.kv_per_token) * self.sequences * self.seq_len


def engine_in_own_process(cfg: RunConfig, shared_gpu: bool) -> bool:
    """Whether each vLLM engine of ``cfg`` runs its engine core in a process of its own:
    ``rollout.vllm.multiprocessing`` true, or ``auto`` where two models share a GPU (``shared_gpu``: one process
    would hold two engines there, and vLLM's sleep mode and memory accounting work for one engine per process;
    graftzoo.training.planner.placement resolves ``auto`` by this rule)."""
    mp = cfg.rollout.vllm.multiprocessing
    return cfg.rollout.engine == "vllm" and (mp is True or (mp == "auto" and shared_gpu))


def ahead_overlap(cfg: RunConfig, shared_gpu: bool) -> bool:
    """Whether the engines of ``cfg`` generate the batches ahead while the models update (graftzoo.training.learning.ahead's
    ``overlap``; docs/scaling.md#asynchronous-rollouts): ``rollout.max_staleness`` >= 1, not ``run.layout`` offload,
    and every engine decoding apart from the update (``decodes_apart``). Otherwise the batches ahead are generated
    just before the update, the engines asleep during it as their sleep level says. The trainer's rule
    (``ahead.overlaps``) also asks the built learners (``Learner.collect_reads_policy``), which the config alone
    does not tell: the plan counts the overlap then, an upper bound."""
    return overlaps(int(cfg.rollout.max_staleness), cfg.run.layout, decodes_apart(cfg, shared_gpu), False)


def decodes_apart(cfg: RunConfig, shared_gpu: bool) -> bool:
    """Whether every engine of ``cfg`` decodes in processes the update does not use: on Ray, rollout workers apart
    (``ray.rollout_workers`` >= 1; a group's own ranks take one call at a time); in the trainer's process, a vLLM
    engine core in a process of its own (``engine_in_own_process``)."""
    if cfg.run.backend == "ray":
        return int(cfg.ray.rollout_workers) >= 1
    return engine_in_own_process(cfg, shared_gpu)


def model_memory(cfg: RunConfig) -> list[ModelMemory]:
    """The memory inputs of every trained model of ``cfg``, in pair order; ``overlap`` for a model on GPUs of its
    own (``ahead_overlap``; the one-GPU layouts set it for their GPU)."""
    r, o = cfg.rollout, cfg.optim
    apart = rollout_workers(cfg) > 0  # the engines on rollout workers of their own: none on the training GPUs
    overlap = ahead_overlap(cfg, shared_gpu=False) and not apart
    sequences = int(cfg.task.prompts_per_step) * int(r.n)
    out = []
    for spec in cfg.pair.models:
        if spec.id not in trained_ids(cfg):
            continue
        a = architecture(spec)
        low = spec.dtype not in (None, "float32")  # a tiny model without a dtype: as warmed up, float32
        precision = resolve_precision(o.precision, low)
        response = int(spec.max_new_tokens)
        prompt = int(r.max_prompt_tokens)
        if a.context:  # the trainer's prompt budget leaves the response room in the context window
            prompt = min(prompt, int(a.context) - response)
        micro = o.max_tokens_per_micro or max(1, sequences // int(o.minibatches)) * (prompt + response)
        vdtype = r.vllm.dtype if r.vllm.dtype != "auto" else (
            "bfloat16" if precision == "bf16-mixed" or (precision == "model" and low) else "float32")
        out.append(ModelMemory(
            model=spec.id, arch=a, params=param_count(a), precision=precision, low=low,
            checkpointing=bool(spec.gradient_checkpointing),
            micro_tokens=int(micro), logit_tokens=int(micro) * response // (prompt + response),
            prompt_tokens=prompt, response_tokens=response, sequences=sequences, engine=r.engine,
            engine_dtype_bytes=4 if vdtype == "float32" else 2,
            kv_cache=None if r.vllm.kv_cache_gb is None else float(r.vllm.kv_cache_gb) * GIB,
            kv_share=float(r.vllm.gpu_memory_utilization), sleep_level=int(r.vllm.sleep_level),
            max_num_seqs=int(r.vllm.max_num_seqs), gen_batch_size=int(r.gen_batch_size), ref=wants_ref(cfg),
            epochs=int(o.epochs),
            num_workers=spec.num_workers if spec.sets("num_workers") or spec.num_workers > 1 else None,
            staleness=int(r.max_staleness), overlap=overlap, decodes=not apart))
    return out


def rollout_workers(cfg: RunConfig) -> int:
    """Rollout workers apart per model (``ray.rollout_workers`` on ``run.backend: ray``; 0 in one process)."""
    return int(cfg.ray.rollout_workers) if cfg.run.backend == "ray" else 0


def update_bytes(m: ModelMemory) -> float:
    """Model ``m``'s update micro-batch (``update_activation_bytes``)."""
    return update_activation_bytes(m.arch, m.micro_tokens, m.logit_tokens, m.precision, m.checkpointing, m.low)


def forward_bytes(m: ModelMemory) -> float:
    """Model ``m``'s forward micro-batch without gradients (``forward_activation_bytes``)."""
    return forward_activation_bytes(m.arch, m.micro_tokens, m.logit_tokens, m.precision, m.low)


def hf_generate_bytes(m: ModelMemory) -> float:
    """The HF engine's generate call: the KV cache of ``gen_batch_size`` sequences at full length and their
    float32 next-token logits."""
    rows = min(m.gen_batch_size, m.sequences)
    return float(rows) * (m.seq_len * m.kv_per_token + 4 * m.arch.vocab)


def rollout_host_bytes(m: ModelMemory) -> float:
    """One step's batch of model ``m``'s rollouts in host memory, every rollout at full length: ``sequences`` x
    (``prompt_tokens`` x ``ROLLOUT_PROMPT_TOKEN_BYTES`` + ``response_tokens`` x ``ROLLOUT_RESPONSE_TOKEN_BYTES``)."""
    return float(m.sequences) * (m.prompt_tokens * ROLLOUT_PROMPT_TOKEN_BYTES
                                 + m.response_tokens * ROLLOUT_RESPONSE_TOKEN_BYTES)


def ahead_host_bytes(m: ModelMemory) -> float:
    """The ``rollout.max_staleness`` batches of model ``m`` collected ahead of their steps and held in host memory
    until then (graftzoo.training.learning.ahead), beside the step's own batch: ``staleness`` x ``rollout_host_bytes``.
    docs/scaling.md#asynchronous-rollouts."""
    return m.staleness * rollout_host_bytes(m)


def kv_share_bytes(m: ModelMemory, gpu_gb: float) -> float:
    """The KV cache vLLM reserves when ``kv_cache_gb`` is null: ``gpu_memory_utilization`` of the GPU less the
    engine's weights."""
    return max(0.0, m.kv_share * gpu_gb * GIB - m.engine_weights)


def kv_min_bytes(m: ModelMemory) -> float:
    """The smallest KV cache an engine of ``m`` starts with: ``KV_MIN_SEQUENCES`` sequences at full length."""
    return float(KV_MIN_SEQUENCES * m.seq_len * m.kv_per_token)


# ------------------------------------------------------------------------------------------------
# what a GPU holds in each phase
# ------------------------------------------------------------------------------------------------

def state_parts(m: ModelMemory, ranks: int, updating: bool) -> dict:
    """Model ``m``'s training state on one GPU of a group of ``ranks`` (bytes): its weights and AdamW moments
    (sharded by FSDP2), the KL reference, and while ``updating`` the gradients and bf16-mixed's working copy
    (``working_copy_bytes``: the other phases that run a forward add it in ``phase_parts``)."""
    w, g, mo = state_per_param(m.precision, m.low)
    out = {"weights": w * m.params / ranks, "adamw_moments": mo * m.params / ranks}
    if m.ref:
        out["ref_weights"] = ref_bytes(m.params, m.precision, m.low, ranks)
    if updating:
        out["grads"] = g * m.params / ranks
        out["working_copy"] = working_copy_bytes(m.arch, m.precision, ranks)
    return out


def generates_in_update(m: ModelMemory, ranks: int) -> bool:
    """Whether model ``m``'s engine generates the batches ahead (``rollout.max_staleness``) while ``m`` updates on a
    group of ``ranks`` ranks: ``m.overlap``, in the trainer's process, where a model has one rank (a model sharded over
    ranks runs in a Ray worker group, whose calls queue one at a time). docs/scaling.md#asynchronous-rollouts."""
    return m.overlap and ranks == 1


def engine_sleeps(m: ModelMemory, ranks: int) -> bool:
    """Whether model ``m``'s vLLM engine frees its GPU memory during ``m``'s update: a sleep level above 0, unless it
    generates the batches ahead meanwhile (``generates_in_update``: the trainer never puts it to sleep then)."""
    return m.vllm and m.sleep_level > 0 and not generates_in_update(m, ranks)


def engine_parts(m: ModelMemory, kv: float, awake: bool) -> dict:
    """Model ``m``'s vLLM engine on one GPU: its weights and KV cache ``kv`` while it is ``awake``; nothing while it
    sleeps (sleep levels 1 and 2 both free its GPU memory)."""
    if not m.vllm or not awake:
        return {}
    return {"engine_weights": m.engine_weights, "kv_cache": kv}


def phase_parts(m: ModelMemory, phase: str, ranks: int, kv: float) -> dict:
    """What one GPU holds for model ``m`` (a group of ``ranks`` ranks, KV cache ``kv`` per engine) while ``m`` is in
    ``phase`` (``PHASES``, module docstring). An engine that generates the batches ahead during the update
    (``generates_in_update``) is awake in it with its forward workspace. Without an engine (``m.decodes`` False:
    rollout workers apart) the GPU holds the training state, and in the sync the weight sent (``apart_sync_parts``)."""
    updating = phase == "update"
    ahead = updating and generates_in_update(m, ranks)
    out = state_parts(m, ranks, updating)
    if not m.decodes:
        if phase == "logprob":
            out.update(activations=forward_bytes(m), working_copy=working_copy_bytes(m.arch, m.precision, ranks))
        elif updating:
            out["activations"] = update_bytes(m)
        elif phase == "sync":
            out.update(apart_sync_parts(m))
        return out
    out.update(engine_parts(m, kv, awake=not (updating and engine_sleeps(m, ranks))))
    if phase == "generate":
        out["engine_workspace"] = (engine_workspace_bytes(m.arch, m.max_num_seqs) if m.vllm else hf_generate_bytes(m))
        if not m.vllm:  # the HF engine decodes with the training model, in its compute dtype
            out["working_copy"] = working_copy_bytes(m.arch, m.precision, ranks)
    elif phase == "logprob":
        out["activations"] = forward_bytes(m)
        out["working_copy"] = working_copy_bytes(m.arch, m.precision, ranks)
    elif updating:  # AdamW's fused CUDA step adds nothing (optimizer_step_bytes)
        out["activations"] = update_bytes(m)
        if ahead:  # the engine decodes the next batches meanwhile
            out["engine_workspace"] = engine_workspace_bytes(m.arch, m.max_num_seqs)
    elif phase == "sync" and m.vllm:
        out["sync_buffer"] = 6.0 * m.arch.vocab * m.arch.hidden  # the largest tensor gathered (fp32) and cast (bf16)
    return out


def apart_sync_parts(m: ModelMemory) -> dict:
    """A training GPU's extra while it sends the weights to the rollout workers apart: the largest tensor gathered
    whole (the embedding, float32) and its copy in the bucket on its way to host memory."""
    return {"sync_buffer": 8.0 * m.arch.vocab * m.arch.hidden}


def rollout_worker_parts(m: ModelMemory, kv: float) -> dict:
    """One rollout worker's GPU (``ray.rollout_workers``): its copy of the weights as the training ranks hold them
    (the transfer writes into it) and its engine: vLLM's own weights, KV cache ``kv`` and forward workspace, or the HF
    engine's compute-dtype copy and a generate call's KV cache."""
    w, _, _ = state_per_param(m.precision, m.low)
    out = {"weights": w * m.params}
    if m.vllm:
        out.update(engine_weights=m.engine_weights, kv_cache=kv,
                   engine_workspace=engine_workspace_bytes(m.arch, m.max_num_seqs))
    else:
        out.update(working_copy=working_copy_bytes(m.arch, m.precision, 1), engine_workspace=hf_generate_bytes(m))
    return out


def apart_sync_bytes(m: ModelMemory) -> float:
    """The bytes a step's weight transfer moves to each rollout worker: the whole weights as trained."""
    return float(state_per_param(m.precision, m.low)[0] * m.params)


def idle_parts(m: ModelMemory, kv: float, resident: bool, phase: str = "") -> dict:
    """What one GPU holds for model ``m`` while another model of the GPU runs its ``phase`` (in-process, one after the
    other): its training state, or offloaded only its KL reference, and its engine, awake (the trainer frees an
    engine only during its own model's update), generating the batches ahead in ``AHEAD_PHASES`` where it does
    (``generates_in_update``: its forward workspace too)."""
    out = state_parts(m, 1, False)
    if not resident:
        out = {k: v for k, v in out.items() if k == "ref_weights"}
    out.update(engine_parts(m, kv, awake=True))
    if phase in AHEAD_PHASES and generates_in_update(m, 1):
        out["engine_workspace"] = engine_workspace_bytes(m.arch, m.max_num_seqs)
    return out


def add(*parts: dict) -> dict:
    """The sum of parts dicts, key by key."""
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


def gib(parts: dict) -> dict:
    """Bytes -> GiB, key by key."""
    return {k: v / GIB for k, v in parts.items()}


# ------------------------------------------------------------------------------------------------
# layouts
# ------------------------------------------------------------------------------------------------

def phase_peaks(phases: dict) -> dict:
    """phase -> its peak (bytes) of ``{phase: {"parts": ...}}``."""
    return {p: sum(v["parts"].values()) for p, v in phases.items()}


def peak_of(phases: dict) -> tuple[str, float]:
    """(the phase with the largest peak, that peak)."""
    peaks = phase_peaks(phases)
    top = max(peaks, key=peaks.get)
    return top, peaks[top]


def group_phases(m: ModelMemory, ranks: int, kv: float) -> dict:
    """A GPU of model ``m``'s own group of ``ranks`` ranks: phase -> ``{"during": m, "parts": ...}``."""
    return {p: {"during": m.model, "parts": phase_parts(m, p, ranks, kv)} for p in PHASES}


def shared_phases(models: list, kv: float, resident: bool, together: bool) -> dict:
    """One GPU shared by ``models`` in one process (the one-GPU layouts; ``resident``: every model's training state
    stays, else only the active model's): each phase at its worst over the models, the others idle beside it
    (``idle_parts``, their engines generating the batches ahead in ``AHEAD_PHASES`` where they do); with ``together``
    the models' generate and logprob phases run at once (the trainer's phase 1 in threads, each engine in its own
    process) and add up."""
    out = {}
    for p in PHASES:
        if together and p in ("generate", "logprob"):
            out[p] = {"during": "all", "parts": add(*(phase_parts(m, p, 1, kv) for m in models))}
            continue
        cands = [(m, add(phase_parts(m, p, 1, kv), *(idle_parts(o, kv, resident, p) for o in models if o is not m)))
                 for m in models]
        m, parts = max(cands, key=lambda c: sum(c[1].values()))
        out[p] = {"during": m.model, "parts": parts}
    return out


def colocated_phases(models: list, ranks: list, kvs: list) -> dict:
    """A GPU holding a rank of every model's group (Ray workers, the models stepping at once): each phase the sum
    of the models' parts in that phase."""
    return {p: {"during": "all", "parts": add(*(phase_parts(m, p, r, kv) for m, r, kv in zip(models, ranks, kvs)))}
            for p in PHASES}


def largest_kv(phases_of, usable: float) -> float:
    """The largest KV cache per engine (bytes, down to 0.1 GiB) for which every phase of ``phases_of(kv)`` fits
    ``usable``: each phase's peak is its base plus the KV caches it holds; inf without engines, < 0 when a phase
    does not fit even without a KV cache."""
    base, slope = phase_peaks(phases_of(0.0)), phase_peaks(phases_of(float(GIB)))
    best = math.inf
    for p in base:
        per_gib = slope[p] - base[p]
        if per_gib > 0:
            best = min(best, (usable - base[p]) / per_gib * GIB)
        elif base[p] > usable:
            best = -1.0
    if not math.isfinite(best) or best < 0:
        return best
    return math.floor(best / GIB * 10) / 10 * GIB


def param_tensor_sizes(a: Arch) -> list[int]:
    """The parameters of each tensor of a model of ``a`` as transformers lays its family out: the embeddings, the
    final norm, per layer the attention projections, the MLP, two norms and the family's biases / per-head norms
    (GPT-2: its position embeddings and every norm's bias), an untied output head. Their sum is ``param_count``."""
    h, f, d = a.hidden, a.ffn, a.head_dim
    q, kv = a.heads * d, a.kv_heads * d
    if a.family == "gpt2":
        top = [a.vocab * h, a.extra - h, h, h]  # wte, wpe, ln_f's weight and bias
        layer = [h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * f, f, f * h, h]
    else:
        top = [a.vocab * h, h]
        layer = ([h * q, h * kv, h * kv, q * h] + [h * f] * (3 if a.gated else 2) + [h, h]
                 + {"qwen2": [q, kv, kv], "qwen3": [d, d]}.get(a.family, []))
    return top + layer * a.layers + ([] if a.tied else [a.vocab * h])


def state_tensor_bytes(m: ModelMemory) -> list[int]:
    """The bytes of each tensor of model ``m``'s training state, as ``Policy._state_tensors`` lists them once it has
    updated: its parameters (``param_tensor_sizes``) in the training dtype, its buffers (the rotary embeddings' two
    float32 tables of head_dim / 2, transformers 5; none for GPT-2), and per parameter AdamW's two moments and its
    float32 step count."""
    w, _, mo = state_per_param(m.precision, m.low)
    sizes = param_tensor_sizes(m.arch)
    rotary = [] if m.arch.family == "gpt2" else [4 * (m.arch.head_dim // 2)] * 2
    return [w * n for n in sizes] + rotary + [b for n in sizes for b in (mo // 2 * n, mo // 2 * n, 4)]


def movable_bytes(m: ModelMemory) -> float:
    """What the offload layout moves of model ``m``: its training state (``state_tensor_bytes``: the weights, buffers
    and AdamW's state; graftzoo.training.models.policy's ``offload``; the KL reference stays on the GPU, gradients hold
    nothing between updates)."""
    return float(sum(state_tensor_bytes(m)))


def host_buffer_bytes(m: ModelMemory) -> float:
    """The host buffer the offload layout holds for model ``m``, as allocated: ``Policy.host_buffer_size`` of its
    ``state_tensor_bytes`` (each tensor aligned to ``Policy.HOST_ALIGN`` bytes, the buffer to whole pages). One
    buffer per model, pinned at its exact size (``Policy._pin``: cudaHostRegister), so torch's pinned allocator and
    its power-of-two rounding (a 12 GiB buffer would hold 16) play no part:
    docs/scaling.md#one-gpu-placement-layouts-offload."""
    return float(policy.Policy.host_buffer_size(state_tensor_bytes(m)))


def offload_bytes_per_step(models: list) -> float:
    """What the offload layout moves over PCIe per step: each model is made active ``OFFLOAD_SWITCHES`` times, its
    ``movable_bytes`` coming in and going out each time."""
    return sum(2.0 * OFFLOAD_SWITCHES * movable_bytes(m) for m in models)


def sleep_bytes_per_step(models: list) -> float:
    """What sleep level 1 moves per step: each engine's weights to host memory and back around its update
    (level 2 drops them; the weight sync reloads them either way); none for an engine that never sleeps
    (``engine_sleeps``)."""
    return sum(2.0 * m.engine_weights for m in models if engine_sleeps(m, 1) and m.sleep_level == 1)


def host_bytes_one_gpu(models: list, layout: str) -> float:
    """Host memory the one-GPU layouts hold besides the process: offload, every model's pinned buffer as allocated
    (``host_buffer_bytes``: ``Policy.offload`` keeps it between moves); sleep level 1, the sleeping engine's
    weights."""
    buffers = sum(host_buffer_bytes(m) for m in models) if layout == "offload" else 0.0
    return buffers + max((m.engine_weights for m in models if engine_sleeps(m, 1) and m.sleep_level == 1),
                         default=0.0)


# ------------------------------------------------------------------------------------------------
# step time from a chip's limits
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Chip:
    """A GPU's limits: dense bfloat16 FLOP/s, memory bandwidth (bytes/s), memory (GiB as sold); ``name``: its key in
    ``CHIPS``."""

    bf16_flops: float
    hbm_bytes_per_s: float
    memory_gb: float
    name: str = ""


CHIPS = {name: Chip(*limits, name) for name, limits in {  # SXM parts, the vendors' data sheets (dense, no sparsity)
    "h200": (989e12, 4.8e12, 141), "h100": (989e12, 3.35e12, 80), "a100": (312e12, 2.039e12, 80)}.items()}
DEFAULT_CHIP = "h100"  # an 80 GB part, the GPU most clusters have: plan's memory and its step time agree by default


def gpu_of(chip: Optional[str] = None, gpu_gb: Optional[float] = None) -> tuple:
    """The GPU ``plan`` sizes for, as (chip name, memory in GiB), so that its memory and its step time describe one
    GPU: neither given, ``DEFAULT_CHIP`` and its memory; a chip alone, its memory; a memory alone, the first chip of
    ``CHIPS`` sold with that memory (141 -> h200, 80 -> h100), else ``DEFAULT_CHIP``'s limits for the step time (a
    memory no listed chip has: a partitioned or another GPU); both, as given. docs/scaling.md#plan-a-run-graftzoo-plan.
    """
    if chip is not None and chip not in CHIPS:
        raise ValueError(f"chip {chip!r} is not one of {', '.join(sorted(CHIPS))}")
    if gpu_gb is None:
        name = chip or DEFAULT_CHIP
        return name, float(CHIPS[name].memory_gb)
    if chip is None:
        chip = next((name for name, c in CHIPS.items() if c.memory_gb == gpu_gb), DEFAULT_CHIP)
    return chip, float(gpu_gb)
# Assumed until a GPU check measures them (``--calibration FILE``; docs/scaling.md#step-time-and-mfu): the update's
# hardware FLOP utilisation (``train_flops`` with gradient checkpointing's recompute, against the chip's data-sheet
# peak: transformers layers with gradient checkpointing reach 0.3-0.4) and the fraction of the memory bandwidth each
# engine's decode steps achieve (the HF engine's taken as vLLM's until measured).
DEFAULT_CALIBRATION = {"update_hfu": 0.35, "hf_decode_bw_fraction": 0.5, "vllm_decode_bw_fraction": 0.5}
# what a calibration may give besides: the measured matrix-product rate its update_hfu is relative to, and the chip
CALIBRATION_PEAK = ("measured_bf16_flops", "chip")
RETIRED_CALIBRATION = {
    "generate_bw_fraction": "it does not say which engine's decode it was measured on; give vllm_decode_bw_fraction "
                            "(vLLM's decode steps) or hf_decode_bw_fraction (the HF engine's): a figure measured on "
                            "one engine is not applied to the other",
    "update_mfu": "the step time counts hardware FLOPs (gradient checkpointing's recompute included), so the plan "
                  "reads update_hfu; update_mfu (model FLOPs, 6·N per token) is what the device check reports"}


def calibration_value(key: str, value):
    """One calibration entry checked (``calibration_of``): a fraction in (0, 1], a positive FLOP/s, or a chip of
    ``CHIPS``; ``ValueError`` names the key."""
    if key in RETIRED_CALIBRATION:
        raise ValueError(f"calibration key {key!r} is no longer read: {RETIRED_CALIBRATION[key]}")
    if key not in DEFAULT_CALIBRATION and key not in CALIBRATION_PEAK:
        raise ValueError(f"calibration key {key!r}: not one of {', '.join([*DEFAULT_CALIBRATION, *CALIBRATION_PEAK])}")
    if key == "chip":
        if value not in CHIPS:
            raise ValueError(f"calibration key 'chip': {value!r} is not one of {', '.join(CHIPS)}")
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if key == "measured_bf16_flops":
        if not number or value <= 0:
            raise ValueError(f"calibration key {key!r}: {value!r} is not a positive FLOP/s")
    elif not number or not 0 < value <= 1:
        raise ValueError(f"calibration key {key!r}: {value!r} is not a fraction in (0, 1]")
    return float(value)


def calibration_of(data: dict | None) -> dict:
    """``DEFAULT_CALIBRATION`` overridden by ``data``: a calibration, or a device check's report (bench/gpu_check.py)
    holding one under ``calibration``. Its keys: ``update_hfu``, ``hf_decode_bw_fraction``,
    ``vllm_decode_bw_fraction`` (fractions in (0, 1]); ``measured_bf16_flops``, the peak ``update_hfu`` is then
    relative to (it needs an ``update_hfu`` measured against it: the default is a data-sheet figure), and ``chip``,
    the ``CHIPS`` key of the GPU measured (``peak_flops``). A null value is a key not given. ``ValueError`` names a
    key that is unknown, retired (``RETIRED_CALIBRATION``) or out of range. docs/scaling.md#step-time-and-mfu."""
    if isinstance(data, dict) and isinstance(data.get("calibration"), dict):
        data = data["calibration"]
    given = {k: calibration_value(k, v) for k, v in (data or {}).items() if v is not None}
    if "measured_bf16_flops" in given and "update_hfu" not in given:
        raise ValueError("calibration key 'measured_bf16_flops' needs the update_hfu measured against it (the "
                         f"default {DEFAULT_CALIBRATION['update_hfu']} is relative to the chip's data-sheet peak)")
    return {**DEFAULT_CALIBRATION, **given}


def peak_flops(chip: Chip, cal: dict) -> float:
    """The bfloat16 FLOP/s on ``chip`` that ``cal``'s ``update_hfu`` is relative to: the data sheet's
    (``chip.bf16_flops``), or the calibration's ``measured_bf16_flops`` — as measured where it names ``chip`` (or
    no chip), scaled by the ratio of the two chips' data-sheet peaks where it names another.
    docs/scaling.md#step-time-and-mfu."""
    measured = cal.get("measured_bf16_flops")
    if measured is None:
        return chip.bf16_flops
    on = cal.get("chip")
    if on is None or on == chip.name:
        return float(measured)
    return measured * chip.bf16_flops / CHIPS[on].bf16_flops


def attention_flops(a: Arch, seq_len: float) -> float:
    """Attention's own FLOPs per token of a forward pass over sequences of ``seq_len`` tokens, beside the weights'
    2·N: per layer the scores Q·Kᵀ and their product with V, 2·(h·d)·seq_len each: 4·layers·(h·d)·seq_len.
    The whole score matrix is counted, the causal mask's half too, as PaLM counts it (12·L·H·Q·T per trained token:
    Chowdhery et al. 2022, arXiv:2204.02311, appendix B); a kernel that skips the masked blocks does about half.
    docs/scaling.md#step-time-and-mfu."""
    return 4.0 * a.layers * a.heads * a.head_dim * seq_len


def forward_flops(n: int, tokens: float, attention: float = 0.0) -> float:
    """A forward pass's FLOPs over ``tokens`` tokens: 2·N per token (a multiply and an add per weight), plus
    ``attention`` per token (``attention_flops``; 0 leaves attention's own FLOPs out).
    docs/scaling.md#step-time-and-mfu."""
    return (2.0 * n + attention) * tokens


def train_flops(n: int, tokens: float, checkpointing: bool, recompute: bool = True, attention: float = 0.0) -> float:
    """An update's FLOPs over ``tokens`` trained tokens, 3 x ``forward_flops``: the forward and the backward (twice
    the forward: the activations' gradients and the weights'), 6·N per token — the model FLOPs MFU is reported
    against (PaLM's definition: Chowdhery et al. 2022, arXiv:2204.02311, appendix B; with ``attention``
    6·N + 12·L·H·Q·T), whatever the recompute; with gradient checkpointing and ``recompute``, the forward again:
    8·N per token, the hardware FLOPs a step's time is made of (HFU). docs/scaling.md#step-time-and-mfu."""
    passes = 4.0 if checkpointing and recompute else 3.0
    return passes * forward_flops(n, tokens, attention)


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """The utilisation of ``peak_flops`` FLOP/s by ``flops`` done in ``seconds``: MFU with model FLOPs
    (``train_flops`` with ``recompute`` False), HFU with hardware FLOPs (``recompute`` True); the peak a data
    sheet's (``CHIPS``) or a measured matrix product's. docs/scaling.md#step-time-and-mfu."""
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"utilisation of {flops:g} FLOPs in {seconds:g} s at {peak_flops:g} FLOP/s: both must be > 0")
    return flops / seconds / peak_flops


def compute_seconds(flops: float, peak: float, utilisation: float) -> float:
    """``flops`` at ``utilisation`` of ``peak`` FLOP/s (``peak_flops``)."""
    return flops / (peak * utilisation)


def decode_batch(kv: float, context: float, kv_per_token: int, max_num_seqs: int, sequences: int) -> int:
    """Sequences an engine decodes at once: ``max_num_seqs``, fewer when there are fewer sequences or when the KV
    cache ``kv`` holds fewer of ``context`` tokens each (its pages are taken as the sequences grow; at least one)."""
    fit = int(kv // max(1.0, context * kv_per_token)) if math.isfinite(kv) else sequences
    return max(1, min(max_num_seqs, sequences, fit))


def decode_weight_bytes(a: Arch, dtype_bytes: int) -> float:
    """The weights one decode step reads, at ``dtype_bytes`` a parameter: all but an untied model's input embeddings
    and GPT-2's position embeddings, of which a step reads only its tokens' rows. docs/scaling.md#step-time-and-mfu."""
    skipped = (0 if a.tied else a.vocab * a.hidden) + (a.extra - a.hidden if a.family == "gpt2" else 0)
    return float(dtype_bytes * (param_count(a) - skipped))


def decode_step_bytes(weights: float, batch: int, context: float, kv_per_token: int) -> float:
    """Bytes one decode step reads: the engine's weights once, and every sequence's KV cache over its ``context``
    tokens."""
    return weights + batch * context * kv_per_token


def decode_bytes(weights: float, batch: int, prompt_tokens: float, steps: int, kv_per_token: int) -> float:
    """Bytes the ``steps`` decode steps of ``batch`` sequences read after their prefill of ``prompt_tokens`` tokens
    (which yields each one's first token; not counted): step k of 1..``steps`` reads ``weights`` and every
    sequence's KV cache over prompt_tokens + k tokens (``decode_step_bytes``), prompt_tokens + (steps + 1) / 2 on
    average. docs/scaling.md#step-time-and-mfu."""
    return steps * decode_step_bytes(weights, batch, prompt_tokens + (steps + 1) / 2, kv_per_token)


def bw_fraction(nbytes: float, seconds: float, bytes_per_s: float) -> float:
    """The fraction of a memory bandwidth of ``bytes_per_s`` that reading ``nbytes`` in ``seconds`` achieves."""
    if seconds <= 0 or bytes_per_s <= 0:
        raise ValueError(f"bandwidth fraction of {nbytes:g} bytes in {seconds:g} s at {bytes_per_s:g} B/s: "
                         f"both must be > 0")
    return nbytes / seconds / bytes_per_s


def decode_bw_key(engine: str) -> str:
    """The calibration key of ``engine``'s (``rollout.engine``: hf | vllm) decode bandwidth fraction."""
    return f"{engine}_decode_bw_fraction"


def generate_seconds(m: ModelMemory, sequences: int, kv: float, chip: Chip, cal: dict) -> float:
    """Model ``m``'s engine generating ``sequences`` rollouts at full length: the prompts' prefill
    (``forward_flops`` with ``attention_flops`` over the prompt) at ``update_hfu`` of ``peak_flops``, then waves of
    ``decode_batch`` sequences (the last one what is left), ``response_tokens`` - 1 decode steps each
    (``decode_bytes``: the weights in the engine's dtype, ``decode_weight_bytes``; the HF engine decodes with the
    training model in its compute dtype) at its engine's ``decode_bw_key`` fraction of the memory bandwidth; a
    sequence's mean context for the batch: its prompt and half its response."""
    dtype = m.engine_dtype_bytes if m.vllm else compute_bytes(m.precision, m.low)
    weights = decode_weight_bytes(m.arch, dtype)
    context = m.prompt_tokens + m.response_tokens / 2
    batch = decode_batch(kv, context, m.kv_per_token, m.max_num_seqs if m.vllm else m.gen_batch_size, sequences)
    full, rest = divmod(sequences, batch)
    steps = max(0, m.response_tokens - 1)
    read = sum(waves * decode_bytes(weights, b, m.prompt_tokens, steps, m.kv_per_token)
               for b, waves in ((batch, full), (rest, 1)) if b and waves)
    decode = read / (chip.hbm_bytes_per_s * cal[decode_bw_key(m.engine)])
    prefill = forward_flops(m.params, sequences * m.prompt_tokens, attention_flops(m.arch, m.prompt_tokens))
    return compute_seconds(prefill, peak_flops(chip, cal), cal["update_hfu"]) + decode


def model_seconds(m: ModelMemory, ranks: int, kv: float, chip: Chip, cal: dict) -> dict:
    """Seconds of each phase of model ``m``'s full-size step on ``ranks`` ranks (each with its share of the
    rollouts and of the update's tokens, every rollout at full length): ``generate_seconds``; the theta_old pass
    (``forward_flops``) and the update (``train_flops`` over ``optim.epochs``, the recompute counted), both with
    ``attention_flops`` over a whole sequence, at ``update_hfu`` of ``peak_flops``; the weight sync, the engine's
    weights out of the GPU and back in through host memory at ``PCIE_BYTES_PER_S``.
    docs/scaling.md#step-time-and-mfu."""
    tokens = m.sequences * m.seq_len / ranks
    peak, hfu, attention = peak_flops(chip, cal), cal["update_hfu"], attention_flops(m.arch, m.seq_len)
    return {"generate": generate_seconds(m, math.ceil(m.sequences / ranks), kv, chip, cal),
            "logprob": compute_seconds(forward_flops(m.params, tokens, attention), peak, hfu),
            "update": compute_seconds(train_flops(m.params, tokens * m.epochs, m.checkpointing, attention=attention),
                                      peak, hfu),
            "sync": 2.0 * m.engine_weights / PCIE_BYTES_PER_S}


def transfer_seconds(nbytes: float) -> float:
    """``nbytes`` over PCIe at ``PCIE_BYTES_PER_S``."""
    return nbytes / PCIE_BYTES_PER_S


def step_seconds(per_model: dict, together: bool, moved: float = 0.0) -> float:
    """A step's seconds from each model's phase seconds: the models one after the other on shared GPUs (their sum),
    or ``together`` on GPUs of their own (the slowest), plus ``moved`` bytes over PCIe."""
    totals = [sum(t.values()) for t in per_model.values()]
    return (max(totals) if together else sum(totals)) + transfer_seconds(moved)


# ------------------------------------------------------------------------------------------------
# the layouts of a run
# ------------------------------------------------------------------------------------------------

PART_NAMES = {"weights": "weights", "adamw_moments": "AdamW moments", "grads": "grads", "ref_weights": "KL reference",
              "working_copy": "bf16 working copy", "activations": "activations", "engine_weights": "engine weights",
              "kv_cache": "KV cache", "engine_workspace": "engine workspace", "sync_buffer": "sync buffer"}


def describe_parts(parts: dict) -> str:
    """``weights 11.46 + grads 11.46 + ...`` (GiB) of a parts dict in bytes, its non-zero parts."""
    return " + ".join(f"{PART_NAMES[k]} {v / GIB:.2f}" for k, v in parts.items() if v > 0)


def kv_of(m: ModelMemory, gpu_gb: float) -> float:
    """The KV cache of model ``m``'s engine on a GPU of its own group: ``kv_cache_gb``, else the GPU share."""
    return m.kv_cache if m.kv_cache is not None else kv_share_bytes(m, gpu_gb)


def need_bytes(m: ModelMemory, ranks: int, gpu_gb: float) -> float:
    """Model ``m``'s per-GPU peak (the largest phase) over ``ranks`` ranks of its own."""
    return peak_of(group_phases(m, ranks, kv_of(m, gpu_gb)))[1]


def min_ranks(m: ModelMemory, usable: float, limit: int, gpu_gb: float) -> int | None:
    """The fewest ranks (at most ``limit``) over which model ``m`` fits ``usable`` bytes per GPU, else None."""
    return next((g for g in range(1, limit + 1) if need_bytes(m, g, gpu_gb) <= usable), None)


def phases_gb(phases: dict) -> dict:
    """``{phase: {"peak_gb", "during", "parts"}}`` in GiB."""
    return {p: {"peak_gb": sum(v["parts"].values()) / GIB, "during": v["during"], "parts": gib(v["parts"])}
            for p, v in phases.items()}


def group_entry(m: ModelMemory, ranks: list, prompts: int, explicit: bool, phases: dict) -> dict:
    """One model's group in a layout: its ranks, the engine on each, the prompts each rank generates (a vLLM engine
    its share, the HF engine all of them), and the peak of each phase of its GPUs while the model runs it (GiB),
    with the parts of the largest."""
    k = len(ranks) if m.vllm else 1  # the HF engine runs the whole request on every rank, in lockstep
    top, peak = peak_of(phases)
    return {"model": m.model, "params": m.params, "ranks": ranks, "num_workers": len(ranks),
            "num_workers_from_config": explicit, "precision": m.precision,
            "state_dtype": "fp32" if state_per_param(m.precision, m.low)[0] == 4 else "bf16",
            "engine_per_rank": m.engine if m.decodes else None, "engine_sleeps": engine_sleeps(m, len(ranks)),
            "engine_generates_in_update": generates_in_update(m, len(ranks)),
            "ahead_host_gb": ahead_host_bytes(m) / GIB,
            "prompts_per_rank": sorted({prompts // k, -(-prompts // k)}),
            "kv_all_per_rank_gb": m.kv_all / len(ranks) / GIB,
            "phases_gb": {p: v / GIB for p, v in phase_peaks(phases).items()}, "peak_phase": top,
            "per_gpu_peak_gb": peak / GIB, "parts": gib(phases[top]["parts"])}


def gpu_rows(groups: list, phases_by_rank: dict, gpus: int) -> list:
    """Per GPU of the node: the models whose ranks it holds, its phases and its peak (GiB)."""
    out = []
    for r in range(gpus):
        ph = phases_by_rank.get(r)
        top, peak = peak_of(ph) if ph else (None, 0.0)
        out.append({"rank": r, "models": [g["model"] for g in groups if r in g["ranks"]],
                    "phases": phases_gb(ph) if ph else {}, "peak_phase": top, "peak_gb": peak / GIB})
    return out


def split_gpus(params: list, minimum: list, total: int) -> list:
    """``total`` GPUs in proportion to ``params``, each model at least its ``minimum``: from the minima, each
    further GPU goes to the model furthest below its proportional share (the first one on a tie)."""
    gpus = list(minimum)
    for _ in range(total - sum(gpus)):
        short = [total * p / sum(params) - g for p, g in zip(params, gpus)]
        gpus[short.index(max(short))] += 1
    return gpus


def separate_split(models: list, workers: list, gpus: int, usable: float, gpu_gb: float) -> tuple:
    """Ranks per model for groups on GPUs of their own: the given ``workers`` (None: to choose), the GPUs they
    leave split by ``split_gpus``; (None, the reason) where no such split fits."""
    if len(models) > gpus:
        return None, f"{len(models)} models need at least {len(models)} GPUs for groups of their own"
    fixed = sum(w for w in workers if w)
    free = [i for i, w in enumerate(workers) if not w]
    if fixed + len(free) > gpus:
        return None, f"num_workers from the config take {fixed} GPUs, the other models need {len(free)}: > {gpus}"
    for m, w in zip(models, workers):
        if w and need_bytes(m, w, gpu_gb) > usable:
            return None, (f"{m.model} needs {need_bytes(m, w, gpu_gb) / GIB:.1f} GiB per GPU over its {w} rank(s) "
                          f"(num_workers)")
    left = gpus - fixed
    most = left - len(free) + 1  # the others keep at least one GPU each
    least = [min_ranks(models[i], usable, most, gpu_gb) for i in free]
    for i, g in zip(free, least):
        if g is None:
            return None, (f"{models[i].model} needs {need_bytes(models[i], most, gpu_gb) / GIB:.1f} GiB per GPU even "
                          f"over {most} rank(s)")
    if sum(least) > left:
        needs = " and ".join(f"{models[i].model} at least {g}" for i, g in zip(free, least))
        return None, f"{needs} GPUs: {sum(least)} > {left}"
    out = list(workers)
    for i, g in zip(free, split_gpus([models[i].params for i in free], least, left) if free else []):
        out[i] = g
    return out, ""


def separate(models: list, split: list, workers: list, prompts: int, usable: float, gpus: int,
             gpu_gb: float) -> dict:
    """The groups of a separate layout, on consecutive ranks in pair order, and why their sizes."""
    groups, by_rank, start = [], {}, 0
    for m, w, given in zip(models, split, workers):
        ph = group_phases(m, w, kv_of(m, gpu_gb))
        groups.append(group_entry(m, list(range(start, start + w)), prompts, bool(given), ph))
        by_rank.update({r: ph for r in range(start, start + w)})
        start += w
    sizes = ", ".join(f"{m.model} {w} " + ("(num_workers from the config)" if given else
                                           f"({m.params / 1e9:.3f} B parameters, needs "
                                           f"{min_ranks(m, usable, w, gpu_gb)})")
                      for m, w, given in zip(models, split, workers))
    why = ("each model on GPUs of its own (none shared: the models generate and update at once), the GPUs the "
           f"config leaves open split in proportion to the parameters, each model at least the GPUs it needs: {sizes}")
    return {"layout": "separate", "why": why, "placement": groups, "per_gpu": gpu_rows(groups, by_rank, gpus),
            "fits": True, "error": None}


def colocated(models: list, workers: list, gpus: int, prompts: int, usable: float, gpu_gb: float, why: str) -> dict:
    """Every model on ranks 0.. (its num_workers, else all ``gpus``), a GPU holding every model's parts of the same
    phase at once (``colocated_phases``); ``error`` names the fullest GPU's phase and models where it exceeds
    ``usable``."""
    over = [(m.model, w) for m, w in zip(models, workers) if w and w > gpus]
    if over:
        return {"layout": "colocated", "why": why, "placement": [], "per_gpu": [], "fits": False,
                "error": f"{over[0][0]}: num_workers {over[0][1]} > {gpus} GPUs"}
    ranks = [list(range(w or gpus)) for w in workers]
    by_rank = {}
    for r in range(gpus):
        here = [(m, len(rk)) for m, rk in zip(models, ranks) if r in rk]
        if here:
            by_rank[r] = colocated_phases([m for m, _ in here], [k for _, k in here],
                                          [kv_of(m, gpu_gb) for m, _ in here])
    groups = [group_entry(m, rk, prompts, bool(w), by_rank[rk[0]]) for m, rk, w in zip(models, ranks, workers)]
    rows = gpu_rows(groups, by_rank, gpus)
    top = max(rows, key=lambda r: r["peak_gb"])
    out = {"layout": "colocated", "why": why, "placement": groups, "per_gpu": rows,
           "fits": top["peak_gb"] * GIB <= usable, "error": None}
    if not out["fits"]:
        ph = by_rank[top["rank"]][top["peak_phase"]]["parts"]
        out["error"] = (f"colocated: {' and '.join(top['models'])} together need {top['peak_gb']:.1f} GiB on GPU "
                        f"{top['rank']} in their {top['peak_phase']} phase ({describe_parts(ph)})")
    return out


def margin_bytes(gpu_gb: float) -> float:
    """The room the plan keeps free below ``usable`` on a GPU of ``gpu_gb`` GiB where it can (``MARGIN``)."""
    return gpu_gb * MARGIN * GIB


def one_gpu_try(models: list, layout: str, level: int, usable: float, together: bool, margin: float) -> dict:
    """The one-GPU ``layout`` at sleep level ``level``: the KV cache per engine (``kv_cache_gb``, else the largest
    that leaves ``margin`` free below ``usable``: ``largest_kv``; where that is less than ``kv_min_bytes``, the
    largest that fits ``usable`` at all) and the phases with it."""
    ms = [dataclasses.replace(m, sleep_level=level) if m.vllm else m for m in models]
    resident = layout == "resident"
    given = next((m.kv_cache for m in ms if m.vllm and m.kv_cache is not None), None)
    engines = any(m.vllm for m in ms)
    if not engines:
        kv = 0.0
    elif given is not None:
        kv = given
    else:
        def phases_of(k):
            return shared_phases(ms, k, resident, together)
        kv = largest_kv(phases_of, usable - margin)
        if kv < max(kv_min_bytes(m) for m in ms if m.vllm):
            kv = largest_kv(phases_of, usable)
        kv = max(0.0, kv)
    return {"models": ms, "level": level, "kv": kv, "sized": engines and given is None,
            "phases": shared_phases(ms, kv, resident, together)}


def one_gpu_layout(cfg: RunConfig, models: list, layout: str, gpu_gb: float) -> dict:
    """Two or more models on one GPU in one process (``LAYOUTS_ONE_GPU``; module docstring). The sleep level is the
    config's, or 2 where the config's is 0 and sleeping leaves the engines a larger KV cache (or makes the layout
    fit); the KV cache per engine is ``rollout.vllm.kv_cache_gb`` where given, else sized by the plan: the largest
    every phase leaves room for with ``margin_bytes`` to spare. It must hold ``kv_min_bytes``. ``tight``: it fits
    with less than the margin to spare (``slack_gb``). In ``resident`` with ``rollout.max_staleness`` >= 1 the engines
    generate the batches ahead during the updates (``ahead_overlap`` on a shared GPU), awake whatever their sleep
    level."""
    usable, margin = gpu_gb * USABLE * GIB, margin_bytes(gpu_gb)
    overlap = layout == "resident" and ahead_overlap(cfg, shared_gpu=True)
    models = [dataclasses.replace(m, overlap=overlap) for m in models]
    together = (layout == "resident" and all(m.vllm for m in models) and bool(cfg.ray.concurrent_models))
    level0 = int(cfg.rollout.vllm.sleep_level)
    tries = [one_gpu_try(models, layout, level0, usable, together, margin)]
    if level0 == 0 and any(m.vllm for m in models) and not overlap:  # an engine generating ahead never sleeps
        tries.append(one_gpu_try(models, layout, 2, usable, together, margin))

    def room(t):
        return usable - peak_of(t["phases"])[1]

    best = max(tries, key=lambda t: (room(t) >= 0, room(t) >= margin, t["kv"] if t["sized"] else 0.0, room(t),
                                     t is tries[0]))
    ms, kv, phases = best["models"], best["kv"], best["phases"]
    kv_min = max((kv_min_bytes(m) for m in ms if m.vllm), default=0.0)
    top, peak = peak_of(phases)
    error = None
    if peak > usable:
        error = (f"the {top} phase of {phases[top]['during']} needs {peak / GIB:.1f} GiB "
                 f"({describe_parts(phases[top]['parts'])}) of {usable / GIB:.1f}")
    elif kv < kv_min:
        error = (f"the GPU leaves {kv / GIB:.2f} GiB of KV cache per engine, less than one sequence of "
                 f"{max(m.seq_len for m in ms)} tokens needs ({kv_min / GIB:.2f} GiB)")
    moved = (offload_bytes_per_step(ms) if layout == "offload" else 0.0) + sleep_bytes_per_step(ms)
    groups = []
    for m in ms:  # the GPU during each of this model's phases
        own = {p: {"during": m.model, "parts": (phases[p]["parts"] if phases[p]["during"] == "all" else add(
            phase_parts(m, p, 1, kv), *(idle_parts(o, kv, layout == "resident", p) for o in ms if o is not m)))}
            for p in PHASES}
        groups.append(group_entry(m, [0], int(cfg.task.prompts_per_step), False, own))
    return {"layout": layout, "fits": error is None, "error": error, "placement": groups,
            "per_gpu": gpu_rows(groups, {0: phases}, 1), "kv_cache_gb": kv / GIB, "kv_sized_by_plan": best["sized"],
            "kv_min_gb": kv_min / GIB, "kv_from_share_gb": sum(kv_share_bytes(m, gpu_gb) for m in ms if m.vllm) / GIB,
            "sleep_level": best["level"], "sleep_level_from_config": best["level"] == level0,
            "phase_1_together": together, "engines_generate_in_update": overlap,
            "moved_gb_per_step": moved / GIB, "transfer_s": transfer_seconds(moved),
            "host_gb": host_bytes_one_gpu(ms, layout) / GIB, "slack_gb": (usable - peak) / GIB,
            "margin_gb": margin / GIB, "tight": error is None and usable - peak < margin, "models": ms}


def tight_text(t: dict) -> str:
    """How little a ``tight`` one-GPU layout ``t`` leaves free, against the margin."""
    return (f"its peak leaves {t['slack_gb']:.2f} GiB of the GPU's usable memory free, less than the "
            f"{t['margin_gb']:.1f} GiB margin ({MARGIN:.0%} of the GPU) kept for the allocator's fragmentation")


def one_gpu_why(chosen: dict, other: dict | None) -> str:
    """Why ``chosen`` (a ``one_gpu_layout``) over ``other``; a ``tight`` layout says how little it leaves free."""
    if chosen["layout"] == "resident":
        sleep = (f"each engine frees its KV cache and weights during its model's update (sleep level "
                 f"{chosen['sleep_level']})" if chosen["sleep_level"] else "the engines stay awake (sleep level 0)")
        if chosen["engines_generate_in_update"]:
            sleep = "the engines stay awake during the updates, generating the next batches (rollout.max_staleness)"
        fit = "chosen where it fits with the margin to spare"
        if chosen["tight"]:
            fit = ("it fits only within the margin, offload " + ("only within it too" if other and other["fits"]
                                                                else "not at all") + f": {tight_text(chosen)}")
        return (f"every model's training state stays on the GPU, nothing moved between host and GPU per step ({fit});"
                f" {sleep}" + (f"; offload would move {other['moved_gb_per_step']:.0f} GiB per step "
                               f"(~{other['transfer_s']:.0f} s at {PCIE_BYTES_PER_S / 1e9:g} GB/s)"
                               if other and other["fits"] else ""))
    if other and other["tight"]:
        head = f"resident fits only within the margin, the safer offload chosen: {tight_text(other)}; "
    else:
        head = f"resident does not fit ({other['error']}); " if other else ""
    return (head + f"one model's training state on the GPU at a time, the others' in host memory (pinned buffers "
                   f"{chosen['host_gb']:.1f} GiB): {chosen['moved_gb_per_step']:.0f} GiB moved per step, "
                   f"~{chosen['transfer_s']:.0f} s at {PCIE_BYTES_PER_S / 1e9:g} GB/s"
            + (f"; it fits only within the margin: {tight_text(chosen)}" if chosen["tight"] else ""))


def ray_settings(groups: list, gpus_per_worker: float) -> dict:
    """The config keys that run a separate or colocated layout with ``--backend ray``."""
    out = {"run.backend": "ray", "run.device": "cuda", "ray.gpus_per_worker": gpus_per_worker}
    out.update({f"pair.models[{g['model']}].num_workers": g["num_workers"] for g in groups})
    return out


def one_gpu_settings(p: dict) -> dict:
    """The config keys that run a one-GPU layout: in-process, ``run.layout``, and the engines' KV cache and sleep
    level as planned."""
    out = {"run.backend": "inprocess", "run.device": "cuda", "run.layout": p["layout"]}
    if any(m.vllm for m in p["models"]):
        out["rollout.vllm.kv_cache_gb"] = round(p["kv_cache_gb"], 1)
        out["rollout.vllm.sleep_level"] = p["sleep_level"]
    return out


def layout_seconds(p: dict, models: list, chip: Chip, cal: dict, kvs: list) -> dict:
    """The step-time estimate of layout ``p`` (``model_seconds`` per model on its ranks, ``step_seconds``)."""
    ranks = {g["model"]: g["num_workers"] for g in p["placement"]}
    per = {m.model: model_seconds(m, ranks[m.model], kv, chip, cal) for m, kv in zip(models, kvs)}
    moved = p.get("moved_gb_per_step", 0.0) * GIB
    return {"per_model_s": per, "transfer_s": transfer_seconds(moved),
            "step_s": step_seconds(per, together=p["layout"] == "separate", moved=moved)}


def one_gpu_choice(cfg: RunConfig, models: list, gpu_gb: float, chip: Chip, cal: dict) -> dict:
    """``gpu_layout`` for two or more models on one GPU: ``run.layout`` where the config gives one, else
    ``resident`` where it fits with ``margin_bytes`` to spare (it moves nothing per step), else ``offload`` where
    it does, else the first that fits at all (``tight``); the other layout's figures under ``alternatives``."""
    asked = [cfg.run.layout] if cfg.run.layout in LAYOUTS_ONE_GPU else list(LAYOUTS_ONE_GPU)
    tries = {lay: one_gpu_layout(cfg, models, lay, gpu_gb) for lay in asked}
    for t in tries.values():
        t["step_time"] = layout_seconds(t, t["models"], chip, cal, [t["kv_cache_gb"] * GIB] * len(models))
    chosen = next((tries[lay] for lay in asked if tries[lay]["fits"] and not tries[lay]["tight"]),
                  next((tries[lay] for lay in asked if tries[lay]["fits"]), tries[asked[-1]]))
    other = next((t for t in tries.values() if t is not chosen), None)
    out = {k: v for k, v in chosen.items() if k != "models"}
    out["why"] = f"run.layout {cfg.run.layout} in the config" if len(asked) == 1 else one_gpu_why(chosen, other)
    out["settings"] = one_gpu_settings(chosen) if chosen["fits"] else {}
    out["alternatives"] = {lay: {k: t[k] for k in ("fits", "tight", "slack_gb", "error", "kv_cache_gb", "sleep_level",
                                                   "engines_generate_in_update", "moved_gb_per_step", "host_gb",
                                                   "step_time")}
                           for lay, t in tries.items() if t is not chosen}
    if not chosen["fits"]:
        out["error"] = (f"no layout of {cfg.pair.name} fits 1 x {gpu_gb:g} GiB GPU, {gpu_gb * USABLE:.1f} GiB "
                        f"available ({USABLE:.0%}): " + "; ".join(f"{lay}: {t['error']}" for lay, t in tries.items()))
    return out


def gpu_layout(cfg: RunConfig, gpus: int, gpu_gb: float, chip: str = "h200", calibration: dict | None = None) -> dict:
    """Where each trained model of ``cfg`` goes on a node of ``gpus`` GPUs of ``gpu_gb`` GiB, with the peak of each
    phase per model and per GPU (GiB) and a step-time estimate on ``chip`` (``CHIPS``; ``calibration``:
    ``calibration_of``'s keys).

    Two or more models on one GPU: the one-GPU layouts (``one_gpu_layout``), ``run.layout`` where the config gives
    one, else ``resident`` where it fits with ``margin_bytes`` to spare (it moves nothing per step), else
    ``offload``. On more GPUs (or one
    model): ``pair.models[i].num_workers`` (or ``ray.num_workers`` above 1) fix a model's ranks; with
    ``ray.gpus_per_worker`` 1 the models get groups on GPUs of their own (``separate``), the GPUs the config leaves
    open split in proportion to the models' parameters, each at least the GPUs it needs; where no such split fits (or
    ``ray.gpus_per_worker`` < 1 asks for shared GPUs) they are ``colocated`` on ranks 0.. of every GPU. A GPU may use
    ``USABLE`` of its memory.

    Returns ``layout``, ``why``, ``placement`` (per model: ranks, ``phases_gb``, ``per_gpu_peak_gb``, ``parts``),
    ``per_gpu`` (per GPU: ``phases`` with their parts, ``peak_gb``), ``fits``, ``error`` (what does not fit, by how
    much), ``settings`` (the config keys that run it), ``step_time`` and, for the one-GPU layouts, ``kv_cache_gb``,
    ``sleep_level``, ``moved_gb_per_step``, ``host_gb`` and ``alternatives`` (the other layout's figures)."""
    gpw = cfg.ray.gpus_per_worker
    if gpw > 1:
        raise ConfigError(f"config key 'ray.gpus_per_worker' ({gpw:g}): graftzoo plan places one rank per GPU (1) "
                          f"or ranks sharing GPUs (< 1)")
    if chip not in CHIPS:
        raise ConfigError(f"chip {chip!r}: graftzoo plan knows {', '.join(CHIPS)}")
    usable = gpu_gb * USABLE * GIB
    models = model_memory(cfg)
    cal, hw = calibration_of(calibration), CHIPS[chip]
    prompts = int(cfg.task.prompts_per_step)
    head = {"pair": cfg.pair.name, "prompts": prompts, "gpus": gpus, "gpu_gb": gpu_gb, "usable_gb": usable / GIB,
            "chip": chip, "calibration": cal, "max_staleness": int(cfg.rollout.max_staleness),
            "ahead_host_gb": sum(ahead_host_bytes(m) for m in models) / GIB}
    apart = rollout_workers(cfg)
    if gpus == 1 and len(models) > 1 and not apart:
        return {**head, **one_gpu_choice(cfg, models, gpu_gb, hw, cal)}
    workers = [m.num_workers for m in models]
    train_gpus = gpus - apart * len(models)  # rollout workers apart: R GPUs of their own per model, the last ranks
    if train_gpus < 1:
        return {**head, "layout": "separate", "why": "", "placement": [], "per_gpu": [], "fits": False,
                "settings": {}, "error": f"no placement of {cfg.pair.name} fits {gpus} GPU(s): ray.rollout_workers "
                                         f"{apart} per model take {apart * len(models)} GPUs, none left to train"}
    split, why_not = (None, "") if gpw < 1 else separate_split(models, workers, train_gpus, usable, gpu_gb)
    if split is not None:
        out, share = separate(models, split, workers, prompts, usable, train_gpus, gpu_gb), 1
    else:
        why = "every model on ranks 0.. of the node, sharing the GPUs: " + (
            f"ray.gpus_per_worker {gpw:g} < 1 asks for shared GPUs" if gpw < 1 else
            f"separate groups do not fit ({why_not})")
        out = colocated(models, workers, train_gpus, prompts, usable, gpu_gb, why)
        share = min(gpw, 1 / max(1, len(models)))
    if apart:
        out = with_rollout_workers(out, models, apart, train_gpus, prompts, usable, gpu_gb)
    if not out["fits"]:
        out["error"] = (f"no placement of {cfg.pair.name} fits {gpus} x {gpu_gb:g} GiB GPU(s), "
                        f"{usable / GIB:.1f} GiB available per GPU ({USABLE:.0%}): "
                        + (f"separate groups: {why_not}; " if why_not else "") + out["error"])
    out["settings"] = ray_settings(out["placement"], round(share, 3)) if out["fits"] else {}
    if apart and out["fits"]:
        out["settings"]["ray.rollout_workers"] = apart
    if out["placement"]:
        kvs = [kv_of(m, gpu_gb) for m in models]
        out["step_time"] = (apart_seconds(out, models, apart, hw, cal, kvs) if apart else
                            layout_seconds(out, models, hw, cal, kvs))
    if apart:  # what the rollout workers change: the same node with the training ranks decoding
        alt = gpu_layout(with_values(cfg, {"ray.rollout_workers": 0}), gpus, gpu_gb, chip, calibration)
        out["without_rollout_workers"] = {"fits": alt["fits"], "layout": alt["layout"],
                                          "step_s": alt.get("step_time", {}).get("step_s")}
    return {**head, **out}


def with_rollout_workers(out: dict, models: list, per_model: int, start: int, prompts: int, usable: float,
                         gpu_gb: float) -> dict:
    """Layout ``out`` of the training groups (on ranks below ``start``) with each model's ``per_model`` rollout
    workers on GPUs of their own from rank ``start`` on (``rollout_worker_parts``, KV cache as on a GPU of its own:
    ``kv_of``); ``rollout_workers`` per model: ranks, engine, prompts each, parts and peak, the weights sent to each
    per step (GiB). A rollout worker over ``usable`` is an ``error``."""
    rows, per_gpu, rank = [], list(out["per_gpu"]), start
    for m in models:
        parts = rollout_worker_parts(m, kv_of(m, gpu_gb))
        peak, ranks = sum(parts.values()), list(range(rank, rank + per_model))
        rank += per_model
        rows.append({"model": m.model, "ranks": ranks, "engine": m.engine, "parts": gib(parts), "peak_gb": peak / GIB,
                     "prompts_per_worker": sorted({prompts // per_model, -(-prompts // per_model)}),
                     "sync_gb": apart_sync_bytes(m) / GIB})
        phase = {"generate": {"peak_gb": peak / GIB, "during": m.model, "parts": gib(parts)}}
        per_gpu += [{"rank": r, "models": [m.model], "phases": phase, "peak_phase": "generate", "peak_gb": peak / GIB}
                    for r in ranks]
        if peak > usable and out["fits"]:
            out = {**out, "fits": False, "error": f"a rollout worker of {m.model} needs {peak / GIB:.1f} GiB on its "
                                                  f"GPU ({describe_parts(parts)})"}
    return {**out, "rollout_workers": rows, "per_gpu": per_gpu}


def apart_seconds(p: dict, models: list, per_model: int, chip: Chip, cal: dict, kvs: list) -> dict:
    """The step-time estimate with rollout workers apart: each model's phases on its training ranks
    (``model_seconds``), its generation on its ``per_model`` rollout workers (each its share of the rollouts), its
    weight sync the whole weights out of a training GPU and into each rollout worker's through host memory
    (``PCIE_BYTES_PER_S``; the network between nodes not counted). With ``rollout.max_staleness`` >= 1 the next
    batch decodes during the update: a model's step is the longer of the two plus its other phases; the models run at
    once (the slowest)."""
    ranks = {g["model"]: g["num_workers"] for g in p["placement"]}
    per = {}
    for m, kv in zip(models, kvs):
        t = model_seconds(m, ranks[m.model], kv, chip, cal)
        t["generate"] = generate_seconds(m, math.ceil(m.sequences / per_model), kv, chip, cal)
        t["sync"] = 2.0 * apart_sync_bytes(m) / PCIE_BYTES_PER_S
        per[m.model] = t
    overlapped = {k: (max(t["generate"], t["update"]) + t["logprob"] + t["sync"] if m.staleness else sum(t.values()))
                  for (k, t), m in zip(per.items(), models)}
    return {"per_model_s": per, "transfer_s": 0.0, "step_s": max(overlapped.values()),
            "overlap": bool(models and models[0].staleness)}


def plan(cfg: RunConfig, gpu_gb: float = 80.0) -> list[dict]:
    """Per trained model, each on GPUs of its own: parameters, each memory part (GiB), the GPUs it needs and the
    peak of each phase on them."""
    usable = gpu_gb * USABLE * GIB
    out = []
    for m in model_memory(cfg):
        gpus = min_ranks(m, usable, 1024, gpu_gb)
        phases = group_phases(m, gpus or 1, kv_of(m, gpu_gb))
        other = dataclasses.replace(m, checkpointing=not m.checkpointing)
        out.append({"model": m.model, "params": m.params, "precision": m.precision, "checkpointing": m.checkpointing,
                    "micro_tokens": m.micro_tokens, "logit_tokens": m.logit_tokens,
                    "state_gib_1gpu": train_state_bytes(m.params, m.precision, 1, m.low) / GIB,
                    "activations_gib": update_bytes(m) / GIB, "activations_other_gib": update_bytes(other) / GIB,
                    "logprob_gib": forward_bytes(m) / GIB,
                    "engine_weights_gib": m.engine_weights / GIB, "kv_cache_gib": kv_of(m, gpu_gb) / GIB,
                    "kv_all_gib": m.kv_all / GIB, "engine_sleeps": engine_sleeps(m, gpus or 1),
                    "max_staleness": m.staleness, "engine_generates_in_update": generates_in_update(m, gpus or 1),
                    "ahead_host_gib": ahead_host_bytes(m) / GIB, "ref": m.ref, "gpus": gpus,
                    "phases_gib": {p: v / GIB for p, v in phase_peaks(phases).items()},
                    "peak_gib_per_gpu": None if gpus is None else peak_of(phases)[1] / GIB})
    return out


def host_peak_bytes(cfg: RunConfig) -> float:
    """What a run of ``cfg`` needs in host memory when it trains on the CPU (bytes): every trained model's training
    state (weights, gradients, AdamW moments, the KL reference), one update micro-batch (``update_activation_bytes``,
    or AdamW's ``foreach`` step where larger) and its rollout engine (vLLM: its weights and ``kv_cache_gb``; HF: a
    generate call's KV cache, ``hf_generate_bytes``) and its batches collected ahead (``ahead_host_bytes``), all at
    once: an upper bound, as the models update one after the other."""
    total = 0.0
    for m in model_memory(cfg):
        state = train_state_bytes(m.params, m.precision, 1, m.low) + (
            ref_bytes(m.params, m.precision, m.low, 1) if m.ref else 0.0)
        work = max(update_bytes(m) + working_copy_bytes(m.arch, m.precision, 1),
                   optimizer_step_bytes(m.params, "cpu"))
        engine = m.engine_weights + (m.kv_cache or 0.0) if m.vllm else hf_generate_bytes(m)
        total += state + work + engine + ahead_host_bytes(m)
    return total
