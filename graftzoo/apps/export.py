"""``graftzoo export``: the command over ``graftzoo.training.export.export_run``, imported (with torch) once the
run is checked: ``--help`` and a missing run or checkpoint answer at once (graftzoo.apps.checks)."""
from __future__ import annotations

import click

from graftzoo.apps.checks import export_target
from graftzoo.apps.options import plugin_option, run_argument, the_run


@click.command("export")
@plugin_option
@run_argument
@click.option("--step", type=click.IntRange(min=0), default=None,
              help="checkpoint step [default: the newest intact checkpoint]")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="folder for one <model>/ folder per trained model [default: RUN/export/step_N]")
@click.option("--model", "models", multiple=True, help="export only this model id (repeatable)")
def export_cmd(path, ckpt, step, out, models):
    """Write a run's trained models as Hugging Face folders (weights, tokenizer, chat template) that transformers,
    vLLM and lm-evaluation-harness load as they are: graftzoo export RUN [--step N] [--out DIR].
    RUN is a run directory or one of its checkpoints (RUN/checkpoints/step_N); --ckpt RUN says the same."""
    path = the_run(path, ckpt)
    # an error is one line naming its culprit (graftzoo.apps.cli.Main): an unknown --model or --step exits 2, a
    # missing or broken checkpoint, or a model that cannot be exported, 1
    export_target(path, step)  # a run or checkpoint folder, with a checkpoint (of --step): one line before torch
    from graftzoo.training.export import export_run  # torch, transformers: after the run's check
    export_run(path, step=step, out=out, models=models or None, log_line=click.echo)
