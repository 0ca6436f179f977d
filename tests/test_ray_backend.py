"""``graftzoo train --backend ray``: each model in its own group of Ray workers, FSDP2 over a group's
ranks (gloo), sharded checkpoints, driven through the ``graftzoo`` command in real processes.

Every Ray run here starts its own private cluster on 127.0.0.1 inside a loopback-only network and PID namespace
(``unshare -n -p -f --mount-proc``): nothing can leave the machine, and every process of the run (the driver, Ray's
own processes, the workers) ends with the namespace's first process, also when the test kills the driver.

The pair: micro-qwen-char in a group of 1 worker, micro-gpt2-pair sharded by FSDP2 over 2 workers; GRAFT with
online exchange, micro-batches of at most 200 tokens (so that both ranks train real micro-batches), 3 seeded steps;
the shared run with rollouts one step ahead (``rollout.max_staleness=1``), the resumed one without.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from graftzoo.training.run.checkpoint import latest_checkpoint, load_weights
from graftzoo.contract.config import load_config, packaged_configs
from graftzoo.training.planner.build import build_policy
from graftzoo.api import train_run as train
from graftzoo.training.eval_runner import evaluate_checkpoint
from helpers import plugin_site

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

# PYTHONFAULTHANDLER: a process that crashes (a rank aborted by a C++ library) prints the Python stack of each thread;
# GLOO_SOCKET_IFNAME: the ranks that tests start themselves use gloo on loopback, as a Ray run's ranks do (ray_env)
ENV = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
           PYTHONFAULTHANDLER="1", GLOO_SOCKET_IFNAME="lo")
SETS = ["task.difficulty=1", "rollout.n=8", "optim.max_tokens_per_micro=200", "run.steps=3", "run.save_every=1",
        "eval.size=4", "run.keep_checkpoints=3"]
A, B, C = "micro-qwen-char", "micro-gpt2-pair", "micro-llama-triple"
# the resumed run's algorithm: HACPO with a KL reference, its models one after the other
HACPO = ["algo.beta_kl=0.05", "ray.concurrent_models=false", "run.eval_at_end=false"]
# the shared run's schedule: each step's rollouts collected one step ahead, before the update (a group's calls queue
# one at a time on Ray, so nothing overlaps), decoded by the weights one version old after step 0
AHEAD = ["rollout.max_staleness=1"]
SKIP_KEYS = ("time/", "perf/", "async/overlap_s")   # wall-clock figures differ from run to run


def pair_file(tmp: Path, workers: int = 2, pair: str = "micro") -> Path:
    """The micro pair (or ``micro3``, the population of three) with B's group of ``workers`` ranks."""
    models = yaml.safe_load((packaged_configs() / "pairs" / f"{pair}.yaml").read_text())["models"]
    models[1]["num_workers"] = workers
    f = tmp / f"{pair}_ray_{workers}.yaml"
    f.write_text(yaml.safe_dump({"pair": {"models": models}}))
    return f


def train_cmd(out: Path, pair: Path, *extra) -> list:
    """``graftzoo train`` of GRAFT on Ray, the models of ``pair`` (a ``pair_file``, whose name says its pair)."""
    args = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", "graft", "--pair", pair.name.split("_ray_")[0],
            "--peer",
            "online", "--no-track", "--backend", "ray", "-c", str(pair), "--set", f"run.out_dir={out}",
            "--set", "run.name=r", "--set", "run.progress=false"]
    for s in [*SETS, *extra]:
        args += ["--set", s]
    return args


def loopback(cmd: list, **kw) -> subprocess.Popen:
    """``cmd`` in a fresh network namespace holding only ``lo`` and a fresh PID namespace (its processes die with
    it). Without the rights to make one (not root), the command runs as it is, still on 127.0.0.1 only."""
    inner = "ip link set lo up && " + " ".join(shlex.quote(c) for c in cmd)
    if shutil.which("unshare") and os.geteuid() == 0:
        cmd = ["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c", inner]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finish(p: subprocess.Popen, timeout: float = 400) -> tuple[int, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the run did not finish within {timeout} s:\n{err[-3000:]}")
    return p.returncode, out + err


def metrics(run: Path) -> dict:
    """(step, model) -> the step's logged numbers, wall-clock figures left out."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("step", -1) >= 0 and r.get("loss") is not None:
            out[(r["step"], r["model"])] = {k: v for k, v in r.items()
                                            if isinstance(v, (int, float)) and not k.startswith(SKIP_KEYS)}
    return out


def assert_same(got: dict, want: dict, rel: float, what: str):
    assert sorted(got) == sorted(want), what
    for key, row in want.items():
        for k, v in row.items():
            assert got[key].get(k) == pytest.approx(v, rel=rel, abs=rel * 1e-3), f"{what}: {key} {k}"


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    """One uninterrupted Ray run of a population of three (``micro3``: 3 worker groups, A and C of 1 rank, B of 2)
    with rollouts one step ahead (``rollout.max_staleness=1``; its wall time is printed)."""
    tmp = tmp_path_factory.mktemp("ray")
    pair = pair_file(tmp, pair="micro3")
    t = time.perf_counter()
    code, log = finish(loopback(train_cmd(tmp / "full", pair, *AHEAD)))
    assert code == 0, log[-4000:]
    print(f"\nRay run: 3 steps of a co-trained population of three (1 + 2 + 1 workers) in "
          f"{time.perf_counter() - t:.1f} s")
    return tmp, pair, tmp / "full" / "r"


def test_ray_backend_trains_like_the_in_process_trainer(ray_run, tmp_path):
    """A GRAFT population of three, 3 worker groups: the same seeded metrics as one process with the same schedule
    (``rollout.max_staleness=1``: every step's own rollouts one version old after step 0), for the models in a group
    of 1 (to 1e-6: the same floating-point operations in another process) and a model sharded by FSDP2 over 2 gloo
    ranks (loss to 1e-5: the ranks' gradients are summed in another order)."""
    _, _, run = ray_run
    cfg = load_config(pair="micro3", algo="graft", overrides=[
        "peer.source=online", "run.track=false", "run.progress=false", f"run.out_dir={tmp_path}", "run.name=r", *SETS,
        *AHEAD])
    ref_dir = train(cfg)
    ref, got = metrics(ref_dir), metrics(run)
    assert sorted(got) == sorted(ref) and len(ref) == 9
    assert [ref[(s, A)]["async/staleness_max"] for s in range(3)] == [0, 1, 1]
    assert [got[(s, B)]["async/staleness_max"] for s in range(3)] == [0, 1, 1]
    assert any(r.get("async/is_weight_mean", 1.0) != 1.0 for r in ref.values())   # the weights moved
    assert all(sum(k.startswith("peer/comp/") for k in r) == 2 for r in got.values())   # each learner: 2 peers
    for m in (A, C):
        assert_same({k: v for k, v in got.items() if k[1] == m}, {k: v for k, v in ref.items() if k[1] == m}, 1e-6, m)
    for key, row in ref.items():
        if key[1] == B:
            assert got[key]["loss"] == pytest.approx(row["loss"], rel=1e-5, abs=1e-8), key
            assert got[key]["grad_norm"] == pytest.approx(row["grad_norm"], rel=1e-5), key
            assert got[key]["reward/mean"] == row["reward/mean"], key   # the same rollouts
    assert any(abs(r["loss"]) > 1e-4 for r in ref.values())        # it trained on something
    # the sharded model's checkpoints are torch.distributed.checkpoint shards, one file per rank, in the manifest
    ck = sorted((run / "checkpoints").glob("step_*"))[-1]
    files = json.loads((ck / "manifest.json").read_text())["files"]
    assert {f"{B}.dcp/__0_0.distcp", f"{B}.dcp/__1_0.distcp", f"{B}.dcp/.metadata"} <= set(files)
    assert not any(f.startswith(A + ".dcp") for f in files)       # a group of one saves whole tensors
    # one process (graftzoo eval) reads the shards without a process group: the weights one process trained
    spec = next(s for s in cfg.pair.models if s.id == B)
    sharded, whole = build_policy(spec, cfg), build_policy(spec, cfg)
    load_weights(sharded, ck)
    load_weights(whole, latest_checkpoint(ref_dir))
    assert sharded.version == whole.version == 3
    ws = whole.model.state_dict()
    for name, x in sharded.model.state_dict().items():
        assert torch.allclose(x, ws[name], rtol=1e-4, atol=1e-5), name   # lr 1e-4: a wrong load is far off
    fresh = build_policy(spec, cfg).model.state_dict()
    assert any(not torch.equal(ws[n], v) for n, v in fresh.items())   # it trained
    out = evaluate_checkpoint(run, benchmarks=["heldout"], k=1, limit=2)
    assert sorted(Path(p).name for p in out) == sorted(f"{m}.json" for m in (A, B, C))


def test_hacpo_killed_with_kill_9_resumes_on_ray_like_in_process_with_the_models_one_after_the_other(ray_run):
    """A HACPO population of three with a KL reference, the models stepped one after the other
    (``ray.concurrent_models=false``; the shared run steps them at once): the driver killed (SIGKILL) after its step-1
    checkpoint takes every process of the run along; the same command resumes from that checkpoint (the sharded model
    through DCP, HACPO's history of every peer through the learner state sent with each update) and the run's metrics
    are one process's: the models in a group of 1 to 1e-6,
    the sharded one to 1e-5 (the ranks' gradients summed in another order). Along the way the parts of a step that
    live in the workers for other algorithms: cross-tokenizer scoring of the peer's rollouts (``score_sequences``
    in the group), sequence-level cross terms, and the KL reference policy held by every rank of a sharded group."""
    tmp, pair, _ = ray_run
    out = tmp / "killed"
    cmd = train_cmd(out, pair, *HACPO)
    cmd[cmd.index("graft")] = "hacpo"
    p = loopback(cmd)
    marker = out / "r" / "checkpoints" / "step_000001" / "manifest.json"
    deadline = time.time() + 300
    while not marker.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert marker.exists() and p.poll() is None, finish(p)[1][-3000:]
    driver = [c for c in psutil.Process(p.pid).children(recursive=True) if "graftzoo.apps.cli" in " ".join(c.cmdline())]
    assert driver, "the driver process was not found"
    driver[0].send_signal(signal.SIGKILL)
    code, _ = finish(p, 60)
    assert code != 0
    assert not [c for c in psutil.Process().children(recursive=True) if c.is_running() and c.status() != "zombie"
                and "ray" in " ".join(c.cmdline())], "Ray processes outlived the killed run"
    code, log = finish(loopback(cmd))
    assert code == 0, log[-4000:]
    assert re.search(r"resuming from step_00000[12] \([23] of 3 steps done\)", log), log[-3000:]
    cfg = load_config(pair="micro3", algo="hacpo", overrides=[
        "peer.source=online", "run.track=false", "run.progress=false", f"run.out_dir={tmp}", "run.name=ref",
        *SETS, *HACPO])
    ref, got = metrics(train(cfg)), metrics(out / "r")
    assert sorted(got) == sorted(ref) and len(ref) == 9
    for m in (A, C):
        assert_same({k: v for k, v in got.items() if k[1] == m}, {k: v for k, v in ref.items() if k[1] == m}, 1e-6, m)
    for key, row in ref.items():
        for k in ("loss", "grad_norm", "kl", "hacpo/cross_lower", "reward/mean"):
            assert got[key][k] == pytest.approx(row[k], rel=1e-5, abs=1e-8), (key, k)
    assert any(r["kl"] > 0 for r in ref.values()) and any(r.get("tokens/peer_share") for r in ref.values())


class _Ref:
    def __init__(self, rank, outcome):
        self.rank, self.outcome = rank, outcome


@pytest.mark.parametrize("other", ["died", "ok", "own error"])
def test_a_rank_failing_in_a_collective_is_reported_after_the_rank_that_died(monkeypatch, other):
    """Rank 0's gloo error reaches the driver before Ray sees that rank 1 died: the line names the dead rank (the
    cause). When no rank died, rank 0's own error is reported as it was raised."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError
    from graftzoo.distributed.backend import WorkerGroup
    from graftzoo.distributed.errors import WorkerDied

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection reset by peer")
    outcomes = {0: RayTaskError("step", "tb", gloo),
                1: {"died": RayActorError(), "ok": 1.0, "own error": RayTaskError("step", "tb", ValueError("x"))}[other]}

    class Actor:
        def __init__(self, rank):
            self.step = type("M", (), {"remote": lambda _, *a, **k: _Ref(rank, outcomes[rank])})()

    def get(ref):
        if isinstance(ref, list):
            return [get(r) for r in ref]
        if isinstance(ref.outcome, BaseException):
            raise ref.outcome
        return ref.outcome

    monkeypatch.setattr(ray, "wait", lambda pending, num_returns=1, timeout=None: (pending[:1], pending[1:]))
    monkeypatch.setattr(ray, "get", get)
    group = WorkerGroup.__new__(WorkerGroup)
    group.model_id, group.world, group.pids, group.broken = "m", 2, [11, 22], False
    group.nodes, group.rollouts, group.rollout_pids, group.rollout_nodes = ["n0", "n1"], [], [], []
    group.actors = [Actor(0), Actor(1)]
    if other == "died":
        with pytest.raises(WorkerDied, match=r"model 'm': worker rank 1 \(pid 22, node n1\) died during step"):
            group.call("step")
    else:
        with pytest.raises(RuntimeError, match=r"Connection reset by peer \[model 'm', worker rank 0\]"):
            group.call("step")
    assert group.broken


def test_a_plugin_learner_resolves_in_the_workers_and_its_failure_comes_back_whole(tmp_path):
    """An algorithm registered by entry point (a plugin on PYTHONPATH) is built inside the workers, and a
    non-finite loss raised there reaches the user as the in-process trainer reports it."""
    site = plugin_site(tmp_path)
    env_path = f"{site}{os.pathsep}{ENV.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-m", "graftzoo.apps.cli", "train", "--algo", "no_eps", "--pair", "micro", "--no-track",
           "--backend", "ray", "--set", f"run.out_dir={tmp_path}", "--set", "run.name=p", "--set", "run.steps=2",
           "--set", f"pair.train=[{A}]", "--set", "run.progress=false"]
    p = loopback(["env", f"PYTHONPATH={env_path}", *cmd])
    code, log = finish(p)
    assert code == 1, log[-3000:]
    assert f"Error: non-finite loss (nan) at model '{A}', step 0, minibatch 0" in log, log[-3000:]
    assert "worker rank 0" in log


def test_a_group_that_cannot_be_placed_fails_in_time_naming_the_model_and_what_it_asked(monkeypatch):
    """A placement group that never becomes ready (STRICT_SPREAD of 2 workers on one node stays pending, measured in
    the scale-out note; a cluster of several nodes runs it for real: tests/test_cluster.py) ends the start after
    ``ray.ready_timeout_s`` with one line naming the model, its bundles and strategy, and the cluster's nodes."""
    import ray
    from graftzoo.distributed import backend
    from graftzoo.distributed.backend import WorkerGroup
    from graftzoo.distributed.errors import WorkerError

    waited = []
    monkeypatch.setattr(ray, "wait", lambda refs, timeout=None, **kw: (waited.append(timeout), ([], refs))[1])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(backend, "alive_nodes", lambda: [{"NodeID": "n0"}])
    cfg = load_config(pair="micro", algo="grpo", overrides=["ray.num_workers=2", "ray.placement=STRICT_SPREAD",
                                                            "ray.ready_timeout_s=3"])
    group = WorkerGroup.__new__(WorkerGroup)
    group.model_id, group.world, group.apart, group.shared = A, 2, 0, None
    group.bundle, group.pg = {"CPU": 1.0}, type("PG", (), {"ready": lambda self: "ref"})()
    with pytest.raises(WorkerError, match=rf"model '{A}': its placement group \(2 x \{{'CPU': 1.0\}}, STRICT_SPREAD\) was "
                                          r"not ready after 3.0 s; the cluster has \{'CPU': 4.0\} over 1 node\(s\)"):
        group._start(cfg.pair.models[0], cfg, 0, 0.0)
    assert waited == [3.0]

