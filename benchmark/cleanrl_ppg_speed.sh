#!/usr/bin/env bash
# CleanRL's ppg_procgen.py, then ppg_procgen.py, back to back on this machine with the same sizes: 64 envs x 256 steps,
# phases of 2 policy iterations, one auxiliary epoch (so that each takes about 10 minutes on 2 CPU cores).
# CleanRL's script needs gym 0.23 and procgen; procgen has no wheel for Python 3.11+, so benchmark/procgen_shim stands
# in for it over envpool's Procgen. Both scripts print their policy-phase SPS; the auxiliary epoch is the wall time left.
#     bash benchmark/cleanrl_ppg_speed.sh            (CLEANRL=path/to/ppg_procgen.py to use a local copy)
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${DEPS:-/tmp/cleanrl_ppg_deps}
CLEANRL=${CLEANRL:-$DEPS/cleanrl_ppg_procgen.py}
mkdir -p "$DEPS"
[ -d "$DEPS/gym" ] || python -m pip install -q --target "$DEPS" --no-deps gym==0.23.1 gym_notices
[ -f "$CLEANRL" ] || curl -sSL https://raw.githubusercontent.com/vwxyzjn/cleanrl/master/cleanrl/ppg_procgen.py -o "$CLEANRL"
RUNS=$(mktemp -d)
echo "CleanRL ppg_procgen.py (one network, 'detach'):"
(cd "$RUNS" && PYTHONPATH="$DEPS:$OLDPWD/benchmark/procgen_shim" /usr/bin/time -f "  %e s wall, %M KiB peak RSS" \
    python "$CLEANRL" --env-id starpilot --total-timesteps 32768 --n-iteration 2 --e-auxiliary 1 --no-cuda 2>&1 |
    grep -E "^SPS|wall" | sed 's/^SPS/  policy phase SPS (cumulative)/')
echo "ppg_procgen.py (two networks, 'dual'; its auxiliary phase runs after iteration 2, then one more iteration):"
(cd "$RUNS" && /usr/bin/time -f "  %e s wall, %M KiB peak RSS" python "$OLDPWD/algorithms/ppg_procgen.py" \
    --env-id StarpilotEasy-v0 --total-timesteps 49152 --n-pi 2 --e-aux 1 --no-cuda --progress-interval 60 2>&1 |
    grep -E "^step|^auxiliary|wall" | sed 's/^/  /')
rm -rf "$RUNS"
