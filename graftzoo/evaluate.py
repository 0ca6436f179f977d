"""Evaluate a policy on a prompt set: greedy accuracy, avg@k and unbiased pass@k, per skill/source.

Each of the k samples per problem uses its own seed (``seed + j``) so sample j is reproducible.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from graftzoo.eval.metrics import mean_sd_ci, pass_at_k


def _correct(env, groups) -> list:
    env.score_groups(groups)
    return [[bool(r.correct) for r in g.rollouts] for g in groups]


def evaluate_policy(policy, engine, prompts, env, k: int = 1, greedy: bool = True, temperature: float = 1.0,
                    max_new_tokens=None, seed: int = 0, group_key: str = "skill") -> dict:
    """Scores of ``policy`` on ``prompts`` (a list of Prompt)."""
    prompts = list(prompts)
    out: dict = {"n_items": len(prompts), "k": int(k)}
    keys = [str(p.metadata.get(group_key, p.source or "all")) for p in prompts]

    def by_key(values):
        acc = defaultdict(list)
        for key, v in zip(keys, values):
            acc[key].append(v)
        return {key: sum(v) / len(v) for key, v in sorted(acc.items())}

    if greedy:
        groups = engine.generate(prompts, 1, greedy=True, max_new_tokens=max_new_tokens)
        corr = [c[0] for c in _correct(env, groups)]
        out["greedy"] = sum(corr) / max(1, len(corr))
        out["greedy_by"] = by_key([float(c) for c in corr])
    if k > 0:
        per_sample = []  # [k][items]
        for j in range(k):
            torch.manual_seed(seed * 1000 + j)
            groups = engine.generate(prompts, 1, temperature=temperature, max_new_tokens=max_new_tokens)
            per_sample.append([c[0] for c in _correct(env, groups)])
        per_item_c = [sum(per_sample[j][i] for j in range(k)) for i in range(len(prompts))]
        runs = [sum(s) / max(1, len(s)) for s in per_sample]
        mean, sd, lo, hi = mean_sd_ci(runs) if len(runs) > 1 else (runs[0], 0.0, runs[0], runs[0])
        out.update({"avg": mean, "sd": sd, "ci": [lo, hi], "per_seed_run": runs,
                    "avg_by": by_key([c / k for c in per_item_c]),
                    "pass_at_k": {str(kk): sum(pass_at_k(k, c, kk) for c in per_item_c) / max(1, len(prompts))
                                  for kk in sorted({1, k})},
                    "pass_at_k_by": by_key([pass_at_k(k, c, k) for c in per_item_c])})
    if "avg" not in out:
        out["avg"] = out.get("greedy", 0.0)
    return out
