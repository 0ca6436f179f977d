"""Peer sources: where a learner's peer groups come from (docs/architecture.md#one-training-step), one module each,
registered by name (graftzoo.contract.peer_sources; docs/architecture.md#where-to-add-a-peer-source):

- ``online``: the partner in the same run; the step hands it every model's groups before any model updates;
- ``stored``: the TrajectoryStore of an earlier run, aligned by step or by epoch;
- ``mixed``: online with a stored fallback, or a mixing ratio.

``PeerSource.groups_by_peer(prompts, step, epoch, learner_id) -> {peer id: {prompt_id: Group}}`` returns, for the
step's prompts, each peer's groups: text, rewards, peer advantages, peer log-prob stats and policy versions (a
source with one peer per learner implements ``groups``, that peer's ``{prompt_id: Group}``).
"""
from __future__ import annotations

from typing import Optional

from graftzoo.contract.config import RunConfig
from graftzoo.contract.peer_sources import peer_source_kind
from graftzoo.peers.sources.base import PeerSource  # noqa: F401
from graftzoo.peers.sources.online import OnlinePeer  # noqa: F401
from graftzoo.peers.sources.stored import StoredPeer, StoredPeers, check_coverage, step_ranges  # noqa: F401
from graftzoo.peers.sources.mixed import MixedPeer  # noqa: F401


def make_peer_source(cfg: RunConfig, trained_ids: list, dataset_id: Optional[str] = None, prompt_ids=None,
                     plan: Optional[list] = None) -> Optional[PeerSource]:
    """The source ``peer.source`` names, built by its registered kind (``none`` -> None); with ``plan`` ((step,
    epoch, prompts) of every step of the run), a store is checked to cover it."""
    kind = peer_source_kind(cfg.peer.source)
    return None if kind is None else kind.build(cfg, trained_ids, dataset_id, prompt_ids, plan)
