"""Every seeded metric of every builtin algorithm, two steps on the micro pair, equals the figures recorded in
``tests/data/step_metrics.json``: a change to the step (its order, theta_old, the losses, the exchange) that moves
any number of any algorithm fails here, naming the algorithm, the step, the model and the metric. Wall times and
throughput are left out (they are not seeded). Regenerate the file only for a change that is meant to move the
numbers: ``python tests/test_step_metrics.py --write [ALGO ...]``."""
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from graftzoo.algos import BUILTIN
from graftzoo.contract.config import load_config
from graftzoo.training.trainer import Trainer

FIGURES = Path(__file__).parent / "data" / "step_metrics.json"
PEER = {"hacpo", "sgt", "graft"}
UNSEEDED = ("time/", "perf/", "async/overlap_s")
# easy prompts, so that groups are mixed and peers rescue groups; two minibatches (theta_old, the clip), micro-batches
# (their shared denominators), a KL and an entropy bonus: every part of the loss moves the numbers
SETTINGS = ["run.track=false", "run.steps=2", "run.eval_at_end=false", "run.eval_at_start=false",
            "task.difficulty=1", "task.prompts_per_step=6", "optim.lr=3e-3", "optim.minibatches=2",
            "optim.max_tokens_per_micro=400", "algo.beta_kl=0.02", "algo.entropy_coeff=0.001"]


def seeded_metrics(algo: str, out_dir, more=()) -> dict:
    """step -> model -> metric -> value of a two-step run of ``algo`` on the micro pair, and each model's weights
    after it (``weights/sum``: the float64 sum of every parameter, ``weights/abs_sum``); ``more``: further settings."""
    overrides = [f"run.out_dir={out_dir}", *SETTINGS, *more] + (["peer.source=online"] if algo in PEER else [])
    tr = Trainer(load_config(pair="micro", algo=algo, overrides=overrides))
    try:
        out = {}
        for step in range(2):
            mets = tr.train_step(step)
            out[str(step)] = {m: {k: v for k, v in sorted(met.items()) if not k.startswith(UNSEEDED)}
                              for m, met in mets.items()}
        for m, pol in tr.policies.items():
            params = [p.detach().double() for p in pol.model.parameters()]
            out["1"][m]["weights/sum"] = float(sum(p.sum() for p in params))
            out["1"][m]["weights/abs_sum"] = float(sum(p.abs().sum() for p in params))
        return out
    finally:
        tr.close()


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("algo", BUILTIN)
def test_every_seeded_metric_equals_the_recorded_figure(algo, tmp_path):
    want = json.loads(FIGURES.read_text())[algo]
    got = json.loads(json.dumps(seeded_metrics(algo, tmp_path)))  # as the file holds them (tuples as lists)
    diffs = [f"step {s}, model {m}, {k}: recorded {want[s][m].get(k, '<absent>')!r}, now {got[s][m].get(k, '<absent>')!r}"
             for s in want for m in want[s] for k in sorted(set(want[s][m]) | set(got[s].get(m, {})))
             if not _same(want[s][m].get(k), got[s].get(m, {}).get(k))]
    assert set(got) == set(want) and all(set(got[s]) == set(want[s]) for s in want), (sorted(got), sorted(want))
    assert not diffs, f"{algo}: {len(diffs)} metrics moved:\n" + "\n".join(diffs[:40])


@pytest.mark.parametrize("algo", ["grpo", "graft"])
def test_rollouts_ahead_off_is_the_synchronous_loop_bit_for_bit(algo, tmp_path):
    """rollout.max_staleness=0 (the default) runs the step in turn exactly as the figures were recorded before rollouts
    could be collected ahead: every seeded number equal to the last bit, and no async/ metric logged."""
    want = json.loads(FIGURES.read_text())[algo]
    got = json.loads(json.dumps(seeded_metrics(algo, tmp_path, ["rollout.max_staleness=0"])))
    assert got == want


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:  # --write [ALGO ...]: those algorithms' figures only
    import tempfile
    torch.set_num_threads(1)
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    with tempfile.TemporaryDirectory() as d:
        figures.update({a: seeded_metrics(a, Path(d) / a) for a in sys.argv[2:] or BUILTIN})
    FIGURES.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIGURES}")
