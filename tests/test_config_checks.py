"""Config declared once, checked once: choices (Literal), bounds and cross-field rules on the Config
dataclasses, one validation pass at load, one error type, and the CLI refusing a bad value in one line
(exit 2) before any model is built."""
import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional, get_args, get_type_hints

import pytest

from graftzoo.algos.base import LearnerConfig, LossAgg
from graftzoo.algos.dapo import DAPOConfig
from graftzoo.algos.functional.core import AGG_MODES
from graftzoo.algos.functional.peer import SGT_GATES
from graftzoo.algos.graft import GRAFTConfig
from graftzoo.algos.hacpo import HACPOConfig
from graftzoo.algos.hora import HORAConfig
from graftzoo.algos.om_grpo import CONTRAST_TEMPLATES, OMGRPOConfig
from graftzoo.algos.sgt import SGTConfig
from graftzoo.core import config as config_mod
from graftzoo.core.config import ConfigError, algo_config, load_config
from graftzoo.core.registry import list_algos
from graftzoo.core.schema import bounded, build, check_value, describe_range, validate

# ------------------------------------------------------------------------------------------------
# the CLI: every invalid value of the issue, one line naming the key, exit 2, no run directory
# ------------------------------------------------------------------------------------------------

BAD = [
    (["--algo", "hora", "--set", "algo.n0=1"], "algo.n0", "[2, rollout.n=4]"),
    (["--algo", "grpo", "--set", "algo.loss_agg=bogus"], "algo.loss_agg", "token-mean | seq-mean-token-sum"),
    (["--algo", "grpo", "--set", "algo.estimator=ppo"], "algo.estimator", "grpo | rloo"),
    (["--algo", "gspo", "--set", "algo.ratio_form=seq"], "algo.ratio_form", "token | sequence"),
    (["--algo", "dapo", "--set", "algo.on_shortfall=eror"], "algo.on_shortfall", "keep | error"),
    (["--algo", "graft"], "peer.source", "--peer online|stored:PATH|mixed:PATH"),
]


@pytest.mark.parametrize("args,key,allowed", BAD, ids=[b[1] for b in BAD])
def test_cli_rejects_bad_value_in_one_line_before_building_models(tmp_path, args, key, allowed):
    out_dir = tmp_path / "runs"
    res = subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", "train", "--pair", "micro", "--no-track",
                          *args, "--set", f"run.out_dir={out_dir}"], capture_output=True, text=True, timeout=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr[-3000:]
    assert key in lines[0] and allowed in lines[0]
    assert "Traceback" not in res.stderr and not res.stdout.strip()
    assert not out_dir.exists()  # the trainer creates the run directory before it builds any model


# ------------------------------------------------------------------------------------------------
# the generic validator
# ------------------------------------------------------------------------------------------------

def test_literal_choices():
    check_value("algo.x", "a", Literal["a", "b"])
    with pytest.raises(ConfigError, match=r"config key 'algo.x' must be one of a \| b, got 'c'"):
        check_value("algo.x", "c", Literal["a", "b"])
    check_value("eval.select", None, Optional[Literal["last", "val_avg"]])
    with pytest.raises(ConfigError, match="one of last | val_avg or null"):
        check_value("eval.select", "best", Optional[Literal["last", "val_avg"]])


def test_types():
    check_value("k", 3, float)                     # an int is a number
    check_value("k", 2.0, int)                     # YAML's 2e0: an integral float is an integer
    check_value("k", [0.1, 10], list[float])
    for value, tp, what in ((2.5, int, "an integer"), ("abc", int, "an integer"), (True, int, "an integer"),
                            (1, bool, "true or false"), ("0.1", float, "a number"), (3, str, "a string"),
                            (["x"], list[float], "a list"), (0.5, list, "a list")):
        with pytest.raises(ConfigError, match=f"config key 'k' must be {what}"):
            check_value("k", value, tp)


@pytest.mark.parametrize("rng,ok,bad,text", [
    ("[0, 1]", [0, 1, 0.5], [-0.1, 1.1], "in [0, 1]"),
    ("(0, 1]", [1e-9, 1], [0, 2], "in (0, 1]"),
    ("[0, 1)", [0, 0.99], [1, -1], "in [0, 1)"),
    ("[1, inf)", [1, 10**9], [0, -3], ">= 1"),
    ("(1, inf)", [1.01], [1, 0], "> 1"),
    ((0, 1), [0, 1], [2], "in [0, 1]"),
])
def test_ranges(rng, ok, bad, text):
    assert describe_range(rng) == text
    for v in ok:
        check_value("algo.r", v, float, rng)
    for v in bad:
        with pytest.raises(ConfigError, match=re.escape(f"config key 'algo.r' must be {text}, got {v!r}")):
            check_value("algo.r", v, float, rng)
    check_value("algo.r", None, Optional[float], rng)  # null skips the bounds


def test_bad_interval_declaration_fails_at_import():
    with pytest.raises(ValueError, match="bad interval"):
        bounded(1, "1..2")


@dataclass
class ToyConfig(LearnerConfig):
    needs_peer: ClassVar[bool] = True
    mode: Literal["a", "b"] = "a"
    k: int = bounded(1, "[1, inf)")
    pair: list = field(default_factory=lambda: [1, 2])

    def check(self, run_cfg):
        super().check(run_cfg)
        if self.mode == "b" and self.k > run_cfg["rollout"]["n"]:
            raise ConfigError(f"config key 'algo.k' must be <= rollout.n with mode=b, got {self.k}")


def run(source="online", n=4, name="toy"):
    return {"rollout": {"n": n}, "peer": {"source": source}, "algo": {"name": name}}


def test_validate_fields_then_peer_then_cross_field_rules():
    validate(build(ToyConfig, {"mode": "b", "k": 4}), run())
    with pytest.raises(ConfigError, match="config key 'algo.mode'"):
        validate(build(ToyConfig, {"mode": "c"}), run())
    with pytest.raises(ConfigError, match="config key 'algo.k' must be >= 1, got 0"):
        validate(build(ToyConfig, {"k": 0}), run())
    with pytest.raises(ConfigError, match="algorithm 'toy' .* needs a peer source"):
        validate(build(ToyConfig, {}), run(source="none"))
    with pytest.raises(ConfigError, match="'algo.k' must be <= rollout.n"):
        validate(build(ToyConfig, {"mode": "b", "k": 5}), run())
    with pytest.raises(ConfigError, match="config key 'algo.adv_eps'"):  # the base class's declarations too
        validate(build(ToyConfig, {"adv_eps": -1.0}), run())


def test_build_checks_nothing_and_fills_defaults():
    obj = build(ToyConfig, {"mode": "c", "k": 0})     # no check: the values were checked before
    assert (obj.mode, obj.k, obj.pair, obj.adv_eps) == ("c", 0, [1, 2], 1e-6)
    assert build(ToyConfig, {}).pair is not build(ToyConfig, {}).pair
    with pytest.raises(ConfigError, match="unknown config key 'algo.kk'"):
        build(ToyConfig, {"kk": 1})


def test_direct_construction_checks_the_declared_fields():
    with pytest.raises(ConfigError, match="algo.select"):
        GRAFTConfig(select="bogus")
    with pytest.raises(ConfigError, match="algo.on_shortfall"):
        DAPOConfig(on_shortfall="eror")
    with pytest.raises(ConfigError, match="algo.tau"):
        SGTConfig(tau=1.0)
    ToyConfig(mode="b", k=99)  # a run-dependent rule needs the run config: checked by load_config


def test_a_redeclared_default_keeps_the_base_bounds():
    assert HACPOConfig().beta_kl == 0.001
    with pytest.raises(ConfigError, match="config key 'algo.beta_kl' must be >= 0"):
        HACPOConfig(beta_kl=-0.1)


def test_declared_choices_match_the_code_that_uses_them():
    assert get_args(LossAgg) == AGG_MODES
    assert set(get_args(get_type_hints(OMGRPOConfig)["contrast_template"])) == set(CONTRAST_TEMPLATES)
    assert get_args(get_type_hints(SGTConfig)["gate"]) == SGT_GATES


# ------------------------------------------------------------------------------------------------
# load_config: one pass, resolved values unchanged, the object built once without a second check
# ------------------------------------------------------------------------------------------------

def micro(algo, *overrides):
    return load_config(pair="micro", algo=algo, overrides=["run.track=false", *overrides])


def test_every_algorithm_resolves_to_its_config_defaults():
    for entry in list_algos()[0]:
        cfg = micro(entry.name, "peer.source=online")
        want = dataclasses.asdict(entry.cls.Config())
        assert cfg["algo"] == {"name": entry.name, **want}, entry.name
        assert algo_config(cfg) == entry.cls.Config()


@pytest.mark.parametrize("override,key", [
    ("peer.source=bogus", "peer.source"), ("peer.align=oldest", "peer.align"), ("xt.overflow=wrap", "xt.overflow"),
    ("rollout.engine=vllm", "rollout.engine"), ("eval.select=best", "eval.select"), ("rollout.n=0", "rollout.n"),
    ("algo.adv_eps=fast", "algo.adv_eps"), ("algo.std_normalize=1", "algo.std_normalize"),
])
def test_core_keys_and_types_are_checked_at_load(override, key):
    with pytest.raises(ConfigError, match=f"config key '{key}' must be"):
        micro("grpo", override)


@pytest.mark.parametrize("algo,overrides,match", [
    ("hora", ["algo.n0=5"], r"'algo.n0' must be in \[2, rollout.n=4\]"),
    ("hora", ["rollout.n=1"], r"'algo.n0' must be in \[2, rollout.n=1\]"),
    ("extra", ["algo.memory_size=2"], "algo.memory_size"),
    ("om_grpo", ["rollout.n=1"], "rollout.n"),
    ("graft", ["peer.source=online", "algo.peer_position=uniform", "algo.peer_minibatches=separate"],
     "peer_minibatches=replace_slots"),
    ("graft", ["peer.source=stored", "algo.token_ratio=cross_aligned"], "token_ratio"),
    ("hacpo", ["peer.source=online", "algo.seq_clip=[0.1, 0.2]"], "self_clip"),
    ("hacpo", ["peer.source=online", "algo.ratio_clamp=[2, 3]"], "algo.ratio_clamp"),
    ("sgt", [], "needs a peer source"),
])
def test_cross_field_and_run_dependent_rules_at_load(algo, overrides, match):
    with pytest.raises(ConfigError, match=match):
        micro(algo, *overrides)


def test_derived_values_are_resolved_once_and_kept():
    cfg = micro("hacpo", "peer.source=online", "algo.self_clip=[0.1, 0.2]", "algo.ratio_clamp=[0.5, 2]")
    assert cfg["algo"]["seq_clip"] == [0.1, 0.2]
    assert cfg["algo"]["ratio_clamp"] == [0.5, 2.0] and isinstance(cfg["algo"]["ratio_clamp"][1], float)
    obj = algo_config(cfg)
    assert (obj.seq_clip, obj.self_clip) == ([0.1, 0.2], [0.1, 0.2])


def test_the_config_is_checked_once_and_built_without_a_second_check(monkeypatch):
    calls = []
    real = HORAConfig.check
    monkeypatch.setattr(HORAConfig, "check", lambda self, run_cfg: (calls.append(1), real(self, run_cfg)))
    cfg = micro("hora", "algo.n0=3")
    assert len(calls) == 1
    monkeypatch.setattr(config_mod, "validate_algo", lambda *a, **k: pytest.fail("checked again"))
    monkeypatch.setattr("graftzoo.core.schema.check_fields", lambda *a, **k: pytest.fail("checked again"))
    obj = algo_config(cfg)
    assert isinstance(obj, HORAConfig) and obj.n0 == 3 and len(calls) == 1
