"""Where one iteration of PPO's loop goes on a GPU: ppo.py against LeanRL's ppo_atari_envpool_torchcompile.py, eager and
compiled, on Breakout-v5 with the Atari sizes (8 envs x 128 steps, 4 epochs of 4 minibatches). Each side runs in its own
process; a timer waits for the GPU (torch.cuda.synchronize) at each phase's end and splits every iteration into the
rollout (acting and env steps), GAE, the update, and the rest (logging, checkpoints' checks); the first --skip
iterations (compiling, recording CUDA graphs) are left out, and the table gives each phase's median over the others.
The waits add a few host syncs an iteration, the same on both sides; read the split, and the SPS as approximate.

    python benchmark/studies/compiled_loop_phases.py --leanrl FILE [--iterations 60] [--skip 10] [--out FILE]

FILE is leanrl/ppo_atari_envpool_torchcompile.py of pytorch-labs/LeanRL (8dbb633 was measured). LeanRL's script is run
with four timer lines and one port added (text patches, each found exactly once; the port is explained at
LEANRL_PATCHES) and a stand-in for wandb (it logs nothing); it is written for gym 0.23 and envpool's old gym API, so it
runs through cleanrl_envpool_gym.py and needs gym 0.23 on the path. "ours, compiled GAE" is ppo.py with --compile
--cudagraphs and its compute_gae also handed to torch.compile: a candidate, measured before it is made.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUDIES = Path(__file__).resolve().parent
ROOT = STUDIES.parents[1]
LEANRL_FILE = "leanrl/ppo_atari_envpool_torchcompile.py"
SIDES = {  # name: (whose, flags)
    "ours, eager": ("ours", []),
    "ours, --compile --cudagraphs": ("ours", ["--compile", "--cudagraphs"]),
    "ours, compiled GAE": ("ours-gae", ["--compile", "--cudagraphs"]),
    "LeanRL, eager": ("leanrl", []),
    "LeanRL, --compile --cudagraphs": ("leanrl", ["--compile", "--cudagraphs"]),
}
PHASES = ("rollout", "gae", "update", "rest")
# LeanRL's file, a port and a timer line after each phase: (old, new); each old must be found exactly once
LEANRL_PATCHES = [
    # a port, not a timer: with tensordict 0.15 and torch 2.11, to_module makes the acting copy's weights parameters that
    # require gradients, so the rollout's values carry a graph and the update fails ("backward through the graph a second
    # time"; compiled: "CudaGraphModule cannot be part of a graph"); the copy shares the weights' storage, so turning
    # its gradients off changes no number
    ("    agent_inference_p.to_module(agent_inference)\n",
     "    agent_inference_p.to_module(agent_inference)\n    agent_inference.requires_grad_(False)\n"),
    ("    for iteration in pbar:\n", "    for iteration in pbar:\n        _PHASES.start()\n"),
    ("        next_obs, next_done, container = rollout(next_obs, next_done, avg_returns=avg_returns)\n",
     "        next_obs, next_done, container = rollout(next_obs, next_done, avg_returns=avg_returns)\n"
     "        _PHASES.lap('rollout')\n"),
    ("        container = gae(next_obs, next_done, container)\n",
     "        container = gae(next_obs, next_done, container)\n        _PHASES.lap('gae')\n"),
    ("        if global_step_burnin is not None and iteration % 10 == 0:\n",
     "        _PHASES.lap('update')\n        if global_step_burnin is not None and iteration % 10 == 0:\n"),
]  # fmt: skip
TIMER = """import atexit, json, time


class Phases:
    def __init__(self):
        self.records, self.current, self.t = [], None, 0.0

    def now(self):
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self):
        now = self.now()
        if self.current is not None:
            self.current["rest"] = now - self.t
            self.records.append(self.current)
        self.current, self.t = {}, now

    def lap(self, name):
        now = self.now()
        self.current[name] = self.current.get(name, 0.0) + now - self.t
        self.t = now


PHASES = Phases()
atexit.register(lambda: print("PHASES " + json.dumps(PHASES.records), flush=True))
"""


def child_ours(gae_compiled: bool, flags: list[str]) -> None:
    """ppo.py's main in this process, its phase boundaries found by wrapping three of its functions."""
    sys.path.insert(0, str(ROOT / "benchmark"))
    from phase_timer import PHASES as T  # noqa: N814  written by the parent

    from algos import load_algorithm

    ppo = load_algorithm("ppo")
    lr, gae, update = ppo.annealed_lr, ppo.compute_gae, ppo.ppo_update
    if gae_compiled:
        import torch

        gae = torch.compile(gae, fullgraph=True)

    def annealed_lr(*a):
        T.start()
        return lr(*a)

    def compute_gae(*a):
        T.lap("rollout")  # the bootstrap value of the last observation comes with the rollout here, with GAE in LeanRL's
        out = gae(*a)
        T.lap("gae")
        return out

    def ppo_update(*a):
        out = update(*a)
        T.lap("update")
        return out

    ppo.annealed_lr, ppo.compute_gae, ppo.ppo_update = annealed_lr, compute_gae, ppo_update
    ppo.main(ppo.parse_args(flags))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--leanrl", required=True, help="LeanRL's leanrl/ppo_atari_envpool_torchcompile.py")
    p.add_argument("--iterations", type=int, default=60, help="iterations of 1,024 steps per side")
    p.add_argument("--skip", type=int, default=10, help="first iterations left out (compiling, recording graphs)")
    p.add_argument("--only", nargs="+", choices=list(SIDES), default=list(SIDES), help="sides to run")
    p.add_argument("--out", default="", help="also write the table to this Markdown file")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args()
    if args.child:
        return child_ours(args.child == "ours-gae", rest)
    steps = ["--total-timesteps", str(1024 * args.iterations), "--env-id", "Breakout-v5", "--seed", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "phase_timer.py").write_text(TIMER)
        (tmp / "wandb.py").write_text("def init(*a, **k):\n    pass\n\n\ndef log(*a, **k):\n    pass\n")
        text = Path(args.leanrl).read_text()
        for old, new in LEANRL_PATCHES:
            if text.count(old) != 1:
                sys.exit(f"compiled_loop_phases.py: error: a patch does not apply to {LEANRL_FILE}: {old.strip()!r}")
            text = text.replace(old, new)
        (tmp / "leanrl_ppo.py").write_text("from phase_timer import PHASES as _PHASES  # noqa\n" + text)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), os.environ.get("PYTHONPATH", "")]))}
        rows, failed = [], False
        for name in args.only:
            whose, flags = SIDES[name]
            if whose == "leanrl":
                cmd = [sys.executable, str(STUDIES / "cleanrl_envpool_gym.py"), str(tmp / "leanrl_ppo.py"), *steps, *flags]
                side_env = {**env, "TORCHDYNAMO_INLINE_INBUILT_NN_MODULES": "1"}  # as LeanRL's file sets it
            else:
                cmd = [sys.executable, __file__, "--leanrl", args.leanrl, "--child", whose, *steps, *flags]
                side_env = env
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=side_env, cwd=tmp, capture_output=True, text=True)
            wall = time.perf_counter() - start
            found = [line for line in proc.stdout.splitlines() if line.startswith("PHASES ")]
            if proc.returncode != 0 or not found:  # the other sides still run
                print(f"{name}: failed (exit {proc.returncode}):\n{proc.stdout[-1000:]}\n{proc.stderr[-2000:]}", flush=True)
                failed = True
                continue
            records = json.loads(found[-1][len("PHASES ") :])[args.skip :]
            med = {ph: 1000 * statistics.median(r.get(ph, 0.0) for r in records) for ph in PHASES}
            total = 1000 * statistics.median(sum(r.values()) for r in records)
            rows.append((name, med, total, len(records), wall))
            print(f"{name}: " + ", ".join(f"{ph} {med[ph]:.1f} ms" for ph in PHASES) + f", total {total:.1f} ms "
                  f"({1024e3 / total:,.0f} SPS) over {len(records)} iterations; process {wall:.0f} s", flush=True)  # fmt: skip
    table = ["| side | rollout ms | GAE ms | update ms | rest ms | iteration ms | SPS | iterations | process s |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, med, total, n, wall in rows:
        cells = [f"{med[ph]:.1f}" for ph in PHASES]
        table.append(f"| {name} | {' | '.join(cells)} | {total:.1f} | {1024e3 / total:,.0f} | {n} | {wall:.0f} |")
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text("\n".join(table) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
