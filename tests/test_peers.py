"""Peer sources (online / stored / mixed) and TrajectoryStore validation, plus GRAFT in stored and mixed mode
through the real trainer (docs/algorithms.md#graft-stored-trajectories)."""
import json

import pytest
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.peers import MixedPeer, OnlinePeer, StoredPeer, StoreError, TrajectoryStore, make_peer_source
from graftzoo.contract.config import load_config, with_values
from graftzoo.contract.types import Group, Prompt, Rollout
from test_graft import STRONG_PAIR  # the micro pair warmed up to have mixed groups (pytest puts tests/ on the path)

A, B = "micro-qwen-char", "micro-gpt2-pair"


def prompts(k, seed=0):
    return [Prompt(id=f"arith-train-{seed}-{i}", text=f"{i}+{i}", gold=str(2 * i), source="arithmetic")
            for i in range(k)]


def group(model, prompt, rewards, step=0):
    rolls = [Rollout(prompt_id=prompt.id, model_id=model, policy_version=step, text=f"{prompt.text}={2 + j}",
                     token_ids=[3, 4, 9], logprobs=[-0.5, -1.5, -0.2], eos_id=9, reward=float(r), correct=bool(r))
             for j, r in enumerate(rewards)]
    return Group(prompt, model, rolls, advantages=[float(r) - 0.5 for r in rewards])


def write_store(root, steps=2, k=3, dataset="arithmetic", model=B, seed=0):
    store = TrajectoryStore(root, dataset=dataset)
    for s in range(steps):
        store.write(s, 0, [group(model, p, [1, 0], s) for p in prompts(k, seed)], tokenizer_id="digit_pair")
    return store


# ------------------------------------------------------------------------------------------------
# the store and its validation
# ------------------------------------------------------------------------------------------------

def test_stored_peer_reads_groups_with_behaviour_stats(tmp_path):
    write_store(tmp_path)
    peer = StoredPeer(tmp_path, dataset="arithmetic")
    out = peer.groups(prompts(3), 1, 0, A)
    g = out["arith-train-0-1"]
    assert peer.peer_of(A) == B and g.source == "peer" and g.model_id == B
    assert g.rewards == [1.0, 0.0] and g.advantages == [0.5, -0.5]
    assert g.advantages == [0.5, -0.5]
    r = g.rollouts[0]
    assert r.token_count == 2 and r.mean_logp == pytest.approx(-1.0)   # EOS excluded when stored
    assert r.origin.stored_step == 1 and r.tokenizer_id == "digit_pair"
    assert peer.groups(prompts(3), 5, 0, A) == {}                       # same_step: nothing logged at step 5
    latest = StoredPeer(tmp_path, align="latest").groups(prompts(3), 5, 0, A)
    assert {g.rollouts[0].origin.stored_step for g in latest.values()} == {1}


def test_latest_alignment_is_by_epoch(tmp_path):
    """peer.align=latest (docs/algorithms.md#graft-stored-trajectories): the most recent logged group of the prompt at or
    before the same EPOCH, whatever step of that epoch the earlier run visited it at (not at or before the step)."""
    store = TrajectoryStore(tmp_path, dataset="arithmetic")
    p0, p1 = prompts(2)
    # the earlier run saw p0 at step 0 (epoch 0) and step 3 (epoch 1), p1 at step 1 (epoch 0) and step 2 (epoch 1)
    for step, epoch, p in ((0, 0, p0), (1, 0, p1), (2, 1, p1), (3, 1, p0)):
        store.write(step, epoch, [group(B, p, [1, 0], step)], tokenizer_id="digit_pair")
    peer = StoredPeer(tmp_path, align="latest")

    def stored_steps(step, epoch):
        return {pid: g.rollouts[0].origin.stored_step for pid, g in peer.groups([p0, p1], step, epoch, A).items()}

    assert stored_steps(2, 1) == {p0.id: 3, p1.id: 2}   # p0's epoch-1 group was logged at a later step (3)
    assert stored_steps(5, 0) == {p0.id: 0, p1.id: 1}   # never a later epoch's group, whatever the step
    assert stored_steps(0, 0) == {p0.id: 0, p1.id: 1}
    assert stored_steps(9, 2) == {p0.id: 3, p1.id: 2}   # epoch 2 not logged: the most recent before it


def test_store_with_unknown_schema_version_is_refused(tmp_path):
    write_store(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["schema_version"] = 99
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="schema version 99"):
        StoredPeer(tmp_path)


def test_store_from_another_dataset_is_refused(tmp_path):
    write_store(tmp_path, dataset="gsm8k")
    with pytest.raises(StoreError, match="dataset 'gsm8k'.*'arithmetic'"):
        StoredPeer(tmp_path, dataset="arithmetic")


def test_store_without_overlapping_prompts_is_refused(tmp_path):
    write_store(tmp_path, seed=7)
    with pytest.raises(StoreError, match="shares no prompt ids"):
        StoredPeer(tmp_path, prompt_ids={p.id for p in prompts(3)})


def test_store_with_other_questions_under_the_same_ids_is_refused(tmp_path):
    write_store(tmp_path)
    other = [Prompt(id=p.id, text=p.text + "*3", gold="0") for p in prompts(3)]
    with pytest.raises(StoreError, match="arith-train-0-0"):
        StoredPeer(tmp_path).groups(other, 0, 0, A)


def test_partly_written_store_is_readable_up_to_its_last_complete_step(tmp_path):
    write_store(tmp_path, steps=2)
    # a crash while writing step 2: a stray temp Parquet file (half written) and a temp meta file
    (tmp_path / B / ".tmp-4242-step_000002.parquet").write_bytes(b"PAR1 half a file")
    (tmp_path / ".tmp-4242-meta.json").write_text("{")
    store = TrajectoryStore(tmp_path, create=False)
    assert store.steps(B) == [0, 1]
    peer = StoredPeer(tmp_path, align="latest")
    assert len(peer.df) == 2 * 3 * 2
    assert {g.rollouts[0].origin.stored_step for g in peer.groups(prompts(3), 2, 0, A).values()} == {1}
    assert StoredPeer(tmp_path).groups(prompts(3), 2, 0, A) == {}        # same_step: step 2 never completed


def test_make_peer_source_kinds(tmp_path):
    write_store(tmp_path)
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "peer.source=stored", f"peer.path={tmp_path}", "peer.align=same_step", "run.seed=0"])
    assert isinstance(make_peer_source(cfg, [A], "arithmetic"), StoredPeer)
    cfg = with_values(cfg, {"peer.source": "mixed"})
    assert isinstance(make_peer_source(cfg, [A, B], "arithmetic"), MixedPeer)
    cfg = with_values(cfg, {"peer.path": None})   # derived, not re-checked: the source's own guard
    with pytest.raises(ValueError, match="peer.path"):
        make_peer_source(cfg, [A, B])
    cfg = with_values(cfg, {"peer.source": "online"})
    assert isinstance(make_peer_source(cfg, [A, B]), OnlinePeer)


def test_mixed_peer_uses_the_store_only_for_the_stored_model(tmp_path):
    write_store(tmp_path, steps=1)
    ps = prompts(3)
    online = OnlinePeer([A, B])
    online.observe({A: [group(A, p, [0, 1]) for p in ps], B: [group(B, p, [0, 0]) for p in ps[:2]]})
    fallback = MixedPeer(online, StoredPeer(tmp_path))
    got = fallback.groups(ps, 0, 0, A)                    # B's live groups, the store where B has none
    assert [got[p.id].rollouts[0].origin is not None for p in ps] == [False, False, True]
    always = MixedPeer(online, StoredPeer(tmp_path), mix_ratio=1.0)
    assert all(g.rollouts[0].origin is not None for g in always.groups(ps, 0, 0, A).values())
    # B's peer is A, which the store does not hold: B gets A's live groups, never B's own stored ones
    for src in (fallback, always):
        assert {g.model_id for g in src.groups(ps, 0, 0, B).values()} == {A}


# ------------------------------------------------------------------------------------------------
# GRAFT through the trainer: stored and mixed mode
# ------------------------------------------------------------------------------------------------

def cli(tmp_path, *args):
    pair = tmp_path / "strong.yaml"
    pair.write_text(STRONG_PAIR)
    res = CliRunner().invoke(main, ["train", "--pair", "micro", "-c", str(pair), "--no-track",
                                    "--set", f"run.out_dir={tmp_path}", "--set", "run.steps=2", *args])
    return res


def records(run_dir, model):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["model"] == model]


@pytest.fixture(scope="module")
def peer_run(tmp_path_factory):
    """A GRPO run of model B alone: its store is the stored peer of the runs below."""
    tmp = tmp_path_factory.mktemp("peer")
    res = cli(tmp, "--algo", "grpo", "--set", f"pair.train=[{B}]", "--set", "run.name=peerB")
    assert res.exit_code == 0, res.output
    return tmp / "peerB"


def test_graft_stored_mode_replaces_groups(peer_run, tmp_path):
    assert TrajectoryStore(peer_run / "store", create=False).steps(B) == [0, 1]
    res = cli(tmp_path, "--algo", "graft", "--peer", f"stored:{peer_run}", "--set", f"pair.train=[{A}]",
              "--set", "run.name=stored")
    assert res.exit_code == 0, res.output
    recs = records(tmp_path / "stored", A)
    assert len(recs) == 2 and not records(tmp_path / "stored", B)     # the peer is neither trained nor sampled
    assert sum(r["peer/rescued_groups"] for r in recs) > 0
    assert all(r["peer/solved_all_fail_frac"] is not None or r["peer/all_fail_count"] == 0 for r in recs)
    summary = json.loads((tmp_path / "stored" / "summary.json").read_text())
    assert summary["peer_source"] == "stored" and summary["peers"] == {A: B}


def test_graft_mixed_mode_runs(peer_run, tmp_path):
    res = cli(tmp_path, "--algo", "graft", "--peer", f"mixed:{peer_run}", "--set", "peer.mix_ratio=1.0",
              "--set", "run.name=mixed")
    assert res.exit_code == 0, res.output
    for m in (A, B):
        recs = records(tmp_path / "mixed", m)
        assert len(recs) == 2 and all(r["peer/rescued_groups"] is not None for r in recs)
    assert sum(r["peer/rescued_groups"] for r in records(tmp_path / "mixed", A)) > 0


def test_stored_mode_refuses_a_store_of_other_prompts(tmp_path):
    write_store(tmp_path / "other", seed=7)
    res = cli(tmp_path, "--algo", "graft", "--peer", f"stored:{tmp_path / 'other'}", "--set", f"pair.train=[{A}]")
    assert res.exit_code != 0 and "shares no prompt ids" in res.output


def test_graft_without_a_peer_is_a_clear_error(tmp_path):
    res = cli(tmp_path, "--algo", "graft")
    assert res.exit_code != 0 and "--peer online|stored:PATH|mixed:PATH" in res.output
