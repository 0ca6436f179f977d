"""The task of a run, in one place: what the run config (``task.*`` and the evaluation sets of
``eval.*``) says about the problems a run trains on, is evaluated on and selects checkpoints on.
The trainer, OM-GRPO's test-time training and ``graftzoo eval`` all ask a :class:`Task`.

- **training env** (``train_env``): the task's environment on its training split; it scores
  rollouts and is the prompt source. A procedural task (``procedural``: the registered env's class says it
  generates its problems, as :class:`ArithmeticEnv` does) with ``task.size: null`` is an endless ``stream`` (the
  sampler draws fresh prompts from the env's ``generate`` every step); any other task is a finite
  ``train_dataset``.
- **held-out split** (``heldout()``): what the trainer evaluates on and the ``heldout`` benchmark
  of ``graftzoo eval``: ``eval.dataset`` (its first ``eval.size`` prompts), else the task's
  ``test`` split (procedural: ``eval.size`` prompts drawn under seed ``HELDOUT_SEED``), else, for a
  dataset without one (a user file, ``math_train``), a fixed slice of the training set
  (``heldout_slice``: ``eval.size`` prompts, at most a tenth of it) that training leaves out.
- **validation split** (``validation()``): the set ``eval.select=val_avg`` picks checkpoints on:
  ``eval.val_dataset`` when set, else ``eval.val_size`` prompts of the task held out from testing
  (the procedural ``val`` split, or a fixed slice of the training file, ``validation_slice``,
  disjoint from a held-out slice; training leaves out the ids of both: ``reserved_ids``).
- **fields** (``task.fields``): the row fields of the task's own data (``problem``, ``answer``, ``id``; dotted
  keys for nested fields), given to the loader of ``task.dataset``, ``eval.dataset`` and ``eval.val_dataset``
  when they are the user's data (not bundled names); ``eval.benchmarks`` are read with the loader's defaults.
- **label-free data** (``task.label_free``): the rows of ``task.dataset`` (every split of it) without a gold answer
  are kept, with ``Prompt.gold`` None, for a learner that trains without labels (``AlgoSection.label_free``,
  checked by ``validate``). Evaluation sets need gold answers: ``eval.*`` datasets are read labelled
  (``load_labelled``), and ``check`` refuses a held-out or validation set carved from ``task.dataset`` that would
  hold an unlabelled prompt, naming ``eval.dataset`` / ``eval.val_dataset``.
- **unverified answers** (``check_unverified``): a step whose share of rollouts the verifier's batch budget left
  undecided (status ``unverified``) is over ``task.max_unverified_share`` logs a warning, or with
  ``task.on_unverified: error`` fails before its update (``judge_unverified`` decides, docs/verifier.md#scaling-with-the-batch).
- **benchmarks** (``load_benchmark``): any dataset name or path, a MathDataset, or ``heldout``;
  ``is_test_set`` says whether checkpoint selection on one would select on a test set.

``Task(cfg).check()`` loads every one of these that the run will use, before any model is built, and
turns what is wrong into one ``ConfigError`` line naming the config key (and the file and line of a
broken dataset row).

Procedural splits never share a question with training (``graftzoo.envs.arithmetic``: held-out
questions are a hash partition), and the held-out and validation slices of a file are disjoint from
each other and from what the sampler trains on.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Optional, Union

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from graftzoo.contract.config import RunConfig
from graftzoo.contract.errors import ConfigError
from graftzoo.envs.datasets import (BENCHMARKS, FILE_SUFFIXES, LABEL_FREE_HINT, DatasetError, MathDataset,
                                     MissingSplitError, bundled_names, load_dataset)
from graftzoo.envs.env import UNVERIFIED, MathReasoningEnv
from graftzoo.envs.templates import TEMPLATES
from graftzoo.envs.verify_pool import AUTO, AUTO_BUDGET_BASE_S, auto_budget, pool_size

log = logging.getLogger(__name__)

HELDOUT = "heldout"
DEFAULT_VAL_SIZE = 64
HELDOUT_SEED = 999  # the dataset seed of every non-train procedural split (test, val)
HELDOUT_FRACTION = 10  # a held-out slice of a training set takes at most 1/HELDOUT_FRACTION of it
#: task.fields key -> the loader's keyword
FIELD_KWARGS = {"problem": "problem_key", "answer": "answer_key", "id": "id_key"}
SCORING_DEFAULTS = {"reward_correct": 1.0, "reward_wrong": 0.0, "verifier_timeout": 2.0}
#: what a DatasetError of an evaluation set says instead of suggesting task.label_free (it applies to training only)
EVAL_NEEDS_GOLD = "an evaluation set needs a gold answer on every row (task.label_free applies to task.dataset only)"
#: what loading a dataset or building an env raises for a bad config value (DatasetError is a ValueError)
LOAD_ERRORS = (ValueError, TypeError, LookupError, AttributeError, OSError, ImportError, gym.error.Error)


class UnverifiedError(RuntimeError):
    """A step over ``task.max_unverified_share`` with ``task.on_unverified: error`` (raised before its update)."""


def judge_unverified(step: int, model: str, unverified: int, scored: int, spec, workers: int) -> Optional[tuple]:
    """What a step's unverified answers call for: None when ``unverified`` of its ``scored`` rollouts is a share of at
    most ``spec.max_unverified_share`` (``spec``: the ``task`` section), else (``spec.on_unverified``: "warn" or
    "error", one line naming the step, the count, the share, the budget and the ``workers`` that verified them, and
    the keys that change them)."""
    if scored == 0 or unverified / scored <= spec.max_unverified_share:
        return None
    budget = spec.verifier_budget
    if budget == AUTO:
        budget = (f"auto: {AUTO_BUDGET_BASE_S:g} s + {spec.verifier_timeout:g} s x ceil(calls / {workers} workers), "
                  f"at most {auto_budget(scored, spec.verifier_timeout, workers):.0f} s for this batch")
    else:
        budget = f"{budget:g} s"
    fails = " (task.on_unverified=error: the step is not trained on)" if spec.on_unverified == "error" else ""
    return spec.on_unverified, (
        f"step {step}, model {model!r}: {unverified} of {scored} answers ({unverified / scored:.1%}) were left "
        f"unverified by the verifier's batch budget and score as wrong without being judged, above "
        f"task.max_unverified_share={spec.max_unverified_share:g}{fails}; task.verifier_budget={budget}, "
        f"{workers} math-verify workers (task.verifier_workers={spec.verifier_workers}): raise task.verifier_budget "
        f"(null: no limit) or task.verifier_workers, or change task.max_unverified_share / task.on_unverified")


def config_error(key: str, value, fn, keys: Optional[dict] = None):
    """``fn()``, with a LOAD_ERRORS exception turned into one ``ConfigError`` line naming ``key`` and its value; with
    ``keys`` (key -> (value, word)), the first key whose word is in the error's text is named instead."""
    try:
        return fn()
    except ConfigError:
        raise
    except LOAD_ERRORS as e:
        text = " ".join(str(e).split()) or type(e).__name__
        if text.startswith("config key"):
            raise ConfigError(text) from None
        key, value = next(((k, v) for k, (v, word) in (keys or {}).items() if word in text), (key, value))
        raise ConfigError(f"config key '{key}' ({value!r}): {text}") from None


@dataclass(frozen=True)
class Benchmark:
    """A loaded prompt set and the env that scores it. ``dataset``: the source dataset's name;
    ``hash``: the hash of exactly these prompts' source (the sliced set for a validation slice)."""

    name: str
    prompts: list
    env: MathReasoningEnv
    dataset: str
    hash: str
    split: Optional[str]


def resolve_benchmarks(spec) -> list:
    """Benchmark names from ``"all"``, ``"a,b"`` or a list (``all`` expands in place, no repeats)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list = []
    for item in items:
        if not isinstance(item, str):
            out.append(item)
            continue
        for name in (BENCHMARKS if item.strip() == "all" else [item.strip()]):
            if name and name not in out:
                out.append(name)
    if not out:
        raise ValueError(f"no benchmark named in {spec!r}")
    return out


def validation_slice(dataset, size: int, exclude=()) -> list:
    """Indices of the fixed validation slice of a training file: ``size`` items drawn by a seed
    derived from the file's hash, so every run on that file shares it (sorted); never one of the
    indices in ``exclude`` (a held-out slice)."""
    exclude = set(exclude)
    pool = [i for i in range(len(dataset)) if i not in exclude]
    n = len(pool)
    if not 0 < size < n:
        raise ValueError(f"validation slice of {size} items out of {n} in {dataset.name!r}"
                         + (f" (less its {len(exclude)} held-out prompts)" if exclude else "")
                         + f": need 0 < size < {n}")
    return sorted(random.Random(f"val:{dataset.hash}").sample(pool, size))


def heldout_slice(dataset, size: Optional[int]) -> list:
    """Indices of the held-out slice of a training set without a test split: the first ``size`` (all: None) of
    a shuffle seeded by the set's hash, at most ``len // HELDOUT_FRACTION`` of them (sorted). Every run on that
    set shares it, and a smaller size takes a subset. Empty when the set has fewer than HELDOUT_FRACTION items."""
    n = len(dataset)
    order = list(range(n))
    random.Random(f"heldout:{dataset.hash}").shuffle(order)
    return sorted(order[:min(int(size or n), n // HELDOUT_FRACTION)])


def data_kwargs(name, fields: Optional[dict], label_free: bool = False) -> dict:
    """The loader keywords of ``task.fields`` for the dataset ``name``, and ``label_free=True`` (rows without a gold
    answer are kept) when ``label_free``; none for a bundled name: its fields are known, its rows labelled."""
    if name is None or str(name) in bundled_names():
        return {}
    kw = {FIELD_KWARGS[k]: v for k, v in (fields or {}).items() if v is not None}
    return {**kw, "label_free": True} if label_free else kw


def load_labelled(name, **kw) -> MathDataset:
    """``load_dataset`` for an evaluation set, whose every row needs a gold answer: a row without one is a
    DatasetError that says so, instead of suggesting ``task.label_free`` (which keeps such rows of task.dataset)."""
    try:
        return load_dataset(name, **kw)
    except DatasetError as e:
        if LABEL_FREE_HINT not in str(e):
            raise
        raise DatasetError(str(e).replace(LABEL_FREE_HINT, EVAL_NEEDS_GOLD)) from None


def _limited(items, limit: Optional[int]) -> list:
    items = list(items)
    return items if limit is None else items[:int(limit)]


def load_benchmark(bench: Union[str, Path, MathDataset], task: Optional["Task"] = None,
                   limit: Optional[int] = None) -> Benchmark:
    """One benchmark: a dataset name or path, a MathDataset, or ``"heldout"`` (needs the run's
    ``task``); its first ``limit`` prompts. Scored with the task's rewards (defaults without one)."""
    if bench == HELDOUT:
        if task is None:
            raise ValueError("benchmark 'heldout' is the run's held-out split: it needs the run's task (its config)")
        return task.heldout(limit)
    ds = bench if isinstance(bench, MathDataset) else load_labelled(bench)
    env = task.scoring_env(ds) if task is not None else MathReasoningEnv(dataset=ds, **SCORING_DEFAULTS)
    return Benchmark(ds.name, _limited(ds, limit), env, ds.name, ds.hash, ds.split)


class Task:
    """The task of the run config ``cfg`` (module docstring). Envs are built on first use."""

    group_field = "skill"  # prompts are reported by this metadata field (else by source), e.g. add / mul

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.spec = cfg.task
        self.eval = cfg.eval
        self.seed = cfg.run.seed

    # ---- the check before any model is built ------------------------------------------------
    def check(self) -> "Task":
        """Load what the run will use (training set, held-out split, ``eval.benchmarks``, the validation set
        of ``eval.select=val_avg``) and check the prompt templates, so that a bad value fails in one
        ``ConfigError`` line naming its key before any model is built; returns ``self`` (what it loaded is
        kept: the trainer's later use costs nothing more). Needs no model; reads files."""
        spec, ev, run = self.spec, self.eval, self.cfg.run
        config_error("task.env", spec.env, lambda: self.procedural)
        if self.procedural and spec.dataset:
            raise ConfigError(f"config key 'task.dataset' ({spec.dataset!r}) is set, but task.env={spec.env} "
                              f"generates its problems and reads no dataset: set task.env=auto (or "
                              f"graftzoo/MathReasoning-v0) to train on the dataset")
        if self.procedural and spec.label_free:
            raise ConfigError(f"config key 'task.label_free' keeps the unlabelled rows of task.dataset, but "
                              f"task.env={spec.env} generates its problems (with their answers) and reads no "
                              f"dataset: give task.dataset, or drop task.label_free")
        pair = self.cfg.pair
        templates = [("pair.template", pair.template)] + [
            (m.key_of("template"), m.template) for m in pair.models if m.sets("template")]
        for key, name in templates:
            if name is not None and name not in TEMPLATES:
                raise ConfigError(f"config key '{key}' must be a prompt template ({' | '.join(sorted(TEMPLATES))}), "
                                  f"got {name!r}")
        if self.procedural:
            if self.stream and run.epochs:
                raise ConfigError(f"config key 'run.epochs' needs a finite training set, but task.size: null makes "
                                  f"{spec.env} an endless stream: set task.size, or run.steps without run.epochs")
            config_error("task.difficulty", spec.difficulty, lambda: self.train_env,
                         keys={"task.mix": (spec.mix, "mix ")})
        else:
            if not spec.dataset:
                raise ConfigError(f"config key 'task.dataset' is required with task.env={spec.env}: a bundled "
                                  f"name ({', '.join(bundled_names())}), a {' / '.join(FILE_SUFFIXES)} file, a "
                                  f"datasets save_to_disk folder or a Hugging Face Hub name")
            config_error("task.dataset", spec.dataset, lambda: self.train_env,
                         keys={"task.split": (spec.split, "split=")})
        benchmarks = config_error("eval.benchmarks", ev.benchmarks,
                                  lambda: resolve_benchmarks(ev.benchmarks)) if ev.benchmarks else []
        if (ev.dataset or run.eval_at_start or run.eval_at_end or run.eval_every
                or HELDOUT in benchmarks or getattr(self.cfg.algo, "ttt", False)):
            held = config_error("eval.dataset", ev.dataset, lambda: self.heldout())
            if not held.prompts:
                raise ConfigError(f"config key 'eval.dataset' ({ev.dataset!r}): the held-out split is empty")
            self._refuse_unlabelled(held, "eval.dataset", "held-out split")
            self._warn_small_heldout(len(held.prompts))
        for bench in benchmarks:
            if bench != HELDOUT:
                config_error("eval.benchmarks", bench, lambda: load_labelled(bench))
        if ev.select == "val_avg":
            key = "eval.val_dataset" if ev.val_dataset else "eval.val_size"
            val = config_error(key, ev.val_dataset or ev.val_size, lambda: self.validation())
            self._refuse_unlabelled(val, "eval.val_dataset", "validation set of eval.select=val_avg")
            if self.is_test_set(val) and not ev.allow_test_selection:
                raise ConfigError(f"config key 'eval.val_dataset' ({val.name!r}) is a test set: eval.select=val_avg "
                                  f"would pick checkpoints on it; give a validation set or set "
                                  f"eval.allow_test_selection: true")
        return self

    def _refuse_unlabelled(self, bench: Benchmark, key: str, what: str) -> None:
        """A held-out or validation set carved from a label-free ``task.dataset`` (a slice of it, or its test split)
        that holds prompts without a gold answer cannot be scored: one ConfigError naming ``key`` and the numbers."""
        missing = sum(p.gold is None for p in bench.prompts)
        if not missing:
            return
        also = " (and eval.dataset)" if key == "eval.val_dataset" and not self.eval.dataset else ""
        raise ConfigError(f"config key '{key}' is required: the {what} is carved from task.dataset "
                          f"{self.spec.dataset!r} (task.label_free: true), and {missing} of its {len(bench.prompts)} "
                          f"prompts have no gold answer, so it cannot be scored; give a labelled {key}{also}")

    def _warn_small_heldout(self, n: int) -> None:
        """One warning when the held-out split came out smaller than ``eval.min_heldout`` and than ``eval.size``
        asks for (a small file's tenth, a small eval.dataset): each prompt moves its score by 100/n points."""
        ev = self.eval
        if n >= ev.min_heldout or (ev.size is not None and n >= ev.size):
            return
        if ev.dataset:
            source = f"all of eval.dataset {ev.dataset!r}"
        elif self._heldout_indices():
            train = self.train_env.dataset
            source = f"a tenth of the {len(train)} of {train.name!r}, which has no test split"
        else:
            source = f"the test split of {self.heldout().dataset!r}"
        asked = f" and eval.size={ev.size}" if ev.size is not None else ""
        log.warning("held-out split: %d prompts (%s), fewer than eval.min_heldout=%d%s: one prompt moves its score by "
                    "%.0f points; give eval.dataset or more data", n, source, ev.min_heldout, asked, 100 / n)

    # ---- the training task -----------------------------------------------------------------
    @cached_property
    def procedural(self) -> bool:
        """Whether the env generates its problems (its class's ``procedural``) rather than reading a file."""
        entry = gym.spec(self.spec.env).entry_point
        cls = load_env_creator(entry) if isinstance(entry, str) else entry
        return bool(getattr(cls, "procedural", False))

    @property
    def stream(self) -> bool:
        """An endless procedural prompt stream (``task.size: null``) rather than a finite dataset."""
        return self.procedural and self.spec.size is None

    @property
    def env_kwargs(self) -> dict:
        """The scoring settings every env of this task shares."""
        return {**{k: getattr(self.spec, k) for k in SCORING_DEFAULTS}, "verifier_budget": self.spec.verifier_budget,
                "verifier_workers": self.spec.verifier_workers, "verifier_options": self.spec.verifier.model_dump()}

    def check_unverified(self, step: int, model: str, groups) -> None:
        """Apply ``judge_unverified`` to the scored rollouts of ``groups``: a warning, or ``UnverifiedError`` (the
        trainer calls this before the step's update trains on them)."""
        rolls = [r for g in groups for r in g.rollouts]
        verdict = judge_unverified(step, model, sum(r.status == UNVERIFIED for r in rolls), len(rolls), self.spec,
                                   pool_size())
        if verdict is None:
            return
        action, message = verdict
        if action == "error":
            raise UnverifiedError(message)
        log.warning(message)

    def make_env(self, split: str, size: Optional[int] = None) -> MathReasoningEnv:
        """The task's env (unwrapped) on ``split``; ``size`` prompts for a procedural task (default
        ``task.size``, else 1: a stream's env only scores)."""
        kw = self.env_kwargs
        if self.procedural:
            kw.update(size=size or self.spec.size or 1, seed=self.seed if split == "train" else HELDOUT_SEED,
                      mix=self.spec.mix or None, difficulty=self.spec.difficulty or None, split=split)
        else:
            kw.update(dataset=self.spec.dataset, split=split if split != "train" else self.spec.split,
                      **self.data_kwargs(self.spec.dataset, label_free=self.spec.label_free))
        return gym.make(self.spec.env, disable_env_checker=True, **kw).unwrapped

    def scoring_env(self, dataset: MathDataset) -> MathReasoningEnv:
        """An env that scores responses to ``dataset``'s prompts with this task's rewards."""
        return MathReasoningEnv(dataset=dataset, **self.env_kwargs)

    @cached_property
    def train_env(self) -> MathReasoningEnv:
        """Scores training rollouts; its dataset is the prompt source of a finite task."""
        return self.make_env("train")

    @property
    def train_dataset(self) -> Optional[MathDataset]:
        """The finite training set (None for a stream); the sampler leaves out ``reserved_ids``."""
        return None if self.stream else self.train_env.dataset

    @property
    def dataset_id(self) -> str:
        """The name stored trajectories are filed under."""
        if self.stream:
            return "arithmetic"
        return getattr(self.train_env.dataset, "name", self.spec.dataset)

    def data_kwargs(self, name, label_free: bool = False) -> dict:
        """Loader keywords of ``task.fields`` for the run's own dataset ``name`` (module docstring); ``label_free``:
        keep rows without a gold answer (``task.label_free``, for ``task.dataset`` only)."""
        return data_kwargs(name, self.spec.fields.model_dump(), label_free)

    @property
    def reserved_ids(self) -> set:
        """Prompt ids training must leave out: a held-out slice of the training set, and the validation slice
        when ``eval.select=val_avg``."""
        val = self.validation_ids() if self.eval.select == "val_avg" else set()
        return val | {p.id for p in self._heldout_items()}

    @cached_property
    def _test_env(self) -> Optional[MathReasoningEnv]:
        """The env of the task's test split; None when its dataset has none (a file, ``math_train``)."""
        try:
            return self.make_env("test")
        except MissingSplitError:
            return None

    def _heldout_indices(self) -> list:
        """Indices into the training set of its held-out slice: empty unless the held-out split is carved from
        it (no eval.dataset, a dataset without a test split)."""
        if self.eval.dataset or self.procedural or self._test_env is not None:
            return []
        return heldout_slice(self.train_env.dataset, self.eval.size)

    def _heldout_items(self) -> list:
        train = self.train_env.dataset if not self.procedural else None
        return [train[i] for i in self._heldout_indices()]

    # ---- evaluation sets -------------------------------------------------------------------
    def heldout(self, limit: Optional[int] = None) -> Benchmark:
        """The held-out split (module docstring), its first ``limit`` prompts."""
        whole = self._heldout
        return whole if limit is None else replace(whole, prompts=whole.prompts[:int(limit)])

    @cached_property
    def _heldout(self) -> Benchmark:
        ev = self.eval
        if ev.dataset:
            ds = load_labelled(ev.dataset, **self.data_kwargs(ev.dataset))
            prompts, env = _limited(ds, ev.size or None), self.scoring_env(ds)
        elif self.procedural:
            env = self.make_env("test", size=ev.size)
            ds, prompts = env.dataset, list(env.dataset)
        elif self._test_env is not None:
            env = self._test_env
            ds, prompts = env.dataset, _limited(env.dataset, ev.size or None)
        else:  # a held-out slice of the training set, which training leaves out (reserved_ids)
            train, prompts = self.train_env.dataset, self._heldout_items()
            if not prompts:
                raise ValueError(f"config key 'eval.dataset' is required: the task's dataset {train.name!r} has no "
                                 f"test split, and its {len(train)} prompts are too few to hold a tenth of them out "
                                 f"(at least {HELDOUT_FRACTION} needed)")
            sliced = MathDataset(f"{train.name}-heldout", prompts, split="test")
            return Benchmark(HELDOUT, prompts, self.scoring_env(train), train.name, sliced.hash, "test")
        return Benchmark(HELDOUT, prompts, env, ds.name, ds.hash, "test")

    def benchmark(self, bench, limit: Optional[int] = None) -> Benchmark:
        return load_benchmark(bench, self, limit)

    def validation(self, dataset=None, size: Optional[int] = None) -> Benchmark:
        """The validation set of checkpoint selection (module docstring); ``dataset`` / ``size``
        override ``eval.val_dataset`` / ``eval.val_size``."""
        dataset = dataset or self.eval.val_dataset
        size = int(size or self.eval.val_size or DEFAULT_VAL_SIZE)
        if dataset:
            if dataset != HELDOUT and not isinstance(dataset, MathDataset):
                dataset = load_labelled(dataset, **self.data_kwargs(dataset))
            return self.benchmark(dataset, limit=size)
        if self.procedural:
            env = self.make_env("val", size=size)
            return Benchmark("val", list(env.dataset), env, env.dataset.name, env.dataset.hash, "val")
        train, items = self._validation_slice(size)
        sliced = MathDataset(f"{train.name}-val", items, split="val")
        return Benchmark(sliced.name, items, self.scoring_env(train), train.name, sliced.hash, "val")

    def _validation_slice(self, size: int) -> tuple:
        train = self.train_env.dataset  # load_dataset(task.dataset, task.split), loaded once
        return train, [train[i] for i in validation_slice(train, size, exclude=self._heldout_indices())]

    def validation_ids(self) -> set:
        """Prompt ids of the training-file validation slice (empty when the validation set is not
        carved from the training data)."""
        if self.eval.val_dataset or self.procedural:
            return set()
        _, items = self._validation_slice(int(self.eval.val_size or DEFAULT_VAL_SIZE))
        return {p.id for p in items}

    def is_test_set(self, bench: Benchmark) -> bool:
        """Whether a loaded benchmark is a test set: the held-out split, a dataset whose split is
        ``test``, one of the GRAFT benchmarks, or one the run evaluates on (eval.benchmarks/dataset)."""
        listed = set(BENCHMARKS) | {str(b) for b in (self.eval.benchmarks or [])}
        if self.eval.dataset:
            listed.add(Path(str(self.eval.dataset)).stem)
            listed.add(str(self.eval.dataset))
        return bench.name == HELDOUT or bench.split == "test" or bench.dataset in listed
