"""Populations of N >= 2 co-trained models (docs/algorithms.md#populations): each rule of the N-model exchange on its
worked example, through the learners' real exchange with three models of three families and tokenizers (``micro3``);
N = 3 runs of every peer algorithm through the trainer, seeded runs that repeat exactly, several stores at once and a
mixed source per peer, and the bad inputs of a population, each one line naming its key. N = 2 stays bit-identical:
tests/test_step_metrics.py, unchanged. On Ray (3 worker groups) and after kill -9: tests/test_ray_backend.py."""
import json
import random

import pytest
import torch
from click.testing import CliRunner
import yaml
from helpers import scored_rollout
from test_graft import STRONG_PAIR  # the micro pair warmed up to have mixed groups

from graftzoo.algos.base import StepContext
from graftzoo.algos.functional import compatibility_score
from graftzoo.algos.graft.formulas import choose_peer
from graftzoo.algos.graft.learner import GRAFT
from graftzoo.algos.hacpo.formulas import hacpo_advantages, hacpo_discrepancy, hacpo_omegas
from graftzoo.algos.hacpo.learner import HACPO
from graftzoo.algos.sgt.learner import SGT
from graftzoo.apps.cli import main
from graftzoo.contract import metrics as M
from graftzoo.contract.config import ConfigError, LearnerFacts, load_config
from graftzoo.contract.types import Group, Prompt
from graftzoo.training.learning import diagnostics
from graftzoo.training.planner.build import build_policy
from graftzoo.training.trainer import Trainer

torch.set_num_threads(1)
L, A, B = "micro-qwen-char", "micro-gpt2-pair", "micro-llama-triple"
G = 4
P = Prompt("p0", "2+3", gold="5")
# the micro pair warmed up a little longer on one-digit problems (test_graft's), and the third model the same way,
# so that groups are mixed and peers rescue groups
STRONG = yaml.safe_dump({**yaml.safe_load(STRONG_PAIR), "pair": {"models": [
    *yaml.safe_load(STRONG_PAIR)["pair"]["models"],
    {"id": B, "kind": "tiny", "family": "llama", "tokenizer": "digit_triple", "hidden": 64, "layers": 2, "heads": 2,
     "kv_heads": 1, "ffn": 128, "max_new_tokens": 32,
     "warmup": {"steps": 150, "batch": 32, "lr": 3.0e-3, "mix": {"add": 0.3, "sub": 0.4, "mul": 0.3},
                "difficulty": 1, "probe_per_skill": 8}}]},
    "task": {**yaml.safe_load(STRONG_PAIR)["task"], "mix": {"add": 1, "sub": 1, "mul": 1}},
    "run": {**yaml.safe_load(STRONG_PAIR)["run"], "eval_at_start": False, "track": False}})


# ---- the rules on their worked examples -------------------------------------------------------------------------

def test_choose_peer_on_the_worked_example():
    """G = 4; A: c = 2, s = 0.91; B: c = 1, s = 0.97; C: c = 4 (all success, not informative)."""
    c, n, s = [2, 1, 4], [4, 4, 4], [0.91, 0.97, 1.5]
    assert choose_peer(c, n, s, "compatible", random.Random(0)) == 1           # B: the highest s among A, B
    assert choose_peer(c, n, s, "informative", random.Random(0)) == 0          # A: p(1-p) 0.25 > 0.1875
    assert {choose_peer(c, n, s, "random", random.Random(k)) for k in range(40)} == {0, 1}   # never C
    assert choose_peer([2, 2], [4, 4], [0.5, 0.5], "compatible", random.Random(0)) == 0      # ties: lower index
    assert choose_peer([0, 4, None], [4, 4, 0], [None] * 3, "informative", random.Random(0)) is None
    assert choose_peer([0, 4, None], [4, 4, 0], [None] * 3, "informative", random.Random(0), mixed_only=False) == 1
    rng = random.Random(5)
    assert choose_peer([0, 3], [4, 4], [None, None], "random", rng) == 1 and rng.random() == random.Random(5).random()
    with pytest.raises(ValueError, match="best"):
        choose_peer(c, n, s, "best", random.Random(0))


def fake(pid, correct):
    return Group(Prompt(pid, "1+1", gold="2"), "m", [scored_stub(c) for c in correct])


def scored_stub(c):
    from graftzoo.contract.types import Rollout
    return Rollout(prompt_id="x", model_id="m", policy_version=0, text="", token_ids=[1], logprobs=[0.0],
                   reward=float(c), correct=bool(c))


def test_complementarity_per_peer_on_the_worked_example():
    """comp(L, A) = comp(L, B) = 1 on the learner's all-fail prompt, comp(L, C) = 0; the union over peers."""
    own = [fake("x", [0, 0, 0, 0]), fake("y", [1, 0, 0, 0])]
    peers = {"A": {"x": fake("x", [1, 1, 0, 0])}, "B": {"x": fake("x", [1, 0, 0, 0])},
             "C": {"x": fake("x", [1, 1, 1, 1]), "y": fake("y", [1, 0, 0, 0])}}
    out = diagnostics.complementarity(own, peers)
    assert out[M.PEER_COMP.of(peer="A")] == out[M.PEER_COMP.of(peer="B")] == 1.0
    assert out[M.PEER_COMP.of(peer="C")] == 0.0
    assert out[M.PEER_MIXED_ON_ALL_FAIL_FRAC] == out[M.PEER_SOLVED_ALL_FAIL_FRAC] == 1.0
    assert out[M.PEER_ALL_FAIL_COUNT] == 1
    # one peer: the pair's keys only, as before populations
    assert not any(k.startswith("peer/comp/") for k in diagnostics.complementarity(own, {"A": peers["A"]}))


# ---- the rules through the learners' exchange: three families, three tokenizers ------------------------------------

@pytest.fixture(scope="module")
def pols():
    cfg = load_config(pair="micro3", algo="graft", overrides=["peer.source=online", "run.track=false"])
    return {s.id: build_policy(s, cfg) for s in cfg.pair.models}


def group(pol, correct, prompt=P):
    texts = [f"{prompt.text}={prompt.gold}" if c else f"{prompt.text}={i + 20}" for i, c in enumerate(correct)]
    adv = [1.0 if c else -1.0 for c in correct]
    return Group(prompt, pol.model_id, [scored_rollout(pol, prompt, t, c) for t, c in zip(texts, correct)], adv)


def exchange(cls, pols, peers: dict, *overrides, own=None, seed: int = 0):
    """One exchange of learner L (qwen, char) with ``peers`` ({model id: its correct flags on P}); returns (ctx,
    slots)."""
    cfg = load_config(pair="micro3", algo=cls.__name__.lower(), overrides=[
        "peer.source=online", "run.track=false", *(["algo.delta=0"] if cls is GRAFT else []), *overrides])
    facts = LearnerFacts.of(cfg)
    learner = cls(cfg.algo, facts)
    ctx = StepContext(step=0, epoch=0, run=facts, policy=pols[L], engine=None, env=None, rng=random.Random(seed))
    own = own or [group(pols[L], [False] * G)]
    return ctx, learner.exchange(ctx, own, {m: {P.id: group(pols[m], c)} for m, c in peers.items()})


def test_graft_grafts_one_informative_group_chosen_by_peer_choice(pols):
    peers = {A: [True, True, False, False], B: [True, False, False, False]}
    informative = exchange(GRAFT, pols, peers, "algo.peer_choice=informative")[1]
    assert [r.origin.model_id for r in informative[0].rollouts] == [A] * G   # p(1-p): 0.25 against 0.1875
    ctx, chosen = exchange(GRAFT, pols, peers)                               # compatible, the default
    s = {}
    for m, c in peers.items():  # each candidate group's mean s under the learner, as the choice scores it
        lg = ctx.localize([group(pols[m], c)])[0]
        s[m] = float(compatibility_score(torch.tensor([r.mean_logp for r in lg.rollouts]),
                                         torch.tensor([r.origin.mean_logp for r in lg.rollouts])).mean())
    assert s[A] != s[B]
    assert {r.origin.model_id for r in chosen[0].rollouts} == {max(s, key=s.get)}
    assert chosen[0].source == "peer"
    # an all-success peer is never grafted; with no informative peer the slot stays the learner's own
    kept = exchange(GRAFT, pols, {A: [True] * G, B: [False] * G})[1]
    assert kept[0].source == "own"
    picks = {exchange(GRAFT, pols, peers, "algo.peer_choice=random", seed=k)[1][0].rollouts[0].origin.model_id
             for k in range(12)}
    assert picks == {A, B}


def test_graft_logs_transfers_by_source_and_keeps_the_peer_advantages(pols):
    ctx, slots = exchange(GRAFT, pols, {A: [True, False, False, False], B: [False] * G})
    assert [r.origin.model_id for r in slots[0].rollouts] == [A] * G
    assert slots[0].advantages == [1.0, -1.0, -1.0, -1.0]                      # the chosen peer's own
    assert ctx.metrics[M.PEER_ADMITTED_FROM.of(peer=A)] == G                   # delta 0: every response admitted
    assert ctx.metrics[M.PEER_ADMITTED_FROM.of(peer=B)] == 0
    assert ctx.metrics[M.PEER_RESCUED_FROM.of(peer=A)] == 1
    assert ctx.metrics[M.XT_RESPONSES] == G                                    # only the chosen group carried


def test_sgt_draws_its_injections_from_the_union_of_every_peers_successes(pols):
    peers = {A: [True, False, False, False], B: [False, True, False, False]}
    ctx, slots = exchange(SGT, pols, peers, "algo.k_inj=2")
    injected = [r for r in slots[0].rollouts if r.role == "peer"]
    assert sorted(r.origin.model_id for r in injected) == sorted([A, B]) and all(r.correct for r in injected)
    assert ctx.metrics[M.PEER_ADMITTED_FROM.of(peer=A)] == ctx.metrics[M.PEER_ADMITTED_FROM.of(peer=B)] == 1
    seen = set()
    for seed in range(12):  # one draw from the union: either peer's success
        _, slots = exchange(SGT, pols, peers, "algo.k_inj=1", seed=seed)
        seen |= {r.origin.model_id for r in slots[0].rollouts if r.role == "peer"}
    assert seen == {A, B}


def test_hacpo_pools_every_models_responses_with_pairwise_capability_ratios(pols):
    own_c, a_c, b_c = [True, False, False, False], [True, True, False, False], [True, True, True, False]
    ctx, slots = exchange(HACPO, pols, {A: a_c, B: b_c}, own=[group(pols[L], own_c)])
    assert [g.source for g in slots] == ["own", "peer", "peer"]                 # self, then each peer in order
    assert [g.rollouts[0].origin.model_id for g in slots[1:]] == [A, B]
    caps = [sum(own_c) / G, sum(a_c) / G, sum(b_c) / G]                         # the first step's accuracies
    base_w, coef = hacpo_omegas(caps, 0, (0.1, 10.0))
    rewards = torch.tensor([float(x) for x in own_c + a_c + b_c], dtype=torch.float64)
    src = torch.tensor([0] * G + [1] * G + [2] * G)
    want = hacpo_discrepancy(hacpo_advantages(rewards, torch.zeros(3 * G, dtype=torch.long), src, 0, base_w), src, 0,
                             coef)
    got = [a for g in slots for a in g.advantages]
    assert got == pytest.approx(want.tolist(), abs=1e-12)
    assert ctx.metrics[M.PEER_ADMITTED_FROM.of(peer=A)] == ctx.metrics[M.PEER_ADMITTED_FROM.of(peer=B)] == G


# ---- N = 3 through the trainer -----------------------------------------------------------------------------------

def step_records(tr: Trainer, steps: int = 2) -> list:
    """Every model's seeded metrics of each step (wall times left out), with its ``model``."""
    return [{"model": m, **{k: v for k, v in sorted(met.items()) if not k.startswith(("time/", "perf/", "async/overlap_s"))}}
            for s in range(steps) for m, met in tr.train_step(s).items()]


def run_population(tmp, algo: str, *overrides, steps: int = 2) -> list:
    (tmp / "strong.yaml").write_text(STRONG)
    tr = Trainer(load_config(pair="micro3", algo=algo, files=[str(tmp / "strong.yaml")], overrides=[
        f"run.out_dir={tmp}", f"run.name={algo}-{len(overrides)}", *overrides]))
    try:
        return step_records(tr, steps)
    finally:
        tr.close()


@pytest.fixture(scope="module")
def graft3(tmp_path_factory):
    return run_population(tmp_path_factory.mktemp("graft3"), "graft", "peer.source=online")


def test_a_seeded_population_run_repeats_exactly(graft3, tmp_path):
    assert len(graft3) == 6 and {r["model"] for r in graft3} == {L, A, B}
    assert run_population(tmp_path, "graft", "peer.source=online") == graft3


def test_graft_on_three_models_exchanges_and_measures_each_ordered_pair(graft3):
    comp_keys = [k for r in graft3 for k in r if k.startswith("peer/comp/")]
    assert len(set(comp_keys)) == 3          # every model is some learner's peer
    assert all(sum(k.startswith("peer/comp/") for k in r) == 2 for r in graft3)   # each learner: its two peers
    assert sum(r[M.PEER_RESCUED_GROUPS] for r in graft3) > 0
    for r in graft3:   # transfers by source add up to the learner's admissions
        by = [v for k, v in r.items() if k.startswith("peer/admitted/")]
        assert len(by) == 2 and sum(by) == r[M.PEER_ADMITTED]


@pytest.mark.parametrize("algo", ["sgt", "hacpo", "grpo"])
def test_every_algorithm_that_runs_on_two_runs_on_three(algo, tmp_path):
    recs = run_population(tmp_path, algo, *([] if algo == "grpo" else ["peer.source=online"]), steps=1)
    assert len(recs) == 3 and all(r["loss"] is not None for r in recs)
    assert all(sum(k.startswith("peer/comp/") for k in r) == 2 for r in recs)   # GRPO too: Fig. 1 for N
    if algo != "grpo":
        assert all(len([k for k in r if k.startswith("peer/admitted/")]) == 2 for r in recs)


# ---- stored peers: several stores, mixed per peer ------------------------------------------------------------------

@pytest.fixture(scope="module")
def stored_runs(tmp_path_factory):
    """A GRAFT run of the population to its end (evaluated), its trajectory store holding every model's groups."""
    tmp = tmp_path_factory.mktemp("stores")
    (tmp / "strong.yaml").write_text(STRONG)
    cfg = load_config(pair="micro3", algo="graft", files=[str(tmp / "strong.yaml")], overrides=[
        f"run.out_dir={tmp}", "run.name=graft", "run.steps=2", "peer.source=online", "run.eval_at_end=true",
        "eval.size=4", "eval.k=1"])
    Trainer(cfg).run()
    return tmp, tmp / "graft"


def test_one_learner_reads_several_stores_at_once(stored_runs, tmp_path):
    tmp, run = stored_runs
    recs = run_population(tmp_path, "graft", "peer.source=stored", f"pair.train=[{L}]",
                          f"peer.stores={{{A}: {run}, {B}: {run}}}")
    assert [r["model"] for r in recs] == [L, L]
    assert all({M.PEER_COMP.of(peer=A), M.PEER_COMP.of(peer=B)} <= set(r) for r in recs)


def test_a_mixed_source_per_peer(stored_runs, tmp_path):
    """L and A co-trained, B read from its store: each learner meets the other live and B stored."""
    _, run = stored_runs
    recs = run_population(tmp_path, "graft", "peer.source=mixed", f"pair.train=[{L}, {A}]", f"peer.stores={{{B}: {run}}}",
                          steps=1)
    assert len(recs) == 2
    for r in recs:
        peers = {k.rsplit("/", 1)[1] for k in r if k.startswith("peer/comp/")}
        assert B in peers and len(peers) == 2


# ---- bad input: one line naming the key ---------------------------------------------------------------------------

@pytest.mark.parametrize("sets,key", [
    (["pair.models=[]"], "pair.models"),
    ([f"pair.models=[{{id: {L}, kind: tiny, family: qwen2, tokenizer: char, hidden: 64, layers: 2, heads: 2, "
      f"ffn: 128}}, {{id: {L}, kind: tiny, family: gpt2, tokenizer: digit_pair, hidden: 64, layers: 2, heads: 2, "
      f"ffn: 128}}]"], "pair.models"),
    (["peer.source=stored", "peer.stores={micro-nobody: runs/x}"], "peer.stores"),
    (["peer.source=online", "algo.peer_choice=best"], "algo.peer_choice"),
])
def test_bad_population_input_is_one_line_naming_the_key(sets, key, tmp_path):
    res = CliRunner().invoke(main, ["train", "--algo", "graft", "--pair", "micro3", "--no-track",
                                    *[a for s in sets + [f"run.out_dir={tmp_path}"] for a in ("--set", s)]])
    assert res.exit_code != 0
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and f"'{key}" in lines[0], res.output
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(pair="micro3", algo="graft", overrides=sets)


# ---- the report: a block per model with its peers, the complementarity heat map -----------------------------------

def test_the_report_shows_each_models_peers_and_the_complementarity_matrix(stored_runs):
    from graftzoo.eval.artifacts import load_run
    from graftzoo.eval.plots import complementarity_matrices, draw_figures, run_labels
    from graftzoo.eval.report import build_table1
    tmp, run_dir = stored_runs
    run = load_run(run_dir)
    assert run.summary["peers"] == {L: [A, B], A: [L, B], B: [L, A]}
    labels = run_labels([run])
    (key, cells), = complementarity_matrices([run], labels).items()
    assert key[1] == (L, A, B) and len(cells) == 6             # every ordered pair of the three
    for (learner, peer), v in cells.items():
        _, vals = run.series(learner, M.PEER_COMP.of(peer=peer))
        assert v == pytest.approx(sum(vals) / len(vals))
    figs = draw_figures([run], tmp / "report", echo=lambda *_: None)
    assert "complementarity.png" in [f.path.name for f in figs]
    table = build_table1([run], baseline=None)
    assert {(b.model, b.peer) for b in table.blocks} == {(L, f"{A} + {B}"), (A, f"{L} + {B}"), (B, f"{L} + {A}")}
    assert any(b.title.startswith(f"{L} (peer: {A} + {B})") for b in table.blocks), [b.title for b in table.blocks]


def test_the_populations_table_sets_each_models_larger_population_against_its_pair():
    """Table 1's rows of one model and method with one peer and with two: the difference and the paired test over
    the seeds both have, as Table 1's marks (``seed_test``); single-model rows are left out."""
    from graftzoo.eval.metrics import seed_test
    from graftzoo.eval.report import Block, Row, Stat, Table, population_markdown, population_rows

    def row(method, per_seed, baseline=False):
        vals = list(per_seed.values())
        return Row(method=method, budget=8, baseline=baseline, seeds=list(per_seed), runs=[], scores={},
                   avg=Stat(sum(vals) / len(vals), 0.0, len(vals)), per_seed=per_seed)
    two = {0: 0.40, 1: 0.42, 2: 0.38}
    three = {0: 0.47, 1: 0.50, 2: 0.44}
    grpo = row("GRPO (n=8)", {0: 0.3, 1: 0.3, 2: 0.3}, baseline=True)
    blocks = [Block(model=L, peer=A, rows=[grpo, row("GRAFT", two), row("SGT", {0: 0.3})]),
              Block(model=L, peer=f"{A} + {B}", rows=[grpo, row("GRAFT", three)])]
    rows = population_rows(Table(benchmarks=[], blocks=blocks, baseline="GRPO (n=8)", budgets=(16, 32)))
    assert [(r.model, r.method, r.small, r.large) for r in rows] == [(L, "GRAFT", 2, 3)]
    want = seed_test(two, three)
    assert rows[0].test.diff == pytest.approx(want.diff) and rows[0].test.p == pytest.approx(want.p)
    assert rows[0].test.paired and rows[0].test.diff == pytest.approx(0.07)
    md = population_markdown(rows)
    assert f"| {L} | GRAFT | 2 | 40.0 ± 0.0 | 3 | 47.0 ± 0.0 | +7.0 | {want.p:.2f} | 3 |" in md


def test_plan_places_a_population_on_a_node_or_says_what_does_not_fit():
    """graftzoo plan with the GPU population (pair1 and OLMo-2-1B): each model on GPUs of its own, the GPUs split by
    parameters; on too few GPUs, one line naming what does not fit."""
    from graftzoo.training.planner import memory
    ids = ["HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base", "allenai/OLMo-2-0425-1B"]
    res = CliRunner().invoke(main, ["plan", "configs/pairs/population1.yaml", "--gpus", "8", "--json",
                                    "--set", "peer.source=online", "--algo", "graft"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    ranks = {g["model"]: g["ranks"] for g in plan["placement"]}
    assert list(ranks) == ids and sorted(r for rs in ranks.values() for r in rs) == list(range(8))
    assert len(ranks[ids[0]]) > len(ranks[ids[2]])     # SmolLM3's 3.1 B parameters take the most GPUs
    counted = {m.model: m.params for m in memory.model_memory(load_config(pair="population1", algo="grpo"))}
    assert counted[ids[2]] == pytest.approx(1.485e9, rel=2e-3)
    res = CliRunner().invoke(main, ["plan", "configs/pairs/population1.yaml", "--gpus", "2"])
    assert res.exit_code == 1 and "no placement of population1 fits 2 x 80 GiB GPU(s)" in res.output


def test_a_stored_peer_run_is_charged_the_compute_of_every_store_it_reads(stored_runs, tmp_path):
    """The summary's ``peer_run_compute`` (the amortized charge): the earlier run's charged cost of each stored
    model, added up over the stores (``peer.stores``), or of the one model ``peer.path`` stands for."""
    from graftzoo.eval.artifacts import stored_peer_cost
    _, run = stored_runs
    (tmp_path / "strong.yaml").write_text(STRONG)
    for name, sets, read in (("two", [f"peer.stores={{{A}: {run}, {B}: {run}}}"], [A, B]),
                             ("one", [f"peer.path={run}", f"peer.model={A}"], [A])):
        Trainer(load_config(pair="micro3", algo="graft", files=[str(tmp_path / "strong.yaml")], overrides=[
            f"run.out_dir={tmp_path}", f"run.name={name}", "run.steps=1", "peer.source=stored",
            f"pair.train=[{L}]", *sets])).run()
        got = json.loads((tmp_path / name / "summary.json").read_text())["peer_run_compute"]
        want = [stored_peer_cost(run, m) for m in read]
        assert got == pytest.approx({k: sum(c[k] for c in want) for k in got}) and got["wall_s"] > 0
