"""The verifier's worker pool from the outside: it works from any kind of script (the workers never
import the caller's ``__main__``), caches timeouts, keeps a batch within its time budget, and leaves
no worker process behind (graftzoo.envs.verify_pool)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from graftzoo.envs import verifier as V
from graftzoo.envs import verify_pool as P

# A symbolic pair (not decided by the fast path: it needs the worker pool). The script has no
# `if __name__ == "__main__":` guard; it records each run of its body in the file $GZ_MARKER.
SCRIPT = textwrap.dedent("""\
    import os
    with open(os.environ["GZ_MARKER"], "a") as f:
        f.write("ran\\n")
    from graftzoo.envs import verify_pool
    from graftzoo.envs.verifier import verify
    r = verify("\\\\boxed{\\\\sqrt{8}}", "2\\\\sqrt{2}")
    print("VERDICT", r.correct, r.status, "pool" if verify_pool._POOL is not None else "no pool")
""")
SCRIPT_TIMEOUT_S = 120  # a hang (the old re-execution loop) fails the test instead of stalling it

PATHOLOGICAL = "9^{9^{9^9}}"  # sympy evaluates the power eagerly: never finishes


def _run_script(how, tmp_path):
    marker = tmp_path / "marker"
    env = dict(os.environ, GZ_MARKER=str(marker))
    kwargs = dict(capture_output=True, text=True, env=env, cwd=tmp_path, timeout=SCRIPT_TIMEOUT_S)
    if how == "file":
        (tmp_path / "score.py").write_text(SCRIPT)
        proc = subprocess.run([sys.executable, "score.py"], **kwargs)
    elif how == "module":
        pkg = tmp_path / "mods"
        pkg.mkdir()
        (pkg / "score_mod.py").write_text(SCRIPT)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pkg), env.get("PYTHONPATH")]))
        proc = subprocess.run([sys.executable, "-m", "score_mod"], **kwargs)
    elif how == "stdin":  # python - <<EOF
        proc = subprocess.run([sys.executable, "-"], input=SCRIPT, **kwargs)
    else:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], **kwargs)
    return proc, marker


@pytest.mark.parametrize("how", ["file", "module", "stdin", "command"])
def test_any_script_can_verify(how, tmp_path):
    """Unguarded file, ``python -m``, a heredoc on stdin and ``python -c``: the body runs once and
    the symbolic answer is scored by the pool."""
    proc, marker = _run_script(how, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "VERDICT True ok pool" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    assert marker.read_text().splitlines() == ["ran"], "the script body ran more than once"


# ---------------------------------------------------------------- timeouts and the batch budget


def _start_pool():
    assert V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}").status == "ok"


def test_timeouts_are_cached(sent):
    _start_pool()
    sent.clear()
    response = f"\\boxed{{{PATHOLOGICAL}}}"
    assert V.verify(response, "12", timeout=0.5) == V.VerifyResult(False, PATHOLOGICAL, "timeout", reason="timeout")
    assert len(sent) == 1
    assert V.verify_batch([response] * 3, ["12"] * 3, timeout=0.5) == [V.VerifyResult(False, PATHOLOGICAL, "timeout", reason="timeout")] * 3
    assert V.verify(response, "12", timeout=0.3).status == "timeout"  # a shorter timeout would time out too
    assert len(sent) == 1, "a cached timeout was computed again"
    # ... and in answer clustering
    assert V.answers_equivalent(PATHOLOGICAL, "12", timeout=0.5) is None
    assert V.answers_equivalent("12", PATHOLOGICAL, timeout=0.5) is None
    assert len(sent) == 2
    # a longer timeout than the one that ran out gets a new try
    assert V.verify(response, "12", timeout=0.8).status == "timeout"
    assert len(sent) == 3


def test_budget_bounds_a_batch_of_pathological_answers(sent):
    _start_pool()
    sent.clear()
    answers = [f"{PATHOLOGICAL}+{k}" for k in range(8)]
    responses = [f"\\boxed{{{a}}}" for a in answers] + ["\\boxed{\\sqrt{8}}"]
    golds = ["12"] * len(answers) + ["2\\sqrt{2}"]
    budget = 2.0
    t0 = time.monotonic()
    out = V.verify_batch(responses, golds, timeout=30.0, budget=budget)
    elapsed = time.monotonic() - t0
    assert elapsed <= budget + 3.0, f"a batch with a {budget} s budget took {elapsed:.1f} s"
    assert [r.status for r in out[:-1]] == ["timeout"] * len(answers)
    assert not any(r.correct for r in out[:-1])
    assert out[-1] == V.VerifyResult(True, "\\sqrt{8}", "ok")  # work done within the budget counts
    # the expired calls never had their 30 s: not cached, a later batch asks again
    assert all(V._cached(("verify", "12", V.normalize_answer(a), V.DEFAULT_OPTIONS, "12", None if V.normalize_answer(a) == a else a), 30.0) is None
               for a in answers)
    assert V._cached(("verify", "2\\sqrt{2}", "\\sqrt{8}", V.DEFAULT_OPTIONS, "2\\sqrt{2}", None), 30.0)[:2] == ("ok", True)
    # the pool still works (workers killed at the budget were replaced)
    assert V.verify("\\boxed{\\frac{3}{6}}", "0.5").correct
    assert V.verify("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", timeout=5.0) == V.VerifyResult(True, "\\sqrt{12}", "ok")


def test_budget_is_checked():
    with pytest.raises(ValueError, match="budget"):
        V.verify_batch(["\\boxed{1}"], ["1"], budget=0)
    with pytest.raises(ValueError, match="budget"):
        V.verify_batch(["\\boxed{1}"], ["1"], budget="30")


# ---------------------------------------------------------------- worker processes


def _state(pid):
    """The process state letter of ``pid`` (``Z``: zombie), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _worker_children(parent):
    """Live verifier workers whose parent is ``parent`` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z" and b"verify_worker" in cmdline:
            out.append(int(entry))
    return out


def _gone(pids, within_s):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(_state(pid) in (None, "Z") for pid in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_worker_left_after_close_pool():
    P.configure_pool(P.DEFAULT_WORKERS)  # an earlier test's environment may have sized the shared pool to its CPUs
    _start_pool()
    pids = {w.proc.pid for w in P._pool()._workers}
    assert set(_worker_children(os.getpid())) == pids and len(pids) == P.DEFAULT_WORKERS
    V.close_pool()
    assert _worker_children(os.getpid()) == []
    assert all(_state(pid) is None for pid in pids)  # exited and reaped, not zombies


DYING_PARENT = textwrap.dedent("""\
    import os, signal, sys, threading, time
    from graftzoo.envs import verify_pool as P
    from graftzoo.envs.verifier import verify
    assert verify("\\\\boxed{\\\\sqrt{3}}", "\\\\sqrt{2}").status == "ok"
    P.SOFT_TIMEOUT_FRACTION = 100.0  # the busy worker will not stop on its own
    threading.Thread(target=verify, args=("\\\\boxed{9^{9^{9^9}}}", "12"), kwargs={"timeout": 300}, daemon=True).start()
    time.sleep(1.0)
    print(" ".join(str(w.proc.pid) for w in P._pool()._workers), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_their_parent():
    """A parent killed with SIGKILL (no atexit) leaves no worker behind, not even a busy one."""
    proc = subprocess.run([sys.executable, "-c", DYING_PARENT], capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == P.DEFAULT_WORKERS
    assert _gone(pids, within_s=10.0), [(pid, _state(pid)) for pid in pids]


def test_start_up_failure_names_the_cause(monkeypatch, tmp_path):
    broken = tmp_path / "broken_worker.py"
    broken.write_text("import sys\nsys.stderr.write('ImportError: no module named math_verify_xyz\\n')\nsys.exit(3)\n")
    V.close_pool()
    V.clear_caches()
    monkeypatch.setattr(P, "WORKER_SCRIPT", str(broken))
    try:
        with pytest.raises(RuntimeError, match="math_verify_xyz") as err:
            V.verify("\\boxed{\\sqrt{3}}", "\\sqrt{2}")
        assert "exit code 3" in str(err.value) and "__main__" not in str(err.value)
    finally:
        V.close_pool()
