"""Tensors for the update: a learner's TrainRows padded into minibatches (built where the model lives).

Layout: [left-padded prompt | right-padded response], so every row's response occupies the last
``R`` columns (``graftzoo.core.policy`` computes positions as ``cumsum(mask) - 1``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from graftzoo.core.types import ROLES, TrainRow

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


@dataclass
class MiniBatch:
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

    def __len__(self):
        return self.input_ids.shape[0]

    @property
    def is_peer(self) -> torch.Tensor:
        return self.role == PEER

    @property
    def is_aux(self) -> torch.Tensor:
        return self.role == AUX

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

    def minibatch(self, idx) -> MiniBatch:
        rows: list[TrainRow] = [self.rows[i] for i in idx]
        input_ids, attention_mask, R = pad_pairs([r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                                 self.pad_id)
        per_token = {"old_logp": [], "loss_mask": [], "kl_mask": []}
        for r in rows:
            n = len(r.response_ids)
            for name, out in per_token.items():
                seq = getattr(r, name)
                if n and len(seq) != n:
                    raise ValueError(f"train row (slot {r.slot}): {name} has {len(seq)} entries "
                                     f"for {n} response tokens")
                out.append(list(seq[:n]) + [0.0] * (R - n))

        def f32(values):
            return torch.tensor(values, dtype=torch.float32)

        return MiniBatch(input_ids, attention_mask, R, f32(per_token["old_logp"]), f32(per_token["loss_mask"]),
                         f32(per_token["kl_mask"]), f32([r.advantage for r in rows]), f32([r.weight for r in rows]),
                         torch.tensor([ROLE_ID[r.role] for r in rows], dtype=torch.long),
                         torch.tensor([r.slot for r in rows], dtype=torch.long),
                         f32([r.origin_mean_logp or 0.0 for r in rows]),
                         torch.tensor([r.given_old_logp for r in rows], dtype=torch.bool), rows)
