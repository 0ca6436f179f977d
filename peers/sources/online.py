"""``online``: the partner co-trained in the same run; the step hands it every model's groups before any model
updates (docs/algorithms.md#graft)."""
from __future__ import annotations

from graftzoo.contract.peer_sources import PeerSourceKind, register_peer_source
from graftzoo.peers.sources.base import PeerSource


class OnlinePeer(PeerSource):
    def __init__(self, model_ids: list):
        if len(model_ids) != 2:
            raise ValueError(f"peer.source=online needs exactly two trained models, got {model_ids}")
        self.model_ids = list(model_ids)
        self._step_groups: dict = {}

    def peer_of(self, learner_id: str) -> str:
        a, b = self.model_ids
        return b if learner_id == a else a

    def observe(self, groups_by_model: dict):
        """Every model's groups of this step (rollouts finished, advantages computed, no update yet)."""
        self._step_groups = {m: {g.prompt.id: g for g in gs} for m, gs in groups_by_model.items()}

    def groups(self, prompts, step, epoch, learner_id):
        mine = self._step_groups.get(self.peer_of(learner_id), {})
        return {p.id: mine[p.id] for p in prompts if p.id in mine}



def build(cfg, trained_ids, dataset_id=None, prompt_ids=None, plan=None) -> OnlinePeer:
    return OnlinePeer(trained_ids)


KIND = register_peer_source(PeerSourceKind(
    "online", "the partner co-trained in this run, its groups of the same step", build, live=True, artifact="live"))
