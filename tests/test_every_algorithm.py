"""What every algorithm file does the same way, one row per file: the same seed gives the same run on the CPU and
another seed another run; bad input gets one line that names the problem and the fix, exit status 2 and no run
directory; a run stopped by SIGTERM (a checkpoint at once) or SIGKILL (the last periodic one, the events after it
purged) resumes with every step logged once. What only one algorithm does stays in its own test file (dqn.py's and
ddpg_td3.py's resumes with and without the replay buffer, ppg_procgen.py's stops inside a phase, es.py's torchrun
resume)."""

import shutil
import signal

import pytest
import torch

from conftest import (
    CPU,
    SMOKE_FLAGS,
    assert_one_error_line,
    load_file,
    marks,
    only_run,
    run_algorithm,
    run_bad_input,
    run_in_process,
    scalars,
    seeded_runs,
    stop_run,
    values,
    write_foreign_checkpoint,
)


def q_table_and_curves(run):
    """qlearning.py's run: its curves and the saved table, which the same seed must give again to the bit."""
    table = load_file(run / "qlearning.model")["q"]
    return [values(run, t) for t in ("charts/episodic_return", "losses/td_error")] + [table.tolist()]


# (seeds, flags, tags, read): the flags of a short run, and what of it two runs of one seed must share to the bit
SEEDED = {
    "ppo": ((7, 7, 8), ["--total-timesteps", "3072"], ("charts/episodic_return", "losses/value_loss", "losses/approx_kl")),
    "a2c": ((7, 7, 8), ["--total-timesteps", "2000", "--log-interval", "10"],
            ("charts/episodic_return", "losses/value_loss", "losses/policy_loss")),
    "dqn": ((7, 7, 8), ["--total-timesteps", "2500", *SMOKE_FLAGS["dqn"]],
            ("charts/episodic_return", "losses/td_loss", "losses/q_values")),
    "ddpg_td3": ((7, 7, 8), ["--env-id", "Pendulum-v1", "--total-timesteps", "500", *SMOKE_FLAGS["ddpg_td3"]],
                 ("charts/episodic_return", "losses/qf1_loss", "losses/actor_loss")),
    "qlearning": ((7, 7, 8), ["--total-timesteps", "30000", "--log-every", "1000", "--save-model", "--eval-episodes", "50"],
                  q_table_and_curves),
    "ppg_procgen": ((3, 3, 4), [*SMOKE_FLAGS["ppg_procgen"], "--total-timesteps", "512"],
                    ("losses/policy_loss", "losses/value_loss", "losses/bc_kl", "losses/aux_value_loss")),
    "rnd_ppo": ((3, 3, 4), [*SMOKE_FLAGS["rnd_ppo"], "--total-timesteps", "256"],
                ("losses/policy_loss", "losses/rnd_loss", "losses/int_value_loss", "charts/intrinsic_reward")),
    "es": ((7, 7, 8), ["--num-generations", "2", "--population-size", "8", "--max-episode-steps", "50"],
           ("charts/population_mean_return", "losses/grad_norm")),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_same_seed_same_run_on_cpu(name, tmp_path):
    """The second run of the seed is a real subprocess, the others forked (tests/forked.py): so in every file the forked
    run is also the subprocess run to the bit, and the subprocess's end (the interpreter's own, with every library's
    exit handlers) exits 0 without a traceback."""
    seeds, flags, read = SEEDED[name]
    tags, read = (read, None) if isinstance(read, tuple) else ((), read)
    runs = seeded_runs(name, seeds, tmp_path, *flags, tags=tags, read=read, real=(1,))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# Each file's bad input and the start of its one error line (a regular expression). FOREIGN stands for a checkpoint of
# the file for FOREIGN_ENV's env, PPO_CHECKPOINT for one of ppo.py, A2C_MODEL for an a2c.py final model.
BAD_INPUT = {
    "ppo": [
        (["--env-id", "CartPol-v1"], r"env 'CartPol-v1' cannot be made \(NameNotFound: Environment `CartPol`"),
        (["--env-id", "nosuchmodule:Env-v0"], r"env 'nosuchmodule:Env-v0' cannot be made \(ModuleNotFoundError"),
        (["--env-id", "Breakout-v5", "--norm-obs"], r"--norm-obs is for float observations, and Breakout-v5 has uint8"),
        (["--num-minibatches", "3"], r"512 does not divide into 3 minibatches"),
        (["--total-timesteps", "100"], r"less than one rollout"),
        (["--resume", "no/such/checkpoint.pt"], r"checkpoint 'no/such/checkpoint.pt' does not exist"),
        (["--resume", "FOREIGN"], r"is for Acrobot-v1, not CartPole-v1; pass --env-id Acrobot-v1"),
        (["--env-id", "FrozenLake-v1"], r"image observation, and FrozenLake-v1 has Discrete\(16\); use qlearning.py"),
        (["--bf16"], r"--bf16 runs the convolutional trunk of frames, and CartPole-v1 has vectors; leave it out"),
    ],
    "a2c": [
        (["--env-id", "CartPol-v1"], r"env 'CartPol-v1' cannot be made \(NameNotFound: Environment `CartPol`"),
        (["--num-envs", "0"], r"--num-envs 0 is out of range; pass a value in \[1, inf\)"),
        (["--total-timesteps", "10"], r"less than one rollout \(--num-envs 8 x --num-steps 5 = 40 steps\)"),
        (
            ["--num-envs", "4", "--num-steps", "50", "--total-timesteps", "199"],
            r"less than one rollout \(--num-envs 4 x --num-steps 50 = 200 steps\)",
        ),
        (["--resume", "no/such/checkpoint.pt"], r"checkpoint 'no/such/checkpoint.pt' does not exist"),
        (["--resume", "FOREIGN"], r"is for Acrobot-v1, not CartPole-v1; pass --env-id Acrobot-v1"),
        (["--resume", "PPO_CHECKPOINT"], r"is a ppo\.py checkpoint of format \d+, not a .*, or run ppo\.py$"),
        (["--resume", "A2C_MODEL"], r"is a a2c\.py model of format \d+, not a a2c\.py checkpoint"),
        (["--env-id", "FrozenLake-v1"], r"image observation, and FrozenLake-v1 has Discrete\(16\); use qlearning.py"),
        # normalised floats written into the uint8 frame storage wrapped around (-3.2 stored as 253)
        (["--env-id", "Breakout-v5", "--norm-obs"], r"--norm-obs is for float observations, and Breakout-v5 has uint8"),
        (["--bf16"], r"--bf16 runs the convolutional trunk of frames, and CartPole-v1 has vectors; leave it out"),
    ],
    "dqn": [
        (["--bf16"], r"--bf16 runs the convolutional trunk of frames, and CartPole-v1 has vectors; leave it out"),
        (["--env-id", "Pendulum-v1"], r"needs Discrete actions, and Pendulum-v1 has Box.*; use ddpg_td3.py"),
        (["--env-id", "CartPol-v1"], r"env 'CartPol-v1' cannot be made \(NameNotFound: Environment `CartPol`"),
        (["--learning-starts", "10"], r"--learning-starts 10 is under --batch-size or leaves no gradient step"),
        (["--learning-starts", "600", "--total-timesteps", "500"], r"--learning-starts 600 is under .* or leaves no"),
        (["--learning-starts", "500", "--total-timesteps", "505"], r"--learning-starts 500 is under .* or leaves no"),
        (["--buffer-size", "100"], r"--buffer-size 100 is less than --batch-size 128 or 8 slots per env; raise it"),
        (["--buffer-size", "20", "--num-envs", "4", "--batch-size", "16"], r"--buffer-size 20 is less .* 8 slots per env"),
        (["--total-timesteps", "3", "--num-envs", "4"], r"--total-timesteps 3 is less than one step of 4 envs"),
        (["--start-e", "0.01", "--end-e", "0.5"], r"--start-e 0.01 is below --end-e 0.5"),
        (["--env-id", "Taxi-v3"], r"image observation, and Taxi-v3 has Discrete\(500\); use qlearning.py"),
        (["--env-id", "Breakout-v5", "--env-backend", "gymnasium"], r"gymnasium has no env 'Breakout-v5'; pass --env-back"),
        (["--env-id", "corridor_env:Corridor-v0", "--env-backend", "envpool"], r"envpool has no env 'corridor_env:Corr"),
        (["--resume", "no/such/checkpoint.pt"], r"checkpoint 'no/such/checkpoint.pt' does not exist"),
        (["--resume", "FOREIGN"], r"is for Acrobot-v1, not CartPole-v1; pass --env-id Acrobot-v1"),
    ],
    "ddpg_td3": [
        (["--env-id", "CartPole-v1"], r"needs bounded 1-D Box actions .*; CartPole-v1 has Discrete\(2\).*use dqn.py"),
        (["--env-id", "Hoper-v4"], r"env 'Hoper-v4' cannot be made \(NameNotFound: Environment `Hoper`"),
        (["--learning-starts", "10"], r"--learning-starts 10 is under --batch-size or leaves no gradient step"),
        (["--buffer-size", "100"], r"--buffer-size 100 is less than --batch-size 256"),
        # the mujoco preset's 25k random steps on a short run: no gradient step would ever be taken
        (["--total-timesteps", "20000"], r"--learning-starts 25000 is under --batch-size or leaves no gradient step"),
        (
            ["--num-envs", "8", "--total-timesteps", "4", "--learning-starts", "2", "--batch-size", "2"],
            r"less than one step of 8",
        ),
        (["--resume", "no/such/checkpoint.pt"], r"checkpoint 'no/such/checkpoint.pt' does not exist"),
        (["--resume", "FOREIGN"], r"is for Walker2d-v4, not Hopper-v4; pass --env-id Walker2d-v4"),
    ],
    "es": [
        (["--env-id", "CartPol-v1"], r"env 'CartPol-v1' cannot be made \(NameNotFound: Environment `CartPol`"),
        (["--population-size", "7"], r"--population-size 7 must be a positive multiple of 2 x 1 process.*; pass 8"),
        (["--sigma", "0"], r"--sigma 0.0 is out of range; pass a value in \(0, inf\)"),
        (["--hidden-sizes", "32", "0"], r"--hidden-sizes 32 0 has a width below 1"),
        (["--resume", "no/such/checkpoint.pt"], r"checkpoint 'no/such/checkpoint.pt' does not exist"),
        (["--resume", "FOREIGN"], r"is for Acrobot-v1, not CartPole-v1; pass --env-id Acrobot-v1"),
        (["--env-id", "FrozenLake-v1"], r"needs vector observations .* FrozenLake-v1 has Discrete\(16\)"),
        (["--env-id", "Breakout-v5"], r"needs vector observations .* Breakout-v5 has Box\(0, 255, \(4, 84, 84\)"),
        (["--env-id", "odd_envs:Multi-v0"], r"Discrete or bounded Box actions, .* and MultiDiscrete\(\[2 2\]\); pick an env"),
        (["--env-id", "odd_envs:Unbounded-v0"], r"Discrete or bounded Box actions, .* and Box\(-inf, inf, \(1,\)"),
        (["--env-id", "odd_envs:NoLimit-v0"], r"has no time limit.*; pass --max-episode-steps"),
    ],
    "qlearning": [
        (["--env-id", "Pendulum-v1"], r"needs a Discrete action space .*Pendulum-v1 has Box.*; use ppo.py or ddpg_td3.py"),
        (["--env-id", "odd_envs:MultiDiscreteActions-v0"], r"needs a Discrete action space .*has MultiDiscrete"),
        (["--env-id", "Breakout-v5"], r"Box vector observations .*Breakout-v5 has Box\(0, 255, \(4, 84, 84\).*; use dqn.py"),
        (["--env-id", "odd_envs:TupleObs-v0"], r"needs Discrete or Box vector observations .*has Tuple"),
        (["--env-id", "FrozenLak-v1"], r"env 'FrozenLak-v1' cannot be made \(NameNotFound: Environment `FrozenLak`"),
        (["--env-id", "CartPole-v1", "--obs-low", "-1", "-1", "-1", "-1", "--obs-high", "1", "inf", "1", "1"],
         r"the grid is unbounded or empty in dimensions \[1\]; bound it with --obs-low and --obs-high"),
        (["--env-id", "CartPole-v0"], r"the grid is unbounded or empty in dimensions \[1, 3\]; bound it"),
        (["--env-id", "MountainCar-v0", "--obs-low", "0", "--obs-high", "1"], r"need 2 values each"),
        (["--env-id", "MountainCar-v0", "--obs-low", "0", "0", "--obs-high", "0", "1"], r"or empty in dimensions \[0\]"),
        (["--obs-low", "0", "--obs-high", "1"], r"--obs-low shapes the grid over Box observations, and FrozenLake-v1's"),
        (["--total-timesteps", "63"], r"--total-timesteps 63 is less than one step of the 64 envs"),
        (["--resume", "no/such/checkpoint.pt"], r"checkpoint 'no/such/checkpoint.pt' does not exist"),
        (["--resume", "FOREIGN"], r"is for Taxi-v3, not FrozenLake-v1; pass --env-id Taxi-v3"),
    ],
    "ppg_procgen": [
        (["--env-id", "CartPole-v1"], r"runs the 16 Procgen games .*not 'CartPole-v1'; run ppo\.py for it"),
        (["--env-id", "StarpilotEasy-v1"], r"runs the 16 Procgen games .*not 'StarpilotEasy-v1'; run ppo\.py for it"),
        (["--aux-rollouts", "9"], r"--aux-rollouts 9 is more than a phase's 8 rollouts"),
        (["--num-minibatches", "3"], r"does not divide into 3 minibatches"),
        (["--total-timesteps", "100"], r"less than one rollout \(128 steps\)"),
        (["--resume", "PPO_CHECKPOINT"], r"is a ppo\.py checkpoint of format \d+, not a .*, or run ppo\.py$"),
        (["--resume", "FOREIGN"], r"is for BigfishEasy-v0, not StarpilotEasy-v0; pass --env-id BigfishEasy-v0"),
    ],
    "rnd_ppo": [
        (["--env-id", "CartPole-v1"], r"runs envpool's Atari games, and CartPole-v1 is not one; run ppo\.py for it"),
        (["--env-id", "StarpilotEasy-v0"], r"runs envpool's Atari games, and StarpilotEasy-v0 is not one; run ppo\.py"),
        (["--env-id", "MontezumaRevenge-v4"], r"env 'MontezumaRevenge-v4' cannot be made \(NameNotFound"),
        (["--num-minibatches", "3"], r"--num-minibatches 3 does not divide the rollout's 128 steps; pass one that does"),
        (["--total-timesteps", "100"], r"--total-timesteps 100 is less than one rollout \(--num-envs 4 x --num-steps 32"),
        # an env count out of proportion to the run: the line names it beside the budget
        (["--num-envs", "40000", "--total-timesteps", "1000000"],
         r"--total-timesteps 1000000 is less than one rollout \(--num-envs 40000 x --num-steps 32 = 1280000 steps\)"),
        (["--resume", "PPO_CHECKPOINT"], r"is a ppo\.py checkpoint of format \d+, not a .*, or run ppo\.py$"),
        (["--resume", "FOREIGN"], r"is for Venture-v5, not MontezumaRevenge-v5; pass --env-id Venture-v5"),
    ],
}  # fmt: skip

FOREIGN_ENV = dict(
    ppo="Acrobot-v1",
    a2c="Acrobot-v1",
    dqn="Acrobot-v1",
    ddpg_td3="Walker2d-v4",
    es="Acrobot-v1",
    qlearning="Taxi-v3",
    ppg_procgen="BigfishEasy-v0",
    rnd_ppo="Venture-v5",
)
# flags every case of a file starts with: the small sizes of its smoke runs (on the CPU: ppg_procgen.py's phase memory
# check names the CPU's free memory)
BASE = dict(ppg_procgen=[*SMOKE_FLAGS["ppg_procgen"], CPU], rnd_ppo=SMOKE_FLAGS["rnd_ppo"])


@pytest.mark.parametrize(
    "name, flags, message",
    [
        pytest.param(name, flags, message, id=f"{name}-{i}")
        for name, rows in BAD_INPUT.items()
        for i, (flags, message) in enumerate(rows)
    ],
)
def test_bad_input_gets_one_clear_line(name, flags, message, tmp_path, test_env):
    env_id = {"a2c": "CartPole-v1", "ppg_procgen": "StarpilotEasy-v0", "rnd_ppo": "MontezumaRevenge-v5"}.get(name)
    placeholders = {}
    if "PPO_CHECKPOINT" in flags:
        placeholders["PPO_CHECKPOINT"] = write_foreign_checkpoint(tmp_path / "ppo_checkpoint.pt", env_id, "ppo.py")
    if "A2C_MODEL" in flags:
        torch.save({"kind": "model", "args": {"env_id": env_id}, **marks("a2c.py", model={})}, tmp_path / "a2c.model")
        placeholders["A2C_MODEL"] = str(tmp_path / "a2c.model")
    flags = [placeholders.get(f, f) for f in [*BASE.get(name, []), *flags]]
    assert_one_error_line(name, run_bad_input(name, flags, tmp_path, FOREIGN_ENV[name], env=test_env), message)


def ppo_resumed(run, ckpt, out):
    # the schedule went on from the checkpoint: the last learning rate is the last iteration's (60 of 512 steps)
    assert values(run, "charts/learning_rate")[-1] == pytest.approx(2.5e-4 / 60)


def qlearning_resumed(run, ckpt, out):
    """The table goes on from the checkpoint's: the stopped checkpoint resumed again for one vector step (64 updates, in
    another folder) saves a table within a few thousandths of the checkpoint's, where a table started afresh would be
    near zero wherever the checkpoint's has learned values."""
    again = run.parent.parent / "again"
    again.mkdir()
    step = ckpt["global_step"]
    run_algorithm("qlearning", "--resume", str(run.parent.parent / "stopped.pt"), "--total-timesteps", str(step + 64),
                  "--save-model", "--eval-episodes", "1", cwd=again)  # fmt: skip
    table, saved = ckpt["q"], load_file(only_run(again) / "qlearning.model")["q"]
    assert table.abs().max() > 0.2 and (saved - table).abs().max() < 0.05  # measured: 0.82 and 0.001
    # the schedules went on from the checkpoint: the last learning rate is the end of the decay
    assert values(run, "charts/learning_rate")[-1] == pytest.approx(0.01, abs=1e-4)


def rnd_ppo_resumed(run, ckpt, out):
    # the resumed run keeps the checkpoint's statistics: no second random initialisation (a fresh run makes one)
    assert "observation statistics from" not in out
    assert [s for s, _, _ in scalars(run)["charts/obs_norm_init_seconds"]] == [0]


# flags, the step the stop comes at (between two periodic checkpoints), the first periodic checkpoint's step, the total,
# the tag whose steps must each be logged once and those steps, and the file's own checks of the resumed run
RESUMED = {
    "ppo": (["--checkpoint-every", "5120"], 8192, 5120, 30720, "charts/learning_rate", list(range(512, 30721, 512)),
            ppo_resumed),
    # 50 vector steps of 64 envs per log, and the last step (3,125 vector steps)
    "qlearning": (["--log-every", "3200", "--checkpoint-every", "32000"], 48_000, 32_000, 200_000, "charts/learning_rate",
                  [*range(3200, 200_000 + 1, 3200), 200_000], qlearning_resumed),
    "rnd_ppo": ([*SMOKE_FLAGS["rnd_ppo"], "--checkpoint-every", "256"], 640, 256, 1280, "losses/rnd_loss",
                list(range(128, 1281, 128)), rnd_ppo_resumed),
}  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("name", sorted(RESUMED))
def test_stopped_run_resumes_with_no_gap_and_no_repeated_step(name, sig, tmp_path):
    flags, at, first, total, tag, steps, check = RESUMED[name]
    stop_run(name, *flags, "--total-timesteps", str(total), "--progress-interval", "0", cwd=tmp_path, at=at, sig=sig)
    run = only_run(tmp_path)
    ckpt = load_file(run / "checkpoint.pt")
    assert first <= ckpt["global_step"] < total
    shutil.copy(run / "checkpoint.pt", tmp_path / "stopped.pt")  # as it was at the stop, for the file's own checks
    resumed = run_algorithm(name, "--resume", str(run / "checkpoint.pt"), cwd=tmp_path)
    assert f"resumed {run.relative_to(tmp_path)} at step {ckpt['global_step']:,}" in resumed.stdout
    assert only_run(tmp_path) == run  # the same tensorboard run goes on
    assert [s for s, _, _ in scalars(run)[tag]] == steps
    check(run, ckpt, resumed.stdout)
    # the stop's checkpoint, left behind, would train the finished run's last steps again into its folder: refused
    shutil.copy(tmp_path / "stopped.pt", run / "checkpoint.pt")
    proc = run_bad_input(name, ["--resume", str(run / "checkpoint.pt")], tmp_path, "")
    again = "resumed, it would train those steps again"
    assert_one_error_line(name, proc, rf"holds step {ckpt['global_step']:,} of a run that finished at step {total:,}: {again}")
    # with a longer budget the same checkpoint extends the finished run (the schedules follow the new length)
    argv = ["--resume", str(run / "checkpoint.pt"), "--total-timesteps", str(total + 1)]
    longer = run_in_process(name, lambda module: print(module.parse_args(argv).total_timesteps), tmp_path)
    assert longer.returncode == 0 and longer.stdout.splitlines()[-1] == str(total + 1), longer.stderr
