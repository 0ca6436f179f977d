"""run.layout offload (graftzoo.training.planner.placement.Residency, Policy.offload / onload): the idle model's training
state (parameters, buffers, AdamW's moments) leaves for host memory and comes back bit for bit, a pass over an
offloaded model is refused, gradients are freed after every optimizer step, and a co-trained run in the offload
layout is the resident run, metric for metric and weight for weight. The host side is one buffer per model, every
state tensor a view into it, of the size the plan counts (memory.host_buffer_bytes), reused by every move. On this
CPU machine host memory and the device are the same RAM: what is checked is the bookkeeping (every tensor moved to
the buffer and back, nothing left behind, nothing computed on a model that is away) and the pinning calls against a
stand-in CUDA runtime; the memory it frees and pins on a GPU is bench/gpu_check.py's."""
import dataclasses
import gc
import json

import pytest
import torch

from transformers import AutoConfig, AutoModelForCausalLM

from graftzoo.contract.config import load_config
from graftzoo.training.planner import memory as M
from graftzoo.training.models.policy import Policy
from graftzoo.training.trainer import Trainer

PAIR = ["micro-qwen-char", "micro-gpt2-pair"]


def micro_cfg(tmp_path, *overrides, algo="graft"):
    return load_config(pair="micro", algo=algo, overrides=[f"run.out_dir={tmp_path}", "run.track=false",
                                                          "run.eval_at_end=false", "peer.source=online",
                                                          "run.device=cpu", *overrides])


def state_of(pol) -> list:
    """Copies of a policy's training state, in ``_state_tensors`` order."""
    return [t.detach().clone() for t in pol._state_tensors()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The micro pair's trainer after one co-trained step (AdamW holds its moments), resident."""
    tr = Trainer(micro_cfg(tmp_path_factory.mktemp("trained"), "run.steps=1"))
    try:
        tr.run()
        yield tr
    finally:
        tr.close()


def test_offload_moves_every_state_tensor_out_and_back_bit_for_bit(trained):
    pol = trained.policies[PAIR[0]]
    assert pol.optimizer.state, "one update: AdamW holds its moments"
    assert all(p.grad is None for p in pol.model.parameters()), "gradients freed after the optimizer step"
    before = state_of(pol)
    ptrs = [t.data_ptr() for t in pol._state_tensors()]
    nbytes = sum(t.numel() * t.element_size() for t in before)
    moments = [t for st in pol.optimizer.state.values() for k, t in st.items() if k.startswith("exp_avg")]
    assert moments and all(any(t is s for s in pol._state_tensors()) for t in moments)

    assert pol.offload() == nbytes
    assert pol.offloaded and pol.offload() == 0  # a second call moves nothing
    assert all(t.data_ptr() != p for t, p in zip(pol._state_tensors(), ptrs)), "every tensor in a new buffer"
    with pytest.raises(RuntimeError, match=f"model '{PAIR[0]}' is offloaded"):
        pol.model(input_ids=torch.tensor([[1, 2, 3]]))
    with pytest.raises(RuntimeError, match="offloaded"):
        pol.score_sequences([[1, 2]], [[3, 4]])

    assert pol.onload() == nbytes and not pol.offloaded and pol.onload() == 0
    after = state_of(pol)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(before, after))
    pol.model(input_ids=torch.tensor([[1, 2, 3]]))  # resident again: passes run
    # the optimizer still steps the same tensors (identity kept, only the storage moved)
    params = {id(p) for p in pol.model.parameters()}
    assert all(id(p) in params for g in pol.optimizer.param_groups for p in g["params"])


def storages(pol) -> set:
    """The host storages the state tensors of an offloaded policy are views into."""
    return {t.untyped_storage().data_ptr() for t in pol._state_tensors()}


@pytest.mark.parametrize("model", PAIR)
def test_the_host_buffer_is_one_storage_of_the_size_the_plan_counts_reused_by_every_move(trained, model):
    pol = trained.policies[model]
    state = list(pol._state_tensors())
    before = state_of(pol)
    planned = next(m for m in M.model_memory(trained.cfg) if m.model == model)
    assert pol.offload() > 0 and pol.offloaded
    try:
        assert len(storages(pol)) == 1, "one host buffer for the whole state, every tensor a view into it"
        buf = pol._state_tensors()[0].untyped_storage()
        # allocated at the plan's size, exactly: the tensors aligned to HOST_ALIGN, whole pages, no power-of-two
        assert buf.nbytes() == pol.host_bytes() == M.host_buffer_bytes(planned) == Policy.host_buffer_size(
            [t.numel() * t.element_size() for t in state])
        assert M.movable_bytes(planned) == sum(t.numel() * t.element_size() for t in state)
        assert pol.host_bytes(pinned=True) == 0  # pinned only where the state leaves a GPU
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in pol._state_tensors())
        assert all(a % Policy.HOST_ALIGN == 0 for a, _ in spans)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), "the views do not overlap"
        assert buf.data_ptr() <= spans[0][0] and spans[-1][1] <= buf.data_ptr() + buf.nbytes()
        ptr = buf.data_ptr()
        assert pol.onload() > 0 and pol.offload() > 0
        assert storages(pol) == {ptr} and pol.host_bytes() == buf.nbytes(), "the second move reuses the buffer"
        assert all(a is b for a, b in zip(pol._state_tensors(), state)), "the same tensors, only their storage moved"
    finally:
        pol.onload()
    assert all(torch.equal(a, b) for a, b in zip(before, state_of(pol)))


class FakeCudart:
    """Stands in for torch.cuda.cudart(): records the (un)registrations, answers ``code`` to cudaHostRegister."""

    def __init__(self, code=0):
        self.calls, self.code = [], code

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.calls.append(("register", ptr, nbytes, flags))
        return self.code

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0

    def cudaError(self, code):
        return code

    def cudaGetErrorString(self, code):
        return "out of memory"


def test_a_mixed_dtype_state_shares_one_buffer_laid_out_anew_when_it_grows_and_pinned_exactly(tmp_path, monkeypatch):
    # pair1's Qwen3 family in bfloat16, trained in its dtype: bf16 weights and moments, float32 steps and buffers
    hf = AutoConfig.for_model("qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
                              num_key_value_heads=2, intermediate_size=128, vocab_size=100, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
    pol = Policy("tiny-qwen3", model, None)  # no optimizer yet: the parameters and buffers only
    pol.offload()
    small = pol.host_bytes()
    assert small == Policy.host_buffer_size([t.numel() * t.element_size() for t in pol._state_tensors()])
    pol.onload()
    pol.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.float().sum().backward()
    pol.optimizer.step()
    pol.optimizer.zero_grad(set_to_none=True)
    before = state_of(pol)
    pol.offload()  # AdamW's moments and steps join the state: a new, larger buffer
    assert {t.dtype for t in pol._state_tensors()} == {torch.bfloat16, torch.float32}
    assert len(storages(pol)) == 1 and pol.host_bytes() > small
    planned = dataclasses.replace(M.model_memory(micro_cfg(tmp_path))[0], arch=M.Arch.from_hf_config(hf),
                                  precision="model", low=True)
    assert pol.host_bytes() == M.host_buffer_bytes(planned)  # the plan's tensors are the real state's
    pol.onload()
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(before, state_of(pol)))

    # the CUDA branch (a state leaving a GPU) against a stand-in runtime: the buffer's page-aligned range, exactly
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    region = pol._host["region"]
    pol._host["unpin"] = pol._pin(region)
    (_, ptr, nbytes, flags), = fake.calls
    assert ptr == region.data_ptr() and ptr % Policy.HOST_PAGE == 0 and nbytes % Policy.HOST_PAGE == 0
    assert nbytes == pol.host_bytes(pinned=True) == pol.host_bytes() - Policy.HOST_PAGE and flags == 0
    pol._release_host()  # dropping the buffer unregisters it first
    assert fake.calls[-1] == ("unregister", ptr) and pol.host_bytes() == 0
    dropped = torch.empty(2 * Policy.HOST_PAGE, dtype=torch.uint8)
    pol._pin(dropped)
    ptr = dropped.data_ptr()
    del dropped
    gc.collect()  # a buffer collected without _release_host: unregistered by its finalizer
    assert fake.calls[-1] == ("unregister", ptr)
    fake.code = 2
    with pytest.raises(RuntimeError, match="model 'tiny-qwen3': pinning its .* host buffer for run.layout offload "
                                           "failed \\(cudaHostRegister: out of memory, error 2\\)"):
        pol._pin(torch.empty(Policy.HOST_PAGE, dtype=torch.uint8))


def records(run_dir) -> list:
    """metrics.jsonl without the timings (wall-clock) and the offload's own time."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "async/overlap_s"))} for r in rows]


def test_offload_run_equals_resident_run(tmp_path):
    runs = {}
    for layout in ("resident", "offload"):
        tr = Trainer(micro_cfg(tmp_path / layout, "run.steps=2", f"run.layout={layout}", "run.save_every=2"))
        try:
            moves = []
            for pol in tr.policies.values():  # count the moves the layout makes
                for name in ("offload", "onload"):
                    def counted(fn=getattr(pol, name), m=pol.model_id, name=name):
                        moves.append((m, name))
                        return fn()
                    setattr(pol, name, counted)
            tr.run()
            assert tr.placement[PAIR[0]]["layout"] == layout
            weights = {m: {k: v.clone() for k, v in p.model.state_dict().items()} for m, p in tr.policies.items()}
            runs[layout] = (records(tr.run_dir), weights, moves, tr.run_dir)
        finally:
            tr.close()
    (res, w_res, moves_res, _), (off, w_off, moves_off, run_dir) = runs["resident"], runs["offload"]
    assert moves_res == [] and len(res) == 4
    # offload: each model goes out when the other becomes active and comes back when it is needed, every step
    assert moves_off.count((PAIR[0], "offload")) >= 2 and moves_off.count((PAIR[1], "onload")) >= 2
    assert res == off, "the offload layout changes nothing the run computes"
    for m in PAIR:
        assert all(torch.equal(w_res[m][k], w_off[m][k]) for k in w_res[m])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["placement"][PAIR[1]]["layout"] == "offload"
    assert "host memory" in summary["placement"][PAIR[1]]["optimizer_state"]
    assert summary["compute"]["models"][PAIR[0]]["phases"]["offload"]["wall_s"] > 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["time/offload"] >= 0 for r in rows)
