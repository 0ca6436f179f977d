"""theta_old once per step (docs/algorithms.md#notation-and-conventions), through the trainer as a user drives it:
each row's old log-probs come from one pass of the update's own forward code (phase 1 for own rows, localization
for peer rows), the update adds no pass of its own, its first minibatch takes the ratio base from its own loss
forward (ratio exactly 1, also in bfloat16), the later ones take theirs against theta_old, and a seeded step's
metrics and weights are those of the two-pass computation this replaced (``two_pass_optimize``) to rounding. The
rows' ratio base is data: no loss rewrites ``MiniBatch.old_logp``; the first minibatch's base from its own forward is
the step's named choice (``base_from_forward``)."""
import math
from collections import Counter

import pytest
import torch
from helpers import theta_old_base
from test_graft import STRONG_PAIR

from graftzoo.contract.batch import micro_split
from graftzoo.contract.config import load_config
from graftzoo.training.models import loss as loss_mod
from graftzoo.training.models import policy as policy_mod
from graftzoo.training.trainer import Trainer

LEARNER = "micro-qwen-char"
CLIP_KEYS = ("clip/frac", "clip/frac_low", "clip/frac_high")


def two_pass_optimize(ctx, policy, learner, minibatches, base_from_forward, where, _optimize=loss_mod.optimize):
    """The update as it was before theta_old was computed once: a no-grad pass over every micro-batch of every
    minibatch before the first optimizer step (``theta_old_base``), then the step's loop (``optimize``, one
    optimizer step per minibatch) on those bases, none taken from a loss forward."""
    if base_from_forward:
        for micros in minibatches:
            for mb in micros:
                mb.old_logp = theta_old_base(policy, mb)
    return _optimize(ctx, policy, learner, minibatches, False, where)


def strong_cfg(tmp_path, algo, *overrides):
    """The micro pair warmed up to solve some prompts (``STRONG_PAIR``: mixed groups, so the steps move the
    weights), two minibatches, lr 0.01."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "strong.yaml").write_text(STRONG_PAIR)
    return load_config(pair="micro", algo=algo, files=[tmp_path / "strong.yaml"], overrides=[
        f"run.out_dir={tmp_path}", "run.track=false", "optim.minibatches=2", "optim.lr=0.01", *overrides])


def grpo_trainer(tmp_path, *overrides):
    """One model (GRPO); top-p 0.5: ``recompute_old_logp: auto`` is on."""
    return Trainer(strong_cfg(tmp_path, "grpo", f"pair.train=[{LEARNER}]", "rollout.top_p=0.5", *overrides))


def grpo_micro_trainer(tmp_path, *overrides):
    """GRPO with micro-batches of at most 256 padded tokens: several scoring passes and update micro-batches."""
    return grpo_trainer(tmp_path, "optim.max_tokens_per_micro=256", *overrides)


def graft_trainer(tmp_path, *overrides):
    """Two models trained with GRAFT and a live peer, every peer response admitted (delta 0): own groups, then the
    grafted ones (peer-last); top-p 0.9: the recompute is on."""
    return Trainer(strong_cfg(tmp_path, "graft", "peer.source=online", "algo.delta=0.0", "rollout.top_p=0.9",
                              *overrides))


def peer_trainer(algo):
    """A pair trained with ``algo`` and a live peer (HACPO, SGT: peer rows localized, as GRAFT's)."""
    def make(tmp_path, *overrides):
        return Trainer(strong_cfg(tmp_path, algo, "peer.source=online", "rollout.top_p=0.9", *overrides))
    return make


def watch_losses(monkeypatch) -> list:
    """The probes (``StepProbe``) that the step's losses are reported to: the step's ``micro_batch_loss`` and the
    ratio base it takes (``graftzoo.training.models.loss.ratio_base``) spied once per test. Each loss call reports its
    minibatch index, metrics, micro-batch, the base its rows arrived with and the base the loss used; it leaves the
    rows' base as it found it and takes its base once, from its forward exactly when ``base_from_forward``."""
    probes = getattr(loss_mod.micro_batch_loss, "probes", None)
    if probes is not None:
        return probes
    probes, used = [], []

    def ratio_base(mb, logp, from_forward, _real=loss_mod.ratio_base):
        out = _real(mb, logp, from_forward)
        used.append((from_forward, out.detach().clone()))
        return out

    def micro_batch_loss(ctx, policy, learner, mb, base_from_forward=False, _real=loss_mod.micro_batch_loss):
        arrived = mb.old_logp.clone()
        out = _real(ctx, policy, learner, mb, base_from_forward)
        (from_forward, base), = used
        used.clear()
        assert from_forward == base_from_forward and torch.equal(mb.old_logp, arrived)  # the rows' base kept
        for probe in probes:
            if probe.tr.policies.get(ctx.model_id) is policy:
                probe.losses[ctx.model_id].append((ctx.update, out[1], mb, arrived, base))
        return out

    micro_batch_loss.probes = probes
    monkeypatch.setattr(loss_mod, "ratio_base", ratio_base)
    monkeypatch.setattr(loss_mod, "micro_batch_loss", micro_batch_loss)
    return probes


class StepProbe:
    """What one training step does with theta_old, per trained model: the forward passes of the model outside
    decoding (a forward pre-hook; the engine decodes with ``use_cache=True``), the sequences each
    ``score_sequences`` call scored and the forwards it took, the micro-batches the update got, and for each loss
    call its minibatch index, metrics, micro-batch, the ratio base its rows arrived with and the one the loss used
    (``watch_losses``)."""

    def __init__(self, tr, monkeypatch, update=None):
        self.tr = tr
        self.forwards = {m: 0 for m in tr.model_ids}
        self.scored = {m: [] for m in tr.model_ids}   # (prompt ids, response ids) per scored sequence
        self.score_forwards = {m: 0 for m in tr.model_ids}
        self.update_micros = {m: 0 for m in tr.model_ids}
        self.losses = {m: [] for m in tr.model_ids}
        self.start = {}
        self.base_from_forward = {}
        if update is not None:
            monkeypatch.setattr(policy_mod, "optimize", update)
        watch_losses(monkeypatch).append(self)
        for m in tr.model_ids:
            self._probe(m, tr.policies[m], monkeypatch)

    def _probe(self, m, pol, monkeypatch):
        def count(module, args, kwargs):
            if not kwargs.get("use_cache"):
                self.forwards[m] += 1
        pol.model.register_forward_pre_hook(count, with_kwargs=True)

        def score_sequences(prompts, responses, _real=pol.score_sequences, **kw):
            self.scored[m] += [(tuple(p), tuple(r)) for p, r in zip(prompts, responses)]
            parts = micro_split([len(p) + len(r) for p, r in zip(prompts, responses)], pol.max_tokens_per_micro)
            self.score_forwards[m] += sum(math.ceil(len(part) / kw.get("chunk", 256)) for part in parts)
            return _real(prompts, responses, **kw)
        monkeypatch.setattr(pol, "score_sequences", score_sequences)

        def update(ctx, lrn, mbs, base_from_forward, where, _real=pol.update):
            self.start[m] = {k: v.clone() for k, v in pol.model.state_dict().items()}  # theta_old
            self.update_micros[m] = sum(len(micros) for micros in mbs)
            self.base_from_forward[m] = base_from_forward
            return _real(ctx, lrn, mbs, base_from_forward, where=where)
        monkeypatch.setattr(pol, "update", update)

    def step(self) -> dict:
        return self.tr.train_step(0)


def numbers(met: dict) -> dict:
    """A step's metrics without the timings."""
    return {k: v for k, v in met.items() if not k.startswith(("time/", "perf/", "async/overlap_s")) and isinstance(v, (int, float))}


def assert_same_step(new: StepProbe, ref: StepProbe, mets: dict, ref_mets: dict):
    """The seeded step's metrics and updated weights are the two-pass computation's, to rounding."""
    for m in new.tr.model_ids:
        a, b = numbers(mets[m]), numbers(ref_mets[m])
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (m, k)
        ours, theirs = new.tr.policies[m].model.state_dict(), ref.tr.policies[m].model.state_dict()
        assert all(torch.allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-7) for k in ours), m


def assert_theta_old_once(probe: StepProbe, ref: StepProbe, mets: dict, algo: str):
    """Per model: the scoring passes scored each of the step's rollouts once (its own, then the localized peer
    ones) and every trained row among them; the model's forwards are exactly those passes plus one per update
    micro-batch; the two-pass update took one more per micro-batch."""
    for m in probe.tr.model_ids:
        met = mets[m]
        localized = met.get("xt/responses", 0) - met.get("xt/dropped", 0)
        assert len(probe.scored[m]) == met["rollouts/generated"] + localized, m   # each rollout scored once
        rows = Counter(tuple(mb.input_ids[b][mb.attention_mask[b].bool()].tolist())
                       for _, _, mb, _, _ in probe.losses[m] for b in range(len(mb)))
        assert not rows - Counter(p + r for p, r in probe.scored[m]), m       # each trained row has its pass
        want = probe.score_forwards[m] + probe.update_micros[m]
        assert probe.forwards[m] == want, (m, probe.forwards[m], want)
        assert ref.forwards[m] == want + ref.update_micros[m], m              # before: a recompute per micro-batch
        print(f"{algo} {m}: forwards per step {ref.forwards[m]} before, {probe.forwards[m]} after "
              f"(scoring {probe.score_forwards[m]} for {len(probe.scored[m])} rollouts, {localized} of them "
              f"localized; update {probe.update_micros[m]})")


def assert_first_ratio_is_one_and_later_bases_are_theta_old(probe: StepProbe):
    """The first minibatch's ratio base is its loss forward's own (a token ratio of exactly 1, nothing clipped);
    a later minibatch's base is the rows' arrived values (no pass), the pre-update policy's log-probs of those rows,
    not the moved weights'."""
    tr = probe.tr
    for m in tr.model_ids:
        pol = tr.policies[m]
        updates = sorted({u for u, *_ in probe.losses[m]})
        assert updates[0] == 0 and len(updates) >= 2, (m, updates)
        moved = {k: v.clone() for k, v in pol.model.state_dict().items()}
        assert any(not torch.equal(moved[k], probe.start[m][k]) for k in moved), m   # the steps moved the policy
        pol.model.load_state_dict(probe.start[m])
        for u, met, mb, before, after in probe.losses[m]:
            with torch.no_grad():
                fwd, _ = pol.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
            real = mb.loss_mask > 0
            if u == 0:
                assert torch.equal(after[real], fwd[real]), m                  # the loss forward's own values
                if not bool(mb.is_peer.any()):  # (HACPO's cross rows log their sequence ratio exp(l_L - l_P))
                    assert met["ratio/mean"] == 1.0 and all(met[k] == 0.0 for k in CLIP_KEYS), (m, met)
            else:
                assert torch.equal(after, before), m                           # no pass: the arrived values
                assert torch.allclose(after[real], fwd[real], atol=1e-4), m    # theta_old, not the moved weights
        pol.model.load_state_dict(moved)


@pytest.mark.parametrize("make,algo", [(grpo_trainer, "grpo"), (grpo_micro_trainer, "grpo"),
                                       (graft_trainer, "graft"), (peer_trainer("hacpo"), "hacpo"),
                                       (peer_trainer("sgt"), "sgt")])
def test_theta_old_once_per_step_first_ratio_one_same_step_as_two_passes(tmp_path, monkeypatch, make, algo):
    """GRPO (own rows only), and GRAFT, HACPO, SGT with a live peer (own and peer rows, each model both learner and
    peer): the step's forward passes, the first minibatch's ratio, and the step against the two-pass reference."""
    probe = StepProbe(make(tmp_path / "once"), monkeypatch)
    mets = probe.step()
    ref = StepProbe(make(tmp_path / "two"), monkeypatch, update=two_pass_optimize)
    ref_mets = ref.step()
    assert all(probe.base_from_forward.values()) and len(probe.base_from_forward) == len(probe.tr.model_ids)
    assert_theta_old_once(probe, ref, mets, algo)
    assert_first_ratio_is_one_and_later_bases_are_theta_old(probe)
    assert_same_step(probe, ref, mets, ref_mets)
    if algo != "grpo":
        assert any(mets[m]["xt/responses"] for m in probe.tr.model_ids)        # peer rows localized, scored once
    if algo == "graft":
        assert any(mets[m]["tokens/peer_share"] for m in probe.tr.model_ids)   # and trained


SHIFT = 0.25


def test_first_minibatch_base_is_its_own_forward_later_ones_the_arrived_theta_old(tmp_path, monkeypatch):
    """bfloat16, lr 0, four minibatches, GRAFT with grafted rows, and every row's arrived base shifted by +0.25
    before the update: the first minibatch's ratio is still exactly 1 (its base is its own loss forward, not the
    arrived values), each later minibatch's is exp(-0.25) (its base is the arrived one, untouched: no pass)."""
    tr = graft_trainer(tmp_path, "optim.minibatches=4", "optim.lr=0.0")
    for m, pol in tr.policies.items():
        pol.model.to(torch.bfloat16)

        def shifted(ctx, lrn, mbs, base_from_forward, where, _real=pol.update):
            for micros in mbs:
                for mb in micros:
                    mb.old_logp = torch.where(mb.given_old.unsqueeze(1), mb.old_logp, mb.old_logp + SHIFT)
            return _real(ctx, lrn, mbs, base_from_forward, where=where)
        monkeypatch.setattr(pol, "update", shifted)
    probe = StepProbe(tr, monkeypatch)
    probe.step()
    for m in tr.model_ids:
        pol = tr.policies[m]
        assert sorted({u for u, *_ in probe.losses[m]})[-1] >= 1, m
        for u, met, mb, before, after in probe.losses[m]:
            with torch.no_grad():
                fwd, _ = pol.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
            real = mb.loss_mask > 0
            if u == 0:
                assert met["ratio/mean"] == 1.0 and all(met[k] == 0.0 for k in CLIP_KEYS), (m, met)
                assert torch.equal(after[real], fwd[real]), m
            else:
                assert torch.equal(after, before), m
                assert met["ratio/mean"] == pytest.approx(math.exp(-SHIFT), rel=1e-3), (m, u)


def test_recompute_off_keeps_the_arrived_bases_and_the_step(tmp_path, monkeypatch):
    """``rollout.recompute_old_logp=false``: no row's base is taken from a forward (the engine's log-probs stay
    the own rows' base), and the step is the two-pass code's bit for bit (it recomputed nothing either)."""
    probe = StepProbe(grpo_trainer(tmp_path / "once", "rollout.recompute_old_logp=false"), monkeypatch)
    mets = probe.step()
    ref = StepProbe(grpo_trainer(tmp_path / "two", "rollout.recompute_old_logp=false"), monkeypatch,
                    update=two_pass_optimize)
    ref_mets = ref.step()
    assert probe.base_from_forward == {LEARNER: False}
    assert all(torch.equal(before, after) for *_, before, after in probe.losses[LEARNER])
    assert numbers(mets[LEARNER]) == numbers(ref_mets[LEARNER])
    assert ref.forwards[LEARNER] == probe.forwards[LEARNER]
    assert mets[LEARNER]["ratio/mean"] != 1.0   # decoding log-probs (top-p renormalised) as the base
