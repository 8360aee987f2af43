"""channels_last against PyTorch's default (contiguous) layout, each with and without --bf16, for a pixel script's
convolutional network, whole process, the variants in turn for --rounds rounds on one machine.

    python benchmark/studies/layout_speed.py --algo ppo --env-id Breakout-v5 --steps 32768 --rounds 2
    python benchmark/studies/layout_speed.py --algo ppo --steps 65536 --rounds 1 --flags="--compile --cudagraphs"

The contiguous variant is the same file with every `memory_format=torch.channels_last` made
`torch.contiguous_format` (a copy in a temporary folder): the same maths, another memory layout for the weights, the
stored frames and the activations. Each line gives the second-half SPS (the run's last half of charts/SPS events, so
that compilation and start-up do not count) and the ratio to the first variant of the same round. On a CPU the
answer is in docs/speed.md; the script exists for the CUDA question (does channels_last, and does bf16, pay on a GPU).
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from speed import last_line, late_sps  # noqa: E402

from tblog import read_scalars  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent


def run(script: Path, args, extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(script), "--env-id", args.env_id, "--total-timesteps", str(args.steps)]
        cmd += [*args.flags.split(), *extra]
        try:
            subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=True)
        except subprocess.CalledProcessError as crash:  # the script's own last line says why
            print(last_line(crash), flush=True)
            return float("nan")
        (run_dir,) = (Path(tmp) / "runs").iterdir()
        return late_sps(read_scalars(str(run_dir)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "dqn", "rnd_ppo"])
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--steps", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--flags", default="", help="flags for every run, e.g. '--compile --cudagraphs'")
    parser.add_argument("--variants", default="cl,contiguous,cl-bf16,contiguous-bf16")
    args = parser.parse_args()
    script = ROOT / "algorithms" / f"{args.algo}.py"
    with tempfile.TemporaryDirectory() as tmp:
        contiguous = Path(tmp) / script.name
        text = script.read_text()
        contiguous.write_text(text.replace("memory_format=torch.channels_last", "memory_format=torch.contiguous_format"))
        variants = {
            "cl": (script, []),
            "contiguous": (contiguous, []),
            "cl-bf16": (script, ["--bf16"]),
            "contiguous-bf16": (contiguous, ["--bf16"]),
        }
        names = args.variants.split(",")
        for r in range(args.rounds):
            first = None
            for name in names:
                sps = run(variants[name][0], args, variants[name][1])
                first = first or sps
                print(
                    f"{args.algo} {args.env_id} {args.flags} round {r + 1}: {name:<16} {sps:8,.0f} SPS  {sps / first:.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
