#!/usr/bin/env bash
# Tabular Q-learning: the exact commands of the benchmark, 3 seeds each, with each env's preset (its defaults).
# Each run logs to runs/<env>__qlearning__<seed>__<time>/ (with policy.png for the grid worlds) and prints the exact
# return of its greedy policy, computed from gymnasium's transition table, beside the exact optimum; the reference
# figures live in benchmark/references.csv.
#
#   env               steps  optimum (exact, value iteration over the env's own time limit)
#   FrozenLake-v1     300k   0.7442  success probability, 100-step limit (best greedy policy of a table: 0.7402)
#   FrozenLake8x8-v1  4M     0.9132  success probability, 200-step limit (best greedy policy of a table: 0.8936)
#   Taxi-v3           300k   7.93    mean over gymnasium's 300 start states, 200-step limit (envpool also starts
#                                    with the passenger at the destination: 9.555 over its 400, what the sampled
#                                    evaluation of a --save-model run measures)
#   CliffWalking-v0   100k   -13     no time limit in the env; the preset caps episodes at 100 steps
#   MountainCar-v0    5M     none    20x20 grid; report the mean return of the greedy policy over 1000 episodes
#
# The optimum is a time-dependent policy; a Q table's greedy policy is the same at every step, so on the FrozenLakes
# the best it can reach is the figure in brackets (the greedy policy of the exact discounted Q).
#
# Usage: bash benchmark/qlearning.sh [toytext|classic|all]   (SEEDS="1 2 3" by default)
# On a 2-core CPU a toy-text run takes 5-15 s (FrozenLake8x8 about a minute), MountainCar about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS="${SEEDS:-1 2 3}"
family="${1:-all}"

run() {  # run ENV: the env's preset; --save-model reloads the table and evaluates it over 1000 episodes
  for seed in $SEEDS; do python algorithms/qlearning.py --env-id "$1" --seed "$seed" --save-model --progress-interval 30; done
}

if [[ $family == toytext || $family == all ]]; then
  for env in FrozenLake-v1 FrozenLake8x8-v1 Taxi-v3 CliffWalking-v0; do run "$env"; done
fi
if [[ $family == classic || $family == all ]]; then
  run MountainCar-v0
fi
