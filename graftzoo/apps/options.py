"""Option values shared by the command line (``graftzoo train --peer``) and grid files (a method's ``peer``)."""
from __future__ import annotations

import click

PEER_KINDS = ("online", "none", "stored", "mixed")
PEER_FORMS = "online | none | stored:PATH | mixed:PATH"


class PeerOptionError(ValueError):
    """A peer value is malformed; the message says which form is expected."""


def parse_peer(value: str) -> dict:
    """A peer value (``online`` | ``none`` | ``stored:PATH`` | ``mixed:PATH``) -> its dotted config
    overrides: ``{"peer.source": kind}``, plus ``{"peer.path": PATH}`` for stored and mixed peers."""
    kind, sep, path = str(value).partition(":")
    if kind not in PEER_KINDS:
        raise PeerOptionError(f"{value!r} must be {PEER_FORMS}")
    if kind in ("stored", "mixed") and not path:
        raise PeerOptionError(f"{kind} needs a path: {kind}:PATH")
    if kind in ("online", "none") and sep:
        raise PeerOptionError(f"{kind} takes no path, got {value!r}")
    return {"peer.source": kind, **({"peer.path": path} if path else {})}


def peer_option(ctx, param, value) -> list:
    """click callback of ``--peer``: the value as ``key=value`` override strings (none when not given)."""
    if value is None:
        return []
    try:
        return [f"{k}={v}" for k, v in parse_peer(value).items()]
    except PeerOptionError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None
