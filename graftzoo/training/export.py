"""Export (what ``graftzoo export RUN [--step N] [--out DIR]`` runs): a run's trained models as Hugging Face folders that
``transformers`` (``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``), vLLM and evaluation harnesses
(lm-evaluation-harness) load as they are.

One folder per trained model, ``DIR/<model id, "/" -> "__">/`` (default ``DIR``: ``RUN/export/step_N``), written by
``save_pretrained``: ``config.json``, ``generation_config.json``, ``model.safetensors``, the tokenizer files and
``chat_template.jinja``, plus ``graftzoo_export.json`` (run, step, checkpoint, model id and spec, prompt template,
the eval scores of that step when the run has them).

- **Weights** come from the checkpoint through the loader ``graftzoo eval`` uses (``graftzoo.training.run.checkpoint.
  load_weights``: manifest, size and sha256 checked; whole state dicts or a worker group's ``<model>.dcp/``
  shards) into a policy rebuilt from the run's config. A model trained with LoRA is saved merged, as a
  plain model (``Policy.merged_model``: a copy is merged; the policy is left as it is).
- **Checkpoint**: ``--step N``, or a checkpoint folder given as RUN, or by default the newest checkpoint whose
  weight files pass their check (a failing one is skipped with a warning; nothing is renamed or removed).
- **Chat template**: the prompt template the model trained with, as the tokenizer's ``chat_template``: a user
  message renders exactly as graftzoo rendered a problem (``compact``: ``Q:{problem}\\n``; ``plain``, ``r1``, ...:
  their text around the problem), an assistant message as its text and the EOS token. A model that trained with
  ``template: chat`` keeps its own chat template. Harnesses that apply chat templates then reproduce the training
  prompt.
- **Tokenizer**: saved without the padding or truncation settings a batch may have left on it (the tokenizer.json a
  fresh build writes), then loaded back with ``AutoTokenizer`` and checked to give the same ids and texts and the
  same rendered prompt. The tiny models' ``char`` tokenizer on a qwen2 model is written as its byte-level twin
  (``graftzoo.tiny.build.byte_level_tokenizer``: transformers forces ``Qwen2Tokenizer`` on a qwen2 folder); a
  tokenizer that still does not load back equal is an error naming the model.
"""
from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Callable, Optional, Sequence

from transformers import AutoTokenizer

from graftzoo.training.run.checkpoint import (CheckpointError, check_weights, checkpoint_dir, checkpoint_step,
                                      list_checkpoints, load_weights)
from graftzoo.contract.errors import ConfigError
from graftzoo.contract.names import model_slug
from graftzoo.envs.templates import render_prompt
from graftzoo.eval.artifacts import EVAL_DIR, eval_file_name
from graftzoo.eval.evaluate import check_writable
from graftzoo.training.eval_checkpoints import build_policies, load_run_config, resolve_target, trained_specs
from graftzoo.training.eval_runner import CLI_EVAL_DIR
from graftzoo.tiny.build import byte_level_tokenizer

log = logging.getLogger("graftzoo")

EXPORT_DIR = "export"                  # default output: RUN/export/step_N/<model>/
EXPORT_META = "graftzoo_export.json"   # what an exported folder came from
_PROBLEM = "\x00problem\x00"            # stands for the problem while a template is turned into Jinja
# problems the loaded-back tokenizer is checked on (those of them the model's tokenizer writes back unchanged)
_PROBES = ("12+345", "(7-2)*3 = 15", "What is $\\frac{1}{2}$ of 10?\nGive the answer in \\boxed{}.",
           "Ünïcödé — café ½ x² ≤ 1234567\r\n\n  \tend 終わり 😀")


class ExportError(ValueError):
    """A run, checkpoint or model cannot be exported; the one-line message names it."""


def _literal(text: str) -> str:
    """``text`` as a Jinja expression that prints it verbatim (a string literal, so no braces or newlines of it
    are read as template syntax or trimmed)."""
    return "{{ " + json.dumps(text, ensure_ascii=False) + " }}" if text else ""


def template_jinja(template: str, tokenizer=None) -> str:
    """The Jinja chat template of graftzoo's prompt template ``template`` (``graftzoo.envs.templates``): a user
    message renders as the template renders a problem, an assistant message as its text and EOS, any other
    message as its text and a newline. ``chat`` is the tokenizer's own chat template."""
    if template == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise ExportError("prompt template 'chat' needs the tokenizer's own chat template, and it has none")
        return tokenizer.chat_template
    text = render_prompt(_PROBLEM, template, tokenizer)
    if text.count(_PROBLEM) != 1:
        raise ExportError(f"prompt template {template!r} does not show the problem exactly once; it cannot be "
                          f"written as a chat template")
    before, after = text.split(_PROBLEM)
    return ("{% for message in messages %}"
            "{% if message['role'] == 'user' %}" + _literal(before) + "{{ message['content'] }}" + _literal(after) +
            "{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}"
            "{% else %}{{ message['content'] }}" + _literal("\n") + "{% endif %}"
            "{% endfor %}")


def _loads_back(folder: Path, tok, template: str) -> Optional[str]:
    """Why ``AutoTokenizer.from_pretrained(folder)`` differs from ``tok`` (ids, decoded text, rendered prompt),
    or None when it does not."""
    back = AutoTokenizer.from_pretrained(folder)
    for problem in _PROBES:
        prompt = render_prompt(problem, template, tok)
        for text in (prompt, problem):
            want = tok.encode(text, add_special_tokens=False)
            if tok.decode(want) != text:  # outside the tokenizer's vocabulary (a tiny model's digits and signs)
                continue
            got = back.encode(text, add_special_tokens=False)
            if got != want:
                return f"{type(back).__name__} encodes {text!r} as {got[:12]}, the model's tokenizer as {want[:12]}"
            if back.decode(got) != tok.decode(want):
                return f"{type(back).__name__} decodes {text!r} as {back.decode(got)!r}"
        if template != "chat":
            chat = back.apply_chat_template([{"role": "user", "content": problem}], tokenize=False,
                                            add_generation_prompt=True)
            if chat != prompt:
                return f"its chat template renders {problem!r} as {chat!r}, graftzoo's template as {prompt!r}"
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(back, name) != getattr(tok, name):
            return f"{name} is {getattr(back, name)}, the model's tokenizer has {getattr(tok, name)}"
    return None


def _save_tokenizer(tok, folder: Path, template: str, model_id: str) -> str:
    """Save ``tok`` with the training template as its chat template, such that ``AutoTokenizer`` loads it back
    equal; returns the tokenizer class written."""
    tok = copy.deepcopy(tok)
    tok.chat_template = template_jinja(template, tok)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:  # a batch padded or cut once leaves its settings in tokenizer.json: not the tokenizer's
        backend.no_padding()
        backend.no_truncation()
    tok.save_pretrained(folder)
    why = _loads_back(folder, tok, template)
    if why is None:
        return type(tok).__name__
    try:
        twin = byte_level_tokenizer(tok)  # a tiny char tokenizer that transformers replaced by its own class
    except ValueError:
        twin = None
    if twin is not None:
        twin.save_pretrained(folder)
        if _loads_back(folder, tok, template) is None:
            return "byte-level " + type(twin).__name__
    raise ExportError(f"model {model_id!r}: AutoTokenizer does not load its tokenizer back equal from {folder}: "
                      f"{why}")


def export_policy(policy, folder, meta: Optional[dict] = None) -> Path:
    """Write ``policy`` (its current weights, tokenizer and prompt template) as a Hugging Face folder, plus
    ``graftzoo_export.json`` holding ``meta``; returns the folder. A peft (LoRA) model is saved merged."""
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)  # a re-export replaces the folder: no file of an older export stays behind
    folder.mkdir(parents=True)
    model = policy.merged_model()  # a LoRA policy's adapters merged into a copy; else the model itself
    tok = policy.tokenizer
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id = tok.eos_token_id, policy.pad_id
    if tok.bos_token_id is not None:
        gen.bos_token_id = tok.bos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tok_class = _save_tokenizer(tok, folder, policy.template, policy.model_id)
    doc = {"model": policy.model_id, "template": policy.template, "tokenizer": tok_class,
           "dtype": str(next(model.parameters()).dtype).replace("torch.", ""), **(meta or {})}
    (folder / EXPORT_META).write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return folder


def _scores(payload: dict) -> dict:
    """benchmark -> avg of an eval file (the trainer's whole held-out split as ``overall``)."""
    out = {name: rec.get("avg") for name, rec in payload.get("benchmarks", {}).items()}
    if isinstance(payload.get("overall"), dict):
        out["overall"] = payload["overall"].get("avg")
    return out


def known_scores(run_dir, model_id: str, step: int) -> dict:
    """Eval scores of ``model_id`` at ``step`` the run holds: the trainer's ``eval/<model>.json`` and
    ``graftzoo eval``'s ``eval/cli/*/<model>.json``, each by its path in the run directory."""
    root = Path(run_dir)
    name = eval_file_name(model_id)
    out = {}
    for path in [root / EVAL_DIR / name] + sorted((root / EVAL_DIR / CLI_EVAL_DIR).glob(f"*/{name}")):
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(payload, dict) and payload.get("step") == step:
            out[path.relative_to(root).as_posix()] = _scores(payload)
    return out


def pick_checkpoint(run_dir: Path, model_ids: Sequence[str], step: Optional[int] = None) -> Path:
    """The checkpoint of ``step``, or the newest one whose weight files of ``model_ids`` pass their check."""
    done = list_checkpoints(run_dir)
    if step is not None:
        ckpt = checkpoint_dir(run_dir, step)
        if ckpt not in done:
            have = ", ".join(str(checkpoint_step(c)) for c in done) or "none"
            raise ConfigError(f"--step {step}: no complete checkpoint of that step in {run_dir} (steps: {have})")
        return ckpt
    for ckpt in reversed(done):
        try:
            check_weights(ckpt, model_ids)
            return ckpt
        except CheckpointError as e:
            log.warning("%s skipped: %s", ckpt, e)
    raise ExportError(f"{run_dir}: no intact checkpoint to export")


def export_run(path, step: Optional[int] = None, out=None, models: Optional[Sequence[str]] = None,
               log_line: Optional[Callable[[str], None]] = None) -> list:
    """Export the trained models of a run directory or checkpoint folder ``path`` (module docstring); returns the
    folders written, one per model."""
    run_dir, ckpt = resolve_target(path)
    cfg = load_run_config(run_dir)
    specs = trained_specs(cfg, models)
    ids = [s.id for s in specs]
    if ckpt is not None and step is not None and checkpoint_step(ckpt) != step:
        raise ConfigError(f"--step {step}: {ckpt} is the checkpoint of step {checkpoint_step(ckpt)}")
    ckpt = ckpt if ckpt is not None else pick_checkpoint(run_dir, ids, step)
    at = checkpoint_step(ckpt)
    out = Path(out) if out is not None else run_dir / EXPORT_DIR / ckpt.name
    check_writable(out, "export to another folder with --out DIR")  # before the models are built and loaded
    policies = build_policies(cfg, ids)
    for m, pol in policies.items():  # every weight file checked and loaded before anything is written
        load_weights(pol, ckpt)
        pol.model.eval()
    written = []
    for spec in specs:
        m = spec.id
        meta = {"run": cfg.run.name, "run_dir": str(run_dir), "step": at,
                "checkpoint": f"checkpoints/{ckpt.name}", "algo": cfg.algo.name, "model_spec": spec.model_dump(),
                "eval": known_scores(run_dir, m, at)}
        folder = export_policy(policies[m], out / model_slug(m), meta)
        written.append(folder)
        if log_line:
            log_line(f"{m}: step {at} -> {folder}")
    return written
