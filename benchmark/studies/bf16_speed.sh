#!/usr/bin/env bash
# channels_last and --bf16 against the files before them, whole process, A B C in turn for ROUNDS rounds (default 2):
# a2c.py and dqn.py (in its learning phase) on Breakout-v5, ppo.py on Breakout-v5 with torch's 2 threads and with 1,
# and the vector rows (ppo.py CartPole-v1, ddpg_td3.py Hopper-v4). BEFORE is a folder with the earlier files, e.g.
#     mkdir -p /tmp/before && for f in ppo a2c dqn ddpg_td3; do git show f4c60cb:algorithms/$f.py > /tmp/before/$f.py; done
#     BEFORE=/tmp/before bash benchmark/studies/bf16_speed.sh
# Each line: the row, the seconds from start to exit, the last SPS the run logged. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=${BEFORE:?a folder with the earlier ppo.py, a2c.py, dqn.py and ddpg_td3.py}
NOW=$PWD/algorithms
ab() {  # label, script, flags...
  local label=$1 script=$2 d s e
  shift 2
  d=$(mktemp -d)
  s=$(date +%s.%N)
  (cd "$d" && python "$script" "$@" --no-cuda > "$d/log" 2>&1)
  e=$(date +%s.%N)
  printf "%s\t%.1f s\t%s\n" "$label" "$(echo "$e - $s" | bc)" "$(grep -o 'SPS [0-9,]*' "$d/log" | tail -1)"
  rm -rf "$d"
}
A2C="--env-id Breakout-v5 --total-timesteps 16000"
DQN="--env-id Breakout-v5 --total-timesteps 8000 --learning-starts 1000"
PPO="--env-id Breakout-v5 --total-timesteps 8192"
TD3="--env-id Hopper-v4 --total-timesteps 5000 --learning-starts 256"
for _ in $(seq "${ROUNDS:-2}"); do
  ab "a2c before" "$BEFORE/a2c.py" $A2C; ab "a2c now" "$NOW/a2c.py" $A2C; ab "a2c now --bf16" "$NOW/a2c.py" $A2C --bf16
  ab "dqn before" "$BEFORE/dqn.py" $DQN; ab "dqn now" "$NOW/dqn.py" $DQN; ab "dqn now --bf16" "$NOW/dqn.py" $DQN --bf16
  ab "ppo now, 2 threads" "$NOW/ppo.py" $PPO; OMP_NUM_THREADS=1 ab "ppo now, 1 thread" "$NOW/ppo.py" $PPO
  ab "ppo now --bf16, 2 threads" "$NOW/ppo.py" $PPO --bf16
  OMP_NUM_THREADS=1 ab "ppo now --bf16, 1 thread" "$NOW/ppo.py" $PPO --bf16
  ab "ppo before" "$BEFORE/ppo.py" $PPO
  ab "ppo CartPole before" "$BEFORE/ppo.py" --env-id CartPole-v1 --total-timesteps 50000
  ab "ppo CartPole now" "$NOW/ppo.py" --env-id CartPole-v1 --total-timesteps 50000
  ab "td3 Hopper before" "$BEFORE/ddpg_td3.py" $TD3; ab "td3 Hopper now" "$NOW/ddpg_td3.py" $TD3
  ab "td3 Hopper now --bf16" "$NOW/ddpg_td3.py" $TD3 --bf16
done
