"""Observations of the kinds a user's own env gives and envpool's Atari never does (tests/obs_envs.py): float (C, H, W)
frames in [0, 1], uint8 vectors (as Atari's RAM is), frames smaller than the Nature CNN takes. ppo.py, a2c.py and dqn.py
learn from the first two as they come and refuse the third in one line; rnd_ppo.py (envpool's Atari only) and
ppg_procgen.py (envpool's Procgen only) refuse all three in one line."""

import gymnasium as gym
import numpy as np
import obs_envs  # noqa: F401  registers the envs in this process, for the in-process refusals
import pytest
import torch

from conftest import CPU, assert_one_error_line, load_algorithm, load_file, only_run, run_algorithm, run_bad_input, values

# The cue task of tests/obs_envs.py: acting at random scores about 10 an episode, reading the cue 20. Each step's reward
# is the whole of what its action earns (the next cue does not depend on it), so a short horizon learns it in a few
# thousand steps: --gamma 0 for dqn.py; 0.5 for ppo.py and a2c.py, where 0 would give a rollout that scores every step
# returns of one value, whose explained variance is NaN (a failed check_run). Each row: the flags, the bar the mean of the
# last 20 episodes must reach, and that mean measured on 2 CPU cores (one thread) over seeds 1-5, with this code and with
# the code before float frames and uint8 vectors were handled (float frames stored as uint8, which truncates them to 0,
# or divided by 255; uint8 vectors into a float network: a traceback, or into it unscaled). The bars leave at least 0.8
# below the worst seed and 1.0 above the best of the code before. Runs of 4,000-8,192 steps, a few seconds each.
PPO = ["--gamma", "0.5", "--total-timesteps", "8192"]  # the atari preset (FloatFrames) or the classic one
A2C = ["--gamma", "0.5", "--total-timesteps", "8000"]
# dqn.py: the atari preset's (FloatFrames) or the classic one's (ByteVector) learning rate and batch, sooner and shorter
DQN = "--gamma 0 --total-timesteps 4000 --learning-starts 500 --buffer-size 4000 --exploration-fraction 0.25".split()
DQN += ["--target-network-frequency", "200"]
LEARNS = {
    ("ppo", "FloatFrames"): (PPO, 17.0, "19.6-19.95; before: 9.5-10.1"),
    ("a2c", "FloatFrames"): ([*A2C, "--num-envs", "4", "--learning-rate", "2e-3"], 17.0, "19.05-19.7; before: 8.9-10.65"),
    ("dqn", "FloatFrames"): (DQN, 17.0, "19.7-20.0; before (divided by 255): 9.15-10.85"),
    ("ppo", "ByteVector"): ([*PPO, "--learning-rate", "1e-3"], 18.0, "19.8-19.9; before: a traceback"),
    ("a2c", "ByteVector"): (A2C, 18.0, "19.9-20.0; before: a traceback"),
    ("dqn", "ByteVector"): (DQN, 18.5, "19.3-19.7; before (unscaled bytes): 15.4-17.5"),
}


@pytest.mark.parametrize("name, env", sorted(LEARNS), ids=[f"{n}-{e}" for n, e in sorted(LEARNS)])
def test_the_observation_arrives_intact_and_the_cue_is_learned(name, env, tmp_path, test_env):
    """The run learns to act on the cue, which it can only where the observation reaches the network as the env gave it
    (float frames not truncated nor divided by 255, uint8 vectors as floats in [0, 1]). FloatFrames are 36x36, the
    smallest frame the Nature CNN takes. Seed 1; the bars and the measured figures are in LEARNS."""
    flags, bar, _measured = LEARNS[name, env]
    run_algorithm(name, "--env-id", f"obs_envs:{env}-v0", "--seed", "1", CPU, *flags, cwd=tmp_path, env=test_env)
    returns = values(only_run(tmp_path), "charts/episodic_return")
    assert np.mean(returns[-20:]) >= bar, returns[-20:]


@pytest.mark.parametrize("name", ["ppo", "a2c", "dqn"])
def test_a_float_frame_reaches_the_first_layer_as_it_is_and_is_left_unchanged(name):
    """The network's input from a float frame is the frame itself (not divided by 255), and the caller's tensor is
    the same after the forward pass (no scaling in place); a uint8 frame is the same picture over 255."""
    module = load_algorithm(name)
    space, actions = gym.make("obs_envs:FloatFrames-v0").observation_space, gym.spaces.Discrete(2)
    net = module.QNetwork(space, actions) if name == "dqn" else module.Agent(space, actions)
    trunk = net.network if name == "dqn" else net.encoder
    frame = torch.rand((3, *space.shape), generator=torch.Generator().manual_seed(0))
    given = frame.clone()
    with torch.no_grad():
        out = net(frame) if name == "dqn" else net.encode(frame)
        assert torch.equal(frame, given), "the forward pass changed its input in place"
        torch.testing.assert_close(out, trunk(given))
        as_bytes = torch.randint(0, 256, frame.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        scaled = module.network_input(as_bytes, torch.float32)
    torch.testing.assert_close(scaled, as_bytes.double().div(255).float())
    assert module.network_input(frame, torch.float32) is frame  # a float32 frame passes as it is, without a copy


SMALL = r"the Nature CNN takes frames of at least 36x36, and obs_envs:SmallFrames-v0 has 16x16; scale them up"
REFUSED = [
    *[
        pytest.param(name, ["--env-id", "obs_envs:SmallFrames-v0"], SMALL, id=f"{name}-SmallFrames")
        for name in ("ppo", "a2c", "dqn")
    ],
    *[
        pytest.param(
            name,
            ["--env-id", "obs_envs:ByteVector-v0", "--norm-obs"],
            r"--norm-obs is for float observations, and obs_envs:ByteVector-v0 has uint8 ones",
            id=f"{name}-ByteVector-norm-obs",
        )
        for name in ("ppo", "a2c")
    ],
    *[
        pytest.param(
            name,
            ["--env-id", f"obs_envs:{env}-v0"],
            r"runs (envpool's Atari|the 16 Procgen) games.*run ppo\.py for it",
            id=f"{name}-{env}",
        )
        for name in ("rnd_ppo", "ppg_procgen")
        for env in ("FloatFrames", "ByteVector", "SmallFrames")
    ],
]


@pytest.mark.parametrize("name, flags, message", REFUSED)
def test_observations_a_file_cannot_take_are_refused_in_one_line(name, flags, message, tmp_path, test_env):
    """One line that says why and what to do, exit 2, no traceback, no run directory (run_bad_input checks it)."""
    assert_one_error_line(name, run_bad_input(name, flags, tmp_path, "CartPole-v1", env=test_env), message)


def test_the_recurrent_preset_leaves_uint8_vectors_unnormalised(tmp_path, test_env):
    """The classic recurrent preset turns --norm-obs on; on uint8 vectors the run goes on with the bytes scaled to [0, 1]
    as the network takes them, without running statistics (normalised floats would not fit the uint8 storage)."""
    flags = ["--env-id", "obs_envs:ByteVector-v0", "--rnn", "lstm", "--total-timesteps", "256", "--save-model"]
    run_algorithm("ppo", *flags, "--eval-episodes", "1", CPU, cwd=tmp_path, env=test_env)
    model = load_file(only_run(tmp_path) / "ppo.model")
    assert model["obs_rms"] is None and not model["args"]["norm_obs"] and model["args"]["rnn_size"] == 64
