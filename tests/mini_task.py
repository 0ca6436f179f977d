"""A task plugin for the untrained miniatures (tests/mini.py): ``mini/Scripts-v0``, an environment registered with
Gymnasium by a plugin file (``--plugin``, ``GRAFTZOO_PLUGINS``) and chosen by ``task.env``
(docs/architecture.md#where-to-add-an-environment).

Each prompt asks for one kind of symbol: ``digit`` ("Write a number.") or ``hebrew`` ("Write a word in Hebrew."),
and a response is right when it holds one (``score_batch``, the task's verifier). An untrained model writes the tokens
of its vocabulary nearly uniformly, so it passes where its vocabulary holds such tokens: SmolLM3's holds ~1,350 tokens
with an ASCII digit and ~20 with a Hebrew letter, Qwen3's ~3,200 with a Hebrew letter and the ten digits alone. Each
model then solves some prompts of its own kind and almost none of the other's, from the models' real tokenizers, as
the pair's skills complement each other (docs/guide.md#the-papers-families-in-miniature).

A right answer must also fit the learner's response limit once re-tokenized into its vocabulary (a longer peer
response is dropped: docs/algorithms.md#cross-tokenizer-exchange), and random text of one vocabulary takes 1.3 to 1.8
times as many tokens of the other. So each model's responses end at its first symbol of the kind it writes
(``stop_at``, given as the model's ``stop``: SmolLM3's at a digit, Qwen3's at a Hebrew letter): a right answer is as
short as its symbol came early. A learner cuts its own stop strings from a peer's response
(docs/algorithms.md#exchange-rules-for-real-vocabularies), which are not the peer's answers: the answer stays."""
from __future__ import annotations

import gymnasium as gym

from graftzoo.contract.types import Prompt
from graftzoo.envs.datasets import MathDataset
from graftzoo.envs.env import ArithmeticEnv, MathReasoningEnv
from graftzoo.envs.verifier import VerifyResult

ENV_ID = "mini/Scripts-v0"
DIGITS = "0123456789"
HEBREW = "".join(chr(c) for c in range(0x05D0, 0x05EB))  # alef .. tav, final forms included
ASK = {"digit": ("Write a number.", DIGITS), "hebrew": ("Write a word in Hebrew.", HEBREW)}


def script_prompts(size: int, seed: int, split: str) -> list:
    """``size`` prompts of ``split``, the two kinds alternating; ids and texts differ across splits and seeds."""
    kinds = list(ASK)
    return [Prompt(id=f"scripts-{split}-{seed}-{i}", text=f"{ASK[kinds[i % 2]][0]} ({split} {seed}-{i})",
                   gold=kinds[i % 2], source="scripts", metadata={"skill": kinds[i % 2]}) for i in range(size)]


def stop_at(kind: str) -> list:
    """Stop strings that end a response at its first symbol of ``kind``, besides the plain template's own."""
    return list(ASK[kind][1]) + ["\nProblem:", "\n\nProblem"]


def first_of(text: str, symbols: str):
    return next((c for c in text if c in symbols), None)


class ScriptsEnv(ArithmeticEnv):
    """The task's prompts (procedural: ``task.size`` of them per split, seeded) scored by ``score_batch``; the
    arithmetic keys (``task.mix``, ``task.difficulty``) do not apply and are refused when given."""

    def __init__(self, size: int = 64, seed: int = 0, mix=None, difficulty=None, split: str = "train",
                 template: str = "plain", **kwargs):
        if mix or difficulty:
            raise ValueError(f"{ENV_ID} has no task.mix or task.difficulty (got {mix!r}, {difficulty!r})")
        data = MathDataset("scripts", script_prompts(size, seed, split), split=split)
        MathReasoningEnv.__init__(self, dataset=data, template=template, **kwargs)

    def score_batch(self, prompts, responses):
        out = []
        for p, text in zip(prompts, responses):
            found = first_of(text, ASK[p.gold][1])
            out.append(VerifyResult(correct=found is not None, extracted=found, status="ok"))
        return out


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=ScriptsEnv)
