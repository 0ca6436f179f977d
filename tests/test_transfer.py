"""The weight transfer from a model's training ranks to its rollout workers (graftzoo.distributed.transfer): the
buckets both sides cut the layout into, and a real broadcast between two processes over gloo on loopback."""
import multiprocessing as mp
import os

import pytest
import torch

from graftzoo.distributed.cluster import free_port
from graftzoo.distributed.transfer import Transfer, buckets, drain, layout_of, signature

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def test_buckets_hold_consecutive_entries_of_one_dtype_within_the_limit():
    layout = [("a", (10,), "float32"), ("b", (5,), "float32"), ("c", (4,), "bfloat16"), ("d", (100,), "float32"),
              ("e", (1,), "float32"), ("f", (2, 3), "float32")]
    # 40 + 20 bytes fit 64; c changes dtype; d (400 bytes) is over the limit, alone; e and f (4 + 24) together
    assert buckets(layout, limit=64) == [[0, 1], [2], [3], [4, 5]]
    assert buckets(layout, limit=10_000) == [[0, 1], [2], [3, 4, 5]]
    assert buckets([], limit=64) == []


def test_the_layout_and_its_signature_name_every_tensor_shape_and_dtype():
    w = {"x": torch.zeros(2, 3), "y": torch.zeros(4, dtype=torch.bfloat16)}
    lay = layout_of(w.items())
    assert lay == [("x", (2, 3), "float32"), ("y", (4,), "bfloat16")]
    other = layout_of({"x": torch.zeros(3, 2), "y": w["y"]}.items())
    assert signature(lay) == signature(list(lay)) != signature(other)


def _receive(port: int, q) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    mine = {"emb": torch.zeros(7, 5), "norm": torch.zeros(5, dtype=torch.bfloat16), "head": torch.zeros(3, 5)}
    t = Transfer("127.0.0.1", port, 1, 2, 60)
    try:
        got = t.receive(layout_of(mine.items()), mine, limit=100)
        q.put((got, {k: v.float().tolist() for k, v in mine.items()}))
    finally:
        t.close()


@pytest.mark.slow  # a second process
def test_a_transfer_moves_the_weights_bit_for_bit_into_the_receivers_tensors():
    """Rank 0 broadcasts a model's weights bucket by bucket (buckets of at most 100 bytes here: several broadcasts,
    a tensor larger than that alone); rank 1 receives them into its own tensors, in place."""
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_receive, args=(port, q))
    p.start()
    try:
        weights = {"emb": torch.randn(7, 5), "norm": torch.randn(5).bfloat16(), "head": torch.randn(3, 5)}
        t = Transfer("127.0.0.1", port, 0, 2, 60)
        try:
            sent = drain(iter(weights.items()), t, layout_of(weights.items()))
        finally:
            t.close()
        got, values = q.get(timeout=60)
    finally:
        p.join(timeout=60)
    assert p.exitcode == 0
    assert sent == got == (35 + 15) * 4 + 5 * 2
    for k, v in weights.items():
        assert torch.equal(torch.tensor(values[k]), v.float()), k
    assert drain(iter(weights.items()), None, []) == 0   # a rank other than 0 walks the weights, sends nothing
