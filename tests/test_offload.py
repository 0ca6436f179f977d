"""run.layout offload (graftzoo.training.placement.Residency, Policy.offload / onload): the idle model's training
state (parameters, buffers, AdamW's moments) leaves for host memory and comes back bit for bit, a pass over an
offloaded model is refused, gradients are freed after every optimizer step, and a co-trained run in the offload
layout is the resident run, metric for metric and weight for weight. On this CPU machine host memory and the
device are the same RAM: what is checked is the bookkeeping (every tensor moved to a new buffer and back, nothing
left behind, nothing computed on a model that is away); the memory it frees on a GPU is bench/gpu_check.py's."""
import json

import pytest
import torch

from graftzoo.contract.config import load_config
from graftzoo.training.trainer import Trainer

PAIR = ["micro-qwen-char", "micro-gpt2-pair"]


def micro_cfg(tmp_path, *overrides, algo="graft"):
    return load_config(pair="micro", algo=algo, overrides=[f"run.out_dir={tmp_path}", "run.track=false",
                                                          "run.eval_at_end=false", "peer.source=online",
                                                          "run.device=cpu", *overrides])


def state_of(pol) -> list:
    """Copies of a policy's training state, in ``_state_tensors`` order."""
    return [t.detach().clone() for t in pol._state_tensors()]


def test_offload_moves_every_state_tensor_out_and_back_bit_for_bit(tmp_path):
    tr = Trainer(micro_cfg(tmp_path, "run.steps=1"))
    try:
        tr.run()
        pol = tr.policies[PAIR[0]]
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
    finally:
        tr.close()


def records(run_dir) -> list:
    """metrics.jsonl without the timings (wall-clock) and the offload's own time."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


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
