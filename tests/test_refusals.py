"""What a run must refuse in one line, in each of the eight files, before anything is written: a checkpoint or model
file whose unpickling would run code (read with PyTorch's safe loader, nothing in it runs), a flag typed beside
--resume that would change how the resumed run learns, a flag this env or run makes meaningless (typed with its
default value), a network too large for the machine; and what a resumed run accepts: a longer run, the same values."""

import time

import numpy as np
import pytest
import torch
from test_write_failure import CHECKPOINTED

from conftest import (
    CPU,
    ROOT,
    assert_one_error_line,
    load_algorithm,
    load_file,
    marks,
    only_run,
    run_algorithm,
    run_bad_input,
    run_in_process,
    scalars,
)

ALGORITHMS = sorted(p.stem for p in (ROOT / "algorithms").glob("*.py"))
MODULES = {name: load_algorithm(name) for name in ALGORITHMS}


class WritesAFile:
    """Unpickled, it opens a file for writing, which creates it: a stand-in for code a crafted file would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def crafted(name: str, kind: str, path, marker) -> str:
    """A file that looks like a checkpoint (kind "checkpoint") or a saved model (kind "model") of name's script, with
    the marks its loader checks, whose weights unpickle to WritesAFile(marker)."""
    env_id = MODULES[name].Args.env_id
    torch.save({"kind": kind, "args": {"env_id": env_id}, **marks(f"{name}.py", model=WritesAFile(str(marker)))}, path)
    return str(path)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_crafted_checkpoint_is_refused_and_nothing_in_it_runs(name, tmp_path):
    marker = tmp_path / "written_by_the_checkpoint"
    path = crafted(name, "checkpoint", tmp_path / "checkpoint.pt", marker)
    proc = run_bad_input(name, ["--env-id", MODULES[name].Args.env_id, "--resume", path], tmp_path, "CartPole-v1")
    assert_one_error_line(name, proc, r"holds io\.open beside tensors and plain values.*nothing in it ran")
    assert not marker.exists()
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_crafted_model_file_is_refused_and_nothing_in_it_runs(name, tmp_path):
    """The final evaluation reloads the saved model from disk: a short --save-model run whose model file is swapped for
    a crafted one as it is written refuses it there, by the path a run takes (not by calling the loader directly)."""
    marker = tmp_path / "written_by_the_model"
    flags = list(CHECKPOINTED[name])  # test_write_failure.py's short run of each file, without its checkpoints
    del flags[flags.index("--checkpoint-every") : flags.index("--checkpoint-every") + 2]

    def call(module):
        real_save = module.save_checkpoint

        def save(path, kind, *args, **kwargs):
            crafted(name, "model", path, marker) if kind == "model" else real_save(path, kind, *args, **kwargs)

        module.save_checkpoint = save
        try:
            module.main(module.parse_args([*flags, "--save-model", "--progress-interval", "0", CPU]))
        finally:
            module.save_checkpoint = real_save

    proc = run_in_process(name, call, tmp_path)
    assert_one_error_line(name, proc, r"holds io\.open beside tensors and plain values.*nothing in it ran")
    assert not marker.exists()


# A short run of each file that writes a checkpoint at its end, the flag of its length, and the longer length a resume
# extends it to. qlearning.py's --num-envs is its own default; dqn.py's and ddpg_td3.py's learning starts within the run.
RESUMED = {
    "ppo": ("--env-id CartPole-v1 --num-steps 64 --total-timesteps 512 --checkpoint-every 512", "total_timesteps", 1024),
    # Pendulum's episodes all last the 20 steps the cap allows: every generation logs at the same spacing
    "es": (
        "--env-id Pendulum-v1 --population-size 8 --max-episode-steps 20 --hidden-sizes 8 --num-generations 4 "
        "--checkpoint-every 2",
        "num_generations",
        6,
    ),
    "a2c": ("--env-id CartPole-v1 --total-timesteps 2000 --checkpoint-every 2000", "total_timesteps", 4000),
    "rnd_ppo": (
        "--num-envs 4 --num-steps 32 --num-minibatches 2 --num-iterations-obs-norm-init 1 --max-episode-steps 40 "
        "--total-timesteps 256 --checkpoint-every 256",
        "total_timesteps",
        512,
    ),
    "dqn": (
        "--env-id CartPole-v1 --total-timesteps 1000 --learning-starts 200 --buffer-size 1000 --batch-size 32 "
        "--log-every 100 --checkpoint-every 500",
        "total_timesteps",
        2000,
    ),
    # --save-buffer: without the buffer, the resumed run refills it for --learning-starts steps before an update
    "ddpg_td3": (
        "--env-id Pendulum-v1 --total-timesteps 600 --learning-starts 300 --buffer-size 2000 --hidden-size 32 "
        "--batch-size 32 --log-every 100 --checkpoint-every 300 --save-buffer",
        "total_timesteps",
        900,
    ),
    "qlearning": ("--total-timesteps 6400 --log-every 640 --checkpoint-every 6400", "total_timesteps", 12800),
    # a run that ends on a phase boundary: the longer run does the auxiliary phase the first one left for its end
    "ppg_procgen": (
        "--num-envs 2 --num-steps 16 --num-minibatches 1 --n-pi 2 --e-aux 1 --total-timesteps 64 --checkpoint-every 64",
        "total_timesteps",
        128,
    ),
}


def tag_steps(run) -> list[int]:
    """The steps of the run's per-iteration (or per-log) scalar, charts/SPS, in the order they were written."""
    return [step for step, _, _ in scalars(run)["charts/SPS"]]


@pytest.mark.parametrize("name", sorted(RESUMED))
def test_a_resumed_run_takes_a_longer_run_and_the_same_values_and_refuses_other_changes(name, tmp_path):
    flags, length, longer = RESUMED[name]
    flags = [*flags.split(), CPU, "--seed", "1"]
    # in this process, as run_bad_input runs its cases: a subprocess would add seconds of imports per run
    trained = run_in_process(name, lambda m: m.main(m.parse_args([*flags, "--progress-interval", "0"])), tmp_path)
    assert trained.returncode == 0, trained.stderr
    run = only_run(tmp_path)
    checkpoint = str(run / "checkpoint.pt")
    before = tag_steps(run)
    env_id = ["--env-id", MODULES[name].Args.env_id if "--env-id" not in flags else flags[flags.index("--env-id") + 1]]
    flag = f"--{length.replace('_', '-')}"

    # the finished run's last checkpoint, resumed as it was, would train nothing: refused
    proc = run_bad_input(name, [*env_id, "--resume", checkpoint], tmp_path, "CartPole-v1")
    old = flags[flags.index(flag) + 1]
    nothing = rf"a run that finished at step .*: resumed, it would train nothing; pass a {flag} above {old} to extend"
    assert_one_error_line(name, proc, nothing)

    # as if the run had stopped at its checkpoint (no `finished`), a flag that changes how the run learns, with another
    # value than the checkpoint's, and a length that does not go past the checkpoint: refused, nothing written
    (run / "finished").rename(tmp_path / "finished")
    proc = run_bad_input(name, [*env_id, "--resume", checkpoint, "--seed", "2"], tmp_path, "CartPole-v1")
    assert_one_error_line(name, proc, r"--seed 2 differs from the checkpoint's 1.*leave out --seed \(or pass 1\)")
    proc = run_bad_input(name, [*env_id, "--resume", checkpoint, flag, "1"], tmp_path, "CartPole-v1")
    assert_one_error_line(name, proc, rf"{flag} 1 does not go past the checkpoint's .*; pass a {flag} above")
    (tmp_path / "finished").rename(run / "finished")
    assert tag_steps(run) == before

    # a longer run, with the same seed typed again: applied and said; the curve goes on from the checkpoint, no gap
    longer_flags = [*env_id, "--resume", checkpoint, flag, str(longer), "--seed", "1"]
    # an events file is named by the second it was opened in, then by a count of the process's writers, which sorts as
    # text ("10" before "9"): in one process and the same second, the resumed run's file would be read first
    time.sleep(1.01 - time.time() % 1)
    proc = run_in_process(name, lambda m: m.main(m.parse_args(longer_flags)), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"resuming with {flag} {longer} (the checkpoint has {old})" in proc.stdout
    after = tag_steps(run)
    assert after[: len(before)] == before and len(after) > len(before)
    gaps = np.diff(after)
    assert (gaps > 0).all() and gaps[len(before) - 1] <= gaps[: len(before) - 1].max(initial=gaps[-1]), after
    # the checkpoint the longer run wrote at its end: at the new length, which its arguments hold
    state = load_file(checkpoint)
    assert state["args"][length] == longer
    assert state["generation" if length == "num_generations" else "global_step"] == longer


# Each file's flags that a run makes meaningless, typed with their default value: (flags, the line's pattern)
MEANINGLESS = {
    "ppo": [
        ("--env-id CartPole-v1 --frame-stack 4", r"--frame-stack is for envpool's Atari ids, and CartPole-v1 is not one"),
        ("--env-id CartPole-v1 --episodic-life", r"--episodic-life is for envpool's Atari ids"),
        ("--env-id Breakout-v5 --no-norm-obs", r"--norm-obs is for float observations, and Breakout-v5 has uint8 ones"),
        ("--env-id CartPole-v1 --rnn-size 128", r"--rnn-size sizes the recurrent layer, and this run has none"),
        ("--env-id CartPole-v1 --eval-episodes 10", r"--eval-episodes sets the evaluations, and this run has none"),
    ],
    "a2c": [
        ("--env-id CartPole-v1 --episodic-life", r"--episodic-life is for envpool's Atari ids, and CartPole-v1 is not one"),
        ("--env-id Breakout-v5 --no-norm-obs", r"--norm-obs is for float observations, and Breakout-v5 has uint8 ones"),
        ("--env-id CartPole-v1 --rnn-size 128", r"--rnn-size sizes the recurrent layer, and this run has none"),
        ("--env-id CartPole-v1 --capture-video", r"--capture-video sets the evaluations, and this run has none"),
    ],
    "rnd_ppo": [
        ("--rnn-size 128", r"--rnn-size sizes the recurrent layer, and this run has none \(see --rnn\)"),
        ("--eval-episodes 10", r"--eval-episodes sets the evaluations, and this run has none"),
    ],
    "dqn": [
        ("--env-id CartPole-v1 --episodic-life", r"--episodic-life is for envpool's Atari ids, and CartPole-v1 is not one"),
        ("--env-id CartPole-v1 --eval-epsilon 0.05", r"--eval-epsilon sets the evaluations, and this run has none"),
    ],
    "ddpg_td3": [
        ("--env-id Pendulum-v1 --algo ddpg --policy-noise 0.2", r"--policy-noise shapes TD3's target policy smoothing"),
        ("--env-id Pendulum-v1 --eval-episodes 10", r"--eval-episodes sets the evaluations, and this run has none"),
    ],
    "qlearning": [
        ("--env-id FrozenLake-v1 --bins 10", r"--bins shapes the grid over Box observations, and FrozenLake-v1's are"),
        ("--no-lr-decay --end-learning-rate 0.01", r"--end-learning-rate is where --lr-decay ends"),
    ],
    "es": [
        ("--env-id CartPole-v1 --eval-every 0 --eval-episodes 10", r"--eval-episodes sets the evaluations, and this run"),
        (
            "--env-id CartPole-v1 --preset auto --num-generations 100 --hidden-sizes 32 32 --sigma 0.02 --learning-rate 0.01 "
            "--l2-coef 0.005 --norm-obs",
            r"--preset only sets defaults, and all it sets are given",
        ),
    ],
    "ppg_procgen": [
        ("--e-aux 0 --n-pi 32", r"--n-pi is for the auxiliary phase, and this run has none \(--e-aux 0\)"),
        ("--start-level 0", r"--start-level is the first level of a fixed set, and this run's levels are unlimited"),
        ("--eval-deterministic", r"--eval-deterministic sets the evaluations, and this run has none"),
        ("--preset paper --n-pi 32", r"--preset only sets the default of --n-pi, and --n-pi is given"),
    ],
}


@pytest.mark.parametrize(
    "name, flags, message",
    [
        pytest.param(name, flags, message, id=f"{name}-{i}")
        for name, rows in MEANINGLESS.items()
        for i, (flags, message) in enumerate(rows)
    ],
)
def test_a_flag_the_run_makes_meaningless_is_refused_even_with_its_default_value(name, flags, message, tmp_path):
    proc = run_bad_input(name, [*flags.split(), CPU], tmp_path, "CartPole-v1")
    assert_one_error_line(name, proc, message + r".*; leave it out")


@pytest.mark.parametrize("name", ["ppo", "ddpg_td3"])
def test_a_mujoco_env_that_cannot_render_is_refused_and_leaves_no_mujoco_log(name, tmp_path):
    """--capture-video on MuJoCo where OpenGL is missing (no DISPLAY, MUJOCO_GL neither egl nor osmesa): refused in one
    line, nothing written (no run directory, no MuJoCo MUJOCO_LOG.TXT). Where the machine renders, there is nothing to see."""
    flags = ["--env-id", "Hopper-v4", "--capture-video", "--save-model", "--total-timesteps", "2048", CPU]
    flags += ["--learning-starts", "1024"] if name == "ddpg_td3" else []
    proc = run_algorithm(name, *flags, cwd=tmp_path, check=False, timeout=300)
    if proc.returncode == 0:
        pytest.skip("this machine renders MuJoCo")
    assert_one_error_line(name, proc, r"--capture-video: Hopper-v4 cannot render here .*; pass --no-capture-video")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
