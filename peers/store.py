"""TrajectoryStore: every rollout of every step as Parquet (pyarrow), atomic and schema-versioned.

Layout of a store directory (usually ``<run_dir>/store``)::

    meta.json                          {"schema_version", "dataset", "models": {id: tokenizer_id}}
    <model slug>/step_000012.parquet   one file per (model, step), written to a temp name then renamed
                                       (graftzoo.contract.names.model_slug: a hub id's "/" is "__", a path id is
                                       never a path; a store written before keeps its nested hub-id folders)

A crash can only lose the step being written; every complete step stays readable (pandas works too:
``pandas.read_parquet(store_dir + "/<model slug>")``). The temp files a killed write leaves (``.tmp-<pid>-*``) are
removed when the run resumes (``remove_partial_writes``). Step files carry Parquet page checksums (CRC32),
checked on every read here: a flipped bit is a ``StoreError`` naming the file, not a silently wrong
``text`` or ``reward``; so is a ``meta.json`` that is not valid store metadata.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from graftzoo.contract.names import model_slug
from graftzoo.contract.types import Group, Origin, Prompt, Rollout

log = logging.getLogger("graftzoo")

SCHEMA_VERSION = 1
_TMP = ".tmp-"  # temp names of writes: .tmp-<pid>-step_000012.parquet, .tmp-<pid>-meta.json

SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("step", pa.int64()), ("epoch", pa.int64()), ("model_id", pa.string()),
    ("tokenizer_id", pa.string()), ("policy_version", pa.int64()), ("sample_index", pa.int64()),
    ("group_size", pa.int64()), ("prompt_text", pa.string()), ("gold", pa.string()), ("dataset", pa.string()),
    ("text", pa.string()), ("reward", pa.float64()), ("correct", pa.bool_()), ("advantage", pa.float64()),
    ("logp_sum", pa.float64()), ("token_count", pa.int64()), ("finish_reason", pa.string()),
    ("extracted", pa.string()), ("status", pa.string()),
], metadata={b"graftzoo_schema_version": str(SCHEMA_VERSION).encode()})


class StoreError(ValueError):
    """A trajectory store (or one of its files, named in the one-line message) is missing, corrupt or of
    another version."""


class StoreMismatchError(StoreError):
    """A readable store that is not what the run asks of it (``peer.path`` names another run's models, dataset or
    questions, or no store at all): a usage error."""


def read_step_file(path, columns: Optional[list] = None) -> pa.Table:
    """One step file, its page checksums verified; any failure is a ``StoreError`` naming the file."""
    try:
        return pq.read_table(path, columns=columns, page_checksum_verification=True)
    except Exception as e:  # a corrupt file names itself; other steps stay readable
        msg = " ".join(str(e).split())[:300]
        raise StoreError(f"{path}: unreadable or corrupt Parquet file: {type(e).__name__}: {msg}") from e


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise StoreError(f"{path}: corrupt trajectory-store metadata (invalid JSON: {' '.join(str(e).split())})") \
            from None
    if not isinstance(meta, dict):
        raise StoreError(f"{path}: corrupt trajectory-store metadata (expected a JSON object, got "
                         f"{type(meta).__name__})")
    v = meta.get("schema_version")
    if v != SCHEMA_VERSION:
        raise StoreError(f"{path}: unknown trajectory-store schema version {v!r} "
                         f"(this graftzoo reads version {SCHEMA_VERSION})")
    models, dataset = meta.get("models"), meta.get("dataset")
    if (not isinstance(models, dict) or not all(isinstance(k, str) and (t is None or isinstance(t, str))
                                                  for k, t in models.items())
            or not (dataset is None or isinstance(dataset, str))):
        raise StoreError(f"{path}: corrupt trajectory-store metadata (expected 'models': {{model id: tokenizer id}}"
                         f" and 'dataset': a name or null)")
    return meta


def _atomic_write_json(path: Path, payload: dict):
    tmp = path.with_name(f"{_TMP}{os.getpid()}-{path.name}")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


class TrajectoryStore:
    def __init__(self, root: str | os.PathLike, dataset: Optional[str] = None, create: bool = True):
        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if meta_path.exists():
            self.meta = _read_meta(meta_path)
        elif create:
            self.root.mkdir(parents=True, exist_ok=True)
            self.meta = {"schema_version": SCHEMA_VERSION, "dataset": dataset, "models": {}}
            _atomic_write_json(meta_path, self.meta)
        else:
            raise StoreError(f"{self.root}: not a trajectory store (no meta.json)")

    def remove_partial_writes(self) -> list:
        """Remove the temp files that killed writes left (``.tmp-*`` in the store and its model folders), each with a
        warning naming it and its size; for the store's one writer (the run holding its directory). Returns them."""
        removed = []
        if not self.root.is_dir():
            return removed
        for p in sorted([*self.root.glob(f"{_TMP}*"), *self.root.glob(f"*/{_TMP}*"), *self.root.glob(f"*/*/{_TMP}*")]):
            if p.is_file():
                size = p.stat().st_size
                p.unlink(missing_ok=True)
                log.warning("%s: removed the leftover of an interrupted store write (%d bytes)", p, size)
                removed.append(p)
        return removed

    def model_dir(self, model_id: str) -> Path:
        """The folder of a model's step files: ``<root>/<model_slug(id)>``, or a hub id's nested folder in a store
        written before the slug (``<root>/Org/Name``, only if it exists and lies inside the store)."""
        d = self.root / model_slug(model_id)
        legacy = self.root / model_id
        if not d.is_dir() and legacy.is_dir() and self.root.resolve() in legacy.resolve().parents:
            return legacy
        return d

    @property
    def dataset(self) -> Optional[str]:
        return self.meta.get("dataset")

    @property
    def models(self) -> dict:
        return dict(self.meta.get("models", {}))

    def write(self, step: int, epoch: int, groups: Iterable[Group], tokenizer_id: str = ""):
        """Write one model's groups for one step (all groups must come from the same model)."""
        groups = list(groups)
        if not groups:
            return
        model_id = groups[0].model_id
        cols = {f.name: [] for f in SCHEMA}
        for g in groups:
            advs = g.advantages or [None] * g.n
            for i, (r, a) in enumerate(zip(g.rollouts, advs)):
                row = dict(prompt_id=g.prompt.id, step=step, epoch=epoch, model_id=model_id,
                           tokenizer_id=tokenizer_id or r.tokenizer_id,
                           policy_version=r.policy_version, sample_index=i, group_size=g.n,
                           prompt_text=g.prompt.text, gold=g.prompt.gold, dataset=self.dataset or g.prompt.source,
                           text=r.text, reward=float(r.reward), correct=bool(r.correct),
                           advantage=None if a is None else float(a), logp_sum=r.logp_sum,
                           token_count=r.token_count, finish_reason=r.finish_reason, extracted=r.extracted,
                           status=r.status)
                for k, v in row.items():
                    cols[k].append(v)
        table = pa.table(cols, schema=SCHEMA)
        d = self.model_dir(model_id)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"step_{step:06d}.parquet"
        tmp = d / f"{_TMP}{os.getpid()}-{path.name}"
        pq.write_table(table, tmp, write_page_checksum=True)
        os.replace(tmp, path)
        if self.meta["models"].get(model_id) != (tokenizer_id or None):
            self.meta["models"][model_id] = tokenizer_id or None
            _atomic_write_json(self.root / "meta.json", self.meta)

    def steps(self, model_id: str) -> list:
        d = self.model_dir(model_id)
        if not d.is_dir():
            return []
        return sorted(int(p.stem.split("_")[1]) for p in d.glob("step_*.parquet"))

    def read(self, model_id: str, steps: Optional[Iterable[int]] = None):
        """All rows of a model as a pandas DataFrame (complete steps only)."""
        wanted = self.steps(model_id) if steps is None else [s for s in steps if s in set(self.steps(model_id))]
        frames = []
        for s in wanted:
            frames.append(read_step_file(self.model_dir(model_id) / f"step_{s:06d}.parquet").to_pandas())
        if not frames:
            return pd.DataFrame({f.name: [] for f in SCHEMA})
        return pd.concat(frames, ignore_index=True)

    def prompt_ids(self, model_id: str) -> set:
        ids = set()
        for s in self.steps(model_id):
            ids.update(read_step_file(self.model_dir(model_id) / f"step_{s:06d}.parquet", columns=["prompt_id"])
                       .column("prompt_id").to_pylist())
        return ids


def rows_to_groups(df, prompts_by_id: Optional[dict] = None) -> dict:
    """DataFrame rows (one step of one model) -> {prompt_id: Group} with stored advantages and log-prob stats."""
    out = {}
    for pid, part in df.sort_values(["prompt_id", "sample_index"]).groupby("prompt_id", sort=False):
        first = part.iloc[0]
        prompt = (prompts_by_id or {}).get(pid) or Prompt(id=pid, text=first["prompt_text"], gold=first["gold"],
                                                          source=first["dataset"])
        rolls = []
        for _, row in part.iterrows():
            n_tok = int(row["token_count"])
            # the stored behaviour statistics are the mean over the peer's own tokens (EOS excluded)
            lp = [float(row["logp_sum"]) / n_tok] * n_tok if n_tok else []
            rolls.append(Rollout(prompt_id=pid, model_id=row["model_id"], policy_version=int(row["policy_version"]),
                                 text=row["text"], token_ids=[0] * n_tok, logprobs=lp,
                                 finish_reason=row["finish_reason"], reward=float(row["reward"]),
                                 correct=bool(row["correct"]), extracted=row["extracted"], status=row["status"],
                                 tokenizer_id=row["tokenizer_id"],
                                 origin=Origin(model_id=row["model_id"], tokenizer_id=row["tokenizer_id"],
                                               mean_logp=lp[0] if lp else 0.0, token_count=n_tok,
                                               stored_step=int(row["step"]))))
        advs = part["advantage"].tolist()
        out[pid] = Group(prompt=prompt, model_id=first["model_id"], rollouts=rolls,
                         advantages=[float(a) if a == a and a is not None else 0.0 for a in advs], source="peer")
    return out
