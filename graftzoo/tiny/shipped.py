"""Warmed-up tiny models shipped with the package, so that every machine starts from the same weights
(docs/guide.md#shipped-tiny-weights).

A warm-up is a few hundred SGD steps from random weights, and CPUs with other floating-point kernels (AVX2, AVX-512,
torch's generic ones) give other weights from the first step: a demo whose models differ between machines cannot
anchor a comparison. So the demo's and the quick start's warmed-up models ship in ``graftzoo/tiny/weights/<id>/``
(their ``save_pretrained`` folder and ``warmup.json``, a few MB), listed in ``weights/manifest.json`` with the recipe
they were trained from (the tiny spec without its id, and the seed) and every file's sha256.

``load_or_warmup`` serves a spec whose recipe and seed are shipped from here, checked by hash once per process (a
file that fails its check is an error naming it, never a silent warm-up); any other spec warms up and is cached as
before. The warm-up code stays the way to make them: ``python -m graftzoo.tiny.rebuild`` (graftzoo.tiny.rebuild)
warms every shipped recipe up anew on this machine and compares its greedy probe with the shipped model's.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Optional

WEIGHTS_DIR = Path(__file__).with_name("weights")
MANIFEST = WEIGHTS_DIR / "manifest.json"
MODEL_FILE = "model.safetensors"
QUALITY_TOLERANCE = 0.1  # a rebuild's greedy probe within this of the shipped model's, skill by skill


class ShippedWeightsError(RuntimeError):
    """A shipped weight file is missing or fails its sha256 check."""


def recipe(spec_dict: dict, seed: int) -> dict:
    """What a warm-up's weights depend on: the tiny spec without its id (the id names a model, not its weights), and
    the seed."""
    return {"spec": {**spec_dict, "id": None}, "seed": int(seed)}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest() -> dict:
    """model id -> {"recipe", "files": {name: sha256}} of the shipped models ({} when none ship)."""
    if not MANIFEST.is_file():
        return {}
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["models"]


@lru_cache(maxsize=None)
def verified(model_id: str) -> Path:
    """The shipped folder of ``model_id``, every file checked against the manifest's sha256 (once per process)."""
    entry, folder = manifest()[model_id], WEIGHTS_DIR / model_id
    for name, want in entry["files"].items():
        path = folder / name
        if not path.is_file():
            raise ShippedWeightsError(f"{path}: a shipped weight file is missing; reinstall graftzoo, or rebuild the "
                                      f"shipped models with python -m graftzoo.tiny.rebuild --write")
        got = sha256_of(path)
        if got != want:
            raise ShippedWeightsError(f"{path}: sha256 {got[:16]}… is not the shipped {want[:16]}… (the file was "
                                      f"changed or cut); reinstall graftzoo, or rebuild the shipped models with "
                                      f"python -m graftzoo.tiny.rebuild --write")
    return folder


def shipped_path(spec_dict: dict, seed: int) -> Optional[Path]:
    """The verified shipped folder whose recipe is ``spec_dict``'s (any id) with ``seed``, or None."""
    want = recipe(spec_dict, seed)
    for model_id, entry in manifest().items():
        if entry["recipe"] == want:
            return verified(model_id)
    return None


def weights_hash(folder) -> str:
    """The sha256 of a tiny model folder's weights (the demo prints its first 12 digits)."""
    return sha256_of(Path(folder) / MODEL_FILE)


def ship(folder, model_id: str) -> Path:
    """Copy a warmed-up folder (``load_or_warmup``'s) into ``weights/<model_id>`` and record it in the manifest."""
    src, dest = Path(folder), WEIGHTS_DIR / model_id
    info = json.loads((src / "warmup.json").read_text())
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}-", dir=WEIGHTS_DIR))
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copy2(f, tmp / f.name)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    models = manifest()
    models[model_id] = {"recipe": recipe(info["spec"], info["seed"]),
                        "files": {f.name: sha256_of(f) for f in sorted(dest.iterdir()) if f.is_file()}}
    MANIFEST.write_text(json.dumps({"models": dict(sorted(models.items()))}, indent=1) + "\n", encoding="utf-8")
    verified.cache_clear()
    return dest
