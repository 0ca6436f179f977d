"""Reading a grid file and expanding it into cells (format: the package docstring); nothing is run or created, and
torch is not imported (a grid with ``report.map`` imports graftzoo.eval.regime once the map is checked)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from graftzoo.apps.evaluate import eval_cmd
from graftzoo.apps.grid.model import (Cell, Grid, GridError, Method, check_one_clip, order_cells, resolve_clips,
                                      slug)
from graftzoo.apps.options import PEER_FORMS, PeerOptionError, parse_peer
from graftzoo.contract.errors import did_you_mean
from graftzoo.contract.config import SCHEMA, ConfigError, find_config, flat_settings, pair_file, read_yaml

GRID_KEYS = {"name", "out_dir", "pairs", "seeds", "files", "set", "algorithms", "variants", "eval", "report"}
METHOD_KEYS = {"label", "algo", "set", "files", "peer", "each_model", "clip", "pairs"}
CLIP_MARKS = ("shared", "own")   # a method's ``clip``: the table's one clip (default) | its own, by design
REPORT_KEYS = {"baseline", "budgets", "map", "wandb"}   # wandb: false keeps the report off wandb
MAP_KEYS = {"title", "rows", "cols", "methods", "budget", "skill"}
CELL_REF = re.compile(r"^\{cell:(.+)\}$")
# the options of ``graftzoo eval`` a grid's ``eval`` block may set: those of evaluate_checkpoint (a test checks they
# agree) but the run (the RUN argument or --ckpt) and where it writes, which each cell sets
EVAL_OPTIONS = frozenset(p.name for p in eval_cmd.params) - {"path", "ckpt", "out", "models", "plugins"}


def _preset(algo: str) -> dict:
    """The preset ``configs/algos/ALGO.yaml`` as written (empty for a plain algorithm name)."""
    path = find_config("algos", algo)
    return read_yaml(path) if path is not None else {}


def _preset_keys(algo: str) -> set:
    """The dotted config keys the preset ``configs/algos/ALGO.yaml`` sets (none for a plain algorithm name): what a
    method's row differs in by design (``graftzoo.eval.report.design_keys``), e.g. grpo_n16's rollout.n."""
    return {s.split("=", 1)[0] for s in flat_settings(_preset(algo))}


def _preset_label(algo: str) -> str:
    return str((_preset(algo).get("run") or {}).get("variant") or algo)


def method_algorithm(method) -> str:
    """The algorithm a grid method runs: its ``set``'s ``algo.name``, else its preset's, else its ``algo`` (then an
    algorithm's name)."""
    preset = (_preset(method.algo).get("algo") or {}).get("name")
    return str(method.overrides.get("algo.name") or preset or method.algo)


def _flat(mapping: dict, where: str, prefix: str = "") -> dict:
    """Dotted overrides from ``{a.b: 1}`` or ``{a: {b: 1}}``; free maps (task.mix ...) and
    ``algo.*`` values stay whole."""
    if not isinstance(mapping, dict):
        raise GridError(f"{where} must be a mapping of dotted config keys to values")
    out = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(SCHEMA.get(path), dict):
            out.update(_flat(value, f"{where}.{key}", f"{path}."))
        elif isinstance(value, dict) and path == "algo":
            out.update({f"algo.{k}": v for k, v in value.items()})
        else:
            out[path] = value
    return out


def _method(entry, where: str) -> Method:
    if isinstance(entry, str):
        return Method(label=_preset_label(entry), algo=entry, sets=_preset_keys(entry))
    if not isinstance(entry, dict):
        raise GridError(f"{where} must be an algorithm name or a mapping with 'algo'")
    if "same_as" in entry:  # a label alias: the same runs, shown under a second label (one config, two names)
        if set(entry) != {"label", "same_as"} or not all(isinstance(entry[k], str) and entry[k] for k in entry):
            raise GridError(f"{where}: an alias entry has exactly 'label' and 'same_as' (the label of the "
                            f"method whose runs it shows), got keys {sorted(entry)}")
        return Method(label=entry["label"], algo="", same_as=entry["same_as"])
    unknown = sorted(set(entry) - METHOD_KEYS)
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}{did_you_mean(unknown[0], sorted(METHOD_KEYS))}; known: "
                        f"{sorted(METHOD_KEYS)}")
    if not isinstance(entry.get("algo"), str) or not entry["algo"]:
        raise GridError(f"{where}: key 'algo' (a preset or algorithm name) is required")
    files = entry.get("files") or []
    if not isinstance(files, list):
        raise GridError(f"{where}.files must be a list of config files")
    peer = entry.get("peer")
    if peer is not None and not isinstance(peer, str):
        raise GridError(f"{where}.peer must be {PEER_FORMS}")
    clip = entry.get("clip", "shared")
    if clip not in CLIP_MARKS:
        raise GridError(f"{where}.clip must be shared (the table's one clip, default) or own (a clip that differs "
                        f"by design, e.g. HACPO's algo.self_clip), got {clip!r}")
    only = entry.get("pairs")
    only = [only] if isinstance(only, str) else only
    if only is not None and (not isinstance(only, list) or not only or not all(isinstance(p, str) for p in only)):
        raise GridError(f"{where}.pairs must be a non-empty list of the grid's pairs")
    return Method(label=str(entry.get("label") or _preset_label(entry["algo"])), algo=entry["algo"],
                  overrides=_flat(entry.get("set") or {}, f"{where}.set"), files=[str(f) for f in files],
                  peer=peer, each_model=bool(entry.get("each_model", False)), clip=clip, pairs=only,
                  sets=_preset_keys(entry["algo"]))


def pair_models(pair: str, where: str) -> list:
    """The model ids of a pair file, in order (the first is the learner of the control and regime-map grids)."""
    try:
        data = read_yaml(pair_file(pair))
    except ConfigError as e:
        raise GridError(f"{where}: {e}") from None
    models = data.get("models") or (data.get("pair") or {}).get("models") or []
    return [m["id"] for m in models]


def _peer_overrides(peer: str, where: str) -> tuple:
    """({peer.* overrides}, label of the referenced method or None); PATH may be ``{cell:LABEL}``."""
    try:
        out = parse_peer(peer)
    except PeerOptionError as e:
        raise GridError(f"{where}.peer: {e} (PATH may be {{cell:LABEL}})") from None
    ref = CELL_REF.match(out.get("peer.path", ""))
    if ref:
        del out["peer.path"]   # the referenced cell's run directory, set per pair and seed
    return out, (ref.group(1).strip() if ref else None)


def _map_pairs(block, key: str, pairs: list, where: str) -> dict:
    """``report.map.rows`` / ``cols``: {name: [pairs of the grid]}."""
    if not isinstance(block, dict) or not block:
        raise GridError(f"{where}: report.map.{key} must be a mapping of names (in words) to lists of the grid's "
                        f"pairs")
    out = {}
    for name, got in block.items():
        got = [got] if isinstance(got, str) else got
        if not isinstance(got, list) or not got or not all(isinstance(p, str) for p in got):
            raise GridError(f"{where}: report.map.{key}[{name!r}] must be a non-empty list of the grid's pairs")
        unknown = [p for p in got if p not in pairs]
        if unknown:
            raise GridError(f"{where}: report.map.{key}[{name!r}]: pairs {unknown} are not among the grid's "
                            f"pairs {pairs}")
        out[str(name)] = got
    return out


def _regime_map(block, where: str, pairs: list, methods: list, report: dict):
    """The validated ``report.map`` (format: the package docstring; what it computes: graftzoo.eval.regime)."""
    if not isinstance(block, dict):
        raise GridError(f"{where}: report.map must be a mapping with keys among {sorted(MAP_KEYS)}")
    unknown = sorted(set(block) - MAP_KEYS)
    if unknown:
        raise GridError(f"{where}: report.map: unknown key(s) {unknown}; known: {sorted(MAP_KEYS)}")
    rows, cols = (_map_pairs(block.get(k), k, pairs, where) for k in ("rows", "cols"))
    cell_pair = {}
    for r, rp in rows.items():
        for c, cp in cols.items():
            both = [p for p in rp if p in cp]
            if len(both) != 1:
                raise GridError(f"{where}: report.map: row {r!r} and column {c!r} share {len(both)} pairs {both}; "
                                f"each (row, col) must pick exactly one pair")
            cell_pair[(r, c)] = both[0]
    stray = sorted({p for ps in list(rows.values()) + list(cols.values()) for p in ps} - set(cell_pair.values()))
    if stray:
        raise GridError(f"{where}: report.map: pairs {stray} are in a row or a column but in no (row, col) cell")
    learner = {p: pair_models(p, where)[0] for p in pairs}
    for r in rows:
        ids = {cell_pair[(r, c)]: learner[cell_pair[(r, c)]] for c in cols}
        if len(set(ids.values())) > 1:
            raise GridError(f"{where}: report.map: row {r!r} mixes learners (each pair's first model): {ids}; a row "
                            f"is one learner")
    base_pairs = {r: list(dict.fromkeys(rp + [p for p in pairs if learner[p] == learner[rp[0]]]))
                  for r, rp in rows.items()}   # the row's pairs, then the grid's other pairs of its learner
    fold = {m.label.casefold(): m for m in methods}
    names = [m.label for m in methods]

    def label(value, key: str) -> str:
        if not isinstance(value, str) or value.casefold() not in fold:
            raise GridError(f"{where}: {key}: {value!r} is not a method label; labels: {names}")
        return fold[value.casefold()].label

    baseline = report.get("baseline") or ("GRPO (n=8)" if "GRPO (n=8)" in names else names[0])  # as write_report
    baseline = label(baseline, "report.baseline (the map's baseline)")
    shown = block.get("methods")
    shown = [shown] if isinstance(shown, str) else shown
    if not isinstance(shown, list) or not shown:
        raise GridError(f"{where}: report.map.methods must be a non-empty list of method labels (one panel each)")
    shown = [label(x, f"report.map.methods[{i}]") for i, x in enumerate(shown)]
    budget = label(block["budget"], "report.map.budget") if block.get("budget") is not None else None
    panels = shown + ([budget] if budget else [])
    if len(set(panels)) != len(panels) or baseline in panels:
        raise GridError(f"{where}: report.map: the panels (methods {shown}, budget {budget}) must be distinct "
                        f"labels other than the baseline {baseline!r}")
    skill = block.get("skill")
    if skill is not None and not isinstance(skill, str):
        raise GridError(f"{where}: report.map.skill must be the name of one benchmark of the eval files (e.g. mul)")
    runs = {x: fold[x.casefold()].same_as or x for x in [baseline, *shown] + ([budget] if budget else [])}
    title = str(block.get("title") or f"Δ against {baseline} on the learner's {skill or 'held-out score'}")
    from graftzoo.eval.regime import RegimeMap  # matplotlib, torch: once the map is checked
    return RegimeMap(title=title, rows=list(rows), cols=list(cols), cell_pair=cell_pair, base_pairs=base_pairs,
                     learner=learner, baseline=baseline, methods=shown, budget=budget, skill=skill, labels=runs)


def _eval_options(ev, where: str) -> dict:
    if not isinstance(ev, dict):
        raise GridError(f"{where} must be a mapping of graftzoo eval options")
    unknown = sorted(set(ev) - EVAL_OPTIONS)
    if unknown:
        raise GridError(f"{where}: unknown option(s) {unknown}; known: {sorted(EVAL_OPTIONS)}")
    return dict(ev)


def _read(path: Path) -> tuple:
    """(path of the grid file, its data): a path that is not a file is looked up as a named grid (``NAME``,
    ``grids/NAME.yaml`` or ``configs/grids/NAME.yaml``) in ./configs, then in the package (``find_config``)."""
    if not path.is_file():
        found = find_config("grids", str(path))
        if found is None:
            raise GridError(f"{path}: no such grid file, nor a grid of that name in ./configs/grids or the "
                            f"package's configs/grids")
        path = found
    try:
        return path, read_yaml(path)
    except ConfigError as e:
        raise GridError(str(e)) from None


def _methods(data: dict, where: str, pairs: list) -> list:
    """The grid's methods (``algorithms`` then ``variants``), checked: at least one, distinct labels, every alias
    naming a method with runs, every method's pairs among the grid's."""
    methods = [_method(e, f"{where}: algorithms[{i}]") for i, e in enumerate(data.get("algorithms") or [])]
    methods += [_method(e, f"{where}: variants[{i}]") for i, e in enumerate(data.get("variants") or [])]
    if not methods:
        raise GridError(f"{where}: no methods: give 'algorithms' and/or 'variants'")
    labels = [m.label for m in methods]
    clash = sorted({x for x in labels if labels.count(x) > 1})
    if clash:
        raise GridError(f"{where}: method label(s) {clash} repeat; give each a distinct 'label'")
    by_label = {m.label: m for m in methods}
    for m in methods:
        if m.same_as is not None and (m.same_as not in by_label or by_label[m.same_as].same_as is not None):
            raise GridError(f"{where}: alias {m.label!r} has same_as {m.same_as!r}, which is not the label of a "
                            f"method with runs; labels: {[x.label for x in methods if x.same_as is None]}")
        unknown = [p for p in m.pairs or [] if p not in pairs]
        if unknown:
            raise GridError(f"{where}: method {m.label!r}: pairs {unknown} are not among the grid's pairs {pairs}")
    return methods


def load_grid(path, out: Optional[str] = None) -> Grid:
    """Read and expand a grid file (format: the package docstring); nothing is run or created."""
    path, data = _read(Path(path))
    where = str(path)
    unknown = sorted(set(data) - GRID_KEYS)
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}{did_you_mean(unknown[0], sorted(GRID_KEYS))}; known: "
                        f"{sorted(GRID_KEYS)}")
    name = str(data.get("name") or path.stem)
    root = Path(out or data.get("out_dir") or Path("runs") / name)
    pairs = data.get("pairs")
    pairs = [pairs] if isinstance(pairs, str) else pairs
    if not pairs or not all(isinstance(p, str) for p in pairs):
        raise GridError(f"{where}: key 'pairs' must name at least one pair")
    for p in pairs:
        pair_models(p, f"{where}: pairs")  # an unknown pair: one line with the closest known ones
    seeds = data.get("seeds", [0])
    seeds = list(range(seeds)) if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise GridError(f"{where}: key 'seeds' must be a list of integers or a count")
    files = [str(f) for f in data.get("files") or []]
    common = _flat(data.get("set") or {}, f"{where}: set")
    methods = _methods(data, where, pairs)
    labels = [m.label for m in methods]
    by_label = {m.label: m for m in methods}
    ev = data.get("eval")
    if ev is not None:
        ev = _eval_options(ev, f"{where}: eval")
    report = data.get("report") or {}
    if not isinstance(report, dict) or set(report) - REPORT_KEYS:
        raise GridError(f"{where}: report must be a mapping with keys among {sorted(REPORT_KEYS)}")
    if not isinstance(report.get("wandb", True), bool):
        raise GridError(f"{where}: report.wandb must be true or false (false: the report is not logged to wandb)")
    regime = _regime_map(report["map"], where, pairs, methods, report) if "map" in report else None

    cells, names = [], {}
    for m in (x for x in methods if x.same_as is None):  # an alias has no cells of its own
        mwhere = f"{where}: method {m.label!r}"
        peer, ref = _peer_overrides(m.peer, mwhere) if m.peer else ({}, None)
        if ref is not None:
            if ref not in by_label:
                raise GridError(f"{mwhere}: peer refers to {{cell:{ref}}} but no method has that label; "
                                f"labels: {labels}")
            ref = by_label[ref].same_as or ref
            if by_label[ref].each_model:
                raise GridError(f"{mwhere}: peer cell {ref!r} trains one model per cell (each_model); "
                                f"refer to a method that trains the whole pair")
        for pair in (p for p in pairs if m.pairs is None or p in m.pairs):
            if ref is not None and by_label[ref].pairs is not None and pair not in by_label[ref].pairs:
                raise GridError(f"{mwhere}: peer refers to {{cell:{ref}}}, which has no cell on pair {pair!r} "
                                f"(its 'pairs': {by_label[ref].pairs})")
            models = pair_models(pair, mwhere) if m.each_model else [None]
            for seed in seeds:
                for model in models:
                    stem = slug(m.label) + (f"-{slug(model.split('/')[-1])}" if model else "")
                    cname = f"{stem}-{pair}-s{seed}"
                    if cname in names:
                        raise GridError(f"{where}: methods {names[cname]!r} and {m.label!r} both name a run "
                                        f"{cname!r}; make their labels differ in letters, digits, '.' or '_'")
                    names[cname] = m.label
                    ov = dict(common)
                    ov.update(m.overrides)
                    ov.update({"run.name": cname, "run.variant": m.label, "run.seed": seed,
                               "run.wandb_group": name, "run.tags": [m.algo, pair, f"s{seed}"],
                               "run.out_dir": str(root)})
                    ov.update(peer)
                    depends = []
                    if ref is not None:
                        dep = f"{slug(ref)}-{pair}-s{seed}"
                        ov["peer.path"] = str(root / dep)
                        depends.append(dep)
                    if model is not None:
                        ov["pair.train"] = [model]
                    cells.append(Cell(name=cname, label=m.label, algo=m.algo, pair=pair, seed=seed,
                                      run_dir=root / cname, overrides=ov, files=files + m.files, model=model,
                                      depends=depends, clip_own=m.clip == "own"))
    resolve_clips(cells)
    check_one_clip(cells, where)
    return Grid(name=name, path=path, root=root, methods=methods, cells=order_cells(cells, where), eval=ev,
                report=report, regime=regime)
