"""The ExTra learner: the algorithm, its section and its metrics are graftzoo.algos.extra."""
from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict, deque
from typing import Optional

import torch
from torch.nn.utils.rnn import pad_sequence

from graftzoo.algos.advantages import AdvantageInputs, register_estimator
from graftzoo.algos.base import Learner
from graftzoo.algos.functional import group_advantages
from graftzoo.algos.extra.formulas import (extra_advantages, extra_option_a_scores, is_hard_prompt,
                                           most_confident_rollout, novelty_scores, prefix_cut_points,
                                           prefix_entropy_scores, reward_variance_ema, select_prefix)
from graftzoo.algos.extra.embedders import make_embedder
from graftzoo.algos.extra import (EXTRA_BONUS_MEAN, EXTRA_GUIDED_ACC, EXTRA_GUIDED_PROMPTS, EXTRA_HARD_PROMPTS,
                                  EXTRA_NOVELTY_MEAN, EXTRA_NOVELTY_WARM_FRAC, EXTRA_PREFIXES_ENQUEUED,
                                  EXTRA_QUEUE_LEN, ExTraConfig)
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.registry import register_algo
from graftzoo.contract.types import Prompt

NEWLINES = ("\n", "\n\n")
SCAN_IDS = 1000  # vocabulary ids scanned for tokens that decode to a cut string (docs/algorithms.md#extra-prefix-regeneration)
ENTROPY_BATCH = 64


@register_estimator("extra")
def extra_estimator(x: AdvantageInputs, cfg: ExTraConfig) -> torch.Tensor:
    """GRPO's advantage with ExTra's novelty bonus for correct responses (docs/algorithms.md#extra-novelty-bonus):
    Option B after the normalisation (``novelty_mode: after_norm``), or Option A's scores normalized as GRPO's."""
    if cfg.novelty_mode == "after_norm":
        return extra_advantages(x.rewards, x.correct, x.index, x.extra["novelty"], cfg.novelty_alpha, cfg.adv_eps)
    scores = extra_option_a_scores(x.rewards, x.correct, x.index, x.extra["novelty"], x.extra["ema"],
                                   cfg.novelty_alpha, cfg.novelty_lambda)
    return group_advantages(scores, x.index, eps=cfg.adv_eps)


def _new_entry() -> dict:
    return {"emb": None, "ema": None, "prefixes": []}


@register_algo("extra")
class ExTra(Learner):
    Config = ExTraConfig

    def __init__(self, cfg: ExTraConfig, run: LearnerFacts):
        super().__init__(cfg, run)
        # run.device auto: the embedder's own choice (sentence-transformers: cuda when visible), as the trainer's
        self.embedder = make_embedder(cfg.embedder, device=None if run.device == "auto" else run.device)
        self.memory: OrderedDict = OrderedDict()   # prompt id -> {"emb": [M, d], "ema": float, "prefixes": [...]}
        self.queue: deque = deque(maxlen=cfg.queue_size)  # (guided Prompt, prefix token ids)
        self._cuts: Optional[tuple] = None

    @property
    def collect_reads_policy(self) -> bool:
        """Prefix regeneration scores the hard prompts' rollouts under the training model inside ``collect``."""
        return bool(self.cfg.prefix_regen)

    # ---- memories ------------------------------------------------------------------------
    def _entry(self, key: str) -> dict:
        if key not in self.memory:
            self.memory[key] = _new_entry()
        self.memory.move_to_end(key)
        while len(self.memory) > self.cfg.memory_prompts:
            self.memory.popitem(last=False)
        return self.memory[key]

    # ---- collect: guided prompts in, prefixes mined out ------------------------------------
    def collect(self, ctx, prompts):
        c = self.cfg
        active = c.prefix_regen and ctx.step + 1 > c.regen_warmup_steps
        prompts = list(prompts)
        prefixes = [[] for _ in prompts]
        k = min(c.regen_batch_size, len(self.queue), len(prompts)) if active else 0
        for j in range(len(prompts) - k, len(prompts)):
            prompts[j], prefixes[j] = self.queue.popleft()
        groups = ctx.score(ctx.generate(prompts, [ctx.n] * len(prompts), prefixes=prefixes if k else None))
        ctx.log(EXTRA_GUIDED_PROMPTS, k)
        if k:
            guided = [r for g in groups[len(groups) - k:] for r in g.rollouts]
            ctx.log(EXTRA_GUIDED_ACC, sum(r.correct for r in guided) / max(1, len(guided)))
        if active:
            self._mine(ctx, groups)
        ctx.log(EXTRA_QUEUE_LEN, len(self.queue))
        return groups

    def _cut_ids(self, policy) -> tuple:
        """(newline token ids, fallback cut token ids) of the policy's tokenizer (docs/algorithms.md#extra-prefix-regeneration)."""
        if self._cuts is None:
            chars = tuple(self.cfg.fallback_cut_chars)
            self._cuts = (policy.token_ids_decoding_to(NEWLINES, scan=SCAN_IDS),
                          policy.token_ids_decoding_to(chars, strip=True, scan=SCAN_IDS) if chars else set())
        return self._cuts

    def _mine(self, ctx, groups):
        """Hard prompts -> most confident rollout -> prefixes -> prefix memory -> queue (docs/algorithms.md#extra-prefix-regeneration)."""
        c = self.cfg
        pooled: dict = {}
        for g in groups:
            pooled.setdefault(g.prompt.id, (g.prompt, []))[1].extend(g.rollouts)
        hard = [(p, rs) for p, rs in pooled.values()
                if rs and is_hard_prompt(sum(r.correct for r in rs), len(rs), c.hard_pass_rate)]
        ctx.log(EXTRA_HARD_PROMPTS, len(hard))
        if not hard:
            return
        newline, fallback = self._cut_ids(ctx.policy)
        rolls = [r for _, rs in hard for r in rs]
        with ctx.phase("logprob"):  # token entropies under theta_old (docs/algorithms.md#extra-prefix-regeneration, "old-log-prob pass")
            _, ents = ctx.policy.score_sequences([r.prompt_token_ids for r in rolls], [r.token_ids for r in rolls],
                                                 with_entropy=True, chunk=ENTROPY_BATCH)
        pos, queued = 0, 0
        for prompt, rs in hard:
            sampled = [e[r.prefix_len:] for e, r in zip(ents[pos:pos + len(rs)], rs)]
            pos += len(rs)
            best = most_confident_rollout(pad_sequence(sampled, batch_first=True),
                                          pad_sequence([torch.ones(len(e)) for e in sampled], batch_first=True))
            if best is None:
                continue
            r = rs[best]
            body = r.token_ids[r.prefix_len:]
            cuts = (prefix_cut_points(body, newline, c.prefix_min_gap, c.max_prefixes)
                    or prefix_cut_points(body, fallback, c.prefix_min_gap, c.max_prefixes))
            cuts = [b for b in cuts if len(r.prompt_token_ids) + r.prefix_len + b <= ctx.policy.max_prompt_tokens]
            if not cuts:
                continue
            scores = prefix_entropy_scores(sampled[best], cuts).tolist()
            ids = [list(r.token_ids[:r.prefix_len + b]) for b in cuts]
            emb = self.embedder.embed([ctx.policy.decode(x) for x in ids], policy=ctx.policy)
            entry = self._entry(prompt.id)
            entry["prefixes"] = (entry["prefixes"] + list(zip(ids, scores, emb)))[-c.prefix_memory:]
            stored = entry["prefixes"]
            k, _ = select_prefix(torch.tensor([s for _, s, _ in stored]), torch.stack([e for _, _, e in stored]),
                                 c.tau)
            self.queue.append((_guided(prompt, stored[k][0]), stored[k][0]))
            queued += 1
        ctx.log(EXTRA_PREFIXES_ENQUEUED, queued)

    # ---- advantages: the novelty of each response, for the registered estimator "extra" ---------------
    estimator = "extra"

    def advantage_inputs(self, ctx, groups):
        """GRPO's inputs plus each response's novelty against its prompt's memory (``extra["novelty"]``) and, for
        Option A (``novelty_mode: before_norm``), each group's reward-variance EMA (``extra["ema"]``); the memories
        take this step's embeddings."""
        x = super().advantage_inputs(ctx, groups)
        c = self.cfg
        rolls = [r for g in groups for r in g.rollouts]
        texts = [ctx.policy.decode(r.token_ids[r.prefix_len:][-c.embed_tokens:]) for r in rolls]
        emb = self.embedder.embed(texts, policy=ctx.policy)
        nov = torch.zeros(len(rolls), dtype=torch.float64)
        rows_of: dict = {}
        for i, gi in enumerate(x.index.tolist()):
            rows_of.setdefault(groups[gi].prompt.id, []).append(i)
        warm = 0
        for key, rows in rows_of.items():
            entry = self._entry(key)
            e = emb[rows]
            warm += entry["emb"] is not None and entry["emb"].shape[0] >= ctx.n
            nov[rows] = novelty_scores(e, entry["emb"], min_history=ctx.n).double()
            mem = e if entry["emb"] is None else torch.cat([entry["emb"], e])
            entry["emb"] = mem[-c.memory_size:]
            if c.novelty_mode == "before_norm":
                entry["ema"] = reward_variance_ema(entry["ema"], x.rewards[rows].tolist(), c.variance_momentum)
        extra = {"novelty": nov}
        if c.novelty_mode == "before_norm":
            extra["ema"] = torch.tensor([self.memory[g.prompt.id]["ema"] for g in groups], dtype=torch.float64)
        ctx.log(EXTRA_NOVELTY_WARM_FRAC, warm / len(rows_of))
        ctx.log(EXTRA_NOVELTY_MEAN, float(nov[x.correct].mean()) if bool(x.correct.any()) else None)
        ctx.log(EXTRA_BONUS_MEAN, float((c.novelty_alpha * nov * x.correct).mean()))
        return dataclasses.replace(x, extra=extra)

    # ---- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"memory": [(k, {"emb": v["emb"], "ema": v["ema"],
                                "prefixes": [(ids, s, e) for ids, s, e in v["prefixes"]]})
                           for k, v in self.memory.items()],
                "queue": [(dataclasses.asdict(p), ids) for p, ids in self.queue]}

    def load_state_dict(self, state: dict):
        self.memory = OrderedDict((k, {"emb": v["emb"], "ema": v["ema"], "prefixes": list(v["prefixes"])})
                                  for k, v in state.get("memory", []))
        self.queue = deque(((Prompt(**p), ids) for p, ids in state.get("queue", [])), maxlen=self.cfg.queue_size)


def _guided(prompt: Prompt, prefix: list) -> Prompt:
    """The guided prompt: the original problem (and its gold, docs/algorithms.md#extra-prefix-regeneration) under its own id, so that it
    forms its own group with its own memories."""
    origin = prompt.metadata.get("extra_origin", prompt.id)
    digest = hashlib.blake2b(str(list(prefix)).encode(), digest_size=6).hexdigest()
    return Prompt(id=f"{origin}#pre-{digest}", text=prompt.text, gold=prompt.gold, source=prompt.source,
                  metadata={**prompt.metadata, "extra_origin": origin, "extra_prefix_len": len(prefix)})
