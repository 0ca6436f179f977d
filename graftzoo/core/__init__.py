"""The core: data contract, config, registry, policy and engines, cross-tokenizer exchange, trainer, checkpoints, tracking."""
