"""The warmed-up tiny models ship with the package (graftzoo.tiny.shipped, docs/guide.md#shipped-tiny-weights): every
machine starts the demo and the quick start from the same weights.

- every shipped file matches the manifest's sha256 (``python -m graftzoo.tiny.rebuild --check``);
- the tiny pair and the quick start's model load from the shipped folders with an empty cache, through the trainer's
  own model building, without a warm-up step; a spec of another recipe (another seed) is not served them;
- a shipped file changed or missing is an error naming it, through ``graftzoo train``, never a silent warm-up.

A rebuild on this machine (``python -m graftzoo.tiny.rebuild``: minutes) is measured by hand; its figures are
in docs/results.md."""
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from graftzoo.contract.config import load_config
from graftzoo.tiny import rebuild, shipped, warmup
from graftzoo.training.planner.build import build_policy, tiny_spec
from helpers import cli_here, one_line_error

SHIPPED = ("tiny-qwen-char", "tiny-gpt2-pair")


def test_every_shipped_file_matches_its_hash(capsys):
    assert set(shipped.manifest()) == set(SHIPPED)
    assert rebuild.main(["--check"]) == 0
    out = capsys.readouterr().out
    for m in SHIPPED:
        assert f"{m}: {shipped.weights_hash(shipped.WEIGHTS_DIR / m)[:12]} ok" in out


@pytest.fixture
def no_warmup(monkeypatch, tmp_path):
    """An empty cache, and a warm-up that fails the test if it starts."""
    monkeypatch.setenv("GRAFTZOO_CACHE", str(tmp_path / "cache"))

    def refuse(*a, **kw):
        raise AssertionError("a warm-up started")
    monkeypatch.setattr(warmup, "sft_train", refuse)


def test_the_demo_and_quick_start_models_load_the_shipped_weights(no_warmup, tmp_path):
    for pair in ("tiny", "quickstart"):
        cfg = load_config(pair=pair, algo="grpo", overrides=["run.track=false"])
        for spec in cfg.pair.models:
            pol = build_policy(spec, cfg)
            want = load_file(str(shipped.WEIGHTS_DIR / spec.id / shipped.MODEL_FILE))
            got = pol.model.state_dict()
            assert all(torch.equal(got[k], v) for k, v in want.items()), (pair, spec.id)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("tiny-*"))


def test_another_recipe_is_not_served_the_shipped_weights():
    cfg = load_config(pair="tiny", algo="grpo", overrides=["run.track=false"])
    spec = tiny_spec(cfg.pair.models[0])
    assert shipped.shipped_path(spec.to_dict(), spec.warmup.seed) == shipped.WEIGHTS_DIR / spec.id
    assert shipped.shipped_path({**spec.to_dict(), "id": "renamed"}, spec.warmup.seed) is not None  # the id is a name
    assert shipped.shipped_path(spec.to_dict(), spec.warmup.seed + 1) is None
    other = replace(spec, warmup=replace(spec.warmup, lr=spec.warmup.lr * 2))
    assert shipped.shipped_path(other.to_dict(), spec.warmup.seed) is None


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_a_damaged_shipped_file_is_an_error_naming_it(no_warmup, tmp_path, monkeypatch, damage):
    copy = tmp_path / "weights"
    shutil.copytree(shipped.WEIGHTS_DIR, copy)
    monkeypatch.setattr(shipped, "WEIGHTS_DIR", copy)
    monkeypatch.setattr(shipped, "MANIFEST", copy / "manifest.json")
    shipped.verified.cache_clear()
    target = copy / "tiny-qwen-char" / shipped.MODEL_FILE
    if damage == "changed":
        data = bytearray(target.read_bytes())
        data[-1] ^= 1
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    try:
        res = cli_here("train", "--algo", "grpo", "--pair", "quickstart", "--no-track", "--set",
                       f"run.out_dir={tmp_path / 'runs'}", "--set", "run.steps=1")
    finally:
        shipped.verified.cache_clear()
    one_line_error(res, 1, str(target), "reinstall graftzoo", "python -m graftzoo.tiny.rebuild")
