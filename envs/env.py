"""Gymnasium environments for verifiable math reasoning (docs/architecture.md#where-to-add-an-environment).

One episode is one prompt: ``reset`` draws a problem and returns the rendered prompt text,
``step`` takes the model's whole response text, verifies it against the gold answer and ends the
episode. Trainers score many responses at once with :meth:`MathReasoningEnv.score_groups`, which
shares its code with ``step``. A rollout whose answer the verifier's batch budget left undecided gets status
``UNVERIFIED`` (scored as wrong, but not judged wrong: the trainer counts it in ``verifier/unverified``).
"""
from __future__ import annotations

import string
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence, Union

import gymnasium as gym
from gymnasium import spaces

from graftzoo.envs.arithmetic import generate_prompts
from graftzoo.envs.datasets import MathDataset, load_dataset
from graftzoo.envs.templates import render_prompt
from graftzoo.envs.verifier import VerifierOptions, VerifyResult, start_pool, verify_batch
from graftzoo.contract.types import Group, Prompt

DEFAULT_MAX_RESPONSE_CHARS = 65536
UNVERIFIED = "unverified"  # a rollout's status when the batch's verifier budget ran out before its verdict
_RESET_OPTIONS = {"index", "with_gold"}


class ResponseText(spaces.Text):
    """The action space: any Unicode text of at most ``max_length`` characters (what ``step``
    accepts). ``sample()`` draws from ``charset``; ``contains`` accepts every character."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def reward_of(correct: bool, reward_correct: float = 1.0, reward_wrong: float = 0.0) -> float:
    """Outcome reward: ``reward_correct`` if correct else ``reward_wrong`` (docs/algorithms.md#notation-and-conventions:
    the binary {0,1} and the DAPO {-1,+1} conventions are both configurable)."""
    return float(reward_correct if correct else reward_wrong)


class MathReasoningEnv(gym.Env[str, str]):
    """A single-step text environment over a math dataset.

    Args:
        dataset: a bundled name (``"math500"`` ...), a ``.jsonl`` / ``.parquet`` path, or a
            :class:`MathDataset`. Extra keyword arguments go to :func:`load_dataset`.
        split: the split, for names that have several (``gsm8k``, ``arithmetic``).
        template: a prompt template name (see :mod:`graftzoo.envs.templates`).
        tokenizer: the tokenizer, for the ``chat`` template.
        reward_correct / reward_wrong: the reward of a correct / wrong response.
        verifier_timeout: seconds the verifier may spend on one response.
        max_response_chars: the longest response ``step`` accepts (the action space's bound).
        verifier_budget: seconds the verifier may spend on one scored batch (None: no limit; ``"auto"``: from the
            batch's number of calls, ``verifier_timeout`` and the pool's size, ``verify_pool.auto_budget``); the
            responses it has not verified by then get status "timeout", marked ``unverified`` (config
            ``task.verifier_budget``).
        verifier_workers: the size of the verifier's worker pool, shared by the process (a count, or ``"auto"``:
            ``verify_pool.auto_workers``; None: the size it has); config ``task.verifier_workers``.
        verifier_options: math-verify's ``verify`` options (``VerifierOptions`` or a dict of its
            fields; None: math-verify's defaults).

    ``reset(options=...)`` accepts ``{"index": i}`` to pick a prompt and ``{"with_gold": True}``
    to put the gold answer in the infos of that episode (it is withheld otherwise).
    """

    metadata = {"render_modes": []}
    procedural: ClassVar[bool] = False
    """Whether the env generates its problems (``generate``) from ``size, seed, mix, difficulty, split`` (the task's
    ``task.*`` keys; ``task.size: null`` makes it an endless stream the sampler draws from) rather than reading a
    dataset (docs/architecture.md#where-to-add-an-environment)."""

    def __init__(self, dataset: Union[str, Path, MathDataset] = "math500", split: Optional[str] = None,
                 template: str = "plain", tokenizer: Any = None, reward_correct: float = 1.0,
                 reward_wrong: float = 0.0, verifier_timeout: float = 1.0,
                 max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS, verifier_budget: Optional[float] = None,
                 verifier_options: Union[VerifierOptions, dict, None] = None,
                 verifier_workers: Union[int, str, None] = None, **dataset_kwargs: Any):
        if isinstance(dataset, MathDataset):
            if split is not None or dataset_kwargs:
                raise ValueError("split and dataset keyword arguments apply to a dataset name or path, "
                                 "not to a MathDataset object")
            self.dataset = dataset
        else:
            self.dataset = load_dataset(dataset, split, **dataset_kwargs)
        self.template = template
        self.tokenizer = tokenizer
        self.reward_correct = float(reward_correct)
        self.reward_wrong = float(reward_wrong)
        self.verifier_timeout = verifier_timeout
        self.verifier_budget = verifier_budget
        self.verifier_options = VerifierOptions(**verifier_options) if isinstance(verifier_options, dict) \
            else verifier_options
        self.max_response_chars = int(max_response_chars)

        wrapper = render_prompt("", template, tokenizer)  # fails early on a bad template/tokenizer
        chars, longest = self._text_stats()
        charset = frozenset(string.printable) | chars | frozenset(wrapper)
        self.observation_space = spaces.Text(max_length=longest + len(wrapper), charset=charset)
        self.action_space = ResponseText(min_length=0, max_length=self.max_response_chars, charset=charset)
        self.verifier_workers = verifier_workers
        start_pool(verifier_workers)  # the verifier's workers warm up in the background while the caller loads its model

        self._prompt: Optional[Prompt] = None
        self._obs = ""
        self._index = -1
        self._with_gold = False
        self._done = True

    def _text_stats(self) -> tuple[frozenset, int]:
        """Every character of the problem texts, and the longest text's length."""
        chars: set[str] = set()
        longest = 0
        for p in self.dataset:
            chars.update(p.text)
            longest = max(longest, len(p.text))
        return frozenset(chars), longest

    def render(self, prompt: Prompt) -> str:
        """The prompt text the model sees for ``prompt``."""
        return render_prompt(prompt.text, self.template, self.tokenizer)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - _RESET_OPTIONS
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; known: {sorted(_RESET_OPTIONS)}")
        if options.get("index") is None:
            index = int(self.np_random.integers(len(self.dataset)))
        else:
            index = int(options["index"])
            if not -len(self.dataset) <= index < len(self.dataset):
                raise IndexError(f"reset option index={index} is out of range for dataset "
                                 f"{self.dataset.name!r} of {len(self.dataset)} prompts")
            index %= len(self.dataset)
        self._index = index
        self._prompt = self.dataset[index]
        self._obs = self.render(self._prompt)
        self._with_gold = bool(options.get("with_gold", False))
        self._done = False
        return self._obs, self._info({"index": index, "dataset": self.dataset.name,
                                      "source": self._prompt.source})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._prompt is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over (one step per prompt); call reset()")
        if not isinstance(action, str):
            raise TypeError(f"the action must be the response text (str), got {type(action).__name__}")
        if len(action) > self.max_response_chars:
            raise ValueError(f"response of {len(action)} characters exceeds max_response_chars="
                             f"{self.max_response_chars}")
        result = self.score_batch([self._prompt], [action])[0]
        self._done = True
        info = self._info({"correct": result.correct, "extracted": result.extracted, "status": result.status})
        return self._obs, self.reward(result), True, False, info

    def generate(self, n: int, start: int = 0) -> list[Prompt]:
        """A procedural env's prompts ``start .. start + n - 1`` of its deterministic stream (its seed and split)."""
        raise NotImplementedError(f"{type(self).__name__} reads a dataset ({self.dataset.name}); only a procedural "
                                  f"env generates prompts")

    def _info(self, extra: dict) -> dict:
        assert self._prompt is not None
        info = {"prompt_id": self._prompt.id, **extra}
        if self._with_gold:
            info["gold"] = self._prompt.gold
        return info

    def reward(self, result: VerifyResult) -> float:
        return reward_of(result.correct, self.reward_correct, self.reward_wrong)

    def score_batch(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[VerifyResult]:
        """Verify ``responses[i]`` against ``prompts[i].gold`` (one verifier call for the batch)."""
        if len(prompts) != len(responses):
            raise ValueError(f"score_batch got {len(prompts)} prompts and {len(responses)} responses")
        unlabelled = [p.id for p in prompts if p.gold is None]
        if unlabelled:
            raise ValueError(f"{len(unlabelled)} prompt(s) have no gold answer (label-free), e.g. "
                             f"{unlabelled[:3]}; the environment cannot score them: label-free "
                             "learners score their own groups")
        return verify_batch(list(responses), [p.gold for p in prompts], timeout=self.verifier_timeout,
                            budget=self.verifier_budget, options=self.verifier_options)

    def score_groups(self, groups: Sequence[Group]) -> list[Group]:
        """The groups with every rollout scored: new rollouts with ``reward, correct, extracted, status`` (status
        ``UNVERIFIED`` where the batch's budget left the answer undecided)."""
        rollouts = [(g.prompt, r) for g in groups for r in g.rollouts]
        results = iter(self.score_batch([p for p, _ in rollouts], [r.text for _, r in rollouts]))
        out = []
        for g in groups:
            scored = []
            for r, res in zip(g.rollouts, results):
                scored.append(replace(r, reward=self.reward(res), correct=bool(res.correct), extracted=res.extracted,
                                      status=UNVERIFIED if res.unverified else res.status))
            out.append(replace(g, rollouts=scored))
        return out


class ArithmeticEnv(MathReasoningEnv):
    """:class:`MathReasoningEnv` over the procedural arithmetic task (``graftzoo/Arithmetic-v0``).

    ``size, seed, mix, difficulty, split`` configure the generator (None: its defaults, and an
    equal mix of every skill); ``seed`` is the dataset's, not the episode's (``reset(seed=)``).
    ``template`` defaults to ``"compact"`` for character-level models. Its endless stream (``generate``) draws add
    and mul at difficulty 3 unless ``mix`` / ``difficulty`` say otherwise."""

    procedural = True
    STREAM_MIX = {"add": 1, "mul": 1}
    STREAM_DIFFICULTY = 3

    def __init__(self, size: int = 1000, seed: int = 0, mix: Optional[dict] = None,
                 difficulty: Any = None, split: str = "train", template: str = "compact", **kwargs: Any):
        self.seed, self.mix, self.difficulty, self.split = seed, mix, difficulty, split
        super().__init__(dataset="arithmetic", split=split, template=template, size=size, seed=seed,
                         mix=mix, difficulty=difficulty, **kwargs)

    def generate(self, n: int, start: int = 0) -> list[Prompt]:
        return generate_prompts(n, self.seed, self.mix or self.STREAM_MIX, self.difficulty or self.STREAM_DIFFICULTY,
                                self.split, start=start)
