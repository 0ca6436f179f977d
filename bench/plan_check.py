"""``graftzoo plan``'s memory formulas (graftzoo/training/planner/memory.py) against the memory small models really take on
CPU: for each case, a model of that shape (random weights; the tiny pair's two models and small Llama / SmolLM3 /
Qwen3 bodies with a large vocabulary) runs one micro-batch of the trainer's scoring path (``Policy.logprobs`` with
the entropies, as the loss calls it) and the peak of the memory allocated on top of what the step starts with is
taken from torch's profiler (every allocation and free of the CPU allocator, added up in time order):

- ``update``: forward and backward with the gradients already allocated (a second micro-batch of a gradient
  accumulation): the activations, logits and logits' gradient of ``memory.update_activation_bytes``;
- ``logprob``: the forward without gradients (the theta_old pass): ``memory.forward_activation_bytes``.

Run: python bench/plan_check.py [--json FILE]    (tests/test_plan.py runs ``measure`` on three of the cases)
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM

from graftzoo.contract.config import load_config
from graftzoo.training.planner.memory import Arch, forward_activation_bytes, update_activation_bytes, working_copy_bytes
from graftzoo.training.planner.build import apply_precision, tiny_spec
from graftzoo.training.models import policy as policy_mod
from graftzoo.training.models.policy import Policy
from graftzoo.tiny.build import tiny_config

CHUNK = 1 << 16  # entries of the logits turned into float32 at a time (the trainer: policy.LOGIT_CHUNK, 2^24)
NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
SHAPES = {  # small bodies of the families graftzoo plans for (head sizes, GQA and the MLP width vary)
    "llama": {"model_type": "llama", "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 8192, "tie_word_embeddings": True,
              **NO_IDS},
    "smollm3": {"model_type": "smollm3", "hidden_size": 128, "intermediate_size": 688, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 8192, "no_rope_layer_interval": 4,
                "tie_word_embeddings": True, **NO_IDS},
    "qwen3": {"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 8192,
              "tie_word_embeddings": True, **NO_IDS},
}
# (model, precision, gradient checkpointing, rows, prompt tokens, response tokens)
CASES = [("tiny-qwen-char", "fp32", False, 8, 64, 64), ("tiny-qwen-char", "fp32", True, 8, 64, 64),
         ("tiny-gpt2-pair", "fp32", False, 8, 64, 64), ("tiny-gpt2-pair", "fp32", True, 8, 64, 64),
         ("llama", "fp32", False, 4, 128, 128), ("llama", "bf16-mixed", False, 4, 128, 128),
         ("llama", "bf16-mixed", True, 4, 128, 128), ("smollm3", "bf16-mixed", True, 4, 128, 128),
         ("qwen3", "fp32", True, 4, 128, 128), ("qwen3", "bf16-mixed", False, 4, 128, 128),
         ("qwen3", "bf16-mixed", True, 8, 128, 128), ("tiny-gpt2-pair", "bf16-mixed", False, 8, 64, 64),
         ("tiny-qwen-char", "bf16-mixed", True, 8, 64, 64)]


def hf_config(name: str) -> dict:
    """The transformers config fields of a case's model: a tiny pair model (configs/pairs/tiny.yaml) or a shape."""
    if isinstance(name, dict):
        return dict(name)
    if name in SHAPES:
        return dict(SHAPES[name])
    spec = next(s for s in load_config(pair="tiny", algo="grpo").pair.models if s.id == name)
    return tiny_config(tiny_spec(spec)).to_dict()


def allocated_peak(fn) -> int:
    """The peak of the CPU memory ``fn`` allocates on top of what is allocated when it starts (bytes)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def measure(name, precision: str, checkpointing: bool, rows: int, prompt: int, response: int) -> dict:
    """Measured peaks (bytes) of one micro-batch of ``rows`` x (``prompt`` + ``response``) tokens through a model
    of case ``name`` (module docstring; or a dict of transformers config fields), and the plan's formulas for the
    same. The log-softmax runs in pieces of ``CHUNK`` entries, so that the logits span many pieces as a full-size
    run's do."""
    torch.set_num_threads(1)
    chunk, policy_mod.LOGIT_CHUNK = policy_mod.LOGIT_CHUNK, CHUNK
    try:
        return _measure(hf_config(name), name if isinstance(name, str) else name["model_type"], precision,
                        checkpointing, rows, prompt, response)
    finally:
        policy_mod.LOGIT_CHUNK = chunk


def _measure(fields: dict, name: str, precision: str, checkpointing: bool, rows: int, prompt: int,
             response: int) -> dict:
    cfg = AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    autocast = apply_precision(model, precision)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = Policy(name, model.train(), None)
    policy.autocast_dtype = autocast
    policy.packs = lambda: False  # the padded path (as on CPU)
    ids = torch.randint(0, cfg.vocab_size, (rows, prompt + response))
    mask = torch.ones_like(ids)

    def update():
        logp, _ = policy.logprobs(ids, mask, response, with_entropy=True, entropy_grad=False)
        (-logp.mean()).backward()

    def logprob():
        with torch.no_grad():
            policy.logprobs(ids, mask, response, with_entropy=True)

    a = Arch.from_hf_config(fields)
    tokens, kept = rows * (prompt + response), rows * (response + 1)  # logits_to_keep: the response and one more
    # the phase's working copy (bf16-mixed; the plan's working_copy_bytes, a state term) made before the peaks
    def working_copy():
        with policy.compute_weights():
            pass

    copy = allocated_peak(working_copy)
    with policy.compute_weights():
        update()  # the gradients allocated, as from a gradient accumulation's second micro-batch on
        peaks = {"update": allocated_peak(update), "logprob": allocated_peak(logprob)}
    return {"case": name, "precision": precision, "checkpointing": checkpointing, "tokens": tokens,
            "seq_len": prompt + response, "params": sum(p.numel() for p in model.parameters()), **peaks, "working_copy": copy,
            "working_copy_plan": working_copy_bytes(a, precision, 1),
            "update_plan": update_activation_bytes(a, tokens, kept, precision, checkpointing),
            "logprob_plan": forward_activation_bytes(a, tokens, kept, precision)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    rows = []
    for case in CASES:
        r = measure(*case)
        rows.append(r)
        print(f"{r['case']:<15} {r['precision']:<10} ckpt {'on ' if r['checkpointing'] else 'off'} "
              f"{r['tokens']:>5} tokens | update {r['update'] / 2**20:7.2f} MiB, plan {r['update_plan'] / 2**20:7.2f}"
              f" ({r['update_plan'] / r['update'] - 1:+.1%}) | logprob {r['logprob'] / 2**20:6.2f} MiB, plan "
              f"{r['logprob_plan'] / 2**20:6.2f} ({r['logprob_plan'] / r['logprob'] - 1:+.1%}) | working copy "
              f"{r['working_copy'] / 2**20:6.2f} MiB, plan {r['working_copy_plan'] / 2**20:6.2f}", flush=True)
    worst = max(abs(r[k + "_plan"] / r[k] - 1) for r in rows for k in ("update", "logprob"))
    print(f"largest error of the plan: {worst:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
