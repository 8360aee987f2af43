#!/usr/bin/env bash
# PPO: the exact commands that reproduce CleanRL's published PPO results, 3 seeds each, through the runner.
# The preset comes from the env's spaces (--preset auto), and with it the budget; references are in
# benchmark/references.csv:
#
#   env               steps  preset   reference (CleanRL's published tables, docs.cleanrl.dev PPO page)
#   CartPole-v1       500k   classic  490.0 +- 6.1      (ppo.py)
#   Acrobot-v1        500k   classic  -86.4 +- 1.3      (ppo.py)
#   MountainCar-v0    500k   classic  -200.0            (ppo.py; PPO without exploration help does not solve it)
#   Pong-v5           10M    atari    20.4              (ppo_atari_envpool.py)
#   BeamRider-v5      10M    atari    2502              (ppo_atari_envpool.py)
#   Breakout-v5       10M    atari    415               (ppo_atari_envpool.py)
#   HalfCheetah-v4    1M     mujoco   1442.6 +- 46.0    (ppo_continuous_action.py)
#   Walker2d-v4       1M     mujoco   2288.0 +- 571.8   (ppo_continuous_action.py)
#   Hopper-v4         1M     mujoco   2382.9 +- 271.7   (ppo_continuous_action.py)
#
#   masked_envs:CartPoleNoVel-v1 100k --rnn lstm 500.0 +- 0.0   (rl-baselines3-zoo's RecurrentPPO, ppo_lstm)
#   masked_envs:PendulumNoVel-v1 300k --rnn lstm -217.9 +- 140.1 at 100k (rl-baselines3-zoo's RecurrentPPO with gSDE)
#   masked_envs:MountainCarContinuousNoVel-v0 300k --rnn lstm 91.5 +- 1.8 (the zoo, with gSDE; not learned here)
#   Breakout-v5       10M    --rnn lstm 128.9 +- 31.1   (CleanRL ppo_atari_lstm.py: one frame per observation)
#   Pong-v5           10M    --rnn lstm 19.8 +- 1.6     (CleanRL ppo_atari_lstm.py)
#   BeamRider-v5      10M    --rnn lstm 1536 +- 612     (CleanRL ppo_atari_lstm.py)
#
# Usage: bash benchmark/ppo.sh [classic|atari|atari-cpu|mujoco|memory|memory-atari|memory-speed|all]
# How long a run takes, and on what machine: docs/ppo.md, Results. Atari 10M steps wants a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
family="${1:-classic}"

source benchmark/common.sh

if [[ $family == classic || $family == all ]]; then bench ppo ppo_classic CartPole-v1 Acrobot-v1 MountainCar-v0; fi
# On a 16-core GPU machine with a budget (benchmark/results/ppo_atari_pong_h100: Pong-v5 at 18 in 12 minutes of an H100):
#   python algorithms/ppo.py --env-id Pong-v5 --seed 1 --compile --cudagraphs --num-envs 16 --num-minibatches 8
if [[ $family == atari || $family == all ]]; then bench ppo ppo_atari Pong-v5 BeamRider-v5 Breakout-v5; fi
# Atari on a 2-core CPU: 2M of the 10M steps with --bf16 (which learns as float32 does: results/bf16_learning), one
# thread a run, about 2 h a run alone on a CPU with AVX512-BF16 (on one without, in float32, two Breakout runs side by
# side ran at 148-152 SPS each: about 3.7 h a run); the reports table each seed beside CleanRL's curve at the same steps
# (benchmark/reference_curves.csv). A stopped run goes on with `python benchmark/run.py --name NAME --resume`.
if [[ $family == atari-cpu ]]; then
  for env in Pong Breakout; do
    name="ppo_atari_${env,,}_2m"
    python benchmark/run.py --algo ppo --name "$name" --env-ids "$env-v5" --seeds 3 --jobs 1 --threads 1 -- \
      --total-timesteps 2000000 --no-cuda --checkpoint-every 100000 --bf16
    python benchmark/report.py "benchmark/runs/$name" --out "benchmark/results/$name" --keep-data
  done
fi
# MuJoCo as committed in benchmark/results/ppo_mujoco and ppo_mujoco_hopper (run there with --no-cuda as well): a
# checkpoint every 100k steps (a stopped benchmark goes on with `python benchmark/run.py --name ppo_mujoco --resume`)
# and the reloaded model's evaluation at the end
if [[ $family == mujoco || $family == all ]]; then
  bench ppo ppo_mujoco HalfCheetah-v4 Walker2d-v4 Hopper-v4 -- --checkpoint-every 100000 --save-model
fi
# Memory: --rnn lstm (its classic recurrent preset, RNN_PRESETS in ppo.py) on the velocity-masked CartPole
# (benchmark/masked_envs.py), then the same settings without memory, and one report with both on each plot.
if [[ $family == memory || $family == all ]]; then
  export PYTHONPATH="$PWD/benchmark${PYTHONPATH:+:$PYTHONPATH}"  # absolute: the runner runs each script in its own folder
  # the zoo's figure is the trained agent's greedy evaluation: --save-model --eval-deterministic gives the same column
  evaluation=(--total-timesteps 100000 --save-model --eval-deterministic)
  same=(--num-envs 8 --num-steps 32 --num-minibatches 1 --update-epochs 20 --learning-rate 1e-3 --gamma 0.98
        --gae-lambda 0.8 --ent-coef 0 --norm-obs)
  bench ppo ppo_lstm_masked_cartpole masked_envs:CartPoleNoVel-v1 -- --rnn lstm "${evaluation[@]}"
  bench ppo ppo_no_memory_masked_cartpole masked_envs:CartPoleNoVel-v1 -- "${same[@]}" "${evaluation[@]}"
  python benchmark/report.py benchmark/results/ppo_lstm_masked_cartpole \
    --compare benchmark/results/ppo_no_memory_masked_cartpole
  # the masked Pendulum with the zoo's PendulumNoVel-v1 settings (4 envs x 1024 steps, 10 epochs, lr 1e-3, gamma 0.9,
  # lambda 0.95; minibatches of one env, as whole sequences need, and no gSDE, which ppo.py does not have), for 300k
  # steps: at the zoo's 100k the LSTM is still far from its figure. About 2 minutes a run, two at a time.
  pendulum=(--num-envs 4 --num-steps 1024 --num-minibatches 4 --update-epochs 10 --learning-rate 1e-3 --gamma 0.9
            --gae-lambda 0.95 --ent-coef 0 --total-timesteps 300000 --save-model --eval-deterministic)
  bench ppo ppo_lstm_masked_pendulum masked_envs:PendulumNoVel-v1 -- --rnn lstm "${pendulum[@]}"
  bench ppo ppo_no_memory_masked_pendulum masked_envs:PendulumNoVel-v1 -- "${pendulum[@]}"
  python benchmark/report.py benchmark/results/ppo_lstm_masked_pendulum \
    --compare benchmark/results/ppo_no_memory_masked_pendulum
  # The masked MountainCarContinuous with the zoo's MountainCarContinuousNoVel-v0 settings (minibatches of one env, no
  # gSDE) does not learn in its 300k steps (docs/ppo.md says how it fails and what it would take), so it is not in the
  # family; to see it:
  #   bench ppo ppo_lstm_masked_mountaincar masked_envs:MountainCarContinuousNoVel-v0 -- --rnn lstm --rnn-size 32 \
  #     --num-envs 8 --num-steps 1024 --num-minibatches 8 --update-epochs 10 --learning-rate 7.77e-5 --no-anneal-lr \
  #     --gamma 0.9999 --gae-lambda 0.9 --clip-coef 0.1 --ent-coef 0.00429 --vf-coef 0.19 --max-grad-norm 5 --norm-obs \
  #     --total-timesteps 300000
fi
# Memory on Atari: --rnn lstm with the recurrent Atari preset (RNN_PRESETS in ppo.py: one frame per observation, a
# 128-unit LSTM, the atari preset's other settings; CleanRL's ppo_atari_lstm.py), 10M steps, against CleanRL's
# published ppo_atari_lstm.py results (report.py reads the rows keyed ppo:lstm in references.csv). Like the atari
# family, a job for a GPU machine; the reloaded model's evaluation at the end.
if [[ $family == memory-atari || $family == all ]]; then
  bench ppo ppo_lstm_atari Breakout-v5 Pong-v5 BeamRider-v5 -- --rnn lstm --checkpoint-every 1000000 --save-model
fi
# Memory, speed: ppo.py --rnn lstm against sb3-contrib's RecurrentPPO with the same settings and sizes
# (benchmark/studies/sb3_recurrent_ppo.py), 100k steps each, one thread, two rounds back to back; whole-process wall times
if [[ $family == memory-speed ]]; then
  sb3_deps
  [ -d "$DEPS/sb3_contrib" ] || python -m pip install -q --target "$DEPS" --no-deps sb3-contrib==2.9.2 >&2
  export PYTHONPATH="$PWD/benchmark:$DEPS${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
  out=$(mktemp -d)
  for round in 1 2; do
    start=$(date +%s.%N)
    (cd "$out" && python "$OLDPWD/algorithms/ppo.py" --env-id masked_envs:CartPoleNoVel-v1 --rnn lstm --no-cuda \
      --total-timesteps 100000 --seed "$round" --progress-interval 1000 | grep -E "^step 99" | tail -n 1)
    echo "round $round: ppo.py --rnn lstm, $(python -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
    start=$(date +%s.%N)
    python benchmark/studies/sb3_recurrent_ppo.py --seed "$round" --total-timesteps 100000
    echo "round $round: sb3-contrib RecurrentPPO, $(python -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
  done
fi
