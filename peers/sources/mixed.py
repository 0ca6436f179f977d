"""``mixed``: the online partner, with the stored groups of an earlier run as fallback (``peer.mix_ratio`` null) or
chosen with probability ``peer.mix_ratio`` (docs/algorithms.md#graft-stored-trajectories)."""
from __future__ import annotations

import random
from typing import Optional

from graftzoo.contract.peer_sources import PeerSourceKind, register_peer_source
from graftzoo.peers.sources import online, stored as stored_source
from graftzoo.peers.sources.base import PeerSource
from graftzoo.peers.sources.online import OnlinePeer
from graftzoo.peers.sources.stored import StoredPeer


class MixedPeer(PeerSource):
    """Online peer, with the stored group used as fallback (mix_ratio None) or with probability mix_ratio."""

    def __init__(self, online: OnlinePeer, stored: StoredPeer, mix_ratio: Optional[float] = None, seed: int = 0):
        self.online, self.stored, self.mix_ratio, self.seed = online, stored, mix_ratio, seed

    def peer_of(self, learner_id):
        return self.online.peer_of(learner_id)

    def observe(self, groups_by_model):
        self.online.observe(groups_by_model)

    def step_metrics(self, step, learner_id):
        return self.stored.step_metrics(step, learner_id) if self.stored.model == self.peer_of(learner_id) else {}

    def groups(self, prompts, step, epoch, learner_id):
        live = self.online.groups(prompts, step, epoch, learner_id)
        # the store stands in for the stored model only: never hand a learner its own logged groups
        stored = self.stored.groups(prompts, step, epoch, learner_id) \
            if self.stored.model == self.peer_of(learner_id) else {}
        rng = random.Random(f"{self.seed}:{step}:{learner_id}")
        out = {}
        for p in prompts:
            use_stored = p.id not in live or (self.mix_ratio is not None and p.id in stored
                                                and rng.random() < self.mix_ratio)
            g = stored.get(p.id) if use_stored else live.get(p.id)
            if g is not None:
                out[p.id] = g
        return out



def build(cfg, trained_ids, dataset_id=None, prompt_ids=None, plan=None) -> MixedPeer:
    stored = stored_source.build(cfg, trained_ids, dataset_id, prompt_ids, plan)
    return MixedPeer(online.build(cfg, trained_ids), stored, cfg.peer.mix_ratio, seed=int(cfg.run.seed))


KIND = register_peer_source(PeerSourceKind(
    "mixed", "the online partner, with an earlier run's stored groups as fallback or mixed in (peer.mix_ratio)",
    build, live=True, reads_run=True, keys=(*stored_source.STORE_KEYS, "mix_ratio"), check=stored_source.check_store,
    label=", mixed peer"))
