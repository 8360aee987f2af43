"""rnd_ppo.py with and without --bf16 on the pixel corridor of tests/ (a hard-exploration task in small, drawn as
Atari frames: RND's own kind of env, at a size a CPU runs in minutes), the same seeds: does exploration learn the same?

    python benchmark/studies/bf16_corridor.py --seeds 1 2 3 --out benchmark/results/bf16_learning/corridor

Each run is tests/test_learning.py's corridor run (16 envs x 64 steps, 12,288 steps, two random rollouts for the
observation statistics), in its own process, two at a time (one thread each); the table gives each run's mean return of
the episodes that ended in its last quarter, and its tensorboard events stay under --out, where a later call with
more seeds keeps them and runs only the new ones.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmark")]
FLAGS = ["--max-episode-steps", "100", "--num-envs", "16", "--num-steps", "64", "--num-iterations-obs-norm-init", "2",
         "--total-timesteps", "12288", "--no-cuda"]  # fmt: skip


def one(argv: list[str]) -> None:
    """One run of rnd_ppo.py, unchanged, with the corridor registered beside envpool's ids."""
    from pixel_corridor import ENV_ID, with_pixel_corridor

    from algos import load_algorithm

    module = load_algorithm("rnd_ppo")
    with_pixel_corridor(module)
    module.main(module.parse_args(["--env-id", ENV_ID, *FLAGS, *argv]))


def last_quarter(run_dir: Path) -> tuple[float, int]:
    from tblog import read_scalars

    logged = read_scalars(str(run_dir))["charts/episodic_return"]
    late = [value for step, value, _ in logged if step > 12288 * 3 // 4]
    return sum(late) / max(len(late), 1), len(late)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", default="benchmark/runs/bf16_corridor", help="folder of the runs' runs/ and the table")
    p.add_argument("--one", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        return one(args.one)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = [(seed, name, flags) for seed in args.seeds for name, flags in (("float32", []), ("bf16", ["--bf16"]))]
    jobs = [job for job in jobs if not list(out.glob(f"runs/*__{job[1]}_s{job[0]}__*"))]  # runs already there are kept
    for pair in (jobs[i : i + 2] for i in range(0, len(jobs), 2)):  # two at a time, one thread each
        running = []
        for seed, name, flags in pair:
            argv = ["--seed", str(seed), "--exp-name", f"{name}_s{seed}", *flags]
            with open(out / f"{name}_s{seed}.log", "w") as log:
                cmd = [sys.executable, __file__, "--one", *argv]
                running.append(subprocess.Popen(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT))
        for proc in running:
            proc.wait()
    rows = ["| seed | float32: mean return, last quarter (episodes) | --bf16: mean return, last quarter (episodes) |",
            "|---|---|---|"]  # fmt: skip
    for seed in args.seeds:
        cells = []
        for name in ("float32", "bf16"):
            mean, n = last_quarter(next((out / "runs").glob(f"*__{name}_s{seed}__*")))
            cells.append(f"{mean:.2f} ({n})")
        rows.append(f"| {seed} | {' | '.join(cells)} |")
    (out / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
