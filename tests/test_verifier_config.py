"""The ``task.verifier.*`` keys (math-verify's comparison options) reach the verifier through a run config: the
task's envs score with them, they change verdicts where math-verify's options do, and they are part of the version
an eval file records. Defaults are math-verify's own."""
import pytest

from graftzoo.contract.config import ConfigError, load_config
from graftzoo.envs.task import Task
from graftzoo.envs.verifier import VERIFIER_VERSION, VerifierOptions, verifier_version, verify


def micro(*overrides):
    return load_config(pair="micro", algo="grpo", overrides=["run.track=false", *overrides])


def test_the_defaults_are_math_verifys_own():
    assert micro().task.verifier.model_dump() == {
        "float_rounding": VerifierOptions().float_rounding, "numeric_precision": VerifierOptions().numeric_precision,
        "strict": VerifierOptions().strict, "allow_set_relation_comp": VerifierOptions().allow_set_relation_comp}


def test_the_keys_reach_the_tasks_envs():
    cfg = micro("task.verifier.float_rounding=2", "task.verifier.strict=false")
    env = Task(cfg).train_env
    assert env.verifier_options == VerifierOptions(float_rounding=2, strict=False)
    assert verifier_version(env.verifier_options) != VERIFIER_VERSION


def test_an_option_changes_the_verdict_as_math_verify_does():
    """Rounding to 2 decimals makes 0.333 equal to 1/3; math-verify's default (6) does not."""
    loose = Task(micro("task.verifier.float_rounding=2")).train_env.verifier_options
    assert verify("\\boxed{0.333}", "\\frac{1}{3}").correct is False
    assert verify("\\boxed{0.333}", "\\frac{1}{3}", options=loose).correct is True


@pytest.mark.parametrize("override,key", [("task.verifier.float_rounding=-1", "task.verifier.float_rounding"),
                                          ("task.verifier.strict=maybe", "task.verifier.strict"),
                                          ("task.verifier.precision=3", "task.verifier.precision")])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        micro(override)
