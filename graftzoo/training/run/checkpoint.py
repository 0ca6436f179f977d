"""Checkpoint / resume: both models and optimizers, learner state, data cursor, RNG states, the
step, peer cursors and the wandb run id. Written atomically (temp dir, then rename); the newest
``keep`` checkpoints of the run are kept.

The layout is defined here and only here::

    RUN/checkpoints/step_000012/          checkpoint_dir(RUN, 12); checkpoint_step(...) == 12
        <model_slug(model id)>.pt         weights_file(ckpt, model_id): {"policy": ..., "learner": ...}
        trainer.pt                        tensor state: torch (and CUDA) RNG states, numpy's MT19937 key
        manifest.json                     written last (its presence = complete): step, trainer extras,
                                          python/numpy RNG scalars, size + sha256 of every file above,
                                          and the sha256 of the manifest itself

Safety: every ``.pt`` file holds tensors and plain containers only and is read with
``torch.load(weights_only=True)`` (a file that needs anything else is refused with ``CheckpointError``,
it is never unpickled); the extras are JSON. A save checks that what it wrote loads that way.

Integrity: sizes and sha256 are computed while writing; reading checks the manifest's own hash and
each file's size and, by default, its sha256 (``hash_files=False`` checks sizes only: that skips one
read of every file, for very large checkpoints). ``prepare_resume`` removes the temp folders of
killed saves and returns the newest checkpoint that passes; one that fails is renamed aside
(``step_000020.corrupt``, never deleted) with a warning naming it and the reason (when none passes, the run
directory refuses to resume: ``graftzoo.training.run.rundir.resume_checkpoint``). Every error about
a checkpoint is a ``CheckpointError`` whose one-line message names the file.

A checkpoint of an older graftzoo (``trainer.pt`` without ``manifest.json``) holds pickled numpy
objects: resuming from it raises ``CheckpointError``; ``load_weights`` (evaluation) still reads its
model file when that file loads with ``weights_only=True``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import torch

from graftzoo.contract.layout import AHEAD_FILE, CHECKPOINTS, MANIFEST, TRAINER_FILE
from graftzoo.contract.names import model_slug
from graftzoo.training.models.fsdp import load_sharded

log = logging.getLogger("graftzoo")

FORMAT = "graftzoo-checkpoint"
FORMAT_VERSION = 2
_PREFIX = "step_"
_NAME = re.compile(r"^step_(\d+)$")
_TMP = ".tmp-"                  # temp folders of saves: .tmp-step_000012-<pid>[-old]
_TMP_NAME = re.compile(r"^\.tmp-step_\d+-(\d+)(-old)?$")
ASIDE_SUFFIX = ".corrupt"       # a checkpoint failing its check is renamed step_000012.corrupt
_ASIDE_NAME = re.compile(r"^step_\d+\.corrupt(-\d+)?$")


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, or cannot be loaded safely; the one-line message names the file."""


def one_line(e) -> str:
    """An exception (or text) as one line: its whitespace, newlines included, collapsed."""
    return " ".join(str(e).split())


# ----------------------------------------------------------------------------------------------
# layout
# ----------------------------------------------------------------------------------------------

def checkpoint_dir(run_dir, step: int) -> Path:
    """``RUN/checkpoints/step_000012`` for step 12."""
    return Path(run_dir) / CHECKPOINTS / f"{_PREFIX}{int(step):06d}"


def checkpoint_step(ckpt) -> int:
    """The training step of ``.../checkpoints/step_N``."""
    m = _NAME.match(Path(ckpt).name)
    if not m:
        raise ValueError(f"{ckpt}: not a checkpoint directory (expected a name like step_000012)")
    return int(m.group(1))


def weights_file(ckpt, model_id: str) -> Path:
    """The file of ``model_id``'s policy and learner state in a checkpoint (hub ids contain "/")."""
    return Path(ckpt) / f"{model_slug(model_id)}.pt"


def _is_legacy(p: Path) -> bool:
    return not (p / MANIFEST).is_file() and (p / TRAINER_FILE).is_file()


def is_checkpoint(path) -> bool:
    """Whether ``path`` is a complete checkpoint directory (``RUN/checkpoints/step_N`` with its manifest,
    or an older graftzoo's with its ``trainer.pt``)."""
    p = Path(path)
    return (p.parent.name == CHECKPOINTS and bool(_NAME.match(p.name))
            and ((p / MANIFEST).is_file() or (p / TRAINER_FILE).is_file()))


def _named(root: Path) -> list:
    """``step_N`` folders of ``root`` (step, path), oldest first; renamed-aside and temp folders excluded."""
    if not root.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(out)


def list_checkpoints(run_dir) -> list:
    """Complete checkpoints of a run, oldest first (by step; not verified: see ``verify_checkpoint``)."""
    return [p for _, p in _named(Path(run_dir) / CHECKPOINTS) if is_checkpoint(p)]


def latest_checkpoint(run_dir) -> Optional[Path]:
    """The newest complete checkpoint of a run, or None (not verified: resuming uses ``prepare_resume``)."""
    done = list_checkpoints(run_dir)
    return done[-1] if done else None


# ----------------------------------------------------------------------------------------------
# hashing, safe loading
# ----------------------------------------------------------------------------------------------

class _HashingWriter:
    """A binary file that hashes and counts what is written to it (sha256 while writing)."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.sha.update(b)
        self.size += memoryview(b).nbytes
        return self.f.write(b)

    def flush(self):
        self.f.flush()


def _fsync_dir(path: Path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _save_pt(obj, path: Path) -> dict:
    """``torch.save`` with its size and sha256 (computed while writing); the file is checked to load with
    ``weights_only=True`` (only tensors and plain containers), so that every checkpoint written can be read."""
    with open(path, "wb") as f:
        w = _HashingWriter(f)
        torch.save(obj, w)
        f.flush()
        os.fsync(f.fileno())
        if os.fstat(f.fileno()).st_size != w.size:
            raise CheckpointError(f"{path}: wrote {w.size} bytes but the file holds {os.fstat(f.fileno()).st_size}")
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    if unsafe:
        raise CheckpointError(f"{path}: would not load with torch.load(weights_only=True): it holds {unsafe} "
                              f"(state_dict must hold tensors and plain containers only)")
    return {"size": w.size, "sha256": w.sha.hexdigest()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _record(path: Path) -> dict:
    """Size and sha256 of a file another process wrote into the checkpoint (a worker rank's shard), fsynced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


_VERIFIED: dict = {}   # files whose sha256 this process checked: (path, size, mtime_ns, inode) -> sha256


def _check_file(path: Path, rec: dict, hash_files: bool):
    try:
        st = path.stat()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (listed in {path.parent / MANIFEST})") from None
    if st.st_size != rec["size"]:
        raise CheckpointError(f"{path}: corrupt: {st.st_size} bytes, the manifest recorded {rec['size']}")
    if not hash_files:
        return
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if _VERIFIED.get(key) == rec["sha256"]:
        return
    got = _sha256(path)
    if got != rec["sha256"]:
        raise CheckpointError(f"{path}: corrupt: sha256 {got[:16]}... differs from the manifest's "
                              f"{rec['sha256'][:16]}...")
    _VERIFIED[key] = got


def _unsafe_reason(e) -> str:
    m = re.search(r"(Trying to load unsupported GLOBAL [^\n]*|Unsupported [^\n]*)", str(e))
    return one_line(m.group(1)).split(". ")[0].rstrip(".")[:200] if m else "not a tensors-only file"


def _safe_load(path: Path, mmap: bool = False):
    """``torch.load(weights_only=True)``; any failure is a ``CheckpointError`` naming the file."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: cannot be loaded safely: it holds Python objects other than tensors and "
                              f"plain containers, refused by torch.load(weights_only=True) "
                              f"({_unsafe_reason(e)})") from None
    except Exception as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint file: {type(e).__name__}: "
                              f"{one_line(e)[:200]}") from None


# ----------------------------------------------------------------------------------------------
# manifest
# ----------------------------------------------------------------------------------------------

def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _check_json(obj, where: str):
    """Extras go into the JSON manifest: plain data with string keys (tuples come back as lists)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_json(v, f"{where}[{i}]")
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CheckpointError(f"checkpoint extra {where}: key {k!r} is not a string (extras are stored "
                                      f"as JSON in {MANIFEST})")
            _check_json(v, f"{where}.{k}")
        return
    raise CheckpointError(f"checkpoint extra {where}: {type(obj).__name__} is not plain JSON data "
                          f"(extras are stored in {MANIFEST})")


def read_manifest(ckpt) -> dict:
    """The manifest of a checkpoint, checked (format, its own sha256, shape); ``CheckpointError`` naming it."""
    path = Path(ckpt) / MANIFEST
    if not path.is_file():
        if (Path(ckpt) / TRAINER_FILE).is_file():
            raise CheckpointError(f"{Path(ckpt) / TRAINER_FILE}: checkpoint written by an older graftzoo (no "
                                  f"{MANIFEST}): it holds pickled Python objects and cannot be loaded safely; "
                                  f"start the run in a new run directory, or move {ckpt} aside")
        raise CheckpointError(f"{path}: missing: {ckpt} is not a complete checkpoint")
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt manifest (invalid JSON: {one_line(e)})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a graftzoo checkpoint manifest")
    if doc.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {doc.get('version')!r}; "
                              f"this graftzoo reads version {FORMAT_VERSION}")
    body = {k: v for k, v in doc.items() if k != "sha256"}
    if hashlib.sha256(_canonical(body)).hexdigest() != doc.get("sha256"):
        raise CheckpointError(f"{path}: corrupt manifest (its sha256 does not match its content)")
    files = doc.get("files")
    if (not isinstance(doc.get("step"), int) or not isinstance(doc.get("extra"), dict)
            or not isinstance(files, dict) or TRAINER_FILE not in files
            or not all(isinstance(r, dict) and isinstance(r.get("size"), int) and isinstance(r.get("sha256"), str)
                       for r in files.values())
            or not all(isinstance(n, str) and _inside(n) for n in files)):
        raise CheckpointError(f"{path}: malformed manifest (step, extra, files with size and sha256)")
    m = _NAME.match(Path(ckpt).name)
    if m and int(m.group(1)) != doc["step"]:
        raise CheckpointError(f"{path}: records step {doc['step']} but the folder is {Path(ckpt).name}")
    return doc


def _inside(name: str) -> bool:
    """A manifest's file name stays inside its checkpoint: relative, no empty, ``.`` or ``..`` part (a sharded
    model's files are ``<model>.dcp/<file>``)."""
    return all(part not in ("", ".", "..") for part in name.split("/"))


def verify_checkpoint(ckpt, hash_files: bool = True, files: Optional[Iterable[str]] = None) -> dict:
    """Check a checkpoint: its manifest, and the size and (``hash_files``) sha256 of each of its files (or of
    the manifest's ``files`` named, e.g. one model's). Returns the manifest; ``CheckpointError`` names the
    first file that fails."""
    doc = read_manifest(ckpt)
    names = list(doc["files"]) if files is None else list(files)
    for name in names:
        rec = doc["files"].get(name)
        if rec is None:
            raise CheckpointError(f"{Path(ckpt) / name}: not in the checkpoint ({Path(ckpt) / MANIFEST} "
                                  f"lists {sorted(doc['files'])})")
        _check_file(Path(ckpt) / name, rec, hash_files)
    return doc


# ----------------------------------------------------------------------------------------------
# RNG states: tensors in trainer.pt, scalars in the manifest
# ----------------------------------------------------------------------------------------------

def _rng_state() -> tuple:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    tensors = {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    plain = {"python": [version, list(internal), gauss],
             "numpy": {"name": str(name), "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}}
    return tensors, plain


def _set_rng_state(tensors: dict, plain: dict, where: Path):
    try:
        version, internal, gauss = plain["python"]
        random.setstate((version, tuple(internal), gauss))
        npy = plain["numpy"]
        keys = tensors["numpy_keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached"]))
        torch.set_rng_state(tensors["torch"])
    except Exception as e:
        raise CheckpointError(f"{where}: malformed RNG state: {type(e).__name__}: {one_line(e)[:200]}") from None
    cuda = tensors.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------------------------
# save, prune, clean
# ----------------------------------------------------------------------------------------------

def _size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _fmt_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def remove_partial_saves(run_dir, only_dead: bool = False) -> list:
    """Remove the temp folders (``checkpoints/.tmp-step_*``) that killed saves left behind, each with a warning
    naming it and its size; ``only_dead``: only those whose writing process is no longer running. Returns them."""
    root = Path(run_dir) / CHECKPOINTS
    removed = []
    if not root.is_dir():
        return removed
    for p in sorted(root.glob(f"{_TMP}{_PREFIX}*")):
        if only_dead:
            m = _TMP_NAME.match(p.name)
            if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
                continue
        size = _size_of(p)
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        log.warning("%s: removed the leftover of an interrupted checkpoint save (%s)", p, _fmt_size(size))
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _prune(root: Path, step: int, keep: int):
    """Keep the newest ``keep`` complete checkpoints at or before ``step`` by their recorded step. Folders of
    other steps (an earlier run's later ones), renamed-aside, legacy and unreadable ones are never removed."""
    if keep <= 0:
        return
    mine = []
    for s, p in _named(root):
        if s > step:
            continue
        try:
            doc = read_manifest(p)
        except CheckpointError:
            continue
        mine.append((doc["step"], p))
    for _, p in sorted(mine)[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(run_dir, step: int, policies: dict, learners: dict, extra: dict, keep: int = 2,
                    ahead: Optional[dict] = None) -> Path:
    """Write ``RUN/checkpoints/step_N`` atomically (manifest last, then one rename) and prune to ``keep``
    (0 = keep all). ``extra``: plain JSON data (string keys), returned by ``load_checkpoint``. ``ahead``: the
    rollouts collected ahead of their steps (graftzoo.training.learning.ahead, plain data), in a file of their own
    (``AHEAD_FILE``), returned as ``"ahead"``."""
    extra = dict(extra)
    _check_json(extra, "extra")
    final = checkpoint_dir(run_dir, step)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    remove_partial_saves(run_dir, only_dead=True)
    tmp = root / f"{_TMP}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        files, models = {}, {}
        for mid, pol in policies.items():
            f = weights_file(tmp, mid)
            state, beside = pol.checkpoint_state(tmp, f.stem)  # a worker group's sharded policy writes its shards
            for rel in beside:
                if not (tmp / rel).is_file():  # written on a node that does not share the run directory
                    raise CheckpointError(f"model {mid!r}: its worker wrote the checkpoint file {rel}, but this "
                                          f"process does not find it under {tmp}: the run directory is not shared "
                                          f"with that worker's node (a run on several nodes needs a shared "
                                          f"run.out_dir); no checkpoint is written")
                files[rel] = _record(tmp / rel)
            files[f.name] = _save_pt({"policy": state, "learner": learners[mid].state_dict()}, f)
            models[mid] = f.name
        tensors, plain = _rng_state()
        files[TRAINER_FILE] = _save_pt(tensors, tmp / TRAINER_FILE)
        if ahead:
            files[AHEAD_FILE] = _save_pt(ahead, tmp / AHEAD_FILE)
        body = {"format": FORMAT, "version": FORMAT_VERSION, "step": int(step), "extra": extra, "rng": plain,
                "models": models, "files": files}
        doc = {**body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()}
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
    except BaseException:   # an error (not a kill) leaves no partial save behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = root / f"{_TMP}{final.name}-{os.getpid()}-old"
    if final.exists():    # replaced only once the new one is complete
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(root)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
    _prune(root, step, keep)
    return final


# ----------------------------------------------------------------------------------------------
# load, resume
# ----------------------------------------------------------------------------------------------

def _model_file(ckpt: Path, doc: dict, model_id: str) -> str:
    name = doc.get("models", {}).get(model_id) or weights_file(ckpt, model_id).name
    if name not in doc["files"]:
        raise CheckpointError(f"{weights_file(ckpt, model_id)}: missing: checkpoint {ckpt} holds no weights for "
                              f"model {model_id!r} (it has {sorted(doc.get('models', {}))})")
    return name


def load_checkpoint(path, policies: dict, learners: dict, hash_files: bool = True) -> dict:
    """Restore policies (weights, optimizer, scheduler), learners and RNG states from a checkpoint; returns the
    trainer extras plus ``step``. Everything is verified before anything is loaded (``verify_checkpoint``)."""
    path = Path(path)
    doc = read_manifest(path)
    names = [_model_file(path, doc, mid) for mid in policies]
    with_ahead = [AHEAD_FILE] if AHEAD_FILE in doc["files"] else []
    verify_checkpoint(path, hash_files,
                      files=[x for n in names for x in _with_shards(doc, n)] + [TRAINER_FILE, *with_ahead])
    for mid, name in zip(policies, names):
        f = path / name
        state = _safe_load(f)
        try:
            policies[mid].load_state_dict(state["policy"], folder=path)
            learners[mid].load_state_dict(state["learner"])
        except Exception as e:
            raise CheckpointError(f"{f}: does not fit model {mid!r} of this run: {type(e).__name__}: "
                                  f"{one_line(e)[:300]}") from None
    _set_rng_state(_safe_load(path / TRAINER_FILE), doc["rng"], path / TRAINER_FILE)
    ahead = {"ahead": _safe_load(path / AHEAD_FILE)} if with_ahead else {}
    return {**doc["extra"], "step": doc["step"], **ahead}


def _set_aside(ckpt: Path) -> Path:
    target = ckpt.with_name(ckpt.name + ASIDE_SUFFIX)
    i = 1
    while target.exists():
        i += 1
        target = ckpt.with_name(f"{ckpt.name}{ASIDE_SUFFIX}-{i}")
    try:
        os.replace(ckpt, target)
    except OSError as e:
        raise CheckpointError(f"{ckpt}: fails its check and cannot be renamed aside: {one_line(e)}") from None
    return target


def set_aside_checkpoints(run_dir) -> list:
    """The checkpoints of a run renamed aside because they failed their check (``step_N.corrupt[-k]``), by name."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(p for p in root.iterdir() if _ASIDE_NAME.match(p.name)) if root.is_dir() else []


def prepare_resume(run_dir, hash_files: bool = True) -> Optional[Path]:
    """Before resuming: remove the leftovers of killed saves (``remove_partial_saves``) and return the newest
    checkpoint that passes ``verify_checkpoint`` (None without any). A newer one that fails is renamed aside
    (``step_N.corrupt``, kept) with a warning naming it and the reason; when none passes, the caller decides
    (``set_aside_checkpoints`` lists them: a run must not silently start over). A checkpoint of an older graftzoo
    is returned as is: ``load_checkpoint`` then refuses it with a ``CheckpointError``."""
    remove_partial_saves(run_dir)
    for _, ck in reversed(_named(Path(run_dir) / CHECKPOINTS)):
        if _is_legacy(ck):
            return ck
        try:
            verify_checkpoint(ck, hash_files)
            return ck
        except CheckpointError as e:
            aside = _set_aside(ck)
            log.warning("%s failed its check (%s); renamed to %s (kept)", ck, e, aside.name)
    return None


def check_weights(ckpt, model_ids: Iterable[str], hash_files: bool = True) -> list:
    """The weight files of ``model_ids`` in a checkpoint, verified as ``load_weights`` verifies them (its manifest,
    their size and sha256; an older graftzoo's checkpoint: that they exist). ``CheckpointError`` naming the file."""
    ckpt = Path(ckpt)
    if _is_legacy(ckpt):
        paths = [weights_file(ckpt, m) for m in model_ids]
        for m, p in zip(model_ids, paths):
            if not p.is_file():
                raise CheckpointError(f"{p}: missing: checkpoint {ckpt} holds no weights for model {m!r}")
        return paths
    doc = read_manifest(ckpt)
    names = [_model_file(ckpt, doc, m) for m in model_ids]
    verify_checkpoint(ckpt, hash_files, files=[x for n in names for x in _with_shards(doc, n)])
    return [ckpt / n for n in names]


def _with_shards(doc: dict, name: str) -> list:
    """A model's file and the sharded-checkpoint files written beside it (``<stem>.dcp/...``)."""
    stem = name[:-len(".pt")] if name.endswith(".pt") else name
    return [name] + sorted(k for k in doc["files"] if k.startswith(stem + ".dcp/"))


def load_weights(policy, ckpt, hash_files: bool = True) -> None:
    """Load ``policy``'s model weights (only: no optimizer or learner state) from a checkpoint directory,
    verified (``check_weights``) and read with ``weights_only=True``."""
    ckpt = Path(ckpt)
    path, = check_weights(ckpt, [policy.model_id], hash_files)
    if _is_legacy(ckpt):
        log.warning("%s: checkpoint of an older graftzoo (no %s): its files cannot be verified", ckpt, MANIFEST)
    state = _safe_load(path, mmap=True)
    try:
        if state["policy"].get("sharded"):  # written by a worker group: its torch.distributed.checkpoint shards
            load_sharded(policy, state["policy"], ckpt, weights_only=True)
        else:
            policy.load_model_state(state["policy"])  # a LoRA policy's: its adapters
        policy.version = int(state["policy"].get("version", 0))
    except Exception as e:
        raise CheckpointError(f"{path}: does not fit model {policy.model_id!r}: {type(e).__name__}: "
                              f"{one_line(e)[:300]}") from None
