#!/usr/bin/env bash
# Tabular Q-learning: the exact commands of the benchmark, 3 seeds each, with each env's preset (its defaults), through
# the runner. Each run logs the exact return of its greedy policy (eval/exact_return, computed from gymnasium's
# transition table) and prints it beside the exact optimum, and when it came within the tolerance of it; the report
# (benchmark/results/qlearning_<family>/) compares the exact return with the optimum in benchmark/references.csv, and
# optimum_reached.txt beside it collects each run's step and training time to the optimum.
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
# Usage: bash benchmark/qlearning.sh [toytext|classic|all]
# On a 2-core CPU a toy-text run takes 5-15 s (FrozenLake8x8 about a minute), MountainCar about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
family="${1:-all}"

source benchmark/common.sh

qbench() {  # bench, plus each run's step and training time to the optimum, from its log
  bench qlearning "$@" -- --save-model --progress-interval 30
  grep -H "of the optimum from step" "benchmark/runs/$1"/logs/*.log | sed 's|.*/logs/||' \
    >"benchmark/results/$1/optimum_reached.txt" || true
}

if [[ $family == toytext || $family == all ]]; then qbench qlearning_toytext FrozenLake-v1 FrozenLake8x8-v1 Taxi-v3 CliffWalking-v0; fi
if [[ $family == classic || $family == all ]]; then qbench qlearning_classic MountainCar-v0; fi
