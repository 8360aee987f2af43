#!/usr/bin/env bash
# CleanRL's ppo_rnd_envpool.py, then rnd_ppo.py, back to back on this machine with the same sizes (the defaults: 128 envs
# x 128 steps, 4 epochs x 4 minibatches, MontezumaRevenge-v5), ITERS policy iterations each (default 4), and one rollout
# of observation-statistics initialisation each (CleanRL's takes over 15 minutes with its default 50).
# Every output line is stamped with the seconds since its run started; the SPS of each is one iteration's steps
# (16,384) over the time between its last two iteration lines (rollout and update, without start-up or initialisation),
# and /usr/bin/time gives the whole process's peak RSS.
# CleanRL's script needs gym 0.23 (installed into DEPS with pip --target) and envpool's old gym API, which the envpool
# here no longer has: benchmark/studies/cleanrl_envpool_gym.py stands in for it over the gymnasium API.
#     bash benchmark/studies/cleanrl_rnd_speed.sh > benchmark/results/rnd_ppo_vs_cleanrl_speed.txt
#   offline: CLEANRL=path/to/a/copy (git show HEAD:cleanrl/ppo_rnd_envpool.py in a clone of vwxyzjn/cleanrl)
#   BF16=1: rnd_ppo.py a second time, with --bf16
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmark/common.sh
DEPS=${DEPS:-/tmp/cleanrl_deps}
CLEANRL=$(cleanrl_script ppo_rnd_envpool.py)
ITERS=${ITERS:-4}
RUNS=$(mktemp -d)
STEPS=$((ITERS * 16384))
sps() { python -c '
import re, sys
times = [float(line.split()[0]) for line in sys.stdin if re.search(sys.argv[1], line)]
print(f"  one iteration (16,384 steps) in {times[-1] - times[-2]:.1f} s: {16384 / (times[-1] - times[-2]):.0f} SPS")' "$1"; }
echo "CleanRL ppo_rnd_envpool.py:"
(cd "$RUNS" && PYTHONUNBUFFERED=1 PYTHONPATH="$DEPS" /usr/bin/time -f "%e s wall, %M KiB peak RSS" \
    python "$OLDPWD/benchmark/studies/cleanrl_envpool_gym.py" "$CLEANRL" \
    --total-timesteps "$STEPS" --num-iterations-obs-norm-init 1 --no-cuda 2>&1 | grep -E --line-buffered "^SPS|wall" |
    stamp | tee "$RUNS/cleanrl.log")
sps "SPS:" < "$RUNS/cleanrl.log"
echo "rnd_ppo.py:"
(cd "$RUNS" && PYTHONUNBUFFERED=1 /usr/bin/time -f "%e s wall, %M KiB peak RSS" python "$OLDPWD/algorithms/rnd_ppo.py" \
    --total-timesteps "$STEPS" --num-iterations-obs-norm-init 1 --no-cuda --progress-interval 0 2>&1 |
    grep -E --line-buffered "^step|wall|^observation" | stamp | tee "$RUNS/ours.log")
sps "step [0-9,]+/" < "$RUNS/ours.log"
if [[ ${BF16:-0} == 1 ]]; then
  echo "rnd_ppo.py --bf16:"
  (cd "$RUNS" && PYTHONUNBUFFERED=1 /usr/bin/time -f "%e s wall, %M KiB peak RSS" python "$OLDPWD/algorithms/rnd_ppo.py" \
      --total-timesteps "$STEPS" --num-iterations-obs-norm-init 1 --no-cuda --progress-interval 0 --bf16 2>&1 |
      grep -E --line-buffered "^step|wall|^observation" | stamp | tee "$RUNS/bf16.log")
  sps "step [0-9,]+/" < "$RUNS/bf16.log"
fi
rm -rf "$RUNS"
