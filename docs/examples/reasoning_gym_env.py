"""reasoning-gym's tasks as a graftzoo environment plugin (docs/guide.md#another-librarys-tasks): one file, no edit
to graftzoo. It registers ``rg/ReasoningGym-v0``, a procedural ``MathReasoningEnv`` whose problems come from
reasoning-gym's generators (``task.mix``: generator name -> weight, e.g. ``{basic_arithmetic: 1, countdown: 1}``;
``task.difficulty``: generator name -> its config keys) and whose reward is reasoning-gym's own scorer
(``score_answer``, a value in [0, 1], mapped onto ``task.reward_correct`` / ``task.reward_wrong``). The trainer scores
rollouts through the env (``score_groups`` -> ``score_batch``, the code ``env.step`` runs) and draws a stream's
prompts from its ``generate``, so this file is all a new task needs:

    pip install -e '.[tasks]'     # reasoning-gym
    graftzoo train --plugin docs/examples/reasoning_gym_env.py --algo grpo --pair micro \\
        --set task.env=rg/ReasoningGym-v0 --set 'task.mix={basic_arithmetic: 1}' --set 'task.difficulty={}'

An answer is read from ``<answer>...</answer>`` (reasoning-gym's convention), else the last ``\\boxed{...}``, else
what follows the last ``=`` of the response's last line. reasoning-gym's scorers run in the trainer's process (not
in graftzoo's sandboxed verifier workers): use generators whose scorers compare strings or numbers.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Optional

import gymnasium as gym
import reasoning_gym

from graftzoo.contract.types import Prompt
from graftzoo.envs import MathDataset, MathReasoningEnv
from graftzoo.envs.verifier import VerifyResult

ENV_ID = "rg/ReasoningGym-v0"
SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}   # each split its own generator seeds: disjoint draws
INSTRUCTION = "Answer in <answer></answer>."
STREAM = 10**9                                    # a generator's size: items are made on demand, by index


@dataclass(frozen=True)
class ScoredResult(VerifyResult):
    """A verdict with reasoning-gym's score (1.0: correct; partial credit in between)."""

    score: float = 0.0


def extract(response: str) -> Optional[str]:
    """The answer a response gives: its last ``<answer>`` span, else its last ``\\boxed{...}``, else what follows the
    last ``=`` of its last non-empty line; None when it gives none."""
    tagged = re.findall(r"<answer>(.*?)</answer>", response, flags=re.S)
    if tagged:
        return tagged[-1].strip()
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", response)
    if boxed:
        return boxed[-1].strip()
    lines = [x for x in response.strip().splitlines() if x.strip()]
    if lines and "=" in lines[-1]:
        return lines[-1].rsplit("=", 1)[1].strip() or None
    return None


class ReasoningGymEnv(MathReasoningEnv):
    """reasoning-gym generators as one procedural task (``size, seed, mix, difficulty, split`` from ``task.*``)."""

    procedural = True

    def __init__(self, size: int = 1000, seed: int = 0, mix: Optional[dict] = None, difficulty: Any = None,
                 split: str = "train", template: str = "plain", **kwargs: Any):
        self.weights = {str(k): float(v) for k, v in (mix or {"basic_arithmetic": 1.0}).items() if float(v) > 0}
        if split not in SPLIT_SEEDS:
            raise ValueError(f"reasoning-gym: split {split!r}; expected one of {sorted(SPLIT_SEEDS)}")
        if difficulty is not None and not isinstance(difficulty, dict):
            raise ValueError(f"reasoning-gym: difficulty is generator -> its config keys, got {difficulty!r}")
        self.seed, self.split = int(seed), split
        self.generators = {}
        for name in self.weights:
            try:
                self.generators[name] = reasoning_gym.create_dataset(
                    name, seed=self._seed(name), size=STREAM, **dict((difficulty or {}).get(name) or {}))
            except (KeyError, ValueError, TypeError) as e:
                raise ValueError(f"reasoning-gym: mix key {name!r}: {' '.join(str(e).split())}") from None
        items = self.generate(int(size))
        super().__init__(dataset=MathDataset(f"rg-{'+'.join(self.weights)}", items, split=split), template=template,
                         **kwargs)

    def _seed(self, name: str) -> int:
        return random.Random(f"{self.seed}:{self.split}:{name}").randrange(2**31)

    def generate(self, n: int, start: int = 0) -> list[Prompt]:
        """Prompts ``start .. start + n - 1``: item i is generator g's item i, g drawn by the weights under (seed,
        split, i), so any slice of the stream is the same whatever ``start`` and ``n`` are."""
        names, weights = list(self.weights), list(self.weights.values())
        out = []
        for i in range(start, start + n):
            name = random.Random(f"{self.seed}:{self.split}:{i}").choices(names, weights)[0]
            entry = self.generators[name][i]
            out.append(Prompt(id=f"rg/{name}/{self.split}/{i}", text=f"{entry['question']}\n{INSTRUCTION}",
                              gold=str(entry["answer"]), source=f"reasoning_gym/{name}",
                              metadata={"rg_task": name, "rg_index": i}))
        return out

    def score_batch(self, prompts, responses) -> list[ScoredResult]:
        """reasoning-gym's ``score_answer`` of each response's answer against its prompt's entry (made again from
        the generator by index)."""
        if len(prompts) != len(responses):
            raise ValueError(f"score_batch got {len(prompts)} prompts and {len(responses)} responses")
        out = []
        for p, text in zip(prompts, responses):
            gen = self.generators[p.metadata["rg_task"]]
            answer = extract(text)
            score = 0.0 if answer is None else float(gen.score_answer(answer, gen[p.metadata["rg_index"]]))
            out.append(ScoredResult(correct=score >= 1.0, extracted=answer,
                                    status="no_answer" if answer is None else "ok", score=score))
        return out

    def reward(self, result: ScoredResult) -> float:
        return self.reward_wrong + (self.reward_correct - self.reward_wrong) * float(result.score)


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=ReasoningGymEnv)
