"""LoRA (``model.lora``, or ``pair.models[i].lora`` for one model): parameter-efficient training through peft.

``wrap`` turns a loaded causal LM into a peft ``PeftModelForCausalLM`` whose only trainable parameters are the LoRA
adapters (``lora_A``, ``lora_B`` of the ``target_modules``); ``B`` starts at zero, so the wrapped model computes the
base model's function until the first update. Everything else reads the wrapped model through the helpers here:

- ``adapter_state`` / ``load_adapter_state``: what a checkpoint holds of the model: the adapter tensors only (the
  base weights are the ones the model spec loads), restored exactly;
- ``merged_state_dict``: the whole weights with the adapters merged (``W + scale * B @ A``) under the base model's
  parameter names, computed beside the training model (never merged into it and unmerged, which would round its
  base weights): a vLLM engine's weight sync (``Policy.full_state_dict``);
- ``merged_model``: a plain transformers model with the adapters merged, a copy (export);
- ``AdaptersOff``: the KL reference, the same model with its adapters disabled (peft's ``disable_adapter``): the
  base model, without a second copy of its weights.

peft is imported when a model is wrapped (it takes seconds to import); ``is_lora`` does not import it.
"""
from __future__ import annotations

import copy
import sys

import torch

from graftzoo.contract.errors import ConfigError


def is_lora(model) -> bool:
    """Whether ``model`` is a peft model (``wrap``'s); peft is only looked at when something imported it already."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(getattr(model, "lora_model", model), peft.PeftModel)


def wrap(model, lora: dict, key: str = "model.lora"):
    """``model`` with LoRA adapters (``lora``: a checked ``model.lora`` mapping; ``key`` names it in errors); only
    the adapters require gradients. A ``target_modules`` entry that names no module is a ``ConfigError``."""
    import peft
    conf = peft.LoraConfig(r=int(lora["r"]), lora_alpha=float(lora["alpha"]), lora_dropout=float(lora["dropout"]),
                           target_modules=lora["target_modules"], bias="none", task_type="CAUSAL_LM",
                           fan_in_fan_out=_conv1d_only(model))
    try:
        return peft.get_peft_model(model, conf)
    except ValueError as e:
        raise ConfigError(f"config key '{key}.target_modules' ({lora['target_modules']!r}): {' '.join(str(e).split())}"
                          ) from None


def _conv1d_only(model) -> bool:
    """Whether the model's projections are transformers ``Conv1D`` layers (GPT-2: weights stored [in, out]), which
    peft's LoRA treats with ``fan_in_fan_out`` (peft would otherwise warn, and set it per layer)."""
    return any(type(m).__name__ == "Conv1D" for m in model.modules())


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts (a tied weight counted once)."""
    seen, trained, total = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trained += p.numel() if p.requires_grad else 0
    return trained, total


def adapter_state(model) -> dict:
    """The adapter tensors of a wrapped model (its state-dict entries holding ``lora_``): what a checkpoint keeps."""
    return {k: v for k, v in model.state_dict().items() if ".lora_" in k}


def load_adapter_state(model, state: dict) -> None:
    """Restore ``adapter_state``'s tensors into a wrapped model; a state that is not this model's adapters (another
    rank or target_modules, a full-weight state) raises ``ValueError`` naming the first mismatch."""
    want = adapter_state(model)
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unexpected:
        raise ValueError(f"the LoRA adapters do not match this model's (model.lora): "
                         + (f"missing {missing[0]} and {len(missing) - 1} more; " if missing else "")
                         + (f"unexpected {unexpected[0]} and {len(unexpected) - 1} more" if unexpected else ""))
    model.load_state_dict(state, strict=False)


@torch.no_grad()
def merged_state_dict(model) -> dict:
    """The whole weights of a wrapped model with its active adapters merged, under the base model's names
    (``model.layers.0.self_attn.q_proj.weight``: no ``base_model.model.`` prefix, no ``base_layer``, no ``lora_``
    tensors). The merged tensors are new ones; the others are the model's own (as ``state_dict`` gives them)."""
    from peft.tuners.lora import LoraLayer
    base = model.get_base_model()
    out = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if ".lora_" not in k}
    for name, mod in base.named_modules():
        if not isinstance(mod, LoraLayer):
            continue
        adapters = [a for a in mod.active_adapters if a in mod.lora_A or a in getattr(mod, "lora_embedding_A", {})]
        if not adapters or getattr(mod, "disable_adapters", False):
            continue
        w = mod.get_base_layer().weight
        delta = sum(mod.get_delta_weight(a) for a in adapters)
        out[f"{name}.weight"] = (w + delta.to(w.dtype)).detach()
    return out


def merged_model(model):
    """A plain transformers model with the adapters merged into a copy of the base weights (peft's
    ``merge_and_unload`` on a deep copy); the training model is untouched."""
    return copy.deepcopy(model).merge_and_unload()


class AdaptersOff:
    """A wrapped model seen with its adapters disabled: the base model it was built from, sharing its weights (the KL
    reference of a LoRA policy). Calls run under peft's ``disable_adapter``; everything else is the model's."""

    def __init__(self, model):
        self.lora_model = model

    def __call__(self, *args, **kwargs):
        """The base model's forward, in eval mode (as the deep-copied reference of a full fine-tune is)."""
        model = self.lora_model
        was = model.training
        model.eval()
        try:
            with model.disable_adapter():
                return model(*args, **kwargs)
        finally:
            model.train(was)

    def __getattr__(self, name):
        if name == "lora_model":  # not set yet (a copy being built)
            raise AttributeError(name)
        return getattr(self.lora_model, name)
