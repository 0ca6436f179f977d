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
  is printed beside it).

The per-GPU peak (``peak_bytes``) is the sum of these parts; with ``rollout.vllm.sleep_level`` > 0 the engine's
memory is freed during the update, so it is the training state plus the larger of the activations and the engine.
The GPUs needed for a model: the smallest G whose per-GPU peak fits ``--gpu-gb`` × 0.9 (``USABLE``).

``graftzoo plan CONFIG --gpus N`` (``placement``) places the trained models on a node of N GPUs: each in a group of
ranks, one GPU per rank, its training state sharded over the group (FSDP2) and a rollout engine on every rank
(each rank generates its share of the step's prompts); the split of the GPUs and when models share them is
``placement``'s docstring. The formulas are checked against the parameter counts of the tiny models and their
measured peak memory on CPU (tests/test_plan.py, bench/plan_check.py).
"""
from __future__ import annotations

import json
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


USABLE = 0.9  # of a GPU's memory, for the planned peak (the rest: CUDA context, allocator fragmentation)
STATE_PARTS = ("weights", "grads", "adamw_moments", "working_copy")


def state_per_param(precision: str, low: bool = True) -> tuple[int, int, int]:
    """Bytes per parameter of the (weights, gradients, AdamW moments) an update keeps: float32 under ``fp32`` /
    ``bf16-mixed`` (4 + 4 + 8), 2 + 2 + 4 under ``model`` precision on a 16-bit model (``low``)."""
    return (2, 2, 4) if precision == "model" and low else (4, 4, 8)


def train_state_bytes(n: int, precision: str, shards: int, low: bool = True) -> float:
    """Weights, gradients and AdamW moments of ``n`` parameters, per GPU over ``shards`` GPUs, plus bf16-mixed's
    gathered 16-bit working copy."""
    return sum(state_per_param(precision, low)) * n / shards + (2 * n if precision == "bf16-mixed" else 0)


def activation_bytes(a: Arch, tokens: int, compute_bytes: int, checkpointing: bool) -> float:
    """Activations kept for the backward pass of one micro-batch of ``tokens`` tokens, plus its logits."""
    per_layer = 34 * tokens * a.hidden * compute_bytes / 2
    kept = (a.layers * 2 * tokens * a.hidden + per_layer) if checkpointing else a.layers * per_layer
    return kept + tokens * a.vocab * compute_bytes


def kv_bytes_per_token(a: Arch, dtype_bytes: int = 2) -> int:
    """KV cache bytes per token: keys and values of every layer's KV heads."""
    return 2 * a.layers * a.kv_heads * a.head_dim * dtype_bytes


def engine_bytes(n: int, vllm, gpu_gb: float) -> tuple[float, float]:
    """(16-bit weights, KV cache reserved) of a colocated vLLM engine: the cache is ``kv_cache_gb``, else what
    ``gpu_memory_utilization`` of the GPU leaves after the weights (vLLM schedules the sequences within it)."""
    w = 2.0 * n
    if vllm.kv_cache_gb is not None:
        return w, float(vllm.kv_cache_gb) * GIB
    return w, max(0.0, float(vllm.gpu_memory_utilization) * gpu_gb * GIB - w)


@dataclass
class ModelMemory:
    """One trained model's memory inputs (bytes) that do not depend on how many ranks shard it."""

    model: str
    params: int
    precision: str
    state_per_param: tuple    # bytes of (weights, gradients, AdamW moments) per parameter
    checkpointing: bool
    micro_tokens: int
    activations: float        # one micro-batch, as configured
    activations_other: float  # the same with gradient checkpointing the other way
    engine: str               # rollout.engine
    engine_weights: float     # the vLLM engine's 16-bit copy (0 for hf: it decodes with the training weights)
    kv_cache: float           # the vLLM engine's KV cache reserve
    kv_all: float             # what every sequence of a step at full length would need at once
    sleeps: bool              # rollout.vllm.sleep_level > 0: the engine's memory is freed during the update
    num_workers: int | None   # pair.models[i].num_workers, where the config gives it


def model_memory(cfg: RunConfig, gpu_gb: float) -> list[ModelMemory]:
    """The memory inputs of every trained model of ``cfg`` on GPUs of ``gpu_gb`` GiB, in pair order."""
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
        out.append(ModelMemory(
            model=spec["id"], params=n, precision=precision, state_per_param=state_per_param(precision, low),
            checkpointing=ckpt, micro_tokens=micro,
            activations=activation_bytes(a, micro, compute, ckpt),
            activations_other=activation_bytes(a, micro, compute, not ckpt), engine=r.engine,
            engine_weights=w, kv_cache=kv, kv_all=kv_bytes_per_token(a) * sequences * seq_len,
            sleeps=vllm and r.vllm.sleep_level > 0, num_workers=spec.get("num_workers")))
    return out


def per_gpu_parts(m: ModelMemory, ranks: int) -> dict:
    """What one GPU of a group of ``ranks`` ranks holds for model ``m`` (bytes): the weights, gradients and AdamW
    moments sharded over the ranks (FSDP2), bf16-mixed's 16-bit working copy (counted unsharded), one micro-batch's
    activations, and the rollout engine every rank runs (16-bit weights and KV cache)."""
    weights, grads, moments = m.state_per_param
    return {"weights": weights * m.params / ranks, "grads": grads * m.params / ranks,
            "adamw_moments": moments * m.params / ranks,
            "working_copy": 2.0 * m.params if m.precision == "bf16-mixed" else 0.0,
            "activations": m.activations, "engine_weights": m.engine_weights, "kv_cache": m.kv_cache}


def peak_bytes(parts: dict, sleeps: bool) -> float:
    """The per-GPU peak of ``per_gpu_parts``: their sum; with the engine asleep during the update, the training
    state plus the larger of the update's activations and the engine's weights and KV cache."""
    state = sum(parts[k] for k in STATE_PARTS)
    engine = parts["engine_weights"] + parts["kv_cache"]
    return state + (max(parts["activations"], engine) if sleeps else parts["activations"] + engine)


def min_ranks(m: ModelMemory, usable: float, limit: int) -> int | None:
    """The fewest ranks (at most ``limit``) over which model ``m`` fits ``usable`` bytes per GPU, else None."""
    return next((g for g in range(1, limit + 1) if peak_bytes(per_gpu_parts(m, g), m.sleeps) <= usable), None)


def plan(cfg: RunConfig, gpu_gb: float = 80.0) -> list[dict]:
    """Per trained model: parameters, each memory part (GiB), the per-GPU peak and the GPUs it needs."""
    usable = gpu_gb * USABLE * GIB
    out = []
    for m in model_memory(cfg, gpu_gb):
        gpus = min_ranks(m, usable, 1024)
        peak = None if gpus is None else peak_bytes(per_gpu_parts(m, gpus), m.sleeps)
        out.append({"model": m.model, "params": m.params, "precision": m.precision, "checkpointing": m.checkpointing,
                    "micro_tokens": m.micro_tokens,
                    "state_gib_1gpu": sum(per_gpu_parts(m, 1)[k] for k in STATE_PARTS) / GIB,
                    "activations_gib": m.activations / GIB, "activations_other_gib": m.activations_other / GIB,
                    "engine_weights_gib": m.engine_weights / GIB, "kv_cache_gib": m.kv_cache / GIB,
                    "kv_all_gib": m.kv_all / GIB, "engine_sleeps": m.sleeps,
                    "gpus": gpus, "peak_gib_per_gpu": None if peak is None else peak / GIB})
    return out


# ------------------------------------------------------------------------------------------------
# placement on a node of N GPUs
# ------------------------------------------------------------------------------------------------

def split_gpus(params: list[int], minimum: list[int], total: int) -> list[int]:
    """``total`` GPUs in proportion to ``params``, each model at least its ``minimum``: from the minima, each
    further GPU goes to the model furthest below its proportional share (the first one on a tie)."""
    gpus = list(minimum)
    for _ in range(total - sum(gpus)):
        short = [total * p / sum(params) - g for p, g in zip(params, gpus)]
        gpus[short.index(max(short))] += 1
    return gpus


def group_entry(m: ModelMemory, ranks: list[int], prompts: int, explicit: bool) -> dict:
    """One model's group in a placement: its ranks, the engine on each, the prompts each rank generates (a vLLM
    engine its share, the HF engine all of them) and its per-GPU parts and peak (GiB)."""
    parts = per_gpu_parts(m, len(ranks))
    k = len(ranks) if m.engine == "vllm" else 1  # the HF engine runs the whole request on every rank, in lockstep
    per = sorted({prompts // k, -(-prompts // k)})
    return {"model": m.model, "ranks": ranks, "num_workers": len(ranks), "num_workers_from_config": explicit,
            "precision": m.precision, "state_dtype": "fp32" if m.state_per_param[0] == 4 else "bf16",
            "engine_per_rank": m.engine, "engine_sleeps": m.sleeps,
            "prompts_per_rank": per, "kv_all_per_rank_gb": m.kv_all / len(ranks) / GIB,
            "per_gpu_peak_gb": peak_bytes(parts, m.sleeps) / GIB, "parts": {k: v / GIB for k, v in parts.items()}}


def need_gib(m: ModelMemory, ranks: int) -> float:
    """Model ``m``'s per-GPU peak over ``ranks`` ranks, GiB."""
    return peak_bytes(per_gpu_parts(m, ranks), m.sleeps) / GIB


def separate_split(models: list[ModelMemory], workers: list, gpus: int, usable: float) -> tuple[list | None, str]:
    """Ranks per model for groups on GPUs of their own: the given ``workers`` (None: to choose), the GPUs they
    leave split by ``split_gpus``; (None, the reason) where no such split fits."""
    if len(models) > gpus:
        return None, f"{len(models)} models need at least {len(models)} GPUs for groups of their own"
    fixed = sum(w for w in workers if w)
    free = [i for i, w in enumerate(workers) if not w]
    if fixed + len(free) > gpus:
        return None, f"num_workers from the config take {fixed} GPUs, the other models need {len(free)}: > {gpus}"
    for m, w in zip(models, workers):
        if w and need_gib(m, w) * GIB > usable:
            return None, f"{m.model} needs {need_gib(m, w):.1f} GiB per GPU over its {w} rank(s) (num_workers)"
    left = gpus - fixed
    most = left - len(free) + 1  # the others keep at least one GPU each
    least = [min_ranks(models[i], usable, most) for i in free]
    for i, g in zip(free, least):
        if g is None:
            return None, f"{models[i].model} needs {need_gib(models[i], most):.1f} GiB per GPU even over {most} rank(s)"
    if sum(least) > left:
        needs = " and ".join(f"{models[i].model} at least {g}" for i, g in zip(free, least))
        return None, f"{needs} GPUs: {sum(least)} > {left}"
    out = list(workers)
    for i, g in zip(free, split_gpus([models[i].params for i in free], least, left) if free else []):
        out[i] = g
    return out, ""


def separate(models: list[ModelMemory], split: list[int], workers: list, prompts: int, usable: float) -> dict:
    """The groups of a separate placement, on consecutive ranks in pair order, and why their sizes."""
    groups, start = [], 0
    for m, w, given in zip(models, split, workers):
        groups.append(group_entry(m, list(range(start, start + w)), prompts, bool(given)))
        start += w
    sizes = ", ".join(f"{m.model} {w} " + ("(num_workers from the config)" if given else
                                           f"({m.params / 1e9:.3f} B parameters, needs {min_ranks(m, usable, w)})")
                      for m, w, given in zip(models, split, workers))
    why = ("each model on GPUs of its own (none shared: the models generate and update at once), the GPUs the "
           f"config leaves open split in proportion to the parameters, each model at least the GPUs it needs: {sizes}")
    return {"layout": "separate", "why": why, "placement": groups, "fits": True, "error": None}


def colocated(models: list[ModelMemory], workers: list, gpus: int, prompts: int, usable: float,
              why: str) -> dict:
    """Every model on ranks 0.. (its num_workers, else all ``gpus``), a GPU holding the sum of its models' peaks;
    ``error`` names the models of the fullest GPU where it exceeds ``usable``."""
    over = [(m.model, w) for m, w in zip(models, workers) if w and w > gpus]
    if over:
        return {"layout": "colocated", "why": why, "placement": [], "fits": False,
                "error": f"{over[0][0]}: num_workers {over[0][1]} > {gpus} GPUs"}
    groups = [group_entry(m, list(range(w or gpus)), prompts, bool(w)) for m, w in zip(models, workers)]
    top = max(per_gpu(groups, gpus), key=lambda r: r["peak_gb"])
    out = {"layout": "colocated", "why": why, "placement": groups, "fits": top["peak_gb"] * GIB <= usable,
           "error": None}
    if not out["fits"]:
        each = ", ".join(f"{g['model']} needs {g['per_gpu_peak_gb']:.1f} GiB per GPU over {g['num_workers']} "
                         f"rank(s)" for g in groups if top["rank"] in g["ranks"])
        out["error"] = f"colocated: {each}, {top['peak_gb']:.1f} GiB together on GPU {top['rank']}"
    return out


def placement(cfg: RunConfig, gpus: int, gpu_gb: float = 80.0) -> dict:
    """Where each trained model of ``cfg`` goes on a node of ``gpus`` GPUs of ``gpu_gb`` GiB (docs/scaling.md).

    Every model runs in a group of ranks, one GPU each, training sharded over them (FSDP2) and a rollout engine on
    every rank generating that rank's share of the prompts. The rule: ``pair.models[i].num_workers`` (or
    ``ray.num_workers`` above 1) fix a model's ranks; with ``ray.gpus_per_worker`` 1 the models get groups on GPUs
    of their own, the GPUs the config leaves open split in proportion to the models' parameters, each model at
    least the GPUs it needs; where no such split fits (or ``ray.gpus_per_worker`` < 1 asks for shared GPUs) the
    models are colocated, each on ranks 0.. of all the GPUs, a GPU holding the sum of its models' peaks. A GPU
    may use ``USABLE`` of its memory. ``fits`` False: ``error`` says which model needs how much against what."""
    gpw = cfg.ray.gpus_per_worker
    if gpw > 1:
        raise ConfigError(f"config key 'ray.gpus_per_worker' ({gpw:g}): graftzoo plan places one rank per GPU (1) "
                          f"or ranks sharing GPUs (< 1)")
    usable = gpu_gb * USABLE * GIB
    models = model_memory(cfg, gpu_gb)
    workers = [m.num_workers or (cfg.ray.num_workers if cfg.ray.num_workers > 1 else None) for m in models]
    prompts = int(cfg.task.prompts_per_step)
    split, why_not = (None, "") if gpw < 1 else separate_split(models, workers, gpus, usable)
    if split is not None:
        out, share = separate(models, split, workers, prompts, usable), 1
    else:
        why = "every model on ranks 0.. of the node, sharing the GPUs: " + (
            f"ray.gpus_per_worker {gpw:g} < 1 asks for shared GPUs" if gpw < 1 else
            f"separate groups do not fit ({why_not})")
        out, share = colocated(models, workers, gpus, prompts, usable, why), min(gpw, 1 / max(1, len(models)))
    if not out["fits"]:
        out["error"] = (f"no placement of {cfg.pair.name} fits {gpus} x {gpu_gb:g} GiB GPU(s), "
                        f"{usable / GIB:.1f} GiB available per GPU ({USABLE:.0%}): "
                        + (f"separate groups: {why_not}; " if why_not else "") + out["error"])
    return {"pair": cfg.pair.name, "prompts": prompts, "gpus": gpus, "gpu_gb": gpu_gb, "usable_gb": usable / GIB,
            **out, "per_gpu": per_gpu(out["placement"], gpus),
            "settings": settings(out["placement"], round(share, 3)) if out["fits"] else {}}


def per_gpu(groups: list[dict], gpus: int) -> list[dict]:
    """Per GPU of the node: the models whose ranks it holds and the sum of their per-GPU peaks (GiB)."""
    return [{"rank": r, "models": [g["model"] for g in groups if r in g["ranks"]],
             "peak_gb": sum(g["per_gpu_peak_gb"] for g in groups if r in g["ranks"])} for r in range(gpus)]


def settings(groups: list[dict], gpus_per_worker: float) -> dict:
    """The config keys that run a placement with ``--backend ray``."""
    out = {"run.backend": "ray", "run.device": "cuda", "ray.gpus_per_worker": gpus_per_worker}
    out.update({f"pair.models[{g['model']}].num_workers": g["num_workers"] for g in groups})
    return out


LAYOUTS = {"separate": "separate groups", "colocated": "colocated, the models sharing each GPU"}


def rank_span(ranks: list[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``"0-3"``; ``[5]`` -> ``"5"``."""
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def placement_lines(p: dict) -> list[str]:
    """``placement``'s answer as the lines ``graftzoo plan --gpus`` prints."""
    usable = p["usable_gb"]
    out = [f"placement of {p['pair']} on {p['gpus']} x {p['gpu_gb']:g} GiB GPUs ({usable:.1f} GiB usable each, "
           f"{USABLE:.0%}): {LAYOUTS[p['layout']]}", f"  why: {p['why']}"]
    for g in p["placement"]:
        q, k = g["parts"], g["num_workers"]
        shard = f"FSDP2 over {k} ranks" if k > 1 else "1 rank, unsharded"
        per = "-".join(str(x) for x in g["prompts_per_rank"])
        if g["engine_per_rank"] == "vllm":
            engine = (f"a vllm engine on every rank generating its {per} of the step's {p['prompts']} prompts, "
                      + ("asleep during the update" if g["engine_sleeps"] else
                         "awake during the update (rollout.vllm.sleep_level 0)"))
        else:
            engine = (f"the {g['engine_per_rank']} engine on every rank (the training weights), all "
                      f"{p['prompts']} prompts in lockstep")
        out.append(f"  rank{'s' if k > 1 else ''} {rank_span(g['ranks'])}: {g['model']}, {shard}; {engine}")
        copy = f" + bf16 working copy {q['working_copy']:.2f}" if q["working_copy"] else ""
        out.append(f"    per GPU: weights {q['weights']:.2f} + grads {q['grads']:.2f} + AdamW moments "
                   f"{q['adamw_moments']:.2f} ({g['state_dtype']}, 1/{k} each){copy} + activations "
                   f"{q['activations']:.2f} + engine weights {q['engine_weights']:.2f} + KV cache {q['kv_cache']:.2f}"
                   + (" (engine and activations not at once)" if g["engine_sleeps"] else "")
                   + f" = {g['per_gpu_peak_gb']:.2f} GiB peak of {usable:.1f}")
    if p["layout"] == "colocated":
        top = max(p["per_gpu"], key=lambda r: r["peak_gb"])
        out.append(f"  per GPU, its models together: up to {top['peak_gb']:.2f} GiB of {usable:.1f}")
    if p["fits"]:
        keys = {k: v for k, v in p["settings"].items() if not k.startswith("pair.models")}
        workers = ", ".join(f"{g['num_workers']} for {g['model']}" for g in p["placement"])
        out.append("  run it with: " + " ".join(f"--set {k}={v:g}" if isinstance(v, float) else f"--set {k}={v}"
                                                for k, v in keys.items())
                   + f"; num_workers in the pair file's models: {workers}")
    return out


@click.command("plan")
@plugin_option
@click.argument("config")
@click.option("--algo", default="grpo", show_default=True, help="algorithm (its settings do not change the plan)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="dotted override")
@click.option("--gpu-gb", "--gpu-mem-gb", "gpu_gb", type=float, default=80.0, show_default=True,
              help="memory of one GPU, GiB")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="place the models on a node of this many GPUs: ranks, engines and per-GPU peak memory")
@click.option("--json", "as_json", is_flag=True, help="print the same as JSON")
@click.pass_context
def plan_cmd(ctx, config, algo, overrides, gpu_gb, gpus, as_json):
    """GPU memory per model and GPUs needed: graftzoo plan configs/pairs/pair1.yaml [--gpu-gb 80] [--gpus 8]."""
    cfg = load_config(pair=config, algo=algo, overrides=list(overrides) + ["run.track=false"])
    if gpus is not None:
        p = placement(cfg, gpus, gpu_gb)
        if as_json:
            click.echo(json.dumps(p, indent=2))
            ctx.exit(0 if p["fits"] else 1)
        if not p["fits"]:
            raise click.ClickException(p["error"])
        click.echo("\n".join(placement_lines(p)))
        return
    rows = plan(cfg, gpu_gb)
    if as_json:
        click.echo(json.dumps({"gpu_gb": gpu_gb, "models": rows}, indent=2))
        return
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
