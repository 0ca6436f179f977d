"""How vLLM's engine processes wait for their next message (``rollout.vllm.poll_sleep_us``).

An engine core in a process of its own talks to its worker processes (where it has any: several GPUs; on one device
the worker runs in the engine core's process, graftzoo.training.engines.vllm_engine.uniproc_executor) through a
shared-memory queue. After each message
it reads, a reader polls the queue in a loop of ``sched_yield`` for a second (vLLM's ``SpinCondition``), so that it
sees the next one at once. That loop is a core's worth of CPU: the worker spins for a second after every generate and
weight sync, the engine core while it waits for each decode step's result. On a GPU machine the core is a spare one;
on a CPU machine it is the core the trainer, the verifier or the other model's engine needs. With asynchronous
rollouts (``rollout.max_staleness``) on 2 CPU cores the spinning ate the whole overlap
(docs/scaling.md#asynchronous-rollouts).

``register`` is a vLLM general plugin (entry point ``vllm.general_plugins`` in setup.py): vLLM runs it in each process
it starts, before the queues are used. The engine sets ``ENV`` while it starts vLLM (``started_with``), and the
processes started then inherit it: their queues then sleep ``poll_sleep_us`` microseconds between polls instead of
yielding. Everything else stays vLLM's: when a reader polls at all, for how long, and its wake-up on the writer's
notice. A message then waits at most that long more to be seen; a CPU decode step takes milliseconds.

Without the plugin (``VLLM_PLUGINS`` set to a list without ``graftzoo_poll_sleep``, or a vLLM whose queue no longer
polls through ``sched_yield``: a warning), vLLM's spinning stays, and only the CPU time differs.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import time

ENV = "GRAFTZOO_VLLM_POLL_SLEEP_US"
CPU_POLL_SLEEP_US = 200  # auto on CPUs: polls 200 us apart cost about 7 % of a core (0.07 CPU-s in the polling second)

log = logging.getLogger(__name__)


def poll_sleep_us(setting, device_type: str) -> int:
    """Microseconds between polls for ``rollout.vllm.poll_sleep_us`` (``auto`` | an integer >= 0) on a device of
    ``device_type``: ``auto`` sleeps ``CPU_POLL_SLEEP_US`` on CPUs and keeps vLLM's spin (0) elsewhere."""
    if setting == "auto":
        return CPU_POLL_SLEEP_US if device_type == "cpu" else 0
    return int(setting)


@contextlib.contextmanager
def started_with(us: int):
    """``ENV`` set to ``us`` while vLLM starts its processes (they inherit it; 0: vLLM's spin, also where this
    process's environment says otherwise), this process's value restored after."""
    before = os.environ.get(ENV)
    os.environ[ENV] = str(int(us))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def register() -> bool:
    """The plugin: in a process started with ``ENV`` > 0, vLLM's shared-memory queue polls by sleeping that many
    microseconds instead of ``sched_yield``. Returns whether it did."""
    us = int(os.environ.get(ENV) or 0)
    if us <= 0:
        return False
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:  # a vLLM without the shared-memory queue: nothing polls it
        return False
    if not callable(getattr(shm_broadcast, "sched_yield", None)):
        log.warning("rollout.vllm.poll_sleep_us: this vLLM's shared-memory queue does not poll through "
                    "sched_yield; its engine processes keep spinning between messages")
        return False
    shm_broadcast.sched_yield = functools.partial(time.sleep, us / 1e6)
    return True
