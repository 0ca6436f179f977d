"""One clip for a comparison (docs/algorithms.md#one-clip-for-every-method): the PPO ratio clip is the run's shared
``optim.clip`` (default 0.2 / 0.2), it reaches every learner's loss, no algorithm has a private default, the grid
refuses a table whose methods train with different clips unless a row is marked ``clip: own``, and the report
prints each row's clip."""
import csv
import io
import math
from types import SimpleNamespace

import pytest
import torch
import yaml
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.apps.grid import GridError, load_grid
from graftzoo.contract.batch import TrainBatch
from graftzoo.contract.config import (ClipSection, ConfigError, LearnerFacts, as_dict, clip_label, effective_clip,
                                      find_config, load_config, packaged_configs, with_values)
from graftzoo.contract.registry import get_algo
from graftzoo.contract.types import TrainRow
from graftzoo.eval.artifacts import load_runs, make_summary, write_config, write_eval, write_summary
from graftzoo.eval.compute import ComputeMeter
from graftzoo.eval.report import build_table1, to_csv, to_latex, to_markdown
from graftzoo.training.models.loss import micro_batch_loss

torch.set_num_threads(1)
PEER = {"graft", "sgt", "hacpo"}
CONFIGS = packaged_configs()  # graftzoo/configs, as installed


def cfg_of(algo, *overrides):
    peer = ["peer.source=online"] if algo in PEER else []
    return load_config(pair="micro", algo=algo, overrides=["run.track=false", *peer, *overrides])


def minibatch(advantages, T=3):
    rows = [TrainRow([1], [5] * T, [-1.0] * T, [1.0] * T, [0.0] * T, a, 1.0, "own", i, None)
            for i, a in enumerate(advantages)]
    return TrainBatch(rows, []).minibatch(range(len(rows)))


class FixedRatio:
    """A policy whose log-probs are the minibatch's old log-probs + log(ratio): every token has that ratio."""

    def __init__(self, mb, ratio):
        self.logp = mb.old_logp + math.log(ratio)

    def logprobs(self, input_ids, attention_mask, resp_len, with_entropy=False, entropy_grad=True):
        return (self.logp, torch.zeros_like(self.logp)) if with_entropy else (self.logp, None)


def loss_of(algo, advantages, ratio, *overrides):
    """The step's whole loss of a micro-batch (``micro_batch_loss``, with the policy loss the learner names) on own
    rows whose every token has ``ratio``."""
    cfg = cfg_of(algo, *overrides)
    learner = get_algo(cfg.algo.name)(cfg.algo, LearnerFacts.of(cfg))
    mb = minibatch(advantages)
    ctx = SimpleNamespace(update=0, max_response=8, run=LearnerFacts.of(cfg))
    loss, _ = micro_batch_loss(ctx, FixedRatio(mb, ratio), learner, mb)
    return float(loss)


# ------------------------------------------------------------------------------------------------
# the shared clip reaches the loss
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["grpo", "graft", "sgt", "dapo"])
def test_the_shared_eps_high_reaches_the_loss(algo):
    # A = +1 and ratio 2 > 1 + eps_high on every token: token-mean loss = -(1 + eps_high) (dapo: its preset's 0.28)
    assert loss_of(algo, [1.0, 1.0], 2.0) == pytest.approx(-1.28 if algo == "dapo" else -1.2)
    assert loss_of(algo, [1.0, 1.0], 2.0, "optim.clip.eps_high=0.2") == pytest.approx(-1.2)
    assert loss_of(algo, [1.0, 1.0], 2.0, "optim.clip.eps_high=0.5") == pytest.approx(-1.5)


@pytest.mark.parametrize("algo", ["grpo", "graft"])
def test_the_shared_eps_low_and_dual_clip_reach_the_loss(algo):
    # A = -1, ratio 0.5 < 1 - eps_low: max(0.5, 1 - eps_low)
    assert loss_of(algo, [-1.0], 0.5) == pytest.approx(0.8)
    assert loss_of(algo, [-1.0], 0.5, "optim.clip.eps_low=0.3") == pytest.approx(0.7)
    # A = -1, ratio 4: unbounded without dual clip, capped at c * |A| with it
    assert loss_of(algo, [-1.0], 4.0) == pytest.approx(4.0)
    assert loss_of(algo, [-1.0], 4.0, "optim.clip.dual_clip_c=3") == pytest.approx(3.0)


def test_graft_trains_with_grpo_s_clip_by_default():
    grpo, graft = cfg_of("grpo"), cfg_of("graft")
    assert effective_clip(graft) == effective_clip(grpo) == {"eps_low": 0.2, "eps_high": 0.2, "dual_clip_c": None,
                                                             "ratio": "token"}
    assert loss_of("graft", [1.0, -0.5], 2.0) == loss_of("grpo", [1.0, -0.5], 2.0)
    for algo in ("grpo", "graft", "sgt", "dapo", "extra", "rloo", "hora", "om_grpo"):
        name = cfg_of(algo).algo.name
        cfg = load_config(pair="micro", overrides=[f"algo.name={name}", "run.track=false"]
                          + (["peer.source=online"] if name in PEER else []))
        assert effective_clip(cfg)["eps_high"] == 0.2, f"{name}: no private clip default without a preset"


# ------------------------------------------------------------------------------------------------
# keys
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo,key", [("grpo", "eps_high"), ("graft", "eps_high"), ("dapo", "dual_clip_c"),
                                      ("extra", "eps_low"), ("hacpo", "eps_low")])
def test_algo_clip_keys_moved_to_optim_clip(algo, key):
    with pytest.raises(ConfigError, match=rf"config key 'algo.{key}' is 'optim.clip.{key}'") as e:
        cfg_of(algo, f"algo.{key}=0.28")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("override,match", [
    ("optim.clip.eps_low=1.5", r"'optim.clip.eps_low' must be in \[0, 1\]"),
    ("optim.clip.eps_high=-0.1", "'optim.clip.eps_high' must be >= 0"),
    ("optim.clip.dual_clip_c=1", "'optim.clip.dual_clip_c' must be > 1"),
    ("optim.clip.eps_high=high", "'optim.clip.eps_high' must be a number"),
    ("optim.clip.eps=0.2", "unknown config key 'optim.clip.eps'"),
])
def test_optim_clip_is_checked_at_load(override, match):
    with pytest.raises(ConfigError, match=match):
        cfg_of("grpo", override)


def test_dapo_and_extra_presets_set_the_shared_clip():
    for algo in ("dapo", "extra"):
        cfg = cfg_of(algo)
        assert cfg.algo.name == algo
        assert cfg.optim.clip.model_dump() == {"eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": 10.0}
        assert clip_label(effective_clip(cfg)) == "0.2/0.28 c=10"
    assert loss_of("dapo", [1.0], 2.0) == pytest.approx(-1.28)
    ds = cfg_of("grpo_n8_ds")   # GRPO clipping with DAPO's dynamic sampling
    assert ds.algo.name == "dapo" and ds.optim.clip.model_dump() == {"eps_low": 0.2, "eps_high": 0.2,
                                                                      "dual_clip_c": None}


def test_gspo_and_hacpo_state_their_own_clip():
    gspo = cfg_of("gspo")
    assert effective_clip(gspo) == {"eps_low": 3e-4, "eps_high": 4e-4, "dual_clip_c": None, "ratio": "sequence"}
    assert effective_clip(cfg_of("gspo", "algo.seq_clip=[0.1, 0.2]", "optim.clip.eps_high=0.5"))["eps_high"] == 0.2
    assert effective_clip(cfg_of("gspo", "optim.clip.eps_high=0.5")) == effective_clip(gspo)  # not the token clip
    # the sequence ratio 1.05 is clipped at 1 + 4e-4 by default, not with seq_clip [0.1, 0.2]
    assert loss_of("gspo", [1.0], 1.05) == pytest.approx(-1.0004)
    assert loss_of("gspo", [1.0], 1.05, "algo.seq_clip=[0.1, 0.2]") == pytest.approx(-1.05)
    with pytest.raises(ConfigError, match="algo.seq_clip"):
        cfg_of("gspo", "algo.seq_clip=[0.1]")
    hacpo = cfg_of("hacpo", "algo.self_clip=[0.1, 0.3]", "optim.clip.eps_high=0.5")
    assert effective_clip(hacpo) == {"eps_low": 0.1, "eps_high": 0.3, "dual_clip_c": None, "ratio": "sequence"}
    assert clip_label(effective_clip(cfg_of("hacpo"))) == "0.0003/0.0004 seq"
    with pytest.raises(ConfigError, match="self_clip"):
        cfg_of("hacpo", "algo.seq_clip=[0.1, 0.3]")


def test_a_clip_under_algo_is_refused_naming_the_shared_key():
    """The clip is ``optim.clip``; a saved config that holds it under ``algo.*`` is refused in one line that names
    the key it belongs to (nothing reads the old layout)."""
    old = as_dict(cfg_of("dapo"))   # a run's config.yaml
    old["algo"].update(eps_low=0.2, eps_high=0.28, dual_clip_c=10.0)
    del old["optim"]["clip"]
    with pytest.raises(ConfigError, match=r"config key 'algo.eps_low' is 'optim.clip.eps_low'") as e:
        effective_clip(old)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------
# the grid: one clip per table
# ------------------------------------------------------------------------------------------------

def grid_file(tmp_path, variants, **extra):
    data = {"name": "c", "pairs": ["micro"], "seeds": [0, 1], "algorithms": ["grpo_n8"], "variants": variants,
            **extra}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_grid_refuses_mixed_clips_naming_the_cells(tmp_path):
    with pytest.raises(GridError) as e:
        load_grid(grid_file(tmp_path, [{"label": "GRAFT", "algo": "graft", "peer": "online"},
                                       {"label": "DAPO", "algo": "dapo"}]))
    msg = str(e.value)
    assert "\n" not in msg and "must share one clip" in msg and "pair 'micro'" in msg
    assert "0.2/0.2 in grpo-n8-micro-s{0,1}, graft-micro-s{0,1}" in msg
    assert "0.2/0.28 c=10 in dapo-micro-s{0,1}" in msg and "clip: own" in msg
    with pytest.raises(GridError, match=r"0.0003/0.0004 seq in hacpo-micro-s\{0,1\}"):
        load_grid(grid_file(tmp_path, [{"label": "HACPO", "algo": "hacpo", "peer": "online"}]))
    with pytest.raises(GridError, match="0.2/0.3 in graft-micro-s"):   # an override on one row
        load_grid(grid_file(tmp_path, [{"label": "GRAFT", "algo": "graft", "peer": "online",
                                        "set": {"optim.clip.eps_high": 0.3}}]))


def test_the_grid_accepts_a_marked_row_or_a_grid_wide_clip(tmp_path):
    grid = load_grid(grid_file(tmp_path, [{"label": "HACPO", "algo": "hacpo", "peer": "online", "clip": "own"},
                                          {"label": "DAPO", "algo": "dapo", "clip": "own"}]))
    clips = {c.name: (clip_label(c.clip), c.clip_own) for c in grid.cells}
    assert clips["grpo-n8-micro-s0"] == ("0.2/0.2", False)
    assert clips["hacpo-micro-s1"] == ("0.0003/0.0004 seq", True) and clips["dapo-micro-s0"] == ("0.2/0.28 c=10", True)
    # clip-higher as a shared, grid-wide choice: every row then trains with it
    grid = load_grid(grid_file(tmp_path, [{"label": "GRAFT", "algo": "graft", "peer": "online"},
                                          {"label": "DAPO", "algo": "dapo"}],
                               set={"optim": {"clip": {"eps_high": 0.28, "dual_clip_c": 10.0}}}))
    assert {clip_label(c.clip) for c in grid.cells} == {"0.2/0.28 c=10"}
    with pytest.raises(GridError, match="clip must be shared .* or own"):
        load_grid(grid_file(tmp_path, [{"label": "HACPO", "algo": "hacpo", "peer": "online", "clip": "mine"}]))


@pytest.mark.parametrize("path", [*sorted((CONFIGS / "grids").glob("*.yaml")), *sorted((CONFIGS / "demo").glob("*.yaml"))],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_shipped_grids_compare_under_one_clip(path):
    if path.name == "demo.yaml":  # the demo's modes, naming grid files of this folder (and grids to run after)
        for plan in yaml.safe_load(path.read_text()).values():
            assert find_config("demo", plan["grid"]) is not None
            assert all(find_config("grids", name) is not None for name in plan.get("also", []))
        return
    grid = load_grid(path)
    shared = {clip_label(c.clip) for c in grid.cells if not c.clip_own}
    assert shared == {"0.2/0.2"}, path
    assert all(c.algo == "hacpo" for c in grid.cells if c.clip_own), path


def test_dry_run_prints_each_cell_s_clip(tmp_path):
    spec = grid_file(tmp_path, [{"label": "HACPO", "algo": "hacpo", "peer": "online", "clip": "own"}])
    res = CliRunner().invoke(main, ["grid", str(spec), "--out", str(tmp_path / "out"), "--dry-run"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    at = lines.index("  [new] grpo-n8-micro-s0")
    assert lines[at + 1].strip() == "clip: 0.2/0.2"
    at = lines.index("  [new] hacpo-micro-s1")
    assert lines[at + 1].strip().startswith("clip: 0.0003/0.0004 seq  (clip: own")


# ------------------------------------------------------------------------------------------------
# the report: a clip column
# ------------------------------------------------------------------------------------------------

def make_run(root, name, variant, algo, seed, clip=None, legacy=None):
    cfg = cfg_of(algo)
    clip = ClipSection(**clip) if clip else cfg.optim.clip
    config = as_dict(with_values(cfg, {"run.name": name, "run.variant": variant, "run.seed": seed, "rollout.n": 8,
                                       "optim.clip": clip}))   # what the trainer writes as config.yaml
    assert config["pair"]["name"] == "micro"
    if legacy:   # a run saved before the clip moved to optim.clip
        del config["optim"]["clip"]
        config["algo"].update(legacy)
    write_config(root / name, config)
    write_eval(root / name, "m", {"model": "m", "step": 1, "benchmarks": {"arith": {"avg": 0.5, "k": 1, "n_items": 4}}})
    write_summary(root / name, make_summary(config, models=["m"], peers={"m": None}, status="done",
                                            compute=ComputeMeter(gpus=0).summary()))


def test_the_report_prints_each_row_s_clip(tmp_path):
    for s in (0, 1):
        make_run(tmp_path, f"grpo-s{s}", "GRPO (n=8)", "grpo", s)
        make_run(tmp_path, f"dapo-s{s}", "DAPO", "dapo", s)
    make_run(tmp_path, "gspo-s0", "GSPO", "gspo", 0)
    make_run(tmp_path, "old-s0", "Old", "grpo", 0, legacy={"eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": None})
    make_run(tmp_path, "mixed-s0", "Mixed", "grpo", 0)
    make_run(tmp_path, "mixed-s1", "Mixed", "grpo", 1, clip={"eps_low": 0.2, "eps_high": 0.3, "dual_clip_c": None})
    table = build_table1(load_runs([tmp_path]))
    rows = {r.method: r.clip for b in table.blocks for r in b.rows}
    assert rows == {"GRPO (n=8)": "0.2/0.2", "DAPO": "0.2/0.28 c=10", "GSPO": "0.0003/0.0004 seq",
                    "Old": "?", "Mixed": "0.2/0.2; 0.2/0.3"}   # a config the report cannot read: "?"
    md = to_markdown(table)
    assert "| Method | n | arith | Avg | Δ | Clip | Differs |" in md
    lines = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ")}
    assert lines["GRPO (n=8)"].endswith("| – | 0.2/0.2 |  |")
    # DAPO's clip-higher is the shared optim.clip: not like for like; GSPO clips with its own key, by design
    assert lines["DAPO"].endswith("| +0.0 | 0.2/0.28 c=10 | clip 0.2/0.28 c=10 vs 0.2/0.2 |")
    assert lines["GSPO"].endswith("| 0.0003/0.0004 seq |  |") and lines["Old"].endswith("| ? |  |")
    assert table.warnings == ["not like for like: rows differ in clip: DAPO 0.2/0.28 c=10, Mixed 0.2/0.2; 0.2/0.3 vs "
                              "GRPO (n=8) 0.2/0.2 (the Differs column of Table 1)"]
    assert "Clip: eps_low/eps_high" in md
    by_method = {r["method"]: r for r in csv.DictReader(io.StringIO(to_csv(table)))}
    assert by_method["DAPO"]["clip"] == "0.2/0.28 c=10" and by_method["GRPO (n=8)"]["clip"] == "0.2/0.2"
    tex = to_latex(table)
    assert r"& $\Delta$ & Clip & Differs \\" in tex and r"& 0.2/0.28 c=10 & clip 0.2/0.28 c=10 vs 0.2/0.2 \\" in tex
