"""Whether a change to an algorithm file keeps its runs the same to the bit on the CPU: short runs of each file, with a
fixed seed, at a git revision (a clone of it) and in this checkout, and every tensorboard scalar compared but the
timings (charts/SPS and the like). A refactor must print "same" for every configuration.

    python benchmark/studies/same_runs.py --rev HEAD                 # every file's configurations
    python benchmark/studies/same_runs.py --rev 7848a17 --only ppo   # one file's
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmark"))
from tblog import read_scalars  # noqa: E402

TIMINGS = ("charts/SPS", "charts/policy_phase_SPS", "charts/aux_epoch_seconds", "charts/generation_seconds", "charts/seconds",
           "charts/obs_norm_init_seconds")  # fmt: skip
# (file, flags): short runs that pass through each file's main paths (updates, logging, evaluation, the final model)
CONFIGS = [
    ("ppo", ["--env-id", "CartPole-v1", "--total-timesteps", "4096", "--save-model", "--eval-episodes", "3"]),
    ("ppo", ["--env-id", "Pendulum-v1", "--total-timesteps", "4096", "--eval-every", "2048", "--eval-episodes", "2"]),
    ("ppo", ["--env-id", "CartPole-v1", "--rnn", "lstm", "--total-timesteps", "4096"]),
    ("ppo", ["--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "32", "--total-timesteps", "256"]),
    ("a2c", ["--env-id", "CartPole-v1", "--total-timesteps", "4000", "--save-model", "--eval-episodes", "3"]),
    ("a2c", ["--env-id", "Pendulum-v1", "--total-timesteps", "2000", "--norm-obs", "--norm-reward"]),
    ("a2c", ["--env-id", "CartPole-v1", "--rnn", "lstm", "--total-timesteps", "2000"]),
    ("dqn", ["--env-id", "CartPole-v1", "--total-timesteps", "3000", "--learning-starts", "500", "--save-model",
             "--eval-episodes", "3"]),
    ("dqn", ["--env-id", "Breakout-v5", "--total-timesteps", "600", "--learning-starts", "300", "--buffer-size", "1000"]),
    ("ddpg_td3", ["--env-id", "Pendulum-v1", "--total-timesteps", "1000", "--learning-starts", "300", "--save-model",
                  "--eval-episodes", "2"]),
    ("ddpg_td3", ["--algo", "ddpg", "--env-id", "Pendulum-v1", "--total-timesteps", "800", "--learning-starts", "300"]),
    ("es", ["--env-id", "CartPole-v1", "--num-generations", "3", "--population-size", "8", "--save-model",
            "--eval-episodes", "2"]),
    ("qlearning", ["--env-id", "FrozenLake-v1", "--total-timesteps", "20000", "--save-model", "--eval-episodes", "20"]),
    ("ppg_procgen", ["--env-id", "StarpilotEasy-v0", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2",
                     "--n-pi", "2", "--e-aux", "1", "--total-timesteps", "512", "--save-model", "--eval-episodes", "1"]),
    ("rnd_ppo", ["--env-id", "MontezumaRevenge-v5", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2",
                 "--num-iterations-obs-norm-init", "1", "--max-episode-steps", "40", "--total-timesteps", "512",
                 "--save-model", "--eval-episodes", "1"]),
]  # fmt: skip


def scalars(checkout: pathlib.Path, name: str, flags: list[str], cwd: pathlib.Path) -> dict:
    """Every scalar but the timings of one run of checkout's algorithms/<name>.py, seed 1, one thread, on the CPU."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, str(checkout / "algorithms" / f"{name}.py"), "--seed", "1", *flags]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1:] or ["(no output)"]}
    (run_dir,) = (cwd / "runs").iterdir()
    found = read_scalars(str(run_dir))
    return {tag: [(step, value) for step, value, _ in points] for tag, points in found.items() if tag not in TIMINGS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the git revision to compare this checkout with")
    parser.add_argument("--only", nargs="*", default=None, help="these files' configurations only (ppo, a2c, ...)")
    options = parser.parse_args()
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        before = pathlib.Path(tmp) / "before"
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(before)], check=True)
        subprocess.run(["git", "-C", str(before), "checkout", "-q", options.rev], check=True)
        for i, (name, flags) in enumerate(CONFIGS):
            if options.only and name not in options.only:
                continue
            runs = []
            for side, checkout in (("before", before), ("after", ROOT)):
                cwd = pathlib.Path(tmp) / f"{side}_{i}"
                cwd.mkdir()
                runs.append(scalars(checkout, name, flags, cwd))
            same = runs[0] == runs[1] and "failed" not in runs[0]
            differ += not same
            tags = sorted(set(runs[0]) | set(runs[1]))
            changed = [t for t in tags if runs[0].get(t) != runs[1].get(t)]
            print(f"{'same' if same else 'DIFFER'}: {name}.py {' '.join(flags)}" + (f"  ({', '.join(changed)})" if changed else
                  f"  ({len(tags)} tags)"), flush=True)  # fmt: skip
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
