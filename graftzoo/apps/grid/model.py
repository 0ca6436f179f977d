"""The grid's objects: a method (one labelled algorithm configuration), a cell (one training run of a
method on a pair and seed) and the expanded grid; cell ordering and selection."""
from __future__ import annotations

import fnmatch
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from graftzoo.core.config import load_config


class GridError(ValueError):
    """A grid file is malformed; the message names the file and the key."""


def slug(text: str) -> str:
    """``"GRAFT w/o gate"`` -> ``"graft-w-o-gate"``."""
    out = re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")
    if not out:
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
