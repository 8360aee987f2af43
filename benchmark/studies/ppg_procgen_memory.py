"""Peak RSS of ppg_procgen.py with the default sizes on CPU, without 1.5 hours of policy phase first.

    python benchmark/studies/ppg_procgen_memory.py          # about 15 minutes on 2 CPU cores, 7 GB of free RAM and disk

It writes a checkpoint at the end of policy iteration 31 of 32 with that phase's frames (random bytes: the content does
not change the memory), resumes it (which loads the frames slot by slot), so the run does the phase's last policy
iteration, the old policy's logits over the whole phase and the first auxiliary minibatches on the full 6.4 GB buffer;
then it stops the run with Ctrl-C and reports the process's peak RSS against the buffer's size.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "algorithms"))
import ppg_procgen as ppg  # noqa: E402


def write_checkpoint_before_last_iteration(env_id: str, flags: list[str]) -> tuple[str, int]:
    """A checkpoint of a default run at iteration n_pi - 1, its frames beside it; returns its path and the buffer size."""
    args = ppg.parse_args(["--env-id", env_id, "--total-timesteps", str(64 * 256 * 40), "--no-cuda", *flags])
    obs_space, action_space = ppg.env_spaces(args.env_id)
    ppg.check_args(args, obs_space, action_space)
    run_dir = os.path.join("runs", "memory_probe")
    os.makedirs(run_dir)
    agent = ppg.Agent(obs_space, action_space, args.arch)
    filled, shape = args.n_pi - 1, (args.num_steps, args.num_envs) + obs_space.shape
    rng, name = np.random.default_rng(0), f"phase_{filled}_process0.u8"
    with open(os.path.join(run_dir, name), "wb") as f:
        for _ in range(filled):
            rng.integers(0, 256, size=shape, dtype=np.uint8).tofile(f)
    phase = dict(file=name, filled=filled, returns=torch.zeros(filled, *shape[:2]), valid=torch.ones(filled, *shape[:2]))
    ppg.save_checkpoint(
        os.path.join(run_dir, "checkpoint.pt"), "checkpoint", args, run_dir, model=agent.state_dict(),
        optimizer=torch.optim.Adam(agent.parameters()).state_dict(),
        aux_optimizer=torch.optim.Adam(agent.parameters()).state_dict(),
        return_rms=ppg.RunningMeanStd((), torch.device("cpu")).state_dict(), phase=[phase], aux=None,
        global_step=filled * args.batch_size, iteration=filled, rng=[ppg.rng_state(torch.device("cpu"))],
    )  # fmt: skip
    (phase_bytes, _, _), *_ = ppg.storage(args, obs_space, action_space, torch.device("cpu")).values()  # the phase first
    return os.path.join(run_dir, "checkpoint.pt"), phase_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="StarpilotEasy-v0")
    p.add_argument("--aux-seconds", type=float, default=60.0, help="seconds of auxiliary phase before the stop")
    p.add_argument("flags", nargs="*", help="other ppg_procgen.py flags of the run (after --), e.g. -- --chunk-size 16")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        os.chdir(tmp)
        checkpoint, buffer = write_checkpoint_before_last_iteration(args.env_id, args.flags)
        cmd = [sys.executable, str(ROOT / "algorithms" / "ppg_procgen.py"), "--env-id", args.env_id, "--resume", checkpoint]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        peak, aux_since = 0, None
        while proc.poll() is None:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = max(peak, int(status.split("VmHWM:")[1].split()[0]) * 1024)  # the kernel's high-water mark
            if aux_since is None and any(line.startswith("auxiliary phase") for line in lines):
                aux_since = time.time()
            if aux_since is not None and time.time() - aux_since > args.aux_seconds:
                proc.send_signal(signal.SIGINT)  # once: the run checkpoints and exits
                aux_since = float("inf")
            time.sleep(1)
        os.chdir("..")
    print("".join(line for line in lines if line.startswith(("step", "auxiliary", "stopped"))), end="")
    print(
        f"phase buffer {buffer / 1e9:.2f} GB ({buffer / 2**30:.2f} GiB); peak RSS {peak / 1e9:.2f} GB "
        f"({peak / 2**30:.2f} GiB): {(peak - buffer) / 1e9:.2f} GB ({(peak - buffer) / 2**30:.2f} GiB) above the buffer"
    )


if __name__ == "__main__":
    main()
