"""benchmark/tune.py on tiny real runs of ppo.py: a study's trials and their values, a study killed and resumed, a trial
pruned on what its runs logged, and bad input refused in one line."""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from conftest import ROOT, SMOKE_TIMEOUT, one_thread, scalars

# ppo.py on CartPole in about 5 s (3 of them imports) on a 2-core machine
TINY = ["--total-timesteps", "4096", "--num-envs", "2", "--num-steps", "64", "--no-cuda"]
STUDY = ["--script", "ppo", "--env-ids", "CartPole-v1", "--param", "learning-rate=log:1e-4:1e-2"]


def tune_cmd(*args: str, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmark" / "tune.py"), "--out", str(out), *args]


def tune(*args: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        tune_cmd(*args, out=out), capture_output=True, text=True, timeout=SMOKE_TIMEOUT, env=one_thread(None)
    )


def load(out: Path, name: str = "ppo_CartPole-v1") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{out / name / 'study.db'}")


def run_dir(out: Path, name: str, trial: int, env_id: str = "CartPole-v1") -> Path:
    """The one run directory of a trial's env (seed 1)."""
    (found,) = (out / name / "runs" / f"trial_{trial}" / f"{env_id}__1" / "runs").iterdir()
    return found


def last_returns(run: Path, n: int = 20) -> float:
    return float(np.mean([v for _, v, _ in scalars(run)["charts/episodic_return"]][-n:]))


def test_a_study_runs_its_trials_two_at_a_time_and_scores_each_on_its_runs(tmp_path):
    """Two envs, so each run's score is scaled by the built-in targets: CartPole 25:475, Acrobot -500:-100."""
    name = "ppo_CartPole-v1_Acrobot-v1"
    args = ["--script", "ppo", "--env-ids", "CartPole-v1", "Acrobot-v1", "--param", "learning-rate=log:1e-4:1e-2",
            "--trials", "3", "--workers", "2", "--", *TINY]  # fmt: skip
    proc = tune(*args, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = load(tmp_path, name).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert trials[1].datetime_start < trials[0].datetime_complete  # two at a time: the second began before the first ended
    assert re.findall(r"^trial (\d)/3 ", proc.stdout, re.M) == ["1", "2", "3"]  # each count once, however they end
    for t in trials:  # the value, computed here from the events each run logged
        cartpole = (last_returns(run_dir(tmp_path, name, t.number)) - 25) / 450
        acrobot = (last_returns(run_dir(tmp_path, name, t.number, "Acrobot-v1")) + 500) / 400
        assert t.value == pytest.approx((cartpole + acrobot) / 2, rel=1e-6)
    best = max(trials, key=lambda t: t.value)
    lr = best.params["learning-rate"]
    assert f"python algorithms/ppo.py --env-id CartPole-v1 --learning-rate {lr} --total-timesteps 4096" in proc.stdout
    assert f"python algorithms/ppo.py --env-id Acrobot-v1 --learning-rate {lr}" in proc.stdout
    table = (tmp_path / name / "trials.md").read_text()
    assert f"| {best.number} | COMPLETE | {best.value:.4g} | {lr:.4g} |" in table
    assert (tmp_path / name / "history.png").stat().st_size > 10_000
    assert (tmp_path / name / "importances.png").is_file()
    # a finished study only prints its results again
    again = tune(*args, out=tmp_path)
    assert again.returncode == 0 and "to run" not in again.stdout and f"--learning-rate {lr}" in again.stdout
    assert len(load(tmp_path, name).trials) == 3


def test_a_one_trial_study_says_why_it_has_no_importances(tmp_path):
    """Parameter importances need two complete trials whose parameters differ: one trial writes none, with a note."""
    proc = tune(*STUDY, "--trials", "1", "--", *TINY, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no importances.png: it needs two complete trials whose parameters differ" in proc.stdout
    assert not (tmp_path / "ppo_CartPole-v1" / "importances.png").exists() and "(trials.md, history.png, runs/)" in proc.stdout


def pids(where) -> list[int]:
    """The processes for whose /proc entry where(entry) holds (those that end while being read are passed over)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and where(entry):
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def session_pids(sid: int) -> list[int]:
    """The processes of a session: a tuner killed with SIGKILL leaves its runs, in their own process groups, going."""
    return pids(lambda entry: os.getsid(int(entry.name)) == sid)


def processes_in(folder: Path) -> list[int]:
    """The processes whose working folder is `folder` or below it (a trial's runs work in their own folders)."""
    return pids(lambda entry: Path(os.readlink(entry / "cwd")).is_relative_to(folder.resolve()))


def states(db: Path) -> list[tuple[int, str]]:
    if not db.is_file():
        return []
    with sqlite3.connect(db) as con:
        try:
            return con.execute("SELECT number, state FROM trials ORDER BY number").fetchall()
        except sqlite3.OperationalError:  # the tables are not made yet
            return []


def test_a_killed_study_goes_on_without_repeating_a_finished_trial(tmp_path):
    args = [*STUDY, "--trials", "3", "--", *TINY]
    db = tmp_path / "ppo_CartPole-v1" / "study.db"
    proc = subprocess.Popen(tune_cmd(*args, out=tmp_path), env=one_thread(None), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + SMOKE_TIMEOUT
    while states(db) != [(0, "COMPLETE"), (1, "RUNNING")] and time.time() < deadline:
        time.sleep(0.2)
    assert states(db) == [(0, "COMPLETE"), (1, "RUNNING")]
    first = load(tmp_path).trials[0]
    for pid in session_pids(proc.pid):  # a machine that went away: the tuner and its runs
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    again = tune(*args, out=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 trial(s) to run" in again.stdout
    trials = load(tmp_path).trials
    finished = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == 3 and trials[1].state != optuna.trial.TrialState.COMPLETE  # the killed one never finished
    assert (finished[0].number, finished[0].params, finished[0].value) == (0, first.params, first.value)
    assert len({t.params["learning-rate"] for t in trials}) == len(trials)  # the resumed sampler drew new values


def test_a_trial_that_does_not_learn_is_pruned_while_it_runs(tmp_path):
    """Trials 0 and 1 learn (CartPole returns 40 and 37 at step 1,024, 84 and 69 at 2,048), trial 2 (learning rate
    1e-9) stays a random policy (21.6 at step 1,024): the median pruner stops it at the first report, the same in 3
    of 3 runs of this test. Its runs are killed within a poll (2 s) of step 1,024, far from their 16,384 steps."""
    args = ["--script", "ppo", "--env-ids", "CartPole-v1", "--param", "learning-rate=log:1e-9:1e-2", "--trials", "3",
            "--enqueue", "learning-rate=2.5e-3", "--enqueue", "learning-rate=3e-3", "--enqueue", "learning-rate=1e-9",
            "--prune-startup", "2", "--prune-warmup", "0", "--report-every", "1024",
            "--", *TINY[2:], "--total-timesteps", "16384"]  # fmt: skip
    proc = tune(*args, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = load(tmp_path).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert [t.params["learning-rate"] for t in trials] == [2.5e-3, 3e-3, 1e-9]
    assert list(trials[2].intermediate_values) == [1] and len(trials[0].intermediate_values) == 16
    assert trials[2].intermediate_values[1] < min(t.intermediate_values[1] for t in trials[:2])
    pruned = run_dir(tmp_path, "ppo_CartPole-v1", 2)
    assert not processes_in(pruned.parent.parent), "the pruned trial's run is still going after the study ended"
    logged = scalars(pruned)  # read once its process is gone, so that nothing more is coming
    assert 1024 < max(points[-1][0] for points in logged.values()) < 16384
    assert "trial 3/3 (#2) PRUNED" in proc.stdout


def test_a_run_that_refuses_its_flags_stops_the_study(tmp_path):
    proc = tune("--script", "ppo", "--env-ids", "CartPole-v1", "--param", "gamma=float:1.5:2", "--trials", "5", "--", *TINY,
                out=tmp_path)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("tune.py: error: ")
    assert "ppo.py: error: --gamma" in proc.stderr
    assert [t.state.name for t in load(tmp_path).trials] == ["FAIL"]


S, E, T, P = ["--script", "ppo"], ["--env-ids", "CartPole-v1"], ["--trials", "2"], ["--param", "learning-rate=log:1e-4:1e-2"]
BAD_INPUT = [
    (["--script", "nosuch", *E, *T, *P], "nosuch"),
    ([*S, *E, *T, "--param", "no-such=float:0:1"], "no-such"),
    ([*S, *E, *T, "--param", "learning-rate=exp:0:1"], "'exp'"),
    ([*S, *E, *T, "--param", "learning-rate=float:1:0.5"], "learning-rate=float:1:0.5: needs LOW < HIGH"),
    ([*S, *E, *T, "--param", "learning-rate=float:a:b"], "learning-rate=float:a:b"),
    ([*S, *E, *T, "--param", "learning-rate=log:0:1"], "LOW > 0"),
    ([*S, *E, *T, "--param", "num-steps=float:1:2"], "--num-steps takes integers"),
    ([*S, *E, *T, "--param", "anneal-lr=cat:yes,no"], "--anneal-lr is a boolean flag"),
    ([*S, *E, *T, "--param", "seed=int:1:5"], "--seed"),
    ([*S, *E, *T, *P, "--param", "learning-rate=float:0.1:0.2"], "--param learning-rate is given twice"),
    ([*S, *E, *T, *P, "--enqueue", "learning-rate=0.5"], "learning-rate=0.5 is outside"),
    ([*S, *E, *T, *P, "--enqueue", "gamma=0.9"], "gamma is not a tuned"),
    ([*S, *E, *T, *P, "--", "--learning-rate", "0.1"], "--learning-rate after -- is also tuned"),
    ([*S, *E, *T, *P, "--", "--no-such", "1"], "--no-such after --"),
    ([*S, *E, *T, *P, "--", "--seed", "3"], "--seed after --"),
    ([*S, *E, *T, *P, "--", "--env-id=Acrobot-v1"], "--env-id=Acrobot-v1 after --"),
    ([*S, "--env-ids", "CartPole-v1", "Foo-v0", *T, *P], "no target scores for Foo-v0"),
    ([*S, "--env-ids", "CartPole-v1", "Foo-v0", *T, *P, "--target", "Foo-v0=1:1"], "--target Foo-v0=1:1"),
    ([*S, *E, *T, *P, "--workers", "0"], "--workers 0"),
    ([*S, *E, "--trials", "x", *P], "--trials"),
    ([*S, *E, *P], "--trials"),
    ([*S, *E, *T, *P, "--storage", "sqlite:////nonexistent/folder/study.db"], "--storage sqlite:////nonexistent"),
    ([*S, *E, *T, *P, "--storage", "/nonexistent/folder/study.log"], "--storage /nonexistent"),
]


@pytest.mark.parametrize("args, culprit", BAD_INPUT, ids=[c for _, c in BAD_INPUT])
def test_bad_input_gets_one_line_and_leaves_no_study_folder(tmp_path, args, culprit):
    proc = tune(*args, out=tmp_path / "out")
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("tune.py: error: ")
    assert culprit in proc.stderr and "; " in proc.stderr
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_help_explains_every_option():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmark" / "tune.py"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "docs/tuning.md" in proc.stdout
    source = (ROOT / "benchmark" / "tune.py").read_text()
    options = re.findall(r'p\.add_argument\(\s*"(--[\w-]+)"', source)
    assert len(options) == source.count("p.add_argument(") > 15
    entries = re.split(r"\n  (?=-)", proc.stdout.split("options:")[1])
    for option in options:  # the option, its metavar, then a few words at least
        (entry,) = [e for e in entries if e.split()[:1] == [option]]
        assert len(entry.split()) > 4, entry
