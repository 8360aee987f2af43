#!/usr/bin/env bash
# What one 30-minute lease of a lent GPU machine ran on 2026-11-24 (H100, 16 cores; results in
# benchmark/results/speed_h100.md and ppo_atari_pong_h100), as steps to send through the device tool one by one.
# That machine has torch with CUDA but not envpool, gymnasium or tyro: pack them here first, into an ignored folder
# that each call carries (echo /.gpu/ >> .git/info/exclude; bash ../shared/py312_bundle.sh .gpu), then call
#   bash benchmark/gpu_session.sh speed ppo:Breakout-v5:4 ddpg_td3:HalfCheetah-v4:2     (a call of about 8 min)
#   bash benchmark/gpu_session.sh speed dqn:Breakout-v5:1 a2c:Breakout-v5:4 rnd_ppo:MontezumaRevenge-v5:1
#   bash benchmark/gpu_session.sh pong-and-tests --compile --cudagraphs --num-envs 16 --num-minibatches 8
#   bash benchmark/gpu_session.sh pong-stop 330      (stops Pong that many seconds later; brings back log and events)
# Each writes what comes back under $OUT. Calls follow each other at once: an idle machine goes back after 30 s, and
# Pong (started with setsid) goes with it. The bundle has no ffmpeg binary (imageio-ffmpeg would pass the 64 MiB a call
# carries) and that machine has no Qt 5, so the --capture-video smoke tests and Procgen fail there; the tests leave
# out ppg_procgen.py.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d /tmp/deps-py312 ] || tar xJf .gpu/deps-py312.txz -C /tmp
export PYTHONPATH=/tmp/deps-py312 PYTHONUNBUFFERED=1
step=$1; shift
case $step in
  speed)  # each ALGO:ENV_ID:STEPS_SCALE, one after another on a quiet machine, eager then --compile then --cudagraphs
    date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv
    for row in "$@"; do
      IFS=: read -r algo env scale <<<"$row"
      timeout 280 python3 benchmark/speed.py --only "$algo:$env" --steps-scale "$scale" --out "$OUT/speed_gpu.md" 2>&1 | tail -25
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
  *) echo "gpu_session.sh: error: unknown step '$step'; use speed, pong-and-tests or pong-stop" >&2; exit 2 ;;
esac
