"""Rollout engines. Plain data in (prompts, counts, optional response prefixes), plain data out
(Groups of Rollouts), so a vLLM engine or a Ray actor can stand behind the same interface.

``HFEngine`` uses ``transformers`` generate (the CPU default). Behaviour log-probs are read from the
generation's raw logits, divided by the temperature and log-softmaxed exactly as ``Policy.logprobs``
does, so the first PPO ratio is 1 to numerical precision without an extra forward pass.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from graftzoo.policy import Policy, position_ids_from_mask
from graftzoo.types import Group, Prompt, Rollout


class Engine:
    """Interface: ``generate(prompts, n, prefixes=None, greedy=False) -> list[Group]``."""

    def generate(self, prompts: Sequence[Prompt], n: Sequence[int], prefixes=None, greedy: bool = False,
                 temperature: Optional[float] = None, max_new_tokens: Optional[int] = None) -> list:
        raise NotImplementedError


class HFEngine(Engine):
    def __init__(self, policy: Policy, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 max_new_tokens: int = 48, gen_batch_size: int = 1024, **_):
        self.policy = policy
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k or 0)
        self.max_new_tokens = int(max_new_tokens)
        self.gen_batch_size = int(gen_batch_size)

    @torch.no_grad()
    def generate(self, prompts, n, prefixes=None, greedy=False, temperature=None, max_new_tokens=None):
        pol = self.policy
        temp = self.temperature if temperature is None else float(temperature)
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if isinstance(n, int):
            n = [n] * len(prompts)
        rows = []  # (prompt index, prompt ids, prefix ids)
        for i, (p, k) in enumerate(zip(prompts, n)):
            pids = pol.encode_prompt(p)
            pre = list(prefixes[i]) if prefixes is not None and prefixes[i] else []
            rows += [(i, pids, pre)] * int(k)
        groups = [Group(prompt=p, model_id=pol.model_id, rollouts=[]) for p in prompts]
        was_training = pol.model.training
        pol.model.eval()
        try:
            for start in range(0, len(rows), self.gen_batch_size):
                chunk = rows[start:start + self.gen_batch_size]
                for (i, pids, pre), ro in zip(chunk, self._generate_rows(chunk, greedy, temp, max_new)):
                    ro.prompt_id = prompts[i].id
                    groups[i].rollouts.append(ro)
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
        kwargs = dict(do_sample=not greedy, max_new_tokens=max_new, eos_token_id=pol.eos_id, pad_token_id=pol.pad_id,
                      return_dict_in_generate=True, output_logits=True, use_cache=True)
        if not greedy:
            kwargs.update(temperature=temp, top_k=self.top_k if self.top_k > 0 else None, top_p=self.top_p)
        out = pol.model.generate(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), **kwargs)
        gen = out.sequences[:, width:]
        scale = 1.0 if greedy else temp
        # logits recorded for every generated position: [rows, steps, V]
        logits = torch.stack(out.logits, dim=1).float() / scale
        lp = F.log_softmax(logits, dim=-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        results = []
        for r, (_, pids, pre) in enumerate(chunk):
            toks = gen[r].tolist()
            if pol.eos_id in toks:
                length, finish = toks.index(pol.eos_id) + 1, "stop"
            else:
                length, finish = len(toks), "length"
            toks = toks[:length]
            body = toks[:-1] if finish == "stop" else toks
            results.append(Rollout(
                prompt_id="", model_id=pol.model_id, policy_version=pol.version,
                text=pol.decode(list(pre) + body), token_ids=list(pre) + toks,
                logprobs=[0.0] * len(pre) + lp[r, :length].tolist(), finish_reason=finish,
                prompt_token_ids=list(pids), eos_id=pol.eos_id, prefix_len=len(pre)))
        return results
