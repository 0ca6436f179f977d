"""Tensors for the update: a learner's TrainRows padded into minibatches (built where the model lives).

Layout: [left-padded prompt | right-padded response], so every row's response occupies the last
``R`` columns (``graftzoo.training.models.policy`` computes positions as ``cumsum(mask) - 1``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Optional

import torch

from graftzoo.contract.types import ROLES, TrainRow

ROLE_ID = {role: i for i, role in enumerate(ROLES)}
OWN, PEER, AUX = (ROLE_ID[r] for r in ROLES)


def pad_pairs(prompts: list, responses: list, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(input_ids [B, P+R], attention_mask [B, P+R], R)`` for token-id lists of prompts and responses."""
    P = max(len(p) for p in prompts)
    R = max(1, max(len(r) for r in responses))
    ids, att = [], []
    for p, r in zip(prompts, responses):  # padded as Python lists, converted once
        ids.append([pad_id] * (P - len(p)) + list(p) + list(r) + [pad_id] * (R - len(r)))
        att.append([0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (R - len(r)))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(att, dtype=torch.long), R


def micro_split(lengths: list, budget) -> list:
    """Indices into ``lengths`` (each row's prompt + response tokens) grouped into micro-batches whose padded size
    (rows x longest row) stays within ``budget`` tokens: rows sorted by length, longest first, packed greedily, so
    rows of similar length share a micro-batch and little is padding. A row longer than the budget is a micro-batch
    of its own (a row is never cut). ``budget`` None: one micro-batch holding every row, in order."""
    if budget is None or not lengths:
        return [list(range(len(lengths)))] if lengths else []
    out, cur, widest = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        width = max(widest, lengths[i])
        if cur and (len(cur) + 1) * width > budget:
            out.append(cur)
            cur, width = [], lengths[i]
        cur.append(i)
        widest = width
    out.append(cur)
    return out


class ByRole:
    """Row masks of a batch whose ``role`` tensor ([B] long) holds each row's ``ROLE_ID``."""

    role: torch.Tensor

    @property
    def is_peer(self) -> torch.Tensor:
        return self.role == PEER

    @property
    def is_aux(self) -> torch.Tensor:
        return self.role == AUX


@dataclass
class MiniBatch(ByRole):
    input_ids: torch.Tensor         # [B, P+R]: left-padded prompt | right-padded response
    attention_mask: torch.Tensor    # [B, P+R]
    resp_len: int                   # R
    old_logp: torch.Tensor          # [B, R] log-probs the ratio is taken against (theta_old)
    loss_mask: torch.Tensor         # [B, R] per-token loss weights
    kl_mask: torch.Tensor           # [B, R]
    advantages: torch.Tensor        # [B]
    weights: torch.Tensor           # [B] per-sequence weights (GRAFT w_i; 1 for own)
    role: torch.Tensor              # [B] long: ROLE_ID of own | peer | aux
    slot: torch.Tensor              # [B] group slot index
    origin_mean_logp: torch.Tensor  # [B] the peer's l_P of a localized response (0 elsewhere)
    given_old: torch.Tensor         # [B] bool: old_logp is a given ratio base, not theta_old
    rows: list
    # a micro-batch's share of its minibatch: the denominators of the minibatch's aggregated loss terms
    # (graftzoo.training.models.loss.denominators), so that the micro-batch losses add up to the minibatch loss; None for a whole minibatch
    norm: Optional[dict] = None
    # the loss's factor: 0 for the stand-in pass of a worker rank holding fewer micro-batches than the others
    # (it runs the forward and backward the group's collectives need, and adds nothing)
    scale: float = 1.0
    # rows decoded by an older policy than theta_old (rollout.max_staleness): [B, R] their behaviour log-probs and [B]
    # bool which rows they are (graftzoo.training.models.loss weighs their tokens); None when the minibatch has none
    behaviour_logp: Optional[torch.Tensor] = None
    stale: Optional[torch.Tensor] = None

    def __len__(self):
        return self.input_ids.shape[0]

    def tensors_only(self, scale: float = 1.0) -> "MiniBatch":
        """A copy without ``rows`` (the Rollouts behind them), to send to a worker process."""
        return MiniBatch(**{**{f.name: getattr(self, f.name) for f in fields(self)}, "rows": [], "scale": scale})

    def to(self, device) -> "MiniBatch":
        """The tensors on ``device`` (the policy's); rows stay as they are."""
        if self.input_ids.device == torch.device(device):
            return self
        return MiniBatch(**{f.name: (v.to(device) if isinstance(v, torch.Tensor) else v)
                            for f in fields(self) for v in [getattr(self, f.name)]})


@dataclass
class TrainBatch:
    """Own groups and admitted peer groups, flattened to rows; slot order = group order."""

    rows: list
    groups: list
    pad_id: int = 0

    def __len__(self):
        return len(self.rows)

    def micro_batches(self, idx, budget, norms: Optional[Callable[[MiniBatch], dict]] = None) -> list:
        """The minibatch of rows ``idx`` as micro-batches of at most ``budget`` padded tokens (``micro_split``), each
        carrying ``norms(minibatch)``: the whole minibatch's loss denominators (graftzoo.training.models.loss), so that their
        losses add up to the minibatch's. The minibatch itself when it fits."""
        whole = self.minibatch(idx)
        groups = micro_split([len(self.rows[i].prompt_ids) + len(self.rows[i].response_ids) for i in idx], budget)
        if len(groups) <= 1:
            return [whole]
        norm = norms(whole) if norms is not None else None
        out = []
        for g in groups:
            mb = self.minibatch([idx[j] for j in sorted(g)])
            mb.norm = norm
            out.append(mb)
        return out

    def minibatch(self, idx) -> MiniBatch:
        rows: list[TrainRow] = [self.rows[i] for i in idx]
        input_ids, attention_mask, R = pad_pairs([r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                                 self.pad_id)
        stale = [r.behaviour_logp is not None for r in rows]
        per_token = {"old_logp": [], "loss_mask": [], "kl_mask": [], **({"behaviour_logp": []} if any(stale) else {})}
        for r in rows:
            n = len(r.response_ids)
            for name, out in per_token.items():
                seq = getattr(r, name)
                if seq is None:  # a fresh row among stale ones: its own theta_old (weight 1 regardless)
                    seq = r.old_logp
                if n and len(seq) != n:
                    raise ValueError(f"train row (slot {r.slot}): {name} has {len(seq)} entries "
                                     f"for {n} response tokens")
                out.append(list(seq[:n]) + [0.0] * (R - n))

        def f32(values):
            return torch.tensor(values, dtype=torch.float32)

        mb = MiniBatch(input_ids, attention_mask, R, f32(per_token["old_logp"]), f32(per_token["loss_mask"]),
                       f32(per_token["kl_mask"]), f32([r.advantage for r in rows]), f32([r.weight for r in rows]),
                       torch.tensor([ROLE_ID[r.role] for r in rows], dtype=torch.long),
                       torch.tensor([r.slot for r in rows], dtype=torch.long),
                       f32([r.origin_mean_logp or 0.0 for r in rows]),
                       torch.tensor([r.given_old_logp for r in rows], dtype=torch.bool), rows)
        if any(stale):
            mb.behaviour_logp, mb.stale = f32(per_token["behaviour_logp"]), torch.tensor(stale, dtype=torch.bool)
        return mb
