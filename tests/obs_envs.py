"""Observations of the kinds a user's own env gives and envpool's Atari never does, registered on import:
`--env-id obs_envs:<Name>-v0`.

Each is the same task, so that a run learns it only where the observation reaches the network intact: a cue on one
side of the observation says which of two actions scores 1 this step (the other scores 0), a fresh cue every step, 20
steps an episode. Acting at random scores about 10, reading the cue 20.
- FloatFrames-v0: (1, 36, 36) float32 frames in [0, 1], the cue a bar of brightness 0.6 in the left or right half (stored
  as uint8 it would truncate to 0; divided by 255 it would be 0.0024). 36x36 is the smallest frame the Nature CNN takes.
- ByteVector-v0: 8 uint8 values, as Atari's RAM is: the first is the cue, 0-63 or 192-255, the others noise.
- SmallFrames-v0: (1, 16, 16) uint8 frames, too small for the Nature CNN.
"""

import gymnasium as gym
import numpy as np

EPISODE = 20


class Cue(gym.Env):
    """Two actions; the one the observation's cue names scores 1."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1, 36, 36), np.float32)
    action_space = gym.spaces.Discrete(2)

    def _observe(self) -> np.ndarray:
        self.side = int(self.np_random.integers(2))
        h, w = self.observation_space.shape[1:]
        frame = np.zeros(self.observation_space.shape, self.observation_space.dtype)
        bright = 0.6 if frame.dtype == np.float32 else 153
        frame[0, h // 4 : 3 * h // 4, self.side * w // 2 : (self.side + 1) * w // 2] = bright
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self.side)
        return self._observe(), reward, False, False, {}


class ByteVector(Cue):
    observation_space = gym.spaces.Box(0, 255, (8,), np.uint8)

    def _observe(self) -> np.ndarray:
        obs = self.np_random.integers(0, 256, 8).astype(np.uint8)
        self.side = int(self.np_random.integers(2))
        obs[0] = self.np_random.integers(0, 64) + 192 * self.side  # 0-63 or 192-255
        return obs


class SmallFrames(Cue):
    observation_space = gym.spaces.Box(0, 255, (1, 16, 16), np.uint8)


gym.register("FloatFrames-v0", entry_point=Cue, max_episode_steps=EPISODE)
gym.register("ByteVector-v0", entry_point=ByteVector, max_episode_steps=EPISODE)
gym.register("SmallFrames-v0", entry_point=SmallFrames, max_episode_steps=EPISODE)
