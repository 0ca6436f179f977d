"""The ``graftzoo`` command line (click), a thin layer over graftzoo.api.

It answers the ``--help`` of every command, every config error and every refusal of a bad path, file or checkpoint
before torch or transformers are imported: the subcommands other than ``train``, ``algos`` and ``config`` live in
their own modules, light to import and imported when one is run (``LAZY``), each importing its heavy body once its
arguments are checked; ``train`` checks the config (graftzoo.contract.config) and its files (graftzoo.apps.checks)
before it imports the trainer; a path that does not exist is one line (``Main``); the anticipated errors are
recognised by name, from the modules already imported (``anticipated``).
"""
from __future__ import annotations

import importlib
import sys

import click
import yaml

from graftzoo.algos import BUILTIN
from graftzoo.apps.checks import check_fresh_start, check_train
from graftzoo.apps.options import PEER_FORMS, UsageLine, peer_option, plugin_option
from graftzoo.contract import output
from graftzoo.contract.config import ALIASES, algo_presets, as_dict, config_keys, load_config
from graftzoo.contract.errors import did_you_mean
from graftzoo.contract.registry import get_config
from graftzoo.training.run.no_effect import say_no_effect

# Anticipated errors: one line ``Error: ...`` naming the culprit, no traceback (``graftzoo --debug`` shows it).
# Usage and config errors exit 2, runtime errors (data, files, disk, a diverged run) exit 1, a signal 128 + signal.
# (module, class): a class counts once its module is imported (an error cannot come from a module never imported).
USAGE_ERRORS = (("graftzoo.contract.errors", "ConfigError"), ("graftzoo.contract.registry", "RegistryError"),
                ("graftzoo.apps.options", "PeerOptionError"), ("graftzoo.apps.grid.model", "GridError"),
                ("graftzoo.training.run.rundir", "RunDirUsageError"), ("graftzoo.training.selection", "SelectionError"),
                ("graftzoo.peers.store", "StoreMismatchError"), ("graftzoo.training.engines.engine", "EngineConfigError"))
RUNTIME_ERRORS = (("graftzoo.envs.datasets", "DatasetError"), ("graftzoo.peers.store", "StoreError"),
                  ("graftzoo.eval.artifacts", "ArtifactError"), ("graftzoo.peers.xt", "XTOverflowError"),
                  ("graftzoo.training.run.checkpoint", "CheckpointError"), ("graftzoo.training.run.rundir", "RunDirError"),
                  ("graftzoo.contract.errors", "NonFiniteError"), ("graftzoo.training.run.tracking", "MetricsFileError"),
                  ("graftzoo.training.engines.engine", "EngineError"), ("graftzoo.distributed.errors", "WorkerError"),
                  ("graftzoo.training.export", "ExportError"),
                  ("graftzoo.distributed.errors", "RayStartError"), ("graftzoo.distributed.errors", "StorageError"),
                  ("graftzoo.envs.task", "UnverifiedError"),
                  ("graftzoo.tiny.shipped", "ShippedWeightsError"),
                  ("builtins", "OSError"))


def anticipated(kinds) -> tuple:
    """The error classes of ``kinds`` whose modules are imported."""
    return tuple(getattr(sys.modules[m], name) for m, name in kinds if m in sys.modules)


def error_line(e: BaseException) -> str:
    """An anticipated error as one line naming its culprit (a file error names the file)."""
    if isinstance(e, OSError) and e.strerror:
        where = e.filename if e.filename is not None else ""
        return f"{where}: {e.strerror}" if where else e.strerror
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


class Group(click.Group):
    """A group whose unknown subcommand gets the closest names (``graftzoo evl``: did you mean 'eval'?), the
    commands not imported yet included (``Main.list_commands``)."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and self.get_command(ctx, name) is None:
            hint = did_you_mean(name, self.list_commands(ctx)) or "."
            raise click.UsageError(f"No such command {name!r}{hint}", ctx)
        return super().resolve_command(ctx, args)


class Main(Group):
    """The ``graftzoo`` group: turns every anticipated error of a subcommand into one line and an exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.BadParameter as e:  # a path that does not exist (click.Path): one line, no usage banner
            if isinstance(e, click.MissingParameter) or not isinstance(getattr(e.param, "type", None), click.Path):
                raise  # a missing input: click's message under the command's usage line
            raise UsageLine(e.format_message()) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt as e:  # the trainer's Interrupted is one: its line and 128 + signal (143, 130)
            code = getattr(e, "exit_code", None)
            click.echo(f"Error: {e}" if code else "Error: interrupted", err=True)
            ctx.exit(code or 130)
        except Exception as e:
            interrupted = anticipated([("graftzoo.training.run.preemption", "Interrupted")])
            if interrupted and isinstance(e, interrupted):
                click.echo(f"Error: {e}", err=True)
                ctx.exit(e.exit_code)
            usage = anticipated(USAGE_ERRORS)
            if ctx.params.get("debug") or not isinstance(e, usage + anticipated(RUNTIME_ERRORS)):
                raise
            click.echo(f"Error: {error_line(e)}", err=True)
            ctx.exit(2 if isinstance(e, usage) else 1)

    # the subcommands of LAZY: listed with their one-line help, imported when run
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY))

    def get_command(self, ctx, name):
        if name in LAZY and name not in self.commands:
            module, attr, _ = LAZY[name]
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        rows = [(name, LAZY[name][2] if name in LAZY and name not in self.commands
                 else self.commands[name].get_short_help_str(80)) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# name -> (module, command, one-line help): imported only when the command runs
LAZY = {
    "demo": ("graftzoo.apps.demo", "demo_cmd", "GRAFT vs GRPO on a heterogeneous tiny pair, on CPU, over seeds."),
    "env": ("graftzoo.apps.env", "env_group", "Inspect and check the registered environments."),
    "eval": ("graftzoo.apps.evaluate", "eval_cmd", "Evaluate a checkpoint on math benchmarks: avg@k, CI, pass@k."),
    "export": ("graftzoo.apps.export", "export_cmd", "Write a run's trained models as Hugging Face folders."),
    "grid": ("graftzoo.apps.grid", "grid_cmd", "Run an algorithm x pair x seed grid and its report."),
    "plan": ("graftzoo.apps.plan_command", "plan_cmd", "GPU memory per model, GPUs needed, placement on a node."),
    "report": ("graftzoo.apps.report", "report_cmd", "Tables, plots and the clip table of finished runs."),
}


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="GRAFTZOO_DEBUG",
              help="show the traceback of an error, and the libraries' warnings and progress bars (hidden otherwise)")
@click.pass_context
def main(ctx, debug):
    """graftzoo: RLVR on language models: a Gymnasium math environment, an algorithm zoo
    (GRPO family, CISPO, HACPO, SGT, HORA, ExTra, OM-GRPO, GRAFT) and peer exchange between models."""
    output.log_to_stderr()  # what a run does (its waits, a resume, a moved-aside run) on stderr, one line each
    if ctx.invoked_subcommand != "demo":  # the demo quiets the libraries itself (graftzoo demo --debug)
        ctx.with_resource(output.quiet_libraries(debug))
    if sys.stderr.isatty():  # the waits (warm-up, loading a model, evaluation) as rich rows; plain lines elsewhere
        ctx.with_resource(output.showing(terminal_display))


def terminal_display():
    """The rich display of the waits on a terminal (graftzoo.apps.progress), made at the first wait."""
    from graftzoo.apps.progress import ProgressPrinter  # rich: only once a wait is shown
    return ProgressPrinter()


def _split_keys(ctx, param, value) -> tuple:
    return tuple(k for v in value for k in str(v).replace(",", " ").split())


@main.command()
@plugin_option
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
    check_train(cfg, run_dir)  # a missing or broken data file, model folder or peer store: one line, before torch
    if no_resume and not overwrite:
        check_fresh_start(cfg, run_dir)
    say_no_effect(cfg)  # a key set where the rest of the config leaves it idle: one warning line each
    from graftzoo.api import summary_lines, train_run as run_train  # torch: after config check
    from graftzoo.apps.progress import ProgressPrinter  # rich: only when training
    # the training bar and the waits (warm-up, loading, evaluation); run.progress false: their start and end only
    progress = ProgressPrinter(f"{cfg.algo.name} on {cfg.pair.name}") if cfg.run.progress else None
    try:
        with output.showing(progress, detail=cfg.run.progress):
            out = run_train(cfg, run_dir=run_dir, resume=not no_resume, progress=progress, overwrite=overwrite,
                            allow_config_change=allow)
    finally:
        if progress is not None:
            progress.close()
    for line in summary_lines(out):  # final scores, where the run's files are, what to run next
        click.echo(line)


@main.group(cls=Group)
def algos():
    """Registered algorithms and plugins."""


@algos.command("list")
@plugin_option
def algos_list():
    """Show each algorithm's name, source and module, then each preset (configs/algos/NAME.yaml, packaged or the
    current directory's ./configs) with what it sets; failed plugins are reported by name."""
    from graftzoo.contract.registry import list_algos  # imports torch: late
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


@main.group("config", cls=Group)
def config_group():
    """The resolved run config and the documented key list."""


@config_group.command("show")
@plugin_option
@click.argument("pair", required=False, default="tiny")
@click.option("--algo", default="grpo", show_default=True, help="algorithm name or preset")
@click.option("--peer", default=None, callback=peer_option, help=PEER_FORMS)
@click.option("--config", "-c", "files", multiple=True, type=click.Path(exists=True), help="extra YAML config files")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="dotted override, e.g. optim.lr=1e-5")
def config_show(pair, algo, peer, files, overrides):
    """Print the resolved config of graftzoo train --pair PAIR --algo ALGO [-c FILE] [--set KEY=VALUE] as YAML."""
    cfg = load_config(pair=pair, algo=algo, files=files, overrides=list(overrides) + peer)
    click.echo(yaml.safe_dump(as_dict(cfg), sort_keys=False).rstrip())


@config_group.command("keys")
@click.option("--markdown", is_flag=True, help="a Markdown page (docs/config.md is this output)")
def config_keys_cmd(markdown):
    """Every config key with its type, bounds, default and meaning (run keys, then each algorithm's algo.*)."""
    click.echo(keys_text(markdown))


def keys_text(markdown: bool) -> str:
    """The key list of ``graftzoo config keys`` (docs/config.md with ``markdown``)."""
    # the report's baseline algorithm (GRPO) in full first, every other one where it differs from it
    rows = config_keys(sorted(BUILTIN, key=lambda name: (not get_config(name).report_baseline, name)))
    if not markdown:
        width = max(len(k) for k, *_ in rows)
        return "\n".join(f"{k:<{width}}  {t}; default {d!r}. {doc}" for k, t, d, doc in rows)
    out = ["# Config keys", "",
           "Generated by `graftzoo config keys --markdown` from the declaration in `graftzoo/contract/config.py` (run",
           "keys) and each algorithm's package (`algos/<name>/__init__.py`: its `algo.*` section); a test checks",
           "that this page is current.",
           "A config is YAML with dotted overrides (`--set optim.lr=1e-5`); an unknown key or a bad value is refused",
           "in one line naming the key. `graftzoo config show PAIR --algo ALGO` prints a resolved config.", ""]
    section = None
    for k, t, d, doc in rows:
        head = k.split(".")[0]
        if head != section:
            section = head
            out += ["", f"## `{head}`", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        out.append(f"| `{k}` | {cell(t)} | `{cell(repr(d))}` | {cell(doc)} |")
    out += ["", "## Other spellings", "", "Accepted for the key they stand for, in YAML files and `--set` alike:", ""]
    out += [f"- `{alias}`: `{target}`" for alias, target in ALIASES.items()]
    return "\n".join(out)


if __name__ == "__main__":
    main()
