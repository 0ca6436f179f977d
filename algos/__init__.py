"""graftzoo.algos: the learners (one module per algorithm), their ``algo.*`` sections (``config``, no torch) and
their pure tensor functions (``functional``). Plugins import ``from graftzoo import register_algo, Learner``."""
import importlib

BUILTIN = ("grpo", "dr_grpo", "rloo", "dapo", "gspo", "hora", "extra", "om_grpo", "hacpo", "sgt", "graft")


def load_builtins() -> None:
    """Import (and so register) every builtin learner."""
    for name in BUILTIN:
        importlib.import_module(f"graftzoo.algos.{name}")
