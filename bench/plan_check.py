"""``graftzoo plan``'s activation formula against the memory one update really takes, on CPU with the tiny pair's
Qwen2 (float32). For each setting, a fresh process trains two steps; during the second step's update, the
tensors each micro-batch's forward keeps for the backward pass (autograd's saved tensors, each storage once,
parameters aside) are added up, and the largest micro-batch's total is compared with the plan's
``activation_bytes`` (activations + logits) for its padded token count.

Run: python bench/plan_check.py
"""
from __future__ import annotations

import json
import subprocess
import sys

SETTINGS = [["optim.max_tokens_per_micro=null"], ["optim.max_tokens_per_micro=2048"],
            ["optim.max_tokens_per_micro=null", "model.gradient_checkpointing=true"],
            ["optim.max_tokens_per_micro=2048", "model.gradient_checkpointing=true"]]

CHILD = r"""
import json, sys, tempfile
import torch
torch.set_num_threads(1)
from graftzoo.apps.plan import activation_bytes, architecture
from graftzoo.training import update as T
from graftzoo.training.trainer import Trainer
from graftzoo.contract.config import load_config

seen = []
update = T.minibatch_update
def measured(ctx, policy, learner, micros, where):
    params = {p.untyped_storage().data_ptr() for p in policy.model.parameters()}
    for mb in micros:  # what each micro-batch's forward keeps for the backward pass (parameters aside)
        kept = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                kept[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _ = learner.loss(ctx, policy, mb)
        del loss
        seen.append((sum(kept.values()), mb.input_ids.numel()))
    return update(ctx, policy, learner, micros, where)


T.minibatch_update = measured
with tempfile.TemporaryDirectory() as out:
    cfg = load_config(pair="tiny", algo="grpo", overrides=[
        "run.track=false", "run.progress=false", f"run.out_dir={out}", "pair.train=[tiny-qwen-char]",
        "optim.minibatches=1", "algo.entropy_coeff=0.01", *sys.argv[1:]])
    tr = Trainer(cfg)
    tr.train_step(0)
    seen.clear()
    tr.train_step(1)
    tr.close()
spec = cfg.pair.models[0]
a = architecture(spec)
n = sum(p.numel() for p in tr.policies["tiny-qwen-char"].model.parameters())
measured_b, tokens = max(seen)
est = activation_bytes(a, tokens, 4, bool(cfg.model.gradient_checkpointing))
print(json.dumps({"settings": sys.argv[1:], "tokens": tokens, "measured_mib": measured_b / 2**20,
                  "estimate_mib": est / 2**20}))
"""


def main():
    for s in SETTINGS:
        out = subprocess.run([sys.executable, "-c", CHILD, *s], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{' '.join(r['settings']):<70} micro-batch {r['tokens']:>6} tokens | kept for backward "
              f"{r['measured_mib']:7.1f} MiB | plan {r['estimate_mib']:7.1f} MiB | ratio "
              f"{r['measured_mib'] / r['estimate_mib']:.2f}", flush=True)


if __name__ == "__main__":
    main()
