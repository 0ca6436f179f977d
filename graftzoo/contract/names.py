"""File and run names derived from model ids and labels, in one place.

A model id is kept as given everywhere it is data (configs, rollouts, metrics, the store's ``model_id`` column); where
it names a file or folder of a run (the trajectory store's per-model folder, a checkpoint's weights file, the eval
file) it goes through ``model_slug``. An id may be a hub id (``Qwen/Qwen3-1.7B-Base``) or a local folder
(``/data/models/my-model``, ``./my-model``): used as a path component as it is, an absolute id would replace the run
directory (``store / "/data/models/my-model"`` is that folder) and a relative one would climb out of it.
"""
from __future__ import annotations

import hashlib
import re

MAX_SLUG = 120  # characters of the id kept; longer ids end in a hash of the whole id


def model_slug(model_id: str) -> str:
    """One safe file-name component for ``model_id``: "/" becomes "__" (hub ids keep the names they always had:
    ``Qwen__Qwen3-1.7B-Base``), every character outside ``[A-Za-z0-9._-]`` and every leading "." become "_" (no
    hidden, ``.``/``..`` or absolute names); an id longer than ``MAX_SLUG`` is cut and ends in a hash of it."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", model_id.replace("/", "__"))
    slug = re.sub(r"^\.+", lambda m: "_" * len(m.group()), slug) or "_"
    if len(slug) > MAX_SLUG:
        slug = f"{slug[:MAX_SLUG - 13]}-{hashlib.sha256(model_id.encode()).hexdigest()[:12]}"
    return slug


def label_slug(text: str) -> str:
    """A label (a method's, a preset's ``run.variant``, a model id's last part) as the part of a run name, the same
    in ``graftzoo train``'s default names and a grid's cell names: ``=()[]{}'"`` dropped, lowercased, every run of
    characters outside ``[a-z0-9._]`` one ``-``, ``-`` and ``.`` stripped at both ends: ``"GRPO (n=8)"`` ->
    ``"grpo-n8"``, ``"GRAFT w/o gate"`` -> ``"graft-w-o-gate"``, ``"Qwen3-1.7B-Base"`` -> ``"qwen3-1.7b-base"``.
    A label of no such characters gives ``""`` (the caller refuses it or names it otherwise)."""
    text = re.sub(r"[=()\[\]{}'\"]", "", str(text)).lower()
    return re.sub(r"[^a-z0-9._]+", "-", text).strip("-.")
