"""Option values shared by the command line (``graftzoo train --peer``) and grid files (a method's ``peer``), the
``--plugin`` option of every command that resolves an algorithm, and the run argument of every command that reads
a run (``run_argument``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from graftzoo.contract.errors import did_you_mean
from graftzoo.contract.peer_sources import peer_source_kind, peer_source_names

PEER_FORMS = "online | none | stored:PATH | mixed:PATH (or a plugin's source: NAME or NAME:PATH)"


class PeerOptionError(ValueError):
    """A peer value is malformed; the message says which form is expected."""


class UsageLine(click.ClickException):
    """A usage error in one line ``Error: ...``, exit code 2, without click's usage banner: a malformed ``--peer``, a
    path that does not exist (``graftzoo.apps.cli.Main``)."""

    exit_code = 2


class PeerUsageError(UsageLine):
    """A malformed ``--peer`` on the command line: one line ``Error: Invalid value for '--peer': ...``."""


def parse_peer(value: str) -> dict:
    """A peer value (``online`` | ``none`` | ``stored:PATH`` | ``mixed:PATH``, or a registered source's name, with
    ``:PATH`` where it reads an earlier run: graftzoo.contract.peer_sources) -> its dotted config overrides:
    ``{"peer.source": kind}``, plus ``{"peer.path": PATH}``."""
    name, sep, path = str(value).partition(":")
    name, path = name.strip(), path.strip()
    known = peer_source_names()
    if name not in known:
        raise PeerOptionError(f"{value!r} must be {PEER_FORMS}{did_you_mean(name, known)}; registered sources: "
                              f"{', '.join(known)}")
    kind = peer_source_kind(name)
    if kind is not None and kind.reads_run and not path:
        raise PeerOptionError(f"{name} needs a path: {name}:PATH")
    if (kind is None or not kind.reads_run) and sep:
        raise PeerOptionError(f"{name} takes no path, got {value!r}")
    return {"peer.source": name, **({"peer.path": path} if path else {})}


def peer_option(ctx, param, value) -> list:
    """click callback of ``--peer``: the value as ``key=value`` override strings (none when not given); a malformed
    value is one line naming the option (``PeerUsageError``)."""
    if value is None:
        return []
    try:
        return [f"{k}={json.dumps(v)}" for k, v in parse_peer(value).items()]  # JSON: YAML reads back the string
    except PeerOptionError as e:
        raise PeerUsageError(f"Invalid value for '--peer': {e}") from None


def _load_plugins(ctx, param, value):
    if value:
        from graftzoo.contract.registry import add_plugins  # light; the plugin itself imports what it needs
        add_plugins(list(value))


# ``@plugin_option`` on a command: ``--plugin my_algo.py`` (or a module name; repeatable) imports it before the
# command runs and adds it to GRAFTZOO_PLUGINS for the command's child processes; one that fails to import is one
# line ``Error: plugin 'my_algo.py' failed to import: ...`` (a usage error, exit 2).
plugin_option = click.option(
    "--plugin", "plugins", multiple=True, metavar="MODULE|FILE.py", expose_value=False, callback=_load_plugins,
    is_eager=True, help="load algorithms or peer sources from a module or a .py file (repeatable; also "
                        "GRAFTZOO_PLUGINS=a,b)")


RUN_FORMS = "a run directory, or one of its checkpoints (RUN/checkpoints/step_N)"


def run_argument(command):
    """The run a command reads, given either way: ``graftzoo eval RUN`` or ``graftzoo eval --ckpt RUN`` (the same
    folder given both ways is one). The command receives it as ``path`` and ``ckpt``; ``the_run(path, ckpt)`` is
    the one folder. A path that does not exist is one line (``graftzoo.apps.cli.Main``)."""
    folder = click.Path(exists=True, file_okay=False)
    command = click.option("--ckpt", "ckpt", type=folder, default=None, metavar="RUN",
                           help=f"the same as the RUN argument: {RUN_FORMS}")(command)
    return click.argument("path", metavar="RUN", required=False, type=folder)(command)


def the_run(path: Optional[str], ckpt: Optional[str]) -> str:
    """The one run folder of ``run_argument``'s two forms; neither, or two different ones, is a usage error that
    shows the command's usage line."""
    ctx = click.get_current_context(silent=True)
    if path and ckpt and Path(path).resolve() != Path(ckpt).resolve():
        raise click.UsageError(f"two runs given, {path} and --ckpt {ckpt}: give one", ctx)
    if not (path or ckpt):
        raise click.UsageError(f"Missing argument 'RUN': {RUN_FORMS} (or --ckpt RUN).", ctx)
    return path or ckpt
