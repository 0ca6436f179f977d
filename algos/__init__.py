"""graftzoo.algos: the algorithms, one package each, found by the registry (graftzoo.contract.registry) the way it
finds plugins: ``graftzoo.algos.<name>`` holds the algorithm's doc, its ``algo.*`` section and its metrics, without
torch (a run config is checked before anything heavy is imported); ``graftzoo.algos.<name>.learner`` its learner,
hooks and policy loss. Beside them: the Learner base (``base``), the peer base (``peer``), the loss registry
(``losses``), the shared keys (``config``) and the pure tensor formulas (``functional``). A new builtin algorithm is
a new package here; a plugin registers the same way from its own module (``from graftzoo import register_algo,
Learner, register_loss``; docs/architecture.md#add-an-algorithm)."""
import importlib
from pathlib import Path


def builtin_names() -> tuple:
    """The builtin algorithms: every package here that has a learner module."""
    return tuple(sorted(p.parent.name for p in Path(__file__).parent.glob("*/learner.py")))


BUILTIN = builtin_names()


def load_sections() -> None:
    """Import every builtin algorithm's package: its ``algo.*`` section and metrics register (no torch)."""
    for name in BUILTIN:
        importlib.import_module(f"graftzoo.algos.{name}")


def load_builtins() -> None:
    """Import (and so register) every builtin learner."""
    for name in BUILTIN:
        importlib.import_module(f"graftzoo.algos.{name}.learner")
