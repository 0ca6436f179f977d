"""The learning step: one step of every model (step), the batches collected ahead (ahead), the prompts of a step (sampler), the transfer-path diagnostics."""
