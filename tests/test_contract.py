"""The data contract (graftzoo.contract.types, README "Architecture"): what crosses a learner hook is plain,
picklable data with typed fields, through the trainer's real step; the loss is built from its parts."""
import pickle
import random

import pytest
import torch
from test_graft import STRONG_PAIR  # the micro pair warmed up to have mixed groups

from graftzoo.algos.base import Learner, StepContext
from graftzoo.algos.functional import agg_loss, sequence_terms_as_tokens
from graftzoo.contract.batch import TrainBatch
from graftzoo.contract.config import LearnerFacts, load_config
from graftzoo.contract.registry import get_algo
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.trainer import Trainer
from graftzoo.contract.types import Group, Origin, Prompt, Rollout, TrainRow

HOOKS = ("collect", "advantages", "exchange", "build_batch", "schedule")


def tensors_in(obj, seen=None) -> list:
    """Every torch.Tensor reachable from ``obj`` through dataclass fields, dicts, lists and tuples."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v, seen)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v, seen)]
    if hasattr(obj, "__dataclass_fields__"):
        return [t for f in obj.__dataclass_fields__ for t in tensors_in(getattr(obj, f), seen)]
    return []


@pytest.mark.parametrize("algo,extra", [("graft", ["algo.token_ratio=cross_aligned"]), ("hacpo", []),
                                        ("sgt", ["algo.mode=aux_nll"])])
def test_what_crosses_a_hook_is_plain_picklable_data(tmp_path, monkeypatch, algo, extra):
    (tmp_path / "strong.yaml").write_text(STRONG_PAIR)
    cfg = load_config(pair="micro", algo=algo, files=[tmp_path / "strong.yaml"],
                      overrides=["peer.source=online", "run.track=false", f"run.out_dir={tmp_path}", "run.steps=1",
                                 "optim.minibatches=2", *extra])
    cls = get_algo(algo)
    crossed = []
    for hook in HOOKS:
        original = getattr(cls, hook)

        def spy(self, ctx, *args, _original=original, _hook=hook):
            out = _original(self, ctx, *args)
            crossed.append((_hook, args, out))
            return out
        monkeypatch.setattr(cls, hook, spy)
    trainer = Trainer(cfg)
    mets = trainer.train_step(0)
    assert {h for h, _, _ in crossed} == set(HOOKS)
    for hook, args, out in crossed:
        assert tensors_in((args, out)) == [], f"{hook} passes tensors"
        back = pickle.loads(pickle.dumps((args, out)))
        assert type(back[1]) is type(out)
    # the exchange really moved peer data, as typed fields: role, origin, one advantage channel
    slots = [out for h, _, out in crossed if h == "exchange"]
    peer_rolls = [r for step in slots for g in step for r in g.rollouts if r.role != "own"]
    assert peer_rolls and all(isinstance(r.origin, Origin) for r in peer_rolls)
    assert all(g.advantages is not None and len(g.advantages) == g.n for step in slots for g in step)
    rows = [row for h, _, out in crossed if h == "build_batch" for row in out.rows]
    assert {row.role for row in rows} >= {"own", "peer" if algo != "sgt" else "aux"}
    assert all(row.origin_mean_logp is not None for row in rows if row.role != "own")
    if algo == "graft":  # T2: the ratio base of grafted rows is the peer's aligned log-probs, not theta_old
        assert any(r.old_logp is not None for r in peer_rolls)
    assert all(m["loss"] is not None for m in mets.values())


def test_sequence_terms_keep_their_meaning_in_every_aggregation():
    """A sequence-level value (HACPO's cross term) is its row's per-token value
    (docs/algorithms.md#loss-aggregation)."""
    tok = torch.tensor([[1.0, 2.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    merged = sequence_terms_as_tokens(tok, torch.tensor([0.0, 5.0]), torch.tensor([False, True]))
    assert agg_loss(merged, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 5) / 2)
    assert agg_loss(merged, mask, "token-mean").item() == pytest.approx((3 + 15) / 5)
    assert agg_loss(merged, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 15) / 2)
    assert torch.equal(sequence_terms_as_tokens(tok), tok)
    with pytest.raises(ValueError, match="seq_rows"):
        sequence_terms_as_tokens(tok, torch.tensor([1.0, 2.0]))


class ConstPolicy:
    """log-probs = a learnable constant per token (enough for the loss parts)."""

    def __init__(self, value=-1.0):
        self.theta = torch.tensor(value, requires_grad=True)

    def logprobs(self, input_ids, attention_mask, resp_len, with_entropy=False, entropy_grad=True):
        logp = self.theta.expand(input_ids.shape[0], resp_len)
        return logp, (torch.ones_like(logp) if with_entropy else None)


def test_loss_parts_follow_the_row_roles():
    """own + peer rows: clipped surrogate, weighted; aux rows: weighted NLL only (the loss SGT names, whose
    ``aux_nll`` mode makes aux rows; out of the clipped surrogate of every loss); KL on own rows only."""
    cfg = load_config(pair="micro", algo="grpo")
    sgt = get_algo("sgt")
    learner = sgt(sgt.Config(mode="aux_nll"), LearnerFacts.of(cfg))
    grpo = Learner(get_algo("grpo").Config(), LearnerFacts.of(cfg))
    assert (learner.loss, grpo.loss) == ("sgt", "clipped")
    ctx = StepContext(step=0, epoch=0, run=LearnerFacts.of(cfg), policy=None, engine=None, env=None,
                      rng=random.Random(0))

    def row(role, adv, weight):
        return TrainRow([1], [2, 3], [-1.0, -1.0], [1.0, 1.0], [1.0, 1.0] if role == "own" else [0.0, 0.0],
                        adv, weight, role, 0)
    pol = ConstPolicy(-1.0)  # ratio 1 everywhere
    batch = TrainBatch([row("own", 1.0, 1.0), row("peer", 2.0, 0.5), row("aux", 0.0, 0.25)], [])
    loss, met = micro_batch_loss(ctx, pol, learner, batch.minibatch([0, 1, 2]))
    # token-mean over the 4 policy-gradient tokens: -(1*1 + 2*0.5) * 2 / 4; aux: -0.25 * l = 0.25
    assert loss.item() == pytest.approx(-1.0 + 0.25)
    assert met["loss/aux_nll"] == pytest.approx(1.0) and met["tokens/peer_share"] == pytest.approx(0.5)
    only_pg, _ = micro_batch_loss(ctx, pol, learner, batch.minibatch([0, 1]))
    assert only_pg.item() == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="learner 'grpo': rows of role aux reach policy loss 'clipped'"):
        micro_batch_loss(ctx, pol, grpo, batch.minibatch([0, 1, 2]))  # no term for them: refused, never dropped


def test_rollout_fields_replace_side_channels():
    r = Rollout(prompt_id="p", model_id="m", policy_version=0, text="1")
    assert not hasattr(r, "meta") and not hasattr(Group(Prompt("p", "q"), "m", [r]), "meta")
    assert (r.role, r.loss_mask, r.kl_mask, r.old_logp, r.origin, r.dropped) == ("own", None, None, None, None, None)
