"""theta_old log-probs (docs/algorithms.md#notation-and-conventions): the engine records the log-prob of the
distribution it actually sampled (renormalised after top-p / top-k), and with ``rollout.recompute_old_logp`` the own
rollouts carry the training path's (``Policy.logprobs`` through ``score_sequences``) as ``Rollout.theta_old`` (their
``logprobs`` never rewritten) before the exchange and the update, so that the first minibatch's ratio is exactly 1
in any precision; ``rollout/logp_diff_max`` is logged on every step."""
import copy
import json

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from test_engine import PROMPTS, tiny_policy
from test_graft import STRONG_PAIR
from helpers import one_run

from graftzoo.contract.config import ConfigError, load_config, with_values
from graftzoo.training.engines.engine import Engine, HFEngine
from graftzoo.training.models import loss as loss_mod
from graftzoo.training.learning.step import old_logp_source
from graftzoo.training.trainer import Trainer, train

LEARNER = "micro-qwen-char"


def micro_cfg(tmp_path, *overrides, algo="grpo"):
    return load_config(pair="micro", algo=algo, overrides=[f"run.out_dir={tmp_path}", "run.track=false",
                                                          "run.eval_at_end=false", *overrides])


def test_top_p_records_the_log_prob_of_the_renormalised_cut_distribution():
    pol = tiny_policy(sharpen=3.0)
    T, top_p = 0.8, 0.5
    torch.manual_seed(0)
    groups = HFEngine(pol, temperature=T, top_p=top_p, max_new_tokens=4).generate(PROMPTS, 4)
    gap, checked = 0.0, 0
    for r in (r for g in groups for r in g.rollouts):
        P = len(r.prompt_token_ids)
        with torch.no_grad():  # one row, no padding: a plain forward pass of the whole sequence
            logits = pol.model(input_ids=torch.tensor([r.prompt_token_ids + r.token_ids])).logits[0].float()
        for t, tok in enumerate(r.token_ids):
            probs = F.softmax(logits[P - 1 + t] / T, -1)
            order = probs.argsort(descending=True)
            before = probs[order].cumsum(0) - probs[order]      # mass of the more likely tokens
            kept = order[before < top_p]                        # the smallest head holding >= top_p
            assert tok in set(kept.tolist()), "sampled a token outside the top-p head"
            want = float(torch.log(probs[tok] / probs[kept].sum()))
            assert r.logprobs[t] == pytest.approx(want, abs=1e-4)
            gap = max(gap, abs(want - float(torch.log(probs[tok]))))
            checked += 1
    assert checked > 10 and gap > 0.05  # the renormalisation is visible: the uncut log-prob would fail


def test_auto_resolves_on_unless_the_engine_is_the_fp32_training_model_sampling_uncut():
    pol = tiny_policy()
    base = load_config(pair="micro", algo="grpo")

    def on(eng, policy=pol, **rollout):
        r = {"recompute_old_logp": "auto", "engine": "hf", "top_p": 1.0, "top_k": 0, **rollout}
        source = old_logp_source(with_values(base, {f"rollout.{k}": v for k, v in r.items()}), policy, eng)
        assert source in ("training", "engine")
        return source == "training"
    assert on(HFEngine(pol)) is False
    assert on(HFEngine(pol, top_p=0.9), top_p=0.9) is True
    assert on(HFEngine(pol, top_k=5), top_k=5) is True
    assert on(HFEngine(pol, min_new_tokens=2)) is True               # EOS masked: another distribution
    assert on(HFEngine(tiny_policy())) is True                       # decodes with another model object
    other = Engine()  # any engine that decodes with a copy of the weights (vLLM), here of this very policy
    other.policy = pol
    assert on(other) is True
    assert on(HFEngine(pol), recompute_old_logp=False, top_p=0.5) is False
    assert on(HFEngine(pol), recompute_old_logp=True) is True
    bf = tiny_policy()
    bf.model.to(torch.bfloat16)
    assert on(HFEngine(bf), policy=bf) is True                       # not float32
    with pytest.raises(ConfigError, match="rollout.recompute_old_logp"):
        load_config(pair="micro", algo="grpo", overrides=["rollout.recompute_old_logp=always"])


def one_step(tmp_path, *overrides, bf16=False):
    tr = Trainer(micro_cfg(tmp_path, f"pair.train=[{LEARNER}]", "optim.minibatches=1", *overrides))
    if bf16:
        tr.policies[LEARNER].model.to(torch.bfloat16)  # parameters cast in place: the optimizer keeps them
    return tr.train_step(0)[LEARNER]


@pytest.mark.parametrize("setting,bf16", [(["rollout.recompute_old_logp=auto"], True),
                                          (["rollout.top_p=0.5"], False)])
def test_recompute_makes_the_first_ratio_exactly_one(tmp_path, setting, bf16):
    """bf16 decoding (KV cache) or a top-p cut: the recorded log-probs are not the update's; recomputed
    (``auto`` is on in both cases) the single minibatch's ratio is exactly 1 and nothing is clipped."""
    met = one_step(tmp_path / "on", *setting, bf16=bf16)
    assert met["rollout/logp_diff_max"] > 1e-4                 # the mismatch that the recompute removes
    assert met["ratio/mean"] == 1.0
    assert met["clip/frac"] == 0.0 and met["clip/frac_low"] == 0.0 and met["clip/frac_high"] == 0.0
    off = one_step(tmp_path / "off", *setting, "rollout.recompute_old_logp=false", bf16=bf16)
    assert off["rollout/logp_diff_max"] == met["rollout/logp_diff_max"]   # same seed, same rollouts
    assert off["ratio/mean"] != 1.0                          # decoding log-probs as theta_old: the ratio is off


@pytest.mark.parametrize("top_p,bf16", [(0.9, False), (1.0, True)])
def test_every_minibatch_is_recomputed_on_its_own_rows_own_and_peer(tmp_path, top_p, bf16):
    """Several minibatches, own and grafted rows, bf16, lr 0 (theta never leaves theta_old): every ratio is 1
    (``auto`` is on for a top-p cut and for bf16). The first minibatch's base is its own loss forward's (exactly 1
    by construction); the later ones' are the values computed once in phase 1 and at localization, which these
    CPU kernels give bitwise whatever the batch shape (test_old_logp_once.py shifts them to tell the two apart)."""
    (tmp_path / "strong.yaml").write_text(STRONG_PAIR)
    cfg = load_config(pair="micro", algo="graft", files=[tmp_path / "strong.yaml"],
                      overrides=[f"run.out_dir={tmp_path}", "run.track=false", "peer.source=online",
                                 "optim.minibatches=4", "optim.lr=0.0", "algo.delta=0.0", f"rollout.top_p={top_p}"])
    tr = Trainer(cfg)
    if bf16:
        for pol in tr.policies.values():
            pol.model.to(torch.bfloat16)
    mets = tr.train_step(0)
    for met in mets.values():
        assert met["ratio/mean"] == 1.0 and met["clip/frac"] == 0.0
    assert any(met["tokens/peer_share"] for met in mets.values())   # grafted rows were in the minibatches


def test_peer_l_p_and_the_store_use_the_recomputed_theta_old(tmp_path, monkeypatch):
    """With the recompute on, the groups every model hands to the peer source (the peer's l_P, its per-token
    log-probs for T2) and to the store carry the training-path log-probs as ``theta_old``, which is what readers take
    (``old_logprobs``); the engine's ``logprobs`` are never rewritten (neither the collected rollouts nor the ones
    handed on). Off, no rollout carries ``theta_old``."""
    seen, collected = {}, {}
    for mode in ("true", "false"):
        tr = Trainer(micro_cfg(tmp_path / mode, "peer.source=online", "rollout.top_p=0.5",
                               f"rollout.recompute_old_logp={mode}", algo="graft"))
        observe = tr.peers.observe
        for m, learner in tr.learners.items():
            def collect(ctx, prompts, _real=learner.collect, _key=(mode, m)):
                groups = _real(ctx, prompts)  # the engine's rollouts, scored: their log-probs as recorded
                collected[_key] = [(r, list(r.logprobs)) for g in groups for r in g.rollouts]
                return groups
            monkeypatch.setattr(learner, "collect", collect)

        def spy(groups_by_model, _tr=tr, _observe=observe, _mode=mode):
            for m, gs in groups_by_model.items():
                rolls = [r for g in gs for r in g.rollouts]
                lps, _ = _tr.policies[m].score_sequences([r.prompt_token_ids for r in rolls],
                                                         [r.token_ids for r in rolls])
                seen[_mode, m] = ([r.old_logprobs for r in rolls], lps, [r.logp_sum for r in rolls],
                                  [r.logprobs for r in rolls], [r.theta_old for r in rolls])
            _observe(groups_by_model)
        tr.peers.observe = spy
        tr.train_step(0)
    for key, rolls in collected.items():
        assert all(r.logprobs == lp for r, lp in rolls), key            # no rewrite in place
        assert seen[key][3] == [lp for _, lp in rolls], key              # the rollouts handed on: the engine's
    for m in ("micro-qwen-char", "micro-gpt2-pair"):
        got, want, _, engine, carried = seen["true", m]
        assert got == want                                   # exactly the training path's values
        assert carried == want                               # carried as theta_old ...
        assert engine != want                                # ... the engine's (top-p renormalised) values kept
        got_off, want_off, _, engine_off, carried_off = seen["false", m]
        assert got_off != want_off                           # off: the decoding (top-p renormalised) values
        assert got_off == engine_off and carried_off == [None] * len(got_off)
        assert engine_off == engine                          # same seed, same rollouts: logprobs not rewritten
    store = pd.read_parquet(one_run(tmp_path / "true", "graft-micro-online-*-s0") / "store" / "micro-gpt2-pair")
    assert sorted(store["logp_sum"]) == sorted(seen["true", "micro-gpt2-pair"][2])


def test_logp_diff_max_is_logged_on_every_step(tmp_path):
    out = train(micro_cfg(tmp_path, "run.steps=2"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 4 and all(r["rollout/logp_diff_max"] is not None for r in rows)
    # the default CPU setting (the fp32 training model decodes uncut) keeps decoding log-probs: they agree
    assert max(r["rollout/logp_diff_max"] for r in rows) < 1e-4


def test_theta_old_is_the_pre_update_policy_in_every_minibatch_own_and_peer_rows(tmp_path, monkeypatch):
    """theta_old of a rollout batch is computed once, before its first optimizer step, for every minibatch: with
    lr > 0 and two minibatches (own groups, then the grafted ones: peer-last), the second minibatch, trained after
    the first step moved the policy, still takes its ratio against the pre-update policy. Peer rows get it like own
    rows: the learner's own log-probs of the peer's text in its tokenizer, never a given base (the peer's
    behaviour log-probs). The base the loss used (``ratio_base``'s value in the step's ``micro_batch_loss``): the
    first minibatch's is its own forward's, bit for bit (``base_from_forward``); a later one's is the value the rows
    arrived with (``MiniBatch.old_logp``, computed once before the update: phase 1, localization), equal to this
    minibatch's own forward under theta_old up to the rounding of another batch shape, on its response tokens."""
    (tmp_path / "strong.yaml").write_text(STRONG_PAIR)
    cfg = load_config(pair="micro", algo="graft", files=[tmp_path / "strong.yaml"],
                      overrides=[f"run.out_dir={tmp_path}", "run.track=false", "peer.source=online",
                                 "optim.minibatches=2", "optim.lr=0.01", "algo.delta=0.0",
                                 "rollout.recompute_old_logp=true"])
    tr = Trainer(cfg)
    seen, start, moved, flags, bases = {m: [] for m in tr.model_ids}, {}, {}, {}, []
    for m in tr.model_ids:
        pol = tr.policies[m]

        def update(ctx, lrn, mbs, base_from_forward, where, _m=m, _pol=pol, _update=pol.update):
            start[_m] = copy.deepcopy(_pol.model.state_dict())   # the policy that sampled: theta_old
            flags[_m] = base_from_forward
            return _update(ctx, lrn, mbs, base_from_forward, where=where)
        monkeypatch.setattr(pol, "update", update)

    def base_spy(mb, logp, from_forward, _real=loss_mod.ratio_base):
        out = _real(mb, logp, from_forward)
        bases.append((from_forward, out.detach().clone()))
        return out

    def loss(ctx, policy, learner, mb, base_from_forward=False, _real=loss_mod.micro_batch_loss):
        m = ctx.model_id
        if ctx.update == 1 and m not in moved:
            moved[m] = any(not torch.equal(p, start[m][n]) for n, p in tr.policies[m].model.state_dict().items())
        arrived = mb.old_logp.clone()
        out = _real(ctx, policy, learner, mb, base_from_forward)
        assert torch.equal(mb.old_logp, arrived)                    # the loss leaves the rows' base as they came
        ff, base = bases.pop()
        assert not bases and ff == base_from_forward
        seen[m].append((ctx.update, mb, base, ff))                  # the ratio base the loss used
        return out
    monkeypatch.setattr(loss_mod, "ratio_base", base_spy)
    monkeypatch.setattr(loss_mod, "micro_batch_loss", loss)
    tr.train_step(0)
    peer_rows = 0
    for m in tr.model_ids:
        pol = tr.policies[m]
        assert moved[m]                                    # the first optimizer step changed the policy
        assert flags[m] is True                            # theta_old from the training path: the named choice
        assert sorted({u for u, _, _, _ in seen[m]}) == [0, 1]
        pol.model.load_state_dict(start[m])
        for u, mb, old, ff in seen[m]:
            with torch.no_grad():
                want, _ = pol.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
            assert not bool(mb.given_old.any())            # T1: no row keeps a given ratio base
            real = mb.loss_mask > 0
            assert ff == (u == 0)                          # only the first minibatch's base is from its forward
            if u == 0:                                     # the pre-update policy, this very minibatch's forward
                assert torch.equal(old, want), (m, u)
            else:                                          # the pre-update policy (phase 1's pass), not the moved one
                assert torch.equal(old, mb.old_logp), (m, u)                  # the values the rows arrived with
                assert torch.allclose(old[real], want[real], atol=1e-5), (m, u)
            peer_rows += int(mb.is_peer.sum())
    assert peer_rows > 0
