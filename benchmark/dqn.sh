#!/usr/bin/env bash
# DQN: the exact commands that reproduce CleanRL's published DQN results, 3 seeds each, through the runner.
# The preset comes from the env's spaces (--preset auto), and with it the budget; the reference figures live in
# benchmark/references.csv, and each family's plots and table go to benchmark/results/dqn_<family>/.
#
#   env               steps  preset   reference (CleanRL's published tables, docs.cleanrl.dev DQN page)
#   CartPole-v1       500k   classic  488.69 +- 16.11     (dqn.py)
#   Acrobot-v1        500k   classic  -91.54 +- 7.20      (dqn.py)
#   MountainCar-v0    500k   classic  -194.95 +- 8.48     (dqn.py)
#   Pong-v5           10M    atari    20.25 +- 0.41       (dqn_atari.py; Mnih et al. 2015, 50M steps: 18.9 +- 1.3)
#   Breakout-v5       10M    atari    366.93 +- 39.89     (dqn_atari.py; Mnih et al. 2015, 50M steps: 401.2 +- 26.9)
#   BeamRider-v5      10M    atari    6673.24 +- 1434.37  (dqn_atari.py; Mnih et al. 2015, 50M steps: 6846 +- 1619)
#
# Classic control runs its one env through gymnasium in the process (--env-backend auto: faster than envpool for a
# single env), as CleanRL's dqn.py does; runs through envpool's CartPole gave alike results.
#
# CleanRL ran the NoFrameskip-v4 games through SB3's wrappers (noop reset, frame skip 4 with max-pooling, episodic
# life, FIRE on reset, clipped rewards, 84x84 grey, 4-frame stacks, no sticky actions): envpool's -v5 defaults
# with episodic life and reward clipping, as the atari preset sets them.
#
# Usage: bash benchmark/dqn.sh [classic|atari|atari-cpu|all|speed|memory]
# Classic control takes a few minutes a run on a 2-core CPU; Atari 10M steps wants a GPU (and 8 GB of memory for
# the 1M-transition replay buffer).
#   speed:  SPS and the time split (env steps / updates / the rest) on CartPole-v1 with the classic preset and on
#           Breakout-v5 with the atari preset shortened to 20k steps (learning from step 10k).
#   memory: fills the atari preset's 1M-transition replay buffer with real Breakout frames (REAL_STEPS of play,
#           default 1M, then those frames again) and prints its size and the process's peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
family="${1:-classic}"

source benchmark/common.sh

if [[ $family == classic || $family == all ]]; then bench dqn dqn_classic CartPole-v1 Acrobot-v1 MountainCar-v0; fi
if [[ $family == atari || $family == all ]]; then bench dqn dqn_atari Pong-v5 Breakout-v5 BeamRider-v5; fi
# Breakout on a 2-core CPU: 2M of the 10M steps, one seed, with epsilon decaying over the first 1M steps as in the
# 10M-step run (0.1 of 10M: --exploration-fraction 0.5 of 2M), so that the curve compares with CleanRL's at the same
# steps (benchmark/reference_curves.csv); float32. About 4 h at 129 SPS on one thread of a 2-core x86 CPU with
# AVX-512 (once learning: 160 SPS on two threads there; about 72 on two threads of one without); the checkpoint
# (every 250k steps, and on a stop) keeps the replay buffer, 7 GB, so that `python benchmark/run.py --name
# dqn_atari_breakout_2m --resume` goes on where it stopped.
if [[ $family == atari-cpu ]]; then
  python benchmark/run.py --algo dqn --name dqn_atari_breakout_2m --env-ids Breakout-v5 --seeds 1 --jobs 1 --threads 1 -- \
    --total-timesteps 2000000 --exploration-fraction 0.5 --no-cuda --checkpoint-every 250000 --save-buffer
  python benchmark/report.py benchmark/runs/dqn_atari_breakout_2m --out benchmark/results/dqn_atari_breakout_2m --keep-data
fi
if [[ $family == speed ]]; then
  python algorithms/dqn.py --env-id CartPole-v1 --total-timesteps 100000 --exp-name speed | tail -4
  python algorithms/dqn.py --env-id Breakout-v5 --total-timesteps 20000 --learning-starts 10000 --exp-name speed | tail -4
fi
if [[ $family == memory ]]; then
  REAL_STEPS="${REAL_STEPS:-1000000}" python - <<'EOF'
import os, resource, sys, time
import envpool, numpy as np, torch
sys.path.insert(0, "algorithms")
import dqn

args = dqn.parse_args(["--env-id", "Breakout-v5"])
envs = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, seed=1, episodic_life=True, reward_clip=True)
obs, _ = envs.reset()
rb = dqn.ReplayBuffer(args.buffer_size, 1, envs.observation_space, True, 1)
rb.add_obs(obs, np.ones(1, bool))
real_steps, played, t0 = int(os.environ["REAL_STEPS"]), [], time.time()
rng, valid, first = np.random.default_rng(0), np.ones(1, bool), np.zeros(1, bool)
for t in range(args.buffer_size):
    if t < real_steps:
        obs, reward, term, trunc, info = envs.step(rng.integers(0, 4, 1))
        step = (obs, reward, term, ~(term | trunc), info["terminated"].astype(bool) | trunc)
        played.append(step) if len(played) < 5000 else None
    else:  # the frames already played, again: every page of the buffer is written all the same
        step = played[t % len(played)]
    rb.add(rng.integers(0, 4, 1), step[1], step[2], valid, step[0], first)
    valid, first = step[3], step[4]
q_network = dqn.QNetwork(envs.observation_space, envs.action_space)
batch = rb.sample(args.batch_size, torch.device("cpu"))
q_network(batch["obs"]).sum().backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss is in KiB on Linux
nbytes = sum(a.nbytes for a in vars(rb).values() if isinstance(a, np.ndarray))
print(f"{args.buffer_size:,} transitions: buffer {nbytes / 1e9:.2f} GB, peak RSS {peak:.2f} GB "
      f"({min(real_steps, args.buffer_size):,} real steps, {time.time() - t0:.0f} s)")
EOF
fi
