"""Evaluate a policy on a prompt set: greedy accuracy, avg@k and unbiased pass@k (spec algos_single §1.6).

Sampling protocol: an *evaluation run* draws k samples per problem; sample j of run r is drawn
under its own torch seed ``sample_seed(seed, r, j)``, so any sample is reproducible on its own.
``summarize`` turns the correctness of every sample into avg@k, its spread and pass@k.
"""
from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Optional, Sequence

import torch

from graftzoo.eval.metrics import mean_sd_ci, pass_at_k


def sample_seed(seed: int, run: int, j: int) -> int:
    """The torch seed of sample ``j`` of evaluation run ``run`` (distinct per (seed, run, j))."""
    return random.Random(f"eval:{seed}:{run}:{j}").randrange(2**31)


def _correct(env, groups) -> list:
    env.score_groups(groups)
    return [[bool(r.correct) for r in g.rollouts] for g in groups]


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


def summarize(correct: Sequence) -> dict:
    """Scores from ``correct[r][j][i]`` (runs x k samples x items; spec algos_single §1.6).

    - ``avg``: avg@k over every sample of every run (= the mean of the runs' avg@k);
    - ``per_seed_run``: one score per evaluation run (its avg@k) when there are several runs; with
      a single run, one score per sample seed j (its avg@1); ``spread_over`` says which;
    - ``sd`` / ``ci``: sample sd and 95% t-interval of ``per_seed_run`` (None with one value);
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
    mean, sd, lo, hi = mean_sd_ci(per_seed)
    n = runs * k
    counts = [sum(correct[r][j][i] for r in range(runs) for j in range(k)) for i in range(items)]
    return {"avg": sum(counts) / (n * items), "sd": _nan_to_none(sd),
            "ci": None if math.isnan(lo) else [lo, hi], "per_seed_run": per_seed,
            "spread_over": "runs" if runs > 1 else "samples", "k": k, "seeds": runs, "n_items": items,
            "pass_at_k": {str(kk): sum(pass_at_k(n, c, kk) for c in counts) / items for kk in sorted({1, k, n})}}


def evaluate_policy(policy, engine, prompts, env, k: int = 1, greedy: bool = True, temperature: float = 1.0,
                    max_new_tokens=None, seed: int = 0, group_key: str = "skill") -> dict:
    """Scores of ``policy`` on ``prompts`` (a list of Prompt), overall and per ``group_key``
    (the prompt's metadata field, else its source): ``summarize`` of k samples per prompt, plus
    greedy accuracy when ``greedy``."""
    prompts = list(prompts)
    out: dict = {"n_items": len(prompts), "k": int(k)}
    keys = [str(p.metadata.get(group_key, p.source or "all")) for p in prompts]

    def by_key(values):
        acc = defaultdict(list)
        for key, v in zip(keys, values):
            acc[key].append(v)
        return {key: sum(v) / len(v) for key, v in sorted(acc.items())}

    if greedy:
        corr = greedy_correctness(engine, env, prompts, max_new_tokens)
        out["greedy"] = sum(corr) / max(1, len(corr))
        out["greedy_by"] = by_key([float(c) for c in corr])
    if k > 0:
        correct = sample_correctness(engine, env, prompts, k, seed=seed, temperature=temperature,
                                     max_new_tokens=max_new_tokens)
        s = summarize(correct)
        out.update({key: s[key] for key in ("avg", "sd", "ci", "per_seed_run", "pass_at_k")})
        per_item_c = [sum(sample[i] for sample in correct[0]) for i in range(len(prompts))]
        out["avg_by"] = by_key([c / k for c in per_item_c])
        out["pass_at_k_by"] = by_key([pass_at_k(k, c, k) for c in per_item_c])
    if "avg" not in out:
        out["avg"] = out.get("greedy", 0.0)
    return out
