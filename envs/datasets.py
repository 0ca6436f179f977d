"""Prompt datasets: the bundled benchmark / training files, the procedural arithmetic task, and
the user's own data (docs/architecture.md, "The data that flows"; docs/guide.md#bring-your-own-data).

A dataset is a read-only ``Sequence[Prompt]`` with a ``name``, a ``path`` (None when generated)
and a ``hash`` that identifies its contents exactly, so a run log can say what it trained on.

User data (:func:`load_dataset`): a JSONL file, a ``.json`` file (a top-level array of rows, or JSON
Lines), a Parquet file, an Arrow file (``.arrow``, as Hugging Face ``datasets`` writes them), a folder
written by ``datasets``' ``save_to_disk`` (a Dataset, or a DatasetDict of which ``split`` picks one),
or a Hugging Face Hub name ``org/name`` that is not a local path (downloaded by ``datasets``; with the
Hub unreachable or ``HF_HUB_OFFLINE`` set, only its local cache is tried, so it fails in seconds).
``datasets`` is imported only for the last three.

Rows are read field by field (the bundled files all use ``id/problem/answer/source``, see
``data/README.md``; user files may differ):

- problem: ``problem``, ``question`` or ``prompt`` (or ``problem_key=``). A list of chat messages
  (verl's ``prompt: [{role, content}, ...]``) gives the content of its last ``user`` message, verbatim
  (an instruction it holds, such as verl's GSM8K "Let's think step by step and output the final answer
  after ####", stays in the text; the prompt template adds its own);
- gold answer: ``answer`` (GSM8K's raw ``... #### 72`` form keeps the text after the last
  ``####``, without thousands commas), else ``gold``, ``ground_truth`` or verl's
  ``reward_model.ground_truth``, else the last ``\\boxed{}`` of ``solution`` (or ``answer_key=``); a
  gold answer that holds a ``\\boxed{}`` (a whole solution) is its last boxed content;
  ``label_free=True`` (config key ``task.label_free``, for a label-free learner) keeps rows without one, with
  ``Prompt.gold`` None;
- id: ``id`` (or ``id_key=``), else the 0-based row index. The prompt id is ``"<dataset>/<id>"``.

A dotted key (``reward_model.ground_truth``) reads a nested field. Every other field of the row
goes to ``Prompt.metadata`` (verl's ``data_source`` also becomes ``Prompt.source`` when the row has no
``source``). A bad row raises :class:`DatasetError` naming where it is and the field: ``file:line`` for
JSONL and JSON, ``file row i`` (the 0-based row index) for Parquet, Arrow and ``datasets`` data
(``folder[split] row i`` for a split of a DatasetDict).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any, Optional, Union, overload

import pyarrow.parquet as pq

from graftzoo.contract.errors import did_you_mean
from graftzoo.contract.types import Prompt
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
#: the evaluation benchmarks of the GRAFT comparison (docs/algorithms.md#evaluation-protocol-and-compute)
BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva_math")

#: the one split a file path accepts besides None: the file itself (``task.split``'s default)
FILE_SPLIT = "train"
#: the file formats :func:`load_file` reads
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
#: a Hugging Face Hub dataset name (``org/name``), tried when no local path of that name exists
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: seconds to wait for a TCP connection to the Hub before treating it as offline
HUB_CONNECT_TIMEOUT = 3.0

_PROBLEM_KEYS = ("problem", "question", "prompt")
_ANSWER_KEYS = ("answer", "gold", "ground_truth", "reward_model.ground_truth")
_ID_KEYS = ("id",)
_FILE_KWARGS = {"problem_key", "answer_key", "id_key", "label_free", "name"}
#: how rows without a gold answer can train: what a DatasetError for one suggests (``graftzoo.envs.task`` says
#: otherwise for an evaluation set, which needs gold answers; ``graftzoo env check`` names its ``--kw``)
LABEL_FREE_HINT = "set task.label_free: true to train a label-free learner, such as om_grpo, on unlabelled rows"
_ARITHMETIC_KWARGS = {"size", "seed", "mix", "difficulty"}


class DatasetError(ValueError):
    """A dataset file or row is malformed; the message names ``file:line`` (or ``file row i``) and the field."""


class MissingSplitError(ValueError):
    """The dataset has no split of the requested name (a file is one split; a DatasetDict lists its own).
    The task falls back to a held-out slice of the training set when the ``test`` split is missing."""


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


def is_user_data(name: Union[str, Path]) -> bool:
    """Whether :func:`load_dataset` reads ``name`` as the user's own file or folder (or refuses it as unknown): not a
    bundled name, the arithmetic task or a Hub name. ``graftzoo train`` reads such data before it imports torch, so
    that a missing file or a broken row is refused at once."""
    key = str(name)
    if key in bundled_names():
        return False
    path = Path(key)
    return not (HUB_NAME.match(key) and not path.exists() and path.suffix not in FILE_SUFFIXES)


def load_dataset(name_or_path: Union[str, Path], split: Optional[str] = None, **kw: Any) -> MathDataset:
    """Load a bundled dataset by name, the procedural arithmetic task, or the user's own data.

    - bundled names: ``math500, aime24, aime25, amc23, minerva_math, math_train, gsm8k_train,
      gsm8k_test``; ``"gsm8k"`` with ``split="train"|"test"``. ``split`` may repeat the file's own
      split and must not contradict it.
    - ``"arithmetic"``: kwargs ``size, seed, mix, difficulty``; ``split`` defaults to ``"train"``.
    - user data (module docstring), kwargs ``problem_key, answer_key, id_key, label_free, name`` (the
      name defaults to the file stem or folder name): a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.arrow``
      file or a ``save_to_disk`` Dataset folder is one split, the set it holds: ``split`` is None or
      ``"train"`` (a run's ``task.split`` default: ``task.dataset: my.jsonl`` needs no other key); any
      other split raises :class:`MissingSplitError`. A DatasetDict folder or a Hub name has named splits:
      ``split`` picks one (None: the only one).
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
            raise MissingSplitError(f"dataset {key!r} has only the {own_split!r} split, got split={split!r}")
        _reject_kwargs(key, kw, set())
        return load_file(DATA_DIR / fname, name=key, split=own_split)
    path = Path(name_or_path)
    if path.is_dir():
        _reject_kwargs(key, kw, _FILE_KWARGS)
        return load_hf_folder(path, split, **kw)
    if path.suffix in FILE_SUFFIXES:
        _one_split(key, split)
        _reject_kwargs(key, kw, _FILE_KWARGS)
        return load_file(path, split=split, **kw)
    if HUB_NAME.match(key) and not path.exists():
        _reject_kwargs(key, kw, _FILE_KWARGS)
        return load_hub(key, split, **kw)
    raise ValueError(f"unknown dataset {key!r}{did_you_mean(key, bundled_names())}: not a bundled name "
                     f"({', '.join(bundled_names())}), not a "
                     f"{' / '.join(FILE_SUFFIXES)} file or a datasets folder (save_to_disk), and not a Hugging Face "
                     f"Hub name (org/name)")


def load_file(path: Union[str, Path], *, name: Optional[str] = None, split: Optional[str] = None,
              problem_key: Optional[str] = None, answer_key: Optional[str] = None,
              id_key: Optional[str] = None, label_free: bool = False) -> MathDataset:
    """Read a JSONL, JSON, Parquet or Arrow file into a :class:`MathDataset` (field rules: module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    data = path.read_bytes()
    if path.suffix == ".parquet":
        rows = _parquet_rows(path)
    elif path.suffix == ".arrow":
        rows = _hf_rows(_read_arrow(path), path.name)
    elif path.suffix == ".json":
        rows = _json_rows(path, data)
    else:
        rows = _jsonl_rows(path, data)
    return _dataset(name or path.stem, rows, str(path), path=path, split=split,
                    digest=hashlib.sha256(data).hexdigest(), problem_key=problem_key, answer_key=answer_key,
                    id_key=id_key, label_free=label_free)


def load_hf_folder(path: Union[str, Path], split: Optional[str] = None, *, name: Optional[str] = None,
                   **fields: Any) -> MathDataset:
    """A folder written by ``datasets``' ``save_to_disk``: a Dataset (one split, like a file) or a DatasetDict
    (``split`` picks one; None: its only one). ``fields``: ``problem_key, answer_key, id_key, label_free``."""
    path = Path(path)
    datasets = _datasets()
    if not any((path / f).is_file() for f in ("dataset_dict.json", "state.json", "dataset_info.json")):
        raise DatasetError(f"{path}: a folder, but not one written by datasets' save_to_disk (no dataset_dict.json "
                           "or state.json in it)")
    try:
        obj = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several types for a damaged folder
        raise DatasetError(f"{path}: cannot read as a datasets folder ({_one_line(e)})") from None
    return _from_hf(obj, path.name, name or path.name, split, path=path, **fields)


def load_hub(repo: str, split: Optional[str] = None, *, name: Optional[str] = None, **fields: Any) -> MathDataset:
    """A Hugging Face Hub dataset ``org/name`` through ``datasets.load_dataset``. When the Hub cannot be reached
    (``HF_HUB_OFFLINE`` set, or no TCP connection within ``HUB_CONNECT_TIMEOUT`` s) only the local cache is tried,
    so an offline machine fails in seconds, in one line naming the dataset, instead of retrying."""
    datasets = _datasets()
    offline = _hub_offline()
    try:
        with _offline_mode(offline is not None):
            obj = datasets.load_dataset(repo, split=split)
    except ValueError as e:
        if "split" in str(e).lower():
            raise MissingSplitError(f"dataset {repo!r}: split={split!r} is not one of its splits "
                                    f"({_one_line(e)})") from None
        raise DatasetError(f"dataset {repo!r} (Hugging Face Hub): {_one_line(e)}") from None
    except Exception as e:  # connection, missing repo, gated repo, ...: one line naming the dataset
        if offline is not None:
            raise DatasetError(f"dataset {repo!r}: not a local path, and the Hugging Face Hub is offline ({offline}) "
                               f"with no copy of it in the local cache") from None
        raise DatasetError(f"dataset {repo!r} (Hugging Face Hub): {_one_line(e)}") from None
    return _from_hf(obj, repo, name or repo.split("/")[-1], split, one_split=False, **fields)


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


def _one_split(what: str, split: Optional[str]) -> None:
    """A file (or a save_to_disk Dataset) is one split: the set it holds."""
    if split not in (None, FILE_SPLIT):
        raise MissingSplitError(f"split={split!r}: {what!r} is one split, the data it holds (split={FILE_SPLIT!r} "
                                f"or None: the file itself); a datasets DatasetDict folder or a Hub name has named "
                                f"splits")


def _datasets():
    """The ``datasets`` library, imported on first use (it takes about a second to import)."""
    import datasets
    return datasets


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _hub_offline() -> Optional[str]:
    """Why the Hugging Face Hub cannot be reached (None when it can): ``HF_HUB_OFFLINE`` (or
    ``HF_DATASETS_OFFLINE``) set, or no TCP connection to ``HF_ENDPOINT`` within ``HUB_CONNECT_TIMEOUT`` s."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{var}={os.environ[var]}"
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT).close()
    except OSError as e:
        return f"cannot connect to {host}:{port}: {e.strerror or _one_line(e)}"
    return None


class _offline_mode:
    """Within it, ``datasets`` and ``huggingface_hub`` read only their local caches (their offline mode,
    which they otherwise take from the environment when imported)."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        import datasets.config
        import huggingface_hub.constants
        self.mods = (datasets.config, huggingface_hub.constants)
        self.old = [m.HF_HUB_OFFLINE for m in self.mods]
        if self.on:
            for m in self.mods:
                m.HF_HUB_OFFLINE = True

    def __exit__(self, *exc):
        for m, old in zip(self.mods, self.old):
            m.HF_HUB_OFFLINE = old


def _read_arrow(path: Path):
    try:
        return _datasets().Dataset.from_file(str(path))
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise DatasetError(f"{path}: cannot read as an Arrow file ({_one_line(e)})") from None


def _from_hf(obj, label: str, name: str, split: Optional[str], *, path: Optional[Path] = None,
             one_split: bool = True, **fields: Any) -> MathDataset:
    """A ``datasets`` Dataset or DatasetDict (``split`` picks one of a DatasetDict) as a MathDataset."""
    if isinstance(obj, dict):  # a DatasetDict
        splits = sorted(obj)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in obj:
            raise MissingSplitError(f"{label}: split={split!r} is not one of its splits ({', '.join(splits)}); "
                                    f"name one with task.split")
        obj, label = obj[split], f"{label}[{split}]"
    elif one_split:
        _one_split(label, split)
    elif split is not None:
        label = f"{label}[{split}]"
    return _dataset(name, _hf_rows(obj, label), label, path=path, split=split, **fields)


def _hf_rows(ds, label: str) -> Iterator[tuple[str, str, dict]]:
    for index, row in enumerate(ds):
        yield f"{label} row {index}", f"row {index}", row


def _dataset(name: str, rows: Iterator[tuple[str, str, dict]], label: str, *, path: Optional[Path] = None,
             split: Optional[str] = None, digest: Optional[str] = None, problem_key: Optional[str] = None,
             answer_key: Optional[str] = None, id_key: Optional[str] = None, label_free: bool = False) -> MathDataset:
    """Rows ``(where, ref, row)`` -> a MathDataset; ``where`` prefixes a bad row's error, ``ref`` names the row
    a repeated id first appeared in."""
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for index, (where, ref, row) in enumerate(rows):
        p = _row_to_prompt(row, index, name=name, where=where, problem_key=problem_key,
                           answer_key=answer_key, id_key=id_key, label_free=label_free)
        if p.id in seen:
            raise DatasetError(f"{where}: id {p.id!r} repeats the id of {seen[p.id]}")
        seen[p.id] = ref
        prompts.append(p)
    if not prompts:
        raise DatasetError(f"{label}: the file holds no rows")
    return MathDataset(name, prompts, path=path, split=split, digest=digest)


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise DatasetError(f"{path.name}:{line}: not valid UTF-8 ({e.reason})") from None


def _jsonl_rows(path: Path, data: bytes) -> Iterator[tuple[str, str, dict]]:
    text = _decode(path, data)
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path.name}:{line}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path.name}:{line}: expected a JSON object, got {type(row).__name__}")
        yield f"{path.name}:{line}", f"line {line}", row


def _json_rows(path: Path, data: bytes) -> Iterator[tuple[str, str, dict]]:
    """A ``.json`` file: a top-level array of objects (each row named by the line it starts on), or JSON Lines."""
    text = _decode(path, data)
    start = len(text) - len(text.lstrip())
    if not text[start:start + 1] == "[":
        yield from _jsonl_rows(path, data)
        return
    decoder, i, index = json.JSONDecoder(), start + 1, 0
    ws = re.compile(r"\s*")
    i = ws.match(text, i).end()
    if text[i:i + 1] == "]":
        return
    while True:
        line = text.count("\n", 0, i) + 1
        try:
            row, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path.name}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path.name}:{line}: row {index} of the array: expected a JSON object, "
                               f"got {type(row).__name__}")
        yield f"{path.name}:{line}", f"line {line}", row
        index += 1
        i = ws.match(text, i).end()
        if text[i:i + 1] == ",":
            i = ws.match(text, i + 1).end()
            continue
        if text[i:i + 1] == "]" and not text[i + 1:].strip():
            return
        line = text.count("\n", 0, i) + 1
        raise DatasetError(f"{path.name}:{line}: invalid JSON (expected ',' or the array's closing ']')")


def _parquet_rows(path: Path) -> Iterator[tuple[str, str, dict]]:
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DatasetError(f"{path}: cannot read as Parquet ({e})") from None
    for index, row in enumerate(table.to_pylist()):
        yield f"{path.name} row {index}", f"row {index}", row


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
    """The gold answer and the top-level keys it came from."""
    if answer_key is not None:
        value = _get(row, answer_key)
        if value is None:
            if label_free:
                return None, set()
            raise DatasetError(f"{where}: field {answer_key!r} is missing ({LABEL_FREE_HINT})")
        return _unboxed(_text(value, answer_key, where)), {answer_key.split(".")[0]}
    for key in _ANSWER_KEYS:
        if _get(row, key) is not None:
            text = _text(_get(row, key), key, where)
            if key == "answer" and "####" in text:
                text = _text(text.rsplit("####", 1)[1].replace(",", ""), key, where)
            return _unboxed(text), {key.split(".")[0]}
    if isinstance(row.get("solution"), str):
        boxed = last_boxed(row["solution"])
        if boxed:
            return boxed, set()
    if label_free:
        return None, set()
    raise DatasetError(f"{where}: field 'answer' is missing (also looked for 'gold', 'ground_truth', "
                       f"'reward_model.ground_truth' and a \\boxed{{}} in 'solution'; set task.fields.answer, or "
                       f"{LABEL_FREE_HINT})")


def _unboxed(gold: str) -> str:
    """A gold answer written as a solution with a ``\\boxed{}`` is the content of its last box."""
    return (last_boxed(gold) or gold) if "\\boxed" in gold or "\\fbox" in gold else gold


def _problem(value: Any, key: str, where: str) -> str:
    """The problem text of a field: a string, or the content of the last ``user`` message of a chat."""
    if isinstance(value, list):
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise DatasetError(f"{where}: field {key!r} is a list but holds no chat message with role 'user' "
                               f"(expected [{{'role': 'user', 'content': ...}}, ...])")
        value, key = users[-1].get("content"), f"{key}[{value.index(users[-1])}].content"
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {key!r} must be a string or a list of chat messages, "
                           f"got {type(value).__name__}")
    if not value.strip():
        raise DatasetError(f"{where}: field {key!r} is empty")
    return value


def _row_to_prompt(row: dict, index: int, *, name: str, where: str, problem_key: Optional[str],
                   answer_key: Optional[str], id_key: Optional[str], label_free: bool) -> Prompt:
    pkey = problem_key or next((k for k in _PROBLEM_KEYS if row.get(k) is not None), "problem")
    value = _get(row, pkey)
    if value is None:
        raise DatasetError(f"{where}: field {pkey!r} is missing"
                           + ("" if problem_key else " (also looked for 'question' and 'prompt'; set "
                                                     "task.fields.problem)"))
    text = _problem(value, pkey, where)
    gold, gold_keys = _gold(row, where, answer_key, label_free)
    ikey = id_key or next((k for k in _ID_KEYS if k in row), None)
    if ikey is None:
        row_id = str(index)
    else:
        raw_id = _get(row, ikey)
        if raw_id is None:
            raise DatasetError(f"{where}: field {ikey!r} is missing")
        row_id = _text(raw_id, ikey, where)
    used = {pkey.split(".")[0], ikey.split(".")[0] if ikey else None} | gold_keys
    metadata = {k: v for k, v in row.items() if k not in used and k != "source"}
    source = next((row[k] for k in ("source", "data_source") if isinstance(row.get(k), str)), name)
    return Prompt(id=f"{name}/{row_id}", text=text, gold=gold, source=source, metadata=metadata)
