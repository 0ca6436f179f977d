"""A run directory's file names, in one light module: the trainer writes them (graftzoo.training.run.checkpoint,
graftzoo.training.run.rundir), the reports read them (graftzoo.eval.artifacts), and the command line checks them before
it imports torch (graftzoo.apps.checks). docs/guide.md#run-directories describes the layout."""
from pathlib import Path

CONFIG = "config.yaml"          # the resolved run config
SUMMARY = "summary.json"        # status, models, compute; written at start and end
METRICS = "metrics.jsonl"       # one record per (step, model)
CHECKPOINTS = "checkpoints"     # folder of a run directory holding its checkpoints
MANIFEST = "manifest.json"      # written last: a checkpoint directory holding it is complete
TRAINER_FILE = "trainer.pt"     # tensor state of the trainer (RNG states)
AHEAD_FILE = "ahead.pt"         # the rollouts collected ahead of their steps (rollout.max_staleness)
STORE = "store"                 # the trajectory store's folder (the trainer's RUN/store)
STORE_META = ("meta.json", f"{STORE}/meta.json")  # a stored peer's trajectory store: PATH/meta.json or RUN/store/meta.json


def holds_run(run_dir) -> bool:
    """Whether ``run_dir`` holds (part of) a run: its config, metrics, checkpoints or trajectory store."""
    d = Path(run_dir)
    return any((d / name).exists() for name in (CONFIG, METRICS, SUMMARY, CHECKPOINTS, STORE))
