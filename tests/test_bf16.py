"""--bf16 in the six neural-network files (docs/speed.md): bfloat16 autocast over the networks' layers, float32 for
everything else (weights, gradients, the optimiser, the heads' outputs, losses, statistics). Each network with --bf16
against the same network in float32, from the same weights on the same input: the outputs and the gradient within a
stated tolerance, and not equal (autocast is on); a short run with --bf16 that saves a checkpoint and a model, keeps
--bf16 in both with every weight and optimiser moment in float32, and resumes with it, training the same layers in
bfloat16 again; the start line's word on a device without native bfloat16. The short runs, in this process, also
check that each optimiser step of the six files starts from cleared gradients (es.py sets its gradient, never adds)."""

from pathlib import Path
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import (
    CPU,
    SMOKE_FLAGS,
    FirstGradients,
    assert_one_error_line,
    check_run,
    load_algorithm,
    load_file,
    only_run,
    run_bad_input,
    run_in_process,
    values,
)

FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # an Atari stack
PROCGEN = gym.spaces.Box(0, 255, (3, 64, 64), np.uint8)
HALF_CHEETAH = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
HALF_CHEETAH_ACTIONS = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def actor_critic(m, bf16: bool):
    agent = m.Agent(FRAMES, gym.spaces.Discrete(6), bf16=bf16)
    heads = lambda h: torch.cat([agent.actor(h), agent.critic(h)], 1)  # noqa: E731
    return agent, lambda x: heads(agent.hidden(x)[0])


def q_network(m, bf16: bool):
    network = m.QNetwork(FRAMES, gym.spaces.Discrete(6), bf16)
    return network, network


def ppg_agent(m, bf16: bool):
    agent = m.Agent(PROCGEN, gym.spaces.Discrete(15), "dual", bf16)
    return agent, lambda x: (lambda logits, aux, value: torch.cat([logits, aux[:, None], value[:, None]], 1))(*agent(x))


def rnd_networks(m, bf16: bool):
    """The agent's logits and values, then RND's error on the newest frame (whitened as rnd_ppo.py feeds it)."""
    agent, rnd = m.Agent(FRAMES, gym.spaces.Discrete(18), bf16=bf16), m.RNDModel(bf16)
    both = torch.nn.ModuleList([agent, rnd])
    heads = lambda logits, ext, intr, _: torch.cat([logits, ext[:, None], intr[:, None]], 1)  # noqa: E731
    whitened = lambda x: ((x[:, -1:].float() - 128.0) / 64.0).clamp(-5, 5)  # noqa: E731
    return both, lambda x: torch.cat([heads(*agent(x)), rnd.error(whitened(x))[:, None]], 1)


def td3_networks(m, bf16: bool):
    """The actor's actions, and the two critics' Q-values of them."""
    actor, critics = m.Actor(17, HALF_CHEETAH_ACTIONS, 256, bf16), m.Critics(17, 6, 256, 2, bf16)
    both = torch.nn.ModuleList([actor, critics])
    return both, lambda x: (lambda a: torch.cat([a, critics(x, a).reshape(2, -1).T], 1))(actor(x))


# each file's networks with or without --bf16, and a function from a batch of observations to their float outputs
NETWORKS = {
    "ppo": (FRAMES, actor_critic),
    "a2c": (FRAMES, actor_critic),
    "dqn": (FRAMES, q_network),
    "ppg_procgen": (PROCGEN, ppg_agent),
    "rnd_ppo": (FRAMES, rnd_networks),
    "ddpg_td3": (HALF_CHEETAH, td3_networks),
}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_bf16_outputs_and_gradients_are_float32_and_near_float32s(name):
    """Measured on three seeds of weights and a batch of 64 random frames per file: the largest difference of an output
    was 0.14-1.2% of the largest output (8 bits of mantissa through the trunk), the cosine similarity of the gradients
    0.99906-0.99999. Bounds: 4% and 0.995."""
    m = load_algorithm(name)
    obs_space, build = NETWORKS[name]
    torch.manual_seed(0)
    (full, full_forward), (half, half_forward) = build(m, False), build(m, True)
    half.load_state_dict(full.state_dict())
    if obs_space.dtype == np.uint8:
        x = torch.randint(0, 256, (64, *obs_space.shape), dtype=torch.uint8)
    else:
        x = torch.randn(64, *obs_space.shape)
    reference, out = full_forward(x), half_forward(x)
    assert out.dtype == torch.float32 and all(p.dtype == torch.float32 for p in half.parameters())
    difference = (out - reference).abs().max().item()
    assert 0 < difference <= 0.04 * reference.abs().max().item(), difference
    trained = [[p for p in net.parameters() if p.requires_grad] for net in (full, half)]  # not RND's fixed target
    grads = [torch.autograd.grad(y.pow(2).mean(), params) for y, params in zip((reference, out), trained, strict=True)]
    assert all(g.dtype == torch.float32 for g in grads[1])
    flat = [torch.cat([g.flatten() for g in gs]).double() for gs in grads]
    assert torch.nn.functional.cosine_similarity(*flat, dim=0).item() > 0.995


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_the_start_line_says_when_bfloat16_is_not_native(name):
    m = load_algorithm(name)
    cpu = torch.device("cpu")
    with mock.patch("builtins.open", mock.mock_open(read_data="flags\t\t: fpu sse avx2 avx512f avx512bw\n")):
        assert "no native bfloat16" in m.bf16_note(cpu)
    with mock.patch("builtins.open", mock.mock_open(read_data="flags\t\t: fpu avx512f avx512_bf16 amx_tile\n")):
        assert m.bf16_note(cpu) == ""
    with mock.patch("torch.cuda.get_device_capability", return_value=(7, 5)):
        assert "no native bfloat16" in m.bf16_note(torch.device("cuda"))
    with mock.patch("torch.cuda.get_device_capability", return_value=(8, 0)):
        assert m.bf16_note(torch.device("cuda")) == ""


# a short --bf16 run of each file on its own kind of env: (flags, the env id first; a checkpoint step; the first run's
# total; the resumed run's total)
RUNS = {
    "ppo": (["--env-id", "Breakout-v5", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"], 128, 256, 384),
    "a2c": (["--env-id", "Breakout-v5", "--num-envs", "4"], 100, 200, 300),
    "dqn": (["--env-id", "Breakout-v5", *SMOKE_FLAGS["dqn"], "--batch-size", "32"], 600, 700, 1200),
    "ppg_procgen": (["--env-id", "StarpilotEasy-v0", *SMOKE_FLAGS["ppg_procgen"]], 256, 384, 512),  # a phase at 256
    "rnd_ppo": (["--env-id", "MontezumaRevenge-v5", *SMOKE_FLAGS["rnd_ppo"]], 128, 256, 384),
    "ddpg_td3": (["--env-id", "Pendulum-v1", *SMOKE_FLAGS["ddpg_td3"]], 400, 500, 800),
}  # fmt: skip
# (the off-policy resumes refill the replay buffer for --learning-starts steps before they train again)


def tensors(state, entry: str = ""):
    """Every tensor in a checkpoint's (nested) state, with its dotted place: optimizer.state.0.exp_avg."""
    if isinstance(state, dict | list | tuple):
        for key, value in state.items() if isinstance(state, dict) else enumerate(state):
            yield from tensors(value, f"{entry}.{key}" if entry else str(key))
    elif torch.is_tensor(state):
        yield entry, state


class BFloat16Layers(TorchDispatchMode):
    """Watches every operation run in its block, and keeps the weights' shapes of the convolutions and matrix products
    that gave bfloat16 with gradients on: the layers of the losses training differentiates that --bf16's autocast runs
    in bfloat16 (on the CPU too). An evaluation (no gradients) builds a network of its own, and is not counted."""

    LAYERS = ("convolution", "mm", "addmm", "bmm", "baddbmm", "linear")

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in self.LAYERS and torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16:
            weight = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2][-1]  # input first, weight last
            self.seen.add((name, tuple(weight.shape)))
        return out


def run_watched(name: str, argv: list[str], cwd, optimisers: int = 0):
    """algorithms/<name>.py run in this process as its __main__ runs it, under BFloat16Layers: the layers it trained in
    bfloat16. With optimisers, its steps are watched too: each starts from cleared gradients (conftest.FirstGradients,
    on this run rather than one of its own)."""
    with BFloat16Layers() as layers, FirstGradients() as gradients:
        proc = run_in_process(name, lambda module: module.run_main(module.main, module.parse_args(argv)), cwd)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-3000:]
    if optimisers:
        gradients.check(name, optimisers)
    return layers.seen


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_bf16_run_saves_it_in_its_checkpoint_and_model_and_a_resume_keeps_it(name, tmp_path):
    flags, every, first, total = RUNS[name]
    common = [*flags, CPU, "--eval-episodes", "1", "--checkpoint-every", str(every), "--save-model"]
    optimisers = 2 if name in ("ddpg_td3", "ppg_procgen") else 1  # actor and critics; policy and auxiliary phases
    trained = run_watched(name, [*common, "--bf16", "--total-timesteps", str(first)], tmp_path, optimisers)
    assert trained, f"{name}.py --bf16 trained no layer in bfloat16"
    run = only_run(tmp_path)
    check_run(name, run)
    ckpt = run / "checkpoint.pt"
    (run / "finished").unlink()  # the run went past its checkpoint: without this, a resume of it is refused
    model = next(run.glob("*.model"))  # <script>.model; ddpg_td3.py's is named after its --algo
    assert load_file(ckpt)["args"]["bf16"] and load_file(model)["args"]["bf16"]
    # autocast, not a cast: what the run saved (weights, the optimiser's moments, statistics) is float32
    for path in (ckpt, model):
        halves = [entry for entry, x in tensors(load_file(path)) if x.dtype in (torch.bfloat16, torch.float16)]
        assert not halves, f"{path.name}: {halves[:4]} in half precision"
    moments = [x.dtype for entry, x in tensors(load_file(ckpt)) if entry.endswith(("exp_avg", "square_avg"))]
    assert moments and set(moments) == {torch.float32}, moments
    assert len(values(run, "eval/episodic_return")) == 1  # the saved model, reloaded and evaluated
    # turning it off on resume is refused: the run keeps the precision it learned with
    proc = run_bad_input(name, [*flags[:2], "--resume", str(ckpt), "--no-bf16"], tmp_path, "")
    assert_one_error_line(name, proc, r"--bf16 False differs from the checkpoint's True")
    # a checkpoint from before --bf16 existed ran in float32: --bf16 beside it is refused, not dropped
    state = load_file(ckpt)
    del state["args"]["bf16"]
    torch.save(state, tmp_path / "older.pt")
    proc = run_bad_input(name, [*flags[:2], "--resume", str(tmp_path / "older.pt"), "--bf16"], tmp_path, "")
    assert_one_error_line(name, proc, r"--bf16 True differs from the checkpoint's False")
    model.unlink()
    # the resumed run trains the same layers in bfloat16 again, as the checkpoint's args say
    resumed = run_watched(name, [*flags[:2], "--resume", str(ckpt), "--total-timesteps", str(total)], tmp_path)
    assert trained <= resumed, f"{name}.py dropped --bf16 on resume: {sorted(trained - resumed)[:3]} trained in float32"
    assert load_file(model)["args"]["bf16"] and load_file(ckpt)["global_step"] >= every
    assert Path(run).samefile(only_run(tmp_path))
