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


def pytest_collection_modifyitems(items):
    """The files with the most ``slow`` tests (real processes) first, the rest in their order: the two xdist workers
    of ``make test`` take a file at a time, and long files started last would leave one worker idle at the end."""
    slow: dict = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    first = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first[item.path]))


@pytest.fixture(autouse=True, scope="session")
def _threads():
    import torch
    torch.set_num_threads(1)


# wall time and outcomes per test file, printed at the end of the run (CI logs show where the time goes, and that
# the engine tests ran rather than skipped)
_FILES: dict = {}


def pytest_runtest_logreport(report):
    rec = _FILES.setdefault(report.nodeid.split("::")[0], {"s": 0.0, "passed": 0, "failed": 0, "skipped": 0})
    rec["s"] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        rec[report.outcome] += 1


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_sep("-", "wall time per test file (every file over 3 s, and every engine test file)")
    ranked = sorted(_FILES.items(), key=lambda kv: -kv[1]["s"])
    for path, rec in ranked:
        if rec["s"] > 3 or "vllm" in path:
            terminalreporter.write_line(f"{rec['s']:7.1f} s  {path}  ({rec['passed']} passed, {rec['failed']} failed, "
                                        f"{rec['skipped']} skipped)")
    rest = [rec["s"] for rec in _FILES.values() if rec["s"] <= 3]
    terminalreporter.write_line(f"{sum(rest):7.1f} s  in {len(rest)} other files; "
                                f"{sum(r['s'] for r in _FILES.values()):.1f} s in all")
