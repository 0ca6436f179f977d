"""The verifier's worker processes (``graftzoo.envs.verify_pool`` starts and feeds them): each one
answers ``("verify", gold, pred)`` / ``("equiv", x, y)`` tasks with math-verify's LaTeX path, under
a soft timer of its own (SIGALRM) and a capped address space.

Workers keep LRU caches of parsed gold and predicted answers, parse with two-stage (SLL, then LL)
ANTLR prediction (same results, about 2x faster), and pay math-verify's first-use costs before
they take calls. math-verify is imported inside the functions: the caller's process never needs it.
"""
from __future__ import annotations

import logging
import signal
from functools import lru_cache

__all__ = ["two_stage_latex2sympy", "worker_main"]

WORKER_MEMORY_HEADROOM = 2 << 30  # bytes of address space a worker may add after start-up

log = logging.getLogger(__name__)


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


def worker_main(conn) -> None:
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
