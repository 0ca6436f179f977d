"""Checkpoint and trajectory-store integrity: checkpoints load with ``torch.load(weights_only=True)``
only (a planted pickle never runs), every file carries size + sha256 in a manifest written last, a corrupt latest
checkpoint is renamed aside and the previous intact one resumes the run exactly, killed saves' leftovers are
removed, pruning follows the recorded steps, store step files carry Parquet page checksums, and every corrupt
file is an error naming it. Through the real call path: ``train``, ``graftzoo eval``, ``TrajectoryStore``."""
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.training.run import checkpoint as C
from graftzoo.training.run.checkpoint import (CheckpointError, list_checkpoints, load_checkpoint, load_weights,
                                      prepare_resume, save_checkpoint, verify_checkpoint)
from graftzoo.contract.config import load_config
from graftzoo.eval.artifacts import ArtifactError
from graftzoo.training.trainer import Trainer, train
from graftzoo.training import selection
from graftzoo.training.eval_checkpoints import build_policies, load_run_config
from graftzoo.peers.sources import StoredPeer
from graftzoo.peers.store import StoreError, TrajectoryStore, read_step_file

MODELS = ("micro-qwen-char", "micro-gpt2-pair")


def micro_cfg(*overrides, algo="grpo"):
    return load_config(pair="micro", algo=algo, overrides=["run.track=false", "run.eval_at_end=false",
                                                           "run.progress=false", *overrides])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 3-step micro run keeping every checkpoint (steps 0, 1, 2); tests work on copies of it."""
    return train(micro_cfg("run.steps=3", "run.save_every=1", "run.keep_checkpoints=0"),
                 run_dir=str(tmp_path_factory.mktemp("integrity") / "base"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same run, uninterrupted, for 4 steps."""
    return train(micro_cfg("run.steps=4", "run.save_every=1", "run.keep_checkpoints=0"),
                 run_dir=str(tmp_path_factory.mktemp("integrity") / "ref"))


def copy_run(base: Path, dst: Path) -> Path:
    shutil.copytree(base, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def weights(ck: Path) -> dict:
    return {m: torch.load(ck / f"{m}.pt", weights_only=True)["policy"]["model"] for m in MODELS}


def metric_rows(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "async/overlap_s"))} for r in rows]


def reseal(ck: Path, name: str):
    """What the author of a tampered download does: record the planted file's size and hash in the manifest."""
    doc = json.loads((ck / C.MANIFEST).read_text())
    data = (ck / name).read_bytes()
    doc["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    body = {k: v for k, v in doc.items() if k != "sha256"}
    doc["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (ck / C.MANIFEST).write_text(json.dumps(doc))


class Planted:
    """A pickle payload: unpickling it creates ``marker`` (any code could run instead)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def flip_byte(path: Path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def one_line_cli_error(res, *needles):
    assert res.exit_code == 1, res.output
    lines = [x for x in res.output.splitlines() if x.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in lines[0], (n, lines[0])


# ------------------------------------------------------------------------------------------------
# the format
# ------------------------------------------------------------------------------------------------

def test_checkpoint_files_are_tensors_only_and_recorded_in_the_manifest(base):
    ck = list_checkpoints(base)[-1]
    doc = verify_checkpoint(ck)
    assert doc["step"] == 2 and doc["extra"]["sampler"] == {"step": 3} and "compute" in doc["extra"]
    assert set(doc["files"]) == {C.TRAINER_FILE, *(f"{m}.pt" for m in MODELS)}
    for name, rec in doc["files"].items():
        data = (ck / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(ck / name)) == []
        torch.load(ck / name, weights_only=True)
    written_last = (ck / C.MANIFEST).stat().st_mtime_ns
    assert written_last >= max((ck / n).stat().st_mtime_ns for n in doc["files"])


def test_stateful_learners_resume_through_weights_only(tmp_path):
    """Learners with state (ExTra memories and queue, HORA and HACPO histories, SGT) save tensors and plain
    containers only: a resume loads them with weights_only=True and gets the same state back."""
    for algo, extra in (("extra", []), ("hora", []), ("hacpo", ["peer.source=online"]),
                        ("sgt", ["peer.source=online"])):
        run = tmp_path / algo
        train(micro_cfg("run.steps=2", *extra, algo=algo), run_dir=str(run))
        ck = list_checkpoints(run)[-1]
        saved = {m: torch.load(ck / f"{m}.pt", weights_only=True)["learner"] for m in MODELS}
        if algo != "sgt":
            assert any(saved.values()), f"{algo}: no learner state saved, the check would be vacuous"
        tr = Trainer(micro_cfg("run.steps=2", *extra, algo=algo), run_dir=str(tmp_path / f"{algo}-fresh"))
        try:
            load_checkpoint(ck, tr.policies, tr.learners)
            for m in MODELS:
                again = tr.learners[m].state_dict()
                assert _same(again, saved[m]), (algo, m)
        finally:
            tr.close()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# ------------------------------------------------------------------------------------------------
# safe loading
# ------------------------------------------------------------------------------------------------

def test_planted_pickle_never_runs(base, tmp_path):
    run = copy_run(base, tmp_path / "run")
    ck = list_checkpoints(run)[-1]
    probe = tmp_path / "probe"
    torch.save({"policy": Planted(probe)}, tmp_path / "probe.pt")
    torch.load(tmp_path / "probe.pt", weights_only=False)
    assert probe.exists(), "the payload is live: unpickling it without weights_only runs it"

    marker = tmp_path / "pwned"
    bad = ck / f"{MODELS[1]}.pt"
    torch.save({"policy": Planted(marker)}, bad)

    # as planted: the manifest's size / hash check refuses it before it is read
    pol = build_policies(load_run_config(run), [MODELS[1]])[MODELS[1]]
    with pytest.raises(CheckpointError, match=f"{bad}: corrupt"):
        load_weights(pol, ck)
    # with the manifest resealed by the planter: weights_only refuses it
    reseal(ck, bad.name)
    with pytest.raises(CheckpointError, match="cannot be loaded safely") as e:
        load_weights(pol, ck)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(ck), "--benchmarks", "heldout", "--limit", "1",
                                    "--k", "1", "--model", MODELS[1]])
    one_line_cli_error(res, str(bad), "cannot be loaded safely")
    # resuming the run: an error naming the file, not a fallback to an older checkpoint
    with pytest.raises(CheckpointError, match="cannot be loaded safely") as e:
        train(micro_cfg("run.steps=4", "run.save_every=1", "run.keep_checkpoints=0"), run_dir=str(run))
    assert str(bad) in str(e.value)
    assert not marker.exists()


def test_planted_trainer_file_never_runs(base, tmp_path):
    run = copy_run(base, tmp_path / "run")
    ck = list_checkpoints(run)[-1]
    marker = tmp_path / "pwned"
    torch.save({"torch": Planted(marker)}, ck / C.TRAINER_FILE)
    reseal(ck, C.TRAINER_FILE)
    with pytest.raises(CheckpointError, match="cannot be loaded safely") as e:
        train(micro_cfg("run.steps=4"), run_dir=str(run))
    assert str(ck / C.TRAINER_FILE) in str(e.value)
    assert not marker.exists()


def test_old_format_checkpoint_is_refused_in_one_line(base, tmp_path):
    """An older graftzoo's checkpoint (trainer.pt with pickled numpy state, no manifest): resuming refuses it by
    name; evaluating still reads its model file, which loads with weights_only=True."""
    run = copy_run(base, tmp_path / "run")
    for ck in list_checkpoints(run)[:-1]:
        shutil.rmtree(ck)
    ck = list_checkpoints(run)[-1]
    (ck / C.MANIFEST).unlink()
    torch.save({"step": 2, "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                                   "torch": torch.get_rng_state()}, "wandb_id": None}, ck / C.TRAINER_FILE)
    with pytest.raises(CheckpointError) as e:
        train(micro_cfg("run.steps=4"), run_dir=str(run))
    msg = str(e.value)
    assert msg.startswith(str(ck / C.TRAINER_FILE)) and "older graftzoo" in msg and "cannot be loaded safely" in msg
    assert "\n" not in msg and ck.is_dir()
    pol = build_policies(load_run_config(run), [MODELS[0]])[MODELS[0]]
    load_weights(pol, ck)
    assert pol.version == 3


def test_save_refuses_state_that_would_not_load_safely(tmp_path):
    class Learner:
        def state_dict(self):
            return {"history": {"p": np.float64(1.0)}}   # a numpy scalar: needs a pickled global

    with pytest.raises(CheckpointError, match=r"micro\.pt: would not load with torch\.load\(weights_only=True\)"):
        save_checkpoint(tmp_path, 0, {"micro": FakePolicy()}, {"micro": Learner()}, {})
    with pytest.raises(CheckpointError, match="extra.peers.cursor: ndarray is not plain JSON"):
        save_checkpoint(tmp_path, 0, {"micro": FakePolicy()}, {"micro": FakeLearner()},
                        {"peers": {"cursor": np.zeros(2)}})
    assert list((tmp_path / "checkpoints").iterdir()) == []   # nothing half-written left behind


def test_a_shard_the_driver_cannot_see_fails_the_save_naming_the_model_and_the_file(tmp_path):
    """A worker group's shard written on a node that does not share the run directory: the save stops with one
    line naming the model and the file, and no checkpoint lists a shard the driver cannot read."""
    class ShardedElsewhere(FakePolicy):
        def checkpoint_state(self, folder, stem):
            (Path(folder) / f"{stem}.dcp").mkdir()
            (Path(folder) / f"{stem}.dcp" / "__0_0.distcp").write_bytes(b"rank 0")   # rank 0: here
            return {"sharded": True}, [f"{stem}.dcp/__0_0.distcp", f"{stem}.dcp/__1_0.distcp"]  # rank 1: elsewhere

    with pytest.raises(CheckpointError, match=r"model 'micro': its worker wrote the checkpoint file "
                                              r"micro\.dcp/__1_0\.distcp, but this process does not find it") as e:
        save_checkpoint(tmp_path, 0, {"micro": ShardedElsewhere()}, {"micro": FakeLearner()}, {})
    assert "not shared" in str(e.value) and "\n" not in str(e.value)
    assert list((tmp_path / "checkpoints").iterdir()) == []


# ------------------------------------------------------------------------------------------------
# corruption: fall back to the previous intact checkpoint, exactly
# ------------------------------------------------------------------------------------------------

def _truncate(ck):
    p = ck / f"{MODELS[1]}.pt"
    p.write_bytes(p.read_bytes()[:1000])
    return p.name


def _flip(ck):
    flip_byte(ck / f"{MODELS[0]}.pt")    # same size: only the hash sees it
    return f"{MODELS[0]}.pt"


def _empty_trainer(ck):
    (ck / C.TRAINER_FILE).write_bytes(b"")
    return C.TRAINER_FILE


def _garble_manifest(ck):
    (ck / C.MANIFEST).write_text('{"format": "graftzoo-checkpoint", "step": 2, "fi')
    return C.MANIFEST


@pytest.mark.parametrize("corrupt", [_truncate, _flip, _empty_trainer, _garble_manifest])
def test_corrupt_latest_checkpoint_resumes_exactly_from_the_previous_one(base, reference, tmp_path, caplog,
                                                                         corrupt):
    run = copy_run(base, tmp_path / "run")
    latest = list_checkpoints(run)[-1]
    bad = corrupt(latest)
    damaged = (latest / bad).read_bytes()
    leftover = run / "checkpoints" / ".tmp-step_000003-4242"   # a killed save of step 3
    leftover.mkdir()
    (leftover / f"{MODELS[0]}.pt").write_bytes(b"0" * 3000)

    with caplog.at_level(logging.WARNING, logger="graftzoo"):
        out = train(micro_cfg("run.steps=4", "run.save_every=1", "run.keep_checkpoints=0"), run_dir=str(run))
    warned = [r.getMessage() for r in caplog.records if r.name == "graftzoo"]
    fell_back = [w for w in warned if str(latest) in w and "step_000002.corrupt" in w]
    assert fell_back and bad in fell_back[0], warned
    assert any(str(leftover) in w and "2.9 KiB" in w for w in warned), warned
    assert not leftover.exists()
    aside = run / "checkpoints" / "step_000002.corrupt"
    assert (aside / bad).read_bytes() == damaged, "the corrupt checkpoint is kept as it was"
    # the replayed steps equal the uninterrupted run's: metrics and final weights
    assert metric_rows(out) == metric_rows(reference)
    a, b = weights(list_checkpoints(out)[-1]), weights(list_checkpoints(reference)[-1])
    assert list_checkpoints(out)[-1].name == "step_000003"
    assert all(torch.equal(a[m][k], b[m][k]) for m in MODELS for k in a[m])


def test_prepare_resume_skips_every_failing_checkpoint_and_renames_each_aside(base, tmp_path, caplog):
    run = copy_run(base, tmp_path / "run")
    c0, c1, c2 = list_checkpoints(run)
    _flip(c2)
    _empty_trainer(c1)
    shutil.copytree(c0, run / "checkpoints" / "step_000001.corrupt")   # an earlier one already set aside
    with caplog.at_level(logging.WARNING, logger="graftzoo"):
        assert prepare_resume(run) == c0
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_000000", "step_000001.corrupt", "step_000001.corrupt-2", "step_000002.corrupt"]
    assert sum(str(c) in r.getMessage() for r in caplog.records for c in (c1, c2)) == 2
    assert prepare_resume(run) == c0 and prepare_resume(tmp_path / "nothing") is None


def test_size_only_verification_misses_a_flipped_byte_that_the_hash_catches(base, tmp_path):
    run = copy_run(base, tmp_path / "run")
    ck = list_checkpoints(run)[-1]
    verify_checkpoint(ck)
    _flip(ck)
    verify_checkpoint(ck, hash_files=False)          # same size
    with pytest.raises(CheckpointError, match=f"{ck / MODELS[0]}.pt: corrupt: sha256"):
        verify_checkpoint(ck)
    _truncate(ck)
    with pytest.raises(CheckpointError, match=f"{ck / MODELS[1]}.pt: corrupt: 1000 bytes"):
        verify_checkpoint(ck, hash_files=False)


def test_eval_of_a_corrupt_checkpoint_names_it_and_a_run_dir_uses_the_previous(base, tmp_path, caplog):
    run = copy_run(base, tmp_path / "run")
    c0, c1, c2 = list_checkpoints(run)
    _truncate(c2)
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(c2), "--benchmarks", "heldout", "--limit", "1",
                                    "--k", "1", "--model", MODELS[1]])
    one_line_cli_error(res, f"{c2 / MODELS[1]}.pt", "corrupt")
    cfg = load_run_config(run)
    pols = build_policies(cfg)
    with caplog.at_level(logging.WARNING, logger="graftzoo"):
        out = selection.select_checkpoints(run, cfg, pols, {}, rule="last")
    for m in MODELS:
        ck, rec = out[m]
        assert ck == c1 and rec["candidates"] == [0, 1] and list(rec["skipped"]) == ["2"]
    assert any(str(c2) in r.getMessage() for r in caplog.records)
    assert c2.is_dir() and not list(run.glob("checkpoints/*corrupt*")), "evaluation changes nothing on disk"


def test_garbled_run_config_is_one_line_naming_the_file(base, tmp_path):
    run = copy_run(base, tmp_path / "run")
    path = run / "config.yaml"
    for text in (b"pair: [unclosed\n  models: {", b"\xff\xfe\x00garbage", b"- a list\n", b"run: {seed: 0}\n"):
        path.write_bytes(text)
        with pytest.raises(ArtifactError) as e:  # a broken file of the run: exit 1, not a usage error
            load_run_config(run)
        assert str(e.value).startswith(str(path)) and len(str(e.value).splitlines()) == 1, str(e.value)
    path.write_bytes(b"pair: [unclosed\n")
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(run), "--benchmarks", "heldout", "--limit", "1"])
    one_line_cli_error(res, str(path), "invalid YAML")


# ------------------------------------------------------------------------------------------------
# killed saves, pruning (with cheap stand-ins for policies and learners)
# ------------------------------------------------------------------------------------------------

class FakePolicy:
    model_id = "micro"

    def __init__(self, n=1000):
        self.w = torch.arange(n, dtype=torch.float32)

    def state_dict(self):
        return {"model": {"w": self.w.clone()}, "version": 1}

    def checkpoint_state(self, folder, stem):
        return self.state_dict(), []

    def load_state_dict(self, state, folder=None):
        self.w = state["model"]["w"]


class FakeLearner:
    def state_dict(self):
        return {"history": {"p": [1.0, 2.0]}}

    def load_state_dict(self, state):
        self.state = state


@pytest.mark.slow
def test_a_killed_save_leaves_a_leftover_that_resume_removes(tmp_path, caplog):
    save_checkpoint(tmp_path, 0, {"a": FakePolicy()}, {"a": FakeLearner()}, {"wandb_id": None})
    script = textwrap.dedent(f"""
        import time, torch
        from graftzoo.training.run.checkpoint import save_checkpoint
        class P:
            def __init__(self, slow): self.slow = slow
            def state_dict(self):
                if self.slow:
                    time.sleep(600)    # killed here: model a is written, model b is not
                return {{"model": {{"w": torch.zeros(300000)}}}}
            def checkpoint_state(self, folder, stem): return self.state_dict(), []
        class L:
            def state_dict(self): return {{}}
        save_checkpoint({str(tmp_path)!r}, 1, {{"a": P(False), "b": P(True)}}, {{"a": L(), "b": L()}}, {{}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list((tmp_path / "checkpoints").glob(".tmp-step_000001-*/a.pt")):
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = list((tmp_path / "checkpoints").glob(".tmp-step_000001-*"))
    assert len(left) == 1 and (left[0] / "a.pt").stat().st_size > 10 ** 6
    with caplog.at_level(logging.WARNING, logger="graftzoo"):
        assert prepare_resume(tmp_path) == C.checkpoint_dir(tmp_path, 0)
    assert not left[0].exists()
    msgs = [r.getMessage() for r in caplog.records]
    assert any(str(left[0]) in m and "MiB" in m for m in msgs), msgs
    pol, learner = FakePolicy(3), FakeLearner()
    state = load_checkpoint(C.checkpoint_dir(tmp_path, 0), {"a": pol}, {"a": learner})
    assert state == {"wandb_id": None, "step": 0} and pol.w.shape == (1000,) and learner.state["history"]


def test_pruning_keeps_the_newest_by_recorded_step_and_never_the_set_aside(tmp_path):
    pols, learners = {"a": FakePolicy(4)}, {"a": FakeLearner()}
    save_checkpoint(tmp_path, 50, pols, learners, {})            # a later step of an earlier run: not this one's
    save_checkpoint(tmp_path, 3, pols, learners, {}, keep=0)
    os.replace(C.checkpoint_dir(tmp_path, 3), tmp_path / "checkpoints" / "step_000003.corrupt")
    for s in (1, 2, 3, 4, 5):
        save_checkpoint(tmp_path, s, pols, learners, {}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000003.corrupt", "step_000004", "step_000005", "step_000050"]
    root = tmp_path / "big"
    for s in (999_998, 999_999, 1_000_000):                      # past six digits: ordered by step, not by name
        save_checkpoint(root, s, pols, learners, {}, keep=2)
    assert [C.checkpoint_step(p) for p in list_checkpoints(root)] == [999_999, 1_000_000]
    assert C.latest_checkpoint(root).name == "step_1000000"


def test_extras_round_trip_as_json_and_rng_states_are_restored(tmp_path):
    extra = {"wandb_id": "abc", "peers": {"cursor": [1, 2]}, "compute": {"t": 0.1 + 0.2, "n": None}}
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # a cached gaussian in numpy's state
    ck = save_checkpoint(tmp_path, 7, {"a": FakePolicy()}, {"a": FakeLearner()}, extra)
    expect = (random.random(), np.random.randn(), float(torch.rand(1)))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    state = load_checkpoint(ck, {"a": FakePolicy(2)}, {"a": FakeLearner()})
    assert (random.random(), np.random.randn(), float(torch.rand(1))) == expect
    assert state == {**extra, "step": 7}


# ------------------------------------------------------------------------------------------------
# the trajectory store
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"schema_version": 1, "models": [1], "dataset": null}',
                                  '{"schema_version": 1, "models": {}, "dataset": 3}', "\udcff"])
def test_corrupt_store_meta_is_a_store_error_naming_the_file(tmp_path, text):
    root = tmp_path / "store"
    root.mkdir()
    meta = root / "meta.json"
    meta.write_bytes(text.encode("utf-8", "surrogateescape"))
    for make in (lambda: TrajectoryStore(root, create=False), lambda: TrajectoryStore(root),
                 lambda: StoredPeer(root)):
        with pytest.raises(StoreError) as e:
            make()
        assert str(e.value).startswith(str(meta)) and "\n" not in str(e.value), str(e.value)


def test_corrupt_store_meta_stops_a_resume_naming_the_file(base, tmp_path):
    run = copy_run(base, tmp_path / "run")
    (run / "store" / "meta.json").write_text('{"schema_version": 1, "models": {"a": ')
    with pytest.raises(StoreError, match=f"{run / 'store' / 'meta.json'}: corrupt"):
        train(micro_cfg("run.steps=4"), run_dir=str(run))


def _silent_flip(path: Path, column: str) -> int:
    """An offset inside ``column``'s pages whose flipped byte reads back without error but with other values
    when page checksums are not verified (so the check below is not vacuous, compressed or not)."""
    raw = path.read_bytes()
    clean = pq.read_table(path)
    md = pq.ParquetFile(path).metadata.row_group(0)
    col = next(md.column(i) for i in range(md.num_columns) if md.column(i).path_in_schema == column)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    for off in range(start + col.total_compressed_size - 1, start, -1):
        data = bytearray(raw)
        data[off] ^= 0x01
        path.write_bytes(bytes(data))
        try:
            if not pq.read_table(path).equals(clean):
                return off
        except Exception:  # noqa: BLE001 - a flip that breaks decoding: not a silent one, try another
            pass
    path.write_bytes(raw)
    raise AssertionError(f"no silent flip found in column {column}")


@pytest.mark.parametrize("column", ["text", "reward"])
def test_a_flipped_bit_in_a_step_file_is_caught_by_page_checksums(base, tmp_path, column):
    run = copy_run(base, tmp_path / "run")
    store = TrajectoryStore(run / "store", create=False)
    path = run / "store" / MODELS[0] / "step_000001.parquet"
    before = store.read(MODELS[0])
    _silent_flip(path, column)
    silently = pq.read_table(path).to_pandas()   # without verification: wrong values, no error
    assert not silently[column].equals(before[before["step"] == 1].reset_index(drop=True)[column])
    for read in (lambda: store.read(MODELS[0]), lambda: read_step_file(path),
                 lambda: StoredPeer(run, model=MODELS[0])):
        with pytest.raises(StoreError, match="CRC checksum") as e:
            read()
        assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)
    assert len(store.read(MODELS[0], steps=[0, 2])) == len(before) * 2 // 3   # the other steps stay readable
