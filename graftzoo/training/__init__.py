"""Training: policies and engines (HF, vLLM), the update, the trainer, checkpoints, the run directory, tracking,
LoRA, FSDP helpers and checkpoint evaluation."""
