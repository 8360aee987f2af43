#!/usr/bin/env bash
# DDPG and TD3: the exact commands that reproduce the published MuJoCo results, 3 seeds x 1M steps each, through the
# runner. The mujoco preset holds the settings of CleanRL's td3_continuous_action.py and ddpg_continuous_action.py
# (256-256 ReLU MLPs, Adam 3e-4, batch 256, 1M buffer, tau 0.005, 25k random steps first, exploration noise 0.1);
# the references are also in benchmark/references.csv.
#
#   env               steps  algo  reference
#   HalfCheetah-v4    1M     td3   9583.22 +- 126.09   CleanRL td3_continuous_action.py (docs.cleanrl.dev, TD3 page)
#   Walker2d-v4       1M     td3   4057.59 +- 658.78   CleanRL td3_continuous_action.py
#   Hopper-v4         1M     td3   3134.61 +- 360.18   CleanRL td3_continuous_action.py
#   HalfCheetah-v1    1M     td3   9636.95 +- 859.07   Fujimoto et al. 2018, Table 1 (gym MuJoCo v1 envs; max over
#   Hopper-v1         1M     td3   3564.07 +- 114.74     the run of the evaluation return, 10 seeds: compare with the
#   Walker2d-v1       1M     td3   4682.82 +- 539.64     -v4 runs with care)
#   HalfCheetah-v4    1M     ddpg  10374.07 +- 157.37  CleanRL ddpg_continuous_action.py (docs.cleanrl.dev, DDPG page)
#   Walker2d-v4       1M     ddpg  1240.16 +- 390.10   CleanRL ddpg_continuous_action.py
#   Hopper-v4         1M     ddpg  1576.78 +- 818.98   CleanRL ddpg_continuous_action.py
#
# CleanRL's ddpg_continuous_action.py delays its actor and target updates too (policy_frequency 2), and so does
# --algo ddpg (--policy-frequency 1 gives the every-step DDPG of Lillicrap et al. 2016 and Fujimoto et al. 2018's
# "OurDDPG"). CleanRL's figures are the mean return of the last training episodes (the report's score).
# benchmark/report.py looks references up by (script, env), and by (script:algo, env) first for runs given --algo:
# the td3 rows are keyed ddpg_td3, the ddpg rows ddpg_td3:ddpg.
#
# Usage: bash benchmark/ddpg_td3.sh [td3|ddpg|mujoco|pendulum|speed]   (mujoco = td3 and ddpg)
# A 1M-step MuJoCo run does 1M gradient steps of 256-256 networks (about 0.4 GFLOP each): about 2.4 h per run at
# 110-120 SPS on one core of a 2-core x86 CPU (beside an A2C run), compute-bound (~47 GFLOP/s, near one core's
# float32 peak), or 1.6 h at 171 SPS with OMP_NUM_THREADS=2 alone; 9 runs per algo: a GPU machine, or stop and
# resume (the checkpoints below).
#   pendulum: TD3 and DDPG on Pendulum-v1 with the classic preset (15k steps, 64-64 MLPs), 3 seeds: about a minute
#             a run on a 2-core CPU (TD3 reaches -250 by 7-9k steps, tests/test_ddpg_td3.py).
#   speed:    SPS on Hopper-v4 once learning has started (1 env, batch 256, 256-256 MLPs; 256 random steps, then
#             4,744 gradient steps), 1 thread and 2.
set -euo pipefail
cd "$(dirname "$0")/.."
family="${1:-td3}"

source benchmark/common.sh

# A checkpoint with the replay buffer every 100k steps (110-170 MB): a run this long is stopped and goes on later
# (`python benchmark/run.py --name ddpg_td3_td3_mujoco --resume`) with its experience. benchmark/results/ddpg_td3_td3_mujoco
# holds Hopper-v4 and HalfCheetah-v4 (run with --env-ids Hopper-v4 HalfCheetah-v4 and --no-cuda, two at a time,
# --jobs 2 --threads 1). Its runner folder was not kept before HalfCheetah seeds 2-3 ran, so they ran from step 0 into a
# new folder with --start-seed 2 --seeds 2; their data and report are in halfcheetah_seeds_2_3/.
ckpt=(--save-model --checkpoint-every 100000 --save-buffer)
if [[ $family == td3 || $family == mujoco ]]; then
  bench ddpg_td3 ddpg_td3_td3_mujoco HalfCheetah-v4 Hopper-v4 Walker2d-v4 -- --algo td3 "${ckpt[@]}"
fi
if [[ $family == ddpg || $family == mujoco ]]; then
  bench ddpg_td3 ddpg_td3_ddpg_mujoco HalfCheetah-v4 Hopper-v4 Walker2d-v4 -- --algo ddpg "${ckpt[@]}"
fi
if [[ $family == pendulum ]]; then
  bench ddpg_td3 ddpg_td3_td3_pendulum Pendulum-v1 -- --algo td3 --save-model
  bench ddpg_td3 ddpg_td3_ddpg_pendulum Pendulum-v1 -- --algo ddpg --save-model
fi
if [[ $family == speed ]]; then
  for threads in 1 2; do
    echo "OMP_NUM_THREADS=$threads"
    OMP_NUM_THREADS=$threads python algorithms/ddpg_td3.py --env-id Hopper-v4 --total-timesteps 5000 \
      --learning-starts 256 --log-every 500 --exp-name speed | tail -4
  done
fi
