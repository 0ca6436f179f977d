"""Shared test setup: CPU only, one torch thread, wandb offline, caches inside the test session."""
import os

import pytest

if not os.environ.get("WANDB_MODE"):
    os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _threads():
    import torch
    torch.set_num_threads(1)
