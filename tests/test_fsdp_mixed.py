"""FSDP2 as the worker groups use it (``graftzoo.training.models.fsdp.shard_policy``), on 2 gloo ranks in real processes:
under ``bf16-mixed`` the parameters are gathered and computed in bf16 and the gradients reduced in float32
(``MixedPrecisionPolicy``); in float32 the group's gradient is one process's to rounding.

One script (``_RANKS``) starts 2 ranks with ``torch.multiprocessing`` on 127.0.0.1, inside a
loopback-only network and PID namespace where the machine allows one (tests/test_ray_backend.py's ``loopback``).
For each precision, every rank builds the micro pair's model with ``build_policy`` as a worker does, shards it with ``shard_policy``,
runs the update's forward (``Policy.logprobs``) on its half of a batch and the backward of a loss over the whole
batch's token count; rank 0 writes the group's gradients (``full_tensor``), the loss and the dtypes the model's
linear layers computed in. The test compares them with one process running the same loss on the whole batch.
"""
import json
import sys

import pytest
import torch

from graftzoo.contract.config import load_config
from graftzoo.training.planner.build import build_policy
from test_ray_backend import finish, loopback

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

MODEL = "micro-gpt2-pair"

_RANKS = r'''
import json, sys, torch, torch.multiprocessing as mp
from graftzoo.contract.config import load_config
from graftzoo.distributed.cluster import free_port
from graftzoo.training.models import fsdp
from graftzoo.training.planner.build import build_policy

def batch(pol):
    torch.manual_seed(1)
    ids = torch.randint(3, len(pol.tokenizer) - 1, (4, 20))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0   # left padding of a shorter prompt
    return ids, mask

def loss_of(pol, ids, mask, tokens):
    logp, _ = pol.logprobs(ids, mask, 8)
    return -logp.sum() / tokens   # the whole batch's denominator: the ranks' gradients add up

def rank(r, world, port, model, precisions, out):
    torch.set_num_threads(1)
    fsdp.init_group(r, world, "127.0.0.1", port, "cpu", 300)  # generous: a loaded machine starts ranks slowly
    for precision in precisions.split(","):  # one group, one model built and sharded per precision
        cfg = load_config(pair="micro", algo="grpo", overrides=[f"optim.precision={precision}"])
        spec = next(s for s in cfg.pair.models if s.id == model)
        pol = build_policy(spec, cfg, seed=0)
        fsdp.shard_policy(pol)
        dtypes = set()
        for m in pol.model.modules():
            if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D":
                m.register_forward_pre_hook(lambda mod, args: dtypes.add(str(mod.weight.dtype)))
        ids, mask = batch(pol)
        loss = loss_of(pol, ids[r::world], mask[r::world], 4 * 8)
        loss.backward()
        grads = {n: p.grad.full_tensor().tolist() for n, p in pol.model.named_parameters()}
        losses = [torch.zeros(1) for _ in range(world)]
        torch.distributed.all_gather(losses, loss.detach().float().reshape(1))
        if r == 0:
            json.dump({"grads": grads, "loss": float(sum(losses)), "dtypes": sorted(dtypes),
                       "master": str(next(pol.model.parameters()).dtype)}, open(f"{out}/{precision}.json", "w"))
    torch.distributed.barrier()  # no rank leaves while another's gloo work is in flight (an abort at exit)
    torch.distributed.destroy_process_group()

if __name__ == "__main__":
    _, model, precisions, out = sys.argv
    mp.start_processes(rank, args=(2, free_port("127.0.0.1"), model, precisions, out), nprocs=2, start_method="spawn")
'''


PRECISIONS = {"bf16-mixed": ("torch.bfloat16", 3e-2), "fp32": ("torch.float32", 1e-5)}


@pytest.fixture(scope="module")
def group(tmp_path_factory) -> dict:
    """precision -> what rank 0 wrote: one launch of 2 ranks for every precision (the ranks start once)."""
    tmp = tmp_path_factory.mktemp("fsdp")
    script = tmp / "ranks.py"
    script.write_text(_RANKS)
    code, log = finish(loopback([sys.executable, str(script), MODEL, ",".join(PRECISIONS), str(tmp)]), timeout=300)
    assert code == 0, log[-3000:]
    return {p: json.loads((tmp / f"{p}.json").read_text()) for p in PRECISIONS}


def _one_process(precision: str):
    cfg = load_config(pair="micro", algo="grpo", overrides=[f"optim.precision={precision}"])
    pol = build_policy(next(s for s in cfg.pair.models if s.id == MODEL), cfg, seed=0)
    torch.manual_seed(1)
    ids = torch.randint(3, len(pol.tokenizer) - 1, (4, 20))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with pol.compute_weights():  # bf16-mixed: the bf16 working copy of the weights, as FSDP2 gathers them
        loss = sum(-pol.logprobs(ids[r::2], mask[r::2], 8)[0].sum() / 32 for r in range(2))
        loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in pol.model.named_parameters()}


def _worst(grads: dict, ref: dict) -> float:
    """The largest gap of a gradient to the reference's, relative to the reference tensor's largest entry."""
    return max(float((torch.tensor(g) - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-12))
               for n, g in grads.items())


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fsdp2_group_matches_one_process(group, precision):
    """bf16-mixed: the layers compute on bf16 parameters gathered from float32 shards (half the all-gather
    traffic), and the group's gradient matches one process to bf16 rounding (3% of each tensor's
    largest entry, the loss to 1e-3: the one process computes on its bf16 working copy, Policy.compute_weights); fp32: to float32 rounding (1e-5). The master weights stay float32."""
    gathered, tolerance = PRECISIONS[precision]
    got = group[precision]
    loss, ref = _one_process(precision)
    assert got["dtypes"] == [gathered]
    assert got["master"] == "torch.float32"
    assert got["loss"] == pytest.approx(loss, rel=1e-3 if precision == "bf16-mixed" else 1e-6)
    assert _worst(got["grads"], ref) <= tolerance
    assert max(float(g.abs().max()) for g in ref.values()) > 1e-3  # a real gradient
