"""Stable-Baselines3's own A2C with rl-baselines3-zoo's MuJoCo entry, to tell a2c.py's behaviour from A2C's: the zoo's
HalfCheetah-v3/Hopper-v3 entry is SB3's A2C defaults (1 env, 5 steps, RMSprop lr 7e-4, 64-64 tanh, log std 0) with
`normalize: true` for 1M steps (the zoo's hyperparams/a2c.yml), which the zoo turns into VecNormalize's defaults while
training: observations and rewards normalised (its model cards list norm_reward False: the evaluation's setting). Run
by `bash benchmark/a2c.sh sb3`, which puts stable-baselines3 and mujoco on the path.

    python benchmark/studies/sb3_a2c_mujoco.py HalfCheetah-v4 --seed 1 --out /tmp/sb3_a2c

Writes <out>/<env>_<seed>.monitor.csv (each training episode's raw return, SB3's Monitor) and prints the mean return of
the last 100 training episodes, the final agent's greedy evaluation (10 episodes, normalisation frozen: the zoo's
figure) and the mean size of the greedy action before clipping to [-1, 1]."""

import argparse
import os
import time

import gymnasium as gym
import numpy as np
import torch

try:
    from stable_baselines3 import A2C
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
except ImportError:
    raise SystemExit("sb3_a2c_mujoco.py: stable-baselines3 is missing; run it with `bash benchmark/a2c.sh sb3`") from None

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("env_id", help="a gymnasium MuJoCo id, e.g. HalfCheetah-v4")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--total-timesteps", type=int, default=1_000_000)
p.add_argument("--out", default="/tmp/sb3_a2c", help="folder of the monitor CSVs")
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)
torch.set_num_threads(1)

monitor = os.path.join(args.out, f"{args.env_id}_{args.seed}.monitor.csv")
venv = VecNormalize(DummyVecEnv([lambda: Monitor(gym.make(args.env_id), monitor)]), norm_obs=True, norm_reward=True)
model = A2C("MlpPolicy", venv, seed=args.seed, device="cpu")
start = time.time()
model.learn(args.total_timesteps)
returns = np.loadtxt(monitor, delimiter=",", skiprows=2, usecols=0, ndmin=1)
print(f"{args.env_id} seed {args.seed}: {args.total_timesteps:,} steps in {time.time() - start:.0f} s; "
      f"last 100 training episodes {returns[-100:].mean():.1f}")  # fmt: skip

# the zoo's evaluation: the final agent, greedy, with the training normalisation statistics frozen
eval_env = VecNormalize(DummyVecEnv([lambda: gym.make(args.env_id)]), norm_obs=True, norm_reward=False, training=False)
eval_env.obs_rms = venv.obs_rms
eval_env.seed(args.seed + 10_000)
obs, episode, scores, sizes = eval_env.reset(), 0.0, [], []
while len(scores) < 10:
    with torch.no_grad():  # the Gaussian's mean, before SB3's predict clips it to the action bounds
        mean = model.policy.get_distribution(torch.as_tensor(obs).float()).distribution.mean.numpy()
    sizes.append(np.abs(mean).mean())
    obs, _, done, _ = eval_env.step(np.clip(mean, -1.0, 1.0))
    episode += float(eval_env.get_original_reward()[0])
    if done[0]:
        scores.append(episode)
        episode = 0.0
print(f"greedy evaluation of the final agent: {np.mean(scores):.1f} +- {np.std(scores):.1f} over 10 episodes; "
      f"mean |action| before clipping {np.mean(sizes):.2f}")  # fmt: skip
