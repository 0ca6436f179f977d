"""Compute accounting: ComputeMeter and the joint charging rule (docs/algorithms.md#evaluation-protocol-and-compute)."""
import pytest

from graftzoo.eval.compute import ComputeMeter, joint_charge, model_total

A, B = "tiny-qwen-char", "tiny-gpt2-pair"


class FakeClock:
    def __init__(self, ticks):
        self.ticks = list(ticks)

    def __call__(self):
        return self.ticks.pop(0)


def test_phase_records_wall_cpu_and_gpu_hours():
    meter = ComputeMeter(gpus=2, clock=FakeClock([10.0, 1810.0, 0.0, 5.0]),
                         cpu_clock=FakeClock([1.0, 901.0, 0.0, 2.0]))
    with meter.phase(A, "generate"):
        pass
    with meter.phase(A, "update", gpus=1):
        pass
    s = meter.summary()
    gen = s["models"][A]["phases"]["generate"]
    assert gen == pytest.approx({"wall_s": 1800.0, "cpu_s": 900.0, "gpu_h": 1.0})  # 2 GPUs x 0.5 h
    upd = s["models"][A]["phases"]["update"]
    assert upd == pytest.approx({"wall_s": 5.0, "cpu_s": 2.0, "gpu_h": 5.0 / 3600})
    assert s["models"][A]["total"] == pytest.approx({"wall_s": 1805.0, "cpu_s": 902.0,
                                                      "gpu_h": 1.0 + 5.0 / 3600})
    assert s["total"] == s["models"][A]["total"]


def test_phase_is_recorded_when_body_raises_and_phases_accumulate():
    meter = ComputeMeter(gpus=0, clock=FakeClock([0.0, 3.0, 10.0, 14.0]),
                         cpu_clock=FakeClock([0.0, 1.0, 0.0, 1.0]))
    with pytest.raises(RuntimeError):
        with meter.phase(B, "generate"):
            raise RuntimeError("boom")
    with meter.phase(B, "generate"):
        pass
    assert meter.summary()["models"][B]["phases"]["generate"] == pytest.approx(
        {"wall_s": 7.0, "cpu_s": 2.0, "gpu_h": 0.0})


def test_real_clocks_and_negative_amounts():
    meter = ComputeMeter(gpus=0)
    with meter.phase(A, "generate"):
        sum(range(1000))
    rec = meter.summary()["models"][A]["phases"]["generate"]
    assert rec["wall_s"] >= 0 and rec["cpu_s"] >= 0 and rec["gpu_h"] == 0
    with pytest.raises(ValueError, match="tiny-qwen-char/update"):
        meter.add(A, "update", wall_s=-1.0)


def _pair_compute():
    """Hand example: A and B co-trained; eval is not training cost."""
    meter = ComputeMeter(gpus=0)
    meter.add(A, "generate", 100.0, 80.0, 0.50)
    meter.add(A, "update", 50.0, 40.0, 0.25)
    meter.add(A, "eval", 30.0, 30.0, 0.10)
    meter.add(B, "generate", 60.0, 50.0, 0.30)
    meter.add(B, "update", 40.0, 30.0, 0.20)
    return meter.summary()


def test_joint_rule_charges_each_model_the_pair():
    summary = {"peers": {A: B, B: A}, "peer_source": "live", "compute": _pair_compute()}
    charge = joint_charge(summary)
    pair = {"wall_s": 250.0, "cpu_s": 200.0, "gpu_h": 1.25}
    for m in (A, B):
        assert charge[m]["rule"] == "joint"
        assert charge[m]["charged"] == pytest.approx(pair)
        assert charge[m]["amortized"] is None
    with_eval = joint_charge(summary, exclude=())
    assert with_eval[A]["charged"] == pytest.approx({"wall_s": 280.0, "cpu_s": 230.0, "gpu_h": 1.35})


def test_stored_rule_charges_learner_only_plus_amortized():
    compute = _pair_compute()
    del compute["models"][B]
    summary = {"peers": {A: B}, "peer_source": "stored", "compute": compute,
               "peer_run_compute": {"wall_s": 1000.0, "cpu_s": 900.0, "gpu_h": 5.0}}
    c = joint_charge(summary)[A]
    assert c["rule"] == "stored"
    assert c["charged"] == pytest.approx({"wall_s": 150.0, "cpu_s": 120.0, "gpu_h": 0.75})
    assert c["amortized"] == pytest.approx({"wall_s": 1150.0, "cpu_s": 1020.0, "gpu_h": 5.75})
    summary["peer_run_compute"] = None
    assert joint_charge(summary)[A]["amortized"] is None


def test_mixed_rule_is_joint_plus_amortized():
    summary = {"peers": {A: B, B: A}, "peer_source": "mixed", "compute": _pair_compute(),
               "peer_run_compute": {"wall_s": 10.0, "cpu_s": 10.0, "gpu_h": 1.0}}
    c = joint_charge(summary)[B]
    assert c["rule"] == "joint"
    assert c["charged"] == pytest.approx({"wall_s": 250.0, "cpu_s": 200.0, "gpu_h": 1.25})
    assert c["amortized"] == pytest.approx({"wall_s": 260.0, "cpu_s": 210.0, "gpu_h": 2.25})


def test_single_model_rule_and_missing_model():
    summary = {"peers": {A: None, B: None}, "peer_source": None, "compute": _pair_compute()}
    c = joint_charge(summary)
    assert c[A]["rule"] == "own"
    assert c[A]["charged"] == pytest.approx({"wall_s": 150.0, "cpu_s": 120.0, "gpu_h": 0.75})
    assert c[B]["charged"] == pytest.approx({"wall_s": 100.0, "cpu_s": 80.0, "gpu_h": 0.5})
    with pytest.raises(KeyError, match="no compute recorded for model 'other'"):
        model_total(summary["compute"], "other")
