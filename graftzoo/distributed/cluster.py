"""Connecting to Ray: a private local cluster on 127.0.0.1, or an existing one (``ray.address``).

Settings that Ray 2.60 needs on a single machine (docs/scaling.md#ray-worker-groups-and-fsdp2, measured here):
token authentication set in the environment before ``ray`` is imported; the node on the loopback address;
``address="local"`` so that a cluster left behind by another process is never joined; usage stats off. The private
cluster is shut down by the process that started it (never ``ray stop``, which ends every Ray process of the
machine); Ray's own reaper ends its processes if that process is killed.
"""
from __future__ import annotations

import os
import secrets
import socket
import sys

from graftzoo.contract.config import RaySection
from graftzoo.distributed.errors import RayStartError

LOOPBACK = "127.0.0.1"


def ray_env(local: bool) -> None:
    """Environment for Ray, set before it is first imported: token authentication (a random token for a private
    cluster; a cluster of your own: set ``RAY_AUTH_TOKEN`` to its token), no usage stats, gloo on loopback."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if local:
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def refresh_ray_config() -> None:
    """Make an already imported Ray read the environment ``ray_env`` set (its configuration and token are cached at
    import: without this, a private cluster started after ``import vllm`` fails its authentication)."""
    from ray._private.authentication.authentication_token_setup import AuthenticationTokenLoader
    from ray._raylet import Config
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def connect(ray_cfg: RaySection, workers: int) -> bool:
    """Connect this process to Ray for a run: the cluster at ``ray.address``, or a private one started on
    127.0.0.1 with ``ray.num_cpus`` logical CPUs (default: enough for ``workers`` workers). Returns whether this
    process started it (and must shut it down: ``disconnect``). A process already connected keeps its cluster."""
    address = ray_cfg.address
    imported = "ray" in sys.modules  # e.g. by vLLM, which imports Ray when it is installed
    ray_env(local=address is None)
    import ray
    if imported:
        refresh_ray_config()
    if ray.is_initialized():
        return False
    try:
        if address is None:
            need = int(-(-workers * float(ray_cfg.cpus_per_worker) // 1))
            cpus = int(ray_cfg.num_cpus or max(os.cpu_count() or 1, need))
            ray.init(address="local", _node_ip_address=LOOPBACK, num_cpus=cpus, include_dashboard=False,
                     configure_logging=False, log_to_driver=True)
        else:
            ray.init(address=address, configure_logging=False)
    except Exception as e:
        where = "a private cluster on 127.0.0.1" if address is None else f"the cluster at ray.address={address!r}"
        raise RayStartError(f"could not start Ray ({where}): {type(e).__name__}: {' '.join(str(e).split())[:500]}") \
            from e
    return True


def disconnect(started: bool) -> None:
    """Shut down the private cluster this process started (only it)."""
    if not started:
        return
    import ray
    if ray.is_initialized():
        ray.shutdown()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now (bound to port 0, then released: another process may take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
