"""The ``graftzoo`` command line (click)."""
from __future__ import annotations

import logging
import sys

import click

from graftzoo.api import summary_lines
from graftzoo.apps.demo import demo_cmd
from graftzoo.apps.export import export_cmd
from graftzoo.apps.grid import grid_cmd
from graftzoo.apps.grid.model import GridError
from graftzoo.apps.options import PEER_FORMS, PeerOptionError, peer_option
from graftzoo.apps.plan import plan_cmd
from graftzoo.apps.progress import ProgressPrinter as _ProgressPrinter
from graftzoo.training.checkpoint import CheckpointError
from graftzoo.contract.config import ConfigError, algo_presets, load_config
from graftzoo.training.engine import EngineError
from graftzoo.training.policy import NonFiniteError
from graftzoo.training.preemption import Interrupted
from graftzoo.contract.registry import RegistryError, list_algos
from graftzoo.training.rundir import RunDirError, RunDirUsageError
from graftzoo.training.tracking import MetricsFileError
from graftzoo.api import train_run as run_train
from graftzoo.peers.xt import XTOverflowError
from graftzoo.distributed.errors import RayStartError, WorkerError
from graftzoo.apps.env import env_group
from graftzoo.envs.datasets import DatasetError
from graftzoo.eval.artifacts import ArtifactError
from graftzoo.apps.report import report_cmd
from graftzoo.apps.evaluate import eval_cmd
from graftzoo.training.selection import SelectionError
from graftzoo.peers.store import StoreError


# Anticipated errors: one line ``Error: ...`` naming the culprit, no traceback (``graftzoo --debug`` shows it).
# Usage and config errors exit 2, runtime errors (data, files, disk, a diverged run) exit 1, a signal 128 + signal.
USAGE_ERRORS = (ConfigError, RegistryError, PeerOptionError, GridError, RunDirUsageError, SelectionError)
RUNTIME_ERRORS = (DatasetError, StoreError, ArtifactError, XTOverflowError, CheckpointError, RunDirError,
                  NonFiniteError, MetricsFileError, EngineError, WorkerError, RayStartError, OSError)


def error_line(e: BaseException) -> str:
    """An anticipated error as one line naming its culprit (a file error names the file)."""
    if isinstance(e, OSError) and e.strerror:
        where = e.filename if e.filename is not None else ""
        return f"{where}: {e.strerror}" if where else e.strerror
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


class Main(click.Group):
    """The ``graftzoo`` group: turns every anticipated error of a subcommand into one line and an exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Interrupted as e:
            click.echo(f"Error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("Error: interrupted", err=True)
            ctx.exit(130)
        except USAGE_ERRORS + RUNTIME_ERRORS as e:
            if ctx.params.get("debug"):
                raise
            click.echo(f"Error: {error_line(e)}", err=True)
            ctx.exit(2 if isinstance(e, USAGE_ERRORS) else 1)


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="GRAFTZOO_DEBUG", help="show the traceback of an error")
def main(debug):
    """graftzoo: RLVR on language models: a Gymnasium math environment, an algorithm zoo
    (GRPO family, HACPO, SGT, HORA, ExTra, OM-GRPO, GRAFT) and peer exchange between models."""
    logger = logging.getLogger("graftzoo")
    if not logger.handlers:  # what a run does (a resume, a moved-aside run) on stderr, one line each
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _split_keys(ctx, param, value) -> tuple:
    return tuple(k for v in value for k in str(v).replace(",", " ").split())


@main.command()
@click.option("--algo", required=True, help="algorithm name or preset (configs/algos/NAME.yaml)")
@click.option("--pair", default="tiny", show_default=True, help="model pair (configs/pairs/NAME.yaml)")
@click.option("--peer", default=None, callback=peer_option, help=PEER_FORMS)
@click.option("--config", "-c", "files", multiple=True, type=click.Path(exists=True), help="extra YAML config files")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="dotted override, e.g. optim.lr=1e-5")
@click.option("--run-dir", default=None, help="run directory (default: run.out_dir/run.name)")
@click.option("--no-resume", is_flag=True,
              help="start over instead of resuming; refused where the run directory holds a run, unless --overwrite")
@click.option("--overwrite", is_flag=True,
              help="start over, moving an existing run aside to RUN.replaced-<time> (never deleted)")
@click.option("--allow-config-change", "allow", multiple=True, callback=_split_keys, metavar="KEY",
              help="resume although KEY changed (repeatable; patterns like optim.* allowed)")
@click.option("--no-track", is_flag=True, help="turn wandb off (metrics.jsonl is still written)")
@click.option("--backend", type=click.Choice(["inprocess", "ray"]), default=None,
              help="where the models run (run.backend): this process, or each model in its own Ray worker group "
                   "(pair.models[].num_workers ranks, FSDP2-sharded; ray.* settings)")
def train(algo, pair, peer, files, overrides, run_dir, no_resume, overwrite, allow, no_track, backend):
    """Train one model or co-train a pair: graftzoo train --algo grpo --pair tiny [--set key=value ...].

    Rerunning the same command resumes from the last intact checkpoint. SIGTERM / Ctrl-C finish the current step,
    save a checkpoint and exit 143 / 130; a second signal stops at once."""
    overrides = list(overrides) + peer  # --peer, as peer.* overrides (peer_option)
    if no_track:
        overrides.append("run.track=false")
    if backend:
        overrides.append(f"run.backend={backend}")
    cfg = load_config(pair=pair, algo=algo, files=files, overrides=overrides)  # every config check, once
    progress = _ProgressPrinter(f"{cfg.algo.name} on {cfg.pair.name}") if cfg.run.progress else None
    try:
        out = run_train(cfg, run_dir=run_dir, resume=not no_resume, progress=progress, overwrite=overwrite,
                        allow_config_change=allow)
    finally:
        if progress is not None:
            progress.close()
    for line in summary_lines(out):  # final scores, where the run's files are, what to run next
        click.echo(line)


@main.group()
def algos():
    """Registered algorithms and plugins."""


@algos.command("list")
def algos_list():
    """Show each algorithm's name, source and module, then each preset (configs/algos/NAME.yaml, packaged or the
    current directory's ./configs) with what it sets; failed plugins are reported by name."""
    entries, failed = list_algos()
    rows = [(e.name, e.source, e.module) for e in entries]
    rows += [(name, source, " ".join(sets)) for name, source, sets in algo_presets()]
    width = max(len(r[0]) for r in rows + [("NAME",)])
    swidth = max(len(r[1]) for r in rows + [("", "FAILED")])
    click.echo(f"{'NAME':<{width}}  {'SOURCE':<{swidth}}  MODULE")
    for name, source, what in rows:
        click.echo(f"{name:<{width}}  {source:<{swidth}}  {what}")
    for name, why in failed.items():
        click.echo(f"{name:<{width}}  {'FAILED':<{swidth}}  {why.splitlines()[0]}", err=True)
    if failed:
        sys.exit(1)


for _name, _cmd in (("env", env_group), ("eval", eval_cmd), ("report", report_cmd), ("grid", grid_cmd),
                   ("demo", demo_cmd), ("plan", plan_cmd), ("export", export_cmd)):
    main.add_command(_cmd, _name)

if __name__ == "__main__":
    main()
