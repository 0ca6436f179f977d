"""Supervised warm-up of the tiny models on procedural arithmetic, cached on disk.

A tiny model starts from random weights; a short SFT run on scratchpad solutions gives it the
skill profile that the RL demo needs (docs/results.md). The loss
is completion-only: cross-entropy on the scratchpad and its EOS after the compact prompt
``Q:{question}\\n``. Fresh problems every step, AdamW, linear warm-up then cosine decay.

The demo's and the quick start's models ship with the package, trained by this code (graftzoo.tiny.shipped):
every machine starts from their weights. Any other spec's result is cached under ``$GRAFTZOO_CACHE`` (default
``~/.cache/graftzoo``) in a directory named by the spec id and a hash of (spec, seed, WARMUP_VERSION, the code and
library versions that produce the weights: ``code_fingerprint``); it holds the model and tokenizer
(``save_pretrained``) and ``warmup.json``. It is written to a temporary directory and
renamed into place, so a reader never sees a half-written checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForCausalLM

from graftzoo.contract.output import log_to_stderr, wait
from graftzoo.envs import arithmetic
from graftzoo.envs.arithmetic import generate_prompts, is_correct
from graftzoo.tiny import build
from graftzoo.tiny.shipped import shipped_path
from graftzoo.tiny.build import (TinyModelSpec, WarmupSpec, build_tiny, load_tokenizer, position_ids,
                                 warmup_answer, warmup_prompt)

WARMUP_VERSION = 1  # bump when the training code changes what a given spec produces
PROBE_SPLIT = "probe"
LARGE_VOCAB = 4096  # vocabularies at least this large are projected on the labelled positions only (sft_loss)


def default_cache_dir() -> Path:
    return Path(os.environ.get("GRAFTZOO_CACHE") or Path.home() / ".cache" / "graftzoo")


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the code that turns a spec into weights: the source of the warm-up, of the tiny
    models and tokenizers and of the arithmetic problems, and the torch and transformers versions.
    A cache written by other code or other libraries is not reused: its weights may differ."""
    h = hashlib.sha256(f"torch {torch.__version__} transformers {transformers.__version__}".encode())
    for module in (build, arithmetic, sys.modules[__name__]):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:16]


def cache_key(spec: TinyModelSpec, seed: int) -> str:
    """Hash of everything that determines the warmed-up weights (the spec, the seed, the code)."""
    blob = json.dumps({"spec": spec.to_dict(), "seed": seed, "version": WARMUP_VERSION, "code": code_fingerprint()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def encode_batch(tokenizer, questions: Sequence[str], solutions: Sequence[str], vocab: str = "char") -> dict:
    """Left-padded SFT batch: prompt (``Q:{q}\\n``, or the plain template for a real ``vocab``) + solution + EOS;
    labels -100 except on the completion."""
    prompts = tokenizer([warmup_prompt(q, vocab) for q in questions], add_special_tokens=False)["input_ids"]
    answers = tokenizer([warmup_answer(s, vocab) for s in solutions], add_special_tokens=False)["input_ids"]
    rows = [(p, a + [tokenizer.eos_token_id]) for p, a in zip(prompts, answers)]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        ids[i, width - n:] = torch.tensor(p + a)
        mask[i, width - n:] = 1
        labels[i, width - len(a):] = torch.tensor(a)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_loss(model, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled (completion) tokens. A model with a large vocabulary (a
    miniature with a real tokenizer, whose output layer is most of its compute) projects only the positions that
    predict a label; the small ones take the whole logits, as they always have."""
    pos = position_ids(batch["attention_mask"])
    if model.config.vocab_size < LARGE_VOCAB:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=pos).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100)
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              position_ids=pos).last_hidden_state
    labels = batch["labels"][:, 1:]
    keep = labels != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), labels[keep])


def lr_factor(step: int, w: WarmupSpec) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from 1 to ``min_lr_ratio`` at ``steps``."""
    if step < w.warmup_steps:
        return (step + 1) / w.warmup_steps
    t = (step - w.warmup_steps) / max(1, w.steps - w.warmup_steps)
    return w.min_lr_ratio + (1 - w.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def sft_train(model, tokenizer, w: WarmupSpec, seed: int,
              progress: Optional[Callable[[dict], None]] = None, start: int = 0, vocab: str = "char") -> dict:
    """Up to ``w.steps`` SFT steps on fresh train-split problems, stopping early once ``w.stop_when`` holds.
    ``start``: index of the first problem of the train stream (a continuation starts past the first phase's);
    ``vocab``: the tokenizer kind (``TinyModelSpec.tokenizer``), which picks the prompt format.

    Returns loss, timing, the step it stopped at and the probe history (``w.stop_when`` only).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=w.lr, betas=tuple(w.betas), weight_decay=w.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, w))
    model.train()
    t0, losses, probes, probe_s = time.perf_counter(), [], [], 0.0
    for step in range(w.steps):
        prompts = generate_prompts(w.batch, seed, w.mix, w.difficulty, "train", start=start + step * w.batch)
        batch = encode_batch(tokenizer, [p.text for p in prompts], [p.metadata["solution"] for p in prompts], vocab)
        loss = sft_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), w.grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None:
            progress({"step": step + 1, "steps": w.steps, "loss": losses[-1], "lr": sched.get_last_lr()[0],
                      "elapsed_s": time.perf_counter() - t0})
        if w.stop_when and (step + 1) % w.probe_every == 0 and step + 1 < w.steps:
            t = time.perf_counter()
            acc = {}
            for k, v in w.stop_when.items():  # in order, skipping the rest once one falls short
                acc.update(probe(model, tokenizer, w, seed, skills=[k], vocab=vocab))
                if acc[k] < v:
                    break
            model.train()
            probe_s += time.perf_counter() - t
            probes.append({"step": step + 1, **acc})
            if all(acc.get(k, -1.0) >= v for k, v in w.stop_when.items()):
                break
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": len(losses), "max_steps": w.steps, "train_s": time.perf_counter() - t0, "stop_probe_s": probe_s,
            "stop_probes": probes, "first_loss": losses[0] if losses else None,
            "final_loss": sum(tail) / len(tail) if tail else None}


@torch.no_grad()
def generate(model, tokenizer, questions: Sequence[str], max_new_tokens: int, num_samples: int = 1,
             do_sample: bool = False, temperature: float = 1.0, batch_size: int = 256,
             vocab: str = "char") -> list[list[str]]:
    """Responses to each question's warm-up prompt: ``num_samples`` per question, plain (top-k 0, top-p 1)."""
    prompts = [warmup_prompt(q, vocab) for q in questions for _ in range(num_samples)]
    texts = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i:i + batch_size], add_special_tokens=False, padding=True, return_tensors="pt")
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
        out = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                             position_ids=position_ids(enc["attention_mask"]), max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **kw)
        texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return [texts[j * num_samples:(j + 1) * num_samples] for j in range(len(questions))]


def max_new_tokens_for(tokenizer, solutions: Sequence[str], margin: int = 4, vocab: str = "char") -> int:
    """Longest tokenized solution + EOS + a margin."""
    answers = [warmup_answer(s, vocab) for s in solutions]
    return max(len(ids) for ids in tokenizer(answers, add_special_tokens=False)["input_ids"]) + 1 + margin


def probe(model, tokenizer, w: WarmupSpec, seed: int, skills: Optional[Sequence[str]] = None,
          vocab: str = "char") -> dict:
    """Greedy accuracy per skill (default: the warm-up mix) on ``w.probe_per_skill`` held-out problems each.

    The probe split is in the held-out partition (never trained on); it may share questions with
    other held-out splits, so stopping on it is a (mild) selection on held-out data.
    """
    skills = skills or [k for k, v in w.mix.items() if v > 0]
    model.eval()
    acc = {}
    for skill in skills:
        ps = generate_prompts(w.probe_per_skill, seed, {skill: 1.0}, w.difficulty, PROBE_SPLIT)
        mnt = max_new_tokens_for(tokenizer, [p.metadata["solution"] for p in ps], vocab=vocab)
        outs = generate(model, tokenizer, [p.text for p in ps], mnt, vocab=vocab)
        acc[skill] = sum(is_correct(o[0], p.gold) for o, p in zip(outs, ps)) / len(ps)
    return acc


CONTINUE_START = 10_000_000  # a continuation's problems start this far into the train stream (past any first phase)


def _warm(spec: TinyModelSpec, seed: int, progress=None, threads: int = 1, cache_dir=None, shown=None) -> tuple:
    """Train ``spec``'s warm-up; with ``warmup.then``, load (or make) the first phase's cached checkpoint and
    continue it with the second recipe. The final probe covers the skills of both phases. ``progress`` gets each
    step's record, ``shown`` (a ``graftzoo.contract.output.Wait``) the steps of this phase."""
    torch.set_num_threads(threads)
    w = spec.warmup

    def report(rec: dict) -> None:
        if shown is not None:
            shown.update(rec["step"], f"loss {rec['loss']:.3f}")
        if progress is not None:
            progress(rec)
    if w.then is None:
        model, tok = build_tiny(spec, seed)
        stats = sft_train(model, tok, w, seed, report, vocab=spec.tokenizer)
    else:
        first = load_or_warmup(replace(spec, warmup=w.first_phase()), seed, cache_dir, progress, threads)
        model, tok = load_tiny(first)
        stats = sft_train(model, tok, w.then, seed, report, start=CONTINUE_START, vocab=spec.tokenizer)
        stats["first_phase"] = {k: v for k, v in warmup_info(first).items() if k not in ("spec", "version")}
        w = replace(w.then, mix={**{k: v for k, v in w.mix.items() if v > 0}, **w.then.mix})
    t = time.perf_counter()  # an untrained model (steps 0: the architecture alone) is not probed
    stats["probe_greedy"] = probe(model, tok, w, seed, vocab=spec.tokenizer) if stats["steps"] else {}
    stats["probe_s"] = time.perf_counter() - t
    return model, tok, stats


def same_weights(spec: TinyModelSpec, seed: int, root: Path) -> Optional[Path]:
    """A cached warm-up of the same recipe and seed under another model id (the id does not change the weights):
    e.g. the first phase shared by the control's learner and its stronger continuation (``warmup.then``)."""
    want = {**spec.to_dict(), "id": None}
    for f in sorted(root.glob("*/warmup.json")):
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if info.get("seed") == seed and info.get("version") == WARMUP_VERSION and \
                info.get("code") == code_fingerprint() and {**info.get("spec", {}), "id": None} == want:
            return f.parent
    return None


def load_or_warmup(spec: TinyModelSpec, seed: Optional[int] = None, cache_dir=None,
                   progress: Optional[Callable[[dict], None]] = None, threads: int = 1, shipped: bool = True) -> str:
    """Directory of the warmed-up ``spec`` (seed defaults to ``spec.warmup.seed``): the package's shipped copy of its
    recipe (``graftzoo.tiny.shipped``, checked by hash; not with ``shipped=False``), else the cache; trains only on a
    cache miss (a warm-up of the same recipe under another id counts as a hit: ``same_weights``)."""
    seed = spec.warmup.seed if seed is None else seed
    if shipped:
        path = shipped_path(spec.to_dict(), seed)
        if path is not None:
            return str(path)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"{spec.id}-{cache_key(spec, seed)}"
    if (final / "warmup.json").is_file():
        return str(final)
    twin = same_weights(spec, seed, root) if root.is_dir() else None
    if twin is not None:
        return str(twin)
    root.mkdir(parents=True, exist_ok=True)
    w = spec.warmup.then or spec.warmup   # a continuation's first phase is a warm-up (and a wait) of its own
    phase = " (its continuation)" if spec.warmup.then else ""
    with wait(f"warm-up of {spec.id}{phase}", total=w.steps, unit="steps",
              note=f"once: cached in {root}" + (", may stop early" if w.stop_when else "")) as shown:
        model, tok, stats = _warm(spec, seed, progress, threads, root, shown)
        probe_text = ", ".join(f"{k} {v:.2f}" for k, v in stats["probe_greedy"].items())
        shown.finish(f"{stats['steps']} steps, greedy probe {probe_text}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.id}-", dir=root))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        meta = {"spec": spec.to_dict(), "seed": seed, "version": WARMUP_VERSION, "code": code_fingerprint(), **stats}
        (tmp / "warmup.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished the same warm-up first; keep its copy
            if not (final / "warmup.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(final)


def _warm_in_child(spec_dict: dict, seed: Optional[int], cache_dir) -> str:
    log_to_stderr()  # its warm-up's progress lines on the parent's stderr
    return load_or_warmup(TinyModelSpec.from_dict(spec_dict), seed, cache_dir)


def warmup_pair(specs: Sequence[TinyModelSpec], seed: Optional[int] = None, cache_dir=None,
                parallel: Optional[bool] = None) -> list[str]:
    """Warm every spec (cached); cache misses run in parallel processes, 1 thread each, when >= 2 cores are ours."""
    if parallel is None:
        parallel = len(os.sched_getaffinity(0)) >= 2
    if not parallel or len(specs) < 2:
        return [load_or_warmup(s, seed, cache_dir) for s in specs]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(len(specs), len(os.sched_getaffinity(0))), mp_context=ctx) as ex:
        futures = [ex.submit(_warm_in_child, s.to_dict(), seed, cache_dir) for s in specs]
        return [f.result() for f in futures]


def load_tiny(path: str):
    """(model, tokenizer) from a ``load_or_warmup`` directory, in eval mode (tokenizer via ``load_tokenizer``)."""
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, load_tokenizer(path)


def warmup_info(path: str) -> dict:
    return json.loads((Path(path) / "warmup.json").read_text())
