"""Pure tensor / number functions for every formula of docs/algorithms.md.

Each function cites its spec section in its docstring; learners build on these.
"""
from .core import *  # noqa: F401,F403
from .core import __all__ as _core_all
from .peer import *  # noqa: F401,F403
from .peer import __all__ as _peer_all
from .single import *  # noqa: F401,F403
from .single import __all__ as _single_all

__all__ = [*_core_all, *_peer_all, *_single_all]
