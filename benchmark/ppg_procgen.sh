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
#        bash benchmark/ppg_procgen.sh cpu       (StarPilot, --arch detach, 4 phases: 2,097,152 steps, 2 seeds, --bf16)
# The cpu form is what a 2-core CPU affords, against CleanRL's curve at the same steps (benchmark/reference_curves.csv):
# 4 policy phases (about 18 min each on one thread beside a DQN run) and 3 auxiliary phases of 6 epochs over 524,288
# frames (about 14 min an epoch there), about 5.5 h a seed, on a CPU with AVX512-BF16; on a 2-core CPU without it
# (float32, where --bf16 is slower), two seeds side by side ran their policy phases at 189-194 SPS each, 2.5 times
# slower than there (about 490 SPS). A stopped run goes on with `python benchmark/run.py --name ppg_starpilot_detach_2m
# --resume`, from a checkpoint inside an auxiliary phase too (with the phase's frames, 6.4 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-25000000}"

source benchmark/common.sh

if [[ $steps == cpu ]]; then
  python benchmark/run.py --algo ppg_procgen --name ppg_starpilot_detach_2m --env-ids StarpilotEasy-v0 --seeds 2 --jobs 1 \
    --threads 1 -- --arch detach --total-timesteps 2097152 --bf16 --no-cuda --checkpoint-every 524288
  python benchmark/report.py benchmark/runs/ppg_starpilot_detach_2m --out benchmark/results/ppg_starpilot_detach_2m --keep-data
  exit
fi
bench ppg_procgen ppg_procgen StarpilotEasy-v0 BossfightEasy-v0 BigfishEasy-v0 -- --total-timesteps "$steps" --checkpoint-every 1048576
