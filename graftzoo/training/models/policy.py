"""A policy: a Hugging Face causal LM, its tokenizer, its prompt template and its optimizer.

Sequences are laid out as [left-padded prompt | right-padded response] so that every row's
response occupies the last R columns; position ids are ``cumsum(mask) - 1`` (left padding), both
here and in generation, so training log-probs equal the behaviour log-probs of the HF engine.
With ``optim.packing`` the model instead sees a micro-batch's real tokens as one sequence (``pack_rows``), the
position ids restarting at 0 for each row, and the log-probs come back in the same ``[B, R]`` layout.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import weakref
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask, flex_attention_mask

from graftzoo.training.models import lora as lora_mod
from graftzoo.contract.batch import micro_split, pad_pairs
from graftzoo.contract.errors import NonFiniteError
from graftzoo.contract.types import Prompt
from graftzoo.training.models.fsdp import full_model_state, load_full, load_sharded, save_sharded
from graftzoo.training.models.loss import optimize
from graftzoo.envs.templates import render_prompt

log = logging.getLogger("graftzoo")


def context_of(model_config) -> int:
    """A model config's maximum sequence length (position embeddings); unbounded when it declares none."""
    return int(getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "n_positions", None)
               or 1 << 30)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: ``cumsum(mask) - 1``, 0 on the leading padded slots."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_len: int):
    """The padded ``[B, L]`` rows of a micro-batch (``pad_pairs``' layout) as one sequence of their real tokens:
    ``(ids [1, T], position_ids [1, T], keep [N], target [N], valid [B, resp_len])``. T is the number of real
    tokens, the rows in order; the position ids restart at 0 for each row (the same ``cumsum(mask) - 1`` as the
    padded path), from which transformers builds a block-diagonal causal mask when no attention mask is given.
    ``valid`` marks the response slots of the last ``resp_len`` columns that hold a real token after a real one;
    ``keep`` are the packed positions whose logits predict them and ``target`` those tokens, both in the row-major
    order of ``valid``."""
    real = attention_mask.bool()
    L = input_ids.shape[1]
    index = (real.flatten().long().cumsum(0) - 1).view_as(attention_mask)  # packed position of each real slot
    before = F.pad(real, (1, 0))[:, L - resp_len:L]  # the slot before each response column is real
    valid = real[:, L - resp_len:] & before
    keep = F.pad(index, (1, 0))[:, L - resp_len:L][valid]
    target = input_ids[:, L - resp_len:][valid]
    return input_ids[real][None], position_ids_from_mask(attention_mask)[real][None], keep, target, valid


def unpack(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` from the ``[N]`` per-token ``values`` of ``valid``'s slots (row-major), 0 elsewhere;
    differentiable in ``values``."""
    return values.new_zeros(valid.shape).masked_scatter(valid, values)


# The attention implementations (a model's ``config._attn_implementation``) that run a packed micro-batch without
# a dense [T, T] mask, so that packing saves the padding's work (docs/scaling.md#memory-bounded-updates). sdpa and
# eager are not among them: given restarting position ids and no attention mask, transformers builds them a dense
# block-diagonal mask (masking_utils.find_packed_sequence_indices), which rules out sdpa's flash kernel and costs
# attention over all T² positions of the packed sequence.
BLOCK_SKIPPING_ATTENTION = (
    "flash_attention_2",  # no mask built: the varlen kernel takes each row's bounds from its position ids
    "flash_attention_3",  # the same varlen path (FlashAttention 3, Hopper)
    "flash_attention_4",  # the same varlen path (FlashAttention 4, the CuTe kernels)
    "flex_attention",  # a BlockMask of the rows: the blocks wholly outside every row's causal triangle are skipped
)


def skips_masked_blocks(attn_implementation) -> bool:
    """Whether a model with this attention implementation runs packed rows without a dense mask: one of
    ``BLOCK_SKIPPING_ATTENTION``, or a hub kernel transformers masks as one of them (``kernels-community/flash-attn2``
    stands in for ``flash_attention_2`` where the flash_attn package is missing: the varlen path, no mask)."""
    if attn_implementation in BLOCK_SKIPPING_ATTENTION:
        return True
    if not isinstance(attn_implementation, str) or attn_implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        return False
    return ALL_MASK_ATTENTION_FUNCTIONS[attn_implementation] in (flash_attention_mask, flex_attention_mask)


def use_packing(setting, device: torch.device, attn_implementation) -> bool:
    """Whether ``optim.packing`` (``True | False | "auto"``) packs the micro-batches of a model on ``device`` whose
    attention implementation is ``attn_implementation`` (``attention_of``): true packs anywhere; auto packs on
    CUDA with an attention that skips the masked blocks (``skips_masked_blocks``) only, where packing saves work,
    so CPU runs and sdpa or eager models keep the padded forward."""
    if setting == "auto":
        return torch.device(device).type == "cuda" and skips_masked_blocks(attn_implementation)
    return setting is True


def attention_of(model) -> Optional[str]:
    """A model's attention implementation as transformers dispatches it (``config._attn_implementation``:
    ``sdpa``, ``eager``, ``flex_attention``, ``flash_attention_2``, ...); None for a model without a config. A
    LoRA (peft) or compiled wrapper answers with its model's config."""
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return attn if isinstance(attn, str) else None


def adamw_kwargs(device: torch.device) -> dict:
    """The AdamW implementation for parameters on ``device``: the fused kernel on CUDA, the multi-tensor
    (``foreach``) one elsewhere."""
    return {"fused": True} if torch.device(device).type == "cuda" else {"foreach": True}


@torch.no_grad()
def packing_fault(model) -> Optional[str]:
    """Why this model would not score packed rows apart (None when it does): the logits of a short row packed after
    another (position ids restarting at 0, no attention mask) must equal those of the row alone, in eval mode and
    the parameters' dtype, within 1e-4 of the logits' scale (2e-2 in 16 bits)."""
    device = next(model.parameters()).device
    vocab = int(model.get_input_embeddings().weight.shape[0])
    first, row = torch.arange(1, 9, device=device) % vocab, torch.arange(3, 8, device=device) % vocab
    pos = torch.cat([torch.arange(8, device=device), torch.arange(5, device=device)])[None]
    was = model.training
    model.eval()
    try:
        packed = model(input_ids=torch.cat([first, row])[None], position_ids=pos, use_cache=False).logits[0, 8:]
        alone = model(input_ids=row[None], position_ids=pos[:, 8:], use_cache=False).logits[0]
    except (TypeError, ValueError, RuntimeError) as e:
        return f"a packed forward fails ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    finally:
        model.train(was)
    err, scale = float((packed.double() - alone.double()).abs().max()), float(alone.double().abs().max())
    tol = 2e-2 if next(model.parameters()).dtype in (torch.float16, torch.bfloat16) else 1e-4
    if not err <= tol * (1.0 + scale):
        return f"a row packed after another scores differently from the row alone (max logit difference {err:.3g})"
    return None


LOGIT_CHUNK = 1 << 24  # logits entries (positions x vocabulary) turned into float32 at a time


def _chunks(logits: torch.Tensor):
    """(rows, positions) slices cutting ``[B, R, V]`` logits into views of at most ``LOGIT_CHUNK`` entries: whole
    rows together while they fit, else pieces of one row."""
    B, R, V = logits.shape
    rows = LOGIT_CHUNK // max(1, R * V)
    if rows >= 1:
        for b in range(0, B, rows):
            yield slice(b, b + rows), slice(0, R)
        return
    step = max(1, LOGIT_CHUNK // max(1, V))
    for b in range(B):
        for j in range(0, R, step):
            yield slice(b, b + 1), slice(j, j + step)


def _log_softmax(x: torch.Tensor, temperature: float) -> torch.Tensor:
    x = x.float()
    return F.log_softmax(x / temperature if temperature != 1.0 else x, dim=-1)


class _TokenLogProbs(torch.autograd.Function):
    """log_softmax(logits / T)[target], a piece at a time; keeps the logits (in their dtype) for the backward pass,
    which recomputes each piece's softmax: d logp / d logits = (onehot(target) - softmax) / T."""

    @staticmethod
    def forward(ctx, logits, target, temperature):
        out = torch.empty(target.shape, dtype=torch.float32, device=logits.device)
        for rows, pos in _chunks(logits):
            out[rows, pos] = _log_softmax(logits[rows, pos], temperature).gather(-1, target[rows, pos, None])[..., 0]
        ctx.save_for_backward(logits, target)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad):
        logits, target = ctx.saved_tensors
        out = torch.empty_like(logits)
        for rows, pos in _chunks(logits):
            g = grad[rows, pos, None]
            d = -_log_softmax(logits[rows, pos], ctx.temperature).exp() * g
            d.scatter_add_(-1, target[rows, pos, None], g)
            out[rows, pos] = (d / ctx.temperature if ctx.temperature != 1.0 else d).to(out.dtype)
        return out, None, None


def token_logprobs(logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[B, R]`` log-probs of ``target`` under softmax(``logits`` / T) (``[B, R, V]``, any float dtype), in float32,
    without a float32 copy of the whole vocabulary's log-probs: the values of ``log_softmax(...).gather(...)``."""
    return _TokenLogProbs.apply(logits, target, float(temperature))


def token_entropies(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[B, R]`` entropies of softmax(``logits`` / T), a piece at a time (differentiable when grad is on)."""
    pieces, row = [], []
    for rows, pos in _chunks(logits):
        ls = _log_softmax(logits[rows, pos], temperature)
        row.append(-(ls.exp() * ls).sum(-1))
        if pos.stop is None or pos.stop >= logits.shape[1]:  # a row slice is complete
            pieces.append(torch.cat(row, dim=1))
            row = []
    return torch.cat(pieces, dim=0)


class ComputeWeights:
    """The weights of ``model`` in the compute dtype while forward passes run (``Policy.compute_weights``).

    Under ``bf16-mixed`` the parameters are float32 master weights. Inside this context every float32 parameter's
    ``.data`` is a bfloat16 copy (the "working copy", 2 bytes per parameter, which the plan counts in every phase
    that runs a forward: graftzoo.training.planner.memory ``working_copy_bytes``), so the whole forward computes in
    bfloat16: the residual stream, the attention inputs, the KV cache and the logits, as FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bf16)`` computes a sharded model (graftzoo.training.models.fsdp). Autocast over the
    float32 weights would not: the residual stream, RoPE's keys and with them the KV cache stay float32, SDPA then
    has no bfloat16 kernel to pick for grouped-query attention, and autocast keeps a cached cast of every weight,
    also without gradients. Buffers (the rotary tables) keep their dtype.

    A gradient reaching a parameter in the copy's dtype is added to a float32 accumulator at once (a
    post-accumulate-grad hook), so the micro-batches of a minibatch sum their gradients in float32; on leaving, the
    master weights return (bit for bit: they are never written inside) with those float32 sums as their ``.grad``,
    ready for the optimizer step. Re-entrant and shared by threads: the copy is made by the first entry and undone
    by the last exit."""

    def __init__(self, model, dtype: torch.dtype):
        self.model, self.dtype = model, dtype
        self._lock = threading.Lock()
        self._depth = 0
        self._masters: list = []  # (parameter, its float32 master data)
        self._grads: dict = {}  # parameter -> float32 gradient accumulated inside the context
        self._hooks: list = []

    def _cast(self) -> None:
        for p in dict.fromkeys(self.model.parameters()):
            if p.dtype != torch.float32 or not p.is_floating_point():
                continue
            self._masters.append((p, p.data))
            if p.grad is not None:  # a gradient from before the context is carried on in float32
                self._grads[p], p.grad = p.grad, None
            p.data = p.data.to(self.dtype)
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._to_master))

    def _to_master(self, p) -> None:
        acc = self._grads.get(p)
        if acc is None:
            self._grads[p] = p.grad.float()
        else:
            acc.add_(p.grad)
        p.grad = None

    def _restore(self) -> None:
        for h in self._hooks:
            h.remove()
        for p, master in self._masters:
            if p.grad is not None and p.grad.dtype != master.dtype:  # a backward cut short before its hook ran
                self._to_master(p)
            p.data = master
            grad = self._grads.pop(p, None)
            if grad is not None:
                p.grad = grad
        self._masters, self._hooks, self._grads = [], [], {}

    @property
    def active(self) -> bool:
        return self._depth > 0

    def __enter__(self):
        with self._lock:
            if self._depth == 0:
                try:
                    self._cast()
                except BaseException:
                    self._restore()
                    raise
            self._depth += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._restore()
        return False


@lru_cache(maxsize=8)
def literal_backend(spec: str) -> Tokenizer:
    """A fast tokenizer's backend (its JSON ``spec``) without its added tokens, built once per process for each
    tokenizer (a real vocabulary takes seconds; every policy of a run, and its reference model, share it)."""
    data = json.loads(spec)
    data.update(added_tokens=[], truncation=None, padding=None)
    return Tokenizer.from_str(json.dumps(data))


class Policy:
    stop_strings: tuple = ()  # a rollout ends at the token that completes one (rollout.stop, graftzoo.training.planner.build)

    def __init__(self, model_id: str, model, tokenizer, template: str = "compact", optim=None,
                 temperature: float = 1.0, max_prompt_tokens: int = 2048, tokenizer_id: str | None = None):
        self.model_id = model_id
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.temperature = float(temperature)
        self.max_prompt_tokens = int(max_prompt_tokens)
        self.tokenizer_id = tokenizer_id or getattr(tokenizer, "name_or_path", "") or model_id
        self.version = 0
        # optim.precision bf16-mixed: parameters (master weights) in float32, forward computed in this dtype
        self.autocast_dtype: Optional[torch.dtype] = None
        self.max_tokens_per_micro: Optional[int] = None  # optim.max_tokens_per_micro: scoring passes stay within it
        self.packing = "auto"  # optim.packing: True | False | "auto" (use_packing)
        self._packing_fault: Optional[str] = None  # packing_fault of the model, "" once it held; None: unchecked
        self.optimizer = None
        self.scheduler = None
        self.grad_clip = None
        # a rank of a worker group whose parameters FSDP2 shards (graftzoo.training.models.fsdp): its state is saved and
        # loaded through torch.distributed.checkpoint, every pass over the model is a collective of the group
        self.sharded = False
        self._gathered = None  # (version, whole weights on rank 0) of a sharded policy, see full_state_dict
        self._home: Optional[torch.device] = None  # where the offloaded training state returns to (``offload``)
        self._guard = None  # the forward pre-hook that refuses a pass over an offloaded model
        self._host: dict = {}  # the host buffer of the training state and its views, kept between moves (``offload``)
        self._compute: Optional[ComputeWeights] = None  # forward passes in the compute dtype (``compute_weights``)
        self._literal = None  # the backend tokenizer without added tokens (``encode_literal``), built on first use
        if optim is not None:
            self.configure_optimizer(optim)

    # ---- optimizer -------------------------------------------------------------------------
    def configure_optimizer(self, optim):
        """AdamW (``adamw_kwargs``: fused on CUDA) and the warm-up schedule from an ``optim`` section
        (graftzoo.contract.config.OptimSection), and its ``packing`` setting."""
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=float(optim.lr),
            betas=tuple(optim.betas), eps=float(optim.eps), weight_decay=float(optim.weight_decay),
            **adamw_kwargs(self.device))
        self.packing = getattr(optim, "packing", self.packing)
        warm = int(optim.warmup_steps or 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)
        self.grad_clip = optim.grad_clip

    def apply_optim_settings(self, optim):
        """Make the run config's optimizer settings (lr, betas, eps, weight decay) current after a resume loaded the
        optimizer's state (which carries the old ones), and ``packing``; a no-op when they are unchanged."""
        self.packing = getattr(optim, "packing", self.packing)
        if self.optimizer is None:
            return
        lr = float(optim.lr)
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch) if self.scheduler else 1.0
        if self.scheduler is not None:
            self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)
        for g in self.optimizer.param_groups:
            if g.get("initial_lr") != lr:
                g["initial_lr"], g["lr"] = lr, lr * factor
            g["betas"] = tuple(float(b) for b in optim.betas)
            g["eps"] = float(optim.eps)
            g["weight_decay"] = float(optim.weight_decay)
        self.grad_clip = optim.grad_clip

    def step(self, loss: torch.Tensor, where: str = "") -> float:
        """One optimizer step on ``loss``; returns the pre-clip gradient norm. A non-finite loss or gradient norm
        raises ``NonFiniteError`` before the step is applied, non-finite parameters right after it (
        health guard); ``where`` names the step in the message."""
        self.zero_grad()
        return self.apply_gradients(self.accumulate(loss, where), where)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def accumulate(self, loss: torch.Tensor, where: str = "") -> float:
        """Add ``loss``'s gradient to the parameters' (one micro-batch of a minibatch, after ``zero_grad``);
        returns the loss value.
        A non-finite loss raises ``NonFiniteError`` before anything is added."""
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise NonFiniteError("loss", loss_value, where)
        loss.backward()
        return loss_value

    def apply_gradients(self, loss_value: float, where: str = "") -> float:
        """The optimizer step on the accumulated gradients (clipped at ``grad_clip``), then zeroed; returns the
        pre-clip gradient norm. ``loss_value``: the minibatch's loss, for the messages."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.grad_clip:
            norm = torch.nn.utils.clip_grad_norm_(params, float(self.grad_clip))
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.tensor(0.0)
        norm = _full(norm)  # a sharded model's norm is a DTensor: the group's total
        if not math.isfinite(float(norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError("gradient norm", float(norm), where, loss=loss_value)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # the gradients' memory is free until the next backward
        trained = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        finite = (torch.stack([torch.isfinite(_local(p)).all() for _, p in trained]) if trained
                  else torch.ones(0, dtype=bool))  # a sharded model: this rank's shards
        if not bool(finite.all()):  # one device sync per step; the names only when something is wrong
            bad = [n for (n, _), ok in zip(trained, finite.tolist()) if not ok]
            raise NonFiniteError(f"parameters after the optimizer step ({bad[0]}"
                                 f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})",
                                 float("nan"), where, loss=loss_value, grad_norm=float(norm))
        return float(norm)

    def update(self, ctx, learner, mbs: list, base_from_forward: bool, where: str) -> list:
        """Train on a step's minibatches, each given as its micro-batches, here, by the optimizer loop
        (``graftzoo.training.models.loss.optimize``); returns per minibatch its parts, one per process that trained it
        (here: one). A worker group's policy on the driver sends them to its ranks instead, each of which runs the
        same loop on its share."""
        return [[part] for part in optimize(ctx, self, learner, mbs, base_from_forward, where)]

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer else 0.0

    # ---- tokens ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The model's device (where an offloaded model's state returns to)."""
        return self._home if self._home is not None else next(self.model.parameters()).device

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype of the trained parameters (float32 master weights under ``bf16-mixed``)."""
        return next(self.model.parameters()).dtype

    @property
    def eos_id(self) -> int:
        """The primary EOS id (the tokenizer's): what padding and an appended EOS use."""
        return self.tokenizer.eos_token_id

    @property
    def eos_ids(self) -> list:
        """Every id that ends a response: the tokenizer's EOS first, then each of the model's
        ``generation_config.eos_token_id`` (an int or a list; Qwen3 and SmolLM3 list several), without repeats."""
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        extra = [extra] if isinstance(extra, int) else list(extra or [])
        return [int(i) for i in dict.fromkeys([self.eos_id, *extra]) if i is not None]

    @property
    def pad_id(self) -> int:
        pid = self.tokenizer.pad_token_id
        return self.eos_id if pid is None else pid

    def render(self, prompt: Prompt) -> str:
        return render_prompt(prompt.text, self.template, self.tokenizer)

    def encode_prompt(self, prompt: Prompt) -> list:
        """The prompt rendered with this policy's template, every token of it: a prompt is never cut (one over
        ``max_prompt_tokens`` is dropped before it reaches an engine, which refuses it)."""
        return self.tokenizer.encode(self.render(prompt), add_special_tokens=False)

    def encode_text(self, text: str) -> list:
        """This model's own text (its prompts, its responses' texts): the tokenizer's encoding, an added token's
        string matched as that token. A peer's text is encoded with ``encode_literal`` instead."""
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def encode_literal(self, text: str) -> list:
        """``text`` taken literally: no added token (special or not) is matched, so a peer response that writes
        ``<|endoftext|>`` or ``<think>`` as text gets the ordinary tokens that spell it, never an added id or an EOS
        (docs/algorithms.md#exchange-rules-for-real-vocabularies). A fast tokenizer's backend is rebuilt from its
        JSON with its ``added_tokens`` emptied (normalizer, pre-tokenizer and model unchanged), once per policy;
        ``decode`` of the ids gives the text back wherever the vocabulary can spell it. A tokenizer without a
        backend splits its special tokens only (``split_special_tokens``)."""
        if not text:
            return []
        enc = self._literal_encoding(text)
        if enc is None:
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        return enc.ids

    def _literal_encoding(self, text: str):
        """The literal backend's ``Encoding`` of ``text`` (ids and offsets; ``encode_literal``), or None for a
        tokenizer without a backend."""
        if self._literal is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is None:
                return None
            self._literal = literal_backend(backend.to_str())
        return self._literal.encode(text, add_special_tokens=False)

    @property
    def added_ids(self) -> frozenset:
        """The ids of the tokenizer's added tokens, special or not (EOS, pad, ``<think>``, ...)."""
        tok = self.tokenizer
        return frozenset(int(i) for i in getattr(tok, "added_tokens_decoder", {})) | frozenset(tok.all_special_ids)

    def normalize_text(self, text: str) -> str:
        """``text`` as the tokenizer's normalizer sees it (Qwen3: NFC); itself when the tokenizer has none."""
        norm = getattr(getattr(self.tokenizer, "backend_tokenizer", None), "normalizer", None)
        return norm.normalize_str(text) if norm is not None else text

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # ---- scoring ---------------------------------------------------------------------------
    def compute_weights(self):
        """A context in which forward passes compute in the policy's compute dtype (``ComputeWeights``: the
        float32 master weights of ``bf16-mixed`` as a bfloat16 working copy; gradients summed in float32 onto the
        masters). A no-op in other precisions and for a sharded model, whose FSDP2 gathers already compute in it.
        Generation, the theta_old, reference and embedding passes and each minibatch of the update run inside one."""
        if self.autocast_dtype is None or self.sharded:
            return contextlib.nullcontext()
        if self._compute is None or self._compute.model is not self.model:
            self._compute = ComputeWeights(self.model, self.autocast_dtype)
        return self._compute

    def packs(self) -> bool:
        """Whether ``logprobs`` packs its rows (``use_packing`` of ``optim.packing``, the model's device and its
        attention, ``attention_of``), and the model scores packed rows apart (``packing_fault``, checked once;
        else one warning and the padded path). ``optim.packing: true`` on CUDA under an attention that masks the
        packed rows densely (sdpa, eager) packs, with one warning (docs/scaling.md#memory-bounded-updates)."""
        attn = attention_of(self.model)
        if not use_packing(self.packing, self.device, attn):
            return False
        if self._packing_fault is None:
            if self.device.type == "cuda" and not skips_masked_blocks(attn):
                log.warning("model %r: optim.packing is true but its attention (%s) masks the packed rows densely: "
                            "model.attn_implementation flex_attention or flash_attention_2 skips the masked blocks "
                            "(docs/scaling.md#memory-bounded-updates)", self.model_id, attn)
            self._packing_fault = packing_fault(self.model) or ""
            if self._packing_fault:
                log.warning("model %r: optim.packing falls back to padded micro-batches: %s", self.model_id,
                            self._packing_fault)
        return not self._packing_fault

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_len: int,
                 with_entropy: bool = False, entropy_grad: bool = True):
        """Per-token log-probs (and entropies) of the last ``resp_len`` tokens of each row.

        The logits are divided by the sampling temperature, exactly as the engine does when it
        records behaviour log-probs (docs/algorithms.md#notation-and-conventions). Only the sampled tokens' log-probs are kept for the
        backward pass (``token_logprobs``), not a float32 log-softmax of the whole vocabulary; the entropies carry
        a gradient only with ``entropy_grad`` (an entropy bonus in the loss), else they are computed without one.
        When ``packs()``, the model runs on the rows' real tokens as one sequence (``pack_rows``), keeps only the
        logits that predict response tokens, and the values come back in the ``[B, resp_len]`` layout, 0 on
        padding (``unpack``).
        """
        weights = self.compute_weights()
        if (torch.is_grad_enabled() and isinstance(weights, ComputeWeights) and not weights.active
                and any(p.requires_grad for p in self.model.parameters())):
            raise RuntimeError(f"model {self.model_id!r}: a forward with gradients under bf16-mixed runs inside "
                               f"Policy.compute_weights(), which sums the gradients onto the float32 master weights "
                               f"(graftzoo.training.models.loss.optimize enters it for each minibatch)")
        with weights:
            return self._logprobs(input_ids, attention_mask, resp_len, with_entropy, entropy_grad)

    def _logprobs(self, input_ids, attention_mask, resp_len, with_entropy, entropy_grad):
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        packed = self.packs()
        if packed:
            ids, pos, keep, target, valid = pack_rows(input_ids, attention_mask, resp_len)
            args = dict(input_ids=ids, position_ids=pos, logits_to_keep=keep)
        else:
            args = dict(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids_from_mask(attention_mask), logits_to_keep=resp_len + 1)
        with torch.autocast(input_ids.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                            enabled=self.autocast_dtype is not None):
            out = self.model(**args, use_cache=False)
        if packed:
            logits, target = out.logits, target[None]
        else:
            logits, target = out.logits[:, -resp_len - 1:-1, :], input_ids[:, -resp_len:]
        logp = token_logprobs(logits, target, self.temperature)
        ent = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = token_entropies(logits, self.temperature)
        if packed:
            logp = unpack(logp[0], valid)
            ent = unpack(ent[0], valid) if ent is not None else None
        return logp, ent

    @torch.no_grad()
    def score_sequences(self, prompts: list, responses: list, *, with_entropy: bool = False,
                        chunk: int = 256) -> tuple[list, Optional[list]]:
        """Per-token log-probs (and entropies) of ``responses[i]`` after ``prompts[i]`` (token-id lists) under
        the current parameters, in eval mode, at most ``chunk`` sequences and ``max_tokens_per_micro`` padded
        tokens per forward pass (``micro_split``): the theta_old pass of the trainer and of cross-tokenizer
        exchange (docs/algorithms.md#cross-tokenizer-exchange), and ExTra's prefix mining (docs/algorithms.md#extra-prefix-regeneration). Returns one list per
        sequence, in order (None for the entropies unless asked). Each pass is ``logprobs`` on rows laid out as the
        update lays out a micro-batch (``pad_pairs`` of the rows in order, ``micro_split``): the update's own forward
        code, so the theta_old it gives a row is the one the update would compute, up to the rounding of another
        batch shape; the update adds no theta_old pass of its own (docs/algorithms.md#notation-and-conventions)."""
        n = len(prompts)
        logps, ents = [None] * n, ([None] * n if with_entropy else None)
        parts = micro_split([len(p) + len(r) for p, r in zip(prompts, responses)], self.max_tokens_per_micro)
        was = self.model.training
        self.model.eval()
        try:
            with self.compute_weights():
                for part in parts:
                    for start in range(0, len(part), chunk):
                        idx = sorted(part[start:start + chunk])
                        ids, att, R = pad_pairs([prompts[i] for i in idx], [responses[i] for i in idx], self.pad_id)
                        logp, ent = self.logprobs(ids, att, R, with_entropy=with_entropy)
                        for b, i in enumerate(idx):
                            logps[i] = logp[b, :len(responses[i])].tolist()
                            if with_entropy:
                                ents[i] = ent[b, :len(responses[i])].float().cpu()
        finally:
            self.model.train(was)
        return logps, ents

    @torch.no_grad()
    def mean_hidden(self, texts, batch: int = 64) -> torch.Tensor:
        """``[len(texts), hidden]``: the mean-pooled last-layer hidden states of ``texts`` (each encoded alone, EOS
        for an empty one), ``batch`` texts per forward pass, in eval mode; float32 on the CPU."""
        model = self.model
        was_training = model.training
        model.eval()
        out = []
        try:
            with self.compute_weights():
                for start in range(0, len(texts), batch):
                    ids = [self.encode_text(t) or [self.eos_id] for t in texts[start:start + batch]]
                    width = max(len(x) for x in ids)
                    inp = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
                    att = torch.zeros((len(ids), width), dtype=torch.long)
                    for r, x in enumerate(ids):
                        inp[r, :len(x)] = torch.tensor(x, dtype=torch.long)
                        att[r, :len(x)] = 1
                    inp, att = inp.to(self.device), att.to(self.device)
                    hid = model(input_ids=inp, attention_mask=att, output_hidden_states=True,
                                use_cache=False).hidden_states[-1].float()
                    m = att.unsqueeze(-1).float()
                    out.append(((hid * m).sum(1) / m.sum(1)).cpu())
        finally:
            model.train(was_training)
        if not out:
            return torch.zeros((0, int(model.config.hidden_size)))
        return torch.cat(out)

    @property
    def context_window(self) -> int:
        """The model's maximum sequence length (position embeddings); unbounded when it declares none."""
        return context_of(self.model.config)

    def token_ids_decoding_to(self, strings, strip: bool = False, scan: int = 1000) -> set:
        """Ids among the first ``scan`` of the vocabulary that decode to one of ``strings`` (stripped of spaces
        when ``strip``), plus each string's id when it encodes as one token (ExTra's cut tokens, docs/algorithms.md#extra-prefix-regeneration)."""
        found = {i for i in range(min(len(self.tokenizer), scan))
                 if (self.decode([i]).strip(" ") if strip else self.decode([i])) in strings}
        for s in strings:
            enc = self.encode_text(s)
            if len(enc) == 1:
                found.add(enc[0])
        return found

    def char_offsets(self, ids: list, text: str) -> list:
        """``(start, end)`` character span in ``text`` of each token of ``ids`` (the tokenization of ``text``).

        The fast tokenizer's offset mapping when re-encoding ``text`` (as is, or literally: ``encode_literal``)
        gives back ``ids`` (or a prefix of them: a truncated response); otherwise spans from decoding growing
        prefixes. Spans are made non-decreasing. Used by GRAFT's cross-aligned ratio
        (docs/algorithms.md#graft-loss-and-token-ratio) and OM-GRPO's answer-span mask
        (docs/algorithms.md#om-grpo-answer-mask).
        """
        spans = None
        if getattr(self.tokenizer, "is_fast", False):
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            if list(enc["input_ids"][:len(ids)]) == list(ids):
                spans = [tuple(o) for o in enc["offset_mapping"][:len(ids)]]
            else:  # a peer's text, encoded literally
                lit = self._literal_encoding(text) if text else None
                if lit is not None and lit.ids[:len(ids)] == list(ids):
                    spans = [tuple(o) for o in lit.offsets[:len(ids)]]
        if spans is None:
            spans, prev = [], 0
            for i in range(len(ids)):
                end = len(self.decode(ids[:i + 1]))
                spans.append((prev, max(prev, end)))
                prev = max(prev, end)
        out, lo, hi = [], 0, 0
        for a, b in spans:
            lo = max(lo, int(a))
            hi = max(hi, int(b), lo)
            out.append((lo, hi))
        return out

    # ---- state -----------------------------------------------------------------------------
    @property
    def lora(self) -> bool:
        """Whether the model trains LoRA adapters only (``model.lora``; graftzoo.training.models.lora)."""
        return lora_mod.is_lora(self.model)

    def state_dict(self) -> dict:
        """The model's state (a LoRA policy's: its adapters only, flagged ``lora``), optimizer, scheduler, version."""
        out = {"model": lora_mod.adapter_state(self.model) if self.lora else self.model.state_dict(),
               "optimizer": self.optimizer.state_dict() if self.optimizer else None,
               "scheduler": self.scheduler.state_dict() if self.scheduler else None, "version": self.version}
        if self.lora:
            out["lora"] = True
        return out

    def load_model_state(self, state: dict) -> None:
        """The model part of ``state_dict()`` (its ``model`` entry) loaded into the model: all of its weights, or
        a LoRA policy's adapters; a LoRA state for a full model or the reverse is a ``ValueError`` naming the key."""
        if bool(state.get("lora")) != self.lora:
            raise ValueError(f"the checkpoint holds {'LoRA adapters' if state.get('lora') else 'full weights'} but "
                             f"model {self.model_id!r} is built {'with' if self.lora else 'without'} LoRA "
                             f"(config key model.lora or pair.models[{self.model_id}].lora)")
        if self.lora:
            lora_mod.load_adapter_state(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])

    def merged_model(self):
        """A plain transformers model of the current weights, for an export: a LoRA policy's adapters merged into
        a copy of its base model (the training model untouched); otherwise the training model itself."""
        return lora_mod.merged_model(self.model) if self.lora else self.model

    def full_state_dict(self) -> dict:
        """The model's parameters and buffers as whole tensors, for a rollout engine's weight sync or an export.
        A sharded policy gathers them (a collective: every rank of the group calls it at once) onto rank 0's CPU
        (the other ranks get an empty dict) and keeps them for the current version until ``release_gathered``, so
        rank 0's engine can read them again without the group."""
        if not self.sharded:  # a LoRA policy: its adapters merged into the base weights, under the base names
            return lora_mod.merged_state_dict(self.model) if self.lora else self.model.state_dict()
        if self._gathered is None or self._gathered[0] != self.version:
            self._gathered = (self.version, full_model_state(self.model))
        return self._gathered[1]

    def iter_weights(self, dtype=None):
        """The weights a rollout engine loads, one ``(name, whole tensor)`` at a time, cast to ``dtype``: a sharded
        policy's parameters each gathered by ``full_tensor()`` as the iteration reaches it (a collective: every
        rank of the group iterates at once, and every rank gets each whole tensor), so the whole model is never
        held at once; a LoRA policy's adapters merged into the base weights, under the base names."""
        state = self.model.state_dict() if self.sharded else self.full_state_dict()
        with torch.no_grad():
            for name, value in state.items():
                value = _full(value).detach()
                yield name, value.to(dtype) if dtype is not None else value

    # ---- offload (run.layout offload, graftzoo.training.planner.placement.Residency) ---------------------------------
    @property
    def offloaded(self) -> bool:
        """Whether the training state is in host memory (``offload``)."""
        return self._home is not None

    def _state_tensors(self) -> list:
        """The training state, each tensor once: the parameters (float32 master weights under ``bf16-mixed``), the
        buffers, the optimizer's state (AdamW's moments and step counts)."""
        seen, out = set(), []
        groups = [self.model.parameters(), self.model.buffers()]
        if self.optimizer is not None:
            groups.append(t for st in self.optimizer.state.values() for t in st.values() if torch.is_tensor(t))
        for t in (t for g in groups for t in g):
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    # the host buffer (``offload``): every state tensor at a multiple of HOST_ALIGN bytes of one buffer per model, its
    # pinned range on HOST_PAGE boundaries of its own
    HOST_ALIGN = 64  # bytes: a cache line; every dtype's element size divides it, so each tensor is a view in place
    HOST_PAGE = 1 << 16  # bytes: 4 KiB and 64 KiB host pages divide it

    @staticmethod
    def host_buffer_size(tensor_bytes) -> int:
        """The bytes of the host buffer ``offload`` allocates for state tensors of ``tensor_bytes`` bytes each (pure;
        the plan's ``memory.host_buffer_bytes``): each tensor rounded up to ``HOST_ALIGN``, their sum up to
        ``HOST_PAGE``, and one page more, so that the range pinned starts on a page of its own (CUDA refuses to
        register a page twice). This is what host memory holds: no power-of-two rounding (``_pin``)."""
        align, page = Policy.HOST_ALIGN, Policy.HOST_PAGE
        used = sum(-(-int(n) // align) * align for n in tensor_bytes)
        return -(-used // page) * page + page

    def _host_views(self, state: list) -> list:
        """A host tensor for each of ``state``, a view into the one host buffer of this model (``host_buffer_size``):
        the buffer kept from the last move where it was laid out for the same dtypes and shapes, else a new one (the
        old one released first, ``_release_host``), pinned where the state leaves a GPU (``_pin``)."""
        pin = any(t.is_cuda for t in state)
        key = (pin, [(t.dtype, tuple(t.shape)) for t in state])
        if self._host.get("key") == key:
            return self._host["views"]
        self._release_host()
        sizes = [t.numel() * t.element_size() for t in state]
        raw = torch.empty(self.host_buffer_size(sizes), dtype=torch.uint8, device="cpu")
        start = -raw.data_ptr() % self.HOST_PAGE
        region = raw[start:start + raw.numel() - self.HOST_PAGE]  # page-aligned, whole pages
        views, at = [], 0
        for t, n in zip(state, sizes):
            views.append(region[at:at + n].view(t.dtype).view(t.shape))
            at += -(-n // self.HOST_ALIGN) * self.HOST_ALIGN
        unpin = self._pin(region) if pin else None
        self._host = {"key": key, "views": views, "region": region, "unpin": unpin}
        return views

    def _pin(self, region: torch.Tensor):
        """Page-lock ``region`` (page-aligned, whole pages) where it is, at its exact size, with ``cudaHostRegister``;
        returns the finalizer that unregisters it (``_release_host`` calls it, or collecting ``region`` does).
        ``pin_memory=True`` would take torch's CachingHostAllocator, which rounds every allocation up to the next
        power of two (ATen/core/CachingHostAllocator.h, torch 2.11 to 2.13): a 12 GiB state would hold 16 GiB of
        pinned memory. Only a process-wide setting lifts it (``pinned_max_round_threshold_mb`` of
        ``PYTORCH_ALLOC_CONF``, read by torch 2.13, not by every release of that range), so it is not used."""
        cudart = torch.cuda.cudart()
        err = int(cudart.cudaHostRegister(region.data_ptr(), region.numel(), 0))
        if err:
            raise RuntimeError(f"model {self.model_id!r}: pinning its {region.numel() / 2**30:.2f} GiB host buffer "
                               f"for run.layout offload failed (cudaHostRegister: "
                               f"{cudart.cudaGetErrorString(cudart.cudaError(err))}, error {err})")
        unpin = weakref.finalize(region, Policy._unpin, region.data_ptr(), self.model_id)
        unpin.atexit = False  # the process's memory goes with it
        return unpin

    @staticmethod
    def _unpin(ptr: int, model_id: str) -> None:
        """Unregister a host buffer ``_pin`` registered; a refusal raises naming the model."""
        cudart = torch.cuda.cudart()
        err = int(cudart.cudaHostUnregister(ptr))
        if err:
            raise RuntimeError(f"model {model_id!r}: unpinning its host buffer (cudaHostUnregister) failed: "
                               f"{cudart.cudaGetErrorString(cudart.cudaError(err))}, error {err}")

    def _release_host(self) -> None:
        """Drop the host buffer, unpinned first."""
        unpin = self._host.get("unpin")
        if unpin is not None:
            unpin()
        self._host = {}

    def host_bytes(self, pinned: bool = False) -> int:
        """The bytes of this model's host buffer (``host_buffer_size`` of the state it was laid out for; 0 before
        the first ``offload``), or with ``pinned`` the bytes of it page-locked (0 unless the state left a GPU)."""
        region = self._host.get("region")
        if region is None:
            return 0
        if pinned:
            return region.numel() if self._host["unpin"] is not None else 0
        return region.untyped_storage().nbytes()

    def offload(self) -> int:
        """Move the training state (``_state_tensors``) to host memory and free its device copies; gradients hold
        nothing between steps (``apply_gradients``). The state goes into one host buffer per model, each tensor a
        view into it (``_host_views``), kept between moves (pinned memory is slow to allocate) and pinned at its
        exact size where it leaves a GPU (``_pin``): docs/scaling.md#one-gpu-placement-layouts-offload. Every
        tensor keeps its identity (its ``.data`` is replaced), so the optimizer, tied weights and hooks stay valid;
        a forward pass over the model while it is offloaded is refused, naming it. Returns the bytes moved; a no-op
        when offloaded."""
        if self.offloaded:
            return 0
        if self.sharded:
            raise RuntimeError(f"model {self.model_id!r}: a sharded (FSDP2) model is not offloaded by run.layout "
                               f"offload; its ranks hold 1/N of the state each")
        home, state = self.device, self._state_tensors()
        for t, host in zip(state, self._host_views(state)):
            host.copy_(t.data)
            t.data = host
        self._home = home

        def refuse(module, args):
            raise RuntimeError(f"model {self.model_id!r} is offloaded to host memory (run.layout offload): a pass "
                               f"over it needs Policy.onload() first")
        self._guard = self.model.register_forward_pre_hook(refuse)
        return sum(t.numel() * t.element_size() for t in state)

    def onload(self) -> int:
        """Bring the training state back from host memory (``offload``) to its device, bit for bit; returns the
        bytes moved; a no-op when it is resident."""
        if not self.offloaded:
            return 0
        moved = 0
        for t in self._state_tensors():
            t.data = t.data.to(self._home, copy=True)
            moved += t.numel() * t.element_size()
        self._guard.remove()
        self._home = self._guard = None
        return moved

    def release_gathered(self) -> None:
        """Drop the gathered copy of a sharded policy's weights (after the engine took them)."""
        self._gathered = None

    def checkpoint_state(self, folder, stem: str) -> tuple[dict, list]:
        """What a checkpoint stores of this policy: its state for the model's ``.pt`` file and the files written
        beside it in ``folder`` (relative paths; a sharded policy's ``torch.distributed.checkpoint`` shards, which
        every rank of its group writes at once)."""
        if self.sharded:
            return save_sharded(self, folder, stem)
        return self.state_dict(), []

    def load_state_dict(self, state: dict, folder=None):
        """Restore ``state_dict()``'s state; a sharded checkpoint's (``{"sharded": dir, ...}``, written by a worker
        group) is read from ``folder / dir`` through ``torch.distributed.checkpoint`` (graftzoo.training.models.fsdp)."""
        if state.get("sharded") or self.sharded:
            load_sharded(self, state, folder) if state.get("sharded") else load_full(self, state)
            return
        self.load_model_state(state)
        if self.optimizer and state.get("optimizer"):
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler and state.get("scheduler"):
            self.scheduler.load_state_dict(state["scheduler"])
        self.version = state.get("version", 0)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (the group's reduction of a sharded model's norm); other tensors as they are."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor parameter; other tensors as they are."""
    return t.to_local() if hasattr(t, "to_local") else t
