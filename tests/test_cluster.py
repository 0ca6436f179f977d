"""graftzoo on a Ray cluster of two nodes (tests/cluster.py: two raylets on 127.0.0.1 in a loopback-only network,
PID and mount namespace, shared by every test of this module), driven through the ``graftzoo`` command:

- GRAFT with each model on a node of its own (``ray.model_placement=spread``) and rollout workers apart from the
  training ranks (``ray.rollout_workers=1``, weights sent over a collective), rollouts one step ahead
  (``rollout.max_staleness=1``) decoded while the models update: the metrics of one process;
- a grid whose cells run on both nodes;
- a run directory that one node sees elsewhere: one line at start naming that node;
- a placement the cluster cannot give (a node per model for three models): one line after ``ray.ready_timeout_s``;
- a node lost mid-run (its raylet killed), k = 0: one line naming its address, the model and the rank (the summary
  says it too); the rerun on the node that remains is exact.

The pair: micro-qwen-char in a group of 1, micro-gpt2-pair sharded by FSDP2 over 2 ranks (1 in the lost node's
run), each with one rollout worker (HF engine on CPU).
"""
import json
import re
import sys
import time

import pytest
import yaml

from graftzoo.api import train_run as train
from graftzoo.contract.config import load_config, packaged_configs
from graftzoo.training.run.no_effect import no_effect_lines
from cluster import LoopbackCluster, can_make
from test_ray_backend import A, B, ENV, SETS, assert_same, finish, metrics

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not can_make(), reason="a cluster in namespaces needs root, unshare and nsenter")]

# each model on a node of its own, with a rollout worker apart; the rollouts of step s decoded by version s - 1
SPREAD = ["ray.model_placement=spread", "ray.rollout_workers=1", "rollout.max_staleness=1"]


def pair_file(tmp, workers: int = 2) -> str:
    """The micro pair with B's group of ``workers`` ranks."""
    models = yaml.safe_load((packaged_configs() / "pairs" / "micro.yaml").read_text())["models"]
    models[1]["num_workers"] = workers
    f = tmp / f"micro_{workers}.yaml"
    f.write_text(yaml.safe_dump({"pair": {"models": models}}))
    return str(f)


def train_cmd(c: LoopbackCluster, pair: str, out, *extra) -> list:
    args = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", "graft", "--pair", "micro",
            "--peer", "online", "--no-track", "--backend", "ray", "-c", pair, "--set", f"ray.address={c.address}",
            "--set", f"run.out_dir={out}", "--set", "run.name=r", "--set", "run.progress=false"]
    for s in [*SETS, *extra]:
        args += ["--set", s]
    return args


def placed(log: str) -> dict:
    """(model, kind) -> the nodes of its actors, from the run's placement lines."""
    out = {}
    for m, kind, nodes in re.findall(r"model (\S+): (training ranks|rollout workers) on nodes \(([^)]*)\)", log):
        out[(m, kind)] = set(re.findall(r"\d+: (127\.0\.0\.1:\d+)", nodes))
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two nodes; the worker node sees ``private/`` as another folder (``elsewhere/``)."""
    base = tmp_path_factory.mktemp("cluster")
    (base / "private").mkdir()
    (base / "elsewhere").mkdir()
    c = LoopbackCluster(ENV)
    try:
        c.worker = c.add_node(private=(base / "private", base / "elsewhere"))
        yield c, base
    finally:
        c.close()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The same GRAFT runs in one process: k = 1 (its run directory) and k = 0 (its metrics)."""
    tmp = tmp_path_factory.mktemp("one")
    base = ["peer.source=online", "run.track=false", "run.progress=false", f"run.out_dir={tmp}", *SETS]
    k1 = load_config(pair="micro", algo="graft", overrides=[*base, "run.name=k1", "rollout.max_staleness=1"])
    return k1, train(k1), metrics(train(load_config(pair="micro", algo="graft", overrides=[*base, "run.name=k0"])))


@pytest.fixture(scope="module")
def spread_run(cluster):
    """The GRAFT run of the micro pair, each model on its own node with its rollout worker (3 steps)."""
    c, base = cluster
    t = time.perf_counter()
    code, log = finish(c.popen(train_cmd(c, pair_file(base), base / "spread", *SPREAD)))
    assert code == 0, log[-4000:]
    print(f"\nRay run on two nodes: 3 steps in {time.perf_counter() - t:.1f} s")
    return base / "spread" / "r", log


def test_graft_with_its_models_on_two_nodes_and_rollout_workers_apart_trains_like_one_process(spread_run,
                                                                                            one_process):
    """Each model's training ranks and rollout worker on one node, the two models on different nodes; the rollouts
    ahead decoded while the models update (``async/overlap_s`` > 0), the weights sent to the rollout workers after
    each update: the same seeded metrics as one process with the same schedule (the sharded model's loss to 1e-5).
    One process decodes with the training model, so nothing overlaps there: 0 s, and said once at start. Step 0 is
    also the step 0 of a run with k = 0 (both decoded by the initial weights)."""
    run, log = spread_run
    where = placed(log)
    assert where[(A, "training ranks")] == where[(A, "rollout workers")]
    assert where[(B, "training ranks")] == where[(B, "rollout workers")]
    assert len(where[(A, "training ranks")] | where[(B, "training ranks")]) == 2, log[-3000:]   # a node each
    got = metrics(run)
    overlap = [json.loads(x).get("async/overlap_s") for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(v and v > 0 for v in overlap)
    cfg, ref_dir, k0 = one_process
    assert any("rollout.max_staleness=1: nothing overlaps here" in line for line in no_effect_lines(cfg))
    ref = metrics(ref_dir)
    assert sorted(got) == sorted(ref) and len(ref) == 6
    rows = [json.loads(x) for x in (ref_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["async/overlap_s"] == 0 for r in rows if r.get("loss") is not None)
    assert_same({k: v for k, v in got.items() if k[1] == A}, {k: v for k, v in ref.items() if k[1] == A}, 1e-5, A)
    for key, row in ref.items():
        if key[1] == B:
            assert got[key]["loss"] == pytest.approx(row["loss"], rel=1e-5, abs=1e-8), key
            assert got[key]["reward/mean"] == row["reward/mean"], key   # the same rollouts
    assert [got[(s, A)]["async/staleness_max"] for s in range(3)] == [0, 1, 1]
    for m in (A, B):
        row = {k: v for k, v in ref[(0, m)].items() if not k.startswith("async/")}
        assert_same({(0, m): got[(0, m)]}, {(0, m): row}, 1e-5, f"step 0 of {m} against k = 0")
        assert k0[(0, m)]["loss"] == pytest.approx(got[(0, m)]["loss"], rel=1e-5, abs=1e-8)
        assert k0[(1, m)]["reward/mean"] != got[(1, m)]["reward/mean"] or \
            k0[(1, m)]["loss"] != pytest.approx(got[(1, m)]["loss"], rel=1e-5)   # step 1: another schedule


def test_grid_cells_run_on_both_nodes_with_dependencies_then_skipped(cluster):
    """``graftzoo grid FILE --ray ADDRESS`` on the cluster: each cell a Ray task spread over the nodes (a ``--backend
    ray`` cell's worker groups join the cluster); the stored-peer cell starts after the cell it reads and reads its
    store wherever it ran; the grid says where each cell ran; a rerun skips the finished cells."""
    c, base = cluster
    grid = {"name": "g", "pairs": ["micro"], "seeds": [0],
            "set": {"run.steps": 1, "run.track": False, "run.progress": False, "task.prompts_per_step": 2,
                    "eval": {"size": 4, "k": 1}},
            "algorithms": [],
            "variants": [{"label": "RLOO on ray", "algo": "rloo",
                          "set": {"run.backend": "ray", "pair.train": [B]}},
                         {"label": "GRPO (stored peer)", "algo": "grpo", "peer": "stored:{cell:RLOO on ray}",
                          "set": {"pair.train": [A], "peer.model": B}}]}
    spec = base / "g.yaml"
    spec.write_text(yaml.safe_dump(grid, sort_keys=False))
    out = base / "grid"
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", "grid", str(spec), "--out", str(out), "--ray", c.address]
    code, log = finish(c.popen(cmd))
    assert code == 0, log[-4000:]
    names = ["rloo-on-ray-micro-s0", "grpo-stored-peer-micro-s0"]
    lines = log.splitlines()
    for name in names:
        assert f"[done] {name}" in log, log[-4000:]
        assert json.loads((out / name / "summary.json").read_text())["status"] == "done"
    first_done = next(i for i, x in enumerate(lines) if x.startswith(f"[done] {names[0]}"))
    assert next(i for i, x in enumerate(lines) if x.startswith(f"[new] {names[1]}")) > first_done
    nodes = dict(re.findall(r"^\s+(\S+) ran on node (127\.0\.0\.1:\d+)$", log, re.M))
    assert sorted(nodes) == sorted(names) and len(set(nodes.values())) == 2, log[-3000:]
    raw = yaml.safe_load((out / names[0] / "config.yaml").read_text())
    assert raw["run"]["backend"] == "ray" and raw["ray"]["address"] == c.address
    assert json.loads((out / names[1] / "summary.json").read_text())["peer_source"] == "stored"
    assert yaml.safe_load((out / names[1] / "config.yaml").read_text())["run"]["backend"] == "inprocess"
    plan = c.run([*cmd, "--dry-run"])
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert all(f"[done] {n}" in plan.stdout for n in names), plan.stdout   # a rerun skips them


def test_a_run_directory_a_node_does_not_share_fails_at_start_naming_the_node(cluster):
    """The worker node sees ``private/`` as another folder: a run there stops before any worker starts, with one
    line naming that node's address; nothing is left in the run directory's check folder."""
    c, base = cluster
    out = base / "private" / "runs"
    code, log = finish(c.popen(train_cmd(c, pair_file(base), out, *SPREAD)), 200)
    assert code == 1, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, log[-3000:]
    assert re.search(rf"is not shared with node 127\.0\.0\.1:{c.worker} \(", errors[0]), errors[0]
    assert "run.out_dir" in errors[0]
    assert "training ranks on nodes" not in log   # no group was started
    assert not (out / "r" / ".graftzoo-nodes").exists()


def test_a_node_per_model_the_cluster_cannot_give_fails_in_time_naming_the_model(cluster):
    """Three models, a node each (``ray.model_placement=spread``), on a cluster of two: the run stops after
    ``ray.ready_timeout_s`` with one line naming the first model, what it asked for and the cluster's nodes."""
    c, base = cluster
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", "grpo", "--pair", "micro3", "--no-track",
           "--backend", "ray"]
    for x in [f"ray.address={c.address}", f"run.out_dir={base / 'unplaced'}", "run.name=s", "ray.ready_timeout_s=2",
              "ray.model_placement=spread"]:
        cmd += ["--set", x]
    code, log = finish(c.popen(cmd), 200)
    assert code == 1, log[-3000:]
    assert re.search(rf"Error: model '{A}': its placement group \(one node per model, ray.model_placement=spread\) was "
                     rf"not ready after 2(\.0)? s; the cluster has .* over 2 node\(s\)", log), log[-3000:]


def test_a_node_lost_mid_run_ends_it_in_one_line_and_the_rerun_on_the_node_left_is_exact(cluster, one_process):
    """A model on each node with a rollout worker apart, k = 0 (each model's group of one rank): the worker node's
    raylet killed after the step-0 checkpoint ends the run within seconds with one line naming the node's address,
    the model and the rank of an actor it held; the same command, its models now packed on the node that remains
    (``ray.model_placement=pack``: free to change on resume; the rollout workers take the checkpoint's weights over
    their collective), resumes and gives the metrics of one process."""
    c, base = cluster
    out = base / "lost"
    cmd = train_cmd(c, pair_file(base, workers=1), out, "ray.model_placement=spread", "ray.rollout_workers=1",
                    "run.eval_at_end=false")
    p = c.popen(cmd)
    marker = out / "r" / "checkpoints" / "step_000000" / "manifest.json"
    deadline = time.time() + 300
    while not marker.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert marker.exists() and p.poll() is None, finish(p)[1][-3000:]
    c.kill_node(c.worker)
    t = time.perf_counter()
    code, log = finish(p, 180)
    took = time.perf_counter() - t
    assert code == 1, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, log[-3000:]
    assert re.search(rf"Error: model 'micro-[a-z0-9-]+': (worker rank|rollout worker) \d \(pid \d+, node "
                     rf"127\.0\.0\.1:{c.worker}\) died", errors[0]), errors[0]
    assert took < 60, took
    summary = json.loads((out / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and f"node 127.0.0.1:{c.worker}" in summary["error"]
    code, log = finish(c.popen([*cmd, "--set", "ray.model_placement=pack"]))
    assert code == 0, log[-4000:]
    assert re.search(r"resuming from step_00000[01] \([12] of 3 steps done\)", log), log[-3000:]
    assert set().union(*placed(log).values()) == {f"127.0.0.1:{p}" for p in c.nodes}   # the node left
    ref, got = one_process[2], metrics(out / "r")
    assert sorted(got) == sorted(ref) and len(ref) == 6
    # the engine/trainer gap is float noise of the forward each side decodes with (one process: the training model; a
    # rollout worker: its copy), ~1e-6 either way; every other number is one process's
    noise = "rollout/logp_diff_max"
    assert all(r[noise] < 1e-4 for r in [*got.values(), *ref.values()])
    assert_same({k: {x: v for x, v in r.items() if x != noise} for k, r in got.items()},
                {k: {x: v for x, v in r.items() if x != noise} for k, r in ref.items()}, 1e-5,
                "the resumed run against one process")
