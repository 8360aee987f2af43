"""benchmark/masked_envs.py: the velocity-masked tasks are their base envs with exactly the velocity entries at 0."""

import gymnasium as gym
import masked_envs
import numpy as np
import pytest

from conftest import load_algorithm


@pytest.mark.parametrize("masked_id", sorted(masked_envs.MASKED))
def test_a_masked_env_is_its_base_env_with_the_velocities_at_zero(masked_id):
    """Same seed, same actions: the same rewards, terminations and truncations, and observations equal to the base
    env's except the velocity entries, which are 0 at every step (reset steps included) and only there."""
    base_id, entries = masked_envs.MASKED[masked_id]
    masked, base = gym.make(masked_id), gym.make(base_id)
    hidden = np.zeros(base.observation_space.shape, bool)
    hidden[list(entries)] = True
    base.action_space.seed(0)
    for episode in range(2):
        (obs, _), (base_obs, _) = masked.reset(seed=episode), base.reset(seed=episode)
        for _ in range(base.spec.max_episode_steps):
            assert (obs[hidden] == 0).all() and (obs[~hidden] == base_obs[~hidden]).all()
            action = base.action_space.sample()
            obs, reward, term, trunc, _ = masked.step(action)
            base_obs, base_reward, base_term, base_trunc, _ = base.step(action)
            assert (reward, term, trunc) == (base_reward, base_term, base_trunc)
            if term or trunc:
                break
        assert term or trunc  # the base env's own time limit truncates the masked one too
    assert masked.observation_space == base.observation_space and masked.action_space == base.action_space


def test_the_scripts_reach_the_masked_envs_by_their_module_path():
    """`--env-id masked_envs:CartPoleNoVel-v1` with benchmark/ on the path goes through ppo.py's gymnasium path."""
    ppo = load_algorithm("ppo")
    envs, is_atari = ppo.make_env("masked_envs:CartPoleNoVel-v1", 3, 0, False, False, "auto")
    obs, _ = envs.reset(seed=0)
    assert not is_atari and obs.shape == (3, 4) and (obs[:, [1, 3]] == 0).all() and (obs[:, [0, 2]] != 0).all()
    envs.close()
