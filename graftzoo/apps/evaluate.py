"""``graftzoo eval``: the command over ``graftzoo.training.eval_runner.evaluate_checkpoint``, imported (with torch)
once the target is checked: ``--help`` and a missing run or checkpoint answer at once (graftzoo.apps.checks). The run
is the RUN argument or ``--ckpt RUN`` (``graftzoo.apps.options.run_argument``)."""
from __future__ import annotations

import click

from graftzoo.apps.checks import eval_target
from graftzoo.apps.options import plugin_option, run_argument, the_run
from graftzoo.contract.config import SELECT_RULES


@click.command("eval")
@plugin_option
@run_argument
@click.option("--benchmarks", default=None,
              help="all | comma-separated names or paths | heldout  [default: eval.benchmarks, else heldout]")
@click.option("--k", type=click.IntRange(min=0), default=None, help="samples per problem [default: eval.k]")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="evaluation runs of k samples each (sd and CI are over runs when > 1)")
@click.option("--greedy/--no-greedy", default=None, help="also score one greedy response [default: eval.greedy]")
@click.option("--temperature", type=float, default=None, help="[default: eval.temperature]")
@click.option("--top-p", type=float, default=None, help="[default: eval.top_p, else rollout.top_p]")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
              help="[default: eval.max_new_tokens, else the model's rollout limit]")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="first N prompts of each benchmark")
@click.option("--seed", type=int, default=None, help="base sampling seed [default: run.seed]")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="folder for <model>.json [default: RUN/eval/cli/step_N-<benchmarks>-k<k>]")
@click.option("--select", type=click.Choice(SELECT_RULES), default=None,
              help="checkpoint selection for a run dir [default: eval.select]")
@click.option("--val-dataset", default=None, help="validation set for --select val_avg [default: eval.val_dataset]")
@click.option("--val-size", type=click.IntRange(min=1), default=None, help="validation prompts [default: 64]")
@click.option("--allow-test-selection", is_flag=True, default=None,
              help="allow val_avg selection on a test set (off: it raises)")
@click.option("--model", "models", multiple=True, help="evaluate only this model id (repeatable)")
def eval_cmd(path, ckpt, benchmarks, k, seeds, greedy, temperature, top_p, max_new_tokens, limit, seed, out, select,
             val_dataset, val_size, allow_test_selection, models):
    """Evaluate a checkpoint on math benchmarks: avg@k ± sd, 95% CI and pass@k per benchmark:
    graftzoo eval RUN [--benchmarks all] [--k 8].

    RUN is a run directory (its checkpoint chosen by eval.select) or one of its checkpoints
    (RUN/checkpoints/step_N); --ckpt RUN says the same."""
    path = the_run(path, ckpt)
    # an error is one line naming its culprit (graftzoo.apps.cli.Main): a usage or config error (an unknown benchmark
    # or model, a bad selection) exits 2, a missing or broken file 1
    eval_target(path, benchmarks)  # a run or checkpoint folder, a checkpoint, benchmark files: one line, before torch
    from graftzoo.training.eval_runner import evaluate_checkpoint  # torch, transformers: after the target check
    paths = evaluate_checkpoint(path, benchmarks, k, seeds=seeds, greedy=greedy, temperature=temperature,
                                top_p=top_p, max_new_tokens=max_new_tokens, limit=limit, seed=seed, out=out,
                                select=select, val_dataset=val_dataset, val_size=val_size,
                                allow_test_selection=allow_test_selection, models=models or None, log=click.echo)
    for p in paths:
        click.echo(f"wrote {p}")
