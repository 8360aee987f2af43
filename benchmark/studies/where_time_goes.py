"""Where a training run's time goes: an algorithm script's main() under cProfile, in this process, the functions' own
time summed into a few kinds of work; the imports (the script's, and torch._dynamo's, which the first optimiser a run
makes imports) are timed apart, before it. cProfile's bookkeeping slows the Python parts more than the
compiled ones, so read the shares, not the seconds, and compare two profiles taken the same way.

    python benchmark/studies/where_time_goes.py ppo --env-id CartPole-v1 --total-timesteps 49152 --no-cuda
    python benchmark/studies/where_time_goes.py dqn --env-id CartPole-v1 --total-timesteps 50000 --no-cuda --top 20
"""

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark/, for algos
from algos import load_algorithm  # noqa: E402

# (kind, substrings of "file:function" that mark it), the first match wins
KINDS = [
    ("imports during the run", ("<frozen importlib", "marshal", "_imp.", "builtins.exec", "__build_class__", "<module>")),
    ("env stepping (envpool, gymnasium)", ("envpool", "gymnasium/", "mujoco")),
    ("backward pass", ("run_backward",)),
    ("optimiser step", ("adam", "rmsprop", "_foreach_", "clip_grad", "optimizer.py", "zero_grad")),
    ("network layers", ("_nn.linear", "conv2d", "torch.tanh", "torch.relu", "lstm", "_nn.", "torch.normal", "multinomial")),
    ("nn.Module calls", ("torch/nn/modules/",)),
    ("torch.distributions", ("torch/distributions",)),
    ("other tensor operations", ("torch._C", "TensorBase", "built-in method torch", "torch/")),
    ("tensorboard and logging", ("tensorboard", "tblog", "protobuf")),
    ("the script's own lines", ("algorithms/",)),
]


def kind_of(where: str) -> str:
    low = where.lower()
    return next((kind for kind, marks in KINDS if any(m.lower() in low for m in marks)), "other Python (numpy, stdlib)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("algo", help="an algorithm file's name: ppo, dqn, a2c, ...")
    p.add_argument("--top", type=int, default=0, help="also print the N functions with the most time of their own")
    args, flags = p.parse_known_args()
    start = time.perf_counter()
    module = load_algorithm(args.algo)
    import torch._dynamo  # noqa: F401  imported by the first optimiser a run makes: counted here, not in the loop

    imported = time.perf_counter() - start
    sys.argv = [str(Path(module.__file__)), *flags]
    profile = cProfile.Profile()
    profile.enable()
    try:
        module.main(module.parse_args(flags))
    except SystemExit:
        pass
    profile.disable()
    stats = pstats.Stats(profile)
    totals: dict[str, float] = {}
    for (file, _, function), (_, _, own, _, _) in stats.stats.items():
        kind = kind_of(f"{file}:{function}")
        totals[kind] = totals.get(kind, 0.0) + own
    run = sum(totals.values())
    print(f"\nimports: {imported:.2f} s (the script's, and torch._dynamo's); main(): {run:.2f} s under cProfile")
    for kind, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds / run:6.1%}  {seconds:6.2f} s  {kind}")
    if args.top:
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
