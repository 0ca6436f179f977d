"""Plain math-verify's verdict on a case of ``verifier_cases.jsonl``: ``verify(parse(gold),
parse(response))`` on the strings as written, with math-verify's default extraction and the case's
options (its ``math_verify`` column; tests/test_verifier_suite.py checks a sample of the column)."""
import logging
import warnings


def plain_verdict(response: str, gold: str, options: dict | None = None) -> bool:
    """True when plain math-verify pays ``response`` for ``gold``; an error is a wrong verdict."""
    from math_verify import parse, verify
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(verify(parse(gold), parse(response), **(options or {})))
        except Exception:
            return False
