"""tests/forked.py stands in for a subprocess in run_algorithm and stop_run: it must give the same run, to the bit, the
same output and the same exit, or every test that uses it would check something other than what a user runs."""

import re
import signal

from conftest import CPU, ROOT, run_algorithm, scalars, stop_run


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
