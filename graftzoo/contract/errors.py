"""Errors of training that cross module and process boundaries (imported without torch or models)."""
import difflib


class NonFiniteError(RuntimeError):
    """Training produced a non-finite loss, gradient norm or parameter (the run stops; nothing of it is saved).
    ``metrics`` holds the step's values (NaN / inf kept) for the metrics log."""

    def __init__(self, what: str, value: float, where: str = "", **metrics):
        super().__init__(f"non-finite {what} ({value}){' at ' + where if where else ''}")
        self.what, self.value = what, value
        self.where = where
        self.metrics = {"loss": value if what == "loss" else None,
                        "grad_norm": value if what == "gradient norm" else None, **metrics}

    def __reduce__(self):  # raised in a worker process, re-raised by the driver with its metrics
        return (type(self), (self.what, self.value, self.where), self.__dict__)


class ConfigError(ValueError):
    """A config key or value is wrong; the one-line message names the key."""


def did_you_mean(name: str, known, prefix: str = "") -> str:
    """``"; did you mean 'a' or 'b'?"`` for the known names closest to a mistyped ``name``, ``""`` when none is
    close: appended to an "unknown ..." message, before the list of every known name. A known name that differs
    from ``name`` in case alone is the one meant (``GRAFT``: ``graft``); otherwise the closest by difflib's ratio,
    compared in lower case (``Grfat``: ``graft``). Names are shown as known, after ``prefix`` (a key's section:
    ``optim.`` + ``lr``)."""
    names = list(dict.fromkeys(str(k) for k in known))
    text = str(name).casefold()
    close = [k for k in names if k.casefold() == text][:1]
    if not close:
        lowered: dict = {}
        for k in names:
            lowered.setdefault(k.casefold(), k)
        close = [lowered[c] for c in difflib.get_close_matches(text, list(lowered), n=3)]
    return f"; did you mean {' or '.join(repr(prefix + c) for c in close)}?" if close else ""
