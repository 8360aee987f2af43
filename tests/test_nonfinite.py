"""An env whose reward or observation turns NaN or inf, and a run whose training turns non-finite, stop in one line in
every file that runs gymnasium envs: what went bad, where, and the checkpoint still on disk with the command that
resumes from it; exit status 1, no traceback, and no NaN or inf in any checkpoint or model under the run folder."""

import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import CPU, ROOT, SMOKE_FLAGS, load_algorithm, load_file, one_thread, only_run, run_algorithm

# each file's short run, checkpointed before the envs of tests/bad_data_envs.py go bad at their BAD_FROM-th step
RUNS = {
    "ppo": ["--total-timesteps", "2048", "--checkpoint-every", "512"],
    "a2c": ["--total-timesteps", "2048", "--checkpoint-every", "512"],
    "dqn": ["--total-timesteps", "2048", *SMOKE_FLAGS["dqn"], "--checkpoint-every", "512"],
    "ddpg_td3": ["--total-timesteps", "2048", *SMOKE_FLAGS["ddpg_td3"], "--checkpoint-every", "512"],
    "es": ["--population-size", "16", "--num-generations", "4", "--checkpoint-every", "1"],
    "qlearning": ["--total-timesteps", "2048", "--checkpoint-every", "512"],
}
BAD_FROM = "1200"  # env steps of the process, over every env; es.py's generations take 16 x 50
ALGORITHMS = sorted(p.stem for p in (ROOT / "algorithms").glob("*.py"))


def run(name: str, env_id: str, cwd, test_env: dict, *flags: str, checkpoints: bool = True, **variables: str):
    """The file's short run on env_id; without checkpoints, --checkpoint-every 0 in place of RUNS's last two flags."""
    env = {**test_env, "BAD_FROM": BAD_FROM, **variables}
    box = "Box" if name == "ddpg_td3" else ""
    own = RUNS[name] if checkpoints else [*RUNS[name][:-2], "--checkpoint-every", "0"]
    args = ["--env-id", f"bad_data_envs:{env_id}{box}-v0", *own, "--progress-interval", "0", CPU, *flags]
    return run_algorithm(name, *args, cwd=cwd, check=False, env=env)


def one_line_and_clean_files(name: str, proc, cwd, what: tuple[str, ...]) -> str:
    """The run's one line, checked: exit 1, no traceback, the line names one of `what`, and every saved file is finite."""
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"{name}.py: error: ") and any(w in line for w in what), line
    for path in only_run(cwd).rglob("*"):
        if path.suffix in (".pt", ".model"):
            assert load_algorithm(name).non_finite(load_file(path)) is None, f"{path} holds a NaN or inf"
    assert not list(cwd.rglob("*.tmp"))
    return line


@pytest.mark.parametrize("name", sorted(RUNS))
def test_bad_env_data_stops_at_its_step_and_the_checkpoint_before_resumes(name, tmp_path, test_env):
    for env_id, what in (("NanReward", "the env's reward is nan"), ("InfObs", "the env's observation is inf")):
        cwd = tmp_path / env_id
        cwd.mkdir()
        line = one_line_and_clean_files(name, run(name, env_id, cwd, test_env), cwd, (what,))
        step = int(line.split(" at step ")[1].split(" ")[0].replace(",", ""))
        assert int(BAD_FROM) <= step < int(BAD_FROM) + 1000, line  # the step it arrived at, not an iteration later
        kept, resume = line.split("the last checkpoint, ")[1].split("; resume from it with: ")
        path, at = kept.split(" (step ")
        assert int(at.split(")")[0].replace(",", "")) == load_file(cwd / path)["global_step"] < step
    # the command in the line resumes the kept checkpoint, and the run ends well once the env is sound again
    command = shlex.split(resume)
    assert command[0] == "python" and command[command.index("--resume") + 1] == path
    proc = run_algorithm(name, *command[2:], CPU, cwd=cwd, check=False, env={**test_env, "BAD_FROM": str(10**9)})
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_training_that_turns_non_finite_is_stopped_by_the_loop(name, tmp_path, test_env):
    """Rewards of 1e30 overflow the float32 losses; qlearning.py's table is float64, so there they are 1e307 (and numpy's
    own overflow warning from the episode's return is let be); es.py's centred ranks make it immune to the reward's
    scale, so there the learning rate is made absurd instead, from the start. No checkpoints (--checkpoint-every 0):
    the line must come from the loop's own check, not from the backstop in the checkpoint's write (the test below),
    which with checkpoints on refuses the first non-finite one at the very step the loop's check would stop."""
    variables = dict(HUGE="1e307", PYTHONWARNINGS="ignore::RuntimeWarning") if name == "qlearning" else {}
    variables = dict(BAD_FROM="0") if name == "es" else variables
    flags = ["--learning-rate", "1e30"] if name == "es" else []
    proc = run(name, "HugeReward", tmp_path, test_env, *flags, checkpoints=False, **variables)
    line = one_line_and_clean_files(name, proc, tmp_path, ("training turned non-finite at step",))
    assert not list(tmp_path.rglob("*.pt")), line


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_checkpoint_backstop_refuses_a_nan_or_inf_and_writes_nothing(name, tmp_path):
    """The last guard, under the loop's checks: a checkpoint or model whose state holds a NaN or inf anywhere (a weight,
    an optimiser's moment, a numpy statistic) is not written, and the error names the first such entry."""
    m = load_algorithm(name)
    args = m.parse_args(["--no-cuda"])
    sound = dict(global_step=5, model={"w": torch.ones(3)}, optimizer={"state": {0: {"exp_avg": torch.zeros(3)}}})
    bad = {
        "model.w": dict(sound, model={"w": torch.tensor([1.0, float("nan"), 1.0])}),
        "optimizer.state.0.exp_avg": dict(sound, optimizer={"state": {0: {"exp_avg": torch.tensor([float("inf")])}}}),
        "obs_rms.1": dict(sound, obs_rms=[np.zeros(2), np.array([1.0, -np.inf])]),
    }
    for entry, state in bad.items():
        for kind in ("checkpoint", "model"):
            expected = rf"^{re.escape(entry)} holds a NaN or inf at step 5, so no {kind} was written from it$"
            with pytest.raises(m.NonFinite, match=expected):
                m.save_checkpoint(str(tmp_path / "checkpoint.pt"), kind, args, str(tmp_path), **state)
    assert not list(tmp_path.iterdir())
    m.save_checkpoint(str(tmp_path / "checkpoint.pt"), "checkpoint", args, str(tmp_path), **sound)
    assert load_file(tmp_path / "checkpoint.pt")["global_step"] == 5


def test_under_torchrun_the_process_that_meets_it_says_so_and_the_job_ends(tmp_path, test_env):
    """Two processes, each stepping two envs that go bad at its 600th env step (about step 1,200 of the run): each
    says what it met in its line (process 0's with the checkpoint to resume from, the other's pointing there), no
    process ends in a traceback, and the job fails."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    flags = ["--env-id", "bad_data_envs:NanReward-v0", *RUNS["ppo"], "--progress-interval", "0", CPU]
    cmd = [*launcher, str(ROOT / "algorithms" / "ppo.py"), *flags]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=one_thread({**test_env, "BAD_FROM": "600"}))
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ppo.py: error: ")]
    assert proc.returncode != 0 and lines and "]: Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert all("the env's reward is nan at step " in line for line in lines), lines
    zero = [line for line in lines if "of process 0)" in line]
    assert all("the last checkpoint, " in line for line in zero) and all(
        "process 0 writes the run's checkpoints" in line for line in lines if line not in zero
    ), lines
