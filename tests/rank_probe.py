"""Run an algorithm script as torchrun runs it, then save what this process holds at the end: the weights of the
network it trained and its normalisation statistics, to $PROBE_DIR/rank<RANK>.pt. The tests compare the files that the
processes of one run leave, which the script itself never writes (only process 0 saves anything).

    PROBE_DIR=/tmp/p torchrun --standalone --nproc_per_node 2 tests/rank_probe.py ppo --env-id CartPole-v1 ...
"""

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmark"))
from algos import load_algorithm  # noqa: E402

name, argv = sys.argv[1], sys.argv[2:]
module = load_algorithm(name)
trained, statistics = [], []

# the network is the one handed to training_steps (storage() builds a throwaway one first, evaluation another); the
# statistics are every RunningMeanStd the run makes (run without --save-model, whose evaluation makes one more)
make_steps, make_statistics = module.training_steps, module.RunningMeanStd.__init__


def recording_training_steps(*networks_and_rest):
    trained.extend(n for n in networks_and_rest if isinstance(n, torch.nn.Module))  # rnd_ppo.py: agent and RND model
    return make_steps(*networks_and_rest)


def recording_statistics(self, *args, **kwargs):
    make_statistics(self, *args, **kwargs)
    statistics.append(self)


def stop_here(code: int):
    raise SystemExit(code)  # where the script leaves with os._exit: back here instead, to save what it holds


leave = os._exit
module.training_steps, module.RunningMeanStd.__init__ = recording_training_steps, recording_statistics
os._exit = stop_here
sys.argv = [str(ROOT / "algorithms" / f"{name}.py"), *argv]  # the resume line names the script
code = 0
try:
    module.main(module.parse_args(argv))
except SystemExit as end:
    code = end.code
out = Path(os.environ["PROBE_DIR"]) / f"rank{os.environ['RANK']}.pt"
models = {f"{i}.{k}": v for i, network in enumerate(trained) for k, v in network.state_dict().items()}
torch.save(dict(model=models, statistics=[rms.state_dict() for rms in statistics]), out)
leave(code)
