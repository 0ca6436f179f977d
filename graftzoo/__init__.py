"""graftzoo: RLVR on language models (see README.md).

The Python API (``graftzoo.api``: ``load_config``, ``train``, ``evaluate``, ``export``, ``RunResult``) is reached
as ``graftzoo.train`` etc. and imported on first use, so that ``import graftzoo`` itself stays light: the
verifier's worker processes import ``graftzoo.envs.*`` and must not pay for torch and transformers.
"""
import importlib

API = ("RunResult", "evaluate", "export", "load_config", "train")
__all__ = list(API)


def __getattr__(name: str):
    """``graftzoo.train`` and the other API names, from ``graftzoo.api`` (imported on first use)."""
    if name in API:
        return getattr(importlib.import_module("graftzoo.api"), name)
    raise AttributeError(f"module 'graftzoo' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(API))
