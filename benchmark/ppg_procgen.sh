#!/usr/bin/env bash
# PPG on Procgen: the exact commands of CleanRL's benchmark setting (Easy distribution, unlimited levels, 25M steps), 3 seeds
# each, through the runner; references are in benchmark/references.csv.
#
#   env                 steps  reference (mean episodic return at 25M steps)
#   StarpilotEasy-v0    25M    CleanRL ppg_procgen.py 34.8; OpenAI train-procgen PPO (Easy) 35.0
#   BossfightEasy-v0    25M    CleanRL ppg_procgen.py 10.8; OpenAI train-procgen PPO (Easy) 9.0
#   BigfishEasy-v0      25M    CleanRL ppg_procgen.py 24.2; OpenAI train-procgen PPO (Easy) 19.5
# (CleanRL's figures: docs.cleanrl.dev, PPG page, 25M steps; PPO's: Cobbe et al. 2020, "Leveraging Procedural
# Generation", Easy.)
#
# 25M steps is a GPU job. On a 2-core x86 CPU (benchmark/studies/cleanrl_ppg_speed.sh) the
# policy phase ran 165 SPS (53 min per phase of 524,288 steps) and an auxiliary epoch about 74 s per policy iteration's
# frames (40 min per epoch over a full phase, 4 h for 6 epochs): about 4.8 h per phase, 48 phases, 9-10 days for 25M
# steps. `--arch detach` (CleanRL's one-CNN architecture, for a like-for-like comparison with its figures) halves that.
# Needs 6.4 GB of RAM (CPU) or GPU memory (CUDA) for the phase's frames; `--preset small` keeps 1.6 GB.
#
# Usage: bash benchmark/ppg_procgen.sh [STEPS]   (default 25000000; a smaller STEPS runs the same commands shorter)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-25000000}"

source benchmark/common.sh

bench ppg_procgen ppg_procgen StarpilotEasy-v0 BossfightEasy-v0 BigfishEasy-v0 -- --total-timesteps "$steps" --checkpoint-every 1048576
