"""Envs the scripts must turn away with one line, registered on import: `--env-id odd_envs:<Name>-v0`."""

import gymnasium as gym
import numpy as np


class Odd(gym.Env):
    """A vector observation and two actions, and nothing happens; no time limit unless registered with one."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class Unbounded(Odd):
    action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)


class Multi(Odd):
    action_space = gym.spaces.MultiDiscrete([2, 2])


class TupleObs(Odd):
    observation_space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(2)))


class MultiDiscreteActions(Odd):
    observation_space = gym.spaces.Discrete(3)
    action_space = gym.spaces.MultiDiscrete([2, 2])


gym.register("NoLimit-v0", entry_point=Odd)
gym.register("Unbounded-v0", entry_point=Unbounded, max_episode_steps=10)
gym.register("Multi-v0", entry_point=Multi, max_episode_steps=10)
gym.register("TupleObs-v0", entry_point=TupleObs)
gym.register("MultiDiscreteActions-v0", entry_point=MultiDiscreteActions)
