"""graftzoo: RLVR on language models (see README.md).

The stable public names, imported on first use so that ``import graftzoo`` itself stays light (the verifier's
worker processes import ``graftzoo.envs.*`` and must not pay for torch and transformers):

- for plugins: ``from graftzoo import register_algo, Learner`` (and ``LearnerConfig``, the base of an ``algo.*``
  section; ``register_loss``, ``LossInputs``, ``PolicyLoss`` for a policy loss; ``register_estimator``,
  ``AdvantageInputs`` for an advantage estimator; docs/architecture.md);
- the Python API (``graftzoo.api``): ``load_config``, ``train``, ``evaluate``, ``export``, ``RunResult``.
"""
import importlib

PUBLIC = {"register_algo": "graftzoo.contract.registry", "Learner": "graftzoo.algos.base",
          "LearnerConfig": "graftzoo.algos.config", "StepContext": "graftzoo.algos.base",
          **{name: "graftzoo.algos.losses" for name in ("LossInputs", "PolicyLoss", "register_loss")},
          **{name: "graftzoo.algos.advantages" for name in ("AdvantageInputs", "register_estimator")},
          **{name: "graftzoo.api" for name in ("RunResult", "evaluate", "export", "load_config", "train")}}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    """A public name from the module that defines it (imported on first use)."""
    if name in PUBLIC:
        return getattr(importlib.import_module(PUBLIC[name]), name)
    raise AttributeError(f"module 'graftzoo' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(PUBLIC))
