"""Transfer-path diagnostics (``run.diagnostics``, graftzoo.training.learning.diagnostics) through the real trainer on the
micro pair: the ``diag/*`` keys, the gradient split of own and peer rows, the log-prob of admitted peer successes
before and after the update, the update bit-identical with diagnostics on or off, the ray refusal, and GRAFT's
always-on ``peer/admitted_succ`` / ``peer/admitted_fail`` counts."""
import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch

from graftzoo.training.learning import diagnostics
from graftzoo.contract.config import ConfigError, load_config
from graftzoo.training.learning.diagnostics import grad_share
from graftzoo.training.models.loss import denominators
from graftzoo.training.models.loss import optimize
from graftzoo.training.trainer import train
from graftzoo.eval.artifacts import load_runs
from graftzoo.eval.report import TRANSFER_COLUMNS, transfer_markdown, transfer_table

MODELS = ("micro-qwen-char", "micro-gpt2-pair")
# seed 10, 16 prompts of 1-digit problems: at step 0 both micro models have an all-fail group that the other's mixed
# group replaces (peer/rescued_groups 1 each) and informative own groups as well, so both gradient parts are non-zero
GRAFTED = ["task.difficulty=1", "task.prompts_per_step=16", "run.seed=10", "optim.minibatches=2"]
DIAG_KEYS = [f"diag/{k}" for k in ("grad_norm_own", "grad_norm_peer", "grad_share_peer")] + [
    f"diag/{s}_succ_logp_{w}" for s in ("own", "peer") for w in ("before", "after", "delta")]


def run(tmp_path, name, algo="graft", steps=2, *overrides) -> Path:
    peer = {"graft": ["peer.source=online", "algo.delta=0"],  # delta=0: every grafted response admitted
            "sgt": ["peer.source=online", "algo.mode=aux_nll"]}.get(algo, [])
    cfg = load_config(pair="micro", algo=algo, overrides=[
        *peer, f"run.out_dir={tmp_path}", f"run.name={name}", "run.track=false", f"run.steps={steps}",
        "run.eval_at_end=false", "run.save_every=0", *GRAFTED, *overrides])
    return train(cfg)


def records(run_dir) -> list:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def graft_runs(tmp_path_factory):
    """The same GRAFT run (2 steps) with diagnostics on and off."""
    out = tmp_path_factory.mktemp("diag")
    return {on: run(out, f"graft-{on}", "graft", 2, f"run.diagnostics={str(on).lower()}") for on in (True, False)}


def test_graft_logs_the_transfer_path(graft_runs):
    """With everything admitted (delta=0) on a step with grafted rows: a positive peer share of the gradient norm, the
    log-prob of the admitted peer successes moves across the update, and the admitted counts split by correctness."""
    recs = records(graft_runs[True])
    assert len(recs) == 4 and all(k in r for r in recs for k in DIAG_KEYS)
    grafted = [r for r in recs if r["step"] == 0]
    assert {r["model"] for r in grafted} == set(MODELS)
    for r in grafted:
        assert r["peer/rescued_groups"] >= 1 and r["peer/admitted_succ"] >= 1
        assert r["peer/admitted_succ"] + r["peer/admitted_fail"] == r["peer/admitted"]
        assert r["peer/rejected"] == 0 and r["peer/admit_rate_succ"] == 1.0  # delta=0: every grafted response
        assert r["diag/grad_norm_own"] > 0 and r["diag/grad_norm_peer"] > 0
        assert 0 < r["diag/grad_share_peer"] < 1
        assert r["diag/grad_share_peer"] == pytest.approx(
            r["diag/grad_norm_peer"] / (r["diag/grad_norm_own"] + r["diag/grad_norm_peer"]))
        # the update trained on them: the admitted peer successes' log-prob changed, the delta is after - before
        assert r["diag/peer_succ_logp_before"] < 0 and r["diag/peer_succ_logp_after"] != r["diag/peer_succ_logp_before"]
        assert r["diag/peer_succ_logp_delta"] == pytest.approx(
            r["diag/peer_succ_logp_after"] - r["diag/peer_succ_logp_before"])
    for r in recs:
        if r["peer/admitted"] == 0:  # no peer row with a weight: no peer part, no share, no peer log-prob
            assert r["diag/grad_norm_peer"] is None and r["diag/grad_share_peer"] is None
            assert r["diag/peer_succ_logp_before"] is None and r["diag/peer_succ_logp_delta"] is None
        for k in ("diag/own_succ_logp_delta", "diag/peer_succ_logp_delta"):
            assert r[k] is None or math.isfinite(r[k])


def test_update_is_bit_identical_with_diagnostics_on_or_off(graft_runs):
    on, off = records(graft_runs[True]), records(graft_runs[False])
    assert all(not any(k.startswith("diag/") for k in r) for r in off)  # off: the keys are absent
    for a, b in zip(on, off, strict=True):
        same = {k for k in a if not k.startswith(("diag/", "time/", "perf/", "async/overlap_s"))}
        assert same == set(b) - {k for k in b if k.startswith(("time/", "perf/", "async/overlap_s"))}
        assert {k: a[k] for k in same} == {k: b[k] for k in same}
    for m in MODELS:
        sa, sb = (torch.load(d / "checkpoints/step_000001" / f"{m}.pt", weights_only=True)["policy"]
                  for d in (graft_runs[True], graft_runs[False]))
        assert sa["model"].keys() == sb["model"].keys()
        assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
        assert all(torch.equal(x, y) for i in sa["optimizer"]["state"]
                   for x, y in zip(sa["optimizer"]["state"][i].values(), sb["optimizer"]["state"][i].values()))


def test_grpo_has_no_peer_part(tmp_path):
    recs = records(run(tmp_path, "grpo", "grpo", 1, "run.diagnostics=true"))
    assert len(recs) == 2 and all(k in r for r in recs for k in DIAG_KEYS)
    for r in recs:
        assert r["diag/grad_norm_peer"] is None and r["diag/grad_share_peer"] is None
        assert r["diag/peer_succ_logp_before"] is None and r["diag/peer_succ_logp_after"] is None
    assert any(r["diag/grad_norm_own"] > 0 for r in recs)


def test_sgt_counts_successes_and_its_aux_rows_are_peer_rows(tmp_path):
    """SGT transfers successes only; its NLL rows (role aux, ``mode=aux_nll``) are peer-source rows of the split."""
    recs = records(run(tmp_path, "sgt", "sgt", 1, "run.diagnostics=true"))
    assert len(recs) == 2
    for r in recs:
        assert r["peer/admitted_succ"] == r["peer/admitted"] and r["peer/admitted_fail"] == 0
        if r["peer/admitted"]:
            assert r["diag/grad_norm_peer"] > 0 and r["diag/peer_succ_logp_delta"] > 0  # the NLL raised them
    assert sum(r["peer/admitted"] for r in recs) > 0


class GradientsOnly:
    """``policy`` whose optimizer step is replaced by adding each minibatch's accumulated gradients to ``grads``
    (the weights stay where they are), for the step's own loop (``optimize``) to run on."""

    def __init__(self, policy):
        self.policy = policy
        self.grads = [torch.zeros_like(p) for p in policy.model.parameters()]

    def apply_gradients(self, total, where=""):
        for acc, p in zip(self.grads, self.policy.model.parameters()):
            if p.grad is not None:
                acc += p.grad
        return 0.0

    def __getattr__(self, name):
        return getattr(self.policy, name)


def test_own_and_peer_parts_add_up_to_the_update_gradient(tmp_path, monkeypatch):
    """The split carries each minibatch's denominators: the own part's gradient plus the peer part's is the gradient
    the step's own loop (``optimize``, its optimizer steps left out) takes over the step's minibatches and
    micro-batches, as the step builds them."""
    checked = []
    real = diagnostics.before_update

    def check(ctx, pol, learner, batch, schedule, budget, base_from_forward):
        update = ctx.update
        parts = diagnostics.split_by_source(ctx, learner, batch, schedule, budget, pol.device)
        assert all(parts.values())  # both sources present (seed 4, step 0)
        pol.zero_grad()
        for part in parts.values():
            diagnostics.accumulate_part(ctx, pol, learner, part, base_from_forward)
        split = [p.grad.clone() for p in pol.model.parameters()]
        pol.zero_grad()
        mbs = [[mb.to(pol.device) for mb in batch.micro_batches(idx, budget, partial(denominators, ctx, learner))]
               for idx in schedule]
        frozen = GradientsOnly(pol)
        before = [p.detach().clone() for p in pol.model.parameters()]
        optimize(ctx, frozen, learner, mbs, base_from_forward, "test")
        assert all(torch.equal(a, p) for a, p in zip(before, pol.model.parameters()))  # no optimizer step
        pol.zero_grad()
        ctx.update = update
        assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(split, frozen.grads))
        checked.append(len(schedule))
        return real(ctx, pol, learner, batch, schedule, budget, base_from_forward)

    monkeypatch.setattr(diagnostics, "before_update", check)
    run(tmp_path, "split", "graft", 1, "run.diagnostics=true", "optim.max_tokens_per_micro=256")
    assert checked == [2, 2]  # both models, two minibatches each


def test_grad_share():
    assert grad_share(3.0, 1.0) == 0.25
    assert grad_share(0.0, 2.0) == 1.0 and grad_share(None, 2.0) == 1.0
    assert grad_share(2.0, None) is None and grad_share(0.0, 0.0) is None


def test_ray_backend_refuses_diagnostics():
    with pytest.raises(ConfigError, match=r"^config key 'run.diagnostics' needs run.backend=inprocess"):
        load_config(pair="micro", algo="grpo", overrides=["run.backend=ray", "run.diagnostics=true"])
    assert load_config(pair="micro", algo="grpo").run.diagnostics is False


def test_report_transfer_table_averages_the_logged_steps(graft_runs):
    """transfer.md's table (``graftzoo report`` / ``grid``): per model, each metric's mean over the run's logged
    steps (None steps left out), read back from the run's own metrics.jsonl."""
    table = transfer_table(load_runs([graft_runs[True]]))
    assert [(m, p) for _, m, p, _, _ in table.rows] == [(MODELS[1], MODELS[0]), (MODELS[0], MODELS[1])]
    recs = records(graft_runs[True])
    for _, model, _, seeds, stats in table.rows:
        assert seeds == [10]
        for (header, key), st in zip(TRANSFER_COLUMNS, stats):
            vals = [r[key] for r in recs if r.get("model") == model and r.get(key) is not None]
            assert (st.mean is None) == (not vals), header
            if vals:
                assert st.mean == pytest.approx(sum(vals) / len(vals)), header
    md = transfer_markdown(table)
    assert md.splitlines()[0].startswith("| Method | Model | Peer | Seeds | grafted groups |") and "| graft (n=" in md
    assert transfer_table(load_runs([graft_runs[False]])).rows[0][4][6].mean is None  # no diag/* with it off
