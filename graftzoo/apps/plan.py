"""``graftzoo plan CONFIG``: the GPU memory each model of a run needs, phase by phase (generate, logprob, update,
sync), how many GPUs it takes and where the models go on a node, and how long a full-size step should take — so a
run can be sized before a node is booked. The memory and step-time model is graftzoo.training.planner.memory (its
docstrings give every formula; docs/scaling.md#plan-a-run-graftzoo-plan); this module prints it, imported (with
torch and transformers) by the command once its config and files are checked (graftzoo.apps.plan_command).
"""
from __future__ import annotations

import json

import click

from graftzoo.apps.options import UsageLine
from graftzoo.training.planner.memory import (GIB, MARGIN, PART_NAMES, PCIE_BYTES_PER_S, PHASES, USABLE,
                                      calibration_of, gpu_layout, gpu_of, margin_bytes, plan)

LAYOUT_NAMES = {"separate": "separate groups", "colocated": "colocated, the models sharing each GPU",
                "resident": "resident, every model's training state on the GPU (run.layout resident)",
                "offload": "offload, one model's training state on the GPU at a time (run.layout offload)"}


def rank_span(ranks: list) -> str:
    """``[0, 1, 2, 3]`` -> ``"0-3"``; ``[5]`` -> ``"5"``."""
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def size_text(params: int) -> str:
    """``3.075 B`` / ``0.42 M`` parameters."""
    return f"{params / 1e9:.3f} B" if params >= 1e9 else f"{params / 1e6:.2f} M"


def parts_text(parts: dict) -> str:
    """``weights 11.46 + grads 11.46 + ...`` of a parts dict in GiB, its non-zero parts."""
    return " + ".join(f"{PART_NAMES[k]} {v:.2f}" for k, v in parts.items() if v > 0)


def phases_text(phases: dict) -> str:
    """``generate 60.1 | logprob 62.0 | update 71.9 | sync 60.3 GiB`` of ``{phase: GiB}``."""
    return " | ".join(f"{p} {phases[p]:.2f}" for p in PHASES if p in phases) + " GiB"


def engine_text(g: dict, prompts: int) -> str:
    """What runs the rollouts of a group entry."""
    per = "-".join(str(x) for x in g["prompts_per_rank"])
    if g["engine_per_rank"] is None:
        return "no engine: its rollout workers apart decode (below)"
    if g["num_workers"] == 1:
        return (f"its {g['engine_per_rank']} engine generating the step's {prompts} prompts"
                + (", asleep during the model's update" if g["engine_sleeps"] else "")
                + (", and the next steps' during the model's update" if g["engine_generates_in_update"] else ""))
    if g["engine_per_rank"] != "vllm":
        return (f"the {g['engine_per_rank']} engine on every rank (the training weights), all {prompts} prompts "
                f"in lockstep")
    return (f"a vllm engine on every rank generating its {per} of the step's {prompts} prompts, "
            + ("asleep during its model's update" if g["engine_sleeps"] else
               "awake during the update (rollout.vllm.sleep_level 0)"))


def ahead_line(k: int, host_gb: float, overlap: bool, models: int = 1) -> str:
    """The rollouts collected ahead of their steps (``rollout.max_staleness`` k >= 1) of ``models`` models: the host
    memory of their k batches each, and whether the engines generate them while the models update, awake
    (graftzoo.training.planner.memory.generates_in_update; docs/scaling.md#asynchronous-rollouts)."""
    each = " of each model" if models > 1 else ""
    engines = ("the engines generate them during the updates" if models > 1
               else "its engine generates them during the update")
    when = (f"{engines}, awake: weights, KV cache and workspace counted in the update phase" if overlap
            else "generated just before each update, not during it")
    return (f"  rollouts ahead (rollout.max_staleness {k}): {k} batch{'es' if k > 1 else ''}{each} in host memory, "
            f"{host_gb:.2f} GiB at full length; {when}")


def gpu_phase_lines(row: dict, usable: float) -> list:
    """One GPU's phases, each with its parts, and its step peak."""
    out = [f"  GPU {row['rank']} by phase ({', '.join(row['models'])}):"]
    for p in PHASES:
        ph = row["phases"][p]
        during = "all models at once" if ph["during"] == "all" else f"during {ph['during']}'s"
        out.append(f"    {p:<8} {ph['peak_gb']:7.2f} GiB ({during}): {parts_text(ph['parts'])}")
    out.append(f"    step peak {row['peak_gb']:.2f} GiB ({row['peak_phase']}) of {usable:.1f}")
    return out


def margin_lines(peak_gb: float, usable_gb: float, gpu_gb: float, what: str, fixes: str) -> list:
    """A warning where a peak that fits leaves less than the margin free (``memory.MARGIN``: the allocator's
    fragmentation beyond ``USABLE``), naming ``fixes``; none otherwise."""
    margin, left = margin_bytes(gpu_gb) / GIB, usable_gb - peak_gb
    if left < 0 or left >= margin:
        return []
    return [f"  warning: {what} peak {peak_gb:.2f} GiB leaves {left:.2f} GiB of the {usable_gb:.1f} usable free, less "
            f"than the {margin:.1f} GiB margin ({MARGIN:.0%} of the GPU, for the allocator's fragmentation): it may "
            f"run out of memory; to leave more: {fixes}"]


def settings_text(settings: dict) -> str:
    """``--set key=value ...`` of a layout's settings (the per-model num_workers aside: they go in the pair file)."""
    return " ".join(f"--set {k}={v:g}" if isinstance(v, float) else f"--set {k}={v}" for k, v in settings.items()
                    if not k.startswith("pair.models"))


def one_gpu_lines(p: dict) -> list:
    """The one-GPU layouts' answer (``gpu_layout`` with ``gpus`` 1 and two or more models) as printed lines."""
    usable = p["usable_gb"]
    out = [f"layout of {p['pair']} on 1 x {p['gpu_gb']:g} GiB GPU ({usable:.1f} GiB usable, {USABLE:.0%}): "
           f"{LAYOUT_NAMES[p['layout']]}", f"  why: {p['why']}"]
    awake = " (the engines never sleep: they generate the next batches during the updates)" \
        if p["engines_generate_in_update"] else ""
    if p["kv_sized_by_plan"]:
        out.append(f"  KV cache: {p['kv_cache_gb']:.1f} GiB per engine, sized by the plan (what every phase leaves; "
                   f"rollout.vllm.kv_cache_gb null would take gpu_memory_utilization's {p['kv_from_share_gb']:.1f} "
                   f"GiB in all); sleep level {p['sleep_level']}"
                   + ("" if p["sleep_level_from_config"] else " (the config's is 0: the engines stay awake then)")
                   + awake)
    elif p["kv_min_gb"]:
        out.append(f"  KV cache: {p['kv_cache_gb']:.1f} GiB per engine (rollout.vllm.kv_cache_gb); sleep level "
                   f"{p['sleep_level']}" + awake)
    if p["phase_1_together"]:
        out.append("  phase 1 (generate, logprob) of the models at once, each engine in its own process")
    for g in p["placement"]:
        out.append(f"  {g['model']}: {size_text(g['params'])} parameters, {g['precision']} ({g['state_dtype']} "
                   f"state); {engine_text(g, p['prompts'])}")
        out.append(f"    the GPU during its phases: {phases_text(g['phases_gb'])}")
    if p["max_staleness"]:
        out.append(ahead_line(p["max_staleness"], p["ahead_host_gb"], p["engines_generate_in_update"],
                              len(p["placement"])))
    out += gpu_phase_lines(p["per_gpu"][0], usable)
    out += margin_lines(p["per_gpu"][0]["peak_gb"], usable, p["gpu_gb"], "the step",
                        "a smaller rollout.vllm.kv_cache_gb or optim.max_tokens_per_micro"
                        + (", or run.layout offload" if p["layout"] == "resident" else ""))
    if p["layout"] == "offload" or p["moved_gb_per_step"]:
        out.append(f"  moved per step: {p['moved_gb_per_step']:.1f} GiB over PCIe (~{p['transfer_s']:.0f} s at "
                   f"{PCIE_BYTES_PER_S / 1e9:g} GB/s); host memory held: {p['host_gb']:.1f} GiB")
    if p["fits"]:
        out.append("  run it with: " + settings_text(p["settings"]))
    return out


def placement_lines(p: dict) -> list:
    """``gpu_layout``'s answer on N GPUs as the lines ``graftzoo plan --gpus`` prints."""
    if p["layout"] in ("resident", "offload"):
        return one_gpu_lines(p)
    usable = p["usable_gb"]
    out = [f"placement of {p['pair']} on {p['gpus']} x {p['gpu_gb']:g} GiB GPUs ({usable:.1f} GiB usable each, "
           f"{USABLE:.0%}): {LAYOUT_NAMES[p['layout']]}", f"  why: {p['why']}"]
    for g in p["placement"]:
        q, k = g["parts"], g["num_workers"]
        shard = f"FSDP2 over {k} ranks" if k > 1 else "1 rank, unsharded"
        out.append(f"  rank{'s' if k > 1 else ''} {rank_span(g['ranks'])}: {g['model']}, {shard}; "
                   f"{engine_text(g, p['prompts'])}")
        out.append(f"    per GPU by phase: {phases_text(g['phases_gb'])}")
        out.append(f"    peak in {g['peak_phase']}: {parts_text(q)} ({g['state_dtype']} state, 1/{k} each) = "
                   f"{g['per_gpu_peak_gb']:.2f} GiB peak of {usable:.1f}")
    out += rollout_lines(p.get("rollout_workers", []), usable, p["max_staleness"])
    if p["max_staleness"] and not p.get("rollout_workers"):
        out.append(ahead_line(p["max_staleness"], p["ahead_host_gb"],
                              any(g["engine_generates_in_update"] for g in p["placement"]), len(p["placement"])))
    if p["layout"] == "colocated" and p["per_gpu"]:
        top = max(p["per_gpu"], key=lambda r: r["peak_gb"])
        out.append(f"  per GPU, its models together: up to {top['peak_gb']:.2f} GiB of {usable:.1f} "
                   f"({top['peak_phase']})")
    if p["per_gpu"]:
        top = max(p["per_gpu"], key=lambda r: r["peak_gb"])
        out += margin_lines(top["peak_gb"], usable, p["gpu_gb"], f"GPU {top['rank']}'s",
                            "a smaller optim.max_tokens_per_micro or rollout.vllm.gpu_memory_utilization, or more "
                            "GPUs")
    if p["fits"]:
        workers = ", ".join(f"{g['num_workers']} for {g['model']}" for g in p["placement"])
        out.append("  run it with: " + settings_text(p["settings"]) + f"; num_workers in the pair file's models: "
                   f"{workers}")
    return out


def rollout_lines(rows: list, usable: float, k: int) -> list:
    """The rollout workers apart (``ray.rollout_workers``) of ``gpu_layout``'s answer: per model its GPUs, engine
    and peak, then what they cost (GPUs, the weights sent per step) and whether they decode during the update."""
    out = []
    for r in rows:
        per = "-".join(str(x) for x in r["prompts_per_worker"])
        out.append(f"  rank{'s' if len(r['ranks']) > 1 else ''} {rank_span(r['ranks'])}: rollout worker"
                   f"{'s' if len(r['ranks']) > 1 else ''} of {r['model']}, a {r['engine']} engine each generating "
                   f"{per} of the step's prompts")
        out.append(f"    peak in generate: {parts_text(r['parts'])} = {r['peak_gb']:.2f} GiB of {usable:.1f}")
    if rows:
        gpus = sum(len(r["ranks"]) for r in rows)
        sent = " + ".join(f"{r['sync_gb'] * len(r['ranks']):.2f} GiB ({r['model']})" for r in rows)
        out.append(f"  rollout workers apart: {gpus} GPU(s) that do not train; each holds a copy of its model's "
                   f"weights beside its engine's; per step the training ranks send the weights through host memory "
                   f"(a gloo broadcast): {sent}")
        out.append(f"  rollouts ahead (rollout.max_staleness {k}): the next batch decodes on the rollout workers "
                   f"during the update" if k else "  rollout.max_staleness 0: the rollout workers wait during the "
                   "update (set it to 1 to decode the next batch meanwhile)")
    return out


def step_line(p: dict) -> str:
    """The step-time estimate of a layout (and of the other one-GPU layout) as one line."""
    st = p["step_time"]
    each = "; ".join(f"{m} " + ", ".join(f"{ph} {t[ph]:.0f}" for ph in PHASES) for m, t in st["per_model_s"].items())
    text = (f"  step time on {p['chip']} (estimate, every rollout at full length): ~{st['step_s']:.0f} s ({each} s"
            + (f"; transfers {st['transfer_s']:.0f} s" if st["transfer_s"] else "") + ")")
    alt = p.get("without_rollout_workers")
    if alt is not None:
        text += ("; with the next batch decoding during the update" if st.get("overlap") else "")
        text += (f"; without rollout workers (the training ranks decode, {alt['layout']} on all {p['gpus']} GPUs): "
                 f"~{alt['step_s']:.0f} s" if alt["fits"] and alt["step_s"] is not None else
                 "; without rollout workers it does not fit")
    for lay, alt in p.get("alternatives", {}).items():
        if alt["fits"]:
            faster = alt["step_time"]["step_s"] < st["step_s"]
            text += (f"; {lay}: ~{alt['step_time']['step_s']:.0f} s with {alt['kv_cache_gb']:.1f} GiB of KV cache per "
                     f"engine" + (f" (more sequences decoded at once: --set run.layout={lay} to prefer it)"
                                  if faster else ""))
    return text


def model_lines(rows: list, gpu_gb: float) -> list:
    """``plan``'s rows (each model on GPUs of its own) as printed lines."""
    out = []
    for p in rows:
        ckpt = "on" if p["checkpointing"] else "off"
        out.append(f"{p['model']}: {size_text(p['params'])} parameters, {p['precision']}, micro-batch "
                   f"{p['micro_tokens']:,} tokens")
        out.append(f"  weights + grads + AdamW (1 GPU) {p['state_gib_1gpu']:8.2f} GiB   (sharded over G GPUs by "
                   f"FSDP2)" + ("   + KL reference" if p["ref"] else ""))
        out.append(f"  update micro-batch, ckpt {ckpt:<3}  {p['activations_gib']:8.2f} GiB   (activations, logits and "
                   f"their gradient; with checkpointing {'off' if p['checkpointing'] else 'on'}: "
                   f"{p['activations_other_gib']:.2f} GiB); logprob pass {p['logprob_gib']:.2f} GiB")
        if p["engine_weights_gib"]:
            out.append(f"  vLLM engine weights + KV cache  {p['engine_weights_gib']:8.2f} + {p['kv_cache_gib']:.2f} GiB"
                       + ("   (asleep during the update)" if p["engine_sleeps"] else "")
                       + f"   (every sequence of a step at once would need {p['kv_all_gib']:.1f} GiB of KV cache)")
        if p["max_staleness"]:
            out.append(ahead_line(p["max_staleness"], p["ahead_host_gib"], p["engine_generates_in_update"]))
        if p["gpus"]:
            out.append(f"  needs {p['gpus']} x {gpu_gb:g} GiB GPU(s), by phase: {phases_text(p['phases_gib'])}; "
                       f"peak {p['peak_gib_per_gpu']:.1f} GiB each")
            out += margin_lines(p["peak_gib_per_gpu"], gpu_gb * USABLE, gpu_gb, "its",
                                "a smaller optim.max_tokens_per_micro or rollout.vllm.gpu_memory_utilization")
        else:
            out.append(f"  needs: does not fit {gpu_gb:g} GiB GPUs at any count (lower the micro-batch budget or turn "
                       f"gradient checkpointing on)")
    if all(p["gpus"] for p in rows):
        out.append(f"total: {sum(p['gpus'] for p in rows)} GPU(s) for the run (each model on its own GPUs)")
    return out


def run_plan(ctx, cfg, gpu_gb, gpus, chip, calibration, as_json):
    """What ``graftzoo plan`` prints (the command and its checks: graftzoo.apps.plan_command) for the checked run
    config ``cfg`` and the calibration file's data ``calibration`` (None: the assumed one)."""
    chip, gpu_gb = gpu_of(chip, gpu_gb)  # one GPU: its memory and its limits
    if calibration is not None:
        try:
            calibration = calibration_of(calibration)
        except (ValueError, TypeError, AttributeError) as e:
            raise UsageLine(f"Invalid value for '--calibration': {e}") from None
    if gpus is not None:
        p = gpu_layout(cfg, gpus, gpu_gb, chip, calibration)
        if as_json:
            click.echo(json.dumps(p, indent=2))
            ctx.exit(0 if p["fits"] else 1)
        if not p["fits"]:
            raise click.ClickException(p["error"])
        click.echo("\n".join(placement_lines(p) + [step_line(p)]))
        return
    rows = plan(cfg, gpu_gb)
    if as_json:
        total = sum(r["gpus"] for r in rows) if all(r["gpus"] for r in rows) else 1  # each model on GPUs of its own
        step = gpu_layout(cfg, total, gpu_gb, chip, calibration).get("step_time")
        click.echo(json.dumps({"gpu_gb": gpu_gb, "models": rows, "step_time": step}, indent=2))
        return
    click.echo("\n".join(model_lines(rows, gpu_gb)))
