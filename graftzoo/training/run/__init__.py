"""The run around the step: its directory (lock, identity, resume), checkpoints, tracking (metrics.jsonl, wandb), stop signals and the keys that have no effect."""
