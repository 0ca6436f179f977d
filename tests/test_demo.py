"""`graftzoo demo --quick` end to end: warm-up, complementarity, GRPO / GRAFT / stored GRAFT runs, report, plots."""
import json
import os
import subprocess
import sys


def test_demo_quick_runs_the_whole_pipeline(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", COLUMNS="120")
    out = subprocess.run([sys.executable, "-m", "graftzoo.apps.cli", "demo", "--quick", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    root = tmp_path / "quick"
    comp = json.loads((root / "complementarity.json").read_text())
    assert set(comp) == {"micro-qwen-char", "micro-gpt2-pair"}
    assert all(0.0 <= c["all_fail_frac"] <= 1.0 for c in comp.values())
    rep = root / "report"
    for f in ("table1.md", "table1.csv", "table1.tex", "clip_table.md", "score_vs_compute.png", "fractions.png",
              "conclusion.txt"):
        assert (rep / f).stat().st_size > 0, f
    table = (rep / "table1.md").read_text()
    for label in ("GRPO (n=8)", "GRAFT", "GRAFT (stored)"):
        assert label in table
    assert "GRAFT n=8 scores" in (rep / "conclusion.txt").read_text()
    runs = [d for d in root.iterdir() if (d / "summary.json").exists()]
    assert len(runs) == 4
    assert all(json.loads((d / "summary.json").read_text())["status"] == "done" for d in runs)
    assert all(list(d.glob("wandb/offline-run-*")) for d in runs)
    stored = [json.loads((d / "summary.json").read_text()) for d in runs if "stored" in d.name]
    assert all(s["peer_source"] == "stored" for s in stored)
    assert "what the numbers show" in out.stdout
