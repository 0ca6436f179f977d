"""``graftzoo plan CONFIG``: the memory each model of a pair needs on a GPU, and how many GPUs a run takes — so a
pair can be sized before a node is booked. Estimates from the architecture alone (no weights are loaded):

- parameters ``N`` (``param_count``): embeddings V·H (twice when the output head is untied), per layer the
  attention projections H·(h·d) + 2·H·(k·d) + (h·d)·H, the MLP 3·H·F (gated: Llama / Qwen) or 2·H·F (GPT-2),
  2·H of norms and the family's biases / per-head norms (GPT-2 also its position embeddings); h / k heads / KV
  heads of size d, F the MLP width;
- training state (``train_state_bytes``): float32 master weights 4N, gradients 4N and AdamW's two moments 8N
  under ``fp32`` / ``bf16-mixed`` (16 bytes per parameter), 2 + 2 + 4 under pure 16-bit ``model`` precision,
  divided over the G GPUs that shard the model (FSDP); plus the 16-bit working copy of the weights under
  ``bf16-mixed`` (2N, gathered);
- activations of one micro-batch of T tokens (``activation_bytes``): 34·T·H bytes per layer in 16-bit compute
  (Korthikanti et al. 2022, "Reducing Activation Recomputation", with fused attention: no s² term), doubled in
  float32; with gradient checkpointing only each layer's 2-byte input (2·T·H per layer) plus one layer's full
  activations; plus the logits kept for the backward pass (T·V in the compute dtype); T = ``optim.
  max_tokens_per_micro``, else a whole minibatch (prompts per step × n / minibatches sequences at full length);
- the vLLM engine colocated with training (``engine_bytes``): its 16-bit weights 2N and its KV cache,
  ``rollout.vllm.kv_cache_gb``, else ``gpu_memory_utilization`` of the GPU less the weights (vLLM schedules the
  sequences within it; 2·L·k·d·2 bytes per token, and what every sequence of a step at full length would need
  is printed beside it); with ``rollout.vllm.sleep_level`` > 0 the engine's memory is freed during the update, so
  the peak is the larger of the two instead of their sum.

The GPUs needed for a model: the smallest G whose per-GPU peak fits ``--gpu-gb`` × 0.9. The formulas are
checked against the parameter counts of the tiny models and their measured peak memory on CPU
(tests/test_plan.py, bench/plan_check.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import click
from transformers import AutoConfig

from graftzoo.apps.options import plugin_option
from graftzoo.contract.config import ConfigError, RunConfig, load_config, trained_ids
from graftzoo.training.models import resolve_precision, tiny_spec
from graftzoo.tiny.build import tiny_config

GIB = 1 << 30


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
                   gated=family != "gpt2", extra_per_layer=extra_layer, extra=extra)


def architecture(spec: dict) -> Arch:
    """A pair.models entry's architecture: tiny models from their spec; hf models from ``arch`` (config.json's
    fields, for planning without the weights) or their config (local path or hub cache)."""
    if spec.get("kind", "tiny") == "tiny":
        return Arch.from_hf_config(tiny_config(tiny_spec(spec)))
    if spec.get("arch"):
        return Arch.from_hf_config(spec["arch"])
    try:
        return Arch.from_hf_config(AutoConfig.from_pretrained(spec.get("path") or spec["id"]))
    except Exception as e:  # offline, no local copy
        raise ConfigError(f"model {spec['id']!r}: its config is not available here ({type(e).__name__}); give its "
                          f"config.json fields as pair.models[].arch to plan without it") from None


def param_count(a: Arch) -> int:
    """Parameters of a decoder-only transformer (module docstring)."""
    attn = a.hidden * a.heads * a.head_dim * 2 + 2 * a.hidden * a.kv_heads * a.head_dim
    mlp = (3 if a.gated else 2) * a.hidden * a.ffn
    embed = a.vocab * a.hidden * (1 if a.tied else 2)
    return embed + a.layers * (attn + mlp + 2 * a.hidden + a.extra_per_layer) + a.hidden + a.extra


def train_state_bytes(n: int, precision: str, shards: int) -> float:
    """Weights, gradients and AdamW moments of ``n`` parameters, per GPU over ``shards`` GPUs, plus bf16-mixed's
    gathered 16-bit working copy."""
    per_param = 16 if precision in ("fp32", "bf16-mixed") else 8
    return per_param * n / shards + (2 * n if precision == "bf16-mixed" else 0)


def activation_bytes(a: Arch, tokens: int, compute_bytes: int, checkpointing: bool) -> float:
    """Activations kept for the backward pass of one micro-batch of ``tokens`` tokens, plus its logits."""
    per_layer = 34 * tokens * a.hidden * compute_bytes / 2
    kept = (a.layers * 2 * tokens * a.hidden + per_layer) if checkpointing else a.layers * per_layer
    return kept + tokens * a.vocab * compute_bytes


def kv_bytes_per_token(a: Arch, dtype_bytes: int = 2) -> int:
    return 2 * a.layers * a.kv_heads * a.head_dim * dtype_bytes


def engine_bytes(n: int, vllm, gpu_gb: float) -> tuple[float, float]:
    """(16-bit weights, KV cache reserved) of a colocated vLLM engine: the cache is ``kv_cache_gb``, else what
    ``gpu_memory_utilization`` of the GPU leaves after the weights (vLLM schedules the sequences within it)."""
    w = 2.0 * n
    if vllm.kv_cache_gb is not None:
        return w, float(vllm.kv_cache_gb) * GIB
    return w, max(0.0, float(vllm.gpu_memory_utilization) * gpu_gb * GIB - w)


def plan(cfg: RunConfig, gpu_gb: float = 80.0) -> list[dict]:
    """Per trained model: parameters, each memory part (GiB), the per-GPU peak and the GPUs it needs."""
    r, o, t = cfg.rollout, cfg.optim, cfg.task
    seq_len = int(r.max_prompt_tokens) + int(r.max_new_tokens)
    sequences = int(t.prompts_per_step) * int(r.n)
    micro = o.max_tokens_per_micro or max(1, sequences // int(o.minibatches)) * seq_len
    train_ids = trained_ids(cfg)
    out = []
    for spec in cfg.pair.models:
        if spec["id"] not in train_ids:
            continue
        a = architecture(spec)
        n = param_count(a)
        low = spec.get("dtype", "float32" if spec.get("kind", "tiny") == "tiny" else "bfloat16") != "float32"
        precision = resolve_precision(o.precision, low)
        compute = 2 if precision == "bf16-mixed" or (precision == "model" and low) else 4
        ckpt = bool(spec.get("gradient_checkpointing", cfg.model.gradient_checkpointing))
        vllm = r.engine == "vllm"
        w, kv = engine_bytes(n, r.vllm, gpu_gb) if vllm else (0.0, 0.0)
        kv_all = kv_bytes_per_token(a) * sequences * seq_len  # every sequence of a step at full length at once
        sleep = vllm and r.vllm.sleep_level > 0
        act = activation_bytes(a, micro, compute, ckpt)
        act_other = activation_bytes(a, micro, compute, not ckpt)
        usable = gpu_gb * 0.9 * GIB
        gpus, peak = None, None
        for g in range(1, 1025):
            train = train_state_bytes(n, precision, g) + act
            p = max(train, w + kv) if sleep else train + w + kv
            if p <= usable:
                gpus, peak = g, p
                break
        out.append({"model": spec["id"], "params": n, "precision": precision, "checkpointing": ckpt,
                    "micro_tokens": micro, "state_gib_1gpu": train_state_bytes(n, precision, 1) / GIB,
                    "activations_gib": act / GIB, "activations_other_gib": act_other / GIB,
                    "engine_weights_gib": w / GIB, "kv_cache_gib": kv / GIB, "kv_all_gib": kv_all / GIB,
                    "engine_sleeps": sleep,
                    "gpus": gpus, "peak_gib_per_gpu": None if peak is None else peak / GIB})
    return out


@click.command("plan")
@plugin_option
@click.argument("config")
@click.option("--algo", default="grpo", show_default=True, help="algorithm (its settings do not change the plan)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="dotted override")
@click.option("--gpu-gb", type=float, default=80.0, show_default=True, help="memory of one GPU, GiB")
def plan_cmd(config, algo, overrides, gpu_gb):
    """GPU memory per model and GPUs needed: graftzoo plan configs/pairs/pair1.yaml [--gpu-gb 80]."""
    cfg = load_config(pair=config, algo=algo, overrides=list(overrides) + ["run.track=false"])
    rows = plan(cfg, gpu_gb)
    for p in rows:
        ckpt = "on" if p["checkpointing"] else "off"
        size = f"{p['params'] / 1e9:.3f} B" if p["params"] >= 1e9 else f"{p['params'] / 1e6:.2f} M"
        click.echo(f"{p['model']}: {size} parameters, {p['precision']}, micro-batch "
                   f"{p['micro_tokens']:,} tokens")
        click.echo(f"  weights + grads + AdamW (1 GPU) {p['state_gib_1gpu']:8.2f} GiB   (sharded over G GPUs by "
                   f"FSDP; bf16-mixed's 16-bit working copy of the weights counted unsharded)")
        click.echo(f"  activations, checkpointing {ckpt:<3}  {p['activations_gib']:8.2f} GiB   "
                   f"(with it {'off' if p['checkpointing'] else 'on'}: {p['activations_other_gib']:.2f} GiB)")
        if p["engine_weights_gib"]:
            click.echo(f"  vLLM engine weights + KV cache  {p['engine_weights_gib']:8.2f} + {p['kv_cache_gib']:.2f}"
                       f" GiB{'   (asleep during the update)' if p['engine_sleeps'] else ''}   (every sequence of "
                       f"a step at once would need {p['kv_all_gib']:.1f} GiB of KV cache)")
        need = (f"{p['gpus']} x {gpu_gb:g} GiB GPU(s), peak {p['peak_gib_per_gpu']:.1f} GiB each"
                if p["gpus"] else f"does not fit {gpu_gb:g} GiB GPUs at any count (lower the micro-batch budget "
                                   f"or turn gradient checkpointing on)")
        click.echo(f"  needs {need}")
    if all(p["gpus"] for p in rows):
        click.echo(f"total: {sum(p['gpus'] for p in rows)} GPU(s) for the run (each model on its own GPUs)")
