#!/usr/bin/env bash
# A2C: the exact commands that reproduce rl-baselines3-zoo's published A2C results, 3 seeds each, through the runner.
# The preset comes from the env's spaces (--preset auto), and with it the budget; references are in
# benchmark/references.csv.
# Hyperparameters: SB3's A2C defaults plus the env's entry in the zoo's hyperparams/a2c.yml, which a2c.py's
# presets hold (classic: CartPole-v1's entry; Acrobot-v1 and MountainCar-v0 add 16 envs and `normalize: true`,
# observations and rewards, below; atari; mujoco, whose `normalize: true` is observations and rewards as well).
#
#   env               steps  preset   reference (rl-baselines3-zoo benchmark.md, mean +- std of the final agent)
#   CartPole-v1       500k   classic  500.0 +- 0.0
#   Acrobot-v1        500k   classic  -83.4 +- 17.2     (16 envs, normalisation)
#   MountainCar-v0    1M     classic  -111.3 +- 24.1    (16 envs, normalisation)
#   Pong-v5           10M    atari    17.3 +- 3.2       (PongNoFrameskip-v4 there)
#   Breakout-v5       10M    atari    279.8 +- 122.2    (BreakoutNoFrameskip-v4 there)
#   BeamRider-v5      10M    atari    2890 +- 1379      (BeamRiderNoFrameskip-v4 there)
#   HalfCheetah-v4    1M     mujoco   3041 +- 157       (HalfCheetah-v3 there)
#   Hopper-v4         1M     mujoco   733 +- 377        (Hopper-v3 there)
#   Walker2d-v4       1M     mujoco   582               (Walker2d-v3 there; the zoo's sb3/a2c-Walker2d-v3
#                                                        model card on the Hugging Face Hub says 577.5 +- 43.8)
#
# The zoo's figures are one trained agent per env, evaluated after training (sampled actions on Atari, the greedy
# policy elsewhere, hence --eval-deterministic below): compare them with the final `eval/episodic_return` of
# these runs (the saved model, reloaded) as well as with the report's last training returns. The zoo's Atari envs
# are NoFrameskip-v4 under SB3's AtariWrapper (no sticky actions, up to 30 no-ops, FIRE on reset, life loss ends the
# training episode, clipped rewards): envpool's -v5 defaults here.
#
# Usage: bash benchmark/a2c.sh [classic|atari|mujoco|all|sb3]
#   sb3: Stable-Baselines3's own A2C with the zoo's MuJoCo entry on gymnasium's HalfCheetah-v4 and Hopper-v4, 3 seeds
#        (benchmark/studies/sb3_a2c_mujoco.py; stable-baselines3 and mujoco go into $DEPS): how A2C itself fares with these
#        settings, beside a2c_mujoco. About 30 min a run on a 2-core CPU.
# Classic control takes about a minute a run on a quiet 2-core CPU (CartPole-v1). Atari 10M steps wants a GPU;
# MuJoCo's 1 env x 5 steps makes 200k updates of a small batch, which a GPU does not speed up.
set -euo pipefail
cd "$(dirname "$0")/.."
family="${1:-classic}"

source benchmark/common.sh

# the zoo's figures are of the final agent, greedy outside Atari: --save-model evaluates the reloaded model
final=(--save-model --eval-deterministic)
if [[ $family == classic || $family == all ]]; then
  bench a2c a2c_cartpole CartPole-v1 -- "${final[@]}"
  bench a2c a2c_acrobot Acrobot-v1 -- "${final[@]}" --num-envs 16 --norm-obs --norm-reward
  bench a2c a2c_mountaincar MountainCar-v0 -- "${final[@]}" --num-envs 16 --norm-obs --norm-reward --total-timesteps 1000000
fi
if [[ $family == atari || $family == all ]]; then bench a2c a2c_atari Pong-v5 Breakout-v5 BeamRider-v5 -- --save-model; fi
# MuJoCo (benchmark/results/a2c_mujoco holds HalfCheetah-v4 and Hopper-v4, run one at a time with --no-cuda): a
# checkpoint every 100k steps, so a stopped benchmark goes on with `python benchmark/run.py --name a2c_mujoco --resume`
if [[ $family == mujoco || $family == all ]]; then
  bench a2c a2c_mujoco HalfCheetah-v4 Hopper-v4 Walker2d-v4 -- "${final[@]}" --checkpoint-every 100000
fi
if [[ $family == sb3 ]]; then
  sb3_deps
  mkdir -p benchmark/runs/sb3_a2c_mujoco
  for env_id in HalfCheetah-v4 Hopper-v4; do
    for seed in 1 2 3; do
      PYTHONPATH="$DEPS" OMP_NUM_THREADS=1 python -W ignore benchmark/studies/sb3_a2c_mujoco.py "$env_id" --seed "$seed" \
        --out benchmark/runs/sb3_a2c_mujoco 2>&1 | grep -v settotalmass
    done
  done | tee benchmark/runs/sb3_a2c_mujoco/summary.txt
fi
