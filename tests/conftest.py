"""Shared test setup: CPU only, one torch thread, wandb offline, caches inside the test session."""
import os

import pytest

if not os.environ.get("WANDB_MODE"):
    os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def sent(monkeypatch):
    """The tasks the verifier's pool is asked to run (a list the test reads); verdict caches cleared around it."""
    from graftzoo.envs import verifier, verify_pool
    tasks = []
    run = verify_pool._Pool.run

    def counting_run(self, batch, timeout, budget=None):
        tasks.extend(batch)
        return run(self, batch, timeout, budget)

    monkeypatch.setattr(verify_pool._Pool, "run", counting_run)
    verifier.clear_caches()
    yield tasks
    verifier.clear_caches()


@pytest.fixture(autouse=True, scope="session")
def _threads():
    import torch
    torch.set_num_threads(1)
