"""Envs whose data goes bad after a while, as custom envs and simulators do, registered on import:
`--env-id bad_data_envs:<Name>-v0`. The envs of a process count their steps together, across episodes (of 50 steps)
and instances (es.py makes new envs each generation); from the BAD_FROM-th (the environment variable, default 300) on,
each step gives a NaN reward (NanReward), an inf in its observation (InfObs), or a finite reward so large (HUGE, default
1e30) that the losses computed from it overflow (HugeReward: training turns non-finite, the env's data does not). The
*Box ids take a continuous action (ddpg_td3.py)."""

import os

import gymnasium as gym
import numpy as np

BAD_FROM = int(os.environ.get("BAD_FROM", 300))
HUGE = float(os.environ.get("HUGE", 1e30))


class Turning(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    turns = "reward"  # reward, observation or huge

    steps = 0  # every instance's, in this process

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        Turning.steps += 1
        obs, reward = self.np_random.uniform(-1, 1, 2).astype(np.float32), float(self.np_random.uniform())
        if Turning.steps >= BAD_FROM:
            if self.turns == "reward":
                reward = float("nan")
            elif self.turns == "observation":
                obs[1] = np.inf
            else:
                reward = HUGE
        return obs, reward, False, False, {}


class BoxActions(Turning):
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


for kind, name in (("reward", "NanReward"), ("observation", "InfObs"), ("huge", "HugeReward")):
    for base, suffix in ((Turning, ""), (BoxActions, "Box")):
        cls = type(f"{name}{suffix}", (base,), {"turns": kind})
        gym.register(f"{name}{suffix}-v0", entry_point=cls, max_episode_steps=50)
