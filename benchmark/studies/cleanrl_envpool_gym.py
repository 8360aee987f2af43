"""Run a CleanRL script written for envpool's old gym API (`envpool.make(..., env_type="gym")`, gym 0.23: reset returns
the observations, step returns (obs, reward, done, info)) with the envpool installed here, whose gym API is gone: only
for timing CleanRL's ppo_rnd_envpool.py beside rnd_ppo.py (benchmark/studies/cleanrl_rnd_speed.sh). Needs gym 0.23 on the path.

    python benchmark/studies/cleanrl_envpool_gym.py path/to/ppo_rnd_envpool.py [its flags]

The stand-in steps envpool's gymnasium pool and joins termination and truncation into done, as the old API did; the
info dict (reward, terminated, lives, ...) is envpool's own. Nothing else of the script changes."""

import runpy
import sys

import envpool
import gym
import numpy as np

make = envpool.make


class OldGymPool(gym.Env):
    def __init__(self, pool):
        self.pool, self.num_envs = pool, pool.config["num_envs"]
        space = pool.observation_space
        self.observation_space = gym.spaces.Box(space.low, space.high, space.shape, space.dtype)
        self.action_space = gym.spaces.Discrete(int(pool.action_space.n))

    def reset(self):
        return self.pool.reset()[0]

    def step(self, action):
        obs, reward, term, trunc, info = self.pool.step(np.asarray(action))
        return obs, reward, term | trunc, info


def make_old_gym(task_id, env_type="gymnasium", **kwargs):
    if env_type == "gym":
        return OldGymPool(make(task_id, env_type="gymnasium", **kwargs))
    return make(task_id, env_type=env_type, **kwargs)


if __name__ == "__main__":
    envpool.make = make_old_gym
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
