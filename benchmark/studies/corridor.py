"""rnd_ppo.py on the pixel corridor of tests/ (a hard-exploration task in small, drawn as Atari frames: RND's own kind
of env, at a size a CPU runs in minutes), two variants of the same seeds side by side:

    python benchmark/studies/corridor.py --compare intrinsic --total-timesteps 49152 --out benchmark/results/rnd_ppo_corridor
    python benchmark/studies/corridor.py --compare bf16 --seeds 1 2 3 --out benchmark/results/bf16_learning/corridor

--compare intrinsic: RND against the same file with its intrinsic reward off (--int-coef 0), which is PPO on the
extrinsic reward alone: does the novelty find the reward? --compare bf16: with and without --bf16, does exploration
learn the same?

Each run is tests/test_learning.py's corridor run (16 envs x 64 steps, two random rollouts for the observation
statistics; 12,288 steps unless --total-timesteps), in its own process, two at a time (one thread each). The corridor's
cells that any env has stood on are counted after every rollout (visited_<run>.csv). The table gives each run's mean
return of the episodes that ended in its last quarter and the cells it visited; corridor.png plots both against env
steps. Runs already under --out are kept and only the new ones run.
"""

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmark")]
FLAGS = ["--max-episode-steps", "100", "--num-envs", "16", "--num-steps", "64", "--num-iterations-obs-norm-init", "2",
         "--no-cuda"]  # fmt: skip
VARIANTS = {  # --compare: (name, flags) of each side
    "bf16": (("float32", []), ("bf16", ["--bf16"])),
    "intrinsic": (("rnd", []), ("no_rnd", ["--int-coef", "0"])),
}


def one(name: str, argv: list[str]) -> None:
    """One run of rnd_ppo.py, unchanged, with the corridor registered beside envpool's ids; the cells its envs have
    visited are counted after each rollout's last step and written to visited_<name>.csv."""
    import pixel_corridor
    from pixel_corridor import ENV_ID, with_pixel_corridor

    from algos import load_algorithm

    module = load_algorithm("rnd_ppo")
    with_pixel_corridor(module)
    args = module.parse_args(["--env-id", ENV_ID, *FLAGS, *argv])
    step, seen, rows = pixel_corridor.PixelCorridor.step, set(), []
    skip = args.num_iterations_obs_norm_init * args.num_steps  # the observation statistics' random rollouts, which
    # global_step does not count either

    def counting(env, action):
        nonlocal skip
        out = step(env, action)
        if skip > 0:
            skip -= 1
        else:
            seen.update(env.pos.tolist())
            rows.append(len(seen))
        return out

    pixel_corridor.PixelCorridor.step = counting
    module.main(args)
    every = args.num_steps  # one row per rollout: each call steps every env once
    with open(f"visited_{name}.csv", "w", newline="") as f:
        table = [((i + 1) * args.num_envs, rows[i]) for i in range(every - 1, len(rows), every)]
        csv.writer(f).writerows([("env_steps", "cells_visited"), *table])


def returns(run_dir: Path) -> list[tuple[int, float]]:
    from tblog import read_scalars

    return [(step, value) for step, value, _ in read_scalars(str(run_dir))["charts/episodic_return"]]


def run_dir(out: Path, run: str) -> Path:
    return next((out / "runs").glob(f"*__{run}__*"))


def visited(out: Path, name: str) -> list[tuple[int, int]]:
    with open(out / f"visited_{name}.csv") as f:
        return [(int(a), int(b)) for a, b in list(csv.reader(f))[1:]]


def plot(out: Path, compare: str, seeds: list[int], total: int) -> None:
    """corridor.png: the mean return of the episodes in each window of 2,048 env steps, and the cells visited."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (name, _), color in zip(VARIANTS[compare], ("tab:blue", "tab:orange"), strict=True):
        for i, seed in enumerate(seeds):
            run = f"{name}_s{seed}"
            points = returns(run_dir(out, run))
            edges = range(0, total, 2048)
            means = [[v for s, v in points if e < s <= e + 2048] for e in edges]
            x = [e + 2048 for e, m in zip(edges, means, strict=True) if m]
            left.plot(x, [sum(m) / len(m) for m in means if m], color=color, alpha=0.8, label=name if i == 0 else None)
            cells = visited(out, run)
            right.plot(*zip(*cells, strict=True), color=color, alpha=0.8, label=name if i == 0 else None)
    left.set(xlabel="env steps", ylabel="mean return of the episodes ended (per 2,048 steps)", title="return")
    right.set(xlabel="env steps", ylabel="cells of the corridor visited (of 40)", title="states visited")
    for ax in (left, right):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"rnd_ppo.py on the pixel corridor, seeds {', '.join(map(str, seeds))}")
    fig.tight_layout()
    fig.savefig(out / "corridor.png", dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", choices=list(VARIANTS), default="bf16", help="what the two sides differ in")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--total-timesteps", type=int, default=12288, help="env steps of each run")
    p.add_argument("--out", default="benchmark/runs/corridor", help="folder of the runs' runs/, logs, table and figure")
    p.add_argument("--one", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        return one(args.one[0], args.one[1:])
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = [(seed, name, flags) for seed in args.seeds for name, flags in VARIANTS[args.compare]]
    jobs = [job for job in jobs if not list(out.glob(f"runs/*__{job[1]}_s{job[0]}__*"))]  # runs already there are kept
    for pair in (jobs[i : i + 2] for i in range(0, len(jobs), 2)):  # two at a time, one thread each
        running = []
        for seed, name, flags in pair:
            run = f"{name}_s{seed}"
            argv = ["--seed", str(seed), "--exp-name", run, "--total-timesteps", str(args.total_timesteps), *flags]
            with open(out / f"{run}.log", "w") as log:
                cmd = [sys.executable, __file__, "--one", run, *argv]
                running.append(subprocess.Popen(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT))
        for proc in running:
            proc.wait()
    names = [name for name, _ in VARIANTS[args.compare]]
    rows = ["| seed | " + " | ".join(f"{n}: mean return, last quarter (episodes) | {n}: cells visited" for n in names) + " |",
            "|---|" + "---|---|" * len(names)]  # fmt: skip
    for seed in args.seeds:
        cells = []
        for name in names:
            points = returns(run_dir(out, f"{name}_s{seed}"))
            late = [v for s, v in points if s > args.total_timesteps * 3 // 4]
            seen = visited(out, f"{name}_s{seed}")[-1][1] if (out / f"visited_{name}_s{seed}.csv").is_file() else "-"
            cells += [f"{sum(late) / max(len(late), 1):.2f} ({len(late)})", str(seen)]
        rows.append(f"| {seed} | {' | '.join(cells)} |")
    (out / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    if all((out / f"visited_{n}_s{s}.csv").is_file() for n in names for s in args.seeds):
        plot(out, args.compare, args.seeds, args.total_timesteps)


if __name__ == "__main__":
    main()
