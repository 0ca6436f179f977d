"""``mixed``: the online peers, with the stored groups of an earlier run as fallback (``peer.mix_ratio`` null) or
chosen with probability ``peer.mix_ratio`` (docs/algorithms.md#graft-stored-trajectories). In a population each peer
is mixed on its own: a peer with a store (``peer.path``, or its entry of ``peer.stores``) and a live group, the rule
above; a peer with only one of them, that one (docs/algorithms.md#populations)."""
from __future__ import annotations

import random
from typing import Optional

from graftzoo.contract.peer_sources import PeerSourceKind, register_peer_source
from graftzoo.peers.sources import online, stored as stored_source
from graftzoo.peers.sources.base import PeerSource
from graftzoo.peers.sources.online import OnlinePeer
from graftzoo.peers.sources.stored import StoredPeers


class MixedPeer(PeerSource):
    """Online peers, with the stored group used as fallback (mix_ratio None) or with probability mix_ratio."""

    def __init__(self, online: OnlinePeer, stored, mix_ratio: Optional[float] = None, seed: int = 0):
        self.online, self.stored, self.mix_ratio, self.seed = online, stored, mix_ratio, seed
        self.stores = {s.model: s for s in (stored.stores if isinstance(stored, StoredPeers) else [stored])}

    def peer_of(self, learner_id):
        return self.online.peer_of(learner_id)

    def peers_of(self, learner_id):
        live = self.online.peers_of(learner_id)
        return live + [m for m in self.stores if m not in live and m != learner_id]

    def stored_runs(self):
        return [run for s in self.stores.values() for run in s.stored_runs()]

    def observe(self, groups_by_model):
        self.online.observe(groups_by_model)

    def step_metrics(self, step, learner_id):
        mine = [s for m, s in self.stores.items() if m in self.peers_of(learner_id)]
        return StoredPeers(mine).step_metrics(step, learner_id) if mine else {}

    def groups(self, prompts, step, epoch, learner_id):
        return self.groups_by_peer(prompts, step, epoch, learner_id)[self.peer_of(learner_id)]

    def groups_by_peer(self, prompts, step, epoch, learner_id):
        live = self.online.groups_by_peer(prompts, step, epoch, learner_id)
        rng = random.Random(f"{self.seed}:{step}:{learner_id}")
        out = {}
        for peer in self.peers_of(learner_id):
            # a store stands in for its own model only: never hand a learner its own logged groups
            mine, kept = live.get(peer, {}), (self.stores[peer].groups(prompts, step, epoch, learner_id)
                                              if peer in self.stores else {})
            out[peer] = {}
            for p in prompts:
                use_stored = p.id not in mine or (self.mix_ratio is not None and p.id in kept
                                                  and rng.random() < self.mix_ratio)
                g = kept.get(p.id) if use_stored else mine.get(p.id)
                if g is not None:
                    out[peer][p.id] = g
        return out


def build(cfg, trained_ids, dataset_id=None, prompt_ids=None, plan=None) -> MixedPeer:
    stored = stored_source.build(cfg, trained_ids, dataset_id, prompt_ids, plan)
    return MixedPeer(online.build(cfg, trained_ids), stored, cfg.peer.mix_ratio, seed=int(cfg.run.seed))


KIND = register_peer_source(PeerSourceKind(
    "mixed", "the online peers, with an earlier run's stored groups as fallback or mixed in (peer.mix_ratio)",
    build, live=True, reads_run=True, keys=(*stored_source.STORE_KEYS, "mix_ratio"), check=stored_source.check_store,
    label=", mixed peer"))
