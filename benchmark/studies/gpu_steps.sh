#!/usr/bin/env bash
# Steps to run the GPU rows on a machine with CUDA but without envpool/gymnasium/tyro: the H100 rows of
# benchmark/results/speed_h100.md (one H100, 16 cores) and the Pong-v5 curve of benchmark/results/ppo_atari_pong_h100.
# On a machine that has those packages, run `python benchmark/speed.py --only ...` and algorithms/ppo.py directly.
#
# 1. Where this repository is checked out with its packages, pack them for Python 3.12 into the ignored folder .gpu/
#    (echo /.gpu/ >> "$(git rev-parse --git-path info/exclude)"; bash ../shared/py312_bundle.sh .gpu), and copy the
#    working tree with .gpu/ to the CUDA machine (which needs torch, numpy, tensorboard and matplotlib).
# 2. There, from the repository root, with OUT naming a folder for what the steps write (default benchmark/runs/gpu),
#    run:
#      bash benchmark/studies/gpu_steps.sh speed ppo:Breakout-v5:4 ddpg_td3:HalfCheetah-v4:2     (about 8 min)
#      bash benchmark/studies/gpu_steps.sh speed dqn:Breakout-v5:1 a2c:Breakout-v5:4 rnd_ppo:MontezumaRevenge-v5:1
#    Each ALGO:ENV_ID:STEPS_SCALE is one speed.py row (eager, then --compile, then --compile --cudagraphs), cut after
#    ROW_SECONDS (default 280); the rows collect in $OUT/speed_gpu.md.
# 3. The Pong-v5 curve and the test suite beside it:
#      bash benchmark/studies/gpu_steps.sh pong-and-tests --compile --cudagraphs --num-envs 16 --num-minibatches 8
#      bash benchmark/studies/gpu_steps.sh pong-stop 330      (stops Pong that many seconds later; copies its log and events to $OUT)
#    pong-and-tests starts Pong in the background (setsid, so it outlives the step) and runs the suite for up to 390 s;
#    pong-stop sends SIGTERM (ppo.py checkpoints and exits). Run the two one after the other on the same machine.
# The packed folder has no ffmpeg binary (imageio-ffmpeg would add about 30 MB), and Procgen needs the Qt 5 runtime
# and sprites the pack drops, so the --capture-video smoke tests and Procgen fail on such a machine; the suite step
# leaves out ppg_procgen.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -d /tmp/deps-py312 ] || [ ! -f .gpu/deps-py312.txz ] || tar xJf .gpu/deps-py312.txz -C /tmp
OUT=${OUT:-$PWD/benchmark/runs/gpu}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/deps-py312 PYTHONUNBUFFERED=1
step=${1:-}; shift
case $step in
  speed)  # each ALGO:ENV_ID:STEPS_SCALE, one after another on a quiet machine, eager then --compile then --cudagraphs
    date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv
    for row in "$@"; do
      IFS=: read -r algo env scale <<<"$row"
      timeout "${ROW_SECONDS:-280}" python3 benchmark/speed.py --only "$algo:$env" --steps-scale "$scale" --out "$OUT/speed_gpu.md" 2>&1 | tail -25
    done
    cat "$OUT/speed_gpu.md" ;;
  pong-and-tests)  # Pong-v5 with ppo.py's Atari preset and the given flags, in the background; the suite beside it
    setsid nohup python3 algorithms/ppo.py --env-id Pong-v5 --seed 1 "$@" >/tmp/pong.log 2>&1 </dev/null &
    sleep 45
    timeout 390 nice -n 5 python3 -m pytest tests -q -n 12 -p no:cacheprovider -k "not ppg" -rfE --durations=15 2>&1 |
      tee "$OUT/test_gpu.log" | tail -60
    cp /tmp/pong.log "$OUT/pong_part.log" ;;
  pong-stop)  # after $1 seconds: SIGTERM (ppo.py checkpoints and exits), then the log and the events come back
    sleep "$1"
    pkill -TERM -f "algorithms/ppo.py --env-id Pong-v5"
    for _ in $(seq 60); do pgrep -f "algorithms/ppo.py --env-id Pong-v5" >/dev/null || break; sleep 2; done
    cp /tmp/pong.log "$OUT/pong.log"; cp runs/Pong-v5__ppo__*/events.out.tfevents.* "$OUT/"; tail -5 /tmp/pong.log ;;
  *) echo "$(basename "$0"): error: unknown step '$step'; use speed, pong-and-tests or pong-stop" >&2; exit 2 ;;
esac
