"""Option values shared by the command line (``graftzoo train --peer``) and grid files (a method's ``peer``)."""
from __future__ import annotations

import json

import click

PEER_KINDS = ("online", "none", "stored", "mixed")
PEER_FORMS = "online | none | stored:PATH | mixed:PATH"


class PeerOptionError(ValueError):
    """A peer value is malformed; the message says which form is expected."""


class PeerUsageError(click.ClickException):
    """A malformed ``--peer`` on the command line: one line ``Error: Invalid value for '--peer': ...``, exit code 2
    (a usage error, without click's usage banner)."""

    exit_code = 2


def parse_peer(value: str) -> dict:
    """A peer value (``online`` | ``none`` | ``stored:PATH`` | ``mixed:PATH``) -> its dotted config
    overrides: ``{"peer.source": kind}``, plus ``{"peer.path": PATH}`` for stored and mixed peers."""
    kind, sep, path = str(value).partition(":")
    kind, path = kind.strip(), path.strip()
    if kind not in PEER_KINDS:
        raise PeerOptionError(f"{value!r} must be {PEER_FORMS}")
    if kind in ("stored", "mixed") and not path:
        raise PeerOptionError(f"{kind} needs a path: {kind}:PATH")
    if kind in ("online", "none") and sep:
        raise PeerOptionError(f"{kind} takes no path, got {value!r}")
    return {"peer.source": kind, **({"peer.path": path} if path else {})}


def peer_option(ctx, param, value) -> list:
    """click callback of ``--peer``: the value as ``key=value`` override strings (none when not given); a malformed
    value is one line naming the option (``PeerUsageError``)."""
    if value is None:
        return []
    try:
        return [f"{k}={json.dumps(v)}" for k, v in parse_peer(value).items()]  # JSON: YAML reads back the string
    except PeerOptionError as e:
        raise PeerUsageError(f"Invalid value for '--peer': {e}") from None
