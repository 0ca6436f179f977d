"""graftzoo.envs: the Gymnasium math-reasoning environments, their datasets, prompt templates and
verifier. Importing this package registers the ids ``graftzoo/MathReasoning-v0`` and
``graftzoo/Arithmetic-v0`` with Gymnasium::

    import gymnasium as gym
    import graftzoo.envs
    env = gym.make("graftzoo/MathReasoning-v0", dataset="math500", template="plain")
"""
import gymnasium as gym

from graftzoo.envs.datasets import DatasetError, MathDataset, load_dataset
from graftzoo.envs.env import ArithmeticEnv, MathReasoningEnv
from graftzoo.envs.templates import TEMPLATES, register_template, render_prompt
from graftzoo.envs.verifier import VerifierOptions, VerifyResult, reward_fn, verify, verify_batch

ENV_IDS = {
    "graftzoo/MathReasoning-v0": ("graftzoo.envs.env:MathReasoningEnv",
                                  {"dataset": "math500", "split": None, "template": "plain"}),
    "graftzoo/Arithmetic-v0": ("graftzoo.envs.env:ArithmeticEnv", {"template": "compact"}),
}
for _id, (_entry, _kwargs) in ENV_IDS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, kwargs=_kwargs)

__all__ = ["ArithmeticEnv", "DatasetError", "ENV_IDS", "MathDataset", "MathReasoningEnv", "TEMPLATES",
           "VerifierOptions", "VerifyResult", "load_dataset", "register_template", "render_prompt", "reward_fn", "verify",
           "verify_batch"]
