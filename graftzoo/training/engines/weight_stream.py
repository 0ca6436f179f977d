"""Weights streamed in memory to a vLLM engine core that runs in its own process: one tensor at a time, over a
loopback TCP socket, no file written.

The training process lists the weights (name and whole tensor, already in the engine's dtype) and serves them on
127.0.0.1; the engine's worker (``WeightReceiver``, vLLM's ``worker_extension_cls``) connects and feeds them to its
own in-place ``reload_weights`` as they arrive. At most one tensor is in flight on each side, so a model never has
to fit twice in host memory. Each tensor crosses as a small JSON header (name, dtype, shape, bytes) and its raw bytes.
"""
from __future__ import annotations

import json
import socket
import struct
import threading
from typing import Callable, Iterable, Iterator

import torch

HEADER = struct.Struct("!I")  # the byte length of each JSON header
_END = b"{}"  # the header after the last tensor
_DTYPES = {str(d).replace("torch.", ""): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                                      torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8)}


class WeightStreamError(RuntimeError):
    """The stream of weights broke off (the other side failed or timed out)."""


def send_tensors(conn: socket.socket, items: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, int]:
    """Write each ``(name, tensor)`` to ``conn`` (header, then the raw bytes), then the end mark; returns (tensors,
    bytes) sent."""
    count = total = 0
    for name, t in items:
        t = t.detach().contiguous().cpu()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        head = json.dumps({"name": name, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                           "nbytes": t.numel() * t.element_size()}).encode()
        conn.sendall(HEADER.pack(len(head)) + head)
        if len(raw):
            conn.sendall(memoryview(raw).cast("B"))
        count, total = count + 1, total + t.numel() * t.element_size()
    conn.sendall(HEADER.pack(len(_END)) + _END)
    return count, total


def _read(conn: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if k == 0:
            raise WeightStreamError(f"the weight stream ended after {got} of {n} bytes")
        got += k
    return buf


def receive_tensors(conn: socket.socket) -> Iterator[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs ``send_tensors`` writes, one at a time, until its end mark."""
    while True:
        (size,) = HEADER.unpack(_read(conn, HEADER.size))
        head = json.loads(bytes(_read(conn, size)))
        if not head:
            return
        dtype = _DTYPES[head["dtype"]]
        raw = _read(conn, int(head["nbytes"]))
        t = torch.frombuffer(raw, dtype=torch.uint8) if len(raw) else torch.empty(0, dtype=torch.uint8)
        yield head["name"], t.view(dtype).reshape(head["shape"])


class WeightServer:
    """A one-connection server on 127.0.0.1 that streams ``items`` to whoever connects first.

    ``serve(items)`` runs in the calling thread (the tensors may be produced by collectives, which belong to the
    process's main thread) while ``pull`` — the call that makes the engine connect — runs in a helper thread; an
    error on either side ends both and is raised here."""

    def __init__(self, timeout_s: float = 300.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.sock.settimeout(float(timeout_s))
        self.timeout_s = float(timeout_s)
        self.address = self.sock.getsockname()

    def stream(self, items: Iterable[tuple[str, torch.Tensor]], pull: Callable[[str, int], object]) -> tuple:
        """Serve ``items`` to the connection ``pull(host, port)`` opens; returns (tensors, bytes sent, pull's
        result)."""
        result, error, open_conn = {}, {}, {}

        def run_pull():
            try:
                result["value"] = pull(*self.address)
            except BaseException as e:  # noqa: BLE001 - re-raised in the serving thread
                error["pull"] = e
                for s in (self.sock, open_conn.get("conn")):  # an accept or a send still waiting ends at once
                    if s is not None:       # (closing a socket from another thread would not wake it)
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass

        th = threading.Thread(target=run_pull, name="graftzoo-weight-pull", daemon=True)
        th.start()
        try:
            try:
                conn, _ = self.sock.accept()
            except OSError as e:
                th.join(self.timeout_s)
                if "pull" in error:
                    raise error["pull"]
                raise WeightStreamError(f"the engine did not connect for its weights: {e}") from e
            with conn:
                conn.settimeout(self.timeout_s)
                open_conn["conn"] = conn
                try:
                    if "pull" in error:  # failed while the connection was being accepted
                        raise OSError("the engine's pull failed")
                    sent = send_tensors(conn, items)
                except OSError as e:
                    th.join(self.timeout_s)
                    if "pull" in error:
                        raise error["pull"] from e
                    raise WeightStreamError(f"the engine stopped reading its weights: {e}") from e
            th.join(self.timeout_s)
            if th.is_alive():
                raise WeightStreamError(f"the engine did not finish loading its weights in {self.timeout_s:.0f} s")
            if "pull" in error:
                raise error["pull"]
            return (*sent, result.get("value"))
        finally:
            self.sock.close()


class WeightReceiver:
    """Mixed into vLLM's worker (``worker_extension_cls``): ``graftzoo_pull_weights(host, port)`` connects to a
    ``WeightServer`` and reloads the model in place from the tensors as they arrive; returns how many it took."""

    def graftzoo_pull_weights(self, host: str, port: int, timeout_s: float = 300.0) -> int:
        count, ended = [0], [False]

        def counted(stream):
            for item in stream:
                count[0] += 1
                yield item
            ended[0] = True

        with socket.create_connection((host, int(port)), timeout=float(timeout_s)) as conn:
            stream = receive_tensors(conn)
            self.reload_weights(weights_iterator=counted(stream))
            if not ended[0]:  # what reload_weights left unread is drained, so that the sender finishes
                for _ in stream:
                    pass
        return count[0]
