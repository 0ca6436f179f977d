"""``graftzoo grid``: run an algorithm x pair x seed grid (plus ablation variants) and its report.

A grid file (``configs/grids/NAME.yaml``)::

    name: tiny_table1                 # wandb group of every cell; default folder runs/<name>
    out_dir: runs/tiny_table1         # optional (``--out`` wins)
    pairs: [micro]                    # configs/pairs/<pair>.yaml
    seeds: [0, 1, 2]                  # or a count: 3
    files: []                         # extra config files for every cell (optional)
    set: {run.steps: 20}              # dotted overrides for every cell (optional)
    algorithms: [grpo_n8, grpo_n16]   # presets or algorithm names; label = the preset's run.variant
    variants:                         # ablations and other labelled methods
      - {label: "GRAFT", algo: graft, peer: online}
      - {label: "GRAFT w/o gate", algo: graft, peer: online, set: {algo.delta: 0.0}}
      - {label: "GRAFT (stored)", algo: graft, peer: "stored:{cell:GRPO (n=8)}", each_model: true}
    eval: {benchmarks: all, k: 8}     # optional: ``graftzoo eval`` on each finished cell
    report: {baseline: "GRPO (n=8)", budgets: [16, 32]}

A method entry (in ``algorithms`` or ``variants``) has ``algo`` and optionally ``label``, ``set``
(its own overrides, after the grid's), ``files``, ``peer`` (``online`` | ``none`` |
``stored:PATH`` | ``mixed:PATH``, where PATH may be ``{cell:LABEL}``: the run directory of the
method LABEL with the same pair and seed, which then runs first), ``each_model: true`` (one
cell per model of the pair, training that model alone: stored-peer methods, whose source is
one model of an earlier pair run), ``clip: own`` and ``pairs: [..]`` (a subset of the grid's
``pairs``: the method's cells are made on those pairs only; e.g. a GRPO baseline, which does not
depend on the peer, runs on one pair per learner; ``--dry-run`` shows it).

An alias entry ``{label: "SGT + GRAFT how", same_as: "w/o balanced exchange"}`` names one configuration
that a paper reports under two labels: it has no cells, the report prints the runs of the method
``same_as`` a second time, at the alias's place and under its label, and ``--dry-run`` lists it.

The regime map (``report.map``, optional) lays the grid's pairs out as a heat map of
Δ = method − baseline on the learner (each pair's FIRST model), one panel per method::

    report:
      baseline: "GRPO (n=8)"
      map:
        title: "GRAFT − GRPO (n=8) on the learner's weak skill (mul)"   # optional
        skill: mul                          # optional: the eval benchmark scored (default: mean over them)
        rows: {"pass@8 ≈ 0.1": [l1-same, l1-het], "pass@8 ≈ 0.3": [l3-same, l3-het]}   # the learner's level
        cols: {"same family, stronger": [l1-same, l3-same], "heterogeneous": [l1-het, l3-het]}
        methods: [GRAFT, "SGT + GRAFT how"]   # one panel each (aliases allowed)
        budget: "GRPO (n=32)"                 # optional: one more panel, budget − baseline

Each (row, col) must pick exactly one pair (the pair in both lists); every pair of a row has the
same learner; the labels are method labels (case-insensitive, aliases allowed). The baseline's
(and budget's) runs for a cell come from its own pair, else from the first pair of its row that
has them, else from another grid pair whose first model is the row's learner (e.g. a one-model
pair that GRPO trains the learner alone on, via ``pairs``); what Δ, ± and n are:
``graftzoo.eval.regime``. The report then also holds ``regime_map.png`` (the heat map),
``regime_map.md`` and ``regime_map.json``; the map is computed from the cells, whether or not
Table 1 can be built.

One clip per table (docs/algorithms.md#one-clip-for-every-method): every cell of a pair trains with the same effective clip
(``optim.clip.*``, or the key an algorithm clips with by design: GSPO ``algo.seq_clip``, HACPO
``algo.self_clip``); loading a grid that mixes clips is a GridError naming the cells and their clips,
unless each differing method is marked ``clip: own`` (e.g. HACPO's GSPO-scale self clip). Set a
non-default clip (clip-higher) once, grid-wide, in ``set``. ``--dry-run`` prints each cell's clip.

Cell ``f"{slug(label)}-{pair}-s{seed}"`` (``f"{slug(label)}-{slug(model)}-{pair}-s{seed}"`` with
``each_model``, ``model`` the part of the model id after its last ``/``) trains in ``<grid dir>/<cell>``. ``slug``
is ``graftzoo.contract.names.label_slug``, the rule of ``graftzoo train``'s default run names too: ``=()[]{}'"``
dropped, lowercased, every run of characters outside ``[a-z0-9._]`` one ``-``, ``-`` and ``.`` stripped at the
ends (``"GRPO (n=8)"`` -> ``grpo-n8``, so a cell of preset grpo_n8 is named as ``graftzoo train --algo grpo_n8``
names that run: ``grpo-n8-micro-s0``). The cell runs with ``run.name = <cell>``, ``run.variant = label``,
``run.wandb_group = name`` and ``run.tags = [algo, pair, "s<seed>"]``. A cell whose
``summary.json`` says "done" (and, with an ``eval`` block, whose eval files answer the same
request) is skipped; an unfinished one is run again and the trainer resumes from its last
checkpoint. A finished cell whose stored config differs from the one the grid would run now (a
key a resume may not change, or one the report compares: run length, eval k and set) is refused,
naming the cells and keys, unless ``--rerun-changed``: then it reruns from the start, its old run
moved aside. Cells run one after another (``--jobs N``: N at a time), each in its own process
(output in ``<grid dir>/logs/<cell>.log``) that dies with the grid, so a failed cell is reported
by name and the grid goes on; cells that depend on it are not run. The exit code is 1 if any cell failed. At the
end the report (Table 1, the clip table, the figures and the regime map) is written to
``<grid dir>/report``; rows that differ in rollout budget, clip or run length other than by their preset (or
``clip: own``) are marked in its Differs column and said on stderr (``graftzoo.eval.report.ROW_KEYS``). When the
cells track to wandb (``run.track``, the default) the report is also logged to a wandb run of job_type ``report``,
``<name>-report`` in the cells' group: Table 1 (``table1``, Δ vs the baseline), the clip table and the figures
(``run.log_report_to_wandb``); ``report: {wandb: false}`` keeps it off wandb.

Modules: ``model`` (Method, Cell, Grid, ordering and selection), ``load`` (reading and expanding a
grid file), ``run`` (cell status, the runners, ``run_grid``), ``command`` (``graftzoo grid``,
the dry-run plan, the report). Reading and checking a grid file imports no torch: ``run`` (the trainer) and the
report's modules are imported once the grid runs (this package's names from ``run`` on first use).
"""
import importlib

from graftzoo.apps.grid.command import grid_cmd, print_plan, write_report
from graftzoo.apps.grid.load import load_grid
from graftzoo.apps.grid.model import Cell, Grid, GridError, Method, order_cells, select_cells, slug

# the names of ``run``, which imports the trainer (torch): imported on first use, so that ``graftzoo grid --help``
# and a broken grid file answer without it
RUN_NAMES = ("GridInterrupted", "cell_status", "changed_cells", "check_changed", "check_configs", "config_drift",
             "eval_command", "eval_done", "resume_note", "run_cell_inprocess", "run_cell_subprocess", "run_grid",
             "summary_status")


def __getattr__(name: str):
    """A name of ``run`` (``RUN_NAMES``), imported on first use (PEP 562)."""
    if name in RUN_NAMES:
        return getattr(importlib.import_module("graftzoo.apps.grid.run"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Cell", "Grid", "GridError", "GridInterrupted", "Method", "cell_status", "changed_cells", "check_changed",
           "check_configs", "config_drift", "eval_command", "eval_done", "grid_cmd", "load_grid", "order_cells",
           "print_plan", "resume_note", "run_cell_inprocess", "run_cell_subprocess", "run_grid", "select_cells", "slug",
           "summary_status", "write_report"]
