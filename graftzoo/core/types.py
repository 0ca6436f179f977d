"""The data that flows through graftzoo (DESIGN.md, "The data that flows").

Text is the lingua franca between models; token ids belong to one tokenizer.
These are plain dataclasses so they cross process / Ray boundaries as plain data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Prompt:
    """One problem. ``gold`` is None for label-free data."""

    id: str
    text: str
    gold: Optional[str] = None
    source: str = ""
    metadata: dict = field(default_factory=dict)


@dataclass
class Rollout:
    """One sampled response, in the generating model's tokenizer.

    ``token_ids`` and ``logprobs`` cover the response only (including the EOS token when the
    model stopped). ``prefix_len`` counts leading response tokens that were given, not sampled
    (ExTra prefix regeneration); they carry no gradient.
    """

    prompt_id: str
    model_id: str
    policy_version: int
    text: str
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" | "length"
    prompt_token_ids: list = field(default_factory=list)
    eos_id: Optional[int] = None
    reward: float = 0.0
    correct: bool = False
    extracted: Optional[str] = None
    status: str = ""
    prefix_len: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def body_ids(self) -> list:
        """Response token ids without the final EOS (what the text decodes from)."""
        ids = list(self.token_ids)
        if self.finish_reason == "stop" and ids and self.eos_id is not None and ids[-1] == self.eos_id:
            return ids[:-1]
        return ids

    def _content(self):
        """Token log-probs without the final EOS (the XT convention, spec algos_peer §1.4)."""
        lp = list(self.logprobs)[self.prefix_len:]
        if self.finish_reason == "stop" and self.token_ids and self.eos_id is not None \
                and self.token_ids[-1] == self.eos_id and lp:
            lp = lp[:-1]
        return lp

    @property
    def logp_sum(self) -> float:
        return float(sum(self._content()))

    @property
    def token_count(self) -> int:
        return len(self._content())

    @property
    def mean_logp(self) -> float:
        n = self.token_count
        return self.logp_sum / n if n else 0.0


@dataclass
class Group:
    """One model's rollouts for one prompt, plus their advantages.

    ``source`` is "own" for the learner's rollouts and "peer" for grafted / transferred ones;
    ``weights`` are per-response loss weights (1.0 for own responses).
    """

    prompt: Prompt
    model_id: str
    rollouts: list
    advantages: Optional[list] = None
    source: str = "own"
    weights: Optional[list] = None
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.rollouts)

    @property
    def rewards(self) -> list:
        return [r.reward for r in self.rollouts]

    @property
    def num_correct(self) -> int:
        return sum(1 for r in self.rollouts if r.correct)

    @property
    def all_fail(self) -> bool:
        return self.n > 0 and self.num_correct == 0

    @property
    def all_success(self) -> bool:
        return self.n > 0 and self.num_correct == self.n

    @property
    def mixed(self) -> bool:
        return 0 < self.num_correct < self.n

    @property
    def outcome(self) -> str:
        return "all_fail" if self.all_fail else "all_success" if self.all_success else "mixed"


def to_plain(obj: Any) -> Any:
    """Dataclass tree -> dicts/lists (for Ray, JSON, Parquet)."""
    from dataclasses import asdict, is_dataclass
    return asdict(obj) if is_dataclass(obj) else obj
