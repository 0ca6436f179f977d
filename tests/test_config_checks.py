"""Config declared once, checked once: choices (Literal), bounds and cross-field rules on the pydantic config
sections, one validation pass at load, one error type, and the CLI refusing a bad value in one line
(exit 2) before any model is built."""
import re
import subprocess
import sys
from typing import Annotated, ClassVar, Literal, Optional, get_args

import pytest
from click.testing import CliRunner
from pydantic import Field, field_validator
from pydantic_core import SchemaError

from graftzoo.algos.config import LearnerConfig, LossAgg
from graftzoo.algos.dapo import DAPOConfig
from graftzoo.algos.graft import GRAFTConfig
from graftzoo.algos.hacpo import HACPOConfig
from graftzoo.algos.hora import HORAConfig
from graftzoo.algos.om_grpo import OMGRPOConfig
from graftzoo.algos.sgt import SGTConfig
from graftzoo.algos.functional.core import AGG_MODES
from graftzoo.algos.functional.peer import SGT_GATES
from graftzoo.algos.om_grpo.learner import CONTRAST_TEMPLATES
from graftzoo.apps.cli import main
from graftzoo.contract import config as config_mod
from graftzoo.contract import registry
from graftzoo.contract import schema as schema_mod
from graftzoo.contract.config import ConfigError, LearnerFacts, as_dict, load_config, read_yaml, with_values
from graftzoo.contract.registry import get_algo, list_algos
from graftzoo.contract.schema import Int, Section, describe, describe_bounds, key, validate_section

CONFIGS = config_mod.packaged_configs()  # graftzoo/configs, as installed

# ------------------------------------------------------------------------------------------------
# the CLI: every invalid value, one line naming the key, exit 2, no run directory
# ------------------------------------------------------------------------------------------------

BAD = [
    (["--algo", "hora", "--set", "algo.n0=1"], "algo.n0", "[2, rollout.n=4]"),
    (["--algo", "grpo", "--set", "algo.loss_agg=bogus"], "algo.loss_agg", "token-mean | seq-mean-token-sum"),
    (["--algo", "grpo", "--set", "algo.estimator=ppo"], "algo.estimator", "grpo | rloo"),
    (["--algo", "gspo", "--set", "algo.ratio_form=seq"], "algo.ratio_form", "token | sequence"),
    (["--algo", "dapo", "--set", "algo.on_shortfall=eror"], "algo.on_shortfall", "keep | error"),
    (["--algo", "graft"], "peer.source", "--peer online|stored:PATH|mixed:PATH"),
    (["--algo", "grpo", "--set", "rollout.temperature=0"], "rollout.temperature", "greedy decoding is eval.greedy"),
    (["--algo", "grpo", "--set", "run.steps=[1,2"], "run.steps", "not valid YAML"),
    (["--algo", "grpo", "--peer", "stored:"], "'--peer'", "stored needs a path: stored:PATH"),
]


@pytest.mark.parametrize("args,key,allowed", BAD, ids=[b[1] for b in BAD])
def test_cli_rejects_bad_value_in_one_line_before_building_models(tmp_path, args, key, allowed):
    """Through the CLI in this process (an interpreter per case would spend ~7 s importing); the next test checks
    one case in a process of its own: exit code and stderr as a shell sees them."""
    out_dir = tmp_path / "runs"
    res = CliRunner().invoke(main, ["train", "--pair", "micro", "--no-track", *args, "--set",
                                    f"run.out_dir={out_dir}"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2, res.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr[-3000:]
    assert key in lines[0] and allowed in lines[0]
    assert "Traceback" not in res.stderr and not res.stdout.strip()
    assert not out_dir.exists()  # the trainer creates the run directory before it builds any model


def test_a_bad_value_is_one_stderr_line_and_exit_2_of_the_real_command(tmp_path):
    args, key, allowed = BAD[0]
    out_dir = tmp_path / "runs"
    res = subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", "train", "--pair", "micro", "--no-track",
                          *args, "--set", f"run.out_dir={out_dir}"], capture_output=True, text=True, timeout=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and key in lines[0] and allowed in lines[0]
    assert "Traceback" not in res.stderr and not res.stdout.strip() and not out_dir.exists()


# ------------------------------------------------------------------------------------------------
# the declaration conventions (graftzoo.contract.schema): one-key sections declared here, and the real ones
# ------------------------------------------------------------------------------------------------

def one_key(tp, name="k", **bounds):
    """A section with the single key ``name`` of type ``tp`` and the given bounds."""
    return type("OneKey", (Section,), {"__annotations__": {name: tp}, name: key(None, "a key", **bounds)})


def check_value(key_name, value, tp, **bounds):
    """``value`` validated as the key ``key_name`` (``algo.x``: section prefix ``algo.``, key ``x``) of type ``tp``."""
    prefix, _, name = key_name.rpartition(".")
    return getattr(validate_section(one_key(tp, name, **bounds), {name: value}, prefix + "." if prefix else ""), name)


def test_literal_choices():
    check_value("algo.x", "a", Literal["a", "b"])
    with pytest.raises(ConfigError, match=r"config key 'algo.x' must be one of a \| b, got 'c'"):
        check_value("algo.x", "c", Literal["a", "b"])
    check_value("eval.select", None, Optional[Literal["last", "val_avg"]])
    with pytest.raises(ConfigError, match="one of last | val_avg or null"):
        check_value("eval.select", "best", Optional[Literal["last", "val_avg"]])
    with pytest.raises(ConfigError, match=r"config key 'eval.select' must be one of last \| val_avg or null"):
        validate_section(config_mod.EvalSection, {"select": "best"}, "eval.")  # the real declaration


def test_types():
    assert check_value("k", 3, float) == 3                     # an int is a number
    two = check_value("k", 2.0, Int)                           # YAML's 2e0: an integral float is an integer
    assert two == 2 and type(two) is int
    assert check_value("k", [0.1, 10], list[float]) == [0.1, 10]
    for value, tp, what in ((2.5, Int, "an integer"), ("abc", Int, "an integer"), (True, Int, "an integer"),
                            (1, bool, "true or false"), ("0.1", float, "a number"), (3, str, "a string"),
                            (["x"], list[float], "a list"), (0.5, list, "a list")):
        with pytest.raises(ConfigError, match=f"config key 'k' must be {what}"):
            check_value("k", value, tp)
    for value in (float("inf"), float("-inf"), float("nan")):   # never infinite or NaN
        with pytest.raises(ConfigError, match="config key 'k' must be a finite number"):
            check_value("k", value, float)


@pytest.mark.parametrize("tp,bounds,ok,bad,text", [
    (float, {"ge": 0, "le": 1}, [0, 1, 0.5], [-0.1, 1.1], "in [0, 1]"),
    (float, {"gt": 0, "le": 1}, [1e-9, 1], [0, 2], "in (0, 1]"),
    (float, {"ge": 0, "lt": 1}, [0, 0.99], [1, -1], "in [0, 1)"),
    (float, {"ge": 1}, [1, 10**9], [0, -3], ">= 1"),
    (float, {"gt": 1}, [1.01], [1, 0], "> 1"),
    (Annotated[float, Field(ge=0, le=1)], {}, [0, 1], [2], "in [0, 1]"),   # bounds on the type, not the key
])
def test_ranges(tp, bounds, ok, bad, text):
    model = one_key(tp, "r", **bounds)
    assert describe_bounds(model.model_fields["r"].metadata) == text
    for v in ok:
        check_value("algo.r", v, tp, **bounds)
    for v in bad:
        with pytest.raises(ConfigError, match=re.escape(f"config key 'algo.r' must be {text}, got {v!r}")):
            check_value("algo.r", v, tp, **bounds)
    assert check_value("algo.r", None, Optional[tp], **bounds) is None  # null skips the bounds


def test_fixed_length_lists_and_bounds_of_their_items():
    optim = config_mod.OptimSection   # optim.betas: a list of 2 numbers in [0, 1)
    assert describe(optim.model_fields["betas"].annotation) == "a list of 2 numbers"
    assert validate_section(optim, {"betas": [0.9, 0.999]}, "optim.").betas == (0.9, 0.999)
    assert validate_section(optim, {"betas": (0, 0.5)}, "optim.").betas == (0, 0.5)
    for value in ("hello", [0.9], [0.9, 0.99, 0.999], [0.9, "x"], 0.9):
        with pytest.raises(ConfigError, match=r"config key 'optim.betas' must be a list of 2 numbers, got"):
            validate_section(optim, {"betas": value}, "optim.")
    with pytest.raises(ConfigError, match=re.escape("'optim.betas' must hold values in [0, 1), got [0.9, 1.0]")):
        validate_section(optim, {"betas": [0.9, 1.0]}, "optim.")
    counts = list[Annotated[Int, Field(ge=1)]]
    assert check_value("k", [1, 2, 3], counts) == [1, 2, 3]
    with pytest.raises(ConfigError, match="must hold values >= 1"):
        check_value("k", [1, 0], counts)


def test_bad_interval_declaration_fails_at_import():
    with pytest.raises(SchemaError, match="'ge' must be coercible to an integer"):
        class Bad(Section):   # a bound that is no number fails when the class is declared, not when it is used
            k: Int = key(1, "a key", ge="1..2")


class ToyConfig(LearnerConfig):
    needs_peer: ClassVar[bool] = True
    mode: Literal["a", "b"] = key("a", "a choice")
    k: Int = key(1, "a count", ge=1)
    pair: list = key(lambda: [1, 2], "a list (a fresh one per object)")

    def check(self, run: LearnerFacts):
        super().check(run)
        if self.mode == "b" and self.k > run.n:
            raise ConfigError(f"config key 'algo.k' must be <= rollout.n with mode=b, got {self.k}")


@pytest.fixture
def toy(monkeypatch):
    """``ToyConfig`` registered as the ``algo.*`` section of algorithm ``toy`` (for this test only)."""
    monkeypatch.setitem(registry._CONFIGS, "toy", ToyConfig)


def run(*overrides, source="online", n=4):
    """The micro pair trained by the toy algorithm, through load_config's one validation pass."""
    return load_config(pair="micro", algo="toy", overrides=["run.track=false", f"peer.source={source}",
                                                            f"rollout.n={n}", *overrides])


def test_validate_fields_then_peer_then_cross_field_rules(toy):
    assert (run("algo.mode=b", "algo.k=4").algo.mode, run("algo.mode=b", "algo.k=4").algo.k) == ("b", 4)
    with pytest.raises(ConfigError, match="config key 'algo.mode'"):
        run("algo.mode=c")
    with pytest.raises(ConfigError, match="config key 'algo.mode'"):   # the fields before the peer
        run("algo.mode=c", source="none")
    with pytest.raises(ConfigError, match="config key 'algo.k' must be >= 1, got 0"):
        run("algo.k=0")
    with pytest.raises(ConfigError, match="algorithm 'toy' .* needs a peer source"):
        run(source="none")
    with pytest.raises(ConfigError, match="algorithm 'toy' .* needs a peer source"):   # the peer before the rules
        run("algo.mode=b", "algo.k=5", source="none")
    with pytest.raises(ConfigError, match="'algo.k' must be <= rollout.n"):
        run("algo.mode=b", "algo.k=5")
    with pytest.raises(ConfigError, match="config key 'algo.adv_eps'"):  # the base class's declarations too
        run("algo.adv_eps=-1.0")


def test_build_checks_nothing_and_fills_defaults(toy):
    cfg = run()
    obj = with_values(cfg, {"algo.mode": "c", "algo.k": 0}).algo   # a derived copy: no check, the values were
    assert (obj.mode, obj.k, obj.pair, obj.adv_eps) == ("c", 0, [1, 2], 1e-6)   # checked before
    assert ToyConfig().pair is not ToyConfig().pair
    with pytest.raises(ConfigError, match="unknown config key 'algo.kk'"):
        ToyConfig(kk=1)
    with pytest.raises(ConfigError, match="unknown config key 'algo.kk'"):
        run("algo.kk=1")


def test_direct_construction_checks_the_declared_fields():
    with pytest.raises(ConfigError, match="algo.select"):
        GRAFTConfig(select="bogus")
    with pytest.raises(ConfigError, match="algo.on_shortfall"):
        DAPOConfig(on_shortfall="eror")
    with pytest.raises(ConfigError, match="algo.tau"):
        SGTConfig(tau=1.0)
    ToyConfig(mode="b", k=99)  # a run-dependent rule needs the run's facts: checked by load_config


def test_a_redeclared_default_keeps_the_base_bounds():
    assert HACPOConfig().beta_kl == 0.001
    with pytest.raises(ConfigError, match="config key 'algo.beta_kl' must be >= 0"):
        HACPOConfig(beta_kl=-0.1)


def test_declared_choices_match_the_code_that_uses_them():
    assert get_args(LossAgg) == AGG_MODES
    assert set(get_args(OMGRPOConfig.model_fields["contrast_template"].annotation)) == set(CONTRAST_TEMPLATES)
    assert get_args(SGTConfig.model_fields["gate"].annotation) == SGT_GATES


# ------------------------------------------------------------------------------------------------
# load_config: one pass, resolved values unchanged, the object built once without a second check
# ------------------------------------------------------------------------------------------------

def micro(algo, *overrides):
    return load_config(pair="micro", algo=algo, overrides=["run.track=false", *overrides])


def test_every_algorithm_resolves_to_its_config_defaults():
    for entry in list_algos()[0]:
        cfg = micro(entry.name, "peer.source=online")
        want = entry.cls.Config().model_dump()
        assert cfg.algo.model_dump() == {**want, "name": entry.name}, entry.name
        assert as_dict(cfg)["algo"] == {**entry.cls.Config().model_dump(mode="json"), "name": entry.name}
        assert type(cfg.algo) is entry.cls.Config and cfg.algo == entry.cls.Config(name=entry.name)


@pytest.mark.parametrize("override,key", [
    ("peer.source=bogus", "peer.source"), ("peer.align=oldest", "peer.align"), ("xt.overflow=wrap", "xt.overflow"),
    ("rollout.engine=sglang", "rollout.engine"), ("eval.select=best", "eval.select"), ("rollout.n=0", "rollout.n"),
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
    ("graft", ["peer.source=stored", "peer.path=runs/p", "algo.token_ratio=cross_aligned"], "token_ratio"),
    ("hacpo", ["peer.source=online", "algo.seq_clip=[0.1, 0.2]"], "self_clip"),
    ("hacpo", ["peer.source=online", "algo.ratio_clamp=[2, 3]"], "algo.ratio_clamp"),
    ("sgt", [], "needs a peer source"),
])
def test_cross_field_and_run_dependent_rules_at_load(algo, overrides, match):
    with pytest.raises(ConfigError, match=match):
        micro(algo, *overrides)


def test_derived_values_are_resolved_once_and_kept():
    cfg = micro("hacpo", "peer.source=online", "algo.self_clip=[0.1, 0.2]", "algo.ratio_clamp=[0.5, 2]")
    assert cfg.algo.seq_clip == [0.1, 0.2]
    assert cfg.algo.ratio_clamp == [0.5, 2.0] and isinstance(cfg.algo.ratio_clamp[1], float)
    assert as_dict(cfg)["algo"]["seq_clip"] == [0.1, 0.2] and as_dict(cfg)["algo"]["ratio_clamp"] == [0.5, 2.0]
    obj = cfg.algo
    assert (obj.seq_clip, obj.self_clip) == ([0.1, 0.2], [0.1, 0.2])


def test_the_config_is_checked_once_and_built_without_a_second_check(monkeypatch):
    calls, loaded = [], []
    real = HORAConfig.check

    def counted(self, run):
        if loaded:
            pytest.fail("checked again")
        calls.append(1)
        return real(self, run)

    monkeypatch.setattr(HORAConfig, "check", counted)
    cfg = micro("hora", "algo.n0=3")
    assert len(calls) == 1
    loaded.append(True)
    # from here on, nothing may validate the algo section again: not its check, not pydantic, not the schema
    again = lambda *a, **k: pytest.fail("checked again")   # noqa: E731
    monkeypatch.setattr(HORAConfig, "model_validate", classmethod(again))
    monkeypatch.setattr(HORAConfig, "__init__", again)
    real_validate = schema_mod.validate_section

    def validate_section_(model, *a, **k):
        if isinstance(model, type) and issubclass(model, LearnerConfig):
            pytest.fail("checked again")
        return real_validate(model, *a, **k)

    monkeypatch.setattr(schema_mod, "validate_section", validate_section_)
    monkeypatch.setattr(config_mod, "validate_section", validate_section_)
    learner = get_algo("hora")(cfg.algo, LearnerFacts.of(cfg))   # what the trainer builds from the config
    derived = with_values(cfg, {"run.name": "x"})
    obj = learner.cfg
    assert isinstance(obj, HORAConfig) and obj.n0 == 3 and obj is cfg.algo and learner.n0 == 3
    assert derived.algo is cfg.algo and as_dict(cfg)["algo"]["n0"] == 3 and len(calls) == 1


# ------------------------------------------------------------------------------------------------
# every core key: declared type and bounds, cross-field rules, overrides that are not YAML
# ------------------------------------------------------------------------------------------------

CORE_BAD = [
    # values that cannot train
    ("rollout.n=0", "rollout.n"), ("task.prompts_per_step=0", "task.prompts_per_step"), ("run.steps=-5", "run.steps"),
    ("optim.minibatches=0", "optim.minibatches"), ("optim.minibatches=100", "optim.minibatches"),
    ("optim.minibatches=5", "optim.minibatches"),           # micro: 4 prompts (groups) per step
    ("rollout.top_p=2", "rollout.top_p"), ("rollout.top_p=0", "rollout.top_p"),
    ("rollout.temperature=0", "rollout.temperature"), ("rollout.temperature=-1", "rollout.temperature"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens"), ("rollout.max_new_tokens=1.5", "rollout.max_new_tokens"),
    ("rollout.max_new_tokens=.inf", "rollout.max_new_tokens"),
    # values that once raised a traceback
    ("run.steps=abc", "run.steps"), ("run.seed=abc", "run.seed"), ("run.seed=1.5", "run.seed"),
    ("optim.lr=-1", "optim.lr"), ("optim.lr=abc", "optim.lr"), ("optim.lr=.inf", "optim.lr"),
    ("optim.lr=.nan", "optim.lr"),
    ("run.threads=0", "run.threads"), ("optim.betas=hello", "optim.betas"), ("optim.betas=[0.9]", "optim.betas"),
    ("optim.betas=[0.9, 1.0]", "optim.betas"), ("optim.betas=[-0.1, 0.9]", "optim.betas"),
    ("task.verifier_timeout=0", "task.verifier_timeout"), ("run.steps=[1,2", "run.steps"), ("eval.k=0", "eval.k"),
    ("run.steps=", "run.steps"), ("peer.source=stored", "peer.path"), ("peer.source=mixed", "peer.path"),
    # the other core keys
    ("run.epochs=0", "run.epochs"), ("run.save_every=-1", "run.save_every"),
    ("run.keep_checkpoints=-1", "run.keep_checkpoints"), ("run.keep_checkpoints=null", "run.keep_checkpoints"),
    ("run.eval_every=-2", "run.eval_every"), ("run.eval_at_start=1", "run.eval_at_start"),
    ("run.eval_at_end=maybe", "run.eval_at_end"), ("run.track=2", "run.track"), ("run.progress=abc", "run.progress"),
    ("run.wandb_mode=offlin", "run.wandb_mode"), ("run.out_dir=null", "run.out_dir"), ("run.tags=x", "run.tags"),
    ("run.device=1", "run.device"), ("run.name=[a]", "run.name"),
    ("run.diagnostics=maybe", "run.diagnostics"),
    ("run={backend: ray, diagnostics: true}", "run.diagnostics"),  # the ranks hold the model: no diagnostics there
    ("tracking.log_completions_every=-1", "tracking.log_completions_every"),
    ("tracking.completions_rows=0", "tracking.completions_rows"), ("tracking.entity=[a]", "tracking.entity"),
    ("pair.train=[nope]", "pair.train"), ("pair.models=[{id: a}, {id: a}]", "pair.models"),
    ("pair.models=[{kind: tiny}]", "pair.models"), ("pair.models=[{id: a, lr: -1}]", "pair.models[a].lr"),
    ("pair.models=[{id: a, max_new_tokens: 0}]", "pair.models[a].max_new_tokens"),
    ("task.size=0", "task.size"), ("task.dataset=7", "task.dataset"), ("task.mix=[add]", "task.mix"),
    ("task.fields.problem=[q]", "task.fields.problem"), ("task.fields.answer=7", "task.fields.answer"),
    ("task.fields.label=x", "task.fields.label"), ("task.fields=q", "task.fields"),
    ("task.reward_correct=abc", "task.reward_correct"), ("task.reward_wrong=[1]", "task.reward_wrong"),
    ("task.reward_correct=0", "task.reward_correct"),        # = reward_wrong: every advantage is 0
    ("task.verifier_budget=0", "task.verifier_budget"), ("task.verifier_timeout=abc", "task.verifier_timeout"),
    ("eval.size=0", "eval.size"), ("eval.val_size=0", "eval.val_size"), ("eval.k=1.5", "eval.k"),
    ("eval.temperature=0", "eval.temperature"), ("eval.top_p=1.5", "eval.top_p"), ("eval.top_p=0", "eval.top_p"),
    ("eval.max_new_tokens=0", "eval.max_new_tokens"), ("eval.greedy=sometimes", "eval.greedy"),
    ("eval.benchmarks=7", "eval.benchmarks"), ("eval.allow_test_selection=2", "eval.allow_test_selection"),
    ("rollout.top_k=-1", "rollout.top_k"), ("rollout.max_prompt_tokens=0", "rollout.max_prompt_tokens"),
    ("rollout.gen_batch_size=0", "rollout.gen_batch_size"), ("rollout.recompute_old_logp=maybe",
                                                              "rollout.recompute_old_logp"),
    ("rollout.stop=Problem", "rollout.stop"), ("rollout.stop=[3]", "rollout.stop"),  # stop strings
    ("optim.eps=0", "optim.eps"), ("optim.weight_decay=-0.1", "optim.weight_decay"),
    ("optim.warmup_steps=-1", "optim.warmup_steps"), ("optim.grad_clip=-1", "optim.grad_clip"),
    ("optim.epochs=0", "optim.epochs"), ("peer.mix_ratio=2", "peer.mix_ratio"), ("peer.path=[a]", "peer.path"),
    ("xt.append_eos_if_stopped=3", "xt.append_eos_if_stopped"), ("store.enabled=sometimes", "store.enabled"),
    # the engine and memory keys
    ("rollout.vllm.dtype=int8", "rollout.vllm.dtype"), ("rollout.vllm.kv_cache_gb=0", "rollout.vllm.kv_cache_gb"),
    ("rollout.vllm.gpu_memory_utilization=1.5", "rollout.vllm.gpu_memory_utilization"),
    ("rollout.vllm.weight_sync=rdma", "rollout.vllm.weight_sync"),
    ("rollout.vllm.max_num_seqs=0", "rollout.vllm.max_num_seqs"), ("rollout.vllm.prefix_caching=2",
                                                                    "rollout.vllm.prefix_caching"),
    ("optim.max_tokens_per_micro=0", "optim.max_tokens_per_micro"), ("optim.precision=fp8", "optim.precision"),
    ("model.gradient_checkpointing=maybe", "model.gradient_checkpointing"),
    ("pair.models=[{id: a, device: 1}]", "pair.models[a].device"),
    # where the models run
    ("run.backend=slurm", "run.backend"), ("ray.num_workers=0", "ray.num_workers"),
    ("ray.cpus_per_worker=0", "ray.cpus_per_worker"), ("ray.gpus_per_worker=-1", "ray.gpus_per_worker"),
    ("ray.placement=ANYWHERE", "ray.placement"), ("ray.ready_timeout_s=0", "ray.ready_timeout_s"),
    ("ray.collective_timeout_s=0", "ray.collective_timeout_s"), ("ray.num_cpus=0", "ray.num_cpus"),
    ("pair.models=[{id: a, num_workers: 0}]", "pair.models[a].num_workers"),
    # LoRA
    ("model.lora=4", "model.lora"), ("model.lora={r: 0}", "model.lora.r"), ("model.lora={r: 2.5}", "model.lora.r"),
    ("model.lora={alpha: 0}", "model.lora.alpha"), ("model.lora={alpha: x}", "model.lora.alpha"),
    ("model.lora={dropout: 1}", "model.lora.dropout"), ("model.lora={dropout: -0.1}", "model.lora.dropout"),
    ("model.lora={target_modules: q_proj}", "model.lora.target_modules"),
    ("model.lora={target_modules: []}", "model.lora.target_modules"),
    ("model.lora={target_modules: [1]}", "model.lora.target_modules"), ("model.lora={rank: 4}", "model.lora.rank"),
    ("pair.models=[{id: a, lora: {r: 0}}]", "pair.models[a].lora.r"),
    ("pair.models=[{id: a, lora: [1]}]", "pair.models[a].lora"),
]


@pytest.mark.parametrize("override,key", CORE_BAD, ids=[f"{o}" for o, _ in CORE_BAD])
def test_every_bad_core_value_is_rejected_at_load_naming_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(pair="micro", algo="grpo", overrides=[override])
    msg = str(e.value)
    assert f"config key '{key}'" in msg and "\n" not in msg, msg


def test_the_messages_say_why():
    with pytest.raises(ConfigError, match=r"'rollout.temperature' must be in \(0, 10\], got 0: rollouts are sampled "
                                          r"\(greedy decoding is eval.greedy"):
        micro("grpo", "rollout.temperature=0")
    with pytest.raises(ConfigError, match=r"'optim.minibatches' must be <= task.prompts_per_step=4 \(a minibatch "
                                          r"holds at least one prompt group\), got 100"):
        micro("grpo", "optim.minibatches=100")
    with pytest.raises(ConfigError, match=r"config key 'run.steps': the value '\[1,2' is not valid YAML"):
        micro("grpo", "run.steps=[1,2")
    with pytest.raises(ConfigError, match=r"'peer.path' is required with peer.source=stored"):
        micro("graft", "peer.source=stored")
    with pytest.raises(ConfigError, match=r"'peer.source' = online co-trains two or more models, but 1 is trained"):
        micro("graft", "peer.source=online", "pair.train=[micro-qwen-char]")


@pytest.mark.parametrize("overrides,check", [
    (["rollout.temperature=0.6", "rollout.top_p=1", "eval.top_p=0.95", "eval.temperature=0.1"],
     lambda c: c.rollout.temperature == 0.6 and c.eval.top_p == 0.95),
    (["optim.grad_clip=0"], lambda c: c.optim.grad_clip == 0),      # 0 or null: no clipping
    (["optim.grad_clip=null", "optim.warmup_steps=null"], lambda c: c.optim.grad_clip is None),
    (["rollout.max_new_tokens=1e3", "run.steps=2e1"],                     # an integral float is an integer
     lambda c: c.rollout.max_new_tokens == 1000 and type(c.run.steps) is int),
    (["optim.lr=3e-5", "optim.eps=1e-6"], lambda c: c.optim.lr == 3e-5 and c.optim.eps == 1e-6),
    (["optim.betas=[0, 0.5]", "optim.weight_decay=0.01"], lambda c: list(c.optim.betas) == [0, 0.5]),
    (["optim.minibatches=4", "run.epochs=2"], lambda c: c.optim.minibatches == 4),
    (["eval.size=null", "eval.max_new_tokens=null", "eval.val_size=null", "run.save_every=null"],
     lambda c: c.eval.size is None),
    (["task.reward_correct=1", "task.reward_wrong=-1", "task.verifier_budget=null"],
     lambda c: c.task.reward_wrong == -1),
    (["eval.benchmarks=all", "run.wandb_mode=disabled", "run.tags=[a, b]"], lambda c: c.eval.benchmarks == "all"),
    (['peer.source=mixed', 'peer.path="2024"', "peer.mix_ratio=0.5"], lambda c: c.peer.path == "2024"),
])
def test_valid_values_are_kept(overrides, check):
    cfg = micro("graft" if any(o.startswith("peer.source") for o in overrides) else "grpo", *overrides)
    assert check(cfg)


def test_a_peer_path_from_the_command_line_stays_a_string():
    from graftzoo.apps.options import peer_option
    cfg = micro("graft", *peer_option(None, None, "stored:2024"))
    assert (cfg.peer.source, cfg.peer.path) == ("stored", "2024")
    with pytest.raises(ConfigError, match="'peer.path' must be a string or null, got 2024"):  # YAML: quote it
        micro("graft", "peer.source=stored", "peer.path=2024")


def test_a_malformed_peer_option_is_one_line():
    for value, message in (("stored:", "stored needs a path"), ("mixed: ", "mixed needs a path"),
                           ("bogus", "must be online")):
        res = CliRunner().invoke(main, ["train", "--algo", "grpo", "--pair", "micro", "--peer", value])
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert lines[0].startswith("Error: Invalid value for '--peer': ") and message in lines[0]


def test_every_shipped_config_loads():
    pairs = sorted(p.stem for p in (CONFIGS / "pairs").glob("*.yaml"))
    presets = sorted(p.stem for p in (CONFIGS / "algos").glob("*.yaml"))
    algos = [e.name for e in list_algos()[0]]
    assert pairs and presets and algos
    for pair in pairs:
        two = len(read_yaml(CONFIGS / "pairs" / f"{pair}.yaml")["models"]) == 2
        for algo in presets + algos:
            if two:
                cfg = load_config(pair=pair, algo=algo, overrides=["peer.source=online"])
            else:  # a one-model pair (the GRPO baselines) trains every algorithm that needs no peer
                try:
                    cfg = load_config(pair=pair, algo=algo)
                except ConfigError as e:
                    assert "needs a peer source" in str(e), (pair, algo, e)
                    continue
            assert cfg.pair.name == pair
    from graftzoo.apps import grid as G
    files = sorted((CONFIGS / "grids").glob("*.yaml")) + sorted(
        p for p in (CONFIGS / "demo").glob("*.yaml") if p.stem != "demo")   # demo.yaml: the demo's plan, no grid
    assert len(files) >= 5
    for path in files:
        grid = G.load_grid(path)
        assert grid.cells and G.check_configs(grid.cells) == {}, path


# ------------------------------------------------------------------------------------------------
# pair.models: typed entries, resolved once against the run keys
# ------------------------------------------------------------------------------------------------

TWO = ("pair.models=[{id: a, lr: 0.5, lora: null, stop: [X], device: cpu}, "
       "{id: b, kind: hf, path: /nowhere, max_new_tokens: 7.0, num_workers: 1, gradient_checkpointing: true}]")


def test_a_model_entry_is_a_frozen_object_whose_run_keys_are_resolved_once():
    import pickle
    cfg = load_config(pair="micro", algo="grpo", overrides=[TWO, "model.lora={r: 4}", "optim.lr=3e-5"])
    a, b = cfg.pair.models
    assert isinstance(a, config_mod.ModelSpec) and (a.id, a.kind, b.kind) == ("a", "tiny", "hf")
    assert (a.lr, a.lora, a.stop, a.device, a.template, a.max_new_tokens, a.num_workers) == (
        0.5, None, ["X"], "cpu", "compact", 40, 1)          # its own values, else pair.template, rollout.*, ray.*
    assert (b.lr, b.lora.r, b.stop, b.device, b.max_new_tokens, b.gradient_checkpointing, b.dtype) == (
        3e-5, 4, "auto", "auto", 7, True, "bfloat16")       # a kind: hf model loads in bfloat16 unless given
    assert a.dtype is None and a.key_of("lr") == "pair.models[a].lr" and b.key_of("lr") == "optim.lr"
    assert a.key_of("lora") == "pair.models[a].lora" and b.key_of("lora") == "model.lora" and a.sets("device")
    with pytest.raises(Exception):
        a.lr = 1.0                                            # frozen
    # config.yaml holds each entry as written (its lora validated), nothing resolved
    assert as_dict(cfg)["pair"]["models"] == [{"id": "a", "lr": 0.5, "lora": None, "stop": ["X"], "device": "cpu"},
                                              {"id": "b", "kind": "hf", "path": "/nowhere", "max_new_tokens": 7.0,
                                               "num_workers": 1, "gradient_checkpointing": True}]
    back = pickle.loads(pickle.dumps(cfg))                    # Ray sends them to the workers
    assert back == cfg and back.pair.models[1].lora.r == 4 and as_dict(back) == as_dict(cfg)
    derived = with_values(cfg, {"optim.lr": 0.25, "run.device": "cpu", "model.lora": None})  # resolved again
    assert [(s.lr, s.device, s.lora) for s in derived.pair.models] == [(0.5, "cpu", None), (0.25, "cpu", None)]
    moved = a.replace(device="cuda:1")                        # an entry's own key set: resolved as before
    assert moved.device == "cuda:1" and moved.lr == 0.5 and moved.model_dump()["device"] == "cuda:1"
    assert with_values(cfg, {"rollout.n": 2}).pair is cfg.pair  # nothing a model reads changed: the same entries


@pytest.mark.parametrize("entry, key, why", [
    ("{id: a, hiden: 64}", "pair.models[a].hiden", "did you mean 'pair.models[a].hidden'"),
    ("{id: a, kind: tiny, path: /x}", "pair.models[a].path", "kind: hf models"),
    ("{id: a, kind: hf, family: gpt2}", "pair.models[a].family", "kind: tiny models"),
    ("{id: a, kind: gguf}", "pair.models[a].kind", "one of tiny | hf"),
    ("{id: a, dtype: bf16}", "pair.models[a].dtype", "must be one of float32, bfloat16, float16"),
    ("{id: a, hidden: 0}", "pair.models[a].hidden", "must be in [1, 1048576], got 0"),
])
def test_a_wrong_key_of_a_model_entry_is_refused_at_load_naming_it(entry, key, why):
    with pytest.raises(ConfigError) as e:
        load_config(pair="micro", algo="grpo", overrides=[f"pair.models=[{entry}]"])
    assert f"config key '{key}'" in str(e.value) and why in str(e.value), str(e.value)


def test_the_learner_facts_are_the_run_keys_they_name():
    """``LearnerFacts`` restates no default: each fact's default is its run key's declared one, ``of`` reads it."""
    assert LearnerFacts() == LearnerFacts.of(load_config(overrides=["pair.models=[{id: a}]"]))
    cfg = micro("grpo", "rollout.n=3", "run.device=cpu", "optim.clip.eps_high=0.28", "xt.overflow=truncate")
    facts = LearnerFacts.of(cfg)
    assert (facts.n, facts.device, facts.clip.eps_high, facts.xt.overflow, facts.max_new_tokens) == (
        3, "cpu", 0.28, "truncate", 40)
