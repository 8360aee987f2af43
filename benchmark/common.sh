# Sourced by benchmark/<algo>.sh from the repository root.
# bench ALGO NAME ENV... [-- FLAGS]: 3 seeds of each env through the runner (FLAGS go to every run), then the
# plots and the table into benchmark/results/NAME.
bench() {
  local algo=$1 name=$2
  shift 2
  python benchmark/run.py --algo "$algo" --name "$name" --seeds 3 --env-ids "$@"
  python benchmark/report.py "benchmark/runs/$name" --out "benchmark/results/$name"
}
