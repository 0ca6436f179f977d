"""A model's weights, from its training group to its rollout workers, in memory over a collective
(``ray.rollout_workers``, docs/scaling.md#rollout-workers-apart).

The training group's rank 0 and the model's R rollout workers form a process group of their own (a ``TCPStore`` on
rank 0's node, gloo over it: independent of the training ranks' FSDP2 group, so neither waits on the other). After
each update every training rank walks the whole weights (a sharded group gathers each tensor as the walk reaches it,
``Policy.iter_weights``); rank 0 packs them into buckets and broadcasts each bucket, and every rollout worker unpacks
it into its own copy of the model. Both sides know the weights' layout (names, shapes, dtypes: the same model built
on both sides) and agree on it at start (``signature``), so only the raw values cross. Tensors on a GPU are staged
through host memory (gloo).
"""
from __future__ import annotations

import hashlib
import math
from datetime import timedelta
from typing import Iterable, Optional

import torch
import torch.distributed as dist

BUCKET_BYTES = 64 * 2**20  # one broadcast carries at most this much (a larger tensor goes alone)


def layout_of(weights: Iterable[tuple[str, torch.Tensor]]) -> list:
    """``[(name, shape, dtype name)]`` of the weights, in their order."""
    return [(name, tuple(t.shape), str(t.dtype).replace("torch.", "")) for name, t in weights]


def signature(layout: list) -> str:
    """A short digest of a layout: the two sides of a transfer compare it at start."""
    return hashlib.sha256(repr(layout).encode()).hexdigest()[:16]


def numel(entry: tuple) -> int:
    """Elements of a layout entry's tensor."""
    return math.prod(int(d) for d in entry[1])


def nbytes(entry: tuple) -> int:
    """Bytes of a layout entry's tensor."""
    return numel(entry) * getattr(torch, entry[2]).itemsize


def buckets(layout: list, limit: int = BUCKET_BYTES) -> list:
    """The layout's entries cut into buckets: consecutive entries of one dtype, each bucket at most ``limit`` bytes
    (an entry larger than ``limit`` is a bucket alone); lists of indices into ``layout``."""
    out, cur, size, dtype = [], [], 0, None
    for i, entry in enumerate(layout):
        b = nbytes(entry)
        if cur and (entry[2] != dtype or size + b > limit):
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size, dtype = size + b, entry[2]
    if cur:
        out.append(cur)
    return out


class Transfer:
    """One side of a model's weight transfer group: rank 0 (the training group's rank 0, which hosts the store)
    sends, ranks 1..R (its rollout workers) receive."""

    def __init__(self, host: str, port: int, rank: int, world: int, timeout_s: float):
        timeout = timedelta(seconds=float(timeout_s))
        self.rank, self.world = int(rank), int(world)
        self.store = dist.TCPStore(host, int(port), self.world, is_master=self.rank == 0, timeout=timeout,
                                   wait_for_workers=False)
        self.group = dist.ProcessGroupGloo(self.store, self.rank, self.world, timeout)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], layout: list, limit: int = BUCKET_BYTES) -> int:
        """Broadcast ``weights`` (in ``layout``'s order) bucket by bucket; returns the bytes sent."""
        it, total = iter(weights), 0
        for idx in buckets(layout, limit):
            parts = []
            for i in idx:
                name, t = next(it)
                if name != layout[i][0]:
                    raise RuntimeError(f"weight transfer: got {name!r} where the layout has {layout[i][0]!r}")
                parts.append(t.detach().reshape(-1).cpu())
            flat = torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()
            self.group.broadcast(flat, 0).wait()
            total += flat.numel() * flat.element_size()
        return total

    def receive(self, layout: list, targets: dict, limit: int = BUCKET_BYTES) -> int:
        """Take each bucket of the broadcast and copy its values into ``targets[name]`` (tensors of the layout's
        shapes); returns the bytes received."""
        total = 0
        with torch.no_grad():
            for idx in buckets(layout, limit):
                sizes = [numel(layout[i]) for i in idx]
                flat = torch.empty(sum(sizes), dtype=getattr(torch, layout[idx[0]][2]))
                self.group.broadcast(flat, 0).wait()
                for i, part in zip(idx, torch.split(flat, sizes)):
                    name, shape, _ = layout[i]
                    targets[name].copy_(part.view(shape))
                total += flat.numel() * flat.element_size()
        return total

    def close(self) -> None:
        group, self.group, self.store = self.group, None, None
        if group is not None:
            try:
                group.shutdown()
            except Exception:  # noqa: BLE001 - a peer already gone: nothing left to release
                pass


def drain(weights: Iterable, transfer: Optional[Transfer], layout: list) -> int:
    """A training rank's part of a transfer: rank 0 sends (``transfer``), every other rank walks the weights all the
    same (a sharded group's gathers are collectives)."""
    if transfer is not None:
        return transfer.send(weights, layout)
    for _ in weights:
        pass
    return 0
