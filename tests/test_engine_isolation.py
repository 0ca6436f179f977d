"""The vLLM engines keep out of the user's process (graftzoo.training.engines.isolation,
docs/reliability.md#engines-and-their-processes): ``graftzoo.train`` called from a script without an
``if __name__ == "__main__":`` guard, with the engine core in a process of its own, trains to the end while the
script's top level runs once; ``os.environ`` after each call equals ``os.environ`` before it; a start that the
engine core refuses in its own process names the engine core's own error; and no run leaves shared memory to
multiprocessing's resource tracker (its "leaked shared_memory" warning at exit). The script is a real Python session
in a subprocess; the refused start and a full run share it, so that the run after the refusal is also a second run
in the same process. The helpers' own cases (spawned children without the caller's main module from ``python -m``,
a heredoc and a kernel-like ``__main__``, the environment put back by its last holder, the cause read from vLLM's
output) run without vLLM."""
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from graftzoo.training.engines import isolation

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

ONE_MODEL = ["pair.train=[micro-qwen-char]", "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.0625",
             "rollout.vllm.multiprocessing=true", "run.track=false", "run.eval_at_start=false",
             "run.eval_at_end=false", "run.progress=false", "run.steps=1", "task.verifier_workers=1"]
TOO_SMALL = "rollout.vllm.kv_cache_gb=0.000001"  # the engine core finds no room for one KV block (its own check)
LEAK = "leaked shared_memory"

# a user's script, as the API's docstring shows it: no guard. Its top level appends a line to MARK each time it runs.
SCRIPT = """\
import json, os
with open({mark!r}, "a") as f:
    f.write("ran\\n")
import graftzoo
from graftzoo import train
from graftzoo.training.engines.engine import EngineError

report = {{}}
for name, extra in {runs!r}:
    before = dict(os.environ)
    try:
        result = train(pair="micro", algo="grpo", overrides={overrides!r} + extra, run_dir=os.path.join({out!r}, name))
        report[name] = {{"status": result.status, "steps": result.steps}}
    except EngineError as e:
        report[name] = {{"error": str(e)}}
    now = dict(os.environ)
    report[name]["env"] = {{k: [before.get(k), now.get(k)] for k in before.keys() | now.keys()
                           if before.get(k) != now.get(k)}}
print("REPORT " + json.dumps(report))
"""


def script(tmp_path, name: str, runs: list) -> tuple:
    """The script's text and the file its top level marks."""
    mark = tmp_path / f"{name}.ran"
    return SCRIPT.format(mark=str(mark), runs=runs, overrides=ONE_MODEL, out=str(tmp_path / name)), mark


def report(proc: subprocess.CompletedProcess) -> dict:
    lines = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("REPORT "):])


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """One Python session: an unguarded script run by path (a start the engine core refuses, then a run)."""
    tmp = tmp_path_factory.mktemp("sessions")
    text, file_mark = script(tmp, "file", [["refused", [TOO_SMALL]], ["trained", []]])
    path = tmp / "unguarded.py"
    path.write_text(text)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp, env=env, text=True, capture_output=True, timeout=600)
    return {"file": proc}, {"file": file_mark}


def test_an_unguarded_script_trains_with_its_engine_core_apart_and_runs_its_top_level_once(sessions):
    out, marks = sessions
    for name in out:
        got = report(out[name])
        assert got["trained"]["status"] == "done" and got["trained"]["steps"] == 1, (name, got)
        assert marks[name].read_text() == "ran\n", name  # never again in the engine core or its workers


def test_os_environ_after_train_equals_before(sessions):
    out, _ = sessions
    for name in out:
        for run, got in report(out[name]).items():
            assert got["env"] == {}, (name, run, got["env"])  # VLLM_*, LD_PRELOAD, LOCAL_WORLD_SIZE, ... put back


def test_no_run_leaves_shared_memory_behind(sessions):
    out, _ = sessions
    for name in out:  # the refused start's included: the engine core ends its worker mid-start
        assert LEAK not in out[name].stderr, (name, out[name].stderr[-3000:])


def test_a_start_the_engine_core_refuses_names_the_engine_cores_error(sessions):
    out, _ = sessions
    error = report(out["file"])["refused"]["error"]
    assert "vLLM could not start an engine" in error
    assert "ValueError: No available memory for the cache blocks" in error, error  # not only "initialization failed"
    assert "\n" not in error


# ---- the helpers, without vLLM ----------------------------------------------------------------------------------

SPAWNER = """\
import multiprocessing, os, sys
with open({mark!r}, "a") as f:
    f.write("ran\\n")
from graftzoo.training.engines.isolation import main_left_out
with main_left_out():
    child = multiprocessing.get_context("spawn").Process(target=os.getpid)
    child.start()
child.join()
sys.exit(child.exitcode)
"""


def test_spawned_children_leave_out_the_main_module_of_a_module_run_a_heredoc_and_a_kernel(tmp_path):
    """``python -m`` (the child would import the module by name), a heredoc (``python -``: the child would look for
    ``<stdin>`` as a file) and a notebook-like kernel (a ``__main__`` that its code was exec'd into, without
    ``__file__``): the child starts, and the top level ran once. (A script run by path, with vLLM: above.)"""
    (tmp_path / "unguarded_mod.py").write_text(SPAWNER.format(mark=str(tmp_path / "mod.ran")))
    kernel = textwrap.dedent(f"""\
        import sys, types
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec({SPAWNER.format(mark=str(tmp_path / "kernel.ran"))!r}, main.__dict__)
        """)
    heredoc = SPAWNER.format(mark=str(tmp_path / "heredoc.ran"))
    for cmd, mark, given in (([sys.executable, "-m", "unguarded_mod"], "mod.ran", None),
                             ([sys.executable, "-"], "heredoc.ran", heredoc),
                             ([sys.executable, "-c", kernel], "kernel.ran", None)):
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, input=given)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (tmp_path / mark).read_text() == "ran\n", cmd


def test_the_environment_is_put_back_by_its_last_holder(monkeypatch):
    monkeypatch.setenv("GZ_KEPT", "old")
    monkeypatch.delenv("GZ_NEW", raising=False)
    with isolation.environment_kept():  # graftzoo.train
        isolation.hold_environment()  # an engine
        before = dict(os.environ)
        os.environ["GZ_KEPT"] = "engine"
        os.environ["GZ_NEW"] = "engine"
        isolation.note_environment(before)
        os.environ["GZ_NEW"] = "later"
    assert os.environ["GZ_KEPT"] == "engine"  # the engine is still open
    isolation.release_environment()
    assert os.environ["GZ_KEPT"] == "old" and "GZ_NEW" not in os.environ


def test_the_cause_is_the_engine_processes_last_exception_line():
    tail = isolation.OutputTail()
    tail._lines.extend([
        "Process EngineCore:", "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
        "ValueError: No available memory for the cache blocks.",
        "(EngineCore pid=7) ERROR 12-06 05:13:59 [core.py:1510] ValueError: No available memory for the cache blocks.",
        "(EngineCore pid=7) ERROR 12-06 05:14:02 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
        "unexpectedly (exit code: None), shutting down executor.", ""])
    assert tail.cause() == "ValueError: No available memory for the cache blocks."
    assert isolation.error_line("graftzoo.training.run.rundir.RunLockedError: in use") == \
        "graftzoo.training.run.rundir.RunLockedError: in use"
    assert isolation.error_line("/x/dispatcher.py:138: FutureWarning: deprecated") is None


def test_vllm_finds_the_shared_memory_plugin_in_the_installed_package():
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("graftzoo_shared_memory") == "graftzoo.training.engines.isolation:register"


CREATOR = """\
import multiprocessing, os, signal, sys
from multiprocessing import shared_memory
from graftzoo.training.engines.guardian import start_time
from graftzoo.training.engines.isolation import release_shared_memory

def create(record, ready):  # what the plugin writes down for a ring buffer an engine process creates
    memory = shared_memory.SharedMemory(create=True, size=4096)
    with open(record, "a") as f:
        f.write(f"{{os.getpid()}} {{start_time(os.getpid())}} {{memory.name}}\\n")
    ready.set()
    signal.pause()

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=create, args=({record!r}, ready))
    child.start()
    ready.wait(60)
    name = open({record!r}).read().split()[2]
    removed = release_shared_memory({record!r}, grace=0.2)  # the creator still lives: it is ended first
    print("RELEASED", removed == [name], os.path.exists("/dev/shm/" + name), child.is_alive())
"""


def test_the_shared_memory_of_an_ended_creator_is_released_without_the_trackers_warning(tmp_path):
    path = tmp_path / "creator.py"
    path.write_text(CREATOR.format(record=str(tmp_path / "record")))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert "RELEASED True False False" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert LEAK not in proc.stderr, proc.stderr[-3000:]
