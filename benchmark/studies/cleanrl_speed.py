"""This project's scripts against CleanRL's, side by side on this machine: the same work (sizes, budget, CPU), timed as
a user feels it, the whole process from `python` to exit. After one untimed warm-up run of each side, the rounds go
A B A B; a row's figure is each side's median, and the ratio is CleanRL's time over ours (above 1: ours is faster).

    python benchmark/studies/cleanrl_speed.py                          # every row, CleanRL's files fetched at CLEANRL_COMMIT
    python benchmark/studies/cleanrl_speed.py --cleanrl PATH           # a clone of vwxyzjn/cleanrl (read with git show)
    python benchmark/studies/cleanrl_speed.py --only ppo-cartpole startup --rounds 3
    python benchmark/studies/cleanrl_speed.py --compile                # also ours with --compile, against CleanRL's eager time

CleanRL's files are run as they are at CLEANRL_COMMIT except for PORTS: API calls of gymnasium 0.29 and envpool's old
gym API that today's gymnasium 1.x and envpool no longer have, each listed with why (the loops, networks and updates are
untouched). Its Atari script runs through benchmark/studies/cleanrl_envpool_gym.py (envpool's old gym API over the gymnasium
one) with gym 0.23 on the path (--deps; `pip install --target DIR --no-deps gym==0.23.1 gym_notices`), and its MuJoCo
scripts need the mujoco package (gymnasium's MuJoCo envs; ours use envpool's), on the path or in --deps.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark/, for speed
from speed import machine  # noqa: E402  (the same machine line as speed.py's tables)

ROOT = Path(__file__).resolve().parents[2]
CLEANRL_COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"  # vwxyzjn/cleanrl master, 2025


# The lines of CleanRL's files that today's APIs need changed: (file, why, old text, new text); every old text must be
# found exactly once, or the run stops (a different commit needs its own ports). Blocks of code are written here
# without their indentation, and indented as in the file (`block`).
def block(text: str, spaces: int) -> str:
    return textwrap.indent(text, " " * spaces)


# CleanRL's episode logging for gymnasium 0.29: a final_info list, one dict (or None) per env
FINAL_INFO_LOOP = """if "final_info" in infos:
    for info in infos["final_info"]:
        if info and "episode" in info:
            print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
            writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
            writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)
"""
TD3_FINAL_INFO_LOOP = FINAL_INFO_LOOP.replace('if info and "episode" in info:', "if info is not None:") + "            break\n"
# ported: gymnasium 1.x keeps the statistics as a dict of arrays, EPISODES: the vector env's infos under next-step
# autoreset, their final_info under same-step autoreset
EPISODES = """if "episode" in EPISODES:
    for i in EPISODES["_episode"].nonzero()[0]:
        print(f"global_step={global_step}, episodic_return={EPISODES['episode']['r'][i]}")
        writer.add_scalar("charts/episodic_return", EPISODES["episode"]["r"][i], global_step)
        writer.add_scalar("charts/episodic_length", EPISODES["episode"]["l"][i], global_step)
"""
NEXT_STEP_EPISODES, SAME_STEP_EPISODES = (EPISODES.replace("EPISODES", e) for e in ("infos", "infos.get('final_info', {})"))
NO_LIST_WHY = "gymnasium 1.x has no final_info list under next-step autoreset"
SAME_STEP_WHY = "gymnasium 1.x resets on the next step; the replay buffer's final observations need same-step autoreset"
PORTS = [
    ("cleanrl/ppo.py", NO_LIST_WHY, block(FINAL_INFO_LOOP, 12), block(NEXT_STEP_EPISODES, 12)),
    ("cleanrl/ppo_continuous_action.py", NO_LIST_WHY, block(FINAL_INFO_LOOP, 12), block(NEXT_STEP_EPISODES, 12)),
    (
        "cleanrl/ppo_continuous_action.py",
        "gymnasium 1.x's TransformObservation takes the observation space",
        "env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
        "env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)",
    ),
]
for _file, _loop in (("cleanrl/dqn.py", FINAL_INFO_LOOP), ("cleanrl/td3_continuous_action.py", TD3_FINAL_INFO_LOOP)):
    PORTS += [
        (_file, "gymnasium 1.x's final_info is a dict of arrays", block(_loop, 8), block(SAME_STEP_EPISODES, 8)),
        (_file, "gymnasium 1.x names the final observations final_obs", 'infos["final_observation"]', 'infos["final_obs"]'),
        (
            _file,
            SAME_STEP_WHY,
            "for i in range(args.num_envs)]\n    )",
            "for i in range(args.num_envs)],\n        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )",
        ),
    ]

# (row, our script and flags, CleanRL's file and flags, note): the same sizes, budget and device on both sides
ROWS = {
    "ppo-cartpole": (
        "PPO CartPole-v1, 4 envs x 128 steps, 49,152 steps",
        ["ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "49152"],
        ["cleanrl/ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "49152"],
    ),
    "dqn-cartpole": (
        "DQN CartPole-v1, 50,000 steps",
        ["dqn.py", "--env-id", "CartPole-v1", "--total-timesteps", "50000"],
        ["cleanrl/dqn.py", "--env-id", "CartPole-v1", "--total-timesteps", "50000"],
    ),
    "a2c-cartpole": (
        "A2C CartPole-v1, 8 envs x 5 steps, 50,000 steps (CleanRL: ppo.py with one epoch of one minibatch)",
        ["a2c.py", "--env-id", "CartPole-v1", "--total-timesteps", "50000"],
        ["cleanrl/ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "50000", "--num-envs", "8", "--num-steps", "5"]
        + ["--num-minibatches", "1", "--update-epochs", "1", "--learning-rate", "7e-4"],
    ),
    "ppo-breakout": (
        "PPO Breakout-v5, 8 envs x 128 steps, 16,384 steps",
        ["ppo.py", "--env-id", "Breakout-v5", "--total-timesteps", "16384"],
        ["cleanrl/ppo_atari_envpool.py", "--env-id", "Breakout-v5", "--total-timesteps", "16384"],
    ),
    "td3-hopper": (
        "TD3 Hopper-v4, 5,000 steps, learning from step 256",
        ["ddpg_td3.py", "--env-id", "Hopper-v4", "--total-timesteps", "5000", "--learning-starts", "256"],
        ["cleanrl/td3_continuous_action.py", "--env-id", "Hopper-v4", "--total-timesteps", "5000", "--learning-starts", "256"],
    ),
    "ppo-halfcheetah": (
        "PPO HalfCheetah-v4, 1 env x 2,048 steps, 16,384 steps",
        ["ppo.py", "--env-id", "HalfCheetah-v4", "--total-timesteps", "16384"],
        ["cleanrl/ppo_continuous_action.py", "--env-id", "HalfCheetah-v4", "--total-timesteps", "16384"],
    ),
    "startup": (
        "start-up: PPO CartPole-v1, 512 steps (one iteration)",
        ["ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "512"],
        ["cleanrl/ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "512"],
    ),
}
COMPILED = {"ppo.py", "a2c.py", "dqn.py", "ddpg_td3.py"}  # the scripts with --compile
BF16 = {"ppo-breakout", "td3-hopper"}  # the rows whose script takes --bf16 on that env (frames, or TD3's networks)


def cleanrl_file(path: str, clone: str | None, cache: Path) -> str:
    """CleanRL's file at CLEANRL_COMMIT: from a local clone (git show), or downloaded once into the cache."""
    local, bare = cache / CLEANRL_COMMIT / path, clone and (clone.endswith(".git") or Path(clone, "HEAD").is_file())
    try:
        if clone:
            git = ["git", "--git-dir" if bare else "-C", clone, "show", f"{CLEANRL_COMMIT}:{path}"]
            return subprocess.run(git, capture_output=True, text=True, check=True).stdout
        if not local.is_file():
            local.parent.mkdir(parents=True, exist_ok=True)
            url = f"https://raw.githubusercontent.com/vwxyzjn/cleanrl/{CLEANRL_COMMIT}/{path}"
            local.write_bytes(urllib.request.urlopen(url, timeout=60).read())
        return local.read_text()
    except (subprocess.CalledProcessError, OSError) as error:  # an unpacked archive has no history; offline, no download
        what = f"--cleanrl {clone} is not a git clone holding" if clone else f"{path} cannot be downloaded ({error}) at"
        print(
            f"{Path(sys.argv[0]).name}: error: {what} CleanRL's commit {CLEANRL_COMMIT[:8]}: clone CleanRL with "
            "`git clone https://github.com/vwxyzjn/cleanrl` and pass the clone's folder as --cleanrl",
            file=sys.stderr,
        )
        sys.exit(2)


def write_ported(path: str, tree: Path, clone: str | None, cache: Path) -> Path:
    """CleanRL's file `path` written under `tree` with its PORTS applied; its path there."""
    text = cleanrl_file(path, clone, cache)
    for file, why, old, new in PORTS:
        if file == path:
            if text.count(old) != 1:
                sys.exit(f"cleanrl_speed.py: error: the port '{why}' does not apply to {path} at {CLEANRL_COMMIT[:8]}")
            text = text.replace(old, new)
    (tree / path).parent.mkdir(parents=True, exist_ok=True)
    (tree / path).write_text(text)
    return tree / path


def write_cleanrl(tree: Path, clone: str | None, cache: Path) -> None:
    """CleanRL's scripts and cleanrl_utils/buffers.py under `tree`, with PORTS applied."""
    files = {cleanrl[0] for _, _, cleanrl in ROWS.values()} | {"cleanrl_utils/buffers.py"}
    for path in sorted(files):
        write_ported(path, tree, clone, cache)
    (tree / "cleanrl_utils" / "__init__.py").write_text("")


def command(side: str, row: str, tree: Path, extra: tuple[str, ...] = ()) -> list[str]:
    _, ours, cleanrl = ROWS[row]
    if side == "ours":
        flags = [*ours[1:], "--no-cuda", *extra]
        return [sys.executable, str(ROOT / "algorithms" / ours[0]), *flags]
    script = [str(tree / cleanrl[0])]
    if "envpool" in cleanrl[0]:  # envpool's old gym API, over today's
        script = [str(ROOT / "benchmark" / "studies" / "cleanrl_envpool_gym.py"), *script]
    return [sys.executable, *script, *cleanrl[1:], "--no-cuda"]


def timed(cmd: list[str], env: dict) -> float:
    """Seconds from start to exit of one run in a fresh folder (its runs/ removed after)."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"cleanrl_speed.py: error: {' '.join(cmd[1:3])} failed:\n{proc.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cleanrl", default=None, help="a clone of vwxyzjn/cleanrl (default: fetch its files from GitHub)")
    p.add_argument("--deps", default="/tmp/cleanrl_deps", help="PYTHONPATH entries for CleanRL's extra needs (':')")
    p.add_argument("--only", nargs="*", default=None, choices=list(ROWS), help="rows to time (default: all)")
    p.add_argument("--rounds", type=int, default=2, help="timed A B rounds per row, after one warm-up of each")
    p.add_argument("--compile", action="store_true", help="also time ours with --compile (its own warm-up first)")
    p.add_argument("--bf16", action="store_true", help="also time ours with --bf16, on the rows in BF16")
    p.add_argument("--out", default=str(ROOT / "benchmark" / "results" / "cleanrl_speed.md"), help="markdown to write")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    cache = Path.home() / ".cache" / "cleanrl_speed"
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        write_cleanrl(tree, args.cleanrl, cache)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), args.deps, os.environ.get("PYTHONPATH", "")])}
        env["PYTHONWARNINGS"] = "ignore"
        rows = []
        for row in args.only or list(ROWS):
            title, ours, _ = ROWS[row]
            sides = ["ours", "cleanrl"] + (["compiled"] if args.compile and ours[0] in COMPILED else [])
            sides += ["bf16"] if args.bf16 and row in BF16 else []
            extra = {"compiled": ("--compile",), "bf16": ("--bf16",)}
            cmds = {
                side: command("cleanrl" if side == "cleanrl" else "ours", row, tree, extra.get(side, ())) for side in sides
            }
            for side in sides:  # warm-up: the OS's file cache, torch's and inductor's caches
                timed(cmds[side], env)
            times = {side: [] for side in sides}
            for _ in range(args.rounds):
                for side in sides:
                    times[side].append(timed(cmds[side], env))
            med = {side: statistics.median(t) for side, t in times.items()}
            spread = {side: f"{min(t):.1f}-{max(t):.1f} s" if len(t) > 1 else f"{t[0]:.1f} s" for side, t in times.items()}
            cells = [title, spread["ours"], spread["cleanrl"], f"{med['cleanrl'] / med['ours']:.2f}x"]
            for flag, side in (("compile", "compiled"), ("bf16", "bf16")):
                if getattr(args, flag):
                    cells.append(f"{spread[side]}: {med['cleanrl'] / med[side]:.2f}x" if side in med else "-")
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    header = "| row | ours | CleanRL | CleanRL's time / ours |"
    header += " ours --compile: time, CleanRL's / it |" if args.compile else ""
    header += " ours --bf16: time, CleanRL's / it |" if args.bf16 else ""
    text = "\n".join(
        [
            "# Against CleanRL's scripts, whole process, same machine",
            "",
            f"{machine()}, CPU. Command: `python benchmark/studies/cleanrl_speed.py"
            + (" --compile" if args.compile else "")
            + (" --bf16" if args.bf16 else "")
            + (f" --only {' '.join(args.only)}" if args.only else "")
            + f"`. CleanRL at {CLEANRL_COMMIT[:8]}, ported as the script lists. After a warm-up run of each, "
            f"{args.rounds} rounds A B; times are the range over the rounds, ratios of the medians.",
            "",
            header,
            "|---|---|---|---|" + "---|" * (args.compile + args.bf16),
            *rows,
            "",
        ]
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return text


if __name__ == "__main__":
    main()
