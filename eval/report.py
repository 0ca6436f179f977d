"""Paper-style result tables from run directories (GRAFT paper Table 1 and Table 9 layouts).

Table 1 (``build_table1``), precisely:

- Rows are methods; a method's cell aggregates its runs over training seeds. A method is an identity, not a spelling
  (``RunFacts.method``): the algorithm, its ``algo.*`` settings, ``rollout.n`` and, with a peer, where its peer groups
  come from, plus the run's label unless that label only names those (the trainer's default ``ALGO (n=N)`` or a
  preset's label, in any case). Each method is shown under one label in every table and figure
  (``method_labels``: the preset's, "GRPO (n=8)" for runs labelled "grpo (n=8)" too; else the spelling most of its
  runs use), and the legend names the spellings it merged. A run contributes to a model's rows when it holds
  ``eval/<model>.json``; runs with status "failed" are skipped. Runs of one method are several rows of a block when a
  seed repeats, and runs of one label but different methods always are (``row_tags``), each row labelled with a
  tag: its folder ("GRPO (n=8) [runs/demo/default]") or the method's settings in which they differ
  ("graft (n=8) [algo.delta 0]"), never one row nor an error.
- Groups (``settings_groups``): runs that differ in a ``COMPARABLE_KEYS`` setting (training steps, eval k, eval
  set) are tabulated in separate groups, each headed by the settings its runs share where the groups differ
  ("steps 40 · eval k=4"), with its own baseline row and Δ; ``allow`` names keys that may differ within a group
  ("*": one group). A table of one group has no heading.
- Blocks: one per group, updated model and peer, titled "<model> (peer: <peer>)". Single-model methods
  (``peers[model]`` is null) are the *baselines*; they appear in every block of their model. A
  model with baselines only gets one block titled "<model>".
- Columns: benchmarks, then Avg. A benchmark cell is mean ± sd over seeds of the eval ``avg``;
  Avg is mean ± sd over seeds of the per-seed mean over the table's benchmarks. A cell needs
  every seed of its row (else "–"); sd is the sample sd (``mean_sd_ci``) and is left out with a
  single seed. Scores are shown x100 (points).
- Δ = Avg mean of the row − Avg mean of the baseline row (default "GRPO (n=8)", found by method whatever case its
  runs wrote it in: ``resolve_label``) of the same block (of two baseline rows with tags, the one with more seeds); a
  block without one has no Δ and says so in one line
  (``Block.note``). Without a named baseline, ``graftzoo report`` takes ``default_baseline`` per group: a row of an
  algorithm whose section declares ``report_baseline`` (``is_report_baseline``; GRPO's does), never one picked by
  its name.
- Significance (``graftzoo.eval.metrics.seed_test``, docs/results.md#marks-of-significance): row X is
  *significantly above* row Y when the two-sided test of their per-seed Avg (paired t-test over the seeds both
  have, Welch's t-test when they share fewer than two) has p < ``SIGNIFICANCE`` (0.05) and X's tested mean is the
  higher. A row with one seed is never significantly above anything.
- Bold: the highest Avg mean among the block's rows with the same rollout budget (``rollout_n``, rollouts per
  prompt per model), where at least two such rows exist, when it is significantly above every other row of that
  budget.
- Marks, for non-baseline rows, with ``budgets=(16, 32)``: a tier k is *covered* in a block when some baseline
  there has budget exactly k. † = tier 16 covered and the row is significantly above every baseline of the block
  with budget ≤ 16; ‡ = the same for tier 32. ‡ is the stronger claim and is shown alone.

Each row also carries the compute charged to its model (``joint_charge``; mean over seeds), used
by ``graftzoo.eval.plots.plot_score_vs_compute``.

``Table.labels`` gives each (run, model) its row's label: what the figures draw it under
(``graftzoo.eval.plots.run_labels``). When every score of the table is 0 there is no best, Δ or mark
(``Table.all_zero``; the legend says so once).

Runs are compared like with like: runs that differ in ``COMPARABLE_KEYS`` (training steps, eval k, eval set) are in
separate groups unless allowed (above). Runs on different tasks (``task_label``:
the training dataset, or the procedural env with its mix) are tabulated in separate blocks, the task in the block
title. Within a block, each row is compared with the baseline row (else with most rows) on every setting that
changes training or scoring (``compare_settings``: the trajectory keys, those a resume may not change, and the
evaluation's; learning rate, a model's own where its pair file sets one, clip, steps, rollout budget,
max_new_tokens, temperature, the model itself, ...). Those in which it differs are in ``Row.differs`` (the "Differs"
column), and ``Table.warnings`` says so in one line per key; a key the row sets by design is left out
(``Row.by_design``: its label states it, "GRPO (n=16)"; its preset sets it; its algorithm clips with its own key; or
the caller's ``design``: a grid method's preset keys and ``clip: own``), and a method's own keys (``algo.*``, its
peer's) are its identity, never a difference.

Aliases (``aliases={label: method}``): one configuration that the paper reports under two labels
(GRAFT's "SGT + GRAFT how" is its "w/o balanced exchange"). The method's row is shown a second time
under the alias label, with the same numbers, Δ, bold and mark (``Row.same_as`` names the method).
"""
from __future__ import annotations

import csv
import dataclasses
import fnmatch
import functools
import io
import json
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from graftzoo.contract import metrics as M
from graftzoo.contract.config import (FREE_TO_CHANGE, HOSTING_MODEL_KEYS, LearnerFacts, as_dict, clip_label,
                                      config_dirs, defaults, named_configs, read_yaml, validate)
from graftzoo.contract.peer_sources import source_label
from graftzoo.contract.registry import get_config, own_clip_keys
from graftzoo.eval.artifacts import RunRecord
from graftzoo.eval.compute import FIELDS, joint_charge
from graftzoo.eval.metrics import SIGNIFICANCE, SeedTest, mean_sd_ci, seed_test

DASH = "–"
MARKS = ("†", "‡")


@dataclass
class Stat:
    """mean and sample sd over seeds (sd None with one value; mean None with none)."""

    mean: Optional[float]
    sd: Optional[float]
    n: int


def _stat(values: Sequence[float]) -> Stat:
    if not values:
        return Stat(None, None, 0)
    if len(values) == 1:
        return Stat(float(values[0]), None, 1)
    mean, sd, _, _ = mean_sd_ci(list(values))
    return Stat(float(mean), float(sd), len(values))


@dataclass
class Row:
    method: str
    budget: int
    baseline: bool                      # a single-model method
    seeds: list
    runs: list                          # run directory paths
    scores: dict                        # benchmark -> Stat (fractions)
    avg: Stat
    delta: Optional[float] = None       # fraction; None for the baseline row itself
    bold: bool = False
    mark: str = ""
    compute: Optional[dict] = None      # mean charged {"wall_s","cpu_s","gpu_h"}
    compute_amortized: Optional[dict] = None
    same_as: Optional[str] = None       # an alias row: the row of this method, under a second label
    clip: str = DASH                    # the clip its runs trained with (``clip_label``), e.g. "0.2/0.2"
    settings: dict = field(default_factory=dict)   # ROW_KEYS key -> its runs' value(s) as text
    by_design: set = field(default_factory=set)    # ROW_KEYS (and "task") the row sets by design: not compared
    differs: dict = field(default_factory=dict)    # ROW_KEYS key -> the reference's value it differs from
    tag: Optional[str] = None           # what tells apart two rows of one method in a block (``row_tags``): their
    #                                     folder ("runs/demo/default") or the settings in which they differ
    per_seed: dict = field(default_factory=dict)   # seed -> Avg of that seed's run (fraction): what ``seed_test`` tests
    p: Optional[float] = None           # p-value of ``seed_test`` against the block's baseline row (None: no test)

    @property
    def label(self) -> str:
        """The method, with its tag where two rows of the method are told apart by it ("GRAFT [runs/demo]")."""
        return self.method if self.tag is None else f"{self.method} [{self.tag}]"


@dataclass
class Block:
    model: str
    peer: Optional[str]
    rows: list
    task: str = DASH                    # what its runs train on (``task_label``)
    show_task: bool = False             # the table spans several tasks: the title names it
    reference: Optional[str] = None     # the row ``Row.differs`` compares with (the baseline); None: most rows
    group: str = ""                     # the label of its ``Group`` ("" in a table of one group)
    note: Optional[str] = None          # one line when the block has no baseline row to measure Δ against

    @property
    def title(self) -> str:
        title = self.model if self.peer is None else f"{self.model} (peer: {self.peer})"
        return f"{title} on {self.task}" if self.show_task else title


@dataclass
class Group:
    """Runs that share their ``COMPARABLE_KEYS`` settings but the allowed ones (``settings_groups``)."""

    label: str                          # the settings where groups differ, "steps 40 · eval k=4" ("": one group)
    settings: dict                      # COMPARABLE_KEYS key -> value, for the keys in which the groups differ
    runs: list                          # its RunRecords, failed ones included
    baseline: Optional[str] = None      # the method its Δ is measured against (None: no baseline row)

    @property
    def slug(self) -> str:
        """A folder name for the group's figures: its label in letters, digits, dots and dashes."""
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.label.replace("=", "")).strip("-").lower() or "all"


@dataclass
class Table:
    benchmarks: list
    blocks: list
    baseline: str                       # the first group's baseline ("" when it has none)
    budgets: tuple
    digits: int = 1
    all_zero: bool = False              # every score is 0: no bold, Δ or marks
    warnings: list = field(default_factory=list)   # one line per setting in which rows differ (not like for like)
    groups: list = field(default_factory=list)     # its ``Group``s, in the order of its sections
    labels: dict = field(default_factory=dict)     # (run path, model) -> the label of its row: what figures draw
    spellings: dict = field(default_factory=dict)  # shown label -> other labels its runs wrote (``label_spellings``)


@dataclass
class ClipRow:
    method: str
    model: str
    peer: Optional[str]
    seeds: list
    own: Stat
    peer_tokens: Stat


@dataclass
class ClipTable:
    rows: list = field(default_factory=list)
    digits: int = 2


def _mean_dicts(dicts: list) -> Optional[dict]:
    if not dicts or any(d is None for d in dicts):
        return None
    return {k: sum(d[k] for d in dicts) / len(dicts) for k in FIELDS}


COMPARABLE_KEYS = ("run.steps", "run.epochs", "eval.k", "eval.dataset", "eval.size", "eval.benchmarks")
"""Config keys every run of one group of a table shares (``settings_groups``)."""


ROW_KEYS = ("rollout.n", "task.prompts_per_step", "clip", "optim.lr") + COMPARABLE_KEYS
"""The settings a Differs cell and the warnings name first, in this order (the rollout budget, the effective clip as
``clip_label`` writes it, the learning rate, the ``COMPARABLE_KEYS``); the other ``compare_settings`` keys follow in
alphabetical order."""

TASK_KEYS = ("task.dataset", "task.split", "task.env", "task.mix", "task.difficulty", "task.size")
"""What a run trains on (``task_label``); runs on different tasks are tabulated in separate blocks."""

TRAJECTORY_FREE = FREE_TO_CHANGE
"""The keys that do not change a run's training trajectory (``graftzoo.contract.config.FREE_TO_CHANGE``, the keys a
resume may change). Every other key is a *trajectory key*; ``HOSTING_MODEL_KEYS``: a ``pair.models`` entry's keys
that say where a model runs, not what it learns."""

SCORE_KEYS = ("eval.greedy", "eval.temperature", "eval.max_new_tokens", "eval.top_p")
"""Evaluation keys that are free to change on resume (``TRAJECTORY_FREE``) but change the score a row reports."""

PER_RUN_KEYS = ("run.seed", "pair.name", "pair.train", "peer.path")
"""Keys in which the runs of one row may differ: the seed, the pair file's name and which of its models train (a row
is one model's), and the stored peer's folder."""

METHOD_PREFIXES = ("algo.",)
"""Keys of a method's identity: its algorithm's section (``algo.*``: GRAFT's gate, DAPO's dynamic sampling, ...) and,
for a method that learns from a peer, ``PEER_PREFIXES``; with ``rollout.n``, they make rows of different methods."""

PEER_PREFIXES = ("peer.", "xt.")
"""Where a peer method's peer groups come from and how they cross tokenizers: part of its identity (ignored for a
method without a peer, which never reads them)."""

_MODEL_RUN_KEYS = {"template": "pair.template", "stop": "rollout.stop", "max_new_tokens": "rollout.max_new_tokens",
                   "lr": "optim.lr", "gradient_checkpointing": "model.gradient_checkpointing",
                   "lora": "model.lora", "attn_implementation": "model.attn_implementation"}
"""Run keys a ``pair.models`` entry may set for its model (``graftzoo.contract.config.MODEL_RUN_KEYS`` less its
hosting keys): a row's value is its model's own where the entry sets one (a pair file's per-model ``lr``)."""


def _config_value(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def task_label(config: dict) -> str:
    """What a run trains on, in a few words: ``task.dataset`` (with ``task.split`` when it is not train), else the
    procedural env with its mix, difficulty and size (``graftzoo/Arithmetic-v0 (add:1 mul:1; difficulty 2)``)."""
    task = config.get("task") or {}
    if task.get("dataset"):
        split = task.get("split")
        return str(task["dataset"]) + (f"[{split}]" if split not in (None, "train") else "")
    env = task.get("env")
    env = "graftzoo/Arithmetic-v0" if env == "auto" else str(env or DASH)   # auto: as the config resolves it

    def words(value) -> str:
        if isinstance(value, dict):
            return " ".join(f"{k}:{v:g}" if isinstance(v, (int, float)) else f"{k}:{v}" for k, v in value.items())
        return str(value)

    parts = [words(task["mix"])] if task.get("mix") else []
    parts += [f"difficulty {words(task['difficulty'])}"] if task.get("difficulty") else []
    parts += [f"size {task['size']}"] if task.get("size") else []
    return f"{env} ({'; '.join(parts)})" if parts else env


def _under(key: str, prefixes) -> bool:
    """Whether ``key`` is one of ``prefixes`` or below one (``task.mix.add`` is under ``task.mix``)."""
    return any(key == p.rstrip(".") or key.startswith(p if p.endswith(".") else p + ".") for p in prefixes)


def design_keys(dotted) -> set:
    """The compared settings (``compare_settings`` keys, "clip" and "task") that config keys set by design define,
    e.g. the keys of a grid method's preset: ``optim.clip.*`` and an algorithm's own clip key define "clip",
    ``TASK_KEYS`` define "task", any other key itself (grpo_n16's ``rollout.n``)."""
    out, own_clip = set(), own_clip_keys()
    for k in dotted:
        if k.startswith("optim.clip") or k in own_clip:
            out.add("clip")
        elif _under(k, TASK_KEYS):
            out.add("task")
        else:
            out.add(k)
    return out


def _label_states(label: str, key: str, value: str) -> bool:
    """Whether a method label states the row's value of ``key``: "GRPO (n=16)" (and the default "grpo (n=16)")
    states rollout.n 16."""
    return key == "rollout.n" and re.search(rf"(?<![\w.])n\s*=\s*{re.escape(value)}(?!\d)", label) is not None


def _setting_text(value) -> str:
    """A setting's value as a table shows it: "–" for none, floats in short form (``5e-05``, ``0.0001``)."""
    if value is None:
        return DASH
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_setting_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_setting_text(v)}" for k, v in value.items()) + "}"
    return str(value)


# ---------------------------------------------------------------- what a run is: its method and its settings

def flatten(node: dict, prefix: str = "") -> dict:
    """Dotted key -> value of a nested config (``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": 1e-4}``); an empty
    mapping and ``pair.models`` (a list) stay whole."""
    out = {}
    for k, v in (node or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _equal(a, b) -> bool:
    """Whether two config values are one setting (``[0.9, 0.999]`` = ``(0.9, 0.999)``, ``1`` = ``1.0``)."""
    return a == b or _json(a) == _json(b)


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _plain(value):
    """A resolved config value as plain data (a section, such as a model's ``lora``, as its mapping)."""
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def normalize_label(label: str) -> str:
    """A label as labels are matched: case and runs of white space do not count ("GRPO  (N=8)" = "grpo (n=8)")."""
    return " ".join(str(label).split()).casefold()


def default_label(flat: dict) -> str:
    """The label the trainer gives a run that names none, from its dotted config ``flat``: ``ALGO (n=N)``, with
    the peer source's label (", stored peer" / ", mixed peer" when it learns from stored trajectories;
    graftzoo.contract.peer_sources)."""
    return f"{flat.get('algo.name')} (n={flat.get('rollout.n')}{source_label(flat.get('peer.source'))})"


def _label_names_other(label: str, key: str, value) -> bool:
    """Whether a label names another value of ``key`` than the run's: "GRPO (n=32)" for a run at rollout.n 16."""
    named = re.findall(r"(?<![\w.])n\s*=\s*(\d+)(?!\d)", label) if key == "rollout.n" else []
    return any(int(n) != value for n in named)


@functools.lru_cache(maxsize=None)
def _declared_defaults() -> str:
    return _json(flatten(defaults()))


@functools.lru_cache(maxsize=8)
def _presets(folders: tuple) -> tuple:
    """(name, settings, label) of each algorithm preset (``configs/algos/*.yaml``; ``folders`` only keys the cache):
    its dotted settings but ``run.variant`` as JSON text, and its ``run.variant`` (None without one)."""
    out = []
    for name, path in named_configs("algos").items():
        try:
            flat = flatten(read_yaml(path))
        except (OSError, ValueError):   # a broken preset file: graftzoo algos list says so, the report reads on
            continue
        label = flat.pop("run.variant", None)
        out.append((name, _json(flat), None if label is None else str(label)))
    return tuple(out)


def presets() -> tuple:
    """The algorithm presets as ``_presets`` gives them, of the configs folders in use (./configs first)."""
    return _presets(tuple(str(d.resolve()) for d in config_dirs()))


@dataclass(frozen=True)
class RunFacts:
    """What the report reads from a run's config once (``run_facts``): the method it is a run of, and its settings.

    ``method`` is the method's identity: its algorithm, ``rollout.n``, its ``METHOD_PREFIXES`` keys (and
    ``PEER_PREFIXES`` keys with a peer), and its label unless the label only names those (``descriptive``: the
    trainer's default ``ALGO (n=N)`` or the label of a preset whose settings the run has, in any case). Runs of one
    identity are one method whatever the case or spacing of a descriptive label; ``canonical`` is the label of the
    preset such a run is a run of ("GRPO (n=8)" for the trainer's "grpo (n=8)"), None without one."""

    label: str                       # run.variant as the run wrote it
    method: tuple                    # the identity (see above): what rows of one method share
    identity: dict                   # its identity keys -> value, for telling two methods of one label apart
    canonical: Optional[str]         # the preset's label of a descriptive method; None: none
    design: frozenset                # compared settings its preset sets (``design_keys``): differences by design
    settings: dict                   # compared key -> value, run-wide keys (``compare_settings``)
    models: dict                     # model id -> {compared key -> value} of the keys its pair.models entry decides
    clip: str                        # ``clip_label`` of the effective clip ("?": unresolved)
    own_clip: bool                   # its algorithm clips with a key of its own (GSPO, HACPO)

    def compared(self, model: str) -> dict:
        """The run's compared settings for ``model``'s row: run-wide, the model's own (in place of the run keys its
        ``pair.models`` entry may set), and "clip"."""
        own = self.models.get(model)
        if own is None:
            return {**self.settings, "clip": self.clip}
        shared = {k: v for k, v in self.settings.items() if not _under(k, _MODEL_RUN_KEYS.values())}
        return {**shared, **own, "clip": self.clip}


def compared_key(key: str) -> bool:
    """Whether a row is compared with its baseline on the config key ``key`` (``compare_settings``): a trajectory key
    (not ``TRAJECTORY_FREE``) or one that decides how it is scored (``COMPARABLE_KEYS``, ``SCORE_KEYS``), but not a
    key of ``PER_RUN_KEYS``, ``TASK_KEYS`` (blocks), a method's identity, the clip's own keys (one "clip" setting) or
    ``pair.models`` (the model's own entry, per block)."""
    if key in COMPARABLE_KEYS or key in SCORE_KEYS:
        return True
    if any(fnmatch.fnmatchcase(key, pat) for pat in TRAJECTORY_FREE) or key in PER_RUN_KEYS:
        return False
    return not (_under(key, TASK_KEYS) or _under(key, METHOD_PREFIXES + PEER_PREFIXES)
                or key.startswith("optim.clip") or key == "pair.models")


def _model_settings(entry: dict, resolved: dict, run_flat: dict) -> dict:
    """A ``pair.models`` entry's compared settings: each ``_MODEL_RUN_KEYS`` run key at the model's value (its own
    where the entry sets it, ``resolved``) and its other keys as ``pair.models[ID].KEY`` (what builds the model)."""
    out = {run_key: resolved.get(k, entry.get(k) if entry.get(k) is not None else run_flat.get(run_key))
           for k, run_key in _MODEL_RUN_KEYS.items()}
    rest = {k: v for k, v in entry.items() if k not in _MODEL_RUN_KEYS and k not in HOSTING_MODEL_KEYS and k != "id"}
    out.update({f"pair.models[{entry['id']}].{k}": v for k, v in flatten(rest).items()})
    return out


@functools.lru_cache(maxsize=4096)
def _facts(config_json: str, label: str, preset_key: tuple) -> RunFacts:
    """``run_facts`` of a config (JSON text), its label and the presets (``presets``)."""
    raw = json.loads(config_json)
    try:
        cfg = validate(raw)
        flat = flatten(as_dict(cfg))
        clip = cfg.algo.effective_clip(LearnerFacts.of(cfg))
        clip_text, own = clip_label(clip), clip != {**cfg.optim.clip.model_dump(), "ratio": "token"}
        resolved = {spec.id: {k: _plain(getattr(spec, k)) for k in _MODEL_RUN_KEYS} for spec in cfg.pair.models}
    except (ValueError, KeyError, TypeError, RuntimeError):  # ConfigError, RegistryError: an unknown algorithm
        flat = {**json.loads(_declared_defaults()), **flatten(raw)}
        if "algo.name" not in flatten(raw):
            flat["algo.name"] = None
        clip_text, own, resolved = "?", False, {}
    peer = flat.get("peer.source") not in (None, "none")
    identity = {k: v for k, v in flat.items()
                if _under(k, METHOD_PREFIXES) or (peer and _under(k, PEER_PREFIXES) and k not in PER_RUN_KEYS)}
    identity["rollout.n"] = flat.get("rollout.n")
    matched = [(name, json.loads(settings), plabel) for name, settings, plabel in preset_key]
    matched = [(name, settings, plabel) for name, settings, plabel in matched
               if all(_equal(flat.get(k), v) for k, v in settings.items())]
    own_label = normalize_label(label)
    named = [p for p in matched if p[2] is not None and normalize_label(p[2]) == own_label]
    descriptive = bool(named) or own_label == normalize_label(default_label(flat))
    canonical = None
    if descriptive:
        labelled = named or [p for p in matched if p[2] is not None]
        canonical = labelled[0][2] if labelled else None
    # a run with every setting of a preset is a run of it: the preset's keys are its design, unless its label names
    # another value of one ("GRPO (n=32)" at the n=16 of grpo_n16: rollout.n differs from what it says); never the
    # clip, one setting for every method of a comparison (docs/algorithms.md#one-clip-for-every-method)
    design = {k for _, settings, _ in matched for k in design_keys(settings)
              if k != "clip" and not _label_names_other(label, k, flat.get(k))}
    method = (_json(sorted(identity.items())), None if descriptive else own_label)
    models = {}
    for entry in flat.get("pair.models") or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            models[entry["id"]] = _model_settings(entry, resolved.get(entry["id"], {}), flat)
    settings = {k: v for k, v in flat.items() if compared_key(k)}
    return RunFacts(label=label, method=method, identity=identity, canonical=canonical, design=frozenset(design),
                    settings=settings, models=models, clip=clip_text, own_clip=own)


def run_facts(run: RunRecord) -> RunFacts:
    """The run's ``RunFacts``, read once per config (cached): its method identity and its compared settings. A config
    that does not validate (an algorithm not installed here, a hand-written config) is read as written over the
    declared defaults, its clip "?"."""
    return _facts(_json(run.config), run.variant, presets())


def compare_settings(run: RunRecord, model: str) -> dict:
    """The settings a row of ``run``'s ``model`` is compared on (``Row.differs``): every trajectory key of the run's
    config (those a resume may not change: all but ``TRAJECTORY_FREE``) and the keys that decide how it is scored
    (``COMPARABLE_KEYS``, ``SCORE_KEYS``), less ``PER_RUN_KEYS``, the task (``TASK_KEYS``: its own blocks) and the
    method's identity (``METHOD_PREFIXES``, ``PEER_PREFIXES``); the clip as one key "clip" (the effective clip, as
    ``clip_label`` writes it), and the model's own values where its ``pair.models`` entry sets them (``optim.lr`` is
    the model's learning rate; ``pair.models[ID].KEY`` what builds it)."""
    return run_facts(run).compared(model)


def _key_order(key: str) -> tuple:
    """Differs cells and warnings name ``ROW_KEYS`` first, in their order, then the other keys alphabetically."""
    return (ROW_KEYS.index(key), "") if key in ROW_KEYS else (len(ROW_KEYS), key)


SETTING_WORDS = {"run.steps": "steps {}", "run.epochs": "epochs {}", "eval.k": "eval k={}",
                 "eval.dataset": "eval on {}", "eval.size": "eval size {}", "eval.benchmarks": "benchmarks {}"}
"""How a group heading says each ``COMPARABLE_KEYS`` setting."""


def _setting_words(key: str, value) -> str:
    if key == "eval.dataset" and value is None:
        return "eval on the held-out split"
    if isinstance(value, (list, tuple)):
        value = ", ".join(str(v) for v in value) or "none"
    return SETTING_WORDS.get(key, key + " {}").format(DASH if value is None else value)


def _natural(value) -> tuple:
    """A sort key that puts numbers in numeric order before text (steps 6, 20, 40)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, repr(value))


def few(names: Sequence[str], most: int = 4) -> str:
    """``names`` joined with commas, at most ``most`` of them, then "and N more": a refusal stays one line."""
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def settings_groups(runs: Sequence[RunRecord], allow: Sequence[str] = ("*",)) -> list:
    """The runs split by their ``COMPARABLE_KEYS`` settings (training length, eval k, eval set), the keys matched by
    ``allow`` ("*": all of them, one group; "eval.*" patterns work) left out: a list of ``Group`` in the natural
    order of their settings (steps 6, 20, 40). A group's label names its values of the keys in which the groups
    differ, joined by " · " ("steps 40 · eval k=4"); one group has the label "". A group of failed runs only is left
    out (it has no row)."""
    keys = [k for k in COMPARABLE_KEYS if not any(fnmatch.fnmatchcase(k, pat) for pat in allow)]
    by_key: dict = {}
    for run in runs:
        values = tuple(_config_value(run.config, k) for k in keys)
        by_key.setdefault(repr(values), (values, []))[1].append(run)
    live = [(values, members) for values, members in by_key.values() if any(r.status != "failed" for r in members)]
    live.sort(key=lambda vm: tuple(_natural(v) for v in vm[0]))
    differ = [i for i, _ in enumerate(keys) if len({repr(values[i]) for values, _ in live}) > 1]
    return [Group(label=" · ".join(_setting_words(keys[i], values[i]) for i in differ),
                  settings={keys[i]: values[i] for i in differ}, runs=members) for values, members in live]


def parent_tags(runs: Sequence[RunRecord]) -> dict:
    """str(run path) -> each run's parent folder relative to the folder they share, or to the one above it when that
    is one's parent ("runs", "runs/demo/default")."""
    paths = {str(r.path): Path(r.path).resolve() for r in runs}
    common = Path(os.path.commonpath([p.parent for p in paths.values()]))
    root = common.parent if any(p.parent == common for p in paths.values()) else common
    return {k: os.path.relpath(p.parent, root) for k, p in paths.items()}


def folder_tags(runs: Sequence[RunRecord]) -> dict:
    """str(run path) -> the folder that tells apart ``runs`` of one method whose seeds repeat: its ``parent_tags``
    folder; the run's own path (relative to the same folder) where two runs of a seed share their parent folder
    too."""
    parents = parent_tags(runs)
    if max(Counter((parents[str(r.path)], r.seed) for r in runs).values()) > 1:
        paths = {str(r.path): Path(r.path).resolve() for r in runs}
        common = Path(os.path.commonpath([p.parent for p in paths.values()]))
        root = common.parent if any(p.parent == common for p in paths.values()) else common
        return {k: os.path.relpath(p, root) for k, p in paths.items()}
    return parents


def repeat_tags(runs: Sequence[RunRecord], seeds: Sequence) -> dict:
    """``folder_tags`` of ``runs`` where ``seeds`` (a seed, or a (model, seed), per member) repeat; else {}: the runs
    of one row or series that must be told apart by their folders."""
    return folder_tags(runs) if len(set(seeds)) < len(seeds) else {}


def method_labels(runs: Sequence[RunRecord]) -> dict:
    """str(run path) -> the label its method is shown under: one label per method (``RunFacts.method``), the same in
    every table and figure. A method whose runs carry a preset's label in any case (``RunFacts.canonical``) is shown
    under the preset's label ("GRPO (n=8)" for the trainer's default "grpo (n=8)" too); any other as most of its runs
    spell their label, then as the first in path order spells it."""
    spellings: dict = {}
    for run in sorted(runs, key=lambda r: str(r.path)):
        facts = run_facts(run)
        counts = spellings.setdefault(facts.method, (Counter(), Counter()))
        if facts.canonical is not None:
            counts[0][facts.canonical] += 1
        counts[1][run.variant] += 1
    shown = {method: (preset or own).most_common(1)[0][0] for method, (preset, own) in spellings.items()}
    return {str(run.path): shown[run_facts(run).method] for run in runs}


def method_of(run: RunRecord, labels: dict) -> str:
    """A run's method label as ``method_labels`` gives it."""
    return labels.get(str(run.path), run.variant)


def resolve_label(name: Optional[str], runs: Sequence[RunRecord], labels: Optional[dict] = None) -> Optional[str]:
    """The shown label (``method_labels``) that ``name`` names: itself, a shown label in another case or spacing
    ("grpo (n=8)" for "GRPO (n=8)"), or the shown label of runs that wrote ``name`` as their own label; None when no
    method of ``runs`` has that name."""
    if name is None:
        return None
    labels = method_labels(runs) if labels is None else labels
    shown = sorted(set(labels.values()))
    if name in shown:
        return name
    wanted = normalize_label(name)
    for label in shown:
        if normalize_label(label) == wanted:
            return label
    for run in sorted(runs, key=lambda r: str(r.path)):
        if normalize_label(run.variant) == wanted and str(run.path) in labels:
            return labels[str(run.path)]
    return None


def label_spellings(runs: Sequence[RunRecord], labels: dict) -> dict:
    """Shown label -> the other labels its runs wrote ("GRPO (n=8)" -> ["grpo (n=8)"]): what a table's caption says
    it merged; labels shown as written are left out."""
    out: dict = {}
    for run in sorted(runs, key=lambda r: str(r.path)):
        shown = labels.get(str(run.path))
        if shown is not None and run.variant != shown:
            out.setdefault(shown, [])
            if run.variant not in out[shown]:
                out[shown].append(run.variant)
    return out


def is_report_baseline(algo) -> bool:
    """Whether the algorithm ``algo`` (a run's ``algo.name``) is one a report compares against when no baseline is
    named: its ``algo.*`` section declares ``report_baseline`` (``AlgoSection``; GRPO's does). False for a name
    that is not a registered algorithm."""
    if not isinstance(algo, str) or not algo:
        return False
    try:
        section = get_config(algo)
    except (ValueError, RuntimeError):  # RegistryError: unknown here; ConfigError: a local plugin failed to import
        return False
    return bool(section.report_baseline)


def baseline_runs(runs: Sequence[RunRecord]) -> list:
    """The runs ``default_baseline`` chooses among: not failed, with an eval file, every evaluated model trained
    alone (no peer), of an algorithm that ``is_report_baseline`` (its presets included)."""
    known: dict = {}   # algorithm name -> is_report_baseline, looked up once

    def declared(algo) -> bool:
        if not isinstance(algo, str):
            return False
        if algo not in known:
            known[algo] = is_report_baseline(algo)
        return known[algo]

    return [run for run in runs if run.status != "failed" and declared(run.summary.get("algo")) and run.evals
            and all(run.peers[m] is None for m in run.evals)]


def default_baseline(runs: Sequence[RunRecord], labels: Optional[dict] = None) -> Optional[str]:
    """The baseline when none is named: of the baseline rows (``baseline_runs``: single-model runs of an algorithm
    whose section declares ``report_baseline``, GRPO's and its presets' among the builtins), the one with the most
    seeds, then the smallest rollout budget, then the first label; None when the runs have no such row. ``labels``:
    the table's ``method_labels`` (default: those of ``runs``)."""
    labels = method_labels(runs) if labels is None else labels
    seeds: dict = {}
    for run in baseline_runs(runs):
        seeds.setdefault((method_of(run, labels), run.rollout_n), set()).add(run.seed)
    if not seeds:
        return None
    (label, _), _ = min(seeds.items(), key=lambda kv: (-len(kv[1]), kv[0][1], kv[0][0]))
    return label


def row_labels(runs: Sequence[RunRecord]) -> list:
    """The method labels of the table's rows (the runs that are tabulated: not failed, with an eval file)."""
    labels = method_labels(runs)
    return sorted({method_of(r, labels) for r in runs if r.status != "failed" and r.evals})


def _identity(run: RunRecord) -> str:
    """The method a run is a run of, as text: its identity (``RunFacts.method``) and identity keys."""
    facts = run_facts(run)
    return _json([facts.method, sorted(facts.identity.items())])


def row_tags(members: list) -> dict:
    """str(run path) -> the tag that tells apart rows of one label in one block (None or absent: one row), for
    ``members`` (run, model) of one label, model, peer, task and group. Runs of one method are one row, their
    settings joined where they differ (the Differs column says so), unless a seed repeats: then a row per pair file
    where the runs of each pair file have a seed each (a single-model method run with a pair and with a larger
    population: "pair tiny3"), else a row per folder (``repeat_tags``). Runs of one label but of different methods (another ``algo.*`` setting, say, under the
    trainer's default label) are never one row: a row per folder (``parent_tags``) where each folder holds runs of one
    method and seed, else a row per method, tagged with the keys in which they differ ("algo.delta 0"), and its folder
    too where a seed repeats in it."""
    runs = [run for run, _ in members]
    ident = {str(run.path): _identity(run) for run in runs}
    if len(set(ident.values())) == 1:
        pairs = {str(run.path): str(run.summary.get("pair")) for run in runs}
        if len(set(pairs.values())) > 1 and all(  # the model trained in pairs or populations of other names
                len({r.seed for r in runs if pairs[str(r.path)] == p}) == sum(v == p for v in pairs.values())
                for p in set(pairs.values())):
            return {path: f"pair {p}" for path, p in pairs.items()}
        return repeat_tags(runs, [run.seed for run in runs])
    folders = parent_tags(runs)
    per_folder: dict = {}
    for run in runs:
        per_folder.setdefault(folders[str(run.path)], []).append(run)
    if all(len({ident[str(r.path)] for r in mine}) == 1 and len({r.seed for r in mine}) == len(mine)
           for mine in per_folder.values()):
        return folders
    values = {str(run.path): run_facts(run).identity for run in runs}
    keys = sorted({k for v in values.values() for k in v}, key=_key_order)
    differ = [k for k in keys if len({_json(v.get(k)) for v in values.values()}) > 1]
    words = {path: ", ".join(f"{k} {_setting_text(v.get(k))}" for k in differ) or "label"
             for path, v in values.items()}
    out = {}
    for text in dict.fromkeys(words.values()):
        mine = [run for run in runs if words[str(run.path)] == text]
        sub = repeat_tags(mine, [run.seed for run in mine])
        out.update({str(run.path): text if not sub else f"{text}; {sub[str(run.path)]}" for run in mine})
    return out


def _group(runs: Sequence[RunRecord], groups: Sequence[Group], labels: dict) -> dict:
    """(model, peer, method, task, group label, tag) -> list of (run, model). ``tag`` (``row_tags``) is None unless
    the runs of one (model, peer, method, task, group) are several rows: a seed repeats, or they differ in a setting."""
    group_of = {str(r.path): g.label for g in groups for r in g.runs}
    keyed: dict = {}
    for run in runs:
        if run.status == "failed" or str(run.path) not in group_of:
            continue
        for model in run.evals:
            key = (model, run.peers[model], method_of(run, labels), task_label(run.config), group_of[str(run.path)])
            keyed.setdefault(key, []).append((run, model))
    out: dict = {}
    for key, members in keyed.items():
        tags = row_tags(members)
        for run, model in members:
            out.setdefault(key + (tags.get(str(run.path)),), []).append((run, model))
    return out


def _charges(run: RunRecord, model: str) -> tuple:
    try:
        c = joint_charge(run.summary)[model]
    except KeyError:
        return None, None
    return c["charged"], c["amortized"]


def _make_row(method: str, members: list, benchmarks: list, tag: Optional[str] = None) -> Row:
    """The row of ``members`` (run, model) of one method: scores and Avg over seeds, compute, and its compared
    settings (``compare_settings``; values its runs disagree on joined by "; "), with the keys it sets by design."""
    members = sorted(members, key=lambda rm: rm[0].seed)
    budgets = {run.rollout_n for run, _ in members}
    if len(budgets) > 1:
        raise ValueError(f"method {method!r}: runs disagree on rollout_n {sorted(budgets)}: "
                         + few([str(r.path) for r, _ in members], 3) + "; give them distinct run.variant labels")
    per_bench = {b: [] for b in benchmarks}
    per_seed, complete = {}, True
    for run, model in members:
        got = run.evals[model]["benchmarks"]
        for b in benchmarks:
            if b in got:
                per_bench[b].append(float(got[b]["avg"]))
        if all(b in got for b in benchmarks):
            per_seed[run.seed] = sum(float(got[b]["avg"]) for b in benchmarks) / len(benchmarks)
        else:
            complete = False
    n = len(members)
    scores = {b: _stat(v) if len(v) == n else Stat(None, None, len(v))
              for b, v in per_bench.items()}
    charged, amortized = zip(*(_charges(run, model) for run, model in members))
    first_run, model = members[0]
    facts = [run_facts(run) for run, _ in members]
    per_run = [compare_settings(run, m) for run, m in members]
    keys = sorted({k for s in per_run for k in s}, key=_key_order)
    settings = {k: "; ".join(dict.fromkeys(_setting_text(s.get(k)) for s in per_run)) for k in keys}
    by_design = {k for k, v in settings.items() if _label_states(method, k, v)}
    by_design |= set.intersection(*(set(f.design) for f in facts))   # what every run's preset sets
    by_design |= {"clip"} if all(f.own_clip for f in facts) else set()
    return Row(method=method, budget=budgets.pop(), baseline=first_run.peers[model] is None,
               seeds=[r.seed for r, _ in members], runs=[str(r.path) for r, _ in members],
               scores=scores, avg=_stat(list(per_seed.values())) if complete else Stat(None, None, 0),
               compute=_mean_dicts(list(charged)), compute_amortized=_mean_dicts(list(amortized)),
               clip=settings["clip"], settings=settings, by_design=by_design, tag=tag,
               per_seed=per_seed if complete else {})


def _baseline_row(rows: list, baseline: Optional[str]) -> Optional[Row]:
    """The block's row of ``baseline`` (of two, told apart by their tags, the one with more seeds, then the first
    tag)."""
    rows = [r for r in rows if r.method == baseline and r.same_as is None]
    return min(rows, key=lambda r: (-len(r.seeds), r.tag or "")) if rows else None


def _compare(block: Block, base: Optional[Row]) -> None:
    """``Row.differs``: each compared setting (``compare_settings``) in which a row differs from the block's baseline
    row ``base`` (else from the value most of its rows share), unless the row sets that key by design
    (``Row.by_design``); a clip that cannot be resolved ("?") is not compared."""
    block.reference = base.label if base is not None else None
    for key in sorted({k for r in block.rows for k in r.settings}, key=_key_order):
        ref = base.settings.get(key, DASH) if base is not None else Counter(
            r.settings.get(key, DASH) for r in block.rows).most_common(1)[0][0]
        for r in block.rows:
            value = r.settings.get(key, DASH)
            if r is not base and value != ref and key not in r.by_design and "?" not in (ref, value):
                r.differs[key] = ref


def _warnings(blocks: list, design: dict) -> list:
    """One line per setting in which rows differ (``Row.differs``), naming the rows and values, and one line when
    the rows train on several tasks (a row whose task is its point, ``design``, left out)."""
    by_key: dict = {}
    for b in blocks:
        for r in b.rows:
            if r.same_as is None:   # an alias row repeats another row
                for key, ref in r.differs.items():
                    rows, refs = by_key.setdefault(key, ({}, {}))
                    rows.setdefault(r.label, r.settings[key])
                    refs.setdefault(b.reference or "most rows", ref)
    lines = [f"not like for like: rows differ in {key}: " + ", ".join(f"{m} {v}" for m, v in rows.items())
             + " vs " + ", ".join(f"{m} {v}" for m, v in refs.items()) + " (the Differs column of Table 1)"
             for key, (rows, refs) in sorted(by_key.items(), key=lambda kv: _key_order(kv[0]))]
    tasks: dict = {}
    for b in blocks:
        methods = tasks.setdefault(b.task, [])
        methods += [r.method for r in b.rows if r.same_as is None and r.method not in methods
                    and "task" not in design.get(r.method, ())]
    tasks = {t: m for t, m in tasks.items() if m}
    if len(tasks) > 1:
        lines.append(f"not like for like: rows train on {len(tasks)} tasks, tabulated in one block each: "
                     + "; ".join(f"{t} ({', '.join(m)})" for t, m in tasks.items()))
    return lines


def _order(rows: list, methods: Optional[Sequence[str]]) -> list:
    first = list(methods or [])

    def key(r: Row):
        if r.method in first:
            return (0, first.index(r.method), 0, "", r.tag or "")
        return (1 if r.baseline else 2, 0, r.budget, r.method, r.tag or "")

    return sorted(rows, key=key)


def significantly_above(row: Row, other: Row) -> bool:
    """Whether ``row``'s per-seed Avg is significantly above ``other``'s (``seed_test``: paired t-test over the
    seeds both have, else Welch's t-test; p < ``SIGNIFICANCE``); never with one seed on either side."""
    test = seed_test(other.per_seed, row.per_seed)
    return test is not None and test.significant and test.diff > 0


def _decorate(block: Block, base: Optional[Row], budgets: tuple) -> None:
    """Δ and its p-value against ``base``, bold and marks (module docstring): every claim a ``seed_test``."""
    rows = [r for r in block.rows if r.avg.mean is not None]
    for r in rows:
        if base is not None and r is not base and base.avg.mean is not None:
            r.delta = r.avg.mean - base.avg.mean
            test = seed_test(base.per_seed, r.per_seed)
            r.p = None if test is None else test.p
    by_budget: dict = {}
    for r in rows:
        by_budget.setdefault(r.budget, []).append(r)
    for same in by_budget.values():
        if len(same) >= 2:
            best = max(same, key=lambda r: r.avg.mean)
            best.bold = all(significantly_above(best, r) for r in same if r is not best)
    baselines = [r for r in rows if r.baseline]
    for r in rows:
        if r.baseline:
            continue
        for mark, k in reversed(list(zip(MARKS, budgets))):
            tier = [b for b in baselines if b.budget <= k]
            if any(b.budget == k for b in tier) and all(significantly_above(r, b) for b in tier):
                r.mark = mark
                break


def _group_blocks(group: Group, keyed: dict, benchmarks: list, tasks: list, budgets: tuple, methods: list,
                  aliases: dict, design: dict) -> list:
    """The blocks of one ``Group``: one per model, peer and task, each with Δ against the group's baseline row."""
    blocks = []
    mine = {key: members for key, members in keyed.items() if key[4] == group.label}
    for model in sorted({m for m, *_ in mine}):
        peers = sorted({p for m, p, *_ in mine if m == model and p is not None}) or [None]
        for peer, task in ((p, t) for p in peers for t in tasks):
            rows = [_make_row(meth, mem, benchmarks, tag) for (m, p, meth, t, _, tag), mem in mine.items()
                    if m == model and (p is None or p == peer) and t == task]
            if not rows:
                continue
            block = Block(model=model, peer=peer, rows=_order(rows, methods), task=task, show_task=len(tasks) > 1,
                          group=group.label)
            labels = [r.label for r in block.rows]
            if len(set(labels)) != len(labels):
                clash = sorted({x for x in labels if labels.count(x) > 1})
                raise ValueError(f"block {block.title!r}: method label(s) {clash} used by both a "
                                 f"single-model run and a run with a peer; give them distinct "
                                 f"run.variant labels")
            for r in block.rows:
                r.by_design |= design.get(r.method, set())
            base = _baseline_row(block.rows, group.baseline)
            if base is None:
                block.note = (f"No {group.baseline} row in this block: no Δ." if group.baseline else
                              "No baseline row in this group: no Δ (--baseline LABEL names one).")
            _decorate(block, base, budgets)
            _compare(block, base)
            copies = [dataclasses.replace(r, method=alias, same_as=r.method)
                      for alias, target in aliases.items() for r in block.rows if r.method == target]
            if any(r.method == c.method for c in copies for r in block.rows):
                raise ValueError(f"block {block.title!r}: alias label(s) {[c.method for c in copies]} are also "
                                 f"run labels")
            block.rows = _order(block.rows + copies, methods)
            blocks.append(block)
    return blocks


def build_table1(runs: Sequence[RunRecord], baseline: Optional[str] = "GRPO (n=8)",
                 budgets: tuple = (16, 32), benchmarks: Optional[Sequence[str]] = None,
                 methods: Optional[Sequence[str]] = None, digits: int = 1,
                 aliases: Optional[dict] = None, design: Optional[dict] = None,
                 allow: Sequence[str] = ("*",)) -> Table:
    """Table 1 of the GRAFT paper from loaded runs (layout and marks: module docstring).

    ``budgets`` are the (†, ‡) budget tiers; ``benchmarks`` fixes the column order (default: order
    of first appearance); ``methods`` puts those rows first in that order (default: baselines by
    budget then name, then the other methods by budget then name); ``aliases`` ({alias label: method})
    repeat a method's row under a second label; ``design`` ({method label: compared keys / "clip" / "task"}, as
    ``design_keys`` gives them) names the settings a row differs in by design, left out of ``Row.differs`` and the
    warnings; ``allow``: the ``COMPARABLE_KEYS`` that may differ within a group (``settings_groups``; "*", the
    default: one group); ``baseline`` None: each group's ``default_baseline``. Labels given here (``baseline``,
    ``methods``, ``aliases``' targets, ``design``) name methods as ``resolve_label`` reads them: in any case, or as
    their runs wrote them.
    """
    if len(budgets) != 2 or budgets[0] >= budgets[1]:
        raise ValueError(f"budgets must be two increasing tiers for (†, ‡), got {budgets}")
    baseline = baseline or None
    labels = method_labels(runs)
    groups = settings_groups(runs, allow)
    keyed = _group(runs, groups, labels)
    if not keyed:
        raise ValueError("no run with an eval/<model>.json to tabulate")

    def shown(name: str) -> str:
        return resolve_label(name, runs, labels) or name

    methods = [shown(m) for m in methods or []]
    aliases = {a: shown(t) for a, t in (aliases or {}).items()}
    design = {shown(m): set(keys) for m, keys in (design or {}).items()}
    for g in groups:   # one labelling for every group: a group's baseline is spelled as its rows are
        g.baseline = default_baseline(g.runs, labels) if baseline is None else shown(baseline)
    if benchmarks is None:
        benchmarks = []
        for run in runs:
            for ev in run.evals.values():
                benchmarks += [b for b in ev["benchmarks"] if b not in benchmarks]
    benchmarks = list(benchmarks)
    tasks = sorted({key[3] for key in keyed})
    blocks = [b for g in groups for b in _group_blocks(g, keyed, benchmarks, tasks, tuple(budgets), methods,
                                                         aliases, design)]
    names = sorted({r.method for b in blocks for r in b.rows})
    if baseline is not None and shown(baseline) not in names:
        raise ValueError(f"baseline {baseline!r} is not a method of these runs; methods: {few(names)}")
    scores = [st.mean for b in blocks for r in b.rows for st in [r.avg, *r.scores.values()] if st.mean is not None]
    all_zero = bool(scores) and all(x == 0 for x in scores)
    if all_zero:  # nothing to rank: no best, no Δ, no claim
        for b in blocks:
            b.note = None
            for r in b.rows:
                r.bold, r.mark, r.delta, r.p = False, "", None, None
    tabulated = [run for run in runs if any(str(run.path) in r.runs for b in blocks for r in b.rows)]
    return Table(benchmarks=benchmarks, blocks=blocks, baseline=groups[0].baseline or "",
                 budgets=tuple(budgets), digits=digits, all_zero=all_zero, warnings=_warnings(blocks, design),
                 groups=[g for g in groups if any(b.group == g.label for b in blocks)],
                 labels={(path, b.model): r.label for b in blocks for r in b.rows if r.same_as is None
                         for path in r.runs},
                 spellings=label_spellings(tabulated, labels))


def step_means(runs: Sequence[RunRecord], keys: Sequence[str], labels: Optional[dict] = None) -> list:
    """Per (method, model, peer), sorted by model then method: ``(method, model, peer, seeds, stats)`` where
    ``stats[j]`` is the mean ± sd over seeds of each run's mean over its logged steps of ``keys[j]`` (steps where it is
    None left out; a ``Stat`` without values when a seed lacks it). Groups where no key was logged are left out;
    failed runs skipped. Runs on several tasks: the method is shown with its task (``"GRPO (n=8) on a.jsonl"``); runs
    of one method and seed from two folders: with its folder (``"GRPO (n=8) [runs/demo/default]"``, ``folder_tags``).
    ``labels``: the method labels (``method_labels``) of the table these rows go with (default: those of ``runs``)."""
    keyed: dict = {}
    labels = method_labels(runs) if labels is None else labels
    several = len({task_label(r.config) for r in runs if r.status != "failed"}) > 1
    for run in runs:
        if run.status == "failed":
            continue
        method = method_of(run, labels) + (f" on {task_label(run.config)}" if several else "")
        for model in run.models:
            vals = []
            for key in keys:
                _, v = run.series(model, key)
                vals.append(sum(v) / len(v) if v else None)
            if all(v is None for v in vals):
                continue
            keyed.setdefault((method, model, run.peers[model]), []).append((run, vals))
    groups: dict = {}
    for (method, model, peer), items in keyed.items():
        tags = repeat_tags([run for run, _ in items], [run.seed for run, _ in items])
        for run, vals in items:
            tag = tags.get(str(run.path))
            groups.setdefault((method if tag is None else f"{method} [{tag}]", model, peer), []).append((run.seed, vals))
    rows = []
    for (method, model, peer), items in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        items.sort(key=lambda sv: sv[0])
        stats = []
        for j in range(len(keys)):
            v = [vals[j] for _, vals in items]
            stats.append(_stat(v) if all(x is not None for x in v) else Stat(None, None, 0))
        rows.append((method, model, peer, [seed for seed, _ in items], stats))
    return rows


def clip_fraction_table(runs: Sequence[RunRecord], own_key: str = M.CLIP_FRAC_OWN,
                        peer_key: str = M.CLIP_FRAC_PEER, labels: Optional[dict] = None) -> ClipTable:
    """Table 9 of the GRAFT paper: fraction of clipped tokens, own vs peer tokens.

    Per run and model, the mean over logged steps of each metric; then mean ± sd over seeds.
    Rows are (method, model, peer) with at least one of the two metrics; failed runs skipped. ``labels``: as
    ``step_means``.
    """
    return ClipTable(rows=[ClipRow(method=method, model=model, peer=peer, seeds=seeds, own=own, peer_tokens=peer_st)
                           for method, model, peer, seeds, (own, peer_st)
                           in step_means(runs, (own_key, peer_key), labels)])


TRANSFER_COLUMNS = (
    # (header, metrics.jsonl key): what the peer exchange moved, per step (graftzoo.training.learning.diagnostics; algos' logs)
    ("grafted groups", M.PEER_RESCUED_GROUPS),
    ("admitted succ.", M.PEER_ADMITTED_SUCC),
    ("admitted fail.", M.PEER_ADMITTED_FAIL),
    ("admit rate succ.", M.PEER_ADMIT_RATE_SUCC),
    ("admit rate fail.", M.PEER_ADMIT_RATE_FAIL),
    ("s median", M.PEER_S_MEDIAN),
    ("grad share peer", M.DIAG_GRAD_SHARE_PEER),
    ("peer succ. logp", M.DIAG_PEER_SUCC_LOGP_BEFORE),
    ("Δ peer succ. logp", M.DIAG_PEER_SUCC_LOGP_DELTA),
    ("own succ. logp", M.DIAG_OWN_SUCC_LOGP_BEFORE),
    ("Δ own succ. logp", M.DIAG_OWN_SUCC_LOGP_DELTA),
)


@dataclass
class TransferTable:
    """The transfer path per (method, model, peer): each ``TRANSFER_COLUMNS`` metric's mean over a run's steps,
    then mean ± sd over seeds (``transfer_table``)."""

    rows: list = field(default_factory=list)   # (method, model, peer, seeds, [Stat per column])
    digits: int = 3


def transfer_table(runs: Sequence[RunRecord], labels: Optional[dict] = None) -> TransferTable:
    """What peer exchange moved in each run (``run.diagnostics``): per run and model the mean over logged
    steps of each ``TRANSFER_COLUMNS`` metric, then mean ± sd over seeds (``step_means``). Rows: (method, model, peer)
    with any of them (a GRPO run with diagnostics has the own columns: the comparison). The ``diag/*`` columns need
    ``run.diagnostics: true``; the log-probs are per token (the learner's mean over a response's trained tokens),
    their Δ the change across one step's update. ``labels``: as ``step_means``."""
    return TransferTable(rows=step_means(runs, [key for _, key in TRANSFER_COLUMNS], labels))


def transfer_markdown(table: TransferTable) -> str:
    """``transfer_table`` as Markdown (values as logged: counts per step, rates, per-token log-probs)."""
    header = ["Method", "Model", "Peer", "Seeds"] + [h for h, _ in TRANSFER_COLUMNS]
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    for method, model, peer, seeds, stats in table.rows:
        lines.append(_md_row([method, model, peer or DASH, str(len(seeds))]
                             + [_fmt(st, table.digits, scale=1.0) for st in stats]))
    note = ("Per step, mean over the run's steps, then mean ± sd over seeds. Log-probs: the learner's mean per-token "
            "log-prob of the admitted correct peer responses (peer) and of its own correct responses with a positive "
            "advantage (own), before the step's update; Δ: after − before. Columns diag/* need run.diagnostics.")
    return "\n".join(lines) + "\n\n" + note + "\n"


@dataclass
class PopulationRow:
    """One model's method trained in a pair and in a larger population (docs/algorithms.md#populations): its Avg
    with N = ``small`` and N = ``large`` models, and ``seed_test`` of the difference (large - small)."""

    model: str
    method: str
    task: str
    small: int
    large: int
    avg_small: Stat
    avg_large: Stat
    test: Optional[SeedTest]


def population_rows(table: Table) -> list:
    """Does another peer help each model? For every model, task and method that Table 1 holds with two population
    sizes (a block's peers: ``A`` for a pair, ``A + B`` for three), the smallest size's row against each larger
    one's, tested over the seeds as Table 1's marks are (``seed_test``: paired over the seeds both have). Single-model
    (baseline) rows have no peers and are left out."""
    sizes: dict = {}
    for block in table.blocks:
        if block.peer is None:
            continue
        n = len(block.peer.split(" + ")) + 1
        for row in block.rows:
            if not row.baseline and row.same_as is None:
                sizes.setdefault((block.model, block.task, row.label), {})[n] = row
    out = []
    for (model, task, method), by_n in sorted(sizes.items()):
        ns = sorted(by_n)
        for n in ns[1:]:
            small, large = by_n[ns[0]], by_n[n]
            out.append(PopulationRow(model, method, task, ns[0], n, small.avg, large.avg,
                                     seed_test(small.per_seed, large.per_seed)))
    return out


def population_markdown(rows: list, digits: int = 1) -> str:
    """``population_rows`` as Markdown: Avg x100, mean ± sd over seeds, Δ = large - small, the test's p."""
    header = ["Model", "Method", "N", "Avg (N small)", "N", "Avg (N large)", "Δ", "p", "seeds"]
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    for r in rows:
        t = r.test
        lines.append(_md_row([r.model, r.method, str(r.small), _fmt(r.avg_small, digits), str(r.large),
                              _fmt(r.avg_large, digits), DASH if t is None else _fmt_delta(t.diff, digits),
                              DASH if t is None else f"{t.p:.2f}",
                              DASH if t is None else f"{t.n}{'' if t.paired else ' (unpaired)'}"]))
    note = ("Each model's method with N models against the same method in the smallest population it trained in "
            "(docs/algorithms.md#populations): held-out Avg x100, mean ± sd over seeds; Δ and p from the paired "
            "t-test over the seeds both have (Welch's test when fewer than two are shared), as Table 1's marks.")
    return "\n".join(lines) + "\n\n" + note + "\n"


# ---------------------------------------------------------------- rendering

def _fmt(stat: Stat, digits: int, scale: float = 100.0, pm: str = " ± ") -> str:
    if stat.mean is None:
        return DASH
    text = f"{stat.mean * scale:.{digits}f}"
    return text if stat.sd is None else f"{text}{pm}{stat.sd * scale:.{digits}f}"


def _fmt_delta(delta: Optional[float], digits: int) -> str:
    return DASH if delta is None else f"{delta * 100:+.{digits}f}"


def _differs(table: Table) -> bool:
    return any(r.differs for b in table.blocks for r in b.rows)


def _differs_text(row: Row) -> str:
    """The Differs cell: ``rollout.n 4 vs 8; run.steps 2 vs 1`` (the row's value vs the reference's)."""
    return "; ".join(f"{k} {row.settings[k]} vs {ref}" for k, ref in row.differs.items())


def _delta_words(table: Table) -> str:
    named = list(dict.fromkeys(g.baseline for g in table.groups)) or [table.baseline]
    if len(named) == 1 and named[0]:
        return f"Δ = Avg − {named[0]}"
    return "Δ = Avg − the baseline row of the row's group (in its heading)"


def significance_words(table: Table) -> str:
    """The caption's account of bold, † and ‡: the test behind them and its level (``significantly_above``)."""
    lo, hi = table.budgets
    text = (f"Bold: the best Avg of its rollout budget n, significantly above every other row of that budget; "
            f"†/‡: significantly above every single-model baseline with n ≤ {lo} / n ≤ {hi}. Significant: p < "
            f"{SIGNIFICANCE:g} in a two-sided paired t-test of the per-seed Avg over the seeds both rows have "
            f"(Welch's t-test when they share fewer than two), no correction for multiple comparisons; a row with one "
            f"seed is never marked.")
    if all(len(r.per_seed) < 2 for b in table.blocks for r in b.rows):
        text += " Every row has one seed: no test, so no bold and no marks."
    return text


def _legend(table: Table) -> str:
    notes = "".join(f" {a} = {m} (the same runs)." for a, m in
                    dict.fromkeys((r.method, r.same_as) for b in table.blocks for r in b.rows if r.same_as))
    if _differs(table):
        notes += (" Differs: every setting that changes training or scoring (learning rate, clip, steps, rollout "
                  "budget, ...) in which the row differs from the block's baseline row (else from most of its rows), "
                  "as 'key, the row's value vs the baseline's': not like for like; a key the row's label, preset or "
                  "algorithm sets by design is not listed.")
    if any(r.tag for b in table.blocks for r in b.rows):
        notes += (" [tag]: runs of one label shown as several rows, told apart by their folder (a seed found in "
                  "two folders) or by their method's settings; Δ is measured against the baseline row with more "
                  "seeds.")
    merged = [f"{shown} (runs labelled {', '.join(others)})" for shown, others in table.spellings.items()]
    if merged:
        notes += (" One label per method (the same algorithm, preset and settings), whatever the case its runs "
                  "wrote it in: " + "; ".join(merged) + ".")
    if table.all_zero:
        return ("Scores are avg@k x100, mean ± sd over training seeds. All scores are 0: no method is best, "
                "no Δ and no marks." + notes)
    return (f"Scores are avg@k x100, mean ± sd over training seeds. {_delta_words(table)}. "
            f"Clip: eps_low/eps_high of the ratio clip (c: dual clip; seq: a sequence ratio). "
            + significance_words(table) + notes)


def group_heading(table: Table, group: Group) -> Optional[str]:
    """The heading of ``group``'s section ("steps 40 · eval k=4: Δ against GRPO (n=8)"); None in a table of one
    group."""
    if len(table.groups) < 2:
        return None
    n = len({r for b in table.blocks if b.group == group.label for row in b.rows for r in row.runs})
    against = f"Δ against {group.baseline}" if group.baseline else "no baseline row, no Δ"
    return f"{group.label} ({n} run{'s' if n != 1 else ''}; {against})"


def _clip_header() -> list:
    return ["Method", "Model", "Peer", "Own tokens clipped (%)", "Peer tokens clipped (%)"]


def _same(text: str) -> str:
    return text


def _clip_cells(row: ClipRow, digits: int, pm: str = " ± ", text=_same, num=_same) -> list:
    return [text(row.method), text(row.model), text(row.peer or DASH),
            num(_fmt(row.own, digits, pm=pm)), num(_fmt(row.peer_tokens, digits, pm=pm))]


def _md_row(cells: list) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def to_markdown(table) -> str:
    """Markdown: one titled table per block (Table) or a single table (ClipTable)."""
    if isinstance(table, ClipTable):
        lines = [_md_row(_clip_header()), _md_row(["---"] * 5)]
        lines += [_md_row(_clip_cells(r, table.digits)) for r in table.rows]
        return "\n".join(lines) + "\n"
    d = table.digits
    differs = _differs(table)
    header = ["Method", "n"] + table.benchmarks + ["Avg", "Δ", "Clip"] + (["Differs"] if differs else [])
    out = []
    headings = {g.label: group_heading(table, g) for g in table.groups}
    for block in table.blocks:
        if headings.get(block.group):
            out += [f"### {headings.pop(block.group)}", ""]
        out += [f"**{block.title}**", "", _md_row(header), _md_row(["---"] * len(header))]
        for r in block.rows:
            avg = _fmt(r.avg, d)
            if r.bold:
                avg = f"**{avg}**"
            out.append(_md_row([r.label, str(r.budget)]
                               + [_fmt(r.scores[b], d) for b in table.benchmarks]
                               + [avg + r.mark, _fmt_delta(r.delta, d), r.clip]
                               + ([_differs_text(r)] if differs else [])))
        out += ["", f"_{block.note}_", ""] if block.note else [""]
    out.append(_legend(table))
    return "\n".join(out) + "\n"


def _round(x: Optional[float], digits: int) -> Optional[float]:
    return None if x is None else round(x * 100, digits + 2)


def flat_rows(table) -> tuple:
    """(header, rows) with numbers, for CSV and wandb; scores and Δ in points (x100)."""
    if isinstance(table, ClipTable):
        header = ["method", "model", "peer", "n_seeds", "own_mean", "own_sd", "peer_mean", "peer_sd"]
        rows = [[r.method, r.model, r.peer, len(r.seeds),
                 _round(r.own.mean, 2), _round(r.own.sd, 2),
                 _round(r.peer_tokens.mean, 2), _round(r.peer_tokens.sd, 2)] for r in table.rows]
        return header, rows
    header = ["group", "block", "model", "peer", "task", "method", "tag", "budget", "clip", "differs", "baseline",
              "n_seeds", "seeds"]
    for b in table.benchmarks:
        header += [f"{b}_mean", f"{b}_sd"]
    header += ["avg_mean", "avg_sd", "delta", "p_vs_baseline", "best_in_budget", "mark"]
    header += [f"charged_{k}" for k in FIELDS] + [f"amortized_{k}" for k in FIELDS]
    header += ["same_as"]
    rows = []
    for block in table.blocks:
        for r in block.rows:
            row = [block.group, block.title, block.model, block.peer, block.task, r.method, r.tag, r.budget, r.clip,
                   _differs_text(r), r.baseline, len(r.seeds), " ".join(str(s) for s in r.seeds)]
            for b in table.benchmarks:
                row += [_round(r.scores[b].mean, 2), _round(r.scores[b].sd, 2)]
            row += [_round(r.avg.mean, 2), _round(r.avg.sd, 2), _round(r.delta, 2),
                    None if r.p is None else round(r.p, 4), r.bold, r.mark]
            for comp in (r.compute, r.compute_amortized):
                row += [None if comp is None else comp[k] for k in FIELDS]
            row += [r.same_as]
            rows.append(row)
    return header, rows


def to_csv(table) -> str:
    """CSV text, one line per row of every block (``flat_rows``); empty cells for missing values."""
    header, rows = flat_rows(table)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows([["" if v is None else v for v in row] for row in rows])
    return buf.getvalue()


_TEX_ESC = {"–": "--", "—": "---", "−": "$-$", "·": r"$\cdot$", "Δ": r"$\Delta$", "±": r"$\pm$", "×": r"$\times$",
            "≤": r"$\leq$", "≥": r"$\geq$", "→": r"$\rightarrow$", "†": r"\dag{}", "‡": r"\ddag{}", "’": "'",
            "‘": "`", "“": "``", "”": "''", "…": r"\ldots{}", "ß": r"\ss{}", "æ": r"\ae{}", "Æ": r"\AE{}",
            "ø": r"\o{}", "Ø": r"\O{}", "œ": r"\oe{}", "Œ": r"\OE{}", "ł": r"\l{}", "Ł": r"\L{}", "ı": r"\i{}",
            "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
            "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "<": r"\textless{}", ">": r"\textgreater{}",
            "|": r"\textbar{}"}
_TEX_ACCENTS = {"\u0300": "`", "\u0301": "'", "\u0302": "^", "\u0303": "~", "\u0304": "=", "\u0308": '"',
                "\u030a": "r", "\u030c": "v", "\u0327": "c"}


def _tex(text: str) -> str:
    """``text`` as LaTeX text in plain ASCII (no input or font encoding package needed): its special characters
    escaped, the symbols the tables use as LaTeX commands, an accented letter as LaTeX's accent on its letter
    (``ü`` -> ``\\"{u}``); any other character becomes "?" (the document then still compiles)."""
    out = []
    for ch in str(text):
        base = unicodedata.normalize("NFD", ch)
        if ch in _TEX_ESC:
            out.append(_TEX_ESC[ch])
        elif ch.isascii():
            out.append(ch)
        elif len(base) == 2 and base[0].isascii() and base[0].isalpha() and base[1] in _TEX_ACCENTS:
            out.append(f"\\{_TEX_ACCENTS[base[1]]}{{{base[0]}}}")
        else:
            out.append("?")
    return "".join(out)


LATEX_PACKAGES = (
    ("booktabs", None, r"\toprule, \midrule, \bottomrule"),
    ("array", None, r">{...} in the column of the Differs cells"),
    ("graphicx", None, r"\resizebox: a table wider than the text is scaled to its width"),
)
"""The packages ``to_latex``'s document loads: (package, option, what the table uses it for). The rest (tabular,
\\multicolumn, \\textbf, \\dag, accents, math symbols) is LaTeX itself, and the text is plain ASCII (``_tex``): no
encoding package, the fonts LaTeX starts with (vector fonts in any TeX distribution)."""

BENCHMARK_SHORT = {"minerva_math": "Minerva", "olympiadbench": "Olympiad"}
"""Short column headings of long benchmark names in ``table1.tex`` (the caption gives each in full)."""

HEADING_MAX = 9
"""The longest benchmark heading ``table1.tex`` shows as it is; a longer one is shortened (``BENCHMARK_SHORT``, else
its first ``HEADING_MAX - 1`` characters and a dot), and the caption says what it stands for."""


def short_heading(name: str) -> str:
    """A benchmark's column heading in ``table1.tex`` (``HEADING_MAX``)."""
    if len(name) <= HEADING_MAX:
        return name
    return BENCHMARK_SHORT.get(name, name[:HEADING_MAX - 1].rstrip("_-. ") + ".")


def latex_preamble() -> str:
    """The preamble ``to_latex``'s document uses: one ``\\usepackage`` line per ``LATEX_PACKAGES`` entry, with what
    it is for (add these to a paper that takes the table environment alone)."""
    lines = []
    for name, option, why in LATEX_PACKAGES:
        use = rf"\usepackage[{option}]{{{name}}}" if option else rf"\usepackage{{{name}}}"
        lines.append(f"{use:<28}% {why}")
    return "\n".join(lines) + "\n"


def _document(body: list, what: str) -> str:
    """A complete LaTeX document around the table environment ``body`` (lines), which it marks for copying."""
    head = [f"% {what}, written by graftzoo report: a complete document (pdflatex compiles it as it is).",
            "% For a paper, copy the lines between BEGIN TABLE and END TABLE, and add the \\usepackage lines of the",
            "% preamble to the paper's.",
            r"\documentclass{article}", latex_preamble().rstrip("\n"), r"\begin{document}", "% BEGIN TABLE"]
    return "\n".join(head + body + ["% END TABLE", r"\end{document}"]) + "\n"


def _float(tabular: list, caption: str, label: str) -> list:
    """``tabular`` (lines) in a centred table float with its caption, scaled down to the text width only when wider
    (``\\resizebox`` of graphicx; ``\\width`` is the table's natural width)."""
    return ([r"\begin{table}[t]", r"\centering", rf"\caption{{{_tex(caption)}}}", rf"\label{{{label}}}",
             r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%"]
            + tabular + ["}", r"\end{table}"])


def to_latex(table, standalone: bool = True) -> str:
    """The table as LaTeX: a booktabs ``tabular`` in a ``table`` float, the caption the Markdown legend (plus what a
    shortened heading stands for), block titles italic rows spanning the table, long Differs cells wrapped. A
    complete document by default (``_document``: the packages of ``LATEX_PACKAGES``, ``pdflatex`` compiles it);
    ``standalone=False``: the ``table`` environment alone, for a document that loads those packages
    (``latex_preamble``)."""
    pm = r" $\pm$ "

    def num(text: str) -> str:
        """A number cell: "–" as an en dash, a minus sign as one (not a hyphen)."""
        text = text.replace(DASH, "--")
        return "$-$" + text[1:] if re.match(r"-\d", text) else text

    if isinstance(table, ClipTable):
        cols = "lll" + "c" * 2
        lines = [rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
                 " & ".join(_tex(h) for h in _clip_header()) + r" \\", r"\midrule"]
        lines += [" & ".join(_clip_cells(r, table.digits, pm=pm, text=_tex, num=num)) + r" \\"
                  for r in table.rows]
        body = _float(lines + [r"\bottomrule", r"\end{tabular}"],
                      "Fraction of clipped tokens (%), own vs peer tokens, mean ± sd over training seeds.",
                      "tab:clip")
        return _document(body, "The clip table") if standalone else "\n".join(body) + "\n"
    d = table.digits
    differs = _differs(table)
    ncol = 5 + len(table.benchmarks) + differs
    tex_marks = {"": "", "†": r"$^\dagger$", "‡": r"$^\ddagger$"}
    wrap = r">{\raggedright\arraybackslash}p{3.5cm}"
    headings = [short_heading(b) for b in table.benchmarks]
    lines = [rf"\begin{{tabular}}{{lr{'c' * (len(table.benchmarks) + 1)}rl{wrap if differs else ''}}}", r"\toprule",
             " & ".join(["Method", "$n$"] + [_tex(h) for h in headings]
                        + ["Avg", r"$\Delta$", "Clip"] + (["Differs"] if differs else [])) + r" \\"]
    group_lines = {g.label: group_heading(table, g) for g in table.groups}
    for block in table.blocks:
        if group_lines.get(block.group):
            lines += [r"\midrule",
                      rf"\multicolumn{{{ncol}}}{{l}}{{\textbf{{{_tex(group_lines.pop(block.group))}}}}} \\"]
        title = block.title + (f" ({block.note.rstrip('.')})" if block.note else "")
        lines += [r"\midrule", rf"\multicolumn{{{ncol}}}{{l}}{{\textit{{{_tex(title)}}}}} \\",
                  r"\midrule"]
        for r in block.rows:
            avg = num(_fmt(r.avg, d, pm=pm))
            if r.bold:
                avg = rf"\textbf{{{avg}}}"
            cells = ([_tex(r.label), str(r.budget)]
                     + [num(_fmt(r.scores[b], d, pm=pm)) for b in table.benchmarks]
                     + [avg + tex_marks[r.mark], num(_fmt_delta(r.delta, d)), _tex(r.clip)]
                     + ([_tex(_differs_text(r))] if differs else []))
            lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    short = [f"{h} = {b}" for h, b in zip(headings, table.benchmarks) if h != b]
    caption = _legend(table) + (f" Columns: {', '.join(short)}." if short else "")
    body = _float(lines, caption, "tab:table1")
    return _document(body, "Table 1") if standalone else "\n".join(body) + "\n"


def log_table_to_wandb(table, run, key: Optional[str] = None):
    """Log ``table`` (Table or ClipTable, as ``flat_rows``) to a wandb run; returns the wandb.Table."""
    import wandb

    header, rows = flat_rows(table)
    wt = wandb.Table(columns=header, data=rows)
    run.log({key or ("clip_table" if isinstance(table, ClipTable) else "table1"): wt})
    return wt
