"""The grid's objects: a method (one labelled algorithm configuration), a cell (one training run of a
method on a pair and seed) and the expanded grid; cell ordering and selection."""
from __future__ import annotations

import fnmatch
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from graftzoo.contract.config import clip_label, effective_clip, load_config
from graftzoo.contract.names import label_slug

if TYPE_CHECKING:  # graftzoo.eval.regime imports torch and matplotlib: a grid file is read without them
    from graftzoo.eval.regime import RegimeMap


class GridError(ValueError):
    """A grid file is malformed; the message names the file and the key."""


def slug(text: str) -> str:
    """A label as the part of a cell's name (``label_slug``, the rule ``graftzoo train``'s default run names use):
    ``"GRAFT w/o gate"`` -> ``"graft-w-o-gate"``, ``"GRPO (n=8)"`` -> ``"grpo-n8"``; a label without letters or
    digits is a GridError."""
    out = label_slug(text)
    if not re.search(r"[a-z0-9]", out):
        raise GridError(f"label {text!r} has no letters or digits to name a run with")
    return out


@dataclass
class Method:
    label: str
    algo: str
    overrides: dict = field(default_factory=dict)
    files: list = field(default_factory=list)
    peer: Optional[str] = None
    each_model: bool = False
    clip: str = "shared"       # shared: the table's one clip | own: a clip that differs by design (HACPO)
    same_as: Optional[str] = None  # a label alias: no cells; the report shows that method's row under this label
    pairs: Optional[list] = None   # the grid pairs it runs on (a subset); None: all of them
    sets: set = field(default_factory=set)  # dotted keys its preset sets: what its row differs in by design


@dataclass
class Cell:
    name: str
    label: str
    algo: str
    pair: str
    seed: int
    run_dir: Path
    overrides: dict            # dotted key -> value, applied after the pair, preset and files
    files: list
    model: Optional[str] = None  # each_model: the one model this cell trains
    depends: list = field(default_factory=list)
    clip_own: bool = False       # its method is marked ``clip: own`` (exempt from the one-clip check)
    clip: Optional[dict] = None  # the effective clip it trains with (``resolve_clips``); None: config not loadable
    config_error: Optional[str] = None  # why its config does not load (``resolve_clips``), None when it does

    def override_args(self) -> list:
        """``key=value`` strings (values in JSON, which YAML reads back as the same value)."""
        return [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in self.overrides.items()]

    def train_command(self) -> list:
        cmd = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", self.algo, "--pair", self.pair]
        for f in self.files:
            cmd += ["-c", str(f)]
        for o in self.override_args():
            cmd += ["--set", o]
        return cmd + ["--run-dir", str(self.run_dir)]

    def config(self) -> dict:
        return load_config(pair=self.pair, algo=self.algo, files=self.files, overrides=self.override_args())


@dataclass
class Grid:
    name: str
    path: Path
    root: Path
    methods: list
    cells: list
    eval: Optional[dict] = None
    report: dict = field(default_factory=dict)
    regime: Optional[RegimeMap] = None  # ``report.map``: the regime heat map's layout (graftzoo.eval.regime)

    def cell(self, name: str) -> Cell:
        return next(c for c in self.cells if c.name == name)


def order_cells(cells: list, where: str) -> list:
    """Dependencies first, otherwise the expansion order; a dependency cycle is a GridError."""
    by_name = {c.name: c for c in cells}
    done, out, visiting = set(), [], set()

    def visit(c: Cell, chain: tuple):
        if c.name in done:
            return
        if c.name in visiting:
            raise GridError(f"{where}: cells depend on each other in a cycle: {' -> '.join(chain + (c.name,))}")
        visiting.add(c.name)
        for d in c.depends:
            visit(by_name[d], chain + (c.name,))
        visiting.discard(c.name)
        done.add(c.name)
        out.append(c)

    for c in cells:
        visit(c, ())
    return out


def resolve_clips(cells: list) -> None:
    """Load each cell's config once: set its ``clip`` (the effective clip it trains with) or, when the config
    does not load, its ``config_error`` (``check_configs`` reports it by cell name)."""
    for c in cells:
        try:
            c.clip, c.config_error = effective_clip(c.config()), None
        except Exception as e:  # ConfigError, RegistryError, ValueError from a learner Config
            c.clip, c.config_error = None, f"{type(e).__name__}: {e}"


def cell_names(cells: list) -> str:
    """Cell names with their seeds folded: ``graft-micro-s{0,1,2}, hacpo-micro-s0``."""
    seeds: dict = {}
    for c in cells:
        seeds.setdefault(c.name[:-len(f"-s{c.seed}")], []).append(str(c.seed))
    return ", ".join(f"{stem}-s{s[0]}" if len(s) == 1 else f"{stem}-s{{{','.join(s)}}}" for stem, s in seeds.items())


def check_one_clip(cells: list, where: str) -> None:
    """Every method of a table (the cells of one pair) trains with one clip (docs/algorithms.md#one-clip-for-every-method): a GridError
    naming the cells and their clips unless the differing methods are marked ``clip: own``."""
    for pair in dict.fromkeys(c.pair for c in cells):
        by_clip: dict = {}
        for c in cells:
            if c.pair == pair and not c.clip_own and c.clip is not None:
                by_clip.setdefault(tuple(sorted(c.clip.items(), key=lambda kv: kv[0])), []).append(c)
        if len(by_clip) > 1:
            mixed = "; ".join(f"{clip_label(group[0].clip)} in {cell_names(group)}" for group in by_clip.values())
            raise GridError(f"{where}: the methods of one table must share one clip (docs/algorithms.md#one-clip-for-every-method), but "
                            f"pair {pair!r} mixes clips (eps_low/eps_high): {mixed}; set optim.clip.* once in the "
                            f"grid's 'set', or mark a method whose clip differs by design with 'clip: own'")


def select_cells(grid: Grid, patterns) -> list:
    """Cells whose name matches one of the glob ``patterns`` (all when none), with their dependencies."""
    if not patterns:
        return list(grid.cells)
    wanted = {c.name for c in grid.cells if any(fnmatch.fnmatch(c.name, p) for p in patterns)}
    if not wanted:
        raise GridError(f"--only {list(patterns)} matches no cell of {grid.path}")
    stack = list(wanted)
    while stack:
        for d in grid.cell(stack.pop()).depends:
            if d not in wanted:
                wanted.add(d)
                stack.append(d)
    return [c for c in grid.cells if c.name in wanted]
