"""The base of every peer source (graftzoo.peers.sources). ``groups_by_peer(prompts, step, epoch, learner_id) ->
{peer model id: {prompt_id: Group}}`` returns, for the step's prompts, the groups of each of the learner's peers
(population order): text, rewards, peer advantages, peer log-prob stats and policy versions. A source with one peer
per learner implements ``groups`` (that peer's ``{prompt_id: Group}``) and ``peer_of``; a source for a population
of N models overrides ``groups_by_peer`` and ``peers_of`` (docs/algorithms.md#populations)."""
from __future__ import annotations

from typing import Optional


class PeerSource:
    def groups(self, prompts, step: int, epoch: int, learner_id: str) -> dict:
        """The learner's one peer's groups of ``prompts``: {prompt_id: Group}."""
        raise NotImplementedError

    def peer_of(self, learner_id: str) -> Optional[str]:
        """The learner's one peer (a source of a population answers ``peers_of``)."""
        return None

    def peers_of(self, learner_id: str) -> list:
        """Every peer model id of the learner, in population order."""
        peer = self.peer_of(learner_id)
        return [] if peer is None else [peer]

    def groups_by_peer(self, prompts, step: int, epoch: int, learner_id: str) -> dict:
        """{peer model id: {prompt_id: Group}} for every peer of the learner (one peer: ``groups`` under
        ``peer_of``, "peer" when the source does not name it)."""
        return {self.peer_of(learner_id) or "peer": self.groups(prompts, step, epoch, learner_id)}

    def stored_runs(self) -> list:
        """(path, model) of each earlier run the source reads (its compute is amortized in the summary)."""
        return []

    def observe(self, groups_by_model: dict):
        """Every trained model's groups of this step, before any update (a no-op unless a source needs them)."""

    def step_metrics(self, step: int, learner_id: str) -> dict:
        """What the source reports about a learner's step (``peer/stored_missing`` for a store)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass
