"""Text embedders for ExTra's novelty reward and prefix smoothing (docs/algorithms.md#extra-novelty-bonus, docs/algorithms.md#extra-prefix-regeneration).

``make_embedder(name)`` returns an object with ``embed(texts, policy=None) -> FloatTensor[N, d]``:

* ``"hashed_ngrams"`` (default): character 1..3-grams hashed into 384 buckets, L2-normalized counts.
  Needs no download, is deterministic across processes (memories survive a checkpoint/resume).
* ``"policy_hidden"``: the policy's last hidden layer, mean-pooled over the text's tokens (needs
  ``policy``; embeddings drift as the policy trains).
* a local directory: a sentence-transformers model saved there (the paper uses
  ``all-MiniLM-L6-v2``). The package is imported only then; it is not a graftzoo dependency.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from graftzoo.algos.extra import EMBEDDERS

BUILTIN = EMBEDDERS  # declared with the section (graftzoo.algos.extra), which checks algo.embedder without torch
_PRIME = 2_147_483_647  # 2^31 - 1: keeps every product of the n-gram hash inside int64


class HashedNgramEmbedder:
    """Bag of hashed character n-grams (n = 1..``max_n``) over the UTF-8 bytes of the text."""

    def __init__(self, dim: int = 384, max_n: int = 3):
        if dim < 1 or max_n < 1:
            raise ValueError(f"hashed_ngrams: dim and max_n must be >= 1, got dim={dim}, max_n={max_n}")
        self.dim, self.max_n = dim, max_n

    def _one(self, text: str) -> torch.Tensor:
        b = torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)
        out = torch.zeros(self.dim, dtype=torch.float32)
        for n in range(1, self.max_n + 1):
            if b.numel() < n:
                break
            h = torch.zeros(b.numel() - n + 1, dtype=torch.int64)
            for q in range(n):
                h = (h * 257 + b[q:b.numel() - n + 1 + q]) % _PRIME
            h = (h + n * 1_000_003) % _PRIME * 48_271 % _PRIME % self.dim
            out += torch.bincount(h, minlength=self.dim).float()
        return out

    def embed(self, texts: Sequence[str], policy=None) -> torch.Tensor:
        if not texts:
            return torch.zeros((0, self.dim))
        return F.normalize(torch.stack([self._one(t) for t in texts]), dim=-1)


class PolicyHiddenEmbedder:
    """Mean-pooled last-layer hidden states of the policy being trained, in chunks of ``batch`` texts."""

    def __init__(self, batch: int = 64):
        self.batch = batch

    def embed(self, texts: Sequence[str], policy=None) -> torch.Tensor:
        if policy is None:
            raise ValueError("embedder 'policy_hidden' needs the policy: call embed(texts, policy=ctx.policy)")
        return policy.mean_hidden(list(texts), batch=self.batch)


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local directory (unit-normalized embeddings)."""

    def __init__(self, path: str, device: Optional[str] = None):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError(f"config key 'algo.embedder' names the model directory {path!r}, which needs the "
                              "'sentence-transformers' package (pip install sentence-transformers); or use a "
                              f"built-in embedder: {' | '.join(BUILTIN)}") from e
        self.model = SentenceTransformer(path, device=device)

    def embed(self, texts: Sequence[str], policy=None) -> torch.Tensor:
        emb = self.model.encode(list(texts), convert_to_tensor=True, normalize_embeddings=True,
                                show_progress_bar=False)
        return emb.float().cpu()


def make_embedder(name: str, device: Optional[str] = None):
    """The embedder named by config key ``algo.embedder`` (see the module docstring)."""
    if name == "hashed_ngrams":
        return HashedNgramEmbedder()
    if name == "policy_hidden":
        return PolicyHiddenEmbedder()
    if isinstance(name, str) and os.path.isdir(name):
        return SentenceTransformerEmbedder(name, device=device)
    raise ValueError(f"config key 'algo.embedder': {name!r} is neither a built-in embedder "
                     f"({' | '.join(BUILTIN)}) nor a local sentence-transformers model directory")
