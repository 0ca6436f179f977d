"""Prompt datasets: the bundled benchmark / training files, the procedural arithmetic task, and
user JSONL or Parquet files (DESIGN.md, "The data that flows").

A dataset is a read-only ``Sequence[Prompt]`` with a ``name``, a ``path`` (None when generated)
and a ``hash`` that identifies its contents exactly, so a run log can say what it trained on.

Rows of a file are read field by field (the bundled files all use ``id/problem/answer/source``,
see ``data/README.md``; user files may differ):

- problem: ``problem`` or ``question`` (or ``problem_key=``);
- gold answer: ``answer`` (GSM8K's raw ``... #### 72`` form keeps the text after the last
  ``####``, without thousands commas), else ``gold`` or ``ground_truth``, else the last
  ``\\boxed{}`` of ``solution`` (or ``answer_key=``); ``label_free=True`` allows rows without one;
- id: ``id`` (or ``id_key=``), else the 0-based row index. The prompt id is ``"<dataset>/<id>"``.

A dotted key (``reward_model.ground_truth``) reads a nested field. Every other field of the row
goes to ``Prompt.metadata``. A bad row raises :class:`DatasetError` naming ``file:line`` and the
field (for Parquet the "line" is the 1-based row number).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union, overload

import pyarrow.parquet as pq

from graftzoo.core.types import Prompt
from graftzoo.envs.arithmetic import SKILLS, ArithmeticDataset

DATA_DIR = Path(__file__).resolve().parent / "data"

#: bundled name -> (file in data/, its split)
BUNDLED: dict[str, tuple[str, str]] = {
    "math500": ("math500.jsonl", "test"),
    "aime24": ("aime24.jsonl", "test"),
    "aime25": ("aime25.jsonl", "test"),
    "amc23": ("amc23.jsonl", "test"),
    "minerva_math": ("minerva_math.jsonl", "test"),
    "math_train": ("math_train.jsonl", "train"),
    "gsm8k_train": ("gsm8k_train.jsonl", "train"),
    "gsm8k_test": ("gsm8k_test.jsonl", "test"),
}
#: the evaluation benchmarks of the GRAFT comparison (spec algos_peer §5.3)
BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva_math")

#: the one split a file path accepts besides None: the file itself (``task.split``'s default)
FILE_SPLIT = "train"

_PROBLEM_KEYS = ("problem", "question")
_ANSWER_KEYS = ("answer", "gold", "ground_truth")
_ID_KEYS = ("id",)
_FILE_KWARGS = {"problem_key", "answer_key", "id_key", "label_free", "name"}
_ARITHMETIC_KWARGS = {"size", "seed", "mix", "difficulty"}


class DatasetError(ValueError):
    """A dataset file or row is malformed; the message names ``file:line`` and the field."""


class MathDataset(Sequence[Prompt]):
    """A read-only sequence of prompts with a name, an optional source path and a content hash.

    ``items`` may be any ``Sequence[Prompt]`` (a list read from a file, or a lazy generator such
    as the arithmetic task). ``digest`` is the sha256 of the source file; when it is None the
    hash is computed on first use over every item's id, text and gold answer.
    """

    def __init__(self, name: str, items: Sequence[Prompt], *, path: Optional[Path] = None,
                 split: Optional[str] = None, digest: Optional[str] = None):
        self.name = name
        self.path = path
        self.split = split
        self._items = items
        self._digest = digest

    @property
    def hash(self) -> str:
        if self._digest is None:
            h = hashlib.sha256()
            for p in self._items:
                h.update(json.dumps([p.id, p.text, p.gold], ensure_ascii=False).encode("utf-8"))
                h.update(b"\n")
            self._digest = h.hexdigest()
        return self._digest

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> Prompt: ...

    @overload
    def __getitem__(self, i: slice) -> list[Prompt]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._items[j] for j in range(*i.indices(len(self)))]
        return self._items[i]

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        return f"MathDataset(name={self.name!r}, split={self.split!r}, len={len(self)}{where})"


def bundled_names() -> list[str]:
    """Every name :func:`load_dataset` accepts besides a file path."""
    return sorted(BUNDLED) + ["arithmetic", "gsm8k"]


def load_dataset(name_or_path: Union[str, Path], split: Optional[str] = None, **kw: Any) -> MathDataset:
    """Load a bundled dataset by name, the procedural arithmetic task, or a JSONL / Parquet file.

    - bundled names: ``math500, aime24, aime25, amc23, minerva_math, math_train, gsm8k_train,
      gsm8k_test``; ``"gsm8k"`` with ``split="train"|"test"``. ``split`` may repeat the file's own
      split and must not contradict it.
    - ``"arithmetic"``: kwargs ``size, seed, mix, difficulty``; ``split`` defaults to ``"train"``.
    - a path ending in ``.jsonl`` or ``.parquet``: kwargs ``problem_key, answer_key, id_key,
      label_free, name`` (the name defaults to the file stem). A file is one split, the set it holds:
      ``split`` is None or ``"train"`` (a run's ``task.split`` default: the file is what it trains
      on, so ``task.dataset: my.jsonl`` needs no other key); any other split is an error, since a
      file has no test or validation part (give ``eval.dataset`` / ``eval.val_dataset``).
    """
    key = str(name_or_path)
    if key == "arithmetic":
        return _load_arithmetic(split, kw)
    if key == "gsm8k":
        if split not in ("train", "test"):
            raise ValueError(f"dataset 'gsm8k' needs split='train' or split='test', got {split!r}")
        key = f"gsm8k_{split}"
    if key in BUNDLED:
        fname, own_split = BUNDLED[key]
        if split is not None and split != own_split:
            raise ValueError(f"dataset {key!r} has only the {own_split!r} split, got split={split!r}")
        _reject_kwargs(key, kw, set())
        return load_file(DATA_DIR / fname, name=key, split=own_split)
    path = Path(name_or_path)
    if path.suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"unknown dataset {key!r}: not a bundled name ({', '.join(bundled_names())}) "
                         "and not a .jsonl or .parquet file")
    if split not in (None, FILE_SPLIT):
        raise ValueError(f"split={split!r} applies to bundled names only; the file {key!r} is one split "
                         f"(split={FILE_SPLIT!r} or None: the file itself)")
    _reject_kwargs(key, kw, _FILE_KWARGS)
    return load_file(path, split=split, **kw)


def load_file(path: Union[str, Path], *, name: Optional[str] = None, split: Optional[str] = None,
              problem_key: Optional[str] = None, answer_key: Optional[str] = None,
              id_key: Optional[str] = None, label_free: bool = False) -> MathDataset:
    """Read a JSONL or Parquet file into a :class:`MathDataset` (field rules: module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    name = name or path.stem
    data = path.read_bytes()
    rows = _parquet_rows(path) if path.suffix == ".parquet" else _jsonl_rows(path, data)
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for index, (line, row) in enumerate(rows):
        where = f"{path.name}:{line}"
        p = _row_to_prompt(row, index, name=name, where=where, problem_key=problem_key,
                           answer_key=answer_key, id_key=id_key, label_free=label_free)
        if p.id in seen:
            raise DatasetError(f"{where}: id {p.id!r} repeats the id of line {seen[p.id]}")
        seen[p.id] = line
        prompts.append(p)
    if not prompts:
        raise DatasetError(f"{path}: the file holds no rows")
    return MathDataset(name, prompts, path=path, split=split, digest=hashlib.sha256(data).hexdigest())


def last_boxed(text: str) -> Optional[str]:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (balanced braces,
    stripped), or of the brace-less form ``\\boxed 2``; None when there is none or it is unclosed."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5):]
    if rest.startswith(" "):
        return rest.split("$")[0].split()[0] if rest.strip() else None
    if not rest.startswith("{"):
        return None
    depth, i = 0, 0
    while i < len(rest):
        if rest[i] == "\\":  # an escaped brace (or any command letter) never counts
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[1:i].strip()
        i += 1
    return None


def _reject_kwargs(what: str, kw: dict, allowed: set) -> None:
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise TypeError(f"load_dataset({what!r}) got unexpected keyword(s) {unknown}; "
                        f"accepted: {sorted(allowed) or 'none'}")


def _load_arithmetic(split: Optional[str], kw: dict) -> MathDataset:
    """The procedural task; defaults: 1000 items, seed 0, every skill in equal parts."""
    _reject_kwargs("arithmetic", kw, _ARITHMETIC_KWARGS)
    kw = {"size": 1000, "seed": 0, **{k: v for k, v in kw.items() if v is not None}}
    kw.setdefault("mix", {s: 1.0 for s in SKILLS})
    split = split or "train"
    return MathDataset("arithmetic", ArithmeticDataset(split=split, **kw), split=split)


def _jsonl_rows(path: Path, data: bytes) -> Iterator[tuple[int, dict]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise DatasetError(f"{path.name}:{line}: not valid UTF-8 ({e.reason})") from None
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path.name}:{line}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path.name}:{line}: expected a JSON object, got {type(row).__name__}")
        yield line, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict]]:

    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DatasetError(f"{path}: cannot read as Parquet ({e})") from None
    for line, row in enumerate(table.to_pylist(), start=1):
        yield line, row


def _get(row: dict, key: str) -> Any:
    """``row[key]``, following dots into nested dicts; None when absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _text(value: Any, field: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DatasetError(f"{where}: field {field!r} must be a string or a number, "
                           f"got {type(value).__name__}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if not text:
        raise DatasetError(f"{where}: field {field!r} is empty")
    return text


def _gold(row: dict, where: str, answer_key: Optional[str], label_free: bool) -> tuple[Optional[str], set]:
    """The gold answer and the keys it came from."""
    if answer_key is not None:
        value = _get(row, answer_key)
        if value is None:
            if label_free:
                return None, set()
            raise DatasetError(f"{where}: field {answer_key!r} is missing")
        return _text(value, answer_key, where), {answer_key.split(".")[0]}
    for key in _ANSWER_KEYS:
        if row.get(key) is not None:
            text = _text(row[key], key, where)
            if key == "answer" and "####" in text:
                text = _text(text.rsplit("####", 1)[1].replace(",", ""), key, where)
            return text, {key}
    if isinstance(row.get("solution"), str):
        boxed = last_boxed(row["solution"])
        if boxed:
            return boxed, set()
    if label_free:
        return None, set()
    raise DatasetError(f"{where}: field 'answer' is missing (also looked for 'gold', 'ground_truth' "
                       "and a \\boxed{} in 'solution'; pass label_free=True for unlabelled data)")


def _row_to_prompt(row: dict, index: int, *, name: str, where: str, problem_key: Optional[str],
                   answer_key: Optional[str], id_key: Optional[str], label_free: bool) -> Prompt:
    pkey = problem_key or next((k for k in _PROBLEM_KEYS if k in row), "problem")
    value = _get(row, pkey)
    if value is None:
        raise DatasetError(f"{where}: field {pkey!r} is missing"
                           + ("" if problem_key else " (also looked for 'question')"))
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {pkey!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DatasetError(f"{where}: field {pkey!r} is empty")
    gold, gold_keys = _gold(row, where, answer_key, label_free)
    ikey = id_key or next((k for k in _ID_KEYS if k in row), None)
    if ikey is None:
        row_id = str(index)
    else:
        raw_id = _get(row, ikey)
        if raw_id is None:
            raise DatasetError(f"{where}: field {ikey!r} is missing")
        row_id = _text(raw_id, ikey, where)
    used = {pkey.split(".")[0], ikey} | gold_keys
    metadata = {k: v for k, v in row.items() if k not in used and k != "source"}
    source = row.get("source") if isinstance(row.get("source"), str) else name
    return Prompt(id=f"{name}/{row_id}", text=value, gold=gold, source=source, metadata=metadata)
