# Sourced by benchmark/<algo>.sh from the repository root.
# bench ALGO NAME ENV... [-- FLAGS]: 3 seeds of each env through the runner (FLAGS go to every run), then the
# plots and the table into benchmark/results/NAME, with the data they are made from (--keep-data: logs and events,
# not checkpoints), which git keeps: benchmark/runs/ does not outlive a fresh checkout.
bench() {
  local algo=$1 name=$2
  shift 2
  python benchmark/run.py --algo "$algo" --name "$name" --seeds 3 --env-ids "$@"
  python benchmark/report.py "benchmark/runs/$name" --out "benchmark/results/$name" --keep-data
}

# For the scripts that time a CleanRL script beside ours (benchmark/studies/cleanrl_*_speed.sh):
# cleanrl_script FILE: gym 0.23 into $DEPS (pip --target, no deps), and CleanRL's cleanrl/FILE at the commit that
# benchmark/studies/cleanrl_speed.py pins (CLEANRL_COMMIT) into $DEPS unless $CLEANRL names a local copy; prints the
# script's path.
cleanrl_script() {
  DEPS=${DEPS:-/tmp/cleanrl_deps}
  mkdir -p "$DEPS"
  [ -d "$DEPS/gym" ] || python -m pip install -q --target "$DEPS" --no-deps gym==0.23.1 gym_notices >&2
  local commit
  commit=$(sed -n 's/^CLEANRL_COMMIT = "\([0-9a-f]\{40\}\)".*/\1/p' benchmark/studies/cleanrl_speed.py)
  local script=${CLEANRL:-$DEPS/cleanrl_${commit:0:8}_$1}
  [ -f "$script" ] || curl -fsSL "https://raw.githubusercontent.com/vwxyzjn/cleanrl/$commit/cleanrl/$1" -o "$script"
  echo "$script"
}
# stamp: every line of stdin prefixed with the seconds since the pipe started.
stamp() { python -u -c 'import sys, time; t = time.time(); [print(f"  {time.time() - t:7.1f} s  {line}", end="") for line in sys.stdin]'; }

# sb3_deps: stable-baselines3 and mujoco (gymnasium's MuJoCo envs) into $DEPS (pip --target), for running SB3's own
# algorithms beside ours (benchmark/studies/sb3_a2c_mujoco.py); numpy stays the one torch was built against.
sb3_deps() {
  DEPS=${DEPS:-/tmp/sb3_deps}
  if [ ! -d "$DEPS/stable_baselines3" ]; then
    python -m pip install -q --target "$DEPS" --no-deps stable-baselines3==2.9.2 >&2
    python -m pip install -q --target "$DEPS" mujoco==4.0.0 >&2
    rm -rf "$DEPS"/numpy "$DEPS"/numpy-*.dist-info
  fi
}
