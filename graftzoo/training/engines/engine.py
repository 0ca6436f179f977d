"""Rollout engines. Plain data in (prompts, counts, optional response prefixes), plain data out
(Groups of Rollouts), so a vLLM engine or a Ray actor can stand behind the same interface.

``HFEngine`` (the CPU default) decodes a Hugging Face causal LM with its KV cache in a short loop of
its own rather than through ``generate``, whose per-token bookkeeping costs more than the forward
pass of a tiny model. It samples from softmax(logits / T), optionally cut by top-k / top-p (the
transformers warpers, in generate's order), with the Gumbel-max trick: argmax(scores + Gumbel
noise) is an exact sample of that distribution, and uniform noise is several times cheaper on CPU
than the exponential draws inside ``torch.multinomial``. Only these settings shape sampling; a
model's ``generation_config`` (e.g. a hub ``repetition_penalty``) is not applied, since the
recorded log-probs would no longer be those of the sampling distribution.

Behaviour log-probs are those of the distribution actually sampled: each step's raw logits divided
by the temperature exactly as ``Policy.logprobs`` does, then cut by top-k / top-p and (before
``min_new_tokens``) EOS, and log-softmaxed over what is left (renormalised). With no cut they are
``Policy.logprobs``' values up to the numerics of a KV-cached decode; with a cut they differ from the
training path, so the trainer then recomputes theta_old through it (``rollout.recompute_old_logp``,
graftzoo.training.trainer) and logs the largest difference (``rollout/logp_diff_max``). Greedy decoding
records the log-probs of softmax(logits) (no distribution is sampled).

Stop strings (``Policy.stop_strings``, ``rollout.stop``): a response ends at the token whose decoded text
completes the first occurrence of one. That token is kept, with its log-prob, and so is the stop string in
``text`` (``text`` stays the decoding of the response ids, as it is for every rollout); the rollout's
``finish_reason`` is ``"stop"``, not ``"length"`` (it is not truncated), and its ids do not end in EOS, so
``Rollout.body_ids`` / ``token_count`` count every token and cross-tokenizer exchange appends the learner's
EOS after it (``xt.append_eos_if_stopped``). ``stop_cut`` is the one definition (on the full decoded text);
the decoding loops only use it to stop early: ``HFEngine`` checks the last few tokens of every live row each step.

EOS: a response ends at any of the policy's ``eos_ids`` (the tokenizer's EOS and every EOS id of the model's
generation config); ``min_new_tokens`` masks all of them. A rollout's ``eos_id`` is the one it ended with.

Prompts are never cut: one whose tokens (``Policy.encode_prompt``) are more than the policy's
``max_prompt_tokens`` is a ``PromptTooLongError`` naming it and the limit. Callers drop such prompts first and
count them (the trainer's ``fitting_prompts`` at start-up, ``rollout/prompts_too_long``; evaluation's
``prompts_too_long``).
"""
from __future__ import annotations

from dataclasses import replace
import copy
import inspect
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from transformers.generation import TopKLogitsWarper, TopPLogitsWarper

from graftzoo.training.models.policy import Policy, position_ids_from_mask
from graftzoo.contract.types import Group, Prompt, Rollout
from graftzoo.envs.templates import render_prompt

FIT_MARGIN = 4  # a text longer than FIT_MARGIN * (longest token's characters) * budget cannot fit (normalisers aside)


class EngineError(RuntimeError):
    """A rollout engine cannot start or decode (names the model and the cause)."""


class PromptTooLongError(EngineError):
    """A prompt over the policy's prompt limit reached an engine (prompts are dropped, never cut)."""


class EngineConfigError(EngineError):
    """The engine cannot run a model as configured (``rollout.engine``, ``rollout.vllm.*``): a usage error, the
    message names the setting to change."""


class Engine:
    """Interface: ``generate(prompts, n, prefixes=None, greedy=False) -> list[Group]``, plus the life cycle the
    trainer drives for every engine alike: ``release_memory()`` before an update, ``sync_weights()`` after it
    (seconds taken, logged as ``time/weight_sync``), ``with_sampling(**settings)`` for evaluation, ``close()``.
    ``uses_training_model``: the engine decodes with the training model itself (no copy of its weights)."""

    uses_training_model = False
    decodes_apart = False  # it decodes in a process of its own, so it may generate while the policy updates
    policy = None  # the policy the engine decodes for
    top_p, top_k, min_new_tokens = 1.0, 0, 0  # the sampling cuts (none by default)

    def records_training_logprobs(self, policy) -> bool:
        """Whether the log-probs this engine records are the ones the update's forward computes for ``policy``: it
        decodes with that very model, in float32, from the uncut softmax(logits / T) (no top-p, top-k or
        min_new_tokens). Any other engine, precision or cut records values the update does not reproduce."""
        fp32 = policy.param_dtype == torch.float32 and policy.autocast_dtype is None
        uncut = float(self.top_p) >= 1.0 and not int(self.top_k or 0) and not int(self.min_new_tokens or 0)
        return bool(self.uses_training_model and self.policy is policy and fp32 and uncut)

    def generate(self, prompts: Sequence[Prompt], n: Sequence[int], prefixes=None, greedy: bool = False,
                 temperature: Optional[float] = None, max_new_tokens: Optional[int] = None) -> list:
        raise NotImplementedError

    def seed(self, seed: int) -> None:
        """Seed the generator the engine samples from (torch's, where the engine runs)."""
        torch.manual_seed(seed)

    def release_memory(self) -> None:
        """Free what the engine can give back while the policy updates (nothing by default)."""

    def sync_weights(self) -> float:
        """Make the engine decode with the policy's current parameters; seconds taken."""
        return 0.0

    def with_sampling(self, **settings) -> "Engine":
        """An engine that decodes like this one with other sampling settings (e.g. ``top_p``)."""
        view = copy.copy(self)
        for k, v in settings.items():
            setattr(view, k, v)
        return view

    def close(self) -> None:
        """Release the engine's resources (processes, memory); idempotent."""


def fitting_prompts(prompts: Sequence[Prompt], limits: dict, chunk: int = 512) -> tuple[list, dict]:
    """The prompts whose rendering fits the prompt budget of every model, and per model how many do not.
    ``limits``: model id -> (tokenizer, template, budget in prompt tokens). A problem text longer than
    ``FIT_MARGIN * budget`` times the longest token of the vocabulary (in characters) cannot fit and is dropped
    without being tokenized (a 5 MB problem costs nothing); the others are rendered and tokenized in batches."""
    bad: set = set()
    dropped = {}
    for m, (tok, template, budget) in limits.items():
        widest = max((len(t) for t in tok.get_vocab()), default=1)
        over = {i for i, p in enumerate(prompts) if len(p.text) > FIT_MARGIN * widest * budget}
        rest = [i for i in range(len(prompts)) if i not in over]
        for start in range(0, len(rest), chunk):
            part = rest[start:start + chunk]
            ids = tok([render_prompt(prompts[i].text, template, tok) for i in part],
                      add_special_tokens=False)["input_ids"]
            over.update(i for i, x in zip(part, ids) if len(x) > budget)
        dropped[m] = len(over)
        bad |= over
    return [p for i, p in enumerate(prompts) if i not in bad], dropped


def expand_requests(pol: Policy, prompts: Sequence[Prompt], n, prefixes=None, max_new: Optional[int] = None,
                    window: Optional[int] = None) -> tuple[list, list]:
    """The sequences to decode — (prompt index, prompt ids, given response prefix ids), ``n[i]`` times for prompt i
    (an int: the same n for every prompt) — and one empty ``Group`` per prompt to collect them. A prompt of more
    than ``pol.max_prompt_tokens`` tokens is a ``PromptTooLongError`` naming it and the limit (never cut). With
    ``max_new``, a prompt whose tokens and ``max_new`` do not fit ``window`` (default: the model's context window)
    is an ``EngineError`` naming it."""
    if isinstance(n, int):
        n = [n] * len(prompts)
    rows = []
    limit = int(pol.max_prompt_tokens)
    if max_new is not None and window is None:
        window = pol.context_window
    for i, (p, k) in enumerate(zip(prompts, n)):
        pids = pol.encode_prompt(p)
        if len(pids) > limit:
            raise PromptTooLongError(f"model {pol.model_id!r}: prompt {p.id!r} has {len(pids)} tokens, more than "
                                     f"the prompt limit of {limit} (rollout.max_prompt_tokens, less max_new_tokens "
                                     f"where the context window needs it): prompts are dropped, never cut")
        pre = list(prefixes[i]) if prefixes is not None and prefixes[i] else []
        if max_new is not None and len(pids) + len(pre) + max_new > window:
            raise EngineError(f"model {pol.model_id!r}: prompt {p.id!r} has {len(pids) + len(pre)} tokens, with "
                              f"max_new_tokens {max_new} more than the engine's window of {window} tokens")
        rows += [(i, pids, pre)] * int(k)
    return rows, [Group(prompt=p, model_id=pol.model_id, rollouts=[]) for p in prompts]


def stop_cut(pol: Policy, pre: list, toks: list, stop) -> Optional[int]:
    """How many of the sampled ``toks`` (after the given response prefix ``pre``) to keep: up to and including the
    token whose decoding completes the first occurrence of a ``stop`` string in the response, or None (no stop
    string in it). A stop string inside the given prefix itself does not count."""
    if not stop or not toks:
        return None
    pre = list(pre)
    head = len(pol.decode(pre)) if pre else 0

    def hit(k: int) -> bool:
        text = pol.decode(pre + list(toks[:k]))
        return any(text.find(s, max(0, head - len(s) + 1)) >= 0 for s in stop)

    if not hit(len(toks)):
        return None
    lo, hi = 1, len(toks)  # the smallest k with hit(k): the text only grows with k
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def rollout_from_tokens(pol: Policy, pids: list, pre: list, toks: list, lps: list, version: int,
                        stopped: bool = False) -> Rollout:
    """The Rollout of sampled ``toks`` (with their log-probs ``lps``) after prompt ``pids`` and given response
    prefix ``pre``: cut after the first of the policy's EOS ids (``eos_ids``) or after the token completing a stop
    string (``stop_cut``), both "stop", or kept whole ("length"; "stop" when the engine says it ended them at a stop
    string, ``stopped``); the prefix carries log-prob 0. The rollout's ``eos_id`` is the EOS id it ended with (the
    policy's primary one when it ended otherwise)."""
    toks = list(toks)
    eos = set(pol.eos_ids)
    first = next((j for j, t in enumerate(toks) if t in eos), None)
    if first is not None:
        length, finish = first + 1, "stop"
    else:
        length, finish = len(toks), "stop" if stopped else "length"
    cut = stop_cut(pol, pre, toks[:length], pol.stop_strings)
    if cut is not None:
        length, finish = cut, "stop"
    toks = toks[:length]
    ended = toks[-1] if toks and toks[-1] in eos else None
    body = toks[:-1] if ended is not None else toks
    return Rollout(prompt_id="", model_id=pol.model_id, policy_version=version, text=pol.decode(list(pre) + body),
                   token_ids=list(pre) + toks, logprobs=[0.0] * len(pre) + list(lps[:length]), finish_reason=finish,
                   prompt_token_ids=list(pids), eos_id=pol.eos_id if ended is None else ended, prefix_len=len(pre),
                   tokenizer_id=pol.tokenizer_id)


def _stand_in(pol: Policy) -> tuple:
    """A one-token batch for a rank that has no more rows to decode while others still do (its output unused)."""
    ids = torch.full((1, 1), pol.pad_id, dtype=torch.long, device=pol.device)
    return ids, torch.ones_like(ids)


class HFEngine(Engine):
    uses_training_model = True

    def __init__(self, policy: Policy, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 max_new_tokens: int = 48, gen_batch_size: int = 1024, min_new_tokens: int = 0, **_):
        self.policy = policy
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k or 0)
        self.max_new_tokens = int(max_new_tokens)
        self.gen_batch_size = int(gen_batch_size)
        self.min_new_tokens = int(min_new_tokens)  # EOS is masked out of sampling before this many tokens
        # a sharded model's ranks decoding their own shares: ``group_max(x)`` is the group's largest x (a
        # collective), so that every rank runs as many forward passes as the busiest one (FSDP's gathers match)
        self.group_max = None

    @torch.no_grad()
    def generate(self, prompts, n, prefixes=None, greedy=False, temperature=None, max_new_tokens=None):
        pol = self.policy
        temp = self.temperature if temperature is None else float(temperature)
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        rows, groups = expand_requests(pol, prompts, n, prefixes, max_new)
        chunks = [rows[s:s + self.gen_batch_size] for s in range(0, len(rows), self.gen_batch_size)]
        if self.group_max is not None:  # a rank with fewer chunks than the busiest decodes stand-ins
            chunks += [None] * (int(self.group_max(len(chunks))) - len(chunks))
        was_training = pol.model.training
        pol.model.eval()
        try:
            with pol.compute_weights():  # bf16-mixed: weights, KV cache and attention in bfloat16
                for chunk in chunks:
                    if chunk is None:
                        self._decode(*_stand_in(pol), greedy, temp, max_new, idle=True)
                        continue
                    for (i, pids, pre), ro in zip(chunk, self._generate_rows(chunk, greedy, temp, max_new)):
                        groups[i].rollouts.append(replace(ro, prompt_id=prompts[i].id))
        finally:
            pol.model.train(was_training)
        return groups

    def _generate_rows(self, chunk, greedy, temp, max_new):
        pol = self.policy
        seqs = [pids + pre for _, pids, pre in chunk]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pol.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[r, width - len(s):] = 1
        gen, lp, ends = self._decode(ids.to(pol.device), mask.to(pol.device), greedy, temp, max_new)
        gen, lp = gen.tolist(), lp.tolist()
        return [rollout_from_tokens(pol, pids, pre, gen[r][:ends[r]], lp[r][:ends[r]], pol.version,
                                    stopped=ends[r] is not None)
                for r, (_, pids, pre) in enumerate(chunk)]

    def _all_done(self, done: torch.Tensor) -> bool:
        """Every row has ended — on every rank of the group when the ranks decode their own shares."""
        live = int(not bool(done.all()))
        return (live if self.group_max is None else int(self.group_max(live))) == 0

    def _decode(self, ids, mask, greedy, temp, max_new, idle: bool = False):
        """KV-cached decoding of left-padded ``ids``: (tokens [B, T], behaviour log-probs [B, T], per row the
        length at which a stop string ended it or None).

        Positions are ``cumsum(mask) - 1`` as in ``Policy.logprobs``. A row that emitted an EOS id (any of
        ``Policy.eos_ids``; all of them masked before ``min_new_tokens``) or completed a stop
        string (seen in the decoding of its last few tokens) continues with pad tokens; decoding stops when every
        row has or after ``max_new`` tokens.
        """
        pol = self.policy
        model = pol.model
        scale = 1.0 if greedy else temp
        warpers = []
        if not greedy and self.top_k > 0:
            warpers.append(TopKLogitsWarper(top_k=self.top_k))
        if not greedy and self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=self.top_p))
        params = inspect.signature(model.forward).parameters
        cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
        pos = position_ids_from_mask(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, use_cache=True)
        step = {cache_arg: getattr(out, cache_arg), "use_cache": True}  # the model's own cache, reused
        B = ids.shape[0]
        dev = ids.device
        done = torch.full((B,), idle, dtype=torch.bool, device=dev)  # idle: a stand-in, ended from the start
        one = torch.ones((B, 1), dtype=mask.dtype, device=dev)
        pad = torch.full((B,), pol.pad_id, dtype=torch.long, device=dev)
        eos = torch.tensor(pol.eos_ids, device=dev)
        toks, lps = [], []
        stop = list(pol.stop_strings)
        ends = [None] * B
        window = max((len(s) for s in stop), default=0) + 2  # tokens whose text can hold a stop string just completed
        pos = pos[:, -1:]
        for t in range(max_new):
            logits = out.logits[:, -1, :].float()
            scaled = logits / scale if scale != 1.0 else logits
            scores = scaled
            if t < self.min_new_tokens:
                scores = scores.index_fill(1, eos, float("-inf"))
            for w in warpers:
                scores = w(ids, scores)
            # the sampled distribution, renormalised after the cuts (no cut: softmax(logits / T) itself)
            sampled = scaled if greedy else scores
            if not greedy:  # Gumbel-max: argmax(scores - log(-log U)) ~ softmax(scores)
                scores = scores - torch.rand_like(scores).log_().neg_().log_()
            nxt = torch.where(done, pad, scores.argmax(-1))
            toks.append(nxt)
            lps.append(F.log_softmax(sampled, dim=-1).gather(-1, nxt.unsqueeze(-1)).squeeze(-1))
            done = done | torch.isin(nxt, eos)
            if stop:
                live = (~done).nonzero().flatten().tolist()
                if live:
                    recent = torch.stack(toks[-window:], dim=1)[live].tolist()
                    texts = pol.tokenizer.batch_decode(recent, skip_special_tokens=True,
                                                       clean_up_tokenization_spaces=False)
                    for r, text in zip(live, texts):
                        if any(s in text for s in stop):
                            ends[r] = t + 1
                            done[r] = True
            if t == max_new - 1 or self._all_done(done):
                break
            mask = torch.cat([mask, one], dim=1)
            pos = pos + 1
            out = model(input_ids=nxt.unsqueeze(-1), attention_mask=mask, position_ids=pos, **step)
        if not toks:
            return torch.zeros((B, 0), dtype=torch.long), torch.zeros((B, 0)), ends
        return torch.stack(toks, dim=1), torch.stack(lps, dim=1), ends
