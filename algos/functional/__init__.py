"""Pure tensor / number functions for the formulas several algorithms share (docs/algorithms.md): the GRPO family's
advantages, surrogate, aggregation, KL and GSPO's ratios (``core``), and the peer exchange's compatibility score,
minibatch bounds and token alignment (``peer``). An algorithm's own formulas live in its package
(graftzoo.algos.<name>.formulas). Each function cites its section in its docstring and has a worked example in the
tests.
"""
from .core import *  # noqa: F401,F403
from .core import __all__ as _core_all
from .peer import *  # noqa: F401,F403
from .peer import __all__ as _peer_all

__all__ = [*_core_all, *_peer_all]
