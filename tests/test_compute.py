"""Compute accounting: ComputeMeter and the joint charging rule (docs/algorithms.md#evaluation-protocol-and-compute)."""
import pytest
import torch

from graftzoo.eval import compute
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


class Events:
    """A clock, a CPU clock and a device synchronisation that write what happened, in order, to one list."""

    def __init__(self, fail_sync: bool = False):
        self.log, self.t, self.fail_sync = [], 0.0, fail_sync

    def clock(self):
        self.t += 1.0
        self.log.append("clock")
        return self.t

    def cpu_clock(self):
        return 0.0

    def sync(self, device):
        self.log.append(("sync", device))
        if self.fail_sync:
            raise RuntimeError("CUDA error: an illegal memory access")


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA "in use" on a CPU machine: the meter's probe says so, the allocator's peak reads 2 GiB."""
    monkeypatch.setattr(compute, "_cuda_in_use", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2 * compute.GIB)


def test_a_phase_on_cuda_synchronises_the_device_at_both_ends_of_its_timed_span(fake_cuda):
    ev = Events()
    meter = ComputeMeter(gpus=1, clock=ev.clock, cpu_clock=ev.cpu_clock, sync=ev.sync,
                         devices={B: "cuda:1", "cpu-model": "cpu"})
    with meter.phase(A, "update"):
        ev.log.append("body")
    assert ev.log == [("sync", None), "clock", "body", ("sync", None), "clock"]  # A: the current device
    ev.log.clear()
    with meter.phase(B, "update"):
        ev.log.append("body")
    assert ev.log == [("sync", "cuda:1"), "clock", "body", ("sync", "cuda:1"), "clock"]
    ev.log.clear()
    with meter.phase("cpu-model", "update"):
        ev.log.append("body")
    assert ev.log == ["clock", "body", "clock"]  # a model on the CPU: nothing synchronised, no GPU peak
    s = meter.summary()["models"]
    assert s[A]["phases"]["update"]["peak_gb"] == 2.0 and "peak_gb" not in s["cpu-model"]["phases"]["update"]


def test_a_phase_on_the_cpu_never_synchronises(monkeypatch):
    def no_sync(device=None):
        raise AssertionError("synchronised a CUDA device on the CPU")
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.setattr(compute, "_cuda_in_use", lambda: False)
    ev = Events()
    meter = ComputeMeter(gpus=0, clock=ev.clock, cpu_clock=ev.cpu_clock)  # the default sync: torch's
    with meter.phase(A, "generate"):
        ev.log.append("body")
    assert ev.log == ["clock", "body", "clock"]
    assert "peak_gb" not in meter.summary()["models"][A]["phases"]["generate"]


def test_cuda_first_used_inside_a_phase_is_synchronised_at_its_end(fake_cuda, monkeypatch):
    in_use = iter([False, True])  # the phase that loads the model onto the GPU
    monkeypatch.setattr(compute, "_cuda_in_use", lambda: next(in_use))
    ev = Events()
    meter = ComputeMeter(gpus=1, clock=ev.clock, cpu_clock=ev.cpu_clock, sync=ev.sync)
    with meter.phase(A, "load"):
        ev.log.append("body")
    assert ev.log == ["clock", "body", ("sync", None), "clock"]


def test_a_failing_synchronisation_is_raised_after_the_phase_is_recorded_unless_the_body_failed(fake_cuda):
    ev = Events(fail_sync=False)
    meter = ComputeMeter(gpus=1, clock=ev.clock, cpu_clock=ev.cpu_clock, sync=ev.sync)
    with pytest.raises(ValueError, match="the body's"):
        with meter.phase(A, "update"):
            ev.fail_sync = True  # the end's synchronisation fails too: the body's error is the one raised
            raise ValueError("the body's")
    ev.fail_sync = False
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with meter.phase(A, "generate"):
            ev.fail_sync = True
    phases = meter.summary()["models"][A]["phases"]
    assert phases["update"]["wall_s"] == 1.0 and phases["generate"]["wall_s"] == 1.0


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
