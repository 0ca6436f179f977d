"""Reports that go into a paper: `graftzoo report runs/` after the README's quick start and the demo.

The README's quick-start `train` lines run as written on the micro pair (the README's `tiny` there, as
tests/test_readme_usage.py does; a local pair file makes them cheap and sets the tiny pair's rollout.n, 8), next to
two runs as `make demo` makes them (the grpo_n8 preset's "GRPO (n=8)" and a "GRAFT" label, in runs/demo, another run
length). The micro pair learns nothing in a step, so the scores in the eval files are then set by hand: the table has
a Δ to show. Then `graftzoo report runs/`: Δ in every block with a GRPO (n=8) row, one label per method in the table
and the figures, the GRAFT run's learning rate in the Differs column, figures in the table's units with every run
told apart, captions beside the images, and a table1.tex that compiles on its own."""
import csv
import io
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import matplotlib.colors as mcolors
import pytest
import yaml
from click.testing import CliRunner
from matplotlib.figure import Figure

from graftzoo.apps.cli import main
from graftzoo.contract.config import MODEL_RUN_KEYS, packaged_configs, read_yaml
from graftzoo.eval.artifacts import load_runs, write_config
from graftzoo.eval.report import (HOSTING_MODEL_KEYS, LATEX_PACKAGES, TRAJECTORY_FREE, _MODEL_RUN_KEYS, build_table1,
                                  compare_settings, short_heading, to_latex, to_markdown)
from graftzoo.training.run import rundir
from test_like_for_like import _run as run_with_settings
from test_report import A, B, make_run

README = Path(__file__).resolve().parents[1] / "README.md"
# what makes the runs cheap goes into the local pair file (a --set would add a hash to the README's run names)
CHEAP_PAIR = {"task": {"prompts_per_step": 2}, "optim": {"minibatches": 1}, "rollout": {"n": 8},
              "eval": {"size": 4, "k": 1}, "run": {"steps": 1, "progress": False, "save_every": 0}}
DEMO = [  # the demo's runs: the grpo_n8 preset (label "GRPO (n=8)") and a labelled GRAFT, in runs/demo, 2 steps
    ["train", "--algo", "grpo_n8", "--pair", "micro", "--set", "run.out_dir=runs/demo", "--set", "run.steps=2"],
    ["train", "--algo", "graft", "--pair", "micro", "--peer", "online", "--set", "run.variant=GRAFT",
     "--set", "run.out_dir=runs/demo", "--set", "run.steps=2"],
]
# held-out score set by hand per run folder (the micro pair scores 0 after a step): (add, mul), the same for both
# models; a second seed of the CLI's GRPO is 2 points higher
SCORES = {"grpo-micro-s0": (0.30, 0.20), "grpo-micro-s1": (0.32, 0.22), "graft-micro-online": (0.40, 0.30),
          "stored": (0.36, 0.26), "demo/grpo": (0.50, 0.40), "demo/graft": (0.55, 0.45)}


def quick_start_trains() -> list:
    """The README quick start's `train` lines on the tiny pair, as argument lists, on the micro pair."""
    section = README.read_text().split("\n## Quick start\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    cmds = [shlex.split(line, comments=True) for line in block.splitlines()]
    trains = [c[1:] for c in cmds if c[:2] == ["graftzoo", "train"] and c[c.index("--pair") + 1] == "tiny"]
    return [[a.replace("tiny", "micro") for a in c] for c in trains]


def _score(run_dir: Path) -> tuple:
    rel = run_dir.relative_to(run_dir.parents[1] if run_dir.parent.name == "demo" else run_dir.parent).as_posix()
    return next(v for k, v in SCORES.items() if rel.startswith(k) or (k == "stored" and "stored" in rel))


def _set_scores(run_dir: Path) -> None:
    """The eval files' and metrics.jsonl's held-out scores of ``run_dir`` set to ``SCORES``."""
    add, mul = _score(run_dir)
    for path in (run_dir / "eval").glob("*.json"):
        ev = json.loads(path.read_text())
        ev["benchmarks"]["add"]["avg"], ev["benchmarks"]["mul"]["avg"] = add, mul
        path.write_text(json.dumps(ev))
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec.get("eval/avg") is not None:
            rec["eval/avg"] = (add + mul) / 2
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """The quick start's runs (and the demo's), then `graftzoo report runs/ --out report/`: (folder, result, the
    figures saved by file path)."""
    root = tmp_path_factory.mktemp("quick")
    micro = read_yaml(packaged_configs() / "pairs" / "micro.yaml")
    for section, values in CHEAP_PAIR.items():
        micro[section] = {**(micro.get(section) or {}), **values}
    (root / "configs" / "pairs").mkdir(parents=True)
    (root / "configs" / "pairs" / "micro.yaml").write_text(yaml.safe_dump(micro))
    trains = quick_start_trains()
    assert [c[1:3] for c in trains] == [["--algo", "grpo"], ["--algo", "graft"], ["--algo", "graft"]], trains
    second_seed = trains[0] + ["--set", "run.seed=1"]   # two seeds of the CLI's GRPO: runs of one row told apart
    saved = {}
    savefig = Figure.savefig

    def spy(self, fname, *args, **kwargs):
        saved[Path(fname).resolve().relative_to((root / "report").resolve()).as_posix()] = self
        return savefig(self, fname, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for args in trains + [second_seed] + DEMO:
            res = CliRunner().invoke(main, args + ["--no-track"])
            assert res.exit_code == 0, f"{shlex.join(args)}\n{res.output[-3000:]}\n{res.exception!r}"
        for summary in (root / "runs").rglob("summary.json"):
            _set_scores(summary.parent)
        mp.setattr(Figure, "savefig", spy)
        res = CliRunner().invoke(main, ["report", "runs/", "--out", "report/"])
    assert res.exit_code == 0, res.output[-3000:]
    return root, res, saved


def _blocks(md: str) -> list:
    """(title, [row lines], note) of each block of a Table 1 markdown."""
    out = []
    for chunk in re.split(r"^\*\*(.+)\*\*$", md, flags=re.M)[1:]:
        if out and out[-1][1] is None:
            out[-1] = (out[-1][0], chunk)
        else:
            out.append((chunk, None))
    blocks = []
    for title, text in out:
        rows = [x for x in text.splitlines() if x.startswith("| ") and not x.startswith(("| Method", "| ---"))]
        note = next((x for x in text.splitlines() if x.startswith("_No ")), None)
        blocks.append((title, rows, note))
    return blocks


def _row_label(line: str) -> str:
    return line.split(" | ")[0][2:]


def test_quick_start_report_has_one_label_per_method_and_a_delta_in_every_block(quick_report):
    root, res, _ = quick_report
    md = (root / "report" / "table1.md").read_text()
    assert "2 groups of runs differ in run.steps" in res.stderr   # the demo's 2 steps, the quick start's 1
    blocks = _blocks(md)
    assert len(blocks) == 4, [b[0] for b in blocks]   # per group, a block per model
    for title, rows, note in blocks:
        labels = [_row_label(x) for x in rows]
        assert any(x.startswith("GRPO (n=8)") for x in labels) and note is None, (title, labels, note)
        for line in rows:   # every row but the baseline row has its Δ against it
            delta = line.split(" | ")[-3 if "| Differs |" in md else -2]
            assert (delta == "–") == (line is rows[0] or _row_label(line) == "GRPO (n=8) [demo]"), (title, line)
    assert "grpo (n=8)" not in [_row_label(x) for _, rows, _ in blocks for x in rows]   # one spelling per method
    assert "One label per method" in md and "GRPO (n=8) (runs labelled grpo (n=8))" in md
    assert "No grpo" not in md and "No GRPO" not in md
    # the README's GRAFT line trains at lr 5e-5, the baseline at the pair's 1e-4: said in its row and on stderr
    graft = [x for _, rows, _ in blocks for x in rows if _row_label(x) == "graft (n=8)"]
    assert len(graft) == 2 and all(x.endswith("| optim.lr 5e-05 vs 0.0001 |") for x in graft), graft
    assert "not like for like: rows differ in optim.lr: graft (n=8) 5e-05 vs GRPO (n=8) 0.0001" in res.stderr
    rows = list(csv.DictReader(io.StringIO((root / "report" / "table1.csv").read_text())))
    assert {r["differs"] for r in rows if r["method"] == "graft (n=8)"} == {"optim.lr 5e-05 vs 0.0001"}
    # the stored run's peer folder and trained models are its own: not a difference; the two seeds are one row
    assert {r["differs"] for r in rows if r["method"] == "graft (n=8, stored peer)"} == {""}
    assert {r["seeds"] for r in rows if r["method"] == "GRPO (n=8)" and r["group"] == "steps 1"} == {"0 1"}


def test_quick_start_figures_name_the_table_rows_in_its_units(quick_report):
    root, _, saved = quick_report
    md = (root / "report" / "table1.md").read_text()
    report = (root / "report" / "report.md").read_text()
    table_labels = {_row_label(x) for _, rows, _ in _blocks(md) for x in rows}
    folders = sorted({p.parent for p in (root / "report").rglob("figures.json")})
    assert [f.name for f in folders] == ["steps-1", "steps-2"]
    for folder in folders:
        figures = json.loads((folder / "figures.json").read_text())
        assert [f["path"] for f in figures] == ["score_vs_compute.png", "fractions.png", "learning_curve.png",
                                                "complementarity.png"]
        for f in figures:
            assert f["labels"] and set(f["labels"]) <= table_labels, (folder.name, f["path"], f["labels"])
            assert f"![{f['title']}]({folder.name}/{f['path']})" in report and f["caption"] in report
            fig = saved[f"{folder.name}/{f['path']}"]
            assert not fig.texts   # the caption is beside the image, not in it
            legend = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
            legend += [t.get_text() for lg in fig.legends for t in lg.get_texts()]
            if f["path"] == "complementarity.png":  # a heat map per row: the row's label is its panel's title
                legend = [ax.get_title() for ax in fig.axes if ax.get_title()]
            assert {x.split(": ")[0] for x in legend if not x.startswith("run of seed")} == set(f["labels"])
        curve = next(f for f in figures if f["path"] == "learning_curve.png")
        fig = saved[f"{folder.name}/learning_curve.png"]
        heldout = [ax for ax in fig.axes if "held-out" in ax.get_ylabel()]
        assert heldout and all("x100" in ax.get_ylabel() for ax in heldout)
        ys = [y for ax in heldout for ln in ax.lines for y in ln.get_ydata()]
        assert max(ys) > 20   # points, as the table: 25 to 50 here, not 0.25 to 0.5
        # each run is told apart: the two seeds of the CLI's GRPO in two colours and dashes, neither the row's own
        runs = [s for s in curve["series"] if s["seed"] is not None]
        if folder.name == "steps-1":
            grpo = [s for s in runs if s["label"] == "GRPO (n=8)" and s["model"] == "micro-qwen-char"]
            mean = next(s for s in curve["series"] if s["label"] == "GRPO (n=8)" and s["seed"] is None)
            assert len({(s["color"], s["linestyle"]) for s in grpo}) == 2 and mean["color"] not in {
                s["color"] for s in grpo}
            assert any(t.startswith("run of seed 1") for lg in fig.legends for t in [x.get_text() for x in lg.get_texts()])
        styles = {(s["label"], s["color"]) for s in curve["series"] if s["seed"] is None}
        assert len({c for _, c in styles}) == len(styles)   # one colour per row of the table


def _latex_problems(tex: str) -> list:
    """What keeps ``tex`` from compiling standalone, by a LaTeX parser (pylatexenc): unbalanced environments or
    braces, a command that neither LaTeX nor a package the document loads defines."""
    from pylatexenc.latexwalker import (LatexEnvironmentNode, LatexGroupNode, LatexMacroNode, LatexMathNode,
                                        LatexWalker)

    latex = {"documentclass", "usepackage", "begin", "end", "centering", "caption", "label", "textbf", "textit",
             "multicolumn", "dag", "ddag", "ldots", "textbackslash", "textasciitilde", "pm", "cdot", "Delta", "times",
             "leq", "geq", "rightarrow", "dagger", "ddagger", "linewidth", "textwidth", "ifdim", "else", "fi",
             "raggedright", "textless", "textgreater", "textbar", "ss", "ae", "AE", "o", "O", "oe", "OE", "l", "L",
             "i", "\\", "&", "%", "_", "#", "$", "{", "}", "^", "'", "`", "~", "=", '"', "r", "v", "c"}
    packages = {"booktabs": {"toprule", "midrule", "bottomrule"}, "graphicx": {"resizebox", "width"},
                "array": {"arraybackslash"}}
    loaded = set(re.findall(r"\\usepackage(?:\[[^\]]*\])?\{([^}]*)\}", tex))
    known = latex | {m for p in loaded for m in packages.get(p, set())}
    problems = [f"\\begin{{{env}}} x{tex.count(chr(92) + 'begin{' + env + '}')} but \\end x"
                f"{tex.count(chr(92) + 'end{' + env + '}')}" for env in set(re.findall(r"\\begin\{(\w+)\}", tex))
                if tex.count("\\begin{" + env + "}") != tex.count("\\end{" + env + "}")]
    try:
        nodes, _, _ = LatexWalker(tex, tolerant_parsing=False).get_latex_nodes()
    except Exception as e:   # pylatexenc's parse error: unbalanced braces or environments
        return problems + [f"parse error: {e}"]
    seen = set()

    def walk(node_list):
        for node in node_list or []:
            if isinstance(node, LatexMacroNode):
                seen.add(node.macroname)
                if node.nodeargd is not None:
                    walk([a for a in node.nodeargd.argnlist if a is not None])
            if isinstance(node, LatexEnvironmentNode):
                seen.add("begin")
                walk(node.nodelist)
                if node.nodeargd is not None:
                    walk([a for a in node.nodeargd.argnlist if a is not None])
            if isinstance(node, (LatexGroupNode, LatexMathNode)):
                walk(node.nodelist)

    walk(nodes)
    return problems + [f"\\{m}: defined by no loaded package" for m in sorted(seen - known)]


def _check_compiles(tex: str, tmp_path: Path) -> None:
    """``tex`` compiles standalone: by pdflatex where it is installed, else by ``_latex_problems``."""
    assert {p for p, *_ in LATEX_PACKAGES} <= set(re.findall(r"\\usepackage(?:\[[^\]]*\])?\{([^}]*)\}", tex))
    assert _latex_problems(tex) == []
    if shutil.which("pdflatex"):
        (tmp_path / "t.tex").write_text(tex, encoding="utf-8")
        res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and (tmp_path / "t.pdf").is_file(), res.stdout[-3000:]


def test_quick_start_table1_tex_compiles_on_its_own(quick_report, tmp_path):
    root, _, _ = quick_report
    tex = (root / "report" / "table1.tex").read_text()
    assert tex.lstrip().startswith("%") and r"\documentclass" in tex and tex.rstrip().endswith(r"\end{document}")
    assert "% BEGIN TABLE" in tex and r"\resizebox" in tex and r"optim.lr 5e-05 vs 0.0001" in tex
    _check_compiles(tex, tmp_path)


def test_the_latex_check_finds_what_does_not_compile():
    good = to_latex_sample()
    assert _latex_problems(good) == []
    assert any("begin{tabular}" in p for p in _latex_problems(good.replace(r"\end{tabular}", "", 1)))
    assert _latex_problems(good.replace(r"\usepackage{booktabs}", "")) == [
        "\\bottomrule: defined by no loaded package", "\\midrule: defined by no loaded package",
        "\\toprule: defined by no loaded package"]


def to_latex_sample(tmp_root=None) -> str:
    return ("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n\\begin{tabular}{ll}\n\\toprule\n"
            "a & b \\\\\n\\midrule\nc & d \\\\\n\\bottomrule\n\\end{tabular}\n\\end{document}\n")


# ---------------------------------------------------------------- hand-made runs: the rules one at a time

PAIR = [{"id": A, "kind": "tiny"}, {"id": B, "kind": "tiny"}]


def _run(root, name, variant, seed, n, scores, peers, source=None, models=None, **settings):
    """``test_like_for_like._run`` (a hand-made run whose config holds ``settings``) with, given ``models``, those
    ``pair.models`` entries (a run with a peer: both models, as a trained run's config)."""
    run_dir = run_with_settings(root, name, variant, seed, n, scores, peers, source=source, **settings)
    models = PAIR if models is None and source else models
    if models is not None:
        raw = yaml.safe_load((run_dir / "config.yaml").read_text())
        raw["pair"]["models"] = models
        write_config(run_dir, raw)
    return run_dir


def test_every_setting_that_changes_training_is_compared(tmp_path):
    """Learning rate (the run's, or a model's own in the pair file), clip, max_new_tokens, temperature, the model
    itself: each in the Differs column with its values; the algorithm's own keys (GRAFT's gate) and the stored peer's
    folder are the method, not a difference."""
    single, live = {A: None}, {A: B}
    for s in (0, 1):
        _run(tmp_path, f"g8-s{s}", "GRPO (n=8)", s, 8, {A: (0.3, 0.2)}, single)
    _run(tmp_path, "lr", "GRAFT", 0, 8, {A: (0.4, 0.3)}, live, source="live", optim__lr=5e-5)
    _run(tmp_path, "own-lr", "SGT", 0, 8, {A: (0.4, 0.3)}, live, source="live",
         models=[{"id": A, "kind": "tiny", "lr": 2e-5}, {"id": B, "kind": "tiny"}])
    _run(tmp_path, "gate", "GRAFT w/o gate", 0, 8, {A: (0.4, 0.3)}, live, source="live", algo__delta=0.0)
    _run(tmp_path, "tokens", "RLOO", 0, 8, {A: (0.4, 0.3)}, single, rollout__max_new_tokens=64,
         rollout__temperature=0.7, optim__clip={"eps_high": 0.28})
    _run(tmp_path, "bigger", "Dr. GRPO", 0, 8, {A: (0.4, 0.3)}, single, models=[{"id": A, "kind": "tiny", "hidden": 128}])
    runs = load_runs([tmp_path])
    rows = {r.method: r for r in build_table1(runs).blocks[0].rows}
    assert rows["GRAFT"].differs == {"optim.lr": "0.0001"} and rows["GRAFT"].settings["optim.lr"] == "5e-05"
    assert rows["SGT"].differs == {"optim.lr": "0.0001"} and rows["SGT"].settings["optim.lr"] == "2e-05"
    assert rows["GRAFT w/o gate"].differs == {}
    assert rows["RLOO"].differs == {"clip": "0.2/0.2", "rollout.max_new_tokens": "48", "rollout.temperature": "1"}
    assert rows["Dr. GRPO"].differs == {f"pair.models[{A}].hidden": "–"}
    md = to_markdown(build_table1(runs))
    assert "| GRAFT | 8 | 40.0 | 30.0 | 35.0 | +10.0 | 0.2/0.2 | optim.lr 5e-05 vs 0.0001 |" in md
    assert "| RLOO | 8 | 40.0 | 30.0 | 35.0 | +10.0 | 0.2/0.28 | clip 0.2/0.28 vs 0.2/0.2; rollout.max_new_tokens 64 " \
           "vs 48; rollout.temperature 0.7 vs 1 |" in md
    assert "optim.lr" in compare_settings(runs[0], A) and not any(k.startswith(("algo.", "peer.", "run.seed"))
                                                                  for k in compare_settings(runs[0], A))


def test_runs_of_one_label_but_two_methods_are_two_rows(tmp_path):
    """Under the trainer's default label, GRAFT runs with another gate (algo.delta) are another method: a row of
    their own, tagged with it, its gate not a difference. Runs of one method at two learning rates stay one row, both
    rates said in its Differs cell."""
    _run(tmp_path, "g8", "grpo (n=8)", 0, 8, {A: (0.3, 0.2)}, {A: None})
    for s, lr in ((0, 1e-4), (1, 5e-5)):
        _run(tmp_path, f"graft-{s}", "graft (n=8)", s, 8, {A: (0.4, 0.3)}, {A: B}, source="live", optim__lr=lr)
    _run(tmp_path, "graft-gate", "graft (n=8)", 0, 8, {A: (0.4, 0.3)}, {A: B}, source="live", algo__delta=0.0)
    table = build_table1(load_runs([tmp_path]))
    rows = {r.label: r for r in table.blocks[0].rows}
    assert list(rows) == ["GRPO (n=8)", "graft (n=8) [algo.delta 0]", "graft (n=8) [algo.delta 0.8]"]
    assert rows["graft (n=8) [algo.delta 0]"].differs == {} and rows["graft (n=8) [algo.delta 0]"].seeds == [0]
    mixed = rows["graft (n=8) [algo.delta 0.8]"]
    assert mixed.seeds == [0, 1] and mixed.differs == {"optim.lr": "0.0001"}
    assert "optim.lr 0.0001; 5e-05 vs 0.0001" in to_markdown(table)
    assert set(table.labels.values()) == set(rows)


def test_the_report_mirrors_the_trainers_trajectory_keys():
    """The report compares what a resume may not change (FREE_TO_CHANGE, one tuple for both) and a model's own keys
    as the config resolves them."""
    assert TRAJECTORY_FREE is rundir.FREE_TO_CHANGE
    assert HOSTING_MODEL_KEYS is rundir.HOSTING_MODEL_KEYS
    assert _MODEL_RUN_KEYS == {k: v for k, v in MODEL_RUN_KEYS.items() if k not in HOSTING_MODEL_KEYS}


def test_long_headings_are_shortened_and_odd_characters_still_compile(tmp_path):
    """Benchmark headings of a paper's width (the caption spells out the shortened ones); labels with LaTeX's
    special characters, accents and symbols outside ASCII (the document stays ASCII: no encoding package, a
    character LaTeX has no command for a "?"); the fragment for a paper of one's own."""
    run = make_run(tmp_path, "x", "GRPO (n=8)", 0, 8, {A: (0.3, 0.2)}, {A: None})
    ev = json.loads((run / "eval" / f"{A}.json").read_text())
    ev["benchmarks"] = {"minerva_math": {"avg": 0.1}, "olympiadbench": {"avg": 0.2}, "some_long_benchmark": {"avg": 0.3}}
    (run / "eval" / f"{A}.json").write_text(json.dumps(ev))
    make_run(tmp_path, "y", "GRAFT & co → 100% ü_x# <b> ☃", 0, 8, {A: (0.3, 0.2)}, {A: B}, source="live")
    ev2 = json.loads((tmp_path / "y" / "eval" / f"{A}.json").read_text())
    ev2["benchmarks"] = ev["benchmarks"]
    (tmp_path / "y" / "eval" / f"{A}.json").write_text(json.dumps(ev2))
    table = build_table1(load_runs([tmp_path]))
    tex = to_latex(table)
    assert [short_heading(b) for b in table.benchmarks] == ["Minerva", "Olympiad", "some_lon."]
    assert "Columns: Minerva = minerva\\_math, Olympiad = olympiadbench, some\\_lon. = some\\_long\\_benchmark." in tex
    assert r"GRAFT \& co $\rightarrow$ 100\% \"{u}\_x\# <" not in tex and tex.isascii()
    assert r"GRAFT \& co $\rightarrow$ 100\% \"{u}\_x\# \textless{}b\textgreater{} ?" in tex
    _check_compiles(tex, tmp_path)
    assert to_latex(table, standalone=False) in tex
