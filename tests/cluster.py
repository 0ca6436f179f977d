"""A Ray cluster of several nodes on this machine, for tests: raylets on 127.0.0.1 (each with its own node manager
port), started with ``ray start`` inside one loopback-only network, PID and mount namespace (``unshare -n -p -f
--mount-proc``). Every command of a test runs inside it (``nsenter``), nothing can leave the machine, and closing the
namespace's first process ends every process of the cluster and of the runs, also when a test fails.

A node may see one folder differently from the others (``add_node(private=(folder, elsewhere))``: a bind mount in a
mount namespace of its own), as a node without the shared file system would.
"""
from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import psutil


def can_make() -> bool:
    """Namespaces need root and ``unshare``/``nsenter``."""
    return os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("nsenter"))


class LoopbackCluster:
    """``nodes`` Ray nodes of ``cpus`` logical CPUs each; the head's GCS on 127.0.0.1:``port``."""

    def __init__(self, env: dict, cpus: int = 6, port: int = 6390):
        self.token = secrets.token_hex(16)
        self.env = dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0")
        self.port, self.cpus, self.next_port = port, cpus, 43000
        self.nodes: dict = {}  # node manager port -> its raylet's pid
        self.temp = Path(tempfile.mkdtemp(prefix="gzc"))  # short: Ray's socket paths must stay under 108 bytes
        self.holder = subprocess.Popen(["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c",
                                        "ip link set lo up && exec sleep infinity"], start_new_session=True)
        deadline = time.time() + 10
        while not psutil.Process(self.holder.pid).children() and time.time() < deadline:
            time.sleep(0.05)
        self.init_pid = psutil.Process(self.holder.pid).children()[0].pid  # PID 1 of the namespace
        self.ray = str(Path(sys.executable).parent / "ray")
        self._start_node(head=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def popen(self, cmd: list, **kw) -> subprocess.Popen:
        """``cmd`` inside the cluster's namespaces (its stdout and stderr piped, as text)."""
        inner = ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "--", *cmd]
        return subprocess.Popen(inner, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

    def run(self, cmd: list, timeout: float = 120) -> subprocess.CompletedProcess:
        p = self.popen(cmd)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise RuntimeError(f"{shlex.join(cmd)} did not finish within {timeout} s:\n{err[-2000:]}") from None
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def _start_node(self, head: bool = False, private: Optional[tuple] = None) -> int:
        nm_port = self.next_port
        self.next_port += 10
        cmd = [self.ray, "start", "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}",
               f"--node-manager-port={nm_port}", "--disable-usage-stats"]
        if head:
            cmd += ["--head", f"--port={self.port}", "--include-dashboard=false", f"--temp-dir={self.temp}"]
        else:
            cmd += [f"--address={self.address}"]
        if private is not None:  # this node sees another folder at ``folder``
            folder, elsewhere = (str(Path(p)) for p in private)
            cmd = ["unshare", "-m", "bash", "-c",
                   f"mount --bind {shlex.quote(elsewhere)} {shlex.quote(folder)} && exec {shlex.join(cmd)}"]
        done = self.run(cmd, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        self.nodes[nm_port] = self._raylet(nm_port)
        return nm_port

    def add_node(self, private: Optional[tuple] = None) -> int:
        """A worker node; returns its node manager port (its address is ``127.0.0.1:PORT``)."""
        return self._start_node(private=private)

    def _raylet(self, nm_port: int) -> int:
        for p in psutil.Process(self.init_pid).children(recursive=True):
            try:
                if p.name() == "raylet" and f"--node_manager_port={nm_port}" in p.cmdline():
                    return p.pid
            except psutil.NoSuchProcess:
                continue
        raise RuntimeError(f"no raylet with node manager port {nm_port}")

    def kill_node(self, nm_port: int) -> None:
        """Kill the node's raylet (SIGKILL): the node is lost, as when its machine goes down."""
        os.kill(self.nodes.pop(nm_port), signal.SIGKILL)

    def close(self) -> None:
        """End every process of the namespace (its PID 1 killed), then the folder of Ray's files."""
        try:
            os.kill(self.init_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.holder.wait(timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)
