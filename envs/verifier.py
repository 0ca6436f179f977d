"""Hardened math verifier: ``graftzoo.envs.verify(response, gold)`` (DESIGN.md "Real parts: Verifier";
spec anchors §3 row "Math verifier" and pain point 6; baseline_perf §3).

Per (response, gold):
  1. extract the final answer (graftzoo.envs.extract: last ``\\boxed``, then fallbacks), in the
     caller's process, with length and nesting limits;
  2. normalize both strings (spacing macros, ``\\left``/``\\right``, ``\\dfrac``) and take the fast
     exact path without math-verify: equal strings, or equal plain numbers (integers, decimals,
     integer fractions, and tuples/intervals of them) are correct; numbers that differ without a
     decimal point (e.g. two different integers) are wrong;
  3. look up the LRU of verdicts keyed by the normalized pair;
  4. otherwise run math-verify (its LaTeX path only: no ExprExtractionConfig, so no sympy string
     parser or eval on model text; latex2sympy passes sympy only digit tokens from its lexer)
     in a bounded pool of worker processes. Each call has a soft timer inside the worker and a
     hard wall-clock kill in the caller; a killed or dead worker is replaced and the call gets
     status "timeout". Workers keep LRU caches of parsed gold and predicted answers, parse with
     two-stage (SLL, then LL) ANTLR prediction (same results, about 2x faster), and pay
     math-verify's first-use costs before they take calls. A batch sends each distinct pair once
     and keeps the answers of one gold on the worker that parsed that gold.

Workers come from the "forkserver" start method (the trainer has torch threads, so fork is
unsafe); the forkserver preloads math_verify once, so a new worker imports nothing and only
spends about a second on warm-up, while the other workers carry on. The pool starts on first use and is shut down at exit (``close_pool``). As with any
spawn/forkserver pool, workers import the main module, so a script must guard its entry point
with ``if __name__ == "__main__":``.
"""
from __future__ import annotations

import atexit
import logging
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import signal
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from importlib.metadata import version

from graftzoo.envs.extract import MAX_ANSWER_CHARS, braces_balanced, extract_answer

__all__ = ["VerifyResult", "verify", "verify_batch", "answers_equivalent", "extract_answer",
           "normalize_answer", "configure_pool", "close_pool", "clear_caches", "VERIFIER_VERSION"]

VERIFIER_VERSION = f"graftzoo-verifier-1+math-verify-{version('math-verify')}"
STATUSES = ("ok", "no_answer", "unparsable", "timeout", "multiple_answers")
DEFAULT_WORKERS = 2
STARTUP_TIMEOUT_S = 120.0
MAX_FAILED_STARTS = 3
VERDICT_CACHE_SIZE = 65_536
SOFT_TIMEOUT_FRACTION = 0.8  # the worker interrupts itself first; the hard kill is the backstop
WORKER_MEMORY_HEADROOM = 2 << 30  # bytes of address space a worker may add after start-up

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyResult:
    """Verdict for one response. ``status`` is one of STATUSES; "ok" means parsed and compared."""

    correct: bool
    extracted: str | None
    status: str


# ---------------------------------------------------------------- normalization and fast path

# Group 1 keeps a LaTeX row break (two backslashes) whole, so that in "1 \\ 2" its second
# backslash is not taken for the space macro "\ ". Dollars, escaped or not, are dropped.
_DROP = re.compile(r"(\\\\)|\\?\$|\\(?:left|right)\.|\\(?:left|right)(?![A-Za-z])|\\[,;:! ]|\\displaystyle|~")
_SMALL_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_SPACE_NEAR_SYMBOL = re.compile(r"\s+(?=[^A-Za-z0-9])|(?<=[^A-Za-z0-9])\s+")
_NUMBER = re.compile(  # integer, decimal, integer fraction (\frac{a}{b}, \frac12, a/b) or infinity
    r"(?P<sign>[-+]?)(?:(?P<int>\d+)|(?P<dec>\d+\.\d*|\.\d+)|\\frac\{(?P<fn>-?\d+)\}\{(?P<fd>-?\d+)\}"
    r"|\\frac(?P<sn>\d)(?P<sd>\d)|(?P<qn>\d+)/(?P<qd>\d+)|(?P<inf>\\infty))")
_BRACKETED = re.compile(r"([(\[])([^()\[\]]*)([)\]])")


def normalize_answer(s: str) -> str:
    """Verdict-preserving normalization used as cache key and by the fast path.

    Drops ``$`` and ``\\$``, spacing macros (``\\,`` ``\\!`` ...), ``\\left``/``\\right``, ``\\displaystyle``,
    maps ``\\dfrac``/``\\tfrac`` to ``\\frac``, removes spaces next to symbols and a final period.
    """
    s = _SMALL_FRAC.sub(r"\\frac", _DROP.sub(lambda m: m.group(1) or "", s))
    s = _SPACE_NEAR_SYMBOL.sub("", " ".join(s.split()))
    return s.rstrip(".")


def _number(s: str) -> tuple[Fraction | float, bool] | None:
    """(value, exact) of a plain number; exact is False when a decimal point is involved."""
    m = _NUMBER.fullmatch(s)
    if m is None:
        return None
    g = m.groupdict()
    try:
        if g["inf"]:
            value = math.inf
        elif g["int"] or g["dec"]:
            value = Fraction(g["int"] or g["dec"])
        else:
            num, den = (g["fn"], g["fd"]) if g["fn"] else (g["sn"], g["sd"]) if g["sn"] else (g["qn"], g["qd"])
            value = Fraction(int(num), int(den))
    except ZeroDivisionError:
        return None
    return (-value if g["sign"] == "-" else value), not g["dec"]


def _numbers(s: str) -> tuple[str, list] | None:
    """A plain number, or a bracketed tuple/interval of plain numbers, as (brackets, [(value, exact)])."""
    m = _BRACKETED.fullmatch(s)
    brackets, parts = (m.group(1) + m.group(3), m.group(2).split(",")) if m else ("", [s])
    values = [_number(p) for p in parts]
    return None if None in values else (brackets, values)


def _fast_verdict(a: str, b: str) -> bool | None:
    """Verdict for two normalized answers without math-verify, or None when it must decide.

    Equal strings are equivalent. Plain numbers (integers, decimals, integer fractions, infinity)
    and bracketed tuples/intervals of them with the same brackets are compared exactly by value:
    equal values are equivalent; a component that differs is a wrong answer when neither side has
    a decimal point (decimals are left to math-verify's rounding rules).
    """
    if a == b:
        return True
    x, y = _numbers(a), _numbers(b)
    if x is None or y is None or x[0] != y[0] or len(x[1]) != len(y[1]):
        return None
    pairs = list(zip(x[1], y[1]))
    if any(u != v and eu and ev for (u, eu), (v, ev) in pairs):
        return False
    return True if all(u == v for (u, _), (v, _) in pairs) else None


class _LRU:
    """Thread-safe LRU dict of verdicts."""

    def __init__(self, size: int):
        self._size, self._data, self._lock = size, OrderedDict(), threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if len(self._data) > self._size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_VERDICTS = _LRU(VERDICT_CACHE_SIZE)

# ---------------------------------------------------------------- worker side (math-verify)


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside a worker; a BaseException so math-verify's handlers let it pass."""


def _on_alarm(signum, frame):
    raise _SoftTimeout()


@lru_cache(maxsize=1)
def _latex_config():
    from math_verify import LatexExtractionConfig
    return [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]


def _parse(answer: str) -> list:
    """math-verify parse of one extracted answer via its LaTeX path only (no eval, no parse_expr)."""
    from math_verify import parse
    return parse("\\boxed{" + answer + "}", extraction_config=_latex_config(),
                 fallback_mode="no_fallback", parsing_timeout=None)


_parse_gold = lru_cache(maxsize=2048)(_parse)
_parse_pred = lru_cache(maxsize=8192)(_parse)


def _evaluate(kind: str, a: str, b: str) -> tuple[str, bool]:
    """``("verify", gold, pred)`` or ``("equiv", x, y)`` -> (status, verdict)."""
    from math_verify import verify as mv_verify
    if kind == "verify":
        gold, pred = _parse_gold(a), _parse_pred(b)
        if not gold or not pred:
            return "unparsable", False
        return "ok", bool(mv_verify(gold, pred, timeout_seconds=None))
    x, y = _parse_pred(a), _parse_pred(b)
    if not x or not y:
        return "unparsable", False
    return "ok", bool(mv_verify(x, y, timeout_seconds=None) or mv_verify(y, x, timeout_seconds=None))


def two_stage_latex2sympy():
    """A drop-in for latex2sympy as math-verify calls it, with two-stage ANTLR parsing.

    The first attempt uses SLL prediction; only when it fails is the input parsed again with the
    full LL prediction latex2sympy uses. ANTLR guarantees that SLL returns either the parse tree LL
    would return or a syntax error, and latex2sympy's error listener raises on every syntax error,
    so results are unchanged; parsing is about 2x faster because full-context LL predictions are
    never cached. Calls with options math-verify does not use go to the original function.
    """
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy, latex2sympy

    class TwoStage(_Latex2Sympy):
        sll = True

        def create_parser(self, latex_str):
            parser = super().create_parser(latex_str)
            if self.sll:
                parser._interp.predictionMode = PredictionMode.SLL
            return parser

        def parse(self, latex_str):
            try:
                return super().parse(latex_str)
            except Exception:
                if not self.sll:
                    raise
                self.sll = False
                return super().parse(latex_str)

    def two_stage(latex_str, is_real=None, convert_degrees=False, normalization_config=None, **options):
        if normalization_config is not None or options:
            return latex2sympy(latex_str, is_real=is_real, convert_degrees=convert_degrees,
                               normalization_config=normalization_config, **options)
        return TwoStage(is_real=is_real, convert_degrees=convert_degrees).parse(latex_str)

    return two_stage


def _install_two_stage_parser() -> None:
    """Make math-verify's parser use ``two_stage_latex2sympy`` (in worker processes only)."""
    import math_verify.parser
    try:
        math_verify.parser.latex2sympy = two_stage_latex2sympy()
    except (ImportError, AttributeError) as e:  # another latex2sympy2_extended layout: keep LL only
        log.warning("verifier: two-stage LaTeX parsing unavailable (%s); using math-verify as is", e)


# One pair per common answer shape; parsing them once in a new worker pays math-verify's first-use
# costs (grammar and sympy initialisation, ~1 s) before the worker takes timed calls.
_WARMUP = (("\\frac{\\sqrt{2}}{2}", "\\sqrt{3}"), ("(1,2]", "[1,2)"), ("(1,-2)", "(-\\infty,2)\\cup(3,\\infty)"),
           ("x^2+2x-1", "(x+1)^2"), ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "6+9i"), ("10^\\circ", "50\\%"),
           ("\\text{(C)}", "y=2x+3"))


def _limit_memory() -> None:
    """Cap the worker's address space (Linux) so a memory bomb raises MemoryError, not OOM."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * resource.getpagesize()
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = current + WORKER_MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    except (ImportError, OSError, ValueError):
        pass


def _worker_main(conn) -> None:
    """Worker loop: receive (task, soft_timeout), answer (status, verdict); exit on EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    _limit_memory()
    _install_two_stage_parser()
    for gold, pred in _WARMUP:
        _evaluate("verify", gold, pred)
    conn.send("ready")
    while True:
        try:
            task, soft = conn.recv()
        except (EOFError, OSError):
            return
        try:
            signal.setitimer(signal.ITIMER_REAL, soft)
            try:
                out = _evaluate(*task)
            except Exception:  # math-verify / sympy failure on this input
                out = ("unparsable", False)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            out = ("timeout", False)
        conn.send(out)


# ---------------------------------------------------------------- caller side (the pool)


def _context():
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["math_verify", "graftzoo.envs.verifier"])
        return ctx
    return mp.get_context("spawn")


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True,
                                name="graftzoo-verifier")
        self.proc.start()
        child.close()
        self.ready = False
        self.task: int | None = None
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class _Schedule:
    """Task order for one pool run: tasks are grouped by their first answer (the gold), and a
    worker keeps taking tasks of the gold it already parsed, then claims an unclaimed gold, and
    only when every gold is claimed shares one (no worker idles while work is queued)."""

    def __init__(self, tasks: list[tuple[str, str, str]]):
        self._tasks = tasks
        self._groups: dict[str, deque[int]] = {}
        for i, task in enumerate(tasks):
            self._groups.setdefault(task[1], deque()).append(i)
        self._owner: dict[str, int] = {}
        self._current: dict[int, str] = {}

    def __bool__(self) -> bool:
        return bool(self._groups)

    def take(self, slot: int) -> int:
        key = self._current.get(slot)
        if key not in self._groups:
            key = next((g for g in self._groups if g not in self._owner), next(iter(self._groups)))
            self._owner[key], self._current[slot] = slot, key
        group = self._groups[key]
        i = group.popleft()
        if not group:
            del self._groups[key]
            self._owner.pop(key, None)
        return i

    def put_back(self, i: int) -> None:
        self._groups.setdefault(self._tasks[i][1], deque()).appendleft(i)


class _Pool:
    """Bounded pool of math-verify workers with a hard wall-clock kill per call."""

    def __init__(self, workers: int):
        self._ctx = _context()
        self._workers = [_Worker(self._ctx) for _ in range(workers)]
        self._lock = threading.Lock()
        self._failed_starts = 0
        self.pid = os.getpid()

    def run(self, tasks: list[tuple[str, str, str]], timeout: float) -> list[tuple[str, bool]]:
        """Run tasks on free workers; return (status, verdict) per task, in order."""
        with self._lock:
            if not self._workers:
                raise RuntimeError("graftzoo verifier: the worker pool was closed during this call")
            results: list = [None] * len(tasks)
            queue = _Schedule(tasks)
            ws = self._workers
            while queue or any(w.task is not None for w in ws):
                now = time.monotonic()
                for k, w in enumerate(ws):
                    if w.ready and w.task is None and queue:
                        i = queue.take(k)
                        try:
                            w.conn.send((tasks[i], SOFT_TIMEOUT_FRACTION * timeout))
                        except OSError:  # died while idle: retry the task on a fresh worker
                            queue.put_back(i)
                            ws[k] = self._replace(w)
                            continue
                        w.task, w.deadline = i, now + timeout
                waiting = [w for w in ws if not w.ready or w.task is not None]
                wait_s = max(0.0, min(w.deadline for w in waiting) - now)
                readable = mp.connection.wait([w.conn for w in waiting], timeout=wait_s)
                for k, w in enumerate(ws):
                    if w not in waiting:
                        continue
                    if w.conn in readable:
                        try:
                            msg = w.conn.recv()
                        except (EOFError, OSError):
                            ws[k] = self._replace(w)
                            if w.task is not None:
                                log.warning("verifier worker died (exit code %s); replaced", w.proc.exitcode)
                                results[w.task] = ("unparsable", False)
                            continue
                        if msg == "ready":
                            w.ready, self._failed_starts = True, 0
                        else:
                            results[w.task], w.task = msg, None
                    elif time.monotonic() >= w.deadline:
                        ws[k] = self._replace(w)
                        if w.task is not None:
                            results[w.task] = ("timeout", False)
            return results

    def _replace(self, w: _Worker) -> _Worker:
        """Kill ``w`` (hung or dead) and start a fresh worker in its place; raise when workers keep
        dying before they are ready (a broken install, or an unguarded main script)."""
        w.kill()
        if not w.ready:
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                raise RuntimeError(
                    f"graftzoo verifier: {self._failed_starts} math-verify workers in a row died while starting "
                    f"(last exit code {w.proc.exitcode}); is math-verify importable, and is the main script "
                    "guarded by `if __name__ == '__main__':`?")
            log.warning("verifier worker died while starting (exit code %s); retrying", w.proc.exitcode)
        return _Worker(self._ctx)

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                w.kill()
            self._workers = []


_POOL: _Pool | None = None
_POOL_SIZE = DEFAULT_WORKERS
_POOL_LOCK = threading.Lock()


def _pool() -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # none yet, or inherited through fork
            _POOL = _Pool(_POOL_SIZE)
        return _POOL


def configure_pool(workers: int) -> None:
    """Set the number of math-verify worker processes (default 2); restarts the pool."""
    global _POOL_SIZE
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"configure_pool: workers must be a positive int, got {workers!r}")
    close_pool()
    _POOL_SIZE = workers


def close_pool() -> None:
    """Stop the worker processes (registered with atexit; the next call starts a new pool)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None


atexit.register(close_pool)


def clear_caches() -> None:
    """Forget cached verdicts (the workers' parse caches go with ``close_pool``)."""
    _VERDICTS.clear()


# ---------------------------------------------------------------- public API


def _check_timeout(timeout: float) -> None:
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"verifier: timeout must be a positive number of seconds, got {timeout!r}")


def verify_batch(responses: list[str], golds: list[str], *, timeout: float = 1.0) -> list[VerifyResult]:
    """Verify ``responses[i]`` against ``golds[i]``; identical normalized pairs are computed once.

    ``timeout`` is the hard wall-clock limit (seconds) of each math-verify call.
    """
    if len(responses) != len(golds):
        raise ValueError(f"verify_batch: {len(responses)} responses but {len(golds)} golds")
    _check_timeout(timeout)
    results: list[VerifyResult | None] = [None] * len(responses)
    pending: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for i, (response, gold) in enumerate(zip(responses, golds)):
        for name, value in (("responses", response), ("golds", gold)):
            if not isinstance(value, str):
                raise TypeError(f"verify_batch: {name}[{i}] must be str, got {type(value).__name__}")
        extracted, status = extract_answer(response)
        if status != "ok":
            results[i] = VerifyResult(False, extracted, status)
            continue
        pred, ref = normalize_answer(extracted), normalize_answer(gold)
        fast = _fast_verdict(pred, ref)
        cached = ("ok", fast) if fast is not None else _VERDICTS.get(("verify", ref, pred))
        if cached is not None:
            results[i] = VerifyResult(cached[1], extracted, cached[0])
        else:
            pending.setdefault((ref, pred), []).append((i, extracted))
    if pending:
        keys = list(pending)
        for (ref, pred), (status, correct) in zip(keys, _pool().run([("verify", *k) for k in keys], timeout)):
            if status != "timeout":
                _VERDICTS.put(("verify", ref, pred), (status, correct))
            for i, extracted in pending[(ref, pred)]:
                results[i] = VerifyResult(correct, extracted, status)
    return results


def verify(response: str, gold: str, *, timeout: float = 1.0) -> VerifyResult:
    """Verify one response against its gold answer (see the module docstring for the pipeline)."""
    return verify_batch([response], [gold], timeout=timeout)[0]


def answers_equivalent(a: str, b: str, *, timeout: float = 1.0) -> bool | None:
    """Whether two extracted answers are mathematically equivalent (OM-GRPO answer clustering).

    Symmetric: math-verify is asked in both directions. None when either answer is too long, has
    unbalanced braces, cannot be parsed, or the comparison times out.
    """
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, str):
            raise TypeError(f"answers_equivalent: {name} must be str, got {type(x).__name__}")
    _check_timeout(timeout)
    if any(len(x) > MAX_ANSWER_CHARS or not braces_balanced(x) for x in (a, b)):
        return None
    x, y = sorted((normalize_answer(a), normalize_answer(b)))
    fast = _fast_verdict(x, y)
    if fast is not None:
        return fast
    cached = _VERDICTS.get(("equiv", x, y))
    if cached is None:
        cached = _pool().run([("equiv", x, y)], timeout)[0]
        if cached[0] != "timeout":
            _VERDICTS.put(("equiv", x, y), cached)
    status, same = cached
    return same if status == "ok" else None
