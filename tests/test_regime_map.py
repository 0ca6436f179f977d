"""The regime map: a method's ``pairs``, the grid's ``report.map`` and the Δ heat map of the learner."""
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from graftzoo.apps import grid as G
from graftzoo.apps.cli import main
from graftzoo.contract.config import packaged_configs
from graftzoo.eval.artifacts import eval_path
from graftzoo.eval.regime import RegimeMap, regime_cells

BASE = {
    "name": "m",
    "pairs": ["micro", "tiny"],
    "seeds": [0],
    "set": {"run.steps": 1, "run.track": False},
    "algorithms": [{"label": "GRPO (n=8)", "algo": "grpo", "pairs": ["micro"]}],
    "variants": [{"label": "GRAFT", "algo": "graft", "peer": "online"},
                 {"label": "SGT + GRAFT how", "same_as": "GRAFT"}],
    "report": {"baseline": "GRPO (n=8)",
               "map": {"rows": {"micro learner": ["micro"], "tiny learner": ["tiny"]},
                       "cols": {"heterogeneous": ["micro", "tiny"]}, "methods": ["graft", "SGT + GRAFT how"]}},
}


def write_grid(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def changed(**kw) -> dict:
    data = json.loads(json.dumps(BASE))
    for dotted, value in kw.items():   # "report__map__rows" -> data["report"]["map"]["rows"]
        *up, last = dotted.split("__")
        d = data
        for k in up:
            d = d[k]
        d[last] = value
    return data


def test_method_pairs_restricts_its_cells_and_the_map_loads(tmp_path):
    grid = G.load_grid(write_grid(tmp_path / "m.yaml", BASE))
    assert [c.name for c in grid.cells] == ["grpo-n8-micro-s0", "graft-micro-s0", "graft-tiny-s0"]
    rm = grid.regime
    assert rm.cell_pair == {("micro learner", "heterogeneous"): "micro", ("tiny learner", "heterogeneous"): "tiny"}
    assert rm.learner == {"micro": "micro-qwen-char", "tiny": "tiny-qwen-char"}
    assert rm.methods == ["GRAFT", "SGT + GRAFT how"] and rm.labels["SGT + GRAFT how"] == "GRAFT"   # alias, any case
    res = CliRunner().invoke(main, ["grid", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "o"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "  GRPO (n=8): grpo pairs=micro" in res.output
    assert "regime map: GRAFT − GRPO (n=8) | SGT + GRAFT how − GRPO (n=8)" in res.output
    assert "  tiny learner (learner tiny-qwen-char): heterogeneous: pair tiny" in res.output


@pytest.mark.parametrize("change, message", [
    (dict(algorithms=[{"label": "GRPO (n=8)", "algo": "grpo", "pairs": ["micro", "nope"]}]),
     "method 'GRPO (n=8)': pairs ['nope'] are not among the grid's pairs"),
    (dict(variants=[{"label": "GRAFT", "algo": "graft", "peer": "stored:{cell:GRPO (n=8)}", "each_model": True},
                    {"label": "SGT + GRAFT how", "same_as": "GRAFT"}]),
     "peer refers to {cell:GRPO (n=8)}, which has no cell on pair 'tiny'"),
    (dict(report__map__cols={"a": ["micro", "tiny"], "b": ["tiny"]}),
     "row 'micro learner' and column 'b' share 0 pairs"),
    (dict(report__map__rows={"both": ["micro", "tiny"]}), "row 'both' and column 'heterogeneous' share 2 pairs"),
    (dict(report__map__rows={"r": ["micro", "tiny"]}, report__map__cols={"a": ["micro"], "b": ["tiny"]}),
     "row 'r' mixes learners"),
    (dict(report__map__cols={"heterogeneous": ["micro", "nope"]}), "report.map.cols['heterogeneous']: pairs ['nope']"),
    (dict(report__map__methods=["GRAFT", "Nope"]), "report.map.methods[1]: 'Nope' is not a method label"),
    (dict(report__map__budget="GRPO (n=32)"), "report.map.budget: 'GRPO (n=32)' is not a method label"),
    (dict(report__baseline="Nope"), "report.baseline (the map's baseline): 'Nope' is not a method label"),
    (dict(report__map__colour=1), "report.map: unknown key(s) ['colour']"),
    (dict(report__map__budget="GRPO (n=8)"), "must be distinct labels other than the baseline 'GRPO (n=8)'"),
])
def test_map_errors_name_the_key(tmp_path, change, message):
    spec = write_grid(tmp_path / "bad.yaml", changed(**change))
    with pytest.raises(G.GridError, match=re.escape(message)) as e:
        G.load_grid(spec)
    assert str(spec) in str(e.value)


def _rmap(**kw) -> RegimeMap:
    base = dict(title="t", rows=["low", "high"], cols=["same", "het"],
                cell_pair={("low", "same"): "l-same", ("low", "het"): "l-het",
                           ("high", "same"): "h-same", ("high", "het"): "h-het"},
                base_pairs={"low": ["l-same", "l-het"], "high": ["h-same", "h-het", "h-alone"]},
                learner={"l-same": "L", "l-het": "L", "h-same": "H", "h-het": "H", "h-alone": "H"},
                baseline="GRPO (n=8)", methods=["GRAFT", "SGT + GRAFT how"], budget="GRPO (n=32)",
                labels={"GRPO (n=8)": "GRPO (n=8)", "GRAFT": "GRAFT", "SGT + GRAFT how": "w/o balanced exchange",
                        "GRPO (n=32)": "GRPO (n=32)"})
    base.update(kw)
    return RegimeMap(**base)


def test_delta_is_paired_by_seed_with_the_row_baseline():
    """Δ_s = method_s − baseline_s over the seeds both have; the baseline comes from the cell's pair, else the row's
    pairs, else the learner's own pair."""
    scores = {("GRPO (n=8)", "l-same", s): v for s, v in {0: 0.30, 1: 0.40, 2: 0.20}.items()}   # row low: one pair
    scores.update({("GRAFT", "l-het", 0): 0.50, ("GRAFT", "l-het", 2): 0.70})                  # seed 1 missing
    scores.update({("GRAFT", "l-same", s): 0.30 + 0.1 * s for s in (0, 1, 2)})
    scores.update({("w/o balanced exchange", "l-het", s): 0.25 for s in (0, 1, 2)})              # the alias's runs
    scores.update({("GRPO (n=32)", "l-same", 5): 0.9})                                           # no shared seed
    scores.update({("GRPO (n=8)", "h-het", 0): 0.1, ("GRAFT", "h-het", 0): 0.4})                 # one seed
    scores.update({("GRPO (n=32)", "h-alone", 0): 0.2})              # the learner's own pair, outside the map
    cells = {(c["row"], c["col"]): c for c in regime_cells(_rmap(), scores)}
    het = cells[("low", "het")]
    assert het["baseline"]["pair"] == "l-same" and het["learner"] == "L"
    d = het["delta"]["GRAFT"]
    assert d["seeds"] == [0, 2] and d["values"] == pytest.approx([0.20, 0.50])                  # paired by seed
    assert d["mean"] == pytest.approx(0.35) and d["n"] == 2
    assert d["sd"] == pytest.approx(math.sqrt(((0.2 - 0.35) ** 2 + (0.5 - 0.35) ** 2) / 1))   # sample s.d. (n − 1)
    alias = het["delta"]["SGT + GRAFT how"]
    assert alias["values"] == pytest.approx([-0.05, -0.15, 0.05]) and alias["n"] == 3
    assert het["methods"]["SGT + GRAFT how"]["mean"] == pytest.approx(0.25)
    same = cells[("low", "same")]["delta"]["GRAFT"]
    assert same["values"] == pytest.approx([0.0, 0.0, 0.3]) and same["mean"] == pytest.approx(0.1)
    assert cells[("low", "same")]["delta"]["GRPO (n=32)"]["n"] == 0
    assert "no seed with both GRPO (n=32) and GRPO (n=8)" in cells[("low", "same")]["missing"]
    one = cells[("high", "het")]["delta"]["GRAFT"]
    assert one["mean"] == pytest.approx(0.3) and one["sd"] is None and one["n"] == 1
    hs = cells[("high", "same")]
    assert hs["baseline"]["pair"] == "h-het" and hs["delta"]["GRAFT"]["mean"] is None      # baseline from the row
    assert hs["missing"] == ["no GRAFT run on pair h-same", "no SGT + GRAFT how run on pair h-same"]
    assert hs["budget"]["pair"] == "h-alone" and hs["delta"]["GRPO (n=32)"]["values"] == pytest.approx([0.1])
    low = cells[("low", "het")]
    assert low["budget"]["pair"] == "l-same" and "no GRPO (n=32) run" not in " ".join(low["missing"])


def _copy_pair(src: dict, name: str, models: list) -> dict:
    return dict(src, name=name, models=[src["models"][i] for i in models])


@pytest.mark.slow
def test_grid_writes_the_regime_map(tmp_path, monkeypatch):
    """End to end through ``graftzoo grid``: a user's ./configs/pairs, a 2 × 2 map on copies of the micro pair (the
    second row's learner is micro's second model), GRPO on a one-model pair of the first row's learner only (outside
    the map); the JSON's Δ is the difference of the eval files, the missing cells say so."""
    monkeypatch.chdir(tmp_path)
    micro = yaml.safe_load((packaged_configs() / "pairs" / "micro.yaml").read_text())
    (tmp_path / "configs" / "pairs").mkdir(parents=True)
    for name, models in (("ma", [0, 1]), ("mb", [0, 1]), ("sa", [1, 0]), ("sb", [1, 0]), ("q", [0])):
        (tmp_path / "configs" / "pairs" / f"{name}.yaml").write_text(yaml.safe_dump(_copy_pair(micro, name, models)))
    spec = {"name": "rm", "pairs": ["q", "ma", "mb", "sa", "sb"], "seeds": [0, 1],
            "set": {"run.steps": 1, "run.track": False, "run.progress": False, "task.prompts_per_step": 2,
                    "rollout.n": 2, "eval": {"size": 16, "k": 1}},
            "algorithms": [{"label": "GRPO (n=8)", "algo": "grpo", "pairs": ["q"]}],
            "variants": [{"label": "GRAFT", "algo": "graft", "peer": "online", "pairs": ["ma", "mb", "sa"]},
                         {"label": "SGT + GRAFT how", "same_as": "GRAFT"}],
            "report": {"baseline": "GRPO (n=8)",
                       "map": {"title": "GRAFT − GRPO on the learner", "skill": "add",
                               "rows": {"qwen learner": ["ma", "mb"], "gpt2 learner": ["sa", "sb"]},
                               "cols": {"peer A": ["ma", "sa"], "peer B": ["mb", "sb"]},
                               "methods": ["GRAFT", "SGT + GRAFT how"]}}}
    write_grid(tmp_path / "rm.yaml", spec)
    res = CliRunner().invoke(main, ["grid", "rm.yaml", "--out", "out", "--in-process"])
    assert res.exit_code == 0, res.output
    # one training step leaves the micro models at 0 everywhere: give every run's eval file its own score, then the
    # grid again (every cell is done and skipped; the report is rewritten from those files)
    for i, f in enumerate(sorted((tmp_path / "out").glob("*/eval/*.json"))):
        ev = json.loads(f.read_text())
        ev["benchmarks"]["add"]["avg"] = 0.013 * i
        f.write_text(json.dumps(ev))
    res = CliRunner().invoke(main, ["grid", "rm.yaml", "--out", "out", "--in-process"])
    assert res.exit_code == 0 and "[new]" not in res.output, res.output
    report = tmp_path / "out" / "report"
    assert (report / "regime_map.png").exists(), res.output
    assert (report / "regime_map.png").stat().st_size > 10_000
    data = json.loads((report / "regime_map.json").read_text())
    cells = {(c["row"], c["col"]): c for c in data["cells"]}

    def add(cell: str, model: str) -> float:
        return json.loads(eval_path(tmp_path / "out" / cell, model).read_text())["benchmarks"]["add"]["avg"]

    for col, pair in (("peer A", "ma"), ("peer B", "mb")):     # row 1: the baseline of both cells is GRPO on q
        d = cells[("qwen learner", col)]["delta"]
        want = [add(f"graft-{pair}-s{s}", "micro-qwen-char") - add(f"grpo-n8-q-s{s}", "micro-qwen-char")
                for s in (0, 1)]
        assert d["GRAFT"]["values"] == pytest.approx(want) and d["GRAFT"]["n"] == 2 and 0 not in want
        assert d["GRAFT"]["sd"] == pytest.approx(statistics.stdev(want))
        assert d["GRAFT"]["mean"] == pytest.approx(statistics.fmean(want))
        assert d["SGT + GRAFT how"] == d["GRAFT"]                                   # the alias shows the same runs
        assert cells[("qwen learner", col)]["baseline"]["pair"] == "q"           # the learner's own pair
    assert cells[("gpt2 learner", "peer A")]["learner"] == "micro-gpt2-pair"
    assert cells[("gpt2 learner", "peer A")]["delta"]["GRAFT"]["mean"] is None     # no GRPO run of this learner
    md = (report / "regime_map.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("| gpt2 learner | peer B |"))
    assert "no GRPO (n=8) run of micro-gpt2-pair in row 'gpt2 learner'" in line and "no GRAFT run on pair sb" in line
    first = next(x for x in md.splitlines() if x.startswith("| qwen learner | peer A |"))
    mean = 100 * cells[("qwen learner", "peer A")]["delta"]["GRAFT"]["mean"]
    assert f"{mean:+.1f}" in first and "(n=2)" in first and not math.isnan(mean)
