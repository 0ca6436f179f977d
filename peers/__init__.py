"""graftzoo.peers: peer sources (online / stored / mixed) and the TrajectoryStore."""
from graftzoo.peers.sources import MixedPeer, OnlinePeer, PeerSource, StoredPeer, make_peer_source  # noqa: F401
from graftzoo.peers.store import SCHEMA_VERSION, StoreError, TrajectoryStore  # noqa: F401
