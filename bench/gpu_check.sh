#!/usr/bin/env bash
# bench/gpu_check.sh — the scale-out path on a GPU machine in one call of at most 10 minutes.
#
# No model hub is reachable there either, so it builds two random models of realistic shape locally (Qwen2 bodies of
# ~0.5B and ~1.5B parameters: hidden 896 x 24 layers and 1536 x 28 layers; a character vocabulary, so the
# embeddings are small), co-trains them for a few GRAFT steps with --backend ray (each model in its own worker group),
# the vLLM engine colocated with training and bf16-mixed precision, then prints per model: tokens/s of each phase,
# peak GPU memory, and the framework's own share of a step (time outside generate / verify / log-probs / update).
#
#   bash bench/gpu_check.sh [STEPS]        (needs: pip install -e .[gpu]  -> torch with CUDA, vllm, ray)
#
# GPUs: with 2 or more, each model gets its own GPU (and FSDP2 over 2 ranks for the larger one when there are 3);
# with 1, both models' workers share it (ray.gpus_per_worker=0.5). FSDP2 needs a GPU per rank (NCCL).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STEPS=${1:-4}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/graftzoo-gpu-check.XXXXXX")
export GRAFTZOO_CACHE="$OUT/cache" WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

GPUS=$($PY - <<'EOF'
import importlib.util, sys
import torch
missing = [m for m in ("vllm", "ray") if importlib.util.find_spec(m) is None]
if not torch.cuda.is_available():
    missing.append("a CUDA build of torch with a visible GPU")
if missing:
    sys.exit("gpu_check: missing " + ", ".join(missing) + " (pip install -e .[gpu])")
print(torch.cuda.device_count())
EOF
)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
echo "GPUs: $GPUS, steps: $STEPS, output: $OUT"

LARGE_WORKERS=1; SHARE=1
if [ "$GPUS" -ge 3 ]; then LARGE_WORKERS=2; fi
if [ "$GPUS" -eq 1 ]; then SHARE=0.5; fi

cat > "$OUT/pair.yaml" <<EOF
name: gpu-check
models:
  - {id: qwen2-0.5b-shape, kind: tiny, family: qwen2, tokenizer: char, hidden: 896, layers: 24, heads: 14,
     kv_heads: 2, ffn: 4864, max_new_tokens: 256, dtype: bfloat16,
     warmup: {steps: 1, batch: 4, lr: 1.0e-5, mix: {add: 1.0}, difficulty: 1, probe_per_skill: 1}}
  - {id: qwen2-1.5b-shape, kind: tiny, family: qwen2, tokenizer: digit_pair, hidden: 1536, layers: 28, heads: 12,
     kv_heads: 2, ffn: 8960, max_new_tokens: 256, dtype: bfloat16, num_workers: $LARGE_WORKERS,
     warmup: {steps: 1, batch: 4, lr: 1.0e-5, mix: {add: 1.0}, difficulty: 1, probe_per_skill: 1}}
template: compact
task: {env: graftzoo/Arithmetic-v0, mix: {add: 1, mul: 1}, difficulty: 3, prompts_per_step: 32}
rollout: {n: 8, max_new_tokens: 256, engine: vllm,
          vllm: {kv_cache_gb: null, gpu_memory_utilization: 0.2, enforce_eager: true}}
optim: {lr: 1.0e-6, minibatches: 2, max_tokens_per_micro: 8192, precision: auto}
model: {gradient_checkpointing: true}
eval: {size: 32, k: 1}
run: {device: cuda, threads: 4, save_every: 0, eval_at_end: false, progress: false}
ray: {gpus_per_worker: $SHARE, cpus_per_worker: 4}
EOF

START=$(date +%s)
timeout 540 $PY -m graftzoo.apps.cli train --algo graft --pair "$OUT/pair.yaml" --peer online --backend ray \
  --no-track --set run.out_dir="$OUT/runs" --set run.name=check --set run.steps="$STEPS" 2>&1 | tail -40
echo "wall: $(( $(date +%s) - START )) s (model build and warm-up cache included)"

$PY - "$OUT/runs/check/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("time/step") is not None]
core = ("time/generate", "time/score", "time/logprob", "time/update")
print("| model | generate tok/s | log-prob tok/s | update tok/s | weight sync s | peak GPU GiB | outside the four phases |")
print("|---|---|---|---|---|---|---|")
for m in sorted({r["model"] for r in rows}):
    rs = [r for r in rows if r["model"] == m][1:] or [r for r in rows if r["model"] == m]  # first step: warm-up
    med = lambda f: statistics.median([f(r) for r in rs])
    gen = med(lambda r: r.get("perf/tokens_per_s") or 0)
    lp = med(lambda r: r["batch/tokens"] / r["time/logprob"] if r.get("time/logprob") else 0)
    up = med(lambda r: r["batch/tokens"] / r["time/update"] if r.get("time/update") else 0)
    step = lambda r: max(x["time/step"] for x in rows if x["step"] == r["step"])
    own = med(lambda r: (step(r) - sum(sum(x.get(k) or 0 for k in core) for x in rows if x["step"] == r["step"]))
              / step(r))
    print(f"| {m} | {gen:.0f} | {lp:.0f} | {up:.0f} | {med(lambda r: r['time/weight_sync']):.2f} | "
          f"{max(r.get('perf/peak_mem_gb') or 0 for r in rs):.1f} | {own:.1%} |")
EOF
