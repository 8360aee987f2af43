"""A small hard-exploration task drawn as Atari frames, for rnd_ppo.py's learning check, which runs only envpool's Atari.

`with_pixel_corridor(module)` gives a loaded algorithm module an `envpool` that also has `PixelCorridor-v0` (every
other id goes to the real envpool), so the script runs its own code, unchanged, on the corridor.

The task: a corridor of LENGTH cells, the agent drawn as a bright bar on a black 84x84 screen at its cell. It starts at
the left end; of its ACTIONS actions one moves it right, one left and the rest do nothing. Reaching the right end scores
1 and ends the episode; --max-episode-steps truncates it. A uniform random walk seldom gets that far, and the
extrinsic reward alone says nothing until it does, so the reward has to be found by going where the agent has not
been: what RND's novelty is for. The frames, the 4-frame stack, info["terminated"] and info["reward"] and the
next-step autoreset (after a done the next step ignores its action and returns reward 0 and the new episode's first
frames) are as envpool's Atari gives them.
"""

import types

import envpool
import gymnasium as gym
import numpy as np

ENV_ID = "PixelCorridor-v0"
LENGTH = 40  # cells; each 2 pixels wide
ACTIONS = 4  # 0: right, 1: left, 2 and 3: stay
STACK = 4


class PixelCorridorSpec:
    """What envpool.make_spec gives for an Atari id, as far as the scripts read it."""

    config = types.SimpleNamespace(episodic_life=False)
    observation_space = gym.spaces.Box(0, 255, (STACK, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(ACTIONS)


class PixelCorridor:
    """num_envs corridors stepped together, with envpool's gymnasium API (reset, step, render, close)."""

    def __init__(self, num_envs: int, max_episode_steps: int = 100, **_ignored):
        self.num_envs, self.max_steps = num_envs, max_episode_steps
        self.pos, self.t = np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int64)
        self.needs_reset = np.zeros(num_envs, bool)
        self.stack = np.zeros((num_envs, STACK, 84, 84), np.uint8)
        self.observation_space, self.action_space = PixelCorridorSpec.observation_space, PixelCorridorSpec.action_space

    def _frames(self) -> np.ndarray:
        frames = np.zeros((self.num_envs, 84, 84), np.uint8)
        for i, p in enumerate(self.pos):
            frames[i, 30:54, 2 + 2 * p : 4 + 2 * p] = 255
        return frames

    def _push(self, envs: np.ndarray, frames: np.ndarray, fill: bool) -> None:
        if fill:  # a new episode: every frame of its stack is its first
            self.stack[envs] = frames[envs, None]
        else:
            self.stack[envs] = np.concatenate([self.stack[envs, 1:], frames[envs, None]], axis=1)

    def _info(self, terminated: np.ndarray, reward: np.ndarray) -> dict:
        ids = np.arange(self.num_envs)
        return dict(terminated=terminated.astype(np.int32), reward=reward, env_id=ids, elapsed_step=self.t)

    def reset(self):
        self.pos[:], self.t[:], self.needs_reset[:] = 0, 0, False
        self._push(np.arange(self.num_envs), self._frames(), fill=True)
        zeros = np.zeros(self.num_envs)
        return self.stack.copy(), self._info(zeros.astype(bool), zeros)

    def step(self, action: np.ndarray):
        action, resetting = np.asarray(action), self.needs_reset.copy()
        move = np.where(action == 0, 1, np.where(action == 1, -1, 0))
        self.pos = np.where(resetting, 0, np.clip(self.pos + move, 0, LENGTH - 1))
        self.t = np.where(resetting, 0, self.t + 1)
        term = ~resetting & (self.pos == LENGTH - 1)
        trunc = ~resetting & ~term & (self.t >= self.max_steps)
        reward = term.astype(np.float64)
        frames = self._frames()
        self._push(np.flatnonzero(resetting), frames, fill=True)
        self._push(np.flatnonzero(~resetting), frames, fill=False)
        self.needs_reset = term | trunc
        return self.stack.copy(), reward, term, trunc, self._info(term, reward)

    def render(self):
        return np.repeat(self.stack[:, -1, :, :, None], 3, axis=-1)

    def close(self):
        pass


def with_pixel_corridor(module) -> None:
    """Give an algorithm module an envpool that also makes PixelCorridor-v0."""
    module.envpool = types.SimpleNamespace(
        list_all_envs=lambda: envpool.list_all_envs() + [ENV_ID],
        make_spec=lambda env_id, **kw: PixelCorridorSpec() if env_id == ENV_ID else envpool.make_spec(env_id, **kw),
        make=lambda env_id, **kw: PixelCorridor(**kw) if env_id == ENV_ID else envpool.make(env_id, **kw),
    )
