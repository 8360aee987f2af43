"""tests/forked.py stands in for a subprocess in run_algorithm and stop_run: it must give the same run, to the bit, the
same output and the same exit, or every test that uses it would check something other than what a user runs."""

import re
import signal
import time

import forked as forked_runs
import pytest

from conftest import CPU, ROOT, run_algorithm, run_script, scalars, stop_run


def both_ways(monkeypatch, tmp_path, call) -> list:
    """call(folder) forked from the server and as a real subprocess (TESTS_SUBPROCESS=1), each in a folder of its own."""
    results = []
    for way in ("forked", "subprocess"):
        (tmp_path / way).mkdir()
        monkeypatch.setenv("TESTS_SUBPROCESS", "1" if way == "subprocess" else "0")
        results.append(call(tmp_path / way))
    return results


def runs_both_ways(monkeypatch, tmp_path, *args: str, check: bool = True):
    return both_ways(monkeypatch, tmp_path, lambda cwd: run_algorithm("ppo", *args, cwd=cwd, check=check))


def without_times(text: str) -> list[str]:
    """Output lines less what differs between two runs of the same seed: speeds, times and run folders' stamps."""
    text = re.sub(r"SPS [\d,]+|ETA \S+|\d+\.\d+ s|__\d+(\b|/)", "", text)
    return text.splitlines()


def test_a_forked_run_is_the_subprocess_run_to_the_bit(monkeypatch, tmp_path):
    env = ["--env-id", "masked_envs:CartPoleNoVel-v1"]  # importable only through PYTHONPATH, as in test_learning.py
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "benchmark"))
    forked, sub = runs_both_ways(monkeypatch, tmp_path, *env, "--total-timesteps", "2048", "--save-model", CPU)
    assert forked.returncode == sub.returncode == 0
    assert without_times(forked.stdout) == without_times(sub.stdout) and forked.stderr == sub.stderr
    (a,), (b,) = ((tmp_path / way / "runs").iterdir() for way in ("forked", "subprocess"))
    logged = [
        {tag: [(step, value) for step, value, _ in points] for tag, points in scalars(run).items() if tag != "charts/SPS"}
        for run in (a, b)
    ]
    assert logged[0] == logged[1] and len(logged[0]["charts/episodic_return"]) > 20


def test_a_refused_run_exits_and_says_the_same(monkeypatch, tmp_path):
    forked, sub = runs_both_ways(monkeypatch, tmp_path, "--num-envs", "0", CPU, check=False)
    assert forked.returncode == sub.returncode == 2 and forked.stderr == sub.stderr and "--num-envs" in forked.stderr


def test_a_forked_run_stopped_by_a_signal_checkpoints_and_exits_as_a_subprocess_does(monkeypatch, tmp_path):
    flags = ["--total-timesteps", "100000", "--progress-interval", "0", "--checkpoint-every", "1024", CPU]
    outs = both_ways(monkeypatch, tmp_path, lambda cwd: stop_run("ppo", *flags, cwd=cwd, at=2048, sig=signal.SIGTERM))
    assert all(list((tmp_path / way).glob("runs/*/checkpoint.pt")) for way in ("forked", "subprocess"))
    assert all("--resume" in out for out in outs), outs


# Scripts that end badly only as they exit, each with what a real subprocess gives: a run must fail the same way forked
CRASH_AT_EXIT = """
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)  # a library's destructor that aborts
print("trained")
"""
TRACEBACK_THEN_EXIT_0 = """
import traceback
try:
    1 / 0
except ZeroDivisionError:
    traceback.print_exc()
print("trained")
"""
ERROR_IN_AN_EXIT_HANDLER = """
import atexit
atexit.register(lambda: 1 / 0)
print("trained")
"""
THREAD_THAT_NEVER_ENDS = """
import threading
threading.Thread(target=threading.Event().wait, name="never-ends").start()
print("trained")
"""


def script(tmp_path, text: str):
    (tmp_path / "script.py").write_text(text)
    return tmp_path / "script.py"


def test_a_crash_as_the_interpreter_exits_fails_a_forked_run_as_a_subprocess(monkeypatch, tmp_path):
    """The child exits through the C library, as the interpreter does, so that the exit handlers of the libraries a run
    loaded (C++ destructors, gloo's among them) run in it too."""
    path = script(tmp_path, CRASH_AT_EXIT)
    forked, sub = both_ways(monkeypatch, tmp_path, lambda cwd: run_script(path, cwd=cwd, check=False))
    assert forked.returncode == sub.returncode == -signal.SIGABRT and forked.stdout == sub.stdout == "trained\n"


@pytest.mark.parametrize("text", [TRACEBACK_THEN_EXIT_0, ERROR_IN_AN_EXIT_HANDLER], ids=["printed", "exit-handler"])
def test_a_run_that_exits_0_after_a_traceback_fails(monkeypatch, tmp_path, text):
    path = script(tmp_path, text)
    for way in both_ways(monkeypatch, tmp_path, lambda cwd: pytest.raises(AssertionError, run_script, path, cwd=cwd)):
        assert "exited 0 and printed" in str(way.value), way.value


def test_a_thread_that_never_ends_ends_the_forked_run_in_seconds(monkeypatch, tmp_path):
    """A real interpreter waits for ever for a thread that is not a daemon; the forked child, SHUTDOWN_LIMIT seconds."""
    monkeypatch.setattr(forked_runs, "SHUTDOWN_LIMIT", 1.0)
    started = time.monotonic()
    proc = run_script(script(tmp_path, THREAD_THAT_NEVER_ENDS), cwd=tmp_path, check=False)
    assert proc.returncode == forked_runs.SHUTDOWN_HUNG and time.monotonic() - started < 20, proc
    assert "the threads ['never-ends'], which are not daemons, still ran 1.0 s later" in proc.stderr, proc.stderr
