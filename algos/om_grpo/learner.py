"""The OM-GRPO learner: the algorithm, its section and its metrics are graftzoo.algos.om_grpo."""
from __future__ import annotations

from dataclasses import replace
import random
from typing import Optional

from graftzoo.algos.base import Learner
from graftzoo.algos.om_grpo.formulas import (answer_span_mask, boxed_spans, contrast_pairs, contrast_prompt,
                                             soft_consensus_rewards)
from graftzoo.envs.verifier import answer_classes, extract_answer
from graftzoo.algos.om_grpo import (OMGRPOConfig, OM_GRPO_ANSWER_DIVERSITY, OM_GRPO_CONTRAST_GENERATED,
                                    OM_GRPO_CONTRAST_SKIPPED_GROUPS, OM_GRPO_CONTRAST_TOKENS, OM_GRPO_FORMAT_RATE,
                                    OM_GRPO_MASKED_TOKEN_FRAC)
from graftzoo.contract.config import LearnerFacts
from graftzoo.contract.registry import register_algo
from graftzoo.contract.types import Prompt

CONTRAST_TEMPLATES = {
    "spec": contrast_prompt,
    # for tiny models: a short context and no English vocabulary
    "compact": lambda problem, a, b: f"{problem}\n{a}\n{b}",
}


def unlabeled(p: Prompt) -> Prompt:
    """A copy of ``p`` without its gold answer and metadata (which may hold a worked solution)."""
    return Prompt(id=p.id, text=p.text, gold=None, source=p.source)


@register_algo("om_grpo")
class OMGRPO(Learner):
    Config = OMGRPOConfig

    def __init__(self, cfg: OMGRPOConfig, run: LearnerFacts):
        super().__init__(cfg, run)
        self._heldout: Optional[list] = None
        self._perms: dict = {}

    # ---- collect ---------------------------------------------------------------------------
    def collect(self, ctx, prompts):
        prompts = self.ttt_prompts(ctx, len(prompts)) if self.cfg.ttt else [unlabeled(p) for p in prompts]
        groups = ctx.generate(prompts, [ctx.n] * len(prompts))
        votes = self.contrast_answers(ctx, groups) if self.cfg.contrast else [[] for _ in groups]
        with ctx.phase("score"):
            self.self_score(ctx, groups, votes)
        self.mask_answers(ctx, groups)
        return groups

    def answer(self, text: str) -> Optional[str]:
        """The final answer of ``text`` in the configured format, None if there is none (r^f = 0)."""
        z, status = extract_answer(text)
        if status != "ok" or (self.cfg.answer_format == "boxed" and not boxed_spans(text)):
            return None
        return z

    def self_score(self, ctx, groups, votes):
        """Soft consensus reward over the answer pool: the groups' own answers plus ``votes[g]``, the CAR
        answers of group g (docs/algorithms.md#om-grpo-consensus-reward). Sets reward, extracted, status of every rollout."""
        c = self.cfg
        timeout = ctx.run.verifier_timeout
        formatted, distinct = 0, 0.0
        for g, extra in zip(groups, votes):
            own = [self.answer(r.text) for r in g.rollouts]
            ids = answer_classes(own + extra, timeout)
            rewards = soft_consensus_rewards(ids[:g.n], ids[g.n:], format_weight=c.format_weight)
            g.rollouts[:] = [replace(r, reward=rew, correct=False, extracted=z,
                                     status="label_free" if z is not None else "no_answer")
                             for r, z, rew in zip(g.rollouts, own, rewards)]
            formatted += sum(z is not None for z in own)
            distinct += len({i for i in ids[:g.n] if i is not None}) / max(1, g.n)
        n = max(1, sum(g.n for g in groups))
        ctx.log(OM_GRPO_FORMAT_RATE, formatted / n)
        ctx.log(OM_GRPO_ANSWER_DIVERSITY, distinct / max(1, len(groups)))
        return groups

    def contrast_answers(self, ctx, groups) -> list:
        """CAR: one short answer per ordered pair of each group's trajectories (docs/algorithms.md#om-grpo-consensus-reward)."""
        c = self.cfg
        pol = ctx.policy
        room = min(pol.max_prompt_tokens, pol.context_window - c.contrast_max_new_tokens)
        asks, owner, skipped = [], [], 0
        for gi, g in enumerate(groups):
            texts = fit_contrast_prompts(pol, g, room, CONTRAST_TEMPLATES[c.contrast_template])
            if texts is None:
                skipped += 1
                continue
            for (i, j), text in texts.items():
                asks.append(Prompt(id=f"{g.prompt.id}#car-{i}-{j}", text=text))
                owner.append(gi)
        ctx.log(OM_GRPO_CONTRAST_SKIPPED_GROUPS, skipped)
        ctx.log(OM_GRPO_CONTRAST_GENERATED, len(asks))
        out = [[] for _ in groups]
        if not asks:
            return out
        with ctx.phase("generate"):
            answered = ctx.engine.generate(asks, 1, temperature=c.contrast_temperature,
                                           max_new_tokens=c.contrast_max_new_tokens)
        for gi, ag in zip(owner, answered):
            out[gi].append(self.answer(ag.rollouts[0].text) if ag.rollouts else None)
        ctx.log(OM_GRPO_CONTRAST_TOKENS, sum(len(r.token_ids) for ag in answered for r in ag.rollouts))
        return out

    # ---- outcome mask ------------------------------------------------------------------------
    def answer_spans(self, text: str, z: Optional[str]) -> list:
        """Character spans of the answer to mask (docs/algorithms.md#om-grpo-answer-mask): the \\boxed{} content(s); for an
        unboxed answer (``answer_format: any``) its last occurrence in the text. None: nothing to mask."""
        if z is None:
            return []
        spans = boxed_spans(text, last_only=not self.cfg.mask_all_boxed)
        if spans:
            return spans
        at = text.rfind(z)
        return [(at, at + len(z))] if at >= 0 else []

    def mask_answers(self, ctx, groups):
        """``Rollout.loss_mask`` (and ``Rollout.kl_mask``) = the outcome mask m^o (docs/algorithms.md#om-grpo-answer-mask)."""
        c = self.cfg
        masked = total = 0
        for g in groups:
            for j, r in enumerate(g.rollouts):
                n = len(r.token_ids)
                body = n - 1 if r.finish_reason == "stop" and n and r.token_ids[-1] == r.eos_id else n
                offsets = ctx.policy.char_offsets(r.token_ids[:body], r.text)
                m = answer_span_mask(offsets, self.answer_spans(r.text, r.extracted), c.answer_grad_scale).tolist()
                m += [1.0] * (n - body)
                g.rollouts[j] = replace(r, loss_mask=m, kl_mask=list(m) if c.mask_kl else [1.0] * n)
                masked += sum(1 for x in m if x < 1.0)
                total += n
        ctx.log(OM_GRPO_MASKED_TOKEN_FRAC, masked / max(1, total))

    # ---- test-time training ---------------------------------------------------------------
    def ttt_prompts(self, ctx, k: int) -> list:
        """The step's ``k`` held-out prompts, gold removed: seeded passes over the evaluation set (docs/algorithms.md#om-grpo-consensus-reward)."""
        if self._heldout is None:
            self._heldout = [unlabeled(p) for p in (ctx.heldout() if ctx.heldout else [])]
            if not self._heldout:
                raise ValueError("algo.ttt: the evaluation set is empty (eval.dataset / eval.size)")
        N = len(self._heldout)
        out = []
        for j in range(k):
            epoch, i = divmod(ctx.step * k + j, N)
            if epoch not in self._perms:
                perm = list(range(N))
                random.Random(f"{ctx.run.seed}:ttt:{epoch}").shuffle(perm)
                self._perms = {epoch: perm}
            out.append(self._heldout[self._perms[epoch][i]])
        return out


def fit_contrast_prompts(policy, group, room: int, template=contrast_prompt) -> Optional[dict]:
    """``{(i, j): contrast prompt text}`` for every ordered pair of the group's trajectories (docs/algorithms.md#om-grpo-consensus-reward), each
    solution cut to its last tokens so that every rendered prompt has at most ``room`` tokens; None if
    the problem alone leaves no room. ``template(problem, solution_a, solution_b)`` writes the text."""
    def render(sol_a, sol_b):
        return template(group.prompt.text, sol_a, sol_b)

    def length(text):
        return len(policy.encode_text(policy.render(Prompt(id="", text=text))))

    ids = [policy.encode_text(r.text) for r in group.rollouts]
    keep = (room - length(render("", ""))) // 2
    while keep >= 1:
        sols = [policy.decode(x[-keep:]) for x in ids]
        texts = {(i, j): render(sols[i], sols[j]) for i, j in contrast_pairs(group.n)}
        over = max((length(t) for t in texts.values()), default=0) - room
        if over <= 0:
            return texts
        keep -= over
    return None
