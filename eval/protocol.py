"""The evaluation protocol (docs/algorithms.md#evaluation-metrics): how one prompt set is scored.

An *evaluation run* draws k samples per problem; sample j of run r is drawn under its own torch
seed ``sample_seed(seed, r, j)``, so any sample is reproducible on its own. ``summarize`` turns
the correctness of every sample into avg@k, its spread and pass@k; ``score_benchmark`` is the
record of one loaded benchmark (``graftzoo.envs.task.Benchmark``), optionally with per-group
scores (``group_by``: a prompt metadata field, else the prompt's source; e.g. the arithmetic skill).
Every evaluation (``graftzoo eval``, the trainer's, checkpoint selection) scores through it.
"""
from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Optional, Sequence

import torch

from graftzoo.contract.errors import ConfigError
from graftzoo.eval.metrics import BOOTSTRAP_RESAMPLES, bootstrap_ci, mean_sd_ci, pass_at_k

CI_METHOD = f"95% percentile bootstrap over prompts ({BOOTSTRAP_RESAMPLES} resamples)"


def sample_seed(seed: int, run: int, j: int) -> int:
    """The torch seed of sample ``j`` of evaluation run ``run`` (distinct per (seed, run, j))."""
    return random.Random(f"eval:{seed}:{run}:{j}").randrange(2**31)


def _correct(env, groups) -> list:
    return [[bool(r.correct) for r in g.rollouts] for g in env.score_groups(groups)]


def greedy_correctness(engine, env, prompts, max_new_tokens=None) -> list:
    """One greedy response per prompt; its correctness, in prompt order."""
    groups = engine.generate(list(prompts), 1, greedy=True, max_new_tokens=max_new_tokens)
    return [c[0] for c in _correct(env, groups)]


def sample_correctness(engine, env, prompts, k: int, *, seed: int = 0, runs: int = 1,
                       temperature: Optional[float] = None, max_new_tokens=None) -> list:
    """``out[r][j][i]``: is sample j of run r on prompt i correct (sampled at ``temperature``)."""
    prompts = list(prompts)
    out = []
    for r in range(runs):
        per_run = []
        for j in range(k):
            torch.manual_seed(sample_seed(seed, r, j))
            groups = engine.generate(prompts, 1, temperature=temperature, max_new_tokens=max_new_tokens)
            per_run.append([c[0] for c in _correct(env, groups)])
        out.append(per_run)
    return out


def _nan_to_none(x: float) -> Optional[float]:
    return None if x is None or math.isnan(x) else x


def _item_counts(correct: Sequence) -> list:
    """Correct samples of each item over every run and sample of ``correct[r][j][i]``."""
    runs, k = len(correct), len(correct[0])
    return [sum(correct[r][j][i] for r in range(runs) for j in range(k)) for i in range(len(correct[0][0]))]


def summarize(correct: Sequence) -> dict:
    """Scores from ``correct[r][j][i]`` (runs x k samples x items; docs/algorithms.md#evaluation-metrics).

    - ``avg``: avg@k over every sample of every run (= the mean of the runs' avg@k);
    - ``per_seed_run``: one score per evaluation run (its avg@k) when there are several runs; with
      a single run, one score per sample seed j (its avg@1); ``spread_over`` says which;
    - ``sd``: sample sd of ``per_seed_run`` (None with one value);
    - ``ci``: 95% percentile bootstrap interval of avg@k over the items (each item's accuracy over
      its samples, items drawn with replacement; ``bootstrap_ci``), inside [0, 1]; None with one
      item; ``ci_method`` says so;
    - ``pass_at_k``: unbiased pass@k over the n = runs*k samples of each item, for k in {1, k, n}.
    """
    runs = len(correct)
    k = len(correct[0]) if runs else 0
    items = len(correct[0][0]) if k else 0
    if runs == 0 or k == 0 or items == 0:
        raise ValueError(f"summarize: need at least one run, sample and item (got {runs}, {k}, {items})")
    if runs > 1:
        per_seed = [sum(map(sum, run)) / (k * items) for run in correct]
    else:
        per_seed = [sum(sample) / items for sample in correct[0]]
    _, sd, _, _ = mean_sd_ci(per_seed)
    n = runs * k
    counts = _item_counts(correct)
    ci = list(bootstrap_ci([c / n for c in counts])) if items > 1 else None
    return {"avg": sum(counts) / (n * items), "sd": _nan_to_none(sd),
            "ci": ci, "ci_method": CI_METHOD, "per_seed_run": per_seed,
            "spread_over": "runs" if runs > 1 else "samples", "k": k, "seeds": runs, "n_items": items,
            "pass_at_k": {str(kk): sum(pass_at_k(n, c, kk) for c in counts) / items for kk in sorted({1, k, n})}}


def group_of(prompt, field: str) -> str:
    """The group of a prompt: its metadata ``field``, else its source, else ``"all"``."""
    return str(prompt.metadata.get(field, prompt.source or "all"))


def group_scores(keys: Sequence[str], correct: Optional[Sequence] = None,
                 greedy: Optional[Sequence] = None) -> dict:
    """Per group (``keys[i]``: the group of item i; sorted): ``avg`` (avg@k), ``k``, ``n_items``,
    ``greedy`` and ``pass_at_k`` at k, from the samples ``correct[r][j][i]`` and/or the greedy
    correctness ``greedy[i]`` (without samples, ``avg`` is the greedy accuracy, k = 0)."""
    members = defaultdict(list)
    for i, key in enumerate(keys):
        members[key].append(i)
    counts = _item_counts(correct) if correct is not None else None
    out = {}
    for key, items in sorted(members.items()):
        rec: dict = {}
        if counts is not None:
            k, n = len(correct[0]), len(correct) * len(correct[0])
            rec.update(avg=sum(counts[i] / n for i in items) / len(items), k=k)
        rec["n_items"] = len(items)
        if greedy is not None:
            rec["greedy"] = sum(float(greedy[i]) for i in items) / len(items)
        if counts is not None:
            rec["pass_at_k"] = {str(k): sum(pass_at_k(n, counts[i], k) for i in items) / len(items)}
        else:
            rec.update(avg=rec["greedy"], k=0, pass_at_k={"1": rec["greedy"]})
        out[key] = rec
    return out


def prompts_within(policy, prompts) -> tuple[list, int]:
    """The prompts whose rendering (``policy.encode_prompt``) is within the policy's ``max_prompt_tokens``, and how
    many are not: those are left out of an evaluation and counted (``prompts_too_long``), never cut."""
    kept = [p for p in prompts if len(policy.encode_prompt(p)) <= policy.max_prompt_tokens]
    return kept, len(prompts) - len(kept)


def score_benchmark(policy, engine, bench, k: int, *, seeds: int = 1, greedy: bool = False,
                    temperature: Optional[float] = None, max_new_tokens: Optional[int] = None,
                    seed: int = 0, group_by: Optional[str] = None) -> dict:
    """One benchmark record (eval artifact format) of ``policy`` (generating with ``engine``) on a
    loaded benchmark: ``summarize`` of ``seeds`` runs of ``k`` samples, plus greedy accuracy when
    ``greedy``, plus ``groups`` (``group_scores``) when ``group_by`` names a prompt field. Prompts over the
    policy's prompt limit are left out and counted (``prompts_too_long``; ``prompts_within``); a benchmark of which
    none is within it is a ``ConfigError`` (no score to give)."""
    prompts, env = bench.prompts, bench.env
    if not prompts:
        raise ValueError(f"benchmark {bench.name!r} has no prompts to evaluate")
    prompts, too_long = prompts_within(policy, prompts)
    if not prompts:
        raise ConfigError(f"benchmark {bench.name!r}: none of its {too_long} prompts is within model "
                          f"{policy.model_id!r}'s prompt limit of {policy.max_prompt_tokens} tokens "
                          f"(rollout.max_prompt_tokens, less max_new_tokens where the context window needs it; "
                          f"prompts are left out, never cut)")
    rec: dict = {}
    correct = corr = None
    if k > 0:
        correct = sample_correctness(engine, env, prompts, k, seed=seed, runs=seeds, temperature=temperature,
                                     max_new_tokens=max_new_tokens)
        rec.update(summarize(correct))
    if greedy:
        corr = greedy_correctness(engine, env, prompts, max_new_tokens)
        rec["greedy"] = sum(corr) / len(corr)
        if k == 0:
            rec.update({"avg": rec["greedy"], "sd": None, "per_seed_run": [rec["greedy"]], "ci_method": CI_METHOD,
                        "ci": list(bootstrap_ci([float(c) for c in corr])) if len(corr) > 1 else None,
                        "k": 0, "seeds": 0, "n_items": len(prompts), "pass_at_k": {"1": rec["greedy"]}})
    if not rec:
        raise ValueError("nothing to evaluate: k = 0 and greedy is off")
    rec["dataset"] = bench.dataset
    rec["prompts_too_long"] = too_long
    if group_by:
        rec["groups"] = group_scores([group_of(p, group_by) for p in prompts], correct, corr)
    return rec
