"""What a new user meets on a fresh clone, each fixed as a class and checked here as one, in this process and
without training (a run is a config.yaml and a checkpoint's manifest: what every command checks before it builds
a model):

- every command that reads a run takes it as an argument (``graftzoo eval RUN``) and as ``--ckpt RUN``, and a
  missing required input shows the command's usage line;
- a request that will be refused is refused before anything is computed or printed: an evaluation with a
  benchmark none of whose prompts fits a model's prompt budget (``--benchmarks all`` on the tiny pairs);
- every unknown name (command, algorithm, preset, pair, peer source, named value, config key, model, benchmark)
  gets the closest known one, a name that differs in case first;
- every key that has no effect in the run's setting says so once, one warning line at start
  (graftzoo.training.run.no_effect's table, each row checked);
- the Python API's errors say what to pass in its own words (``overwrite=True``, not ``--overwrite``), for every
  message of the layers below the command line that names an option;
- the README's algorithm table lists every registered algorithm, and .gitignore every folder its quick start
  writes.
"""
import ast
import importlib.util
import json
import logging
import re
import shlex
from pathlib import Path

import pytest

import graftzoo.api as api
from graftzoo.algos import BUILTIN
from graftzoo.apps.cli import main
from graftzoo.contract.config import as_dict, defaults, load_config
from graftzoo.eval.artifacts import write_config
from graftzoo.training.run.no_effect import NO_EFFECT, no_effect_lines
from graftzoo.training.run.rundir import RunDirUsageError
from helpers import cli_here, one_line_error

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")


def fake_run(folder: Path, *sets, pair: str = "micro", algo: str = "grpo") -> Path:
    """A run directory as the commands see it before they build a model: its config.yaml and one checkpoint's
    manifest (no weights)."""
    write_config(folder, as_dict(load_config(pair=pair, algo=algo, overrides=list(sets))))
    ckpt = folder / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text("{}")
    return folder


def leaf_commands(group=main, path=()):
    """(words, command) of every command of the CLI that runs something (its groups walked)."""
    ctx = group.make_context("graftzoo", [], resilient_parsing=True)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if hasattr(cmd, "list_commands"):
            yield from leaf_commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


# ------------------------------------------------------------------------------------------------
# a run as an argument; a missing input shows the usage line
# ------------------------------------------------------------------------------------------------

def test_every_command_that_reads_a_run_takes_it_as_an_argument_and_as_ckpt(tmp_path):
    readers = {words: cmd for words, cmd in leaf_commands() if any(p.name == "ckpt" for p in cmd.params)}
    assert {" ".join(w) for w in readers} == {"eval", "export"}
    for words, cmd in readers.items():
        argument = [p for p in cmd.params if p.param_type_name == "argument"]
        assert [p.human_readable_name for p in argument] == ["RUN"], words
    run = tmp_path / "run"
    write_config(run, as_dict(load_config(pair="micro", algo="grpo")))  # a run without a checkpoint: refused alike
    for words in readers:
        lines = {one_line_error(cli_here(*words, *form), 1, "no ") for form in ([run], ["--ckpt", run])}
        assert len(lines) == 1, lines   # the same refusal either way
    one_line_error(cli_here("eval", run, "--ckpt", tmp_path), 2, "two runs given")


def test_a_missing_required_input_shows_the_usage_line():
    checked = []
    for words, cmd in leaf_commands():
        if not any(p.required or p.name == "ckpt" for p in cmd.params):
            continue  # runs without arguments (demo, algos list, ...)
        res = cli_here(*words)
        assert res.returncode == 2 and "Missing" in res.stderr, (words, res.stderr)
        assert re.search(rf"^Usage: \S+ {' '.join(words)} ", res.stderr, re.M), (words, res.stderr)  # prog: main
        checked.append(" ".join(words))
    assert {"eval", "export", "report", "train", "plan", "grid"} <= set(checked), checked


# ------------------------------------------------------------------------------------------------
# refused before anything is computed
# ------------------------------------------------------------------------------------------------

def test_a_benchmark_that_no_prompt_of_fits_is_refused_before_anything_is_evaluated(tmp_path):
    """``all`` on the micro pair (128-token contexts, as the tiny pair's): no AIME24 problem fits either model's
    prompt budget. The whole request is refused before a model is loaded or a benchmark scored: no result row,
    no evaluation started, the benchmarks that do fit named."""
    run = fake_run(tmp_path / "run")
    res = cli_here("eval", run, "--benchmarks", "all", "--k", "1")
    line = one_line_error(res, 2, "benchmark 'aime24': none of its 30 prompts is within model 'micro-qwen-char''s "
                                  "prompt limit of 88 tokens or model 'micro-gpt2-pair''s prompt limit of 96 tokens")
    assert line.endswith("evaluate the others with --benchmarks math500,aime25,amc23,minerva_math"), line
    assert res.stdout == "" and "evaluating" not in res.stderr, (res.stdout, res.stderr)
    assert not (run / "eval").exists()


# ------------------------------------------------------------------------------------------------
# did you mean
# ------------------------------------------------------------------------------------------------

TRAIN = ["train", "--pair", "micro", "--algo", "grpo"]


@pytest.mark.parametrize("args,meant", [
    (["evl"], "'eval'"),                                                     # a command
    (["config", "shwo"], "'show'"),                                          # a subcommand
    (["train", "--algo", "GRAFT"], "'graft'"),                               # an algorithm, in capitals
    (["train", "--algo", "grpo_N8"], "'grpo_n8'"),                           # a preset
    (["train", "--algo", "grpo", "--pair", "TINY"], "'tiny'"),               # a pair
    (["train", "--algo", "graft", "--peer", "Online"], "'online'"),          # a peer source
    (TRAIN + ["--set", "peer.source=Online"], "'online'"),                   # a named value of a key
    (TRAIN + ["--set", "rollout.engine=VLLM"], "'vllm'"),
    (TRAIN + ["--set", "optim.LR=1e-5"], "'optim.lr'"),                      # a config key
    (["train", "--pair", "micro", "--algo", "graft", "--set", "algo.Delta=1"], "'algo.delta'"),
    (TRAIN + ["--set", "pair.train=[Micro-qwen-char]"], "'micro-qwen-char'"),   # a model
    (TRAIN + ["--set", "task.dataset=gsm8"], "'gsm8k'"),                     # a dataset
], ids=lambda x: x if isinstance(x, str) else " ".join(x[1:4]))
def test_every_unknown_name_gets_the_closest_known_one(args, meant):
    res = cli_here(*args)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert f"did you mean {meant}" in res.stderr, res.stderr


def test_unknown_benchmark_model_and_stored_peer_model_get_the_closest(tmp_path):
    run = fake_run(tmp_path / "run")
    one_line_error(cli_here("eval", run, "--benchmarks", "MATH500"), 2, "did you mean 'math500'?")
    one_line_error(cli_here("eval", run, "--model", "Micro-qwen-char"), 2, "did you mean 'micro-qwen-char'?")
    (run / "store").mkdir()
    (run / "store" / "meta.json").write_text(json.dumps({"models": {"micro-qwen-char": "char"}}))
    one_line_error(cli_here(*TRAIN, "--peer", f"stored:{run}", "--set", "peer.model=MICRO-qwen-char",
                            "--set", "pair.train=[micro-gpt2-pair]"), 2, "did you mean 'micro-qwen-char'?")


# ------------------------------------------------------------------------------------------------
# options without effect: one warning line each, at start
# ------------------------------------------------------------------------------------------------

VLLM = importlib.util.find_spec("vllm") is not None
# each row of NO_EFFECT: (overrides where its keys are idle, overrides where the same keys act)
CASES = {
    "rollout.max_staleness": (["rollout.max_staleness=1"],
                              ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.multiprocessing=true"]),
    "rollout.tis_cap": (["rollout.tis_cap=3"], ["rollout.tis_cap=3", "rollout.max_staleness=1",
                                                "rollout.engine=vllm", "rollout.vllm.multiprocessing=true"]),
    "rollout.vllm.*": (["rollout.vllm.kv_cache_gb=2", "rollout.vllm.max_num_seqs=8"],
                       ["rollout.vllm.kv_cache_gb=2", "rollout.vllm.max_num_seqs=8", "rollout.engine=vllm"]),
    "ray.*": (["ray.num_cpus=3"], ["ray.num_cpus=3", "run.backend=ray"]),
    "pair.models[].num_workers": (["pair.models=" + json.dumps([{"id": "m", "num_workers": 2}])],
                                  ["pair.models=" + json.dumps([{"id": "m", "num_workers": 2}]), "run.backend=ray"]),
    "ray.hf_split_generate": (["ray.hf_split_generate=true", "run.backend=ray", "rollout.engine=vllm"],
                              ["ray.hf_split_generate=true", "run.backend=ray"]),
    "peer.path": (["peer.path=runs/x"], ["peer.path=runs/x", "peer.source=stored"]),
    "peer.model": (["peer.model=m"], ["peer.model=m", "peer.source=stored", "peer.path=runs/x"]),
    "peer.align": (["peer.align=latest"], ["peer.align=latest", "peer.source=stored", "peer.path=runs/x"]),
    "peer.missing": (["peer.missing=skip"], ["peer.missing=skip", "peer.source=stored", "peer.path=runs/x"]),
    "peer.mix_ratio": (["peer.mix_ratio=0.5", "peer.source=stored", "peer.path=runs/x"],
                       ["peer.mix_ratio=0.5", "peer.source=mixed", "peer.path=runs/x"]),
    "xt.*": (["xt.overflow=error"], ["xt.overflow=error", "peer.source=online"]),
    "tracking.*": (["tracking.entity=me", "run.track=false"], ["tracking.entity=me"]),
    "run.wandb_project": (["run.wandb_project=p", "run.track=false"], ["run.wandb_project=p"]),
    "run.wandb_mode": (["run.wandb_mode=offline", "run.track=false"], ["run.wandb_mode=offline"]),
    "run.eval_every": (["run.eval_every=2", "run.steps=2"], ["run.eval_every=2", "run.steps=3"]),
}


def test_every_row_of_the_table_is_checked():
    assert set(CASES) == {row.keys for row in NO_EFFECT}


@pytest.mark.parametrize("keys", sorted(CASES))
def test_an_option_without_effect_is_said_once(keys):
    idle, acting = CASES[keys]
    if not VLLM and any("engine=vllm" in s for s in idle + acting):
        pytest.skip("the vllm package is not installed (rollout.engine=vllm is refused without it)")
    lines = no_effect_lines(load_config(pair="micro", algo="grpo", overrides=idle))
    row = keys.split("[]")[0] if "[]" in keys else keys.rstrip("*")
    assert len(lines) == 1 and lines[0].startswith(row), lines
    assert no_effect_lines(load_config(pair="micro", algo="grpo", overrides=acting)) == []


def test_the_shipped_pairs_and_presets_say_nothing():
    for pair in ("micro", "tiny", "quickstart", "pair1", "pair1-mini"):
        for algo in ("grpo", "grpo_n8", "dapo", "cispo"):
            assert no_effect_lines(load_config(pair=pair, algo=algo)) == [], (pair, algo)
        if pair != "quickstart":   # one model: no online peer
            assert no_effect_lines(load_config(pair=pair, algo="graft", overrides=["peer.source=online"])) == []


def test_rollouts_ahead_on_ray_overlap_only_with_rollout_workers_apart():
    """On Ray a model's ranks that decode and train take one call at a time: k >= 1 overlaps nothing there, said
    naming ray.rollout_workers; with rollout workers apart it overlaps (nothing said); rollout workers in one process
    have no effect."""
    ray = ["run.backend=ray", "rollout.max_staleness=1"]
    said = no_effect_lines(load_config(pair="micro", algo="grpo", overrides=ray))
    assert len(said) == 1 and "nothing overlaps here (ray.rollout_workers is 0" in said[0], said
    assert "ray.rollout_workers >= 1" in said[0]
    assert no_effect_lines(load_config(pair="micro", algo="grpo", overrides=[*ray, "ray.rollout_workers=1"])) == []
    alone = no_effect_lines(load_config(pair="micro", algo="grpo", overrides=["ray.rollout_workers=1"]))
    assert len(alone) == 1 and alone[0].startswith("ray.rollout_workers=1: ") and "run.backend" in alone[0], alone


class Started(Exception):
    """Raised by the stand-in trainer: the run would start here."""


def test_train_says_it_once_at_start_on_the_command_line_and_in_the_api(monkeypatch, caplog):
    def stand_in(*args, **kwargs):
        raise Started
    monkeypatch.setattr(api, "train_run", stand_in)
    res = cli_here(*TRAIN, "--set", "rollout.max_staleness=1", "--set", "run.progress=false")
    assert res.returncode == 1   # the stand-in's exception: the run would have started
    said = [line for line in res.stderr.splitlines() if "rollout.max_staleness=1" in line]
    assert len(said) == 1 and "nothing overlaps here (rollout.engine is hf" in said[0], res.stderr
    with caplog.at_level(logging.WARNING, logger="graftzoo"), pytest.raises(Started):
        api.train(algo="grpo", pair="micro", overrides={"rollout.max_staleness": 1, "ray.num_cpus": 2})
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["rollout.max_staleness=1", "ray.num_cpus=2"]
    assert not OPTION.search(caplog.text), caplog.text   # the API's words


# ------------------------------------------------------------------------------------------------
# the API's own words
# ------------------------------------------------------------------------------------------------

def test_the_api_says_what_to_pass_in_its_own_words(tmp_path):
    run = fake_run(tmp_path / "run")
    with pytest.raises(RunDirUsageError) as e:
        api.train(algo="grpo", pair="micro", run_dir=run, resume=False)
    said = str(e.value)
    assert "resume=False would mix" in said and "pass overwrite=True" in said, said
    assert 'overrides={"run.name": "NAME"}' in said and not OPTION.search(said), said
    with pytest.raises(RunDirUsageError) as e:   # resumed under another learning rate
        api.train(algo="grpo", pair="micro", run_dir=run, overrides={"optim.lr": 0.5})
    assert 'pass allow_config_change=["optim.lr"]' in str(e.value) and not OPTION.search(str(e.value)), e.value
    with pytest.raises(ValueError) as e:
        api.load_config(pair="micro", algo="graft")
    assert 'overrides={"peer.source": "online"}' in str(e.value) and not OPTION.search(str(e.value)), e.value


def test_the_api_logs_in_its_own_words_and_the_command_line_in_its_own(tmp_path, caplog):
    """A finished run rerun unchanged does nothing and says how to start it over: through the API in its words
    (``overwrite=True``), through the command line in its own (``--overwrite``); the record factory the API call
    used is put back after it."""
    sets = {"pair.train": ["micro-qwen-char"], "run.steps": 1, "run.eval_at_end": False, "run.progress": False,
            "task.prompts_per_step": 2}
    run = tmp_path / "run"
    assert api.train(algo="grpo", pair="micro", run_dir=run, track=False, overrides=sets).status == "done"
    factory = logging.getLogRecordFactory()
    with caplog.at_level(logging.WARNING, logger="graftzoo"):
        api.train(algo="grpo", pair="micro", run_dir=run, track=False, overrides=sets)
    said = [r.getMessage() for r in caplog.records if "nothing to do" in r.getMessage()]
    assert len(said) == 1 and "pass overwrite=True" in said[0] and not OPTION.search(said[0]), caplog.text
    assert logging.getLogRecordFactory() is factory
    res = cli_here(*TRAIN, "--run-dir", run, "--no-track", *[x for k, v in sets.items()
                                                            for x in ("--set", f"{k}={json.dumps(v)}")])
    assert res.returncode == 0 and "nothing to do" in res.stderr and "pass --overwrite" in res.stderr, res.stderr


def _messages(path: Path) -> list:
    """The string literals of a module that name a command-line option, f-strings rendered with stand-ins ('x' for a
    repr, 7 otherwise), docstrings left out (log lines included: an API call writes them in its words too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))   # a docstring
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)   # the pieces of an f-string: read with it
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else ("'x'" if v.conversion == ord("r") else "7")
                           for v in node.values)
        else:
            continue
        text = re.sub(r"python -m [\w.]+( --[\w-]+)*", "", text)   # a module's own command, valid as it is
        if OPTION.search(text):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {text}")
    return found


# the layers the API calls into; the command-only modules (graftzoo report's tables, graftzoo env check) apart
API_LAYERS = ("graftzoo/contract", "graftzoo/training", "graftzoo/distributed", "algos", "peers", "eval", "envs")
COMMAND_ONLY = ("eval/report.py", "envs/check.py")


def test_every_option_a_message_below_the_command_line_names_has_api_words():
    files = [f for root in API_LAYERS for f in sorted((REPO / root).rglob("*.py"))
             if str(f.relative_to(REPO)) not in COMMAND_ONLY]
    messages = [m for f in files for m in _messages(f)]
    assert len(messages) > 20, messages   # the scan finds them
    left = [(m, api.api_words(m.split(": ", 1)[1])) for m in messages]
    left = [(m, said) for m, said in left if OPTION.search(said)]
    assert not left, "\n".join(f"{m}\n  -> {said}" for m, said in left)


# ------------------------------------------------------------------------------------------------
# the README's algorithm table and the quick start's folders
# ------------------------------------------------------------------------------------------------

def test_the_readme_lists_every_registered_algorithm():
    section = README.read_text(encoding="utf-8").split("\n## Algorithms\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = [re.match(r"\| `([^`]+)`", line).group(1) for line in rows]
    assert sorted(listed) == sorted(BUILTIN), (listed, BUILTIN)


def test_gitignore_holds_every_folder_the_quick_start_writes():
    section = README.read_text(encoding="utf-8").split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```bash\n")[1:]]
    cmds = [shlex.split(line, comments=True) for b in blocks for line in b.splitlines()]
    outs = {c[i + 1] for c in cmds for i, a in enumerate(c[:-1]) if a in ("--out", "--run-dir")}
    written = {Path(p).parts[0] for p in outs} | {defaults()["run"]["out_dir"], "report"}   # report's default --out
    ignored = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()
               if line.strip().endswith("/") and "*" not in line}
    assert {"hf", "report", "runs"} <= written
    assert written <= ignored, written - ignored


def test_the_quick_start_reports_with_its_default_folder():
    """``graftzoo report``'s default --out is the folder the gitignore test assumes."""
    report = main.get_command(main.make_context("graftzoo", [], resilient_parsing=True), "report")
    assert next(p.default for p in report.params if p.name == "out_dir") == "report"
