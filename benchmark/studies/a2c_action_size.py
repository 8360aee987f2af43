"""How far outside its action bounds a saved a2c.py Gaussian policy has drifted: the mean size |mean| of the greedy
action, before the clip to the bounds, over the steps of the reloaded model's greedy play.

    python benchmark/studies/a2c_action_size.py benchmark/runs/a2c_mujoco/runs/HalfCheetah-v4__a2c__1__*/a2c.model

A size well above 1 on [-1, 1] bounds means the clipped action no longer moves with the policy's mean (every MuJoCo
run in benchmark/results/a2c_mujoco/sb3_a2c.md ends so, good or collapsed). The env, seed and observation statistics
come from the model file; the env is seeded as a2c.py's own evaluation seeds it (seed + 100,000). It is the measure
sb3_a2c_mujoco.py prints for SB3's A2C (there over its 10 evaluation episodes)."""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark/, for algos
from algos import load_algorithm  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("model", nargs="+", help="runs/<run>/a2c.model files written by a2c.py --save-model")
p.add_argument("--steps", type=int, default=1000, help="env steps of greedy play to average over (default 1000)")
args = p.parse_args()
if args.steps < 1:
    raise SystemExit(f"a2c_action_size.py: --steps is {args.steps}; pass a positive number of steps, e.g. 1000")

a2c = load_algorithm("a2c")
torch.set_num_threads(1)
for path in args.model:
    try:  # the safe loader, as a2c.py reads its files: nothing in a file runs
        with torch.serialization.safe_globals(a2c.NUMPY_TYPES):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a missing, unreadable or unsafe file: the same one line as any other wrong file
        state = None
    if not (isinstance(state, dict) and state.get("script") == "a2c.py" and state.get("kind") == "model"):
        raise SystemExit(f"a2c_action_size.py: '{path}' is not an a2c.py model; pass the runs/<run>/a2c.model of a run")
    saved = state["args"]
    envs, _ = a2c.make_env(saved["env_id"], 1, saved["seed"] + 100_000, False, False, "auto")
    if not isinstance(envs.single_action_space, a2c.gym.spaces.Box):
        raise SystemExit(f"a2c_action_size.py: {saved['env_id']} has discrete actions; there are no bounds to leave")
    agent = a2c.Agent(envs.single_observation_space, envs.single_action_space)
    agent.load_state_dict(state["model"])
    rms = None
    if state["obs_rms"] is not None:
        rms = a2c.RunningMeanStd(envs.single_observation_space.shape, torch.device("cpu"))
        rms.load_state_dict(state["obs_rms"])
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs, _ = envs.reset()
    sizes = []
    for _ in range(args.steps):
        with torch.no_grad():
            x = torch.as_tensor(a2c.normalize_obs(obs, rms))
            mean = agent.get_action_and_value(x, deterministic=True)[0].numpy()
        sizes.append(np.abs(mean).mean())
        obs, *_ = envs.step(np.clip(mean, low, high))
    envs.close()
    print(f"{path}: {saved['env_id']} seed {saved['seed']}, mean |action| before clipping {np.mean(sizes):.2f} "
          f"over {args.steps} steps (bounds {low.min():g} to {high.max():g})")  # fmt: skip
