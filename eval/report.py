"""Paper-style result tables from run directories (GRAFT paper Table 1 and Table 9 layouts).

Table 1 (``build_table1``), precisely:

- Rows are methods (``summary.variant``); a method's cell aggregates its runs over training
  seeds. A run contributes to a model's rows when it holds ``eval/<model>.json``; runs with status
  "failed" are skipped. Two runs of the same (model, peer, method, seed) in one group are two rows, each labelled
  with its folder (``folder_tags``: "GRPO (n=8) [runs/demo/default]"), never one row nor an error.
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
- Δ = Avg mean of the row − Avg mean of the baseline row (default "GRPO (n=8)") of the same block (of two baseline
  rows from two folders, the one with more seeds); a block without one has no Δ and says so in one line
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

Method labels match case-insensitively ("grpo (n=8)" and "GRPO (n=8)" are one method, shown with the spelling of
the first run in path order: ``method_labels``). When every score of the table is 0 there is no best, Δ or mark
(``Table.all_zero``; the legend says so once).

Runs are compared like with like: runs that differ in ``COMPARABLE_KEYS`` (training steps, eval k, eval set) are in
separate groups unless allowed (above). Runs on different tasks (``task_label``:
the training dataset, or the procedural env with its mix) are tabulated in separate blocks, the task in the block
title. Within a block, a row whose ``ROW_KEYS`` settings (rollout budget, clip, and the allowed ``COMPARABLE_KEYS``)
differ from the baseline row's (else from most rows') has them in ``Row.differs`` (the "Differs" column), and
``Table.warnings`` says so in one line per key; a key the row sets by design is left out (``Row.by_design``: its label
states it, "GRPO (n=16)"; its algorithm clips with its own key; or the caller's ``design``: a grid method's preset
keys and ``clip: own``).

Aliases (``aliases={label: method}``): one configuration that the paper reports under two labels
(GRAFT's "SGT + GRAFT how" is its "w/o balanced exchange"). The method's row is shown a second time
under the alias label, with the same numbers, Δ, bold and mark (``Row.same_as`` names the method).
"""
from __future__ import annotations

import csv
import dataclasses
import fnmatch
import io
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from graftzoo.contract import metrics as M
from graftzoo.contract.config import LearnerFacts, clip_label, validate
from graftzoo.contract.registry import get_config, own_clip_keys
from graftzoo.eval.artifacts import RunRecord
from graftzoo.eval.compute import FIELDS, joint_charge
from graftzoo.eval.metrics import SIGNIFICANCE, mean_sd_ci, seed_test

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
    folder: Optional[str] = None        # the runs' folder, where two rows of one method share seeds (``folder_tags``)
    per_seed: dict = field(default_factory=dict)   # seed -> Avg of that seed's run (fraction): what ``seed_test`` tests
    p: Optional[float] = None           # p-value of ``seed_test`` against the block's baseline row (None: no test)

    @property
    def label(self) -> str:
        """The method, with its folder where two rows of the method are told apart by it."""
        return self.method if self.folder is None else f"{self.method} [{self.folder}]"


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


ROW_KEYS = ("rollout.n", "task.prompts_per_step", "clip") + COMPARABLE_KEYS
"""Settings the rows of one block are compared on (``Row.differs``): the rollout budget (responses per prompt, prompts
per step), the effective clip (``clip``, as ``clip_label`` writes it) and the ``COMPARABLE_KEYS`` a report was allowed
to mix."""

TASK_KEYS = ("task.dataset", "task.split", "task.env", "task.mix", "task.difficulty", "task.size")
"""What a run trains on (``task_label``); runs on different tasks are tabulated in separate blocks."""


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


def design_keys(dotted) -> set:
    """The ``ROW_KEYS`` (and "task") that config keys set by design define, e.g. the keys of a grid method's preset
    (``optim.clip.*`` and an algorithm's own clip key define "clip"; ``TASK_KEYS`` define "task")."""
    out, own_clip = set(), own_clip_keys()
    for k in dotted:
        if k in ROW_KEYS:
            out.add(k)
        elif k.startswith("optim.clip") or k in own_clip:
            out.add("clip")
        elif any(k == t or k.startswith(t + ".") for t in TASK_KEYS):
            out.add("task")
    return out


def _label_states(label: str, key: str, value: str) -> bool:
    """Whether a method label states the row's value of ``key``: "GRPO (n=16)" (and the default "grpo (n=16)")
    states rollout.n 16."""
    return key == "rollout.n" and re.search(rf"(?<![\w.])n\s*=\s*{re.escape(value)}(?!\d)", label) is not None


def _run_clip(run: RunRecord) -> tuple:
    """(``clip_label`` of the run's effective clip, whether its algorithm clips with its own key rather than
    ``optim.clip``: GSPO's sequence clip, HACPO's self clip); ("?", False) where it cannot be resolved."""
    try:
        cfg = validate(run.config)
        clip = cfg.algo.effective_clip(LearnerFacts.of(cfg))
    except (ValueError, KeyError, TypeError, RuntimeError):  # ConfigError, RegistryError: an unknown algorithm
        return "?", False
    return clip_label(clip), clip != {**cfg.optim.clip.model_dump(), "ratio": "token"}


def _setting_text(value) -> str:
    return DASH if value is None else str(value)


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


def folder_tags(runs: Sequence[RunRecord]) -> dict:
    """str(run path) -> the folder that tells apart ``runs`` of one method whose seeds repeat: each run's parent
    folder relative to the folder they share, or to the one above it when that is one's parent ("runs",
    "runs/demo/default"); the run's own path where two runs of a seed share their parent folder too."""
    paths = {str(r.path): Path(r.path).resolve() for r in runs}
    common = Path(os.path.commonpath([p.parent for p in paths.values()]))
    root = common.parent if any(p.parent == common for p in paths.values()) else common
    parents = {k: os.path.relpath(p.parent, root) for k, p in paths.items()}
    if max(Counter((parents[str(r.path)], r.seed) for r in runs).values()) > 1:
        return {k: os.path.relpath(p, root) for k, p in paths.items()}
    return parents


def repeat_tags(runs: Sequence[RunRecord], seeds: Sequence) -> dict:
    """``folder_tags`` of ``runs`` where ``seeds`` (a seed, or a (model, seed), per member) repeat; else {}: the runs
    of one row or series that must be told apart by their folders."""
    return folder_tags(runs) if len(set(seeds)) < len(seeds) else {}


def method_labels(runs: Sequence[RunRecord]) -> dict:
    """Case-folded method label -> the label shown: the spelling of the first run (in path order) that uses it."""
    out: dict = {}
    for run in sorted(runs, key=lambda r: str(r.path)):
        out.setdefault(run.variant.casefold(), run.variant)
    return out


def method_of(run: RunRecord, labels: dict) -> str:
    """A run's method label as ``method_labels`` spells it."""
    return labels.get(run.variant.casefold(), run.variant)


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


def default_baseline(runs: Sequence[RunRecord]) -> Optional[str]:
    """The baseline when none is named: of the baseline rows (``baseline_runs``: single-model runs of an algorithm
    whose section declares ``report_baseline``, GRPO's and its presets' among the builtins), the one with the most
    seeds, then the smallest rollout budget, then the first label; None when the runs have no such row."""
    labels = method_labels(runs)
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


def _group(runs: Sequence[RunRecord], groups: Sequence[Group]) -> dict:
    """(model, peer, method, task, group label, folder) -> list of (run, model). ``folder`` is None unless two runs
    of one (model, peer, method, task, group) have the same seed: then each of its runs is keyed by its folder
    (``folder_tags``), and they are two rows rather than one."""
    labels = method_labels(runs)
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
        tags = repeat_tags([run for run, _ in members], [run.seed for run, _ in members])
        for run, model in members:
            out.setdefault(key + (tags.get(str(run.path)),), []).append((run, model))
    return out


def _charges(run: RunRecord, model: str) -> tuple:
    try:
        c = joint_charge(run.summary)[model]
    except KeyError:
        return None, None
    return c["charged"], c["amortized"]


def _make_row(method: str, members: list, benchmarks: list, folder: Optional[str] = None) -> Row:
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
    clips = [_run_clip(run) for run, _ in members]
    settings = {k: "; ".join(dict.fromkeys(_setting_text(_config_value(r.config, k)) for r, _ in members))
                for k in ROW_KEYS if k != "clip"}
    settings["clip"] = "; ".join(dict.fromkeys(text for text, _ in clips))  # differing clips are all shown
    by_design = {k for k, v in settings.items() if _label_states(method, k, v)}
    by_design |= {"clip"} if all(own for _, own in clips) else set()
    return Row(method=method, budget=budgets.pop(), baseline=first_run.peers[model] is None,
               seeds=[r.seed for r, _ in members], runs=[str(r.path) for r, _ in members],
               scores=scores, avg=_stat(list(per_seed.values())) if complete else Stat(None, None, 0),
               compute=_mean_dicts(list(charged)), compute_amortized=_mean_dicts(list(amortized)),
               clip=settings["clip"], settings=settings, by_design=by_design, folder=folder,
               per_seed=per_seed if complete else {})


def _baseline_row(rows: list, baseline: Optional[str]) -> Optional[Row]:
    """The block's row of ``baseline`` (of two from two folders, the one with more seeds, then the first folder)."""
    rows = [r for r in rows if r.method == baseline and r.same_as is None]
    return min(rows, key=lambda r: (-len(r.seeds), r.folder or "")) if rows else None


def _compare(block: Block, base: Optional[Row]) -> None:
    """``Row.differs``: each ``ROW_KEYS`` setting in which a row differs from the block's baseline row ``base`` (else
    from the value most of its rows share), unless the row sets that key by design (``Row.by_design``); a clip that
    cannot be resolved ("?") is not compared."""
    block.reference = base.label if base is not None else None
    for key in ROW_KEYS:
        ref = base.settings[key] if base is not None else Counter(
            r.settings[key] for r in block.rows).most_common(1)[0][0]
        for r in block.rows:
            value = r.settings[key]
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
             for key, (rows, refs) in sorted(by_key.items(), key=lambda kv: ROW_KEYS.index(kv[0]))]
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
            return (0, first.index(r.method), 0, "", r.folder or "")
        return (1 if r.baseline else 2, 0, r.budget, r.method, r.folder or "")

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
            rows = [_make_row(meth, mem, benchmarks, folder) for (m, p, meth, t, _, folder), mem in mine.items()
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
    repeat a method's row under a second label; ``design`` ({method label: ``ROW_KEYS`` / "task"}) names the
    settings a row differs in by design (``design_keys``), left out of ``Row.differs`` and the warnings;
    ``allow``: the ``COMPARABLE_KEYS`` that may differ within a group (``settings_groups``; "*", the default: one
    group); ``baseline`` None: each group's ``default_baseline``.
    """
    if len(budgets) != 2 or budgets[0] >= budgets[1]:
        raise ValueError(f"budgets must be two increasing tiers for (†, ‡), got {budgets}")
    baseline = baseline or None
    groups = settings_groups(runs, allow)
    keyed = _group(runs, groups)
    if not keyed:
        raise ValueError("no run with an eval/<model>.json to tabulate")
    labels = method_labels(runs)
    methods = [labels.get(m.casefold(), m) for m in methods or []]
    aliases = {a: labels.get(t.casefold(), t) for a, t in (aliases or {}).items()}
    design = {labels.get(m.casefold(), m): set(keys) for m, keys in (design or {}).items()}
    for g in groups:
        g.baseline = default_baseline(g.runs) if baseline is None else labels.get(baseline.casefold(), baseline)
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
    if baseline is not None and labels.get(baseline.casefold(), baseline) not in names:
        raise ValueError(f"baseline {baseline!r} is not a method of these runs; methods: {few(names)}")
    scores = [st.mean for b in blocks for r in b.rows for st in [r.avg, *r.scores.values()] if st.mean is not None]
    all_zero = bool(scores) and all(x == 0 for x in scores)
    if all_zero:  # nothing to rank: no best, no Δ, no claim
        for b in blocks:
            b.note = None
            for r in b.rows:
                r.bold, r.mark, r.delta, r.p = False, "", None, None
    return Table(benchmarks=benchmarks, blocks=blocks, baseline=groups[0].baseline or "",
                 budgets=tuple(budgets), digits=digits, all_zero=all_zero, warnings=_warnings(blocks, design),
                 groups=[g for g in groups if any(b.group == g.label for b in blocks)])


def step_means(runs: Sequence[RunRecord], keys: Sequence[str]) -> list:
    """Per (method, model, peer), sorted by model then method: ``(method, model, peer, seeds, stats)`` where
    ``stats[j]`` is the mean ± sd over seeds of each run's mean over its logged steps of ``keys[j]`` (steps where it is
    None left out; a ``Stat`` without values when a seed lacks it). Groups where no key was logged are left out;
    failed runs skipped. Runs on several tasks: the method is shown with its task (``"GRPO (n=8) on a.jsonl"``); runs
    of one method and seed from two folders: with its folder (``"GRPO (n=8) [runs/demo/default]"``, ``folder_tags``)."""
    keyed: dict = {}
    labels = method_labels(runs)
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
                        peer_key: str = M.CLIP_FRAC_PEER) -> ClipTable:
    """Table 9 of the GRAFT paper: fraction of clipped tokens, own vs peer tokens.

    Per run and model, the mean over logged steps of each metric; then mean ± sd over seeds.
    Rows are (method, model, peer) with at least one of the two metrics; failed runs skipped.
    """
    return ClipTable(rows=[ClipRow(method=method, model=model, peer=peer, seeds=seeds, own=own, peer_tokens=peer_st)
                           for method, model, peer, seeds, (own, peer_st) in step_means(runs, (own_key, peer_key))])


TRANSFER_COLUMNS = (
    # (header, metrics.jsonl key): what the peer exchange moved, per step (graftzoo.training.diagnostics; algos' logs)
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


def transfer_table(runs: Sequence[RunRecord]) -> TransferTable:
    """What peer exchange moved in each run (``run.diagnostics``): per run and model the mean over logged
    steps of each ``TRANSFER_COLUMNS`` metric, then mean ± sd over seeds (``step_means``). Rows: (method, model, peer)
    with any of them (a GRPO run with diagnostics has the own columns: the comparison). The ``diag/*`` columns need
    ``run.diagnostics: true``; the log-probs are per token (the learner's mean over a response's trained tokens),
    their Δ the change across one step's update."""
    return TransferTable(rows=step_means(runs, [key for _, key in TRANSFER_COLUMNS]))


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
        notes += (" Differs: settings in which the row's runs differ from the block's baseline row (else "
                  "from most of its rows): not like for like; a key the row's label, preset or algorithm sets by "
                  "design is not listed.")
    if any(r.folder for b in table.blocks for r in b.rows):
        notes += (" [folder]: runs of one method and seed found in two folders, shown as two rows; Δ is measured "
                  "against the baseline row with more seeds.")
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
    header = ["group", "block", "model", "peer", "task", "method", "folder", "budget", "clip", "differs", "baseline",
              "n_seeds", "seeds"]
    for b in table.benchmarks:
        header += [f"{b}_mean", f"{b}_sd"]
    header += ["avg_mean", "avg_sd", "delta", "p_vs_baseline", "best_in_budget", "mark"]
    header += [f"charged_{k}" for k in FIELDS] + [f"amortized_{k}" for k in FIELDS]
    header += ["same_as"]
    rows = []
    for block in table.blocks:
        for r in block.rows:
            row = [block.group, block.title, block.model, block.peer, block.task, r.method, r.folder, r.budget, r.clip,
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


_TEX_ESC = {"–": "--", "·": r"$\cdot$", "Δ": r"$\Delta$",
            "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
            "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def _tex(text: str) -> str:
    return "".join(_TEX_ESC.get(ch, ch) for ch in text)


def to_latex(table) -> str:
    """A booktabs ``tabular``; block titles are italic rows spanning the table."""
    pm = r" $\pm$ "

    def num(text: str) -> str:
        return text.replace(DASH, "--")

    if isinstance(table, ClipTable):
        cols = "lll" + "c" * 2
        lines = [rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
                 " & ".join(_tex(h) for h in _clip_header()) + r" \\", r"\midrule"]
        lines += [" & ".join(_clip_cells(r, table.digits, pm=pm, text=_tex, num=num)) + r" \\"
                  for r in table.rows]
        return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"]) + "\n"
    d = table.digits
    differs = _differs(table)
    ncol = 5 + len(table.benchmarks) + differs
    tex_marks = {"": "", "†": r"$^\dagger$", "‡": r"$^\ddagger$"}
    lines = [rf"\begin{{tabular}}{{lr{'c' * (len(table.benchmarks) + 1)}rl{'l' * differs}}}", r"\toprule",
             " & ".join(["Method", "$n$"] + [_tex(b) for b in table.benchmarks]
                        + ["Avg", r"$\Delta$", "Clip"] + (["Differs"] if differs else [])) + r" \\"]
    headings = {g.label: group_heading(table, g) for g in table.groups}
    for block in table.blocks:
        if headings.get(block.group):
            lines += [r"\midrule", rf"\multicolumn{{{ncol}}}{{l}}{{\textbf{{{_tex(headings.pop(block.group))}}}}} \\"]
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
    return "\n".join(lines) + "\n"


def log_table_to_wandb(table, run, key: Optional[str] = None):
    """Log ``table`` (Table or ClipTable, as ``flat_rows``) to a wandb run; returns the wandb.Table."""
    import wandb

    header, rows = flat_rows(table)
    wt = wandb.Table(columns=header, data=rows)
    run.log({key or ("clip_table" if isinstance(table, ClipTable) else "table1"): wt})
    return wt
