"""Every path of the paper's pair run on its miniature (docs/guide.md#the-papers-families-in-miniature): ``pair1-mini``
untrained (tests/mini.py: the real SmolLM3 and Qwen3 architectures and tokenizers, their own EOS, the plain
template), driven as a user drives them, through ``graftzoo train`` / ``graftzoo eval`` and the Python API.

Untrained models fail every arithmetic prompt, so the runs train on a task of their own, registered as an
environment plugin (tests/mini_task.py, ``--plugin``; ``task.env`` selects it): "write a number" or "write a word in
Hebrew", which an untrained model passes where its vocabulary holds such tokens. SmolLM3's holds digits and almost no
Hebrew, Qwen3's the reverse, so each model solves some prompts the other fails entirely and the exchange runs in both
directions (docs/algorithms.md#cross-tokenizer-exchange): every exchange test checks, for each model as the learner,
that the other's groups were taken, re-tokenized into its vocabulary and admitted into its update.

- GRAFT with an online peer (the run the other tests share), with a stored peer (each model learning from the other's
  trajectories in an earlier GRPO run's Parquet store) and with a mixed one; HACPO; SGT; GRPO;
- a run stopped after its checkpoint and extended equals the uninterrupted run, metrics and weights
  (docs/reliability.md#resume-by-rerunning);
- ``graftzoo eval --ckpt RUN`` scores both models on the task's held-out split;
- ``--backend ray`` with SmolLM3 sharded by FSDP2 over 2 gloo ranks gives the in-process run's metrics and weights
  (docs/scaling.md#ray-worker-groups-and-fsdp2), in a loopback-only namespace (tests/test_ray_backend.py).
"""
import json
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import graftzoo
from graftzoo.contract.config import load_config
from graftzoo.training.run.checkpoint import load_weights
from graftzoo.training.planner.build import build_policy
from helpers import cli_here
from mini import QWEN, SMOL, untrained_pair
from mini_task import stop_at
from test_ray_backend import assert_same, finish, loopback, metrics

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

PLUGIN = Path(__file__).with_name("mini_task.py").resolve()
MODELS = (SMOL, QWEN)
# 8 prompts x 4 rollouts, 1 step (the exchange runs both ways from step 0; the online run takes 2, the length the
# resume test extends a run to), a checkpoint at the end; micro-batches of at most 400 tokens, so that both ranks
# of a sharded group train real micro-batches (test_ray_fsdp2_trains_like_the_in_process_trainer)
SECTIONS = {"task": {"env": "mini/Scripts-v0", "size": 64, "mix": {}, "difficulty": {}, "prompts_per_step": 8},
            "rollout": {"n": 4},
            "optim": {"minibatches": 2, "warmup_steps": 0, "max_tokens_per_micro": 400},
            "run": {"steps": 1, "save_every": 0, "eval_at_end": False, "progress": False},
            "eval": {"size": 8, "k": 1}}
# responses of up to 16 tokens, each model's ending at its first symbol of the kind it writes (tests/mini_task.py)
MODEL_KEYS = {SMOL: {"max_new_tokens": 16, "stop": stop_at("digit")},
              QWEN: {"max_new_tokens": 16, "stop": stop_at("hebrew")}}
SKIP = ("time/", "perf/", "async/overlap_s")  # wall-clock figures differ from run to run


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The miniature pair file on the task, and the folder of the runs; the plugin named for every command and the
    processes they start (what ``--plugin`` does), taken back when the module ends."""
    tmp = tmp_path_factory.mktemp("mini")
    path = untrained_pair(tmp, **SECTIONS)
    cfg = yaml.safe_load(path.read_text())
    for m in cfg["models"]:
        m.update(MODEL_KEYS[m["id"]])
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTZOO_PLUGINS", str(PLUGIN))
        yield path, tmp


def train_args(pair, algo: str, name: str, *sets, peer: str = "online") -> list:
    path, out = pair
    args = ["train", "--plugin", PLUGIN, "--algo", algo, "--pair", path, "--no-track", "--set", f"run.out_dir={out}",
            "--set", f"run.name={name}"] + (["--peer", peer] if peer else [])
    return args + [x for s in sets for x in ("--set", s)]


def train(pair, algo: str, name: str, *sets, peer: str = "online") -> Path:
    """``graftzoo train`` of the miniature pair, in this process; the run directory (its wall time is printed)."""
    t = time.perf_counter()
    res = cli_here(*train_args(pair, algo, name, *sets, peer=peer))
    assert res.returncode == 0, res.stderr[-4000:]
    print(f"\n{name}: {time.perf_counter() - t:.1f} s")
    return pair[1] / name


def records(run: Path) -> list:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def of(run: Path, model: str) -> list:
    return [r for r in records(run) if r["model"] == model]


def strip(recs: list) -> list:
    return [{k: v for k, v in r.items() if not k.startswith(SKIP)} for r in recs]


def total(recs: list, key: str) -> float:
    return sum(r.get(key) or 0 for r in recs)


def assert_took_peer_groups(run: Path, models=MODELS, steps: int = 1, succ: bool = True):
    """Each of ``models``, as the learner, took the other's groups: all-fail prompts rescued, the peer's responses
    re-tokenized into its vocabulary (``xt/responses``), admitted (with ``succ``: correct ones among them) and
    trained on (``tokens/peer_share``)."""
    for m in models:
        recs = of(run, m)
        assert len(recs) == steps, (m, recs)
        for key in ("peer/rescued_groups", "xt/responses", "peer/admitted") + (("peer/admitted_succ",) if succ else ()):
            assert total(recs, key) > 0, (m, key, [(r["step"], r.get(key)) for r in recs])
        assert any(r["tokens/peer_share"] > 0 for r in recs), m


@pytest.fixture(scope="module")
def online(pair):
    """GRAFT with an online peer, 2 steps: the run several tests read."""
    return train(pair, "graft", "graft-online", "run.steps=2")


@pytest.fixture(scope="module")
def first(pair):
    """The online GRAFT run stopped after step 0 (``run.steps=1``: its checkpoint ``step_000000`` written, and kept
    when the run is extended): the resume test extends it."""
    run = train(pair, "graft", "resumed")
    assert len(records(run)) == 2 and (run / "checkpoints" / "step_000000").is_dir()
    return run


@pytest.fixture(scope="module")
def grpo(pair):
    """GRPO on both models: its store is the stored peer of the GRAFT stored and mixed runs."""
    return train(pair, "grpo", "grpo", peer=None)


def test_graft_online_exchanges_in_both_directions(online):
    """Each model rescues its all-fail groups of the other's kind of prompt: every learner all-fail prompt with a
    mixed peer group is replaced (no cap), the peer's responses re-tokenized and gated by s = exp(l_L - l_P)."""
    assert_took_peer_groups(online, steps=2)
    for r in records(online):
        assert r["peer/rescued_groups"] == round((r["peer/mixed_on_all_fail_frac"] or 0) * r["peer/all_fail_count"])
        if r["peer/admitted"]:
            assert r["peer/s_min"] <= r["peer/s_median"] <= r["peer/s_max"] and r["clip/frac_peer"] is not None
    assert json.loads((online / "summary.json").read_text())["peers"] == {SMOL: QWEN, QWEN: SMOL}


def test_grpo_trains_both_models_on_groups_the_other_solves(grpo):
    """GRPO: each model learns from its own mixed groups, and the pair is complementary (each solves some of the
    other's all-fail prompts: what the exchange runs rest on); no peer group is taken."""
    for m in MODELS:
        recs = of(grpo, m)
        assert len(recs) == 1 and any(abs(r["loss"]) > 0 for r in recs), m
        assert any(r["groups/mixed"] > 0 for r in recs) and any(r["peer/solved_all_fail_frac"] for r in recs), m
        assert not total(recs, "peer/admitted") and not total(recs, "xt/responses"), m


@pytest.fixture(scope="module")
def stored(pair, grpo):
    """learner -> its GRAFT run with the GRPO run's store as the peer (``--peer stored:RUN``), made once, on first
    use (the stored-peer test and the Ray run read SmolLM3's)."""
    runs = {}

    def get(learner: str) -> Path:
        if learner not in runs:
            runs[learner] = train(pair, "graft", f"stored-{learner}", f"pair.train=[{learner}]", peer=f"stored:{grpo}")
        return runs[learner]
    return get


@pytest.mark.parametrize("learner", MODELS)
def test_graft_stored_takes_the_other_models_trajectories(stored, learner):
    """``--peer stored:RUN`` trains one model on the other's groups as the GRPO run stored them (its Parquet
    store): only the learner is sampled and trained."""
    other = QWEN if learner == SMOL else SMOL
    run = stored(learner)
    assert not of(run, other)
    assert_took_peer_groups(run, [learner])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["peer_source"] == "stored" and summary["peers"] == {learner: other}


def test_graft_mixed_takes_stored_and_online_groups(pair, grpo, online):
    """``--peer mixed:RUN`` with the stored Qwen3 used wherever it has a group (``peer.mix_ratio=1``): SmolLM3 learns
    from the GRPO run's Qwen3 trajectories (read from its store: none missing), Qwen3 from the live SmolLM3. At step 0
    the stored groups are the ones a live Qwen3 samples (the same seed and weights), so the step is the online run's
    to the last metric: the store's round trip is exact."""
    run = train(pair, "graft", "mixed", "peer.mix_ratio=1.0", f"peer.model={QWEN}", peer=f"mixed:{grpo}")
    assert_took_peer_groups(run)
    assert [r.get("peer/stored_missing") for r in of(run, SMOL)] == [0]   # its peer is the store, covering it
    assert [r.get("peer/stored_missing") for r in of(run, QWEN)] == [None]
    mixed, live = strip(of(run, SMOL)), strip(of(online, SMOL))
    assert mixed[0] == {**live[0], "peer/stored_missing": 0}
    assert strip(of(run, QWEN)) == strip(of(online, QWEN))[:1]


def test_hacpo_pools_the_other_models_responses_in_both_directions(pair):
    """HACPO (4 prompts): every peer response is pooled into the learner's group of its prompt (cut to the learner's
    limit, HACPO's ``xt.overflow``); rescued groups are the learner's all-fail prompts the peer solved."""
    run = train(pair, "hacpo", "hacpo", "task.prompts_per_step=4")
    assert_took_peer_groups(run, succ=False)
    for r in records(run):
        assert r["xt/responses"] == 4 * 4 and r["hacpo/capability_peer"] is not None
        assert r["peer/rescued_groups"] == round(r["peer/solved_all_fail_frac"] * r["peer/all_fail_count"])


def test_sgt_rescues_all_fail_groups_in_both_directions(pair):
    """SGT: one verified peer success passed into each all-fail group the peer solved (``algo.k_inj`` 1); a success
    that cannot be carried (longer than the learner's limit once re-tokenized) is rejected."""
    run = train(pair, "sgt", "sgt")
    assert_took_peer_groups(run)
    for r in records(run):
        solved = round((r["peer/solved_all_fail_frac"] or 0) * r["peer/all_fail_count"])
        assert r["peer/rescued_groups"] + r["peer/rejected"] == solved == r["xt/responses"]
        assert r["peer/admitted"] == r["peer/rescued_groups"] and r["peer/admitted_fail"] == 0


def final_weights(run: Path, step: int = 1) -> dict:
    ck = run / "checkpoints" / f"step_{step:06d}"
    return {m: torch.load(ck / f"{m}.pt", weights_only=True)["policy"]["model"] for m in MODELS}


def test_a_run_stopped_after_its_checkpoint_and_rerun_equals_the_uninterrupted_run(pair, online, first):
    """The GRAFT online run stopped after step 0 (``first``), then the same run to the online run's length through
    the Python API: every metric but the wall-clock ones, and both models' weights, are the uninterrupted run's."""
    path, out = pair
    result = graftzoo.train(pair=str(path), algo="graft", track=False, overrides={
        "peer.source": "online", "run.out_dir": str(out), "run.name": "resumed", "run.steps": 2})
    assert result.status == "done" and result.steps == 2
    assert strip(records(first)) == strip(records(online))
    got, want = final_weights(first), final_weights(online)
    for m in MODELS:
        assert got[m].keys() == want[m].keys() and all(torch.equal(got[m][k], want[m][k]) for k in want[m]), m


def test_eval_scores_both_models_on_the_tasks_held_out_split(online):
    """``graftzoo eval --ckpt RUN``: both models of the last checkpoint, on the 8 held-out prompts, 8 answers each,
    scored by the task's verifier (which some answers pass; math-verify would find no answer to "Write a number.")."""
    res = cli_here("eval", "--plugin", PLUGIN, "--ckpt", online, "--benchmarks", "heldout", "--k", "8", "--no-greedy")
    assert res.returncode == 0, res.stderr[-3000:]
    for m in MODELS:
        payload = json.loads((online / "eval" / "cli" / "step_1-heldout-k8" / f"{m}.json").read_text())
        rec = payload["benchmarks"]["heldout"]
        assert payload["model"] == m and payload["step"] == 1 and rec["n_items"] == 8 and rec["k"] == 8
        assert rec["prompts_too_long"] == 0 and 0 < rec["avg"] < 1, (m, rec["avg"])


def test_ray_fsdp2_trains_like_the_in_process_trainer(pair, grpo, stored):
    """``--backend ray`` with ``ray.num_workers=2``: SmolLM3 (its NoPE layers; its 128,256 embedding rows split
    between the ranks) in a group of 2 ranks sharding it with FSDP2 over gloo, learning from the GRPO run's stored
    Qwen3 groups, every rank decoding the in-process run's rollouts. Over one step, rewards and exchange counts are
    the in-process run's exactly, the loss and gradient norm to 1e-5 (the ranks' gradients summed in another order),
    and the weights one process reads from the shards to 1e-5."""
    path, out = pair
    ref_run = stored(SMOL)
    cmd = [sys.executable, "-m", "graftzoo.apps.cli",
           *map(str, train_args(pair, "graft", "ray", f"pair.train=[{SMOL}]", peer=f"stored:{grpo}")),
           "--backend", "ray", "--set", "ray.num_workers=2"]
    t = time.perf_counter()
    code, log = finish(loopback(cmd), timeout=600)
    assert code == 0, log[-4000:]
    print(f"\nRay run (2 ranks): {time.perf_counter() - t:.1f} s")
    got, ref = metrics(out / "ray"), metrics(ref_run)
    assert sorted(got) == sorted(ref) == [(0, SMOL)]
    exact = ("reward/mean", "groups/mixed", "peer/rescued_groups", "peer/admitted", "xt/responses", "batch/tokens")
    assert_same({k: {x: v[x] for x in exact} for k, v in got.items()},
                {k: {x: v[x] for x in exact} for k, v in ref.items()}, 0.0, "Ray")
    assert ref[(0, SMOL)]["peer/admitted"] > 0
    for key, row in ref.items():
        for k in ("loss", "grad_norm"):
            assert got[key][k] == pytest.approx(row[k], rel=1e-5, abs=1e-8), (key, k)
    ck = out / "ray" / "checkpoints" / "step_000000"
    files = json.loads((ck / "manifest.json").read_text())["files"]
    assert {f"{SMOL}.dcp/__0_0.distcp", f"{SMOL}.dcp/__1_0.distcp"} <= set(files), files
    cfg = load_config(pair=str(path), algo="grpo", overrides=["run.track=false"])
    spec = next(s for s in cfg.pair.models if s.id == SMOL)
    want = torch.load(ref_run / "checkpoints" / "step_000000" / f"{SMOL}.pt", weights_only=True)["policy"]["model"]
    pol = build_policy(spec, cfg)
    load_weights(pol, ck)
    for name, x in pol.model.state_dict().items():
        assert torch.allclose(x, want[name], rtol=1e-4, atol=1e-5), name
