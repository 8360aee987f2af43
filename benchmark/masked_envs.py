"""Partially observed classic-control tasks: the velocities hidden, so that a policy needs memory to act well.

rl-baselines3-zoo's "NoVel" envs, as its benchmark of recurrent PPO defines them: the base env's observation with its
velocity entries multiplied by 0 (CartPole-v1: cart velocity and pole angular velocity, entries 1 and 3; Pendulum-v1:
angular velocity, entry 2; MountainCarContinuous-v0: velocity, entry 1). Everything else (dynamics, rewards, time
limits, rendering) is the base env's. Registered with gymnasium on import; the scripts reach them through their
gymnasium path with the module named in the id, this folder on the path:

    PYTHONPATH=benchmark python algorithms/ppo.py --env-id masked_envs:CartPoleNoVel-v1
"""

import gymnasium as gym
import numpy as np

# masked id: (base id, the observation entries that are velocities)
MASKED = {
    "CartPoleNoVel-v1": ("CartPole-v1", (1, 3)),
    "PendulumNoVel-v1": ("Pendulum-v1", (2,)),
    "MountainCarContinuousNoVel-v0": ("MountainCarContinuous-v0", (1,)),
}


class MaskVelocity(gym.ObservationWrapper):
    """The base env with the given observation entries set to 0; the observation space keeps its shape and bounds."""

    def __init__(self, env: gym.Env, velocity_entries: tuple[int, ...]):
        super().__init__(env)
        self.mask = np.ones(env.observation_space.shape, dtype=env.observation_space.dtype)
        self.mask[list(velocity_entries)] = 0

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation * self.mask


def make_masked(base_id: str, velocity_entries: tuple[int, ...], **kwargs) -> gym.Env:
    """The base env as gymnasium makes it (its own time limit included), with its velocities masked."""
    return MaskVelocity(gym.make(base_id, **kwargs), velocity_entries)


for _masked_id, (_base_id, _entries) in MASKED.items():
    if _masked_id not in gym.registry:
        # no max_episode_steps here: the base env's own TimeLimit, inside the wrapper, already truncates
        gym.register(_masked_id, entry_point=make_masked, kwargs=dict(base_id=_base_id, velocity_entries=_entries))
