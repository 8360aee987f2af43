#!/usr/bin/env bash
# PPO: the exact commands that reproduce CleanRL's published PPO results, 3 seeds each.
# Each run logs to runs/<env>__ppo__<seed>__<time>/; the reference figures live in benchmark/references.csv.
#
#   env               steps  preset   reference (CleanRL's published tables, docs.cleanrl.dev PPO page)
#   CartPole-v1       500k   classic  490.0 +- 6.1      (ppo.py)
#   Acrobot-v1        500k   classic  -86.4 +- 1.3      (ppo.py)
#   MountainCar-v0    500k   classic  -200.0            (ppo.py; PPO without exploration help does not solve it)
#   Pong-v5           10M    atari    20.4              (ppo_atari_envpool.py)
#   BeamRider-v5      10M    atari    2502              (ppo_atari_envpool.py)
#   Breakout-v5       10M    atari    415               (ppo_atari_envpool.py)
#   HalfCheetah-v4    1M     mujoco   1443              (ppo_continuous_action.py)
#   Walker2d-v4       1M     mujoco   2288              (ppo_continuous_action.py)
#   Hopper-v4         1M     mujoco   2383              (ppo_continuous_action.py)
#
# Usage: bash benchmark/ppo.sh [classic|atari|mujoco|all]   (SEEDS="1 2 3" by default)
# Classic control takes about 1.5 minutes a run on a 2-core CPU; Atari 10M steps takes about 7 hours a run on
# that CPU (about 400 SPS) and wants a GPU; MuJoCo 1M steps is about an hour a run on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS="${SEEDS:-1 2 3}"
family="${1:-classic}"

run() {  # run ENV: the preset is chosen from the env's spaces (--preset auto); the budget is the preset's
  for seed in $SEEDS; do python algorithms/ppo.py --env-id "$1" --seed "$seed" --eval-every 0; done
}

if [[ $family == classic || $family == all ]]; then
  for env in CartPole-v1 Acrobot-v1 MountainCar-v0; do run "$env"; done
fi
if [[ $family == atari || $family == all ]]; then
  for env in Pong-v5 BeamRider-v5 Breakout-v5; do run "$env"; done
fi
if [[ $family == mujoco || $family == all ]]; then
  for env in HalfCheetah-v4 Walker2d-v4 Hopper-v4; do run "$env"; done
fi
