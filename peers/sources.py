"""Peer sources: where a learner's peer groups come from (docs/architecture.md#one-training-step).

``groups(prompts, step, epoch, learner_id) -> {prompt_id: Group}`` returns, for the step's prompts,
the peer's groups: text, rewards, peer advantages, peer log-prob stats and policy versions.

- ``OnlinePeer``: the partner in the same run; the trainer hands it every model's groups of the
  step before any model updates.
- ``StoredPeer``: the TrajectoryStore of an earlier run; alignment ``same_step`` (the record of
  this step) or ``latest`` (the most recent record of the prompt at or before this EPOCH, spec
  docs/algorithms.md#graft-stored-trajectories: the earlier run may visit the prompt at another step of the
  epoch). A missing prompt means no replacement.
- ``MixedPeer``: online with a stored fallback, or a mixing ratio.

Before the first step, ``make_peer_source`` checks that a store covers the run (``StoredPeer.coverage`` over the
prompts of every step): a step none of whose prompts has a stored group is refused, unless ``peer.missing=skip``
(then logged and counted per step in ``peer/stored_missing``); prompts of other steps without one are a warning; a
stored prompt whose question differs from the run's is refused.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Optional

from graftzoo.contract import metrics as M
from graftzoo.contract.config import RunConfig
from graftzoo.contract.errors import ConfigError
from graftzoo.peers.store import StoreError, StoreMismatchError, TrajectoryStore, rows_to_groups

log = logging.getLogger("graftzoo")


class PeerSource:
    kind = "none"

    def groups(self, prompts, step: int, epoch: int, learner_id: str) -> dict:
        raise NotImplementedError

    def peer_of(self, learner_id: str) -> Optional[str]:
        return None

    def observe(self, groups_by_model: dict):
        """Every trained model's groups of this step, before any update (a no-op unless a source needs them)."""

    def step_metrics(self, step: int, learner_id: str) -> dict:
        """What the source reports about a learner's step (``peer/stored_missing`` for a store)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass


class OnlinePeer(PeerSource):
    kind = "online"

    def __init__(self, model_ids: list):
        if len(model_ids) != 2:
            raise ValueError(f"peer.source=online needs exactly two trained models, got {model_ids}")
        self.model_ids = list(model_ids)
        self._step_groups: dict = {}

    def peer_of(self, learner_id: str) -> str:
        a, b = self.model_ids
        return b if learner_id == a else a

    def observe(self, groups_by_model: dict):
        """Every model's groups of this step (rollouts finished, advantages computed, no update yet)."""
        self._step_groups = {m: {g.prompt.id: g for g in gs} for m, gs in groups_by_model.items()}

    def groups(self, prompts, step, epoch, learner_id):
        mine = self._step_groups.get(self.peer_of(learner_id), {})
        return {p.id: mine[p.id] for p in prompts if p.id in mine}


def _store_dir(path) -> Path:
    p = Path(path)
    if (p / "store" / "meta.json").exists():
        return p / "store"
    return p


class StoredPeer(PeerSource):
    kind = "stored"

    def __init__(self, path, model: Optional[str] = None, align: str = "same_step", dataset: Optional[str] = None,
                 prompt_ids: Optional[set] = None, exclude: Optional[str] = None):
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

    def step_metrics(self, step, learner_id):
        return {M.PEER_STORED_MISSING: int(int(step) in self.missing_steps)}

    def coverage(self, plan) -> tuple[list, int, int]:
        """``plan``: (step, epoch, prompts) of every step the run trains. Returns the steps none of whose prompts has
        a stored group (as ``groups`` aligns them), and over the other steps the prompts without one and all prompts.
        A stored prompt whose question differs from the run's prompt of that id is a ``StoreError``."""
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


class MixedPeer(PeerSource):
    """Online peer, with the stored group used as fallback (mix_ratio None) or with probability mix_ratio."""

    kind = "mixed"

    def __init__(self, online: OnlinePeer, stored: StoredPeer, mix_ratio: Optional[float] = None, seed: int = 0):
        self.online, self.stored, self.mix_ratio, self.seed = online, stored, mix_ratio, seed

    def peer_of(self, learner_id):
        return self.online.peer_of(learner_id)

    def observe(self, groups_by_model):
        self.online.observe(groups_by_model)

    def step_metrics(self, step, learner_id):
        return self.stored.step_metrics(step, learner_id) if self.stored.model == self.peer_of(learner_id) else {}

    def groups(self, prompts, step, epoch, learner_id):
        live = self.online.groups(prompts, step, epoch, learner_id)
        # the store stands in for the stored model only: never hand a learner its own logged groups
        stored = self.stored.groups(prompts, step, epoch, learner_id) \
            if self.stored.model == self.peer_of(learner_id) else {}
        rng = random.Random(f"{self.seed}:{step}:{learner_id}")
        out = {}
        for p in prompts:
            use_stored = p.id not in live or (self.mix_ratio is not None and p.id in stored
                                                and rng.random() < self.mix_ratio)
            g = stored.get(p.id) if use_stored else live.get(p.id)
            if g is not None:
                out[p.id] = g
        return out


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


def make_peer_source(cfg: RunConfig, trained_ids: list, dataset_id: Optional[str] = None, prompt_ids=None,
                     plan: Optional[list] = None):
    """The peer source named by ``peer.*`` (``none`` -> None); with ``plan`` ((step, epoch, prompts) of every step
    of the run), a store is checked to cover it (``check_coverage``, ``peer.missing``)."""
    pc = cfg.peer
    src = pc.source
    if src == "none":
        return None
    if src == "online":
        return OnlinePeer(trained_ids)
    if not pc.path:
        raise ValueError(f"peer.source={src} needs peer.path (a run dir or store dir)")
    exclude = trained_ids[0] if len(trained_ids) == 1 else None
    stored = StoredPeer(pc.path, model=pc.model, align=pc.align, dataset=dataset_id,
                        prompt_ids=prompt_ids, exclude=exclude)
    if plan is not None:
        check_coverage(stored, plan, pc.missing)
    if src == "stored":
        return stored
    return MixedPeer(OnlinePeer(trained_ids), stored, pc.mix_ratio, seed=int(cfg.run.seed))
