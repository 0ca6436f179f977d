"""``stored``: the TrajectoryStore of an earlier run (docs/algorithms.md#graft-stored-trajectories). Alignment
``same_step`` (the record of this step) or ``latest`` (the most recent record of the prompt at or before this EPOCH:
the earlier run may visit the prompt at another step of the epoch). A missing prompt means no replacement.

Before the first step, ``build`` checks that the store covers the run (``StoredPeer.coverage`` over the prompts of
every step): a step none of whose prompts has a stored group is refused, unless ``peer.missing=skip`` (then logged and
counted per step in ``peer/stored_missing``); prompts of other steps without one are a warning; a stored prompt whose
question differs from the run's is refused. ``check_store`` is the pre-flight check of ``peer.path`` and
``peer.model`` before any heavy import. Light: the store (pandas, pyarrow) is imported when a run reads it."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from graftzoo.contract import metrics as M
from graftzoo.contract.errors import ConfigError, did_you_mean
from graftzoo.contract.layout import STORE_META
from graftzoo.contract.peer_sources import PeerSourceKind, register_peer_source
from graftzoo.peers.sources.base import PeerSource

log = logging.getLogger("graftzoo")
STORE_KEYS = ("path", "model", "stores", "align", "missing")


def _store_dir(path) -> Path:
    p = Path(path)
    if (p / "store" / "meta.json").exists():
        return p / "store"
    return p


class StoredPeer(PeerSource):
    def __init__(self, path, model: Optional[str] = None, align: str = "same_step", dataset: Optional[str] = None,
                 prompt_ids: Optional[set] = None, exclude: Optional[str] = None):
        from graftzoo.peers.store import StoreMismatchError, TrajectoryStore  # pandas: when a run reads the store
        if align not in ("same_step", "latest"):
            raise ValueError(f"config key 'peer.align' must be same_step|latest, got {align!r}")
        root = _store_dir(path)
        if not (root / "meta.json").exists():
            raise StoreMismatchError(f"peer store {path}: no trajectory store here (expected meta.json or "
                                     f"store/meta.json)")
        self.store = TrajectoryStore(root, create=False)
        models = [m for m in self.store.models if m != exclude] or list(self.store.models)
        if model is None:
            if len(models) != 1:
                raise StoreMismatchError(f"peer store {path} holds models {sorted(self.store.models)}; "
                                         f"choose one with peer.model")
            model = models[0]
        if model not in self.store.models:
            raise StoreMismatchError(f"peer store {path} has no model '{model}' (it has {sorted(self.store.models)})")
        self.model = model
        self.align = align
        self.path = path
        if dataset is not None and self.store.dataset not in (None, dataset):
            raise StoreMismatchError(f"peer store {path} was written for dataset '{self.store.dataset}', "
                                     f"this run trains on '{dataset}'")
        self.df = self.store.read(model)
        if prompt_ids is not None and not (set(self.df["prompt_id"]) & set(prompt_ids)):
            raise StoreMismatchError(f"peer store {path} (model {model}) shares no prompt ids with this run's "
                                     f"prompts")
        self._by_step = {int(s): part for s, part in self.df.groupby("step")} if len(self.df) else {}
        self.missing_steps: set = set()  # steps of the run without a stored group (peer.missing=skip)

    def peer_of(self, learner_id):
        return self.model

    def stored_runs(self):
        return [(self.path, self.model)]

    def step_metrics(self, step, learner_id):
        return {M.PEER_STORED_MISSING: int(int(step) in self.missing_steps)}

    def coverage(self, plan) -> tuple[list, int, int]:
        """``plan``: (step, epoch, prompts) of every step the run trains. Returns the steps none of whose prompts has
        a stored group (as ``groups`` aligns them), and over the other steps the prompts without one and all prompts.
        A stored prompt whose question differs from the run's prompt of that id is a ``StoreError``."""
        from graftzoo.peers.store import StoreMismatchError  # pandas: when a run reads the store
        texts = dict(self.df[["prompt_id", "prompt_text"]].drop_duplicates("prompt_id").itertuples(index=False))
        ids_at = {s: set(part["prompt_id"]) for s, part in self._by_step.items()}
        first = self.df.groupby("prompt_id")["epoch"].min().to_dict() if len(self.df) else {}

        def stored(step, epoch, pid) -> bool:
            if self.align == "same_step":
                return pid in ids_at.get(int(step), ())
            return pid in first and first[pid] <= epoch
        missing, short, total = [], 0, 0
        for step, epoch, prompts in plan:
            for p in prompts:
                if p.id in texts and texts[p.id] != p.text:
                    raise StoreMismatchError(f"peer store {self.path}: prompt {p.id} is {texts[p.id]!r} in the store "
                                             f"but {p.text!r} in this run (different task settings?)")
            hit = sum(stored(step, epoch, p.id) for p in prompts)
            if not hit:
                missing.append(int(step))
            else:
                short, total = short + len(prompts) - hit, total + len(prompts)
        return missing, short, total

    def groups(self, prompts, step, epoch, learner_id):
        from graftzoo.peers.store import StoreMismatchError, rows_to_groups  # pandas: when a run reads the store
        ids = {p.id for p in prompts}
        by_id = {p.id: p for p in prompts}
        if self.align == "same_step":
            part = self._by_step.get(int(step))
            if part is None:
                return {}
            part = part[part["prompt_id"].isin(ids)]
        else:
            # the most recent record at or before this epoch, whatever its step within the epoch (docs/algorithms.md#graft-stored-trajectories)
            cand = self.df[(self.df["prompt_id"].isin(ids)) & (self.df["epoch"] <= epoch)]
            if not len(cand):
                return {}
            last = cand.groupby("prompt_id")["step"].transform("max")
            part = cand[cand["step"] == last]
        for pid, text in part[["prompt_id", "prompt_text"]].drop_duplicates().itertuples(index=False):
            if text != by_id[pid].text:  # same id, another question: other task settings or seed
                raise StoreMismatchError(f"peer store {self.path}: prompt {pid} is {text!r} in the store but "
                                         f"{by_id[pid].text!r} in this run (different task settings?)")
        return rows_to_groups(part, by_id)


def step_ranges(steps) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, steps = [], sorted(set(steps))
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def check_coverage(stored: StoredPeer, plan: list, missing: str = "refuse") -> None:
    """Refuse (``ConfigError``) a store that has no group for some step of the run, unless ``missing`` is ``skip``:
    then the steps are logged and ``stored.missing_steps`` counts them in ``peer/stored_missing``. Prompts without a
    stored group on the other steps are a warning."""
    steps: list = []

    def seen():  # the plan may be a generator: its steps are kept for the message
        for item in plan:
            steps.append(item[0])
            yield item

    lost, short, total = stored.coverage(seen())
    if lost:
        held = stored.store.steps(stored.model)
        if stored.align == "same_step":
            other = [s for s in lost if s in set(held)]
            absent = [s for s in lost if s not in other]
            how = "; ".join(([f"steps {step_ranges(absent)} are not in the store"] if absent else []) + (
                [f"steps {step_ranges(other)} hold other prompts (the peer run sampled with another run.seed, "
                 f"task.prompts_per_step or data)"] if other else []))
        else:
            how = f"steps {step_ranges(lost)} have no stored group of their prompts at or before their epoch"
        what = (f"config key 'peer.path' ({stored.path}): the store of model {stored.model!r} holds steps "
                f"{step_ranges(held)}, this run needs steps {step_ranges(steps)}: {how}")
        if missing != "skip":
            raise ConfigError(f"{what}; give a peer run that covers this one (same prompts, as many steps), or set "
                              f"peer.missing=skip to train the {len(lost)} step(s) without a stored peer")
        log.warning("%s; they train without a stored peer (peer.missing=skip; peer/stored_missing = 1)", what)
        stored.missing_steps = set(lost)
    if short:
        log.warning("peer store %s (model %r): %d of the %d prompts of the covered steps have no stored group: they "
                    "train without a stored peer (the peer run sampled other prompts: another run.seed, "
                    "task.prompts_per_step or data; a DAPO peer stores its informative groups only)", stored.path,
                    stored.model, short, total)



class StoredPeers(PeerSource):
    """Several stores at once, one per peer model (``peer.stores``; docs/algorithms.md#populations): a learner's
    peers are the stored models other than itself, in population order."""

    def __init__(self, stores: list):
        self.stores = list(stores)

    def peers_of(self, learner_id):
        return [s.model for s in self.stores if s.model != learner_id]

    def groups_by_peer(self, prompts, step, epoch, learner_id):
        return {s.model: s.groups(prompts, step, epoch, learner_id) for s in self.stores if s.model != learner_id}

    def stored_runs(self):
        return [run for s in self.stores for run in s.stored_runs()]

    def step_metrics(self, step, learner_id):
        return {M.PEER_STORED_MISSING: int(any(int(step) in s.missing_steps for s in self.stores
                                               if s.model != learner_id))}


def store_paths(cfg, trained_ids) -> dict:
    """peer model id -> the run or store directory it is read from: ``peer.stores`` as given (population order), else
    ``peer.path`` for ``peer.model`` (None: the store's only model, or the one this run does not train)."""
    pc = cfg.peer
    if pc.stores:
        order = [s.id for s in cfg.pair.models]
        return {m: pc.stores[m] for m in sorted(pc.stores, key=order.index)}
    if not pc.path:
        raise ValueError(f"peer.source={pc.source} needs peer.path (a run dir or store dir) or peer.stores")
    return {pc.model: pc.path}


def build(cfg, trained_ids, dataset_id=None, prompt_ids=None, plan=None):
    """The store at ``peer.path`` (a learner trained alone reads the other model's groups), or one store per peer
    model (``peer.stores``: a ``StoredPeers``), each checked to cover ``plan`` (``check_coverage``, ``peer.missing``)."""
    pc = cfg.peer
    plan = None if plan is None else list(plan)
    exclude = trained_ids[0] if len(trained_ids) == 1 else None
    stores = []
    for model, path in store_paths(cfg, trained_ids).items():
        stored = StoredPeer(path, model=model, align=pc.align, dataset=dataset_id, prompt_ids=prompt_ids,
                            exclude=exclude)
        if plan is not None:
            check_coverage(stored, plan, pc.missing)
        stores.append(stored)
    return StoredPeers(stores) if pc.stores else stores[0]


def check_store(cfg) -> None:
    """``peer.path`` (or each path of ``peer.stores``) holds a trajectory store (``STORE_META``), and the store holds
    the model ``peer.model`` (the model ``peer.stores`` reads from it) names, when it names one."""
    pc = cfg.peer
    wanted = [(pc.model, pc.path, "peer.model")] if pc.path else []
    wanted += [(m, path, f"peer.stores.{m}") for m, path in (pc.stores or {}).items()]
    for model, path, key in wanted:
        metas = [Path(path) / m for m in STORE_META if (Path(path) / m).exists()]
        if not metas:
            raise ConfigError(f"peer store {path}: no trajectory store here (expected meta.json or "
                              f"store/meta.json)" + (f" (config key '{key}')" if pc.stores else ""))
        try:
            models = sorted(json.loads(metas[0].read_text(encoding="utf-8")).get("models") or {})
        except (OSError, ValueError, AttributeError):  # a broken store: the trainer names what is wrong with it
            continue
        if model is not None and models and model not in models:
            raise ConfigError(f"config key '{key}': the peer store {path} has no model {model!r}"
                              f"{did_you_mean(model, models) or ';'} it has {models}")


KIND = register_peer_source(PeerSourceKind(
    "stored", "the groups an earlier run stored (peer.path), step by step", build, reads_run=True, keys=STORE_KEYS,
    check=check_store, label=", stored peer"))
