"""``graftzoo plan CONFIG``: the command, its options and the checks of its config and files, before the memory
model (graftzoo.training.planner.memory, which imports torch and transformers) and the printing (graftzoo.apps.plan) are
imported: ``--help``, a missing pair file, model folder or calibration file, or a broken one, answer at once."""
from __future__ import annotations

import json
from pathlib import Path

import click

from graftzoo.apps.options import UsageLine, plugin_option
from graftzoo.contract.config import RunConfig, load_config, looks_like_folder, trained_ids
from graftzoo.contract.errors import ConfigError

CHIP_NAMES = ("a100", "h100", "h200")  # graftzoo.training.planner.memory.CHIPS (a test checks they agree)


def read_calibration(path: str | None):
    """The data of ``--calibration FILE`` (None without one); a file that is not JSON is one usage line naming it.
    What it holds is checked by graftzoo.training.planner.memory.calibration_of."""
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageLine(f"Invalid value for '--calibration': {path}: not JSON ({e})") from None


def check_model_configs(cfg: RunConfig) -> None:
    """Every trained ``kind: hf`` model that plan reads from a local folder (no ``arch`` given) has its
    ``config.json`` there (graftzoo.training.planner.memory.architecture reads it; a hub id is looked up there)."""
    train = trained_ids(cfg)
    for spec in cfg.pair.models:
        src = str(spec.path or spec.id)
        if (spec.kind == "hf" and spec.id in train and not spec.arch and (spec.path or looks_like_folder(src))
                and not (Path(src).expanduser() / "config.json").is_file()):
            raise ConfigError(f"model {spec.id!r}: its config is not available here (no {src}/config.json); give "
                              f"its config.json fields as pair.models[].arch to plan without it")


@click.command("plan")
@plugin_option
@click.argument("config")
@click.option("--algo", default="grpo", show_default=True,
              help="algorithm (its KL coefficient decides whether a reference model is counted)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="dotted override")
@click.option("--gpu-gb", "--gpu-mem-gb", "gpu_gb", type=float, default=None,
              help="memory of one GPU, GiB [default: the chip's: 80 for h100, 141 for h200]")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="place the models on a node of this many GPUs: layout, ranks, engines, per-phase peaks")
@click.option("--chip", type=click.Choice(CHIP_NAMES), default=None,
              help="the GPU whose FLOP/s and memory bandwidth the step-time estimate uses [default: the chip sold "
                   "with --gpu-gb's memory (141: h200), else h100]")
@click.option("--calibration", "calibration_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="JSON with update_hfu, hf_decode_bw_fraction, vllm_decode_bw_fraction (and optionally "
                   "measured_bf16_flops, chip) measured on a GPU, or the device check's report (defaults: assumed)")
@click.option("--json", "as_json", is_flag=True, help="print the same as JSON, with the step-time estimate")
@click.pass_context
def plan_cmd(ctx, config, algo, overrides, gpu_gb, gpus, chip, calibration_file, as_json):
    """GPU memory per model and phase, GPUs needed, layout: graftzoo plan configs/pairs/pair1.yaml [--gpus 1]."""
    cfg = load_config(pair=config, algo=algo, overrides=list(overrides) + ["run.track=false"])
    check_model_configs(cfg)
    calibration = read_calibration(calibration_file)
    from graftzoo.apps.plan import run_plan  # torch, transformers: after the config and file checks
    run_plan(ctx, cfg, gpu_gb, gpus, chip, calibration, as_json)
