"""Training, in rooms (docs/architecture.md#where-each-concern-lives): the trainer, export and checkpoint evaluation
here; ``run/`` (run directory, checkpoints, tracking, signals), ``planner/`` (memory, placement, building models and
engines), ``learning/`` (the step), ``engines/`` (HF, vLLM), ``models/`` (policy, loss and update loop, FSDP2, LoRA).
"""
