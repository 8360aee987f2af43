#!/usr/bin/env bash
# CleanRL's ppg_procgen.py, then ppg_procgen.py with its two architectures, back to back on this machine with the same
# sizes: 64 envs x 256 steps, phases of 2 policy iterations, one auxiliary epoch (each run takes minutes on 2 CPU cores).
# CleanRL's script needs gym 0.23 and procgen; procgen has no wheel for Python 3.11+, so benchmark/studies/procgen_shim stands
# in for it over envpool's Procgen. Every output line is stamped with the seconds since its run started.
#   CleanRL: policy-phase SPS is its last "SPS:" line (2 iterations, updates included); its auxiliary phase (the old
#            policy's logits, then the epoch) is the time from that line to the end of the process.
#   ppg_procgen.py: the mean of charts/policy_phase_SPS, and charts/aux_epoch_seconds (the epoch alone; its old-logit
#            pass, one forward pass of the policy CNN over the phase's frames, is not in it).
#     bash benchmark/studies/cleanrl_ppg_speed.sh > benchmark/results/ppg_procgen_vs_cleanrl_speed.txt
#   offline: CLEANRL=path/to/a/copy (git show HEAD:cleanrl/ppg_procgen.py in a clone of vwxyzjn/cleanrl; fe8d8a03 measured)
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmark/common.sh
DEPS=${DEPS:-/tmp/cleanrl_deps}
CLEANRL=$(cleanrl_script ppg_procgen.py)
RUNS=$(mktemp -d)
echo "CleanRL ppg_procgen.py (one network, 'detach'):"
(cd "$RUNS" && PYTHONUNBUFFERED=1 PYTHONPATH="$DEPS:$OLDPWD/benchmark/studies/procgen_shim" /usr/bin/time -f "%e s wall, %M KiB peak RSS" \
    python "$CLEANRL" --env-id starpilot --total-timesteps 32768 --n-iteration 2 --e-auxiliary 1 --no-cuda 2>&1 |
    grep -E --line-buffered "^SPS|wall" | stamp)
for arch in dual detach; do
    echo "ppg_procgen.py --arch $arch (its auxiliary phase runs after iteration 2, then one more iteration):"
    (cd "$RUNS" && /usr/bin/time -f "%e s wall, %M KiB peak RSS" python "$OLDPWD/algorithms/ppg_procgen.py" \
        --env-id StarpilotEasy-v0 --arch "$arch" --total-timesteps 49152 --n-pi 2 --e-aux 1 --no-cuda \
        --progress-interval 60 2>&1 | grep -E "^step|^auxiliary|wall" | sed 's/^/  /')
    PYTHONPATH=benchmark python -c "
import glob, numpy as np; from tblog import read_scalars
s = read_scalars(max(glob.glob('$RUNS/runs/*'), key=lambda p: p.split('__')[-1]))
print(f'  policy phase {np.mean([v for _, v, _ in s[\"charts/policy_phase_SPS\"]]):.0f} SPS, '
      f'auxiliary epoch {s[\"charts/aux_epoch_seconds\"][-1][1]:.0f} s over 2 iterations of frames')"
    rm -rf "$RUNS/runs"
done
rm -rf "$RUNS"
