"""The base of every peer source (graftzoo.peers.sources): ``groups(prompts, step, epoch, learner_id) -> {prompt_id:
Group}`` returns, for the step's prompts, the peer's groups: text, rewards, peer advantages, peer log-prob stats and
policy versions."""
from __future__ import annotations

from typing import Optional


class PeerSource:
    def groups(self, prompts, step: int, epoch: int, learner_id: str) -> dict:
        raise NotImplementedError

    def peer_of(self, learner_id: str) -> Optional[str]:
        return None

    def observe(self, groups_by_model: dict):
        """Every trained model's groups of this step, before any update (a no-op unless a source needs them)."""

    def step_metrics(self, step: int, learner_id: str) -> dict:
        """What the source reports about a learner's step (``peer/stored_missing`` for a store)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass
