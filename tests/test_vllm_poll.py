"""``rollout.vllm.poll_sleep_us`` (graftzoo.training.engines.vllm_poll): the setting's meaning per device, the environment
the engine's processes inherit, and the vLLM plugin that makes their message queue sleep between polls. That an
engine in its own process then stays idle between calls is checked on a real run in tests/test_vllm_runs.py."""
import logging
import os
import time
from importlib.metadata import entry_points

import pytest

from graftzoo.contract.config import load_config
from graftzoo.contract.errors import ConfigError
from graftzoo.training.engines import vllm_poll
from graftzoo.training.engines.vllm_poll import CPU_POLL_SLEEP_US, ENV, poll_sleep_us, register, started_with

shm_broadcast = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")


def test_auto_sleeps_on_cpus_and_keeps_vllms_spin_on_gpus():
    assert poll_sleep_us("auto", "cpu") == CPU_POLL_SLEEP_US == 200
    assert poll_sleep_us("auto", "cuda") == 0
    assert poll_sleep_us(0, "cpu") == 0 and poll_sleep_us(750, "cuda") == 750


def test_the_key_takes_auto_or_microseconds_and_refuses_the_rest():
    assert load_config(pair="micro", algo="grpo").rollout.vllm.poll_sleep_us == "auto"
    assert load_config(pair="micro", algo="grpo", overrides=["rollout.vllm.poll_sleep_us=50"]).rollout.vllm \
        .poll_sleep_us == 50
    for bad in ("-1", "fast", "1000000"):
        with pytest.raises(ConfigError, match="rollout.vllm.poll_sleep_us"):
            load_config(pair="micro", algo="grpo", overrides=[f"rollout.vllm.poll_sleep_us={bad}"])


def test_the_environment_holds_the_setting_only_while_vllm_starts(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with started_with(300):
        assert os.environ[ENV] == "300"
    assert ENV not in os.environ
    monkeypatch.setenv(ENV, "7")  # a caller's own value comes back
    with started_with(300):
        assert os.environ[ENV] == "300"
    assert os.environ[ENV] == "7"
    with started_with(0):  # vLLM's spin, whatever the caller's environment says
        assert os.environ[ENV] == "0"
    assert os.environ[ENV] == "7"


def test_the_plugin_makes_the_queue_sleep_between_polls(monkeypatch):
    monkeypatch.setattr(shm_broadcast, "sched_yield", shm_broadcast.sched_yield)  # restored after the test
    monkeypatch.setenv(ENV, "20000")
    assert register() is True
    t = time.perf_counter()
    shm_broadcast.sched_yield()
    assert time.perf_counter() - t >= 0.019  # slept 20 ms, where a yield returns at once


def test_without_the_setting_the_plugin_leaves_vllm_alone(monkeypatch):
    original = shm_broadcast.sched_yield
    monkeypatch.setattr(shm_broadcast, "sched_yield", original)
    for value in (None, "0"):
        if value is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, value)
        assert register() is False and shm_broadcast.sched_yield is original


def test_a_vllm_whose_queue_polls_otherwise_gets_a_warning_not_an_error(monkeypatch, caplog):
    monkeypatch.delattr(shm_broadcast, "sched_yield")
    monkeypatch.setenv(ENV, "200")
    with caplog.at_level(logging.WARNING, logger=vllm_poll.__name__):
        assert register() is False
    assert "rollout.vllm.poll_sleep_us" in caplog.text and "keep spinning" in caplog.text


def test_vllm_finds_the_plugin_in_the_installed_package():
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("graftzoo_poll_sleep") == "graftzoo.training.engines.vllm_poll:register"
