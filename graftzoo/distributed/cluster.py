"""Connecting to Ray: a private local cluster on 127.0.0.1, or an existing one (``ray.address``).

Settings that Ray 2.60 needs on a single machine (docs/scaling.md#ray-worker-groups-and-fsdp2, measured here):
token authentication set in the environment before ``ray`` is imported; the node on the loopback address;
``address="local"`` so that a cluster left behind by another process is never joined; usage stats off. The private
cluster is shut down by the process that started it (never ``ray stop``, which ends every Ray process of the
machine); Ray's own reaper ends its processes if that process is killed.

On a cluster of several nodes (docs/scaling.md#a-cluster-of-several-nodes) a node is named by its raylet's address
(``node_names``: several nodes of one machine share a host), and the folder a run or grid writes is checked to be
one every node reads and writes (``check_shared_dir``).
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
from pathlib import Path

from graftzoo.contract.config import RaySection
from graftzoo.distributed.errors import RayStartError, StorageError

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


def _nodes() -> list:
    """``ray.nodes()``; none where this process is not connected (or the cluster no longer answers)."""
    import ray
    if not ray.is_initialized():
        return []
    try:
        return ray.nodes()
    except Exception:  # noqa: BLE001 - said as an unknown node by the callers
        return []


def alive_nodes() -> list:
    """The cluster's live nodes (``ray.nodes()`` entries)."""
    return [n for n in _nodes() if n.get("Alive")]


def node_names() -> dict:
    """node id -> its address as ``host:port`` (the raylet's): several nodes of one machine share a host."""
    return {n["NodeID"]: f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}" for n in _nodes()}


MARKS = ".graftzoo-nodes"  # the folder of the run directory where each node leaves its mark at start


def _mark(folder: str, name: str, token: str, want: dict) -> dict:
    """On a node: write ``name`` with ``token`` into ``folder``, read the marks ``want`` (name -> token) there;
    returns what it could not read (name -> what it found)."""
    import ray
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write(token)
    missing = {}
    for other, tok in want.items():
        try:
            with open(os.path.join(folder, other)) as f:
                got = f.read()
        except OSError as e:
            got = f"{type(e).__name__}"
        if got != tok:
            missing[other] = got
    return {"node_id": ray.get_runtime_context().get_node_id(), "missing": missing}


def check_shared_dir(run_dir: Path, timeout: float = 60.0, what: str = "run directory",
                     key: str = "run.out_dir") -> None:
    """The run directory (or a grid's folder: ``what``, set by ``key``) is one every live node reads and writes: the
    driver leaves a mark in it, a task on each node writes its own and reads the driver's, then the driver reads
    every node's. A node that cannot, or whose mark the driver cannot read, fails the run in one line naming it
    (``StorageError``): the workers' checkpoint shards must land where the driver reads them."""
    import ray
    from ray.exceptions import TaskUnschedulableError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder = run_dir.resolve() / MARKS
    folder.mkdir(parents=True, exist_ok=True)
    mine = secrets.token_hex(8)
    (folder / "driver").write_text(mine)
    nodes, names = alive_nodes(), node_names()
    task = ray.remote(_mark)
    try:
        refs = {task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(str(folder), n["NodeID"], n["NodeID"][:16] + mine, {"driver": mine}):
                n["NodeID"] for n in nodes}
        done, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in late:
            raise StorageError(f"node {names[refs[ref]]} did not answer the {what}'s check within "
                               f"{timeout:.0f} s")
        for ref in done:
            node = refs[ref]
            try:
                got = ray.get(ref)
            except TaskUnschedulableError:  # the node left the cluster since ray.nodes() listed it
                continue
            seen = (folder / node).read_text() if (folder / node).is_file() else None
            if got["missing"] or seen != node[:16] + mine:
                side = "cannot read what the driver wrote there" if got["missing"] else \
                    "wrote its mark where the driver cannot read it"
                raise StorageError(f"the {what} {run_dir} is not shared with node {names[node]} (it {side}); "
                                   f"work on several nodes needs a directory every node reads and writes (a shared "
                                   f"file system): set {key} to one")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
