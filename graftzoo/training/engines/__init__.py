"""The rollout engines: HF (the training weights) and vLLM (an engine core apart, its weight sync, its process isolation and guardian)."""
