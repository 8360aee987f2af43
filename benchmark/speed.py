"""Each script's training SPS against envpool's own random-action throughput for the same env and number of envs.

    python benchmark/speed.py                   # every configuration below, into benchmark/runs/speed.md
    python benchmark/speed.py --out benchmark/results/speed.md   # the committed table, remade
    python benchmark/speed.py --only ppo        # one algorithm's rows
    python benchmark/speed.py --only 'dqn:CartPole-v1 --learning-starts 1000'   # a row with flags of its own
    python benchmark/speed.py --scaling         # 1 process x 2 threads against 2 torchrun processes x 1 thread

The fraction (script SPS / env SPS) is the share of the env's speed the learner keeps: the figure to watch when
changing a hot loop. The scripts with `--compile` run each row a second time compiled, right after the eager run, and
on a CUDA machine a third time with `--cudagraphs`; the table gives the ratio of their second-half SPS (compilation
happens in the first iterations) and the run length from which compiling pays for itself. Run it on a quiet machine:
other processes on the same cores distort every figure, ratios less than absolute SPS.

The table is rewritten after each row. A row whose script fails is left out with its script's last line, the other rows
go on, and speed.py exits 1 at the end naming the rows that failed.
"""

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import envpool
import gymnasium as gym
import numpy as np
import torch

from tblog import read_scalars

ROOT = Path(__file__).resolve().parent.parent
# envpool declares float64 bounds for float32 observations; gymnasium warns about it on every env made
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")

# (algo, env_id, num_envs, steps to train, other flags): the sizes of each algorithm's preset for that env (for PPO on
# Breakout-v5 and TD3 on HalfCheetah-v4 also the sizes of LeanRL's published CleanRL and LeanRL speed figures). The DQN
# and TD3 rows start learning early so that most of the run trains.
CONFIGS = [
    ("ppo", "CartPole-v1", 4, 102_400, []),
    ("ppo", "Breakout-v5", 8, 16_384, []),
    ("dqn", "CartPole-v1", 1, 100_000, ["--learning-starts", "10000"]),
    ("dqn", "Breakout-v5", 1, 20_000, ["--learning-starts", "10000"]),
    ("a2c", "CartPole-v1", 8, 100_000, []),
    ("a2c", "Breakout-v5", 16, 16_000, []),
    ("qlearning", "FrozenLake-v1", 64, 300_000, []),
    ("ddpg_td3", "Hopper-v4", 1, 5_000, ["--learning-starts", "256"]),
    ("ddpg_td3", "HalfCheetah-v4", 1, 5_000, ["--learning-starts", "256"]),  # LeanRL's TD3 speed figures' env
    ("es", "CartPole-v1", 256, 20, []),
    ("ppg_procgen", "StarpilotEasy-v0", 64, 49_152, ["--n-pi", "2", "--e-aux", "1"]),
    ("rnd_ppo", "MontezumaRevenge-v5", 128, 32_768, ["--num-iterations-obs-norm-init", "0"]),
]
# the scripts that train data-parallel under torchrun, and the rows --scaling times with 1 and 2 processes
SCALING_ROWS = {("ppo", "CartPole-v1"), ("ppo", "Breakout-v5"), ("a2c", "CartPole-v1"), ("rnd_ppo", "MontezumaRevenge-v5")}
# ppg_procgen.py's row at a quarter of its rollout length (64 envs x 64 steps, an auxiliary phase after iteration 2),
# so that each of its two runs takes minutes; its SPS there counts the auxiliary phase's time too
SCALING = [c for c in CONFIGS if (c[0], c[1]) in SCALING_ROWS] + [
    ("ppg_procgen", "StarpilotEasy-v0", 64, 12_288, ["--num-steps", "64", "--n-pi", "2", "--e-aux", "1"])
]
# the steps per env of one rollout in the presets of the rows whose rollout is more than a tenth of their budget: a
# budget scaled below one rollout is raised to one, which the scripts take as their least
ROLLOUT = {"ppg_procgen": 256, "rnd_ppo": 128}
# the scripts with --compile (and --cudagraphs, CUDA only)
COMPILED = {"ppo", "a2c", "dqn", "ddpg_td3"}
# the rows whose script takes --bf16 there: the pixel networks, and TD3's MLPs (ppo, a2c and dqn refuse it on vectors)
BF16 = {("ppo", "Breakout-v5"), ("dqn", "Breakout-v5"), ("a2c", "Breakout-v5"), ("ddpg_td3", "Hopper-v4")}
BF16 |= {("ddpg_td3", "HalfCheetah-v4"), ("ppg_procgen", "StarpilotEasy-v0"), ("rnd_ppo", "MontezumaRevenge-v5")}
# es.py's envs are its population, and its budget is counted in generations. ppg_procgen.py runs the default sizes
# (64 envs x 256 steps) with phases of 2 policy iterations, so that an auxiliary epoch is timed within minutes: its SPS
# is the policy phase's, and the auxiliary epoch's seconds per policy iteration of frames are shown beside it


def env_sps(env_id: str, num_envs: int, seconds: float) -> float:
    """envpool stepping random actions as fast as it can, in env steps (summed over envs) per second."""
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=0)
    envs.reset()
    space = envs.action_space
    rng = np.random.default_rng(0)

    def random_actions():
        if isinstance(space, gym.spaces.Discrete):
            return rng.integers(0, space.n, num_envs)
        return rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32)

    for _ in range(20):  # warm-up
        envs.step(random_actions())
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(random_actions())
        steps += num_envs
    envs.close()
    return steps / (time.perf_counter() - start)


def scaled(algo: str, num_envs: int, steps: int, flags: list[str], scale: float) -> tuple[int, list[str]]:
    """A row's budget times `scale`, at least one rollout, and its flags with a --learning-starts that the budget leaves no
    gradient step after set to half the budget (dqn.py and ddpg_td3.py refuse such a run)."""
    given = dict(zip(flags[::2], flags[1::2], strict=True))  # the rows' own flags are pairs of name and value
    rollout = num_envs * int(given.get("--num-steps", ROLLOUT[algo])) if algo in ROLLOUT else 1
    budget = max(int(steps * scale), rollout)
    if int(given.get("--learning-starts", 0)) >= budget:
        given["--learning-starts"] = str(budget // 2)
    return budget, [word for pair in given.items() for word in pair]


def selected(configs: list[tuple], only: list[str] | None, scale: float) -> list[tuple]:
    """The rows --only names (all without it) at their scaled budgets, each with the flags typed after its name added
    last (a flag given twice takes the last value)."""
    rows = []
    for algo, env_id, num_envs, steps, flags in configs:
        picks = [extra for name, *extra in map(shlex.split, only or []) if name in (algo, f"{algo}:{env_id}")]
        if only is None or picks:
            budget, flags = scaled(algo, num_envs, steps, flags, scale)
            rows.append((algo, env_id, num_envs, budget, [*flags, *(picks[0] if picks else [])]))
    return rows


def measured(configs: list[tuple], measure, write) -> list[str]:
    """Each row's measure in turn, the table written after each; a row whose run fails is left out, said in one line
    with its script's last line, and the others go on. Exits 1 at the end if a row failed."""
    rows, failed = [], []
    for config in configs:
        try:
            rows.append(measure(*config))
        except subprocess.CalledProcessError as crash:
            failed.append(f"{config[0]}:{config[1]}")
            script = next(Path(c).name for c in crash.cmd if str(c).endswith(".py"))
            print(
                f"speed.py: row {failed[-1]} failed: {script} exited {crash.returncode}: {last_line(crash)[:300]}", flush=True
            )
            continue
        print(rows[-1], flush=True)
        write(rows)
    if failed:
        sys.exit(f"speed.py: error: {len(failed)} of {len(configs)} rows failed ({', '.join(failed)}), each said above")
    return rows


def train(algo, env_id, num_envs, steps, flags, processes: int = 1, threads: int | None = None) -> tuple[dict, float]:
    """One training run in a temporary folder: its logged scalars and the whole run's wall time in seconds. With
    processes > 1, under torchrun (gloo on the CPU); threads sets each process's OMP_NUM_THREADS. A run that fails
    raises CalledProcessError, which `measured` turns into the script's own last line."""
    with tempfile.TemporaryDirectory() as tmp:
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
        cmd = [sys.executable, *(launcher if processes > 1 else []), str(ROOT / "algorithms" / f"{algo}.py")]
        cmd += ["--env-id", env_id]
        if algo == "es":
            cmd += ["--population-size", str(num_envs), "--num-generations", str(steps), *flags]
        else:
            cmd += ["--num-envs", str(num_envs), "--total-timesteps", str(steps), *flags]
        start = time.perf_counter()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
        subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        (run,) = (Path(tmp) / "runs").iterdir()
        return read_scalars(str(run)), seconds


def script_sps(logged: dict, flags: list[str]) -> tuple[float, str]:
    """The SPS a training run logs last (its mean over the run, evaluation excluded); for PPG, the policy phase's mean
    SPS and the auxiliary epoch's time (a note for the table)."""
    if "charts/aux_epoch_seconds" not in logged:
        return logged["charts/SPS"][-1][1], ""
    n_pi = int(flags[flags.index("--n-pi") + 1])
    per_iteration = np.mean([v for _, v, _ in logged["charts/aux_epoch_seconds"]]) / n_pi
    minutes = 32 * per_iteration / 60
    note = f"; policy phase; auxiliary epoch {per_iteration:,.0f} s per iteration's frames, {minutes:,.0f} min at N_pi 32"
    return np.mean([v for _, v, _ in logged["charts/policy_phase_SPS"]]), note


def last_line(crash: subprocess.CalledProcessError) -> str:
    """What a failed run said last (a script's refusal names its flag and the fix)."""
    return ((crash.stderr or "").strip().splitlines() or ["no output"])[-1]


def late_sps(logged: dict) -> float:
    """Env steps per second over the second half of a run's SPS events (their steps and wall times): the speed a long
    run settles at, without the first iterations, which pay torch.compile's compilation."""
    events = logged["charts/SPS"]
    if len(events) < 3:
        return float("nan")
    (step0, _, time0), (step1, _, time1) = events[len(events) // 2], events[-1]
    return (step1 - step0) / (time1 - time0) if time1 > time0 else float("nan")


def pays_from(eager_seconds: float, compiled_seconds: float, steps: int, eager_sps: float, compiled_sps: float) -> float:
    """The run length (env steps) from which compiling saves time: the compiled run's fixed cost (its wall time beyond
    what its steps took at its late speed, less the eager run's same beyond) over the time it saves per step."""
    saved_per_step = 1 / eager_sps - 1 / compiled_sps
    fixed = (compiled_seconds - steps / compiled_sps) - (eager_seconds - steps / eager_sps)
    return max(fixed, 0.0) / saved_per_step if saved_per_step > 0 else float("inf")


def compiled_cells(algo, env_id, num_envs, budget, flags, eager: tuple[dict, float], cuda: bool) -> list[str]:
    """The two compiled columns of a row: --compile's late SPS against the eager run's and the length from which it
    pays; --cudagraphs' the same on CUDA."""
    if algo not in COMPILED:
        return ["-", "-"]
    eager_late = late_sps(eager[0])
    cells = []
    for extra in (["--compile"], ["--compile", "--cudagraphs"]):
        if "--cudagraphs" in extra and not cuda:
            cells.append("needs CUDA")
            continue
        try:
            logged, seconds = train(algo, env_id, num_envs, budget, [*flags, *extra])
        except subprocess.CalledProcessError as crash:  # the row keeps its eager figures and says why this cell has none
            cells.append(f"crashed (exit {crash.returncode}): {last_line(crash)[:150]}")
            continue
        late = late_sps(logged)
        if not (np.isfinite(late) and np.isfinite(eager_late)):
            cells.append("run too short for a second half of SPS events")
            continue
        length = pays_from(eager[1], seconds, budget, eager_late, late)
        pays = f"pays from {length:,.0f} steps" if np.isfinite(length) else "never pays"
        cells.append(f"{late:,.0f} ({late / eager_late:.2f}x eager's {eager_late:,.0f}; {pays})")
    return cells


def bf16_cell(algo, env_id, num_envs, budget, flags, eager_sps: float) -> str:
    """The --bf16 column: the same run with --bf16, its SPS (as the script SPS column counts it) against the default's;
    where that run fails, why, as a compiled cell says it."""
    if (algo, env_id) not in BF16:
        return "-"
    try:
        logged, _ = train(algo, env_id, num_envs, budget, [*flags, "--bf16"])
    except subprocess.CalledProcessError as crash:
        return f"crashed (exit {crash.returncode}): {last_line(crash)[:150]}"
    sps = script_sps(logged, flags)[0]
    return f"{sps:,.0f} ({sps / eager_sps:.2f}x)"


def machine() -> str:
    """The first words of a table's machine line: cores, CPU, torch and envpool versions."""
    cpu = platform.processor() or platform.machine()
    return f"Machine: {os.cpu_count()} cores ({cpu}), torch {torch.__version__}, envpool {envpool.__version__}"


def command_line(argv: list[str], out: str) -> str:
    """The command that made a table, as typed, with the file it wrote (a table says what made it)."""
    kept, skip = [], False
    for arg in argv:  # --out as given is replaced by the path written
        if skip or arg == "--out" or arg.startswith("--out="):
            skip = arg == "--out"
            continue
        kept.append(arg)
    return " ".join(["python benchmark/speed.py", *map(shlex.quote, kept), "--out", os.path.relpath(out, ROOT)])


def scaling(steps_scale: float, out: str, only: list[str] | None = None, command: str = "") -> str:
    """Each SCALING row twice on the same cores, back to back: one process with 2 torch threads, then 2 torchrun processes
    with one thread each and half the envs each; their SPS (all processes' steps over process 0's training time, the
    last charts/SPS: for ppg_procgen.py its auxiliary phase included) and whole-run wall times, and the ratio of the
    two SPS."""

    def row(algo, env_id, num_envs, budget, flags) -> str:
        runs = [train(algo, env_id, num_envs, budget, flags, processes, 2 // processes) for processes in (1, 2)]
        (one, one_s), (two, two_s) = ((logged["charts/SPS"][-1][1], seconds) for logged, seconds in runs)
        cells = [f"{algo}.py", env_id, f"{num_envs}", f"{budget:,}", f"{one:,.0f} ({one_s:.0f} s)"]
        return "| " + " | ".join([*cells, f"{two:,.0f} ({two_s:.0f} s)", f"{two / one:.2f}x"]) + " |"

    def write(rows: list[str]) -> None:
        text = "\n".join(
            [
                "# One process with two threads against two processes with one thread each",
                "",
                f"{machine()}, CPU (gloo). Command: `{command or 'python benchmark/speed.py --scaling'}`. "
                "SPS: all processes' env steps per second of training (evaluation excluded; ppg_procgen.py: both phases, "
                "64 envs x 64 steps, an auxiliary phase after iteration 2); in brackets the whole run's wall time, start-up "
                "included.",
                "",
                "| script | env | envs | steps | 1 process x 2 threads: SPS (wall) | 2 processes x 1 thread: SPS (wall) | "
                "2 processes against 1 |",
                "|---|---|---|---|---|---|---|",
                *rows,
                "",
            ]
        )
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)

    measured(selected(SCALING, only, steps_scale), row, write)
    return Path(out).read_text()


def main(argv: list[str] | None = None) -> str:
    """The table asked for, as written."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="rows to measure, as ALGO or ALGO:ENV_ID, each optionally followed, in the same quoted word, by flags for "
        "that row's script (e.g. 'dqn:CartPole-v1 --learning-starts 1000'; default: all rows)",
    )
    p.add_argument(
        "--steps-scale",
        type=float,
        default=1.0,
        help="multiply every training budget (e.g. 0.1 to try: a budget is never less than one rollout, and a "
        "--learning-starts as large as the budget becomes half of it)",
    )
    p.add_argument("--env-seconds", type=float, default=5.0, help="seconds of random stepping per env")
    p.add_argument("--no-compile", action="store_true", help="leave out the compiled runs (their columns show '-')")
    p.add_argument("--no-bf16", action="store_true", help="leave out the --bf16 runs (their column shows '-')")
    p.add_argument(
        "--out",
        default=None,
        help="markdown file to write (default: benchmark/runs/speed.md, or with --scaling speed_scaling.md: the committed "
        "tables in benchmark/results are rewritten only when named here)",
    )
    p.add_argument("--scaling", action="store_true", help="time the torchrun rows with 1 and 2 processes instead")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    configs = SCALING if args.scaling else CONFIGS
    for entry in args.only or []:
        try:
            name = (shlex.split(entry) or [""])[0]
        except ValueError as e:
            p.error(f"--only {entry!r}: {e}")
        if not any(name in (algo, f"{algo}:{env_id}") for algo, env_id, *_ in configs):
            p.error(f"--only {entry!r} names no row; the rows: {', '.join(f'{c[0]}:{c[1]}' for c in configs)}")
    args.out = args.out or str(ROOT / "benchmark" / "runs" / ("speed_scaling.md" if args.scaling else "speed.md"))
    if args.scaling:
        return scaling(args.steps_scale, args.out, args.only, command_line(argv, args.out))
    return tables(args, command_line(argv, args.out))


def tables(args: argparse.Namespace, command: str) -> str:
    """The speed table of the rows asked for; with --only, the other rows of an existing table stay as they were."""
    cuda = torch.cuda.is_available()

    def row(algo, env_id, num_envs, budget, flags) -> str:
        eager = train(algo, env_id, num_envs, budget, flags)
        learner, note = script_sps(eager[0], flags)
        compiled = ["-", "-"] if args.no_compile else compiled_cells(algo, env_id, num_envs, budget, flags, eager, cuda)
        bf16 = "-" if args.no_bf16 else bf16_cell(algo, env_id, num_envs, budget, flags, learner)
        env = env_sps(env_id, num_envs, args.env_seconds)
        shown = f"{budget:,}" + (" generations" if algo == "es" else "") + (f" ({' '.join(flags)}{note})" if flags else "")
        cells = [f"{algo}.py", env_id, f"{num_envs}", shown, f"{learner:,.0f}", f"{env:,.0f}", f"{learner / env:.1%}"]
        return "| " + " | ".join([*cells, bf16, *compiled]) + " |"

    old = Path(args.out).read_text().splitlines() if args.only is not None and Path(args.out).exists() else []
    kept = [line for line in old if line.startswith("| ") and "---" not in line][1:]

    def write(rows: list[str]) -> None:
        key = lambda row: " | ".join(row.split(" | ")[:2])  # noqa: E731  "| algo.py | env_id"
        by_key = {key(row): row for row in kept + rows}  # a new row replaces its old one
        rows = [by_key[k] for k in (f"| {c[0]}.py | {c[1]}" for c in CONFIGS) if k in by_key]
        text = "\n".join(
            [
                "# Learner speed against the env's own speed",
                "",
                f"{machine()}, "
                f"{'CUDA ' + torch.cuda.get_device_name() if cuda else 'no GPU'}. "
                f"Command: `{command}`" + (" (its rows; the others as they were)." if args.only else "."),
                "",
                "| script | env | envs | steps | script SPS | envpool random-action SPS | fraction kept | --bf16: script SPS "
                "(x default's) | --compile: second-half SPS (x eager's) | --compile --cudagraphs |",
                "|---|---|---|---|---|---|---|---|---|---|",
                *rows,
                "",
                "ppo.py, a2c.py and dqn.py step their CartPole-v1 envs with gymnasium in the process (`--env-backend auto`:",
                "up to 10 CartPoles, that is faster than envpool's hand-off to its threads); the env column is envpool's all",
                "the same.",
                "",
            ]
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)

    measured(selected(CONFIGS, args.only, args.steps_scale), row, write)
    return Path(args.out).read_text()


if __name__ == "__main__":
    main()
