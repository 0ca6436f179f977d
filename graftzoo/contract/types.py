"""The data contract of graftzoo (docs/architecture.md, "The data that flows"; docs/architecture.md#one-training-step).

    Prompt -> Group of Rollouts (one model, one prompt) -> TrainRow (one response as a learner trains on it)
           -> MiniBatch (tensors, graftzoo.contract.batch) -> loss parts (policy gradient, auxiliary NLL, KL)

Text is the lingua franca between models; token ids belong to one tokenizer. Everything here is a
plain, picklable dataclass: hooks exchange these and nothing else (no string-keyed side channels),
so they can cross process / Ray boundaries as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

Role = Literal["own", "peer", "aux"]
"""What a response is to the learner that trains on it: its own sample (policy gradient, KL), a peer's
response (policy gradient with the peer's / recomputed advantage, no KL), or an auxiliary target
(length-normalized NLL only, e.g. SGT ``mode=aux_nll``)."""
ROLES = ("own", "peer", "aux")


@dataclass
class Prompt:
    """One problem. ``gold`` is None for label-free data."""

    id: str
    text: str
    gold: Optional[str] = None
    source: str = ""
    metadata: dict = field(default_factory=dict)


@dataclass
class Origin:
    """Where a localized peer response came from (docs/algorithms.md#cross-tokenizer-exchange): the generating model and
    tokenizer, and the peer's behaviour mean log-prob ``l_P`` over its own ``token_count`` tokens
    (EOS excluded). ``stored_step`` is set when the response was read from a trajectory store."""

    model_id: str
    tokenizer_id: str
    mean_logp: float
    token_count: int
    stored_step: Optional[int] = None


@dataclass(frozen=True)
class Rollout:
    """One sampled response, in the token ids of the tokenizer that ``tokenizer_id`` names.

    ``token_ids`` and ``logprobs`` cover the response only (including the EOS token when the model
    stopped). ``prefix_len`` counts leading response tokens that were given, not sampled (ExTra prefix
    regeneration); they carry no gradient. For a peer response localized into a learner's tokenizer
    (``origin`` set), ``logprobs`` are the learner's theta_old log-probs of the re-tokenized text.
    ``logprobs`` are never rewritten: theta_old through the training path is data of its own, ``theta_old``,
    given when the step's theta_old pass makes the rollout (docs/algorithms.md#notation-and-conventions);
    ``old_logprobs`` is the one a reader takes (``theta_old`` when given, else ``logprobs``).

    A rollout is a value: frozen, changed only by ``dataclasses.replace`` into a new one (a hook that sets a field
    for the loss puts the copy in its group's place). Fields that learner hooks set for the loss (None = the
    default):

    - ``role``: own | peer | aux (see ``Role``);
    - ``loss_mask``: per-token loss weights, multiplied into the default mask (1 after the prefix);
    - ``kl_mask``: per-token KL weights of an own response (default: the loss mask);
    - ``old_logp``: a given ratio base that is not this learner's theta_old (GRAFT's aligned peer log-probs;
      default: ``old_logprobs``);
    - ``char_offsets``: character span of each body token in ``text`` (GRAFT's cross-aligned ratio);
    - ``dropped``: why a localized response cannot be trained on ("overflow", "prompt_overflow", "empty",
      "lossy_<reason>", "verdict_changed": docs/algorithms.md#exchange-rules-for-real-vocabularies).
    """

    prompt_id: str
    model_id: str
    policy_version: int
    text: str
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" | "length"
    prompt_token_ids: list = field(default_factory=list)
    eos_id: Optional[int] = None
    reward: float = 0.0
    correct: bool = False
    extracted: Optional[str] = None
    status: str = ""
    prefix_len: int = 0
    tokenizer_id: str = ""
    role: Role = "own"
    loss_mask: Optional[list] = None
    kl_mask: Optional[list] = None
    old_logp: Optional[list] = None
    char_offsets: Optional[list] = None
    origin: Optional[Origin] = None
    dropped: Optional[str] = None
    theta_old: Optional[list] = None
    staleness: int = 0  # updates between the policy version that decoded it and theta_old (the step's theta_old pass)

    @property
    def old_logprobs(self) -> list:
        """The response's log-probs under theta_old as the step uses them: the training path's (``theta_old``)
        when the step computed them as the ratio base, else the engine's (``logprobs``)."""
        return self.logprobs if self.theta_old is None else self.theta_old

    @property
    def body_ids(self) -> list:
        """Response token ids without the final EOS (what the text decodes from)."""
        ids = list(self.token_ids)
        if self.finish_reason == "stop" and ids and self.eos_id is not None and ids[-1] == self.eos_id:
            return ids[:-1]
        return ids

    def _content(self):
        """Token log-probs without the final EOS (the XT convention, docs/algorithms.md#cross-tokenizer-exchange)."""
        lp = list(self.old_logprobs)[self.prefix_len:]
        if self.finish_reason == "stop" and self.token_ids and self.eos_id is not None \
                and self.token_ids[-1] == self.eos_id and lp:
            lp = lp[:-1]
        return lp

    @property
    def logp_sum(self) -> float:
        return float(sum(self._content()))

    @property
    def token_count(self) -> int:
        return len(self._content())

    @property
    def mean_logp(self) -> float:
        n = self.token_count
        return self.logp_sum / n if n else 0.0


@dataclass
class Group:
    """One model's rollouts for one prompt, plus their advantages (the one advantage channel).

    ``source`` is "own" for a slot that holds the learner's group and "peer" for a slot that the
    exchange filled with peer data (it decides the slot's place in the minibatch order);
    ``weights`` are per-response loss weights (GRAFT's ``w_i``; None = 1).
    """

    prompt: Prompt
    model_id: str
    rollouts: list
    advantages: Optional[list] = None
    source: str = "own"
    weights: Optional[list] = None

    @property
    def n(self) -> int:
        return len(self.rollouts)

    @property
    def rewards(self) -> list:
        return [r.reward for r in self.rollouts]

    @property
    def num_correct(self) -> int:
        return sum(1 for r in self.rollouts if r.correct)

    @property
    def all_fail(self) -> bool:
        return self.n > 0 and self.num_correct == 0

    @property
    def all_success(self) -> bool:
        return self.n > 0 and self.num_correct == self.n

    @property
    def mixed(self) -> bool:
        return 0 < self.num_correct < self.n


@dataclass
class TrainRow:
    """One response as a learner trains on it, in the learner's own tokenizer (plain data).

    Token-level: ``old_logp``, ``loss_mask``, ``kl_mask`` (one entry per response token).
    Sequence-level: ``advantage``, ``weight``, ``role``, ``slot`` (the group slot it came from),
    ``origin_mean_logp`` (the peer's ``l_P`` for a localized response, used by HACPO's cross ratio) and
    ``given_old_logp`` (``old_logp`` is a given ratio base, e.g. GRAFT T2's aligned peer log-probs, not the
    learner's theta_old: a recompute of theta_old leaves it as it is). ``behaviour_logp``: an own response decoded
    by an older policy than theta_old (``Rollout.staleness`` > 0), its behaviour log-probs, which the loss weighs
    its tokens by (docs/algorithms.md#stale-rollouts); None for every other row.
    ``rollout`` is the response it was built from, for inspection only: the loss reads the fields.
    """

    prompt_ids: list
    response_ids: list
    old_logp: list
    loss_mask: list
    kl_mask: list
    advantage: float
    weight: float
    role: Role
    slot: int
    origin_mean_logp: Optional[float] = None
    given_old_logp: bool = False
    rollout: Optional[Rollout] = None
    behaviour_logp: Optional[list] = None

    @property
    def is_peer(self) -> bool:
        return self.role == "peer"
