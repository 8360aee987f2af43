"""A tiny gymnasium env that envpool does not have, registered on import: `--env-id corridor_env:Corridor-v0`."""

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right along a corridor of 5 cells: +1 at the end (termination); a 20-step limit truncates."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (5,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def _obs(self):
        obs = np.zeros(5, np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = max(0, min(4, self.pos + (1 if action == 1 else -1)))
        done = self.pos == 4
        return self._obs(), float(done), done, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=20)
