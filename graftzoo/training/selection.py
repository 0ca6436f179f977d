"""Checkpoint selection (``eval.select``) for a run directory target of ``graftzoo eval``:

- ``last``: the newest complete checkpoint;
- ``val_avg``: every kept checkpoint is scored (avg@k, the eval sampling settings) on the run's
  VALIDATION set (``graftzoo.envs.task.Task.validation``) and each model gets its best one (ties:
  the later step), as in the GRAFT paper's Figure 4. Selecting on a test set (``Task.is_test_set``)
  raises ``SelectionError`` unless ``allow_test`` / ``eval.allow_test_selection`` says otherwise.
  Keep every checkpoint for such runs (``run.keep_checkpoints: 0``).

A checkpoint that fails its check (``graftzoo.training.run.checkpoint.verify_checkpoint``: manifest, size and
sha256 of the evaluated models' files) is skipped with a warning naming it and the reason; the record
lists it under ``skipped``. The run directory is not changed.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Optional

from graftzoo.contract.config import SELECT_RULES, RunConfig
from graftzoo.training.run.checkpoint import CheckpointError, check_weights, checkpoint_step, list_checkpoints, load_weights
from graftzoo.envs.task import Task
from graftzoo.eval.evaluate import fmt_score
from graftzoo.eval.protocol import score_benchmark

log_ = logging.getLogger("graftzoo")


class SelectionError(ValueError):
    """Checkpoint selection is misconfigured (e.g. it would select on a test set)."""


def select_checkpoints(run_dir, cfg: RunConfig, policies: dict, engines: dict, *, rule: Optional[str] = None,
                       val_dataset=None, val_size: Optional[int] = None, allow_test: Optional[bool] = None,
                       k: int = 1, temperature: Optional[float] = None, max_new_tokens: Optional[int] = None,
                       seed: int = 0, log: Optional[Callable[[str], None]] = None) -> dict:
    """model id -> (checkpoint, selection record) under ``rule`` (default ``eval.select``)."""
    ev = cfg.eval
    rule = rule or ev.select or "last"
    if rule not in SELECT_RULES:
        raise SelectionError(f"config key 'eval.select' must be one of {SELECT_RULES}, got {rule!r}")
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"{Path(run_dir) / 'checkpoints'}: no complete checkpoint to evaluate")
    if rule == "val_avg":
        allow = bool(ev.allow_test_selection if allow_test is None else allow_test)
        task = Task(cfg)
        val = task.validation(val_dataset, val_size)
        if task.is_test_set(val) and not allow:
            raise SelectionError(f"eval.select=val_avg would pick checkpoints on {val.name!r}, a test set; "
                                 f"give a validation set (eval.val_dataset / --val-dataset) or allow it explicitly "
                                 f"(eval.allow_test_selection / --allow-test-selection)")
    skipped = {}
    if rule == "last":   # the newest intact one
        while ckpts and (why := _failed_check(ckpts[-1], policies)) is not None:
            skipped[str(checkpoint_step(ckpts[-1]))] = why
            ckpts = ckpts[:-1]
    else:
        for c in list(ckpts):
            if (why := _failed_check(c, policies)) is not None:
                skipped[str(checkpoint_step(c))] = why
                ckpts.remove(c)
    if not ckpts:
        raise CheckpointError(f"{Path(run_dir) / 'checkpoints'}: no intact checkpoint to evaluate "
                              f"(failed: {skipped})")
    steps = [checkpoint_step(c) for c in ckpts]
    extra = {"skipped": skipped} if skipped else {}
    if rule == "last":
        return {m: (ckpts[-1], {"rule": "last", "candidates": steps, **extra}) for m in policies}
    scores: dict = {m: {} for m in policies}
    for ckpt, step in zip(ckpts, steps):
        for m, pol in policies.items():
            load_weights(pol, ckpt)
            engines[m].sync_weights()
            rec = score_benchmark(pol, engines[m], val, k, greedy=k == 0, temperature=temperature,
                                  max_new_tokens=max_new_tokens, seed=seed)
            scores[m][step] = rec["avg"]
            if log:
                log(f"select {m}  step {step}  {val.name} avg@{k} {fmt_score(rec['avg'])}")
    out = {}
    for m in policies:
        best = max(steps, key=lambda s: (scores[m][s], s))
        out[m] = (ckpts[steps.index(best)],
                  {"rule": "val_avg", "dataset": val.name, "dataset_hash": val.hash,
                   "n_items": len(val.prompts), "k": k, "candidates": steps,
                   "scores": {str(s): scores[m][s] for s in steps}, "selected_step": best, **extra})
    return out


def _failed_check(ckpt, policies: dict) -> Optional[str]:
    """None if ``ckpt`` holds intact weights of ``policies``' models (``check_weights``), else the reason (warned)."""
    try:
        check_weights(ckpt, list(policies))
        return None
    except CheckpointError as e:
        log_.warning("skipping checkpoint %s: %s", ckpt, e)
        return str(e)
