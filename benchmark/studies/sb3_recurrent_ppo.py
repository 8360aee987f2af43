"""sb3-contrib's RecurrentPPO on the velocity-masked CartPole, with the settings ppo.py's `--rnn lstm` takes and the
same network sizes, to time the two side by side. Run by `bash benchmark/ppo.sh memory-speed`, which puts
stable-baselines3 and sb3-contrib on the path (pip --target, no other change).

    python benchmark/studies/sb3_recurrent_ppo.py --seed 1 --total-timesteps 100000

Settings: rl-baselines3-zoo's CartPoleNoVel-v1 entry (hyperparams/ppo_lstm.yml: 8 envs x 32 steps, batch 256, 20
epochs, gamma 0.98, lambda 0.8, no entropy bonus, learning rate 1e-3 annealed, clip 0.2 annealed) with observations
normalised (VecNormalize, observations only) as ppo.py's preset does; the network as ppo.py's: one LSTM of 64 units
shared by actor and critic (shared_lstm=True, enable_critic_lstm=False), then 64-64 tanh MLPs. Prints the mean return
of the last 100 training episodes and the steps per second of learn() (the whole training, env steps included)."""

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmark/, for masked_envs
import masked_envs  # noqa: E402,F401  (registers CartPoleNoVel-v1)

try:
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
except ImportError:
    raise SystemExit(
        "sb3_recurrent_ppo.py: sb3-contrib is missing; run it with `bash benchmark/ppo.sh memory-speed`"
    ) from None

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--seed", type=int, default=1)
p.add_argument("--total-timesteps", type=int, default=100_000)
args = p.parse_args()
torch.set_num_threads(1)


def linear(start: float):
    return lambda progress_remaining: progress_remaining * start  # the zoo's lin_<x>: from x at the start to 0 at the end


venv = VecNormalize(make_vec_env("CartPoleNoVel-v1", n_envs=8, seed=args.seed), norm_obs=True, norm_reward=False)
model = RecurrentPPO(
    "MlpLstmPolicy", venv, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8, ent_coef=0.0,
    learning_rate=linear(1e-3), clip_range=linear(0.2), seed=args.seed, device="cpu",
    policy_kwargs=dict(lstm_hidden_size=64, shared_lstm=True, enable_critic_lstm=False),
)  # fmt: skip
start = time.time()
model.learn(args.total_timesteps)
seconds = time.time() - start
returns = [info["r"] for info in model.ep_info_buffer]  # SB3's Monitor: the last 100 episodes
print(f"sb3-contrib RecurrentPPO: {args.total_timesteps / seconds:.0f} SPS, last 100 episodes {np.mean(returns):.1f}")
