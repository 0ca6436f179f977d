"""``graftzoo env ...`` commands (the lead mounts :data:`env_group` on the main CLI)."""
from __future__ import annotations

import click
import gymnasium as gym
import yaml

from graftzoo.contract.errors import ConfigError
from graftzoo.envs.check import check_env_id


def parse_kw(pairs: tuple) -> dict:
    """``("dataset=math500", "size=64")`` -> ``{"dataset": "math500", "size": 64}``; values are
    read as YAML scalars (numbers, true/false, null), anything else stays a string."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint="--kw")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


@click.group("env")
def env_group() -> None:
    """Inspect and check the math environments."""


@env_group.command("check")
@click.argument("env_id")
@click.option("--kw", "kw", multiple=True, metavar="KEY=VALUE",
              help="keyword argument for gymnasium.make (repeatable), e.g. --kw dataset=aime24")
def check(env_id: str, kw: tuple) -> None:
    """Run Gymnasium's env checker plus gold self-verification and reset determinism on ENV_ID."""
    kwargs = parse_kw(kw)
    try:
        gym.spec(env_id)
    except gym.error.Error as e:  # an unknown id (gymnasium says which ones are close): a usage error, exit 2
        known = [k for k in gym.registry if k.startswith("graftzoo/")]
        raise ConfigError(f"env {env_id!r}: {' '.join(str(e).split())} (graftzoo's: {', '.join(known)})") from None
    report = check_env_id(env_id, **kwargs)
    click.echo(str(report))
    if not report.ok:
        raise SystemExit(1)
