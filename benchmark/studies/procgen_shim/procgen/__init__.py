"""A stand-in for the procgen package over envpool's Procgen, only for timing CleanRL's ppg_procgen.py on a machine
where procgen does not install (its wheels stop at Python 3.10): ProcgenEnv with the gym 0.23 vector interface that
CleanRL's script uses (a dict observation 'rgb' of HWC frames, done flags, one info dict per env).

It differs from procgen in the reset (envpool's next-step autoreset instead of gym3's same-step one) and in the extra
HWC transpose per step; neither changes the cost of the networks, which is what the comparison measures."""

import envpool
import gym
import numpy as np


class ProcgenEnv(gym.Env):
    def __init__(self, num_envs, env_name, num_levels=0, start_level=0, distribution_mode="easy"):
        env_id = f"{env_name.capitalize()}{distribution_mode.capitalize()}-v0"
        self.env = envpool.make_gymnasium(env_id, num_envs=num_envs, num_levels=num_levels, start_level=start_level)
        self.num_envs = num_envs
        self.observation_space = gym.spaces.Dict(rgb=gym.spaces.Box(0, 255, (64, 64, 3), np.uint8))
        self.action_space = gym.spaces.Discrete(15)

    def reset(self):
        return {"rgb": self.env.reset()[0].transpose(0, 2, 3, 1)}

    def step(self, action):
        obs, reward, term, trunc, _ = self.env.step(action)
        return {"rgb": obs.transpose(0, 2, 3, 1)}, reward, term | trunc, [{} for _ in range(self.num_envs)]
