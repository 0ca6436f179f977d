"""The ``graftzoo`` command line (click)."""
from __future__ import annotations

import sys

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from graftzoo.apps.demo import demo_cmd
from graftzoo.apps.grid import grid_cmd
from graftzoo.apps.options import PEER_FORMS, peer_option
from graftzoo.core.config import ConfigError, load_config
from graftzoo.core.registry import RegistryError, list_algos
from graftzoo.core.trainer import train as run_train
from graftzoo.core.xt import XTOverflowError
from graftzoo.envs.cli import env_group
from graftzoo.eval.cli import report_cmd
from graftzoo.eval.runner import eval_cmd
from graftzoo.peers.store import StoreError


class ConfigUsageError(click.ClickException):
    """A config the run cannot start with: one line ``Error: ...`` naming the key, exit code 2 (a usage error)."""

    exit_code = 2

    def __init__(self, error: Exception):
        super().__init__("; ".join(line.strip() for line in str(error).splitlines() if line.strip()))


def _progress_printer(label: str):
    """A rich progress bar: step, reward, all-fail fraction and tokens/s per model."""
    state = {}

    def update(step, total, mets):
        if "bar" not in state:
            state["bar"] = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), TextColumn("{task.fields[info]}"), transient=False)
            state["bar"].start()
            state["task"] = state["bar"].add_task(label, total=total, info="")
        info = "  ".join(f"{m}: r={v.get('reward/acc') or 0:.2f} dead={v.get('groups/all_fail') or 0:.2f} "
                         f"tok/s={v.get('perf/tokens_per_s') or 0:.0f}" for m, v in mets.items())
        state["bar"].update(state["task"], completed=step + 1, info=info)
        if step + 1 >= total:
            state["bar"].stop()

    return update


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """graftzoo: RLVR on language models: a Gymnasium math environment, an algorithm zoo
    (GRPO family, HACPO, SGT, HORA, ExTra, OM-GRPO, GRAFT) and peer exchange between models."""


@main.command()
@click.option("--algo", required=True, help="algorithm name or preset (configs/algos/NAME.yaml)")
@click.option("--pair", default="tiny", show_default=True, help="model pair (configs/pairs/NAME.yaml)")
@click.option("--peer", default=None, callback=peer_option, help=PEER_FORMS)
@click.option("--config", "-c", "files", multiple=True, type=click.Path(exists=True), help="extra YAML config files")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="dotted override, e.g. optim.lr=1e-5")
@click.option("--run-dir", default=None, help="run directory (default: run.out_dir/run.name)")
@click.option("--no-resume", is_flag=True, help="start over even if the run directory has checkpoints")
@click.option("--no-track", is_flag=True, help="turn wandb off (metrics.jsonl is still written)")
def train(algo, pair, peer, files, overrides, run_dir, no_resume, no_track):
    """Train one model or co-train a pair: graftzoo train --algo grpo --pair tiny [--set key=value ...]."""
    overrides = list(overrides) + peer  # --peer, as peer.* overrides (peer_option)
    if no_track:
        overrides.append("run.track=false")
    try:  # every config check happens here, once, before any model is built
        cfg = load_config(pair=pair, algo=algo, files=files, overrides=overrides)
    except (ConfigError, RegistryError) as e:
        raise ConfigUsageError(e)
    progress = _progress_printer(f"{cfg['algo']['name']} on {cfg['pair']['name']}") if cfg["run"]["progress"] else None
    try:
        out = run_train(cfg, run_dir=run_dir, resume=not no_resume, progress=progress)
    except (ConfigError, RegistryError, StoreError, XTOverflowError) as e:
        raise click.ClickException(str(e))
    click.echo(f"run directory: {out}")


@main.group()
def algos():
    """Registered algorithms and plugins."""


@algos.command("list")
def algos_list():
    """Show each algorithm's name, source and module; failed plugins are reported by name."""
    entries, failed = list_algos()
    width = max(len(e.name) for e in entries)
    for e in entries:
        click.echo(f"{e.name:<{width}}  {e.source:<20}  {e.module}")
    for name, why in failed.items():
        click.echo(f"{name:<{width}}  FAILED              {why.splitlines()[0]}", err=True)
    if failed:
        sys.exit(1)


for _name, _cmd in (("env", env_group), ("eval", eval_cmd), ("report", report_cmd), ("grid", grid_cmd),
                   ("demo", demo_cmd)):
    main.add_command(_cmd, _name)

if __name__ == "__main__":
    main()
