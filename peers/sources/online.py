"""``online``: the models co-trained in the same run; the step hands it every model's groups before any model
updates (docs/algorithms.md#graft). Each learner's peers are the other trained models, in population order
(docs/algorithms.md#populations)."""
from __future__ import annotations

from graftzoo.contract.peer_sources import PeerSourceKind, register_peer_source
from graftzoo.peers.sources.base import PeerSource


class OnlinePeer(PeerSource):
    def __init__(self, model_ids: list):
        if len(model_ids) < 2:
            raise ValueError(f"peer.source=online needs two or more trained models, got {model_ids}")
        self.model_ids = list(model_ids)
        self._step_groups: dict = {}

    def peers_of(self, learner_id: str) -> list:
        return [m for m in self.model_ids if m != learner_id]

    def peer_of(self, learner_id: str) -> str:
        """The partner of a pair (a population has several: ``peers_of``)."""
        peers = self.peers_of(learner_id)
        if len(peers) != 1:
            raise ValueError(f"model {learner_id!r} has {len(peers)} peers ({peers}): ask peers_of")
        return peers[0]

    def observe(self, groups_by_model: dict):
        """Every model's groups of this step (rollouts finished, advantages computed, no update yet)."""
        self._step_groups = {m: {g.prompt.id: g for g in gs} for m, gs in groups_by_model.items()}

    def _of(self, model: str, prompts) -> dict:
        mine = self._step_groups.get(model, {})
        return {p.id: mine[p.id] for p in prompts if p.id in mine}

    def groups(self, prompts, step, epoch, learner_id):
        return self._of(self.peer_of(learner_id), prompts)

    def groups_by_peer(self, prompts, step, epoch, learner_id):
        peers = self.peers_of(learner_id)
        if len(peers) == 1:  # a pair: ``groups``, which a subclass may refine
            return {peers[0]: self.groups(prompts, step, epoch, learner_id)}
        return {m: self._of(m, prompts) for m in peers}


def build(cfg, trained_ids, dataset_id=None, prompt_ids=None, plan=None) -> OnlinePeer:
    return OnlinePeer(trained_ids)


KIND = register_peer_source(PeerSourceKind(
    "online", "the models co-trained in this run, their groups of the same step", build, live=True,
    artifact="live"))
