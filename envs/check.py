"""Conformance check for a registered environment id (docs/verifier.md, Gymnasium's ``check_env``).

``check_env_id`` runs Gymnasium's checker on the unwrapped env, then our own checks:

- every gold answer, written as ``\\boxed{gold}``, verifies against itself (a gold answer that
  cannot is unreachable reward; each failure is listed with the verifier's status);
- resets with the same seed give the same prompts.

Label-free data (``--kw label_free=true``, a run's ``task.label_free``) is checked too: its unlabelled prompts are
counted and skipped by the gold check, and Gymnasium's checker, whose ``step`` must score a response, runs on the
labelled prompts (it is skipped, and said so, when there is none).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from graftzoo.envs.datasets import LABEL_FREE_HINT, DatasetError, MathDataset
from graftzoo.envs.env import MathReasoningEnv
from graftzoo.envs.verifier import verify_batch


@dataclass
class GoldFailure:
    prompt_id: str
    gold: str
    status: str
    extracted: Any


@dataclass
class CheckReport:
    env_id: str
    kwargs: dict
    dataset: str = ""
    n_prompts: int = 0
    gym_error: str = ""
    gym_skipped: str = ""  # why Gymnasium's checker did not run (every prompt label-free)
    gym_warnings: list = field(default_factory=list)
    gold_checked: int = 0
    gold_failures: list = field(default_factory=list)
    label_free: int = 0
    reset_deterministic: bool = False

    @property
    def ok(self) -> bool:
        return not self.gym_error and not self.gold_failures and self.reset_deterministic

    def __str__(self) -> str:
        gym_check = (f"FAIL: {self.gym_error}" if self.gym_error
                     else f"skipped: {self.gym_skipped}" if self.gym_skipped else "ok")
        lines = [f"env {self.env_id} {self.kwargs or ''}".rstrip(),
                 f"  dataset {self.dataset}: {self.n_prompts} prompts",
                 f"  gymnasium check_env: {gym_check}"]
        lines += [f"    warning: {w}" for w in self.gym_warnings]
        lines.append(f"  reset determinism: {'ok' if self.reset_deterministic else 'FAIL'}")
        lines.append(f"  gold self-verification: {self.gold_checked - len(self.gold_failures)}"
                     f"/{self.gold_checked} ok" + (f" ({self.label_free} label-free skipped)"
                                                   if self.label_free else ""))
        for f in self.gold_failures:
            lines.append(f"    {f.prompt_id}: gold {f.gold!r} -> {f.status} (extracted {f.extracted!r})")
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


def gold_failures(env: MathReasoningEnv) -> tuple[int, list[GoldFailure]]:
    """(number of labelled prompts, those whose ``\\boxed{gold}`` does not verify against gold)."""
    prompts = [p for p in env.dataset if p.gold is not None]
    golds = [p.gold for p in prompts]
    results = verify_batch([f"\\boxed{{{g}}}" for g in golds], golds, timeout=env.verifier_timeout)
    return len(prompts), [GoldFailure(p.id, p.gold, r.status, r.extracted)
                          for p, r in zip(prompts, results) if not r.correct]


def resets_deterministic(env: gym.Env, seeds: tuple = (0, 1, 2), steps: int = 5) -> bool:
    """Reset with each seed, then ``steps`` unseeded resets; twice; the prompt ids must match."""
    def run(seed: int) -> list:
        ids = [env.reset(seed=seed)[1]["prompt_id"]]
        ids += [env.reset()[1]["prompt_id"] for _ in range(steps)]
        return ids
    return all(run(s) == run(s) for s in seeds)


def _gym_check(raw: MathReasoningEnv, report: CheckReport) -> None:
    """Gymnasium's checker on ``raw``; on its labelled prompts only when some have no gold answer (its ``step`` scores
    a response, which needs one)."""
    full = raw.dataset
    labelled = [p for p in full if p.gold is not None]
    if not labelled:
        report.gym_skipped = "every prompt is label-free, and its step() scores against a gold answer"
        return
    if len(labelled) < len(full):
        raw.dataset = MathDataset(full.name, labelled, path=full.path, split=full.split)
    try:
        check_env(raw, skip_render_check=True)
    except Exception as e:  # the checker reports through AssertionError and others
        report.gym_error = f"{type(e).__name__}: {e}"
    finally:
        raw.dataset = full


def check_env_id(env_id: str, **kwargs: Any) -> CheckReport:
    """Make ``env_id`` with ``kwargs`` and run every check; see :class:`CheckReport`."""
    report = CheckReport(env_id=env_id, kwargs=kwargs)
    try:
        env = gym.make(env_id, **kwargs)
    except DatasetError as e:  # here rows without a gold answer are kept by the env's keyword, not a config key
        if LABEL_FREE_HINT not in str(e):
            raise
        raise DatasetError(str(e).replace(LABEL_FREE_HINT, "pass --kw label_free=true to keep unlabelled rows")) \
            from None
    raw = env.unwrapped
    if not isinstance(raw, MathReasoningEnv):
        raise TypeError(f"{env_id} is not a graftzoo MathReasoningEnv (got {type(raw).__name__})")
    report.dataset, report.n_prompts = raw.dataset.name, len(raw.dataset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _gym_check(raw, report)
    report.gym_warnings = [str(w.message) for w in caught]
    report.reset_deterministic = resets_deterministic(raw)
    report.gold_checked, report.gold_failures = gold_failures(raw)
    report.label_free = len(raw.dataset) - report.gold_checked
    env.close()
    return report
