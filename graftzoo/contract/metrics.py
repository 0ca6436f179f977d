"""Metric names: every key the code logs to ``metrics.jsonl`` and wandb, declared once with its unit, its meaning and
who logs it. Logging sites and readers (reports, plots, the progress bar) use these constants, never the raw
strings; docs/metrics.md is generated from here (``markdown``; ``python -m graftzoo.contract.metrics``).

A ``Metric`` is its name: a ``str`` whose value is the key as it is written, so it is a metrics dict's key, a
DataFrame's column and a wandb key as it is (and pickles as the plain name). Names built at run time (one per
evaluation group) are a ``Family``: the pattern is declared once and ``Family.of(...)`` builds the names.

    from graftzoo.contract import metrics as M
    ctx.log(M.PEER_ADMITTED, n)              # "peer/admitted"
    out[M.EVAL_AVG_GROUP.of(group=g)] = avg  # "eval/avg_<group>"

``METRICS`` maps every name to its ``Metric``; ``FAMILIES`` holds the patterns; ``declared(name)`` says whether a
name is either. ``EVERY_RECORD`` is the fixed vocabulary present in every ``metrics.jsonl`` record (``None`` where
it does not apply, e.g. the peer metrics of a GRPO run).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from graftzoo.contract.registry import load_sections

UNITS = {
    "fraction": "a share in [0, 1]",
    "count": "a number of things (per step unless said)",
    "s": "seconds of wall-clock time",
    "tokens": "a number of tokens",
    "tokens/s": "tokens per second of wall-clock time",
    "GB": "gigabytes (2^30 bytes)",
    "nats": "natural-log units (entropies, KL, log-probs)",
    "nats/token": "a mean over tokens of a natural-log quantity",
    "ratio": "a ratio of two like quantities (1 = equal)",
    "reward": "the verifier's reward scale",
    "value": "a dimensionless number (a loss, a norm, a coefficient)",
    "index": "a position (step, epoch)",
    "id": "an identifier",
    "table": "a wandb table",
}


METRICS: dict = {}
"""name -> Metric, every declared metric in declaration order: the shared ones here, then each algorithm's, declared
in its package (graftzoo.algos.<name>) and loaded with the sections (``_with_algorithms``)."""


class Metric(str):
    """A declared metric: the name (the str itself), its ``unit`` (a key of ``UNITS``), a one-line ``meaning`` and
    ``by``, who logs it ("all": every run)."""

    unit: str
    meaning: str
    by: str

    def __new__(cls, name: str, unit: str, meaning: str, by: str = "all"):
        if unit not in UNITS:
            raise ValueError(f"metric {name!r}: unknown unit {unit!r} (known: {sorted(UNITS)})")
        self = super().__new__(cls, name)
        self.unit, self.meaning, self.by = unit, meaning, by
        old = METRICS.setdefault(name, self)
        if (old.unit, old.meaning, old.by) != (unit, meaning, by):
            raise ValueError(f"metric {name!r} is declared twice: by {old.by!r} ({old.meaning!r}) and by {by!r} "
                             f"({meaning!r})")
        return self

    @property
    def name(self) -> str:
        return str(self)

    def __reduce__(self):  # a plain str across processes (Ray) and in copies
        return (str, (str(self),))


@dataclass(frozen=True)
class Family:
    """Metric names built at run time: ``pattern`` with ``{part}`` placeholders (``eval/avg_{group}``)."""

    pattern: str
    unit: str
    meaning: str
    by: str = "all"

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"metric family {self.pattern!r}: unknown unit {self.unit!r}")

    @property
    def parts(self) -> tuple:
        return tuple(re.findall(r"\{(\w+)\}", self.pattern))

    def of(self, **parts) -> str:
        """The name for these parts (each placeholder given, nothing else)."""
        if set(parts) != set(self.parts):
            raise ValueError(f"metric family {self.pattern!r} takes {self.parts}, got {sorted(parts)}")
        return self.pattern.format(**{k: str(v) for k, v in parts.items()})

    def matches(self, name: str) -> bool:
        rx = "".join(".+" if i % 2 else re.escape(s) for i, s in enumerate(re.split(r"\{\w+\}", self.pattern)))
        return re.fullmatch(rx, name) is not None

    @property
    def shown(self) -> str:
        """The pattern as the docs write it: ``eval/avg_<group>``."""
        return re.sub(r"\{(\w+)\}", r"<\1>", self.pattern)


_PEER_LEARNERS = "GRAFT, HACPO, SGT"
_PAIRS = "co-trained pairs, peer exchange"
_EVAL = "evaluation (run.eval_every, eval_at_start, eval_at_end)"
_DIAG = "run.diagnostics"

# ---- the record ---------------------------------------------------------------------------------------------------
STEP = Metric("step", "index", "training step of the record (-1: the evaluation before training; run.steps: the "
              "final evaluation)")
MODEL = Metric("model", "id", "the model id the record is about")
EPOCH = Metric("epoch", "index", "pass over the training prompts the step belongs to")

# ---- optimisation -------------------------------------------------------------------------------------------------
LOSS = Metric("loss", "value", "training loss of a minibatch (its micro-batches summed), mean over the step's "
              "minibatches")
GRAD_NORM = Metric("grad_norm", "value", "gradient L2 norm before clipping, mean over the step's optimizer steps")
LR = Metric("lr", "value", "the optimizer's learning rate after the step's update")
ENTROPY = Metric("entropy", "nats", "mean token entropy of the trained response tokens")
KL = Metric("kl", "nats", "k3 KL estimate to the reference model over the KL tokens", "all (algo.beta_kl > 0)")
RATIO_MEAN = Metric("ratio/mean", "ratio", "mean importance ratio pi_theta / pi_old over trained tokens")
LOSS_AUX_NLL = Metric("loss/aux_nll", "nats/token", "mean per-token NLL of the auxiliary (aux) rows", "SGT (aux mode)")
TOKENS_PEER_SHARE = Metric("tokens/peer_share", "fraction", "share of the trained tokens that come from peer rows")
CLIP_FRAC = Metric("clip/frac", "fraction", "trained tokens whose ratio was clipped (low or high)")
CLIP_FRAC_OWN = Metric("clip/frac_own", "fraction", "clipped share of the learner's own tokens")
CLIP_FRAC_PEER = Metric("clip/frac_peer", "fraction", "clipped share of the peer tokens")
CLIP_FRAC_LOW = Metric("clip/frac_low", "fraction", "trained tokens clipped at 1 - eps_low")
CLIP_FRAC_HIGH = Metric("clip/frac_high", "fraction", "trained tokens clipped at 1 + eps_high")

# ---- outcomes of the step's own rollouts ----------------------------------------------------------------------------
REWARD_MEAN = Metric("reward/mean", "reward", "mean reward of the step's rollouts")
REWARD_ACC = Metric("reward/acc", "fraction", "rollouts the verifier judged correct")
GROUPS_COUNT = Metric("groups/count", "count", "groups (prompts) the step collected")
GROUPS_ALL_FAIL = Metric("groups/all_fail", "fraction", "groups with no correct response")
GROUPS_ALL_SUCCESS = Metric("groups/all_success", "fraction", "groups with every response correct")
GROUPS_MIXED = Metric("groups/mixed", "fraction", "groups with both correct and incorrect responses")
RESPONSE_LEN_MEAN = Metric("response/len_mean", "tokens", "mean sampled response length (given prefixes left out)")
RESPONSE_TRUNC_RATE = Metric("response/trunc_rate", "fraction", "responses cut at rollout.max_new_tokens")
VERIFIER_TIMEOUTS = Metric("verifier/timeouts", "count", "responses whose math-verify call ran out of its own time "
                           "(task.verifier_timeout); they score as wrong")
VERIFIER_UNVERIFIED = Metric("verifier/unverified", "count", "responses the batch's verifier budget left undecided "
                             "(task.verifier_budget): scored as wrong without being judged, not in verifier/timeouts")
VERIFIER_UNVERIFIED_SHARE = Metric("verifier/unverified_share", "fraction", "verifier/unverified over the step's "
                                   "scored responses (over task.max_unverified_share: task.on_unverified)")
ROLLOUTS_GENERATED = Metric("rollouts/generated", "count", "responses sampled in the step")
ROLLOUTS_TOKENS = Metric("rollouts/tokens", "tokens", "tokens sampled in the step (given prefixes left out)")
ROLLOUT_LOGP_DIFF_MAX = Metric("rollout/logp_diff_max", "nats", "max |decoding log-prob - training-path log-prob| "
                               "over own response tokens (engine / trainer mismatch)")
ROLLOUT_PROMPTS_TOO_LONG = Metric("rollout/prompts_too_long", "count", "training prompts dropped at start-up (never "
                                  "cut) because their rendering is over a trained model's prompt limit (the whole "
                                  "set, the same in every step's record)")
ASYNC_STALENESS_MEAN = Metric("async/staleness_mean", "count", "mean of (theta_old's policy version - the version "
                              "that decoded it) over the step's own rollouts", "all (rollout.max_staleness > 0)")
ASYNC_STALENESS_MAX = Metric("async/staleness_max", "count", "the largest such gap of the step (at most "
                             "rollout.max_staleness)", "all (rollout.max_staleness > 0)")
ASYNC_IS_WEIGHT_MEAN = Metric("async/is_weight_mean", "ratio", "mean truncated importance weight min(pi_old / "
                              "pi_behaviour, rollout.tis_cap) over the trained tokens of stale rollouts",
                              "all (rollout.max_staleness > 0)")
ASYNC_IS_WEIGHT_MAX = Metric("async/is_weight_max", "ratio", "the largest such weight of the step",
                             "all (rollout.max_staleness > 0)")
ASYNC_IS_CAPPED = Metric("async/is_capped_frac", "fraction", "trained tokens of stale rollouts whose weight is at "
                         "the cap rollout.tis_cap", "all (rollout.max_staleness > 0)")
ASYNC_OVERLAP_S = Metric("async/overlap_s", "s", "seconds of this model's update during which its rollouts ahead "
                         "(rollout.max_staleness >= 1) were being generated; 0 where nothing overlaps (k = 0, or the "
                         "batches ahead generated before the update); a wall-clock figure")
BATCH_TOKENS = Metric("batch/tokens", "tokens", "prompt + response tokens of the step's training rows")

# ---- complementarity and peer exchange ------------------------------------------------------------------------------
PEER_SOLVED_ALL_FAIL_FRAC = Metric("peer/solved_all_fail_frac", "fraction",
                                   "the learner's all-fail prompts that the peer solved at least once", _PAIRS)
PEER_MIXED_ON_ALL_FAIL_FRAC = Metric("peer/mixed_on_all_fail_frac", "fraction",
                                     "the learner's all-fail prompts where the peer's group is mixed", _PAIRS)
PEER_ALL_FAIL_COUNT = Metric("peer/all_fail_count", "count", "the learner's all-fail prompts of the step", _PAIRS)
PEER_COMP = Family("peer/comp/{peer}", "fraction", "comp(L, P): the learner's all-fail prompts where peer P's group "
                   "is mixed (docs/algorithms.md#populations; logged with two or more peers)", _PAIRS)
PEER_ADMITTED_FROM = Family("peer/admitted/{peer}", "count", "peer responses admitted from peer P (logged with two "
                            "or more peers)", _PEER_LEARNERS)
PEER_RESCUED_FROM = Family("peer/rescued_groups/{peer}", "count", "own groups that received peer P's responses "
                           "(logged with two or more peers)", _PEER_LEARNERS)
PEER_RESCUED_GROUPS = Metric("peer/rescued_groups", "count", "own groups that received peer responses",
                             _PEER_LEARNERS)
PEER_ADMITTED = Metric("peer/admitted", "count", "peer responses admitted into the batch", _PEER_LEARNERS)
PEER_ADMITTED_SUCC = Metric("peer/admitted_succ", "count", "admitted peer responses that are correct",
                            "GRAFT, SGT")
PEER_ADMITTED_FAIL = Metric("peer/admitted_fail", "count", "admitted peer responses that are incorrect",
                            "GRAFT, SGT")
PEER_REJECTED = Metric("peer/rejected", "count", "peer responses offered but not admitted (gate, overflow)",
                       _PEER_LEARNERS)
PEER_ADMIT_RATE_SUCC = Metric("peer/admit_rate_succ", "fraction", "correct grafted responses the gate admitted",
                              "GRAFT")
PEER_ADMIT_RATE_FAIL = Metric("peer/admit_rate_fail", "fraction", "incorrect grafted responses the gate admitted",
                              "GRAFT")
PEER_S_MEAN = Metric("peer/s_mean", "ratio", "mean compatibility score s = exp(l_L - l_P) of the peer responses",
                     _PEER_LEARNERS)
PEER_S_MEDIAN = Metric("peer/s_median", "ratio", "median compatibility score s of the peer responses", _PEER_LEARNERS)
PEER_S_MIN = Metric("peer/s_min", "ratio", "smallest compatibility score s of the peer responses", _PEER_LEARNERS)
PEER_S_MAX = Metric("peer/s_max", "ratio", "largest compatibility score s of the peer responses", _PEER_LEARNERS)
PEER_S_Q10 = Metric("peer/s_q10", "ratio", "10th percentile of the compatibility scores s of the grafted responses",
                    "GRAFT")
PEER_S_Q90 = Metric("peer/s_q90", "ratio", "90th percentile of the compatibility scores s of the grafted responses",
                    "GRAFT")
PEER_S_ADMITTED_MEAN = Metric("peer/s_admitted_mean", "ratio", "mean compatibility score s of the admitted grafted "
                              "responses", "GRAFT")
PEER_S_ADMITTED_MIN = Metric("peer/s_admitted_min", "ratio", "smallest s of the admitted grafted responses", "GRAFT")
PEER_S_ADMITTED_MAX = Metric("peer/s_admitted_max", "ratio", "largest s of the admitted grafted responses", "GRAFT")
PEER_ADMIT_RATE = Metric("peer/admit_rate", "fraction", "grafted responses admitted (peer/admitted over the grafted "
                         "responses offered)", "GRAFT")
PEER_STORED_MISSING = Metric("peer/stored_missing", "count", "1 when the stored peer holds no group for any prompt of "
                             "the step (peer.missing=skip), else 0: summed, the steps trained without a stored peer",
                             "stored and mixed peers")

# ---- cross-tokenizer exchange --------------------------------------------------------------------------------------
_XT = "peer exchange (ctx.localize)"
XT_RESPONSES = Metric("xt/responses", "count", "peer responses re-tokenized for the learner", _XT)
XT_DROPPED = Metric("xt/dropped", "count", "re-tokenized peer responses dropped (overflow, empty, lossy with "
                    "xt.lossy=drop, verdict changed)", _XT)
XT_DROPPED_PROMPT_OVERFLOW = Metric("xt/dropped_prompt_overflow", "count",
                                    "peer responses dropped because the re-rendered prompt is too long", _XT)
XT_ID_MISMATCH_RATE = Metric("xt/id_mismatch_rate", "fraction", "same-tokenizer peer responses whose re-encoded ids "
                             "differ from the sampled ones", _XT)
XT_TOKEN_COUNT_RATIO = Metric("xt/token_count_ratio", "ratio", "learner tokens / peer tokens of the re-tokenized "
                              "responses", _XT)
XT_LOSSLESS_FRAC = Metric("xt/lossless_frac", "fraction", "re-tokenized peer responses whose learner ids decode to "
                          "the peer's text (its stop text cut)", _XT)
XT_VERDICT_KEPT_FRAC = Metric("xt/verdict_kept_frac", "fraction", "carried peer responses (all but the lossy ones "
                              "dropped) whose verdict on the learner's text is the peer's", _XT)
XT_VERDICT_CHANGED = Metric("xt/verdict_changed", "count", "carried peer responses whose re-verified text got another "
                            "verdict (dropped)", _XT)
XT_LOSSY_NORMALIZED = Metric("xt/lossy_normalized", "count", "peer responses the learner's normalizer changes (NFC)",
                             _XT)
XT_LOSSY_PARTIAL_CHAR = Metric("xt/lossy_partial_char", "count", "peer responses cut for length mid-character (text "
                               "ending in U+FFFD)", _XT)
XT_LOSSY_OTHER = Metric("xt/lossy_other", "count", "peer responses the learner's vocabulary cannot spell (another "
                        "decoded text)", _XT)
XT_LOSSY = {"normalized": XT_LOSSY_NORMALIZED, "partial_char": XT_LOSSY_PARTIAL_CHAR, "other": XT_LOSSY_OTHER}
"""lossy reason -> its count (docs/algorithms.md#exchange-rules-for-real-vocabularies)."""

# ---- time and throughput -------------------------------------------------------------------------------------------
TIME_GENERATE = Metric("time/generate", "s", "sampling (generate phase) during the step (with rollout.max_staleness: "
                       "the later steps' batches generated during it)")
TIME_SCORE = Metric("time/score", "s", "verifier scoring during the step (with rollout.max_staleness: as "
                    "time/generate)")
TIME_LOGPROB = Metric("time/logprob", "s", "theta_old log-prob passes (recompute, localisation)")
TIME_UPDATE = Metric("time/update", "s", "the optimizer updates")
TIME_EXCHANGE = Metric("time/exchange", "s", "peer source, exchange and batch building")
TIME_WEIGHT_SYNC = Metric("time/weight_sync", "s", "syncing the updated weights into the rollout engine")
TIME_OFFLOAD = Metric("time/offload", "s", "moving this model's training state between its GPU and host memory "
                      "(run.layout offload; 0 when resident)")
TIME_STEP = Metric("time/step", "s", "wall time from the step's start to the end of this model's update (set on "
                   "every trained record)")
PERF_TOKENS_PER_S = Metric("perf/tokens_per_s", "tokens/s", "rollouts/tokens / time/generate")
PERF_PEAK_MEM_GB = Metric("perf/peak_mem_gb", "GB", "peak accelerator memory of the model's largest rank",
                          "ray backend")

# ---- evaluation ----------------------------------------------------------------------------------------------------
EVAL_AVG = Metric("eval/avg", "fraction", "held-out score avg@k (eval.k samples per problem)", _EVAL)
EVAL_GREEDY = Metric("eval/greedy", "fraction", "held-out score of greedy decoding (eval.greedy)", _EVAL)
EVAL_AVG_GROUP = Family("eval/avg_{group}", "fraction", "held-out avg@k of one group of the task (e.g. a skill)",
                        _EVAL)
EVAL_GREEDY_GROUP = Family("eval/greedy_{group}", "fraction", "held-out greedy score of one group of the task", _EVAL)

# ---- transfer-path diagnostics (run.diagnostics) --------------------------------------------------------------------
DIAG_GRAD_NORM_OWN = Metric("diag/grad_norm_own", "value", "norm of the loss gradient at theta_old from own rows",
                            _DIAG)
DIAG_GRAD_NORM_PEER = Metric("diag/grad_norm_peer", "value", "norm of the loss gradient at theta_old from "
                             "peer-source rows", _DIAG)
DIAG_GRAD_SHARE_PEER = Metric("diag/grad_share_peer", "fraction", "||g_peer|| / (||g_own|| + ||g_peer||)", _DIAG)
DIAG_OWN_SUCC_LOGP_BEFORE = Metric("diag/own_succ_logp_before", "nats/token", "mean log-prob of the own correct "
                                   "rows with a positive advantage, under theta_old", _DIAG)
DIAG_OWN_SUCC_LOGP_AFTER = Metric("diag/own_succ_logp_after", "nats/token", "the same after the step's update", _DIAG)
DIAG_OWN_SUCC_LOGP_DELTA = Metric("diag/own_succ_logp_delta", "nats/token", "after - before of the own correct rows",
                                  _DIAG)
DIAG_PEER_SUCC_LOGP_BEFORE = Metric("diag/peer_succ_logp_before", "nats/token", "mean log-prob of the admitted "
                                    "correct peer-source rows, under theta_old", _DIAG)
DIAG_PEER_SUCC_LOGP_AFTER = Metric("diag/peer_succ_logp_after", "nats/token", "the same after the step's update",
                                   _DIAG)
DIAG_PEER_SUCC_LOGP_DELTA = Metric("diag/peer_succ_logp_delta", "nats/token", "after - before of the admitted "
                                   "correct peer-source rows", _DIAG)
SUCC_LOGP = {("own", "before"): DIAG_OWN_SUCC_LOGP_BEFORE, ("own", "after"): DIAG_OWN_SUCC_LOGP_AFTER,
             ("own", "delta"): DIAG_OWN_SUCC_LOGP_DELTA, ("peer", "before"): DIAG_PEER_SUCC_LOGP_BEFORE,
             ("peer", "after"): DIAG_PEER_SUCC_LOGP_AFTER, ("peer", "delta"): DIAG_PEER_SUCC_LOGP_DELTA}
"""(source, before | after | delta) -> the success log-prob diagnostic."""

# ---- per algorithm -------------------------------------------------------------------------------------------------





# ---- wandb only ----------------------------------------------------------------------------------------------------
WANDB_METRIC = Family("{model}/{metric}", "value", "every numeric metric of a record, per model", "all (wandb)")
COMPLETIONS = Family("{model}/completions", "table", "the responses a step trains on (tracking.log_completions_every)",
                     "all (wandb)")


WANDB_STEP = "train/step"
"""The x axis of every wandb chart (wandb's ``define_metric``): the record's ``step`` (not a ``Metric``: never in
metrics.jsonl)."""
WANDB_STEP_MEANING = ("the x axis of every wandb chart: the record's `step` (-1: the evaluation before training; "
                      "run.steps: the final evaluation); wandb's own step is `step` + 1")


def wandb_key(model: str, name: str) -> str:
    """The wandb key of ``name`` for ``model`` (``WANDB_METRIC``)."""
    return f"{model}/{name}"


# ---- the registry --------------------------------------------------------------------------------------------------
FAMILIES: tuple = tuple(v for v in list(globals().values()) if isinstance(v, Family))
"""The patterns of names built at run time."""
JSONL_FAMILIES: tuple = tuple(f for f in FAMILIES if "wandb" not in f.by)
"""The families whose names appear in metrics.jsonl."""

EVERY_RECORD: tuple = (
    # outcomes
    REWARD_MEAN, REWARD_ACC, GROUPS_ALL_FAIL, GROUPS_ALL_SUCCESS, GROUPS_MIXED, GROUPS_COUNT,
    # peer exchange (paper Fig. 1 right, Table 9)
    PEER_SOLVED_ALL_FAIL_FRAC, PEER_MIXED_ON_ALL_FAIL_FRAC, PEER_RESCUED_GROUPS, PEER_ADMITTED,
    PEER_ADMITTED_SUCC, PEER_ADMITTED_FAIL, PEER_REJECTED, PEER_S_MEAN, PEER_S_MEDIAN, PEER_S_MIN,
    PEER_S_MAX, TOKENS_PEER_SHARE,
    CLIP_FRAC, CLIP_FRAC_OWN, CLIP_FRAC_PEER, CLIP_FRAC_LOW, CLIP_FRAC_HIGH,
    # optimisation
    LOSS, GRAD_NORM, LR, ENTROPY, KL, RATIO_MEAN,
    ROLLOUT_LOGP_DIFF_MAX,
    VERIFIER_TIMEOUTS, VERIFIER_UNVERIFIED, VERIFIER_UNVERIFIED_SHARE,
    # responses and throughput
    RESPONSE_LEN_MEAN, RESPONSE_TRUNC_RATE, PERF_TOKENS_PER_S, ROLLOUTS_GENERATED,
    TIME_GENERATE, TIME_SCORE, TIME_LOGPROB, TIME_EXCHANGE, TIME_UPDATE, TIME_STEP, ASYNC_OVERLAP_S,
)
"""The fixed vocabulary: present in every metrics.jsonl record, None where it does not apply."""


def _with_algorithms() -> None:
    """Declare the builtin algorithms' own metrics: their packages are imported once (no torch)."""
    load_sections()


def get(name: str) -> Metric:
    """The declared metric ``name`` (KeyError naming the page of declared names otherwise)."""
    _with_algorithms()
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not declared in graftzoo/contract/metrics.py or its algorithm's package "
                       f"(docs/metrics.md)") from None


def family_of(name: str) -> Optional[Family]:
    """The metrics.jsonl family whose pattern ``name`` matches, else None."""
    return next((f for f in JSONL_FAMILIES if f.matches(name)), None)


def declared(name: str) -> bool:
    """Whether ``name`` is a declared metrics.jsonl key: a ``Metric`` or a name of a ``JSONL_FAMILIES`` pattern."""
    _with_algorithms()
    return name in METRICS or family_of(name) is not None


# ---- docs/metrics.md -----------------------------------------------------------------------------------------------
TOPICS = {"": "Record and optimisation", "loss": "Record and optimisation", "ratio": "Record and optimisation",
          "tokens": "Record and optimisation", "clip": "Record and optimisation",
          "reward": "Outcomes", "groups": "Outcomes", "response": "Outcomes", "verifier": "Outcomes",
          "rollouts": "Outcomes", "rollout": "Outcomes", "batch": "Outcomes",
          "peer": "Complementarity and peer exchange", "xt": "Cross-tokenizer exchange",
          "time": "Time and throughput", "perf": "Time and throughput", "eval": "Evaluation",
          "diag": "Transfer-path diagnostics"}
ALGORITHM_TOPIC = "Per algorithm"  # a prefix not above: an algorithm's own metrics (declared in its package)


def _topic(name: str) -> str:
    return TOPICS.get(name.split("/")[0] if "/" in name else "", ALGORITHM_TOPIC)


def _row(name: str, unit: str, meaning: str, by: str, mark: str = "") -> str:
    return f"| `{name}`{mark} | {unit} | {meaning.replace('|', '&#124;')} | {by} |"


def markdown() -> str:
    """docs/metrics.md: one table per topic (name, unit, meaning, logged by), then the families and the units."""
    lines = ["# Metrics", "",
             "Generated by `python -m graftzoo.contract.metrics > docs/metrics.md` from the declarations in",
             "`graftzoo/contract/metrics.py` and in each algorithm's package (`graftzoo/algos/<name>/__init__.py`);",
             "a test checks that this page is current and that every key a run",
             "writes to `metrics.jsonl` is declared. One record per (step, model); the keys of the fixed vocabulary",
             "(marked \\*) are in every record, null where they do not apply. wandb logs each numeric key as",
             f"`<model>/<key>` against `{WANDB_STEP}`, the record's step: the evaluation before training",
             "(`run.eval_at_start`, step -1) is the first point of the evaluation charts.", ""]
    _with_algorithms()
    always = set(EVERY_RECORD)
    topics: dict = {}
    for m in METRICS.values():
        topics.setdefault(_topic(m), []).append(m)
    for f in JSONL_FAMILIES:
        topics.setdefault(_topic(f.pattern), []).append(f)
    # the algorithms' metrics by algorithm (their packages may have been imported in any order), each as declared
    topics.get(ALGORITHM_TOPIC, []).sort(key=lambda m: str(m).split("/")[0])
    for topic in dict.fromkeys([*TOPICS.values(), ALGORITHM_TOPIC]):
        if topic not in topics:
            continue
        lines += [f"## {topic}", "", "| name | unit | meaning | logged by |", "| --- | --- | --- | --- |"]
        for m in topics[topic]:
            if isinstance(m, Family):
                lines.append(_row(m.shown, m.unit, m.meaning + " (one per value)", m.by))
            else:
                lines.append(_row(m, m.unit, m.meaning, m.by, " \\*" if m in always else ""))
        lines.append("")
    lines += ["## wandb", "", "| name | unit | meaning | logged by |", "| --- | --- | --- | --- |"]
    lines += [_row(WANDB_STEP, "index", WANDB_STEP_MEANING, "all (wandb)")]
    lines += [_row(f.shown, f.unit, f.meaning, f.by) for f in FAMILIES if f not in JSONL_FAMILIES]
    lines += ["", "## Units", "", "| unit | meaning |", "| --- | --- |"]
    lines += [f"| {u} | {d} |" for u, d in UNITS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the package's module, which the algorithms' packages declare their metrics into
    from graftzoo.contract import metrics
    print(metrics.markdown(), end="")
