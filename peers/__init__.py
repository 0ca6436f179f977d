"""graftzoo.peers: peer sources (one module each under ``sources``: online / stored / mixed), the cross-tokenizer
exchange (``xt``) and the TrajectoryStore (``store``). The names below are imported on first use, so that a config
check registering the builtin sources imports no pandas."""
import importlib

PUBLIC = {**{name: "graftzoo.peers.sources" for name in ("MixedPeer", "OnlinePeer", "PeerSource", "StoredPeer",
                                                         "make_peer_source")},
          **{name: "graftzoo.peers.store" for name in ("SCHEMA_VERSION", "StoreError", "TrajectoryStore")}}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name in PUBLIC:
        return getattr(importlib.import_module(PUBLIC[name]), name)
    raise AttributeError(f"module 'graftzoo.peers' has no attribute {name!r}")
