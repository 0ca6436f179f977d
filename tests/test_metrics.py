"""Metric names (graftzoo/contract/metrics.py): docs/metrics.md is the generator's text, every key a real run writes
to metrics.jsonl is declared, the module imports without torch, and the complementarity metrics come from
graftzoo.training.learning.diagnostics."""
import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from graftzoo.contract import metrics as M

ROOT = Path(__file__).resolve().parents[1]


def test_docs_page_is_current():
    assert (ROOT / "docs" / "metrics.md").read_text() == M.markdown(), \
        "docs/metrics.md is stale: python -m graftzoo.contract.metrics > docs/metrics.md"


def test_declarations_are_whole():
    assert len(M.METRICS) == len(set(M.METRICS))
    for name, m in M.METRICS.items():
        assert name == m.name and m.unit in M.UNITS and m.meaning and m.by, name
    assert set(M.EVERY_RECORD) <= set(M.METRICS)
    for f in M.FAMILIES:
        assert f.unit in M.UNITS and f.meaning and f.parts, f.pattern


def test_a_metric_is_its_name():
    m = M.PEER_ADMITTED
    assert m == "peer/admitted" and {m: 1}["peer/admitted"] == 1 and hash(m) == hash("peer/admitted")
    assert json.dumps({m: m}) == '{"peer/admitted": "peer/admitted"}'
    back = pickle.loads(pickle.dumps(m))
    assert type(back) is str and back == m  # crosses processes (Ray) as the plain name


def test_families_build_and_match_names():
    assert M.EVAL_AVG_GROUP.of(group="add") == "eval/avg_add"
    assert M.declared("eval/avg_add") and M.declared("eval/greedy_mul") and M.declared("eval/avg")
    assert not M.declared("eval/avgx") and not M.declared("peer/nope")
    with pytest.raises(ValueError):
        M.EVAL_AVG_GROUP.of(skill="add")
    assert M.COMPLETIONS.of(model="m") == "m/completions" and not M.declared("m/completions")  # wandb only
    with pytest.raises(KeyError, match="not declared"):
        M.get("peer/nope")


def _keys(run_dir: Path) -> set:
    keys = set()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        keys |= set(json.loads(line))
    return keys


@pytest.mark.parametrize("algo,extra", [("grpo", {}), ("graft", {"peer.source": "online"})])
def test_every_logged_metric_is_declared(tmp_path, algo, extra):
    from graftzoo import api
    res = api.train(algo=algo, pair="micro", overrides={"run.steps": 2, "run.track": False,
                                                        "run.out_dir": str(tmp_path), "task.prompts_per_step": 2,
                                                        "eval.size": 4, **extra})
    assert res.status == "done", res.error
    keys = _keys(res.run_dir)
    undeclared = sorted(k for k in keys if not M.declared(k))
    assert not undeclared, f"logged but not declared in graftzoo/contract/metrics.py: {undeclared}"
    assert set(M.EVERY_RECORD) <= keys
    assert {M.PEER_SOLVED_ALL_FAIL_FRAC, M.PEER_ALL_FAIL_COUNT, M.EVAL_AVG} <= keys  # a co-trained pair
    if algo == "graft":
        assert M.PEER_ADMIT_RATE_SUCC in keys


def test_contract_metrics_import_without_torch():
    code = ("import sys; import graftzoo.contract.metrics as M; assert M.METRICS; "
            "heavy = [m for m in ('torch', 'transformers', 'numpy', 'pandas') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def _group(pid, correct):
    n = len(correct)
    k = sum(correct)
    return SimpleNamespace(prompt=SimpleNamespace(id=pid), num_correct=k, all_fail=k == 0, mixed=0 < k < n)


def test_complementarity_lives_in_diagnostics():
    from graftzoo.training.learning import diagnostics
    from graftzoo.training import trainer
    assert not hasattr(trainer, "complementarity")
    own = [_group("a", [0, 0]), _group("b", [0, 0]), _group("c", [1, 0]), _group("d", [0, 0])]
    peer = {"a": _group("a", [1, 1]), "b": _group("b", [1, 0]), "c": _group("c", [0, 0])}
    out = diagnostics.complementarity(own, {"B": peer})
    assert out == {M.PEER_SOLVED_ALL_FAIL_FRAC: 2 / 3, M.PEER_MIXED_ON_ALL_FAIL_FRAC: 1 / 3,
                   M.PEER_ALL_FAIL_COUNT: 3}
    assert diagnostics.complementarity([own[2]], {"B": peer}) == {M.PEER_SOLVED_ALL_FAIL_FRAC: None,
                                                           M.PEER_MIXED_ON_ALL_FAIL_FRAC: None,
                                                           M.PEER_ALL_FAIL_COUNT: 0}
