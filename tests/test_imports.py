"""Import hygiene: every module imports in a fresh interpreter, the module-level import graph of the
package has no cycle, and imports inside functions are only for optional heavy dependencies."""
import ast
import concurrent.futures as cf
import importlib.util
import json
import os
import pkgutil
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOTS = ("graftzoo", "graftzoo.envs", "graftzoo.algos", "graftzoo.peers", "graftzoo.eval")
# optional or heavy third-party packages a function may import on first use (never a graftzoo module)
LAZY_OK = {"vllm", "ray", "matplotlib", "wandb", "sentence_transformers", "trl", "peft", "flash_attn",
           "datasets", "huggingface_hub",  # ~1 s to import: only for datasets folders, Arrow files and Hub names
           # only the verifier's worker processes parse with math-verify (1.7 s saved on `import graftzoo.envs`);
           # `resource` is POSIX-only (the workers' memory limit)
           "math_verify", "antlr4", "latex2sympy2_extended", "sympy", "resource"}


def _walk(package: str, path: str) -> dict:
    """module name -> source file, for ``package`` and every module under it (nothing is imported)."""
    out = {package: str(Path(path) / "__init__.py")}
    for info in pkgutil.iter_modules([path], package + "."):
        here = Path(info.module_finder.path)
        short = info.name.rsplit(".", 1)[1]
        if info.ispkg:
            out.update(_walk(info.name, str(here / short)))
        else:
            out[info.name] = str(here / f"{short}.py")
    return out


def package_modules() -> dict:
    """Every module of the graftzoo distribution (the five roots install from separate folders)."""
    out = {}
    for root in ROOTS:
        spec = importlib.util.find_spec(root)
        for loc in spec.submodule_search_locations:
            out.update(_walk(root, loc))
    return out


MODULES = package_modules()


# ---------------------------------------------------------------------------------------------
# (a) each module imports in a fresh interpreter
# ---------------------------------------------------------------------------------------------

CHILD = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-4)
print(json.dumps(failed))
"""


def _group(name: str) -> str:
    """The subpackage a module is imported with: graftzoo.contract, graftzoo.algos, ..."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else name


@pytest.mark.slow
def test_every_module_imports_in_a_fresh_interpreter():
    """One fresh interpreter per subpackage, importing its modules in a shuffled order (so a cycle
    that only breaks when entered from one side shows up sooner or later; the seed is in the message,
    GRAFTZOO_IMPORT_SEED=N repeats an order)."""
    seed = int(os.environ.get("GRAFTZOO_IMPORT_SEED") or random.randrange(10 ** 6))
    rng = random.Random(seed)
    groups: dict = {}
    for name in sorted(MODULES):
        groups.setdefault(_group(name), []).append(name)
    for names in groups.values():
        rng.shuffle(names)
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", WANDB_MODE="offline")

    def run(names):
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(names)], capture_output=True, text=True,
                              env=env, timeout=300)
        try:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return {names[0]: f"interpreter died (rc {proc.returncode}): {proc.stderr[-2000:]}"}

    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(groups, pool.map(run, groups.values())))
    failed = {name: why for res in results.values() for name, why in res.items()}
    report = "\n".join(f"--- {name} (import order {groups[_group(name)]}):\n{why}" for name, why in failed.items())
    assert not failed, f"modules that fail to import (GRAFTZOO_IMPORT_SEED={seed}):\n{report}"


# ---------------------------------------------------------------------------------------------
# (b) static checks on the source
# ---------------------------------------------------------------------------------------------

def _resolve(node, module: str, is_pkg: bool) -> list:
    """The graftzoo modules an import statement executes (with their packages), else []."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if is_pkg else module.split(".")[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out = []
    for name in names:
        parts = name.split(".")
        out += [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in MODULES]
    return out


def _is_type_checking(node) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING")


def _imports(tree):
    """(import node, inside a function?) for every import statement; ``if TYPE_CHECKING:`` blocks skipped."""
    def visit(node, in_func):
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_func
            yield from visit(child, in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from visit(tree, False)


def _parsed():
    for name, path in sorted(MODULES.items()):
        yield name, path, ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def import_graph(in_functions: bool = True) -> dict:
    """module -> {graftzoo modules its imports execute: (module, imported inside a function?)}.
    Packages that the importing module sits in are left out: they are initialised before it (the
    usual package pattern). Imports inside functions count (``in_functions``): a cycle they close
    is a cycle hidden, not removed."""
    graph = {}
    for name, path, tree in _parsed():
        is_pkg = path.endswith("__init__.py")
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} | ({name} if is_pkg else set())
        edges = graph[name] = {}
        for node, in_func in _imports(tree):
            if in_func and not in_functions:
                continue
            for m in _resolve(node, name, is_pkg):
                if m not in own and m != name:
                    edges[m] = edges.get(m, True) and in_func
    return graph


def find_cycles(graph: dict) -> list:
    """One cycle path (``[a, b, ..., a]``) per strongly connected component with more than one module."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in comps:  # the shortest cycle through each module of the component, without repeats
        for start in sorted(comp):
            path = _shortest_path(graph, comp, start)
            k = path.index(min(path[:-1]))
            path = path[k:-1] + path[:k] + [path[k]]
            if path not in cycles:
                cycles.append(path)
    return cycles


def _shortest_path(graph: dict, comp: set, start: str) -> list:
    """Breadth-first: the shortest ``[start, ..., start]`` within a strongly connected component."""
    prev, frontier = {}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def test_find_cycles_reports_a_path():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(g) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    cycles = find_cycles({m: set(e) for m, e in graph.items()})

    def show(c):
        return c[0] + "".join(f" {'~>' if graph[a][b] else '->'} {b}" for a, b in zip(c, c[1:]))
    assert not cycles, ("import cycles (~> marks an import inside a function, which hides the cycle "
                        "without removing it):\n" + "\n".join("  " + show(c) for c in cycles))


def late_reason(line: str) -> str:
    """The reason a late import gives in its line's comment (``# torch: after config check``), without ``noqa``."""
    comment = line.split("#", 1)[1] if "#" in line else ""
    return " ".join(w for w in comment.split() if not w.startswith(("noqa", "F401", "PLC")))


def function_level_imports() -> list:
    """``file:line  statement`` for each import inside a function that is neither an optional heavy dependency
    nor an import made late on purpose, with its reason in a comment on its line (the CLI imports the trainer
    after the config check so that ``--help`` and config errors answer at once)."""
    bad = []
    for name, path, tree in _parsed():
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        for node, in_func in _imports(tree):
            if not in_func or len(late_reason(lines[node.lineno - 1]).split()) >= 2:
                continue
            is_pkg = path.endswith("__init__.py")
            tops = {a.name.split(".")[0] for a in node.names} if isinstance(node, ast.Import) else \
                {(node.module or "").split(".")[0]} if not node.level else {"graftzoo"}
            if _resolve(node, name, is_pkg) or not tops <= LAZY_OK:
                rel = os.path.relpath(path, Path(__file__).resolve().parents[1])
                bad.append(f"{rel}:{node.lineno}  {ast.unparse(node)}")
    return bad


def test_function_level_imports_are_only_optional_heavy_dependencies():
    bad = function_level_imports()
    assert not bad, (f"{len(bad)} import(s) inside functions (move them to the top of the module; only "
                     f"{sorted(LAZY_OK)} may be imported lazily, or an import that says why it is late in a "
                     f"comment on its line):\n" + "\n".join("  " + b for b in bad))


def test_a_late_import_states_its_reason():
    assert late_reason("    from graftzoo.api import train_run  # torch: after config check") == \
        "torch: after config check"
    assert late_reason("    import torch  # noqa: F401") == "" and late_reason("    import torch") == ""
