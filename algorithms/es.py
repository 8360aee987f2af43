"""OpenAI evolution strategies (Salimans et al. 2017), one envpool batch per population; benchmark: `bash benchmark/es.sh`."""

import argparse
import dataclasses
import difflib
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Literal

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import tyro
from torch import nn
from torch.utils.tensorboard import SummaryWriter

# envpool declares float64 bounds for float32 observations; gymnasium warns about it on every env made
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")


@dataclass
class Args:
    # --- run infrastructure ---
    exp_name: str = "es"
    """name of this experiment, part of the run directory name"""
    env_id: str = "CartPole-v1"
    """envpool id (CartPole-v1, Pendulum-v1, HalfCheetah-v4, ...) or any gymnasium id, including 'module:Env-v0'"""
    preset: Literal["auto", "classic", "mujoco"] = "auto"
    """defaults for a family: classic (256 members, 32-32 tanh MLP, 100 generations), mujoco (Salimans et al. 2017's
    Humanoid configuration: 256-256 tanh MLP, sigma 0.02, L2 0.005, Adam 0.01; 256 members, 500 generations);
    auto picks mujoco for Box actions, classic otherwise"""
    seed: int = 1
    """seed of python, numpy, torch, the noise and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available (under torchrun, GPU LOCAL_RANK)"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final model to runs/<run>/es.model, then reload it from disk and evaluate it"""
    eval_every: int = 10
    """evaluate the unperturbed mean policy every this many generations (0: only after training, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many generations (0: only on Ctrl-C / SIGTERM)"""
    resume: str = ""
    """path of a checkpoint.pt to resume from; the run goes on in the same directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""

    # --- algorithm ---
    num_generations: int = 100
    """generations (one update of the mean parameters each)"""
    population_size: int = 256
    """members per generation over all processes: antithetic pairs, so even (and a multiple of 2 x processes)"""
    sigma: float = 0.02
    """standard deviation of the parameter noise"""
    learning_rate: float = 0.01
    """Adam step size"""
    l2_coef: float = 0.005
    """L2 weight decay coefficient, added to the (sigma-scaled) ES gradient as in Salimans et al.'s code"""
    hidden_sizes: tuple[int, ...] = (32, 32)
    """widths of the policy's tanh hidden layers"""
    norm_obs: bool = True
    """normalise observations with running statistics gathered from the rollouts (clipped to +-5)"""
    max_episode_steps: int = 0
    """horizon: steps per member's episode at most (0: the env's own time limit)"""

    # --- computed at start-up ---
    horizon: tyro.conf.Suppress[int] = 0
    """max_episode_steps or the env's time limit (computed)"""
    world_size: tyro.conf.Suppress[int] = 1
    """processes sharing the population, WORLD_SIZE under torchrun (computed)"""


# A preset only changes defaults: any flag given on the command line wins. The mujoco preset is the Humanoid
# configuration of Salimans et al.'s code (evolution-strategies-starter, configurations/humanoid.json); their
# population was at least 10,000 episodes a generation on 1,440 CPUs, ours is one envpool batch.
PRESETS = {
    "classic": dict(),
    "mujoco": dict(num_generations=500, hidden_sizes=(256, 256)),
}


def fail(message: str):
    """Bad input ends with one line on stderr and exit status 1, never a traceback."""
    raise SystemExit(f"es.py: error: {message}")


# ---------------------------------------------------------------------------------------------------------------
# Envs
# ---------------------------------------------------------------------------------------------------------------
def env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one env, without starting a pool; a clear error for an unknown id."""
    if ":" not in env_id and env_id in envpool.list_all_envs():
        spec = envpool.make_spec(env_id)
        return spec.observation_space, spec.action_space
    try:
        env = gym.make(env_id)
    except gym.error.Error as e:
        known = envpool.list_all_envs() + list(gym.registry.keys())
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "see envpool.list_all_envs() for the ids envpool has"
        fail(f"unknown env id '{env_id}' ({type(e).__name__}); {hint}")
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


def time_limit(env_id: str) -> int:
    """The env's own episode step limit (0: none)."""
    if ":" not in env_id and env_id in envpool.list_all_envs():
        return int(envpool.make_spec(env_id).config.max_episode_steps)
    env = gym.make(env_id)  # gym.make, not gym.spec: it imports the module of a 'module:Env-v0' id
    limit = env.spec.max_episode_steps if env.spec else None
    env.close()
    return int(limit or 0)


def make_env(env_id: str, num_envs: int, seed: int, render: bool = False):
    """A vector env with next-step autoreset: envpool when it has the id, gymnasium otherwise.

    Env i is seeded with seed + i (envpool and gymnasium alike), so a member's env depends only on its index.
    After a step that ends an episode, the next step ignores its action and returns reward 0 and the first
    observation of the next episode; the rollout masks that step and everything after it out.
    """
    render_kwargs = dict(render_mode="rgb_array") if render else {}
    if ":" not in env_id and env_id in envpool.list_all_envs():
        return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **render_kwargs)
    # gymnasium 1.x vector envs autoreset on the next step too, like envpool (AutoresetMode.NEXT_STEP)
    envs = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs=dict(autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP),
        **render_kwargs,
    )
    envs.reset(seed=seed)
    return envs


def can_render(env_id: str) -> bool:
    """envpool's MuJoCo renderer needs OpenGL and, where it has none, ends the whole process: try it in a child."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import es; "
        f"envs = es.make_env({env_id!r}, 1, 0, render=True); envs.reset(); envs.render()"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


# ---------------------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------------------
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    # Huang et al. 2022, detail 2: orthogonal weights, zero biases
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Policy(nn.Module):
    """Deterministic tanh MLP, one member alone: logits (Discrete, acted on by argmax) or pre-tanh actions (Box).

    ES perturbs the flat vector of its parameters (parameters_to_vector order: weight, bias per layer)."""

    def __init__(self, obs_dim: int, n_out: int, hidden_sizes: tuple[int, ...]):
        super().__init__()
        layers, n_in = [], obs_dim
        for width in hidden_sizes:
            layers += [layer_init(nn.Linear(n_in, width)), nn.Tanh()]
            n_in = width
        layers.append(layer_init(nn.Linear(n_in, n_out), std=0.01))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def layer_shapes(self) -> list[tuple[int, int]]:
        return [(m.out_features, m.in_features) for m in self.net if isinstance(m, nn.Linear)]


def stack_layers(thetas: torch.Tensor, layer_shapes: list[tuple[int, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(P, D) flat parameters -> per layer (weights (P, in, out), biases (P, 1, out)), ready for baddbmm.

    Made contiguous once per generation: the rollout reads every member's weights at every step."""
    layers, offset, num = [], 0, thetas.shape[0]
    for n_out, n_in in layer_shapes:
        w = thetas[:, offset : offset + n_out * n_in].reshape(num, n_out, n_in).transpose(1, 2).contiguous()
        offset += n_out * n_in
        b = thetas[:, offset : offset + n_out].reshape(num, 1, n_out).contiguous()
        offset += n_out
        layers.append((w, b))
    return layers


def population_forward(layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
    """Every member's network on its own observation in one batched pass: x (P, obs_dim) -> (P, n_out)."""
    h = x.unsqueeze(1)
    for i, (w, b) in enumerate(layers):
        if w.shape[1] <= 8:  # few inputs (a classic control observation): multiply-and-sum beats the CPU's bmm 2x
            h = (h.transpose(1, 2) * w).sum(1, keepdim=True) + b
        else:
            h = torch.baddbmm(b, h, w)
        if i < len(layers) - 1:
            h = torch.tanh(h)
    return h.squeeze(1)


def to_action(out: torch.Tensor, low: torch.Tensor | None, high: torch.Tensor | None) -> torch.Tensor:
    """Discrete: the argmax. Box: tanh scaled to the bounds."""
    if low is None:
        return out.argmax(-1)
    return low + (torch.tanh(out) + 1.0) * 0.5 * (high - low)


# ---------------------------------------------------------------------------------------------------------------
# Running statistics for observation normalisation
# ---------------------------------------------------------------------------------------------------------------
def update_mean_var_count(mean, var, count, batch_mean, batch_var, batch_count):
    """Merge a batch's moments into running ones (Chan et al. 1979, parallel variance)."""
    delta = batch_mean - mean
    total = count + batch_count
    new_mean = mean + delta * batch_count / total
    m2 = var * count + batch_var * batch_count + delta**2 * count * batch_count / total
    return new_mean, m2 / total, total


class RunningMeanStd:
    """Mean and variance of everything passed to update(), kept on the device in float64."""

    def __init__(self, shape: tuple, device: torch.device):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.tensor(1e-4, dtype=torch.float64, device=device)  # as gymnasium's wrappers

    def update_from_sums(self, total: torch.Tensor, total_sq: torch.Tensor, count: torch.Tensor) -> None:
        """Merge the sums of x and x^2 over count observations (what the processes exchange, not the observations)."""
        if count <= 0:
            return
        batch_mean = total / count
        batch_var = (total_sq / count - batch_mean**2).clamp(min=0.0)
        self.mean, self.var, self.count = update_mean_var_count(self.mean, self.var, self.count, batch_mean, batch_var, count)

    def state_dict(self) -> dict:
        return dict(mean=self.mean.cpu(), var=self.var.cpu(), count=self.count.cpu())

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = (state[k].to(self.mean.device) for k in ("mean", "var", "count"))


def frozen_normalizer(rms: RunningMeanStd | None, obs_dim: int, device: torch.device):
    """(shift, scale) in float32, fixed for a generation: every member of a generation sees the same statistics."""
    if rms is None:
        return torch.zeros(obs_dim, device=device), torch.ones(obs_dim, device=device)
    return rms.mean.float(), torch.sqrt(rms.var + 1e-8).float()


def normalize_obs(obs: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, clip: float = 5.0) -> torch.Tensor:
    # Salimans et al.'s code clips normalised observations to +-5
    return ((obs - shift) / scale).clamp(-clip, clip)


# ---------------------------------------------------------------------------------------------------------------
# The algorithm's maths
# ---------------------------------------------------------------------------------------------------------------
def pair_seed(seed: int, generation: int, pair: int) -> int:
    """The seed of antithetic pair `pair`'s noise in `generation`: a function of those alone, not of the process."""
    return int(np.random.SeedSequence([seed, generation, pair]).generate_state(1, np.uint64)[0] >> 1)


def pair_noise(seed: int, generation: int, pairs: range, dim: int, device: torch.device) -> torch.Tensor:
    """Noise of the given pairs, (len(pairs), dim), regenerated from their seeds (so processes exchange no noise)."""
    noise = torch.empty((len(pairs), dim), device=device)
    gen = torch.Generator(device=device)
    for row, pair in enumerate(pairs):
        gen.manual_seed(pair_seed(seed, generation, pair))
        noise[row] = torch.randn(dim, generator=gen, device=device)
    return noise


def generation_env_seed(seed: int, generation: int) -> int:
    """Env seed of member 0 in `generation`; member m's env gets this + m. Fresh envs every generation: how many
    steps an env takes after its member is done depends on the other members of its batch, and must not change
    the next episode's start (then 1 and N processes, and a resumed run, play the same episodes)."""
    return int(np.random.SeedSequence([seed, generation]).generate_state(1)[0] % 2**30)


def perturb(theta: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """Antithetic population: member 2j is theta + sigma eps_j, member 2j + 1 is theta - sigma eps_j. (2 pairs, D)."""
    signed = torch.stack([noise, -noise], dim=1).reshape(-1, noise.shape[1])
    return theta.unsqueeze(0) + sigma * signed


def centered_ranks(fitness: torch.Tensor) -> torch.Tensor:
    """Fitness shaping of Salimans et al. 2017: ranks 0..P-1 scaled to [-0.5, 0.5].

    Ties share their mean rank (the starter code breaks them by sort order), so an antithetic pair whose two
    members score the same, common on CartPole where many reach the time limit, pushes nowhere."""
    num = fitness.numel()
    order = torch.argsort(fitness, stable=True)
    ranks = torch.empty(num, dtype=torch.float64, device=fitness.device)
    ranks[order] = torch.arange(num, dtype=torch.float64, device=fitness.device)
    _, inverse, counts = torch.unique(fitness, return_inverse=True, return_counts=True)
    mean_rank = torch.zeros(counts.numel(), dtype=torch.float64, device=fitness.device).index_add_(0, inverse, ranks)
    return (mean_rank / counts)[inverse] / (num - 1) - 0.5


def es_gradient(shaped: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """The ES estimate of grad E[F(theta + sigma eps)]: 1 / (P sigma) sum_i F_i eps_i over the antithetic population
    (eps_2j = eps_j, eps_2j+1 = -eps_j), i.e. sum_j (F_2j - F_2j+1) eps_j / (P sigma)."""
    weights = (shaped[0::2] - shaped[1::2]).to(noise.dtype)
    return weights @ noise / (shaped.numel() * sigma)


def rollout(envs, layers, shift, scale, low, high, horizon: int, device: torch.device):
    """Each env plays one episode with its member's parameters, all members in one batch, until every member is done
    or the horizon is reached. With next-step autoreset the step after a member's done is a reset step, and the
    steps after it belong to a new episode: none of them count, in its return, length or observation statistics.

    Returns fitness (float64), lengths, per-member sums of the observations acted on and of their squares, as one
    (members, 2 + 2 obs_dim) float64 array (what the processes exchange), and the env steps taken (done or not).
    """
    obs, _ = envs.reset()
    num = obs.shape[0]
    alive = np.ones(num, dtype=bool)
    fitness, lengths = np.zeros(num), np.zeros(num)
    obs_sum, obs_sq = np.zeros(obs.shape), np.zeros(obs.shape)
    steps = 0
    for _ in range(horizon):
        o = np.asarray(obs, dtype=np.float64) * alive[:, None]
        obs_sum += o
        obs_sq += o * o
        x = normalize_obs(torch.as_tensor(obs, dtype=torch.float32, device=device), shift, scale)
        with torch.no_grad():
            action = to_action(population_forward(layers, x), low, high).cpu().numpy()
        obs, reward, term, trunc, _ = envs.step(action)
        steps += num
        fitness += np.where(alive, reward, 0.0)
        lengths += alive
        alive &= ~(term | trunc)
        if not alive.any():
            break
    return np.concatenate([fitness[:, None], lengths[:, None], obs_sum, obs_sq], axis=1), steps


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints and evaluation
# ---------------------------------------------------------------------------------------------------------------
def save_checkpoint(path: str, state: dict) -> None:
    """Write to a temporary file, then rename: a kill during the write never leaves a broken checkpoint."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, env_id: str | None = None) -> dict:
    if not os.path.isfile(path):
        fail(f"checkpoint '{path}' does not exist; pass the checkpoint.pt or es.model of an earlier run")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        fail(f"checkpoint '{path}' cannot be read ({type(e).__name__}: {e}); it is not an es.py checkpoint")
    if not isinstance(state, dict) or "model" not in state or "args" not in state:
        fail(f"'{path}' is not an es.py checkpoint (it has no model and args)")
    if env_id is not None and state["args"]["env_id"] != env_id:
        fail(f"checkpoint '{path}' is for {state['args']['env_id']}, not {env_id}; pass --env-id {state['args']['env_id']}")
    return state


def evaluate(
    policy: Policy,
    obs_rms: RunningMeanStd | None,
    args: Args,
    device: torch.device,
    video_path: str | None = None,
) -> np.ndarray:
    """Play one full episode (up to the horizon) of the policy on each of args.eval_episodes envs.

    Normalisation statistics are frozen. Returns the episodes' returns. Video: env 0's episode, when it renders.
    """
    envs = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, render=video_path is not None)
    space = envs.single_action_space
    low, high = (None, None)
    if isinstance(space, gym.spaces.Box):
        low, high = (torch.as_tensor(b, dtype=torch.float32, device=device) for b in (space.low, space.high))
    shift, scale = frozen_normalizer(obs_rms, int(np.prod(envs.single_observation_space.shape)), device)
    obs, _ = envs.reset()
    returns, finished = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool)
    frames = []
    for _ in range(args.horizon):
        if video_path is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        with torch.no_grad():
            x = normalize_obs(torch.as_tensor(obs, dtype=torch.float32, device=device), shift, scale)
            action = to_action(policy(x), low, high).cpu().numpy()
        obs, reward, term, trunc, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
        if finished.all():
            break
    envs.close()
    if video_path is not None and frames:
        import imageio  # only needed for --capture-video; imageio-ffmpeg ships its own ffmpeg binary

        os.makedirs(os.path.dirname(video_path), exist_ok=True)
        imageio.mimsave(video_path, frames, fps=30, macro_block_size=1)
    return returns


# ---------------------------------------------------------------------------------------------------------------
# Command line and training loop
# ---------------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> Args:
    """tyro CLI whose defaults are the chosen preset's, so that --help shows the values a run will use."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env-id", "--env_id", dest="env_id", default=Args.env_id)
    pre.add_argument("--preset", default=Args.preset)
    known, _ = pre.parse_known_args(argv)
    preset = known.preset
    if preset == "auto":
        _, action_space = env_spaces(known.env_id)
        preset = "mujoco" if isinstance(action_space, gym.spaces.Box) else "classic"
    defaults = Args(env_id=known.env_id, **PRESETS.get(preset, {}))
    return tyro.cli(Args, default=defaults, args=argv, description=__doc__)


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        fail(f"es.py handles Discrete and Box action spaces; {args.env_id} has {action_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"es.py needs a vector observation; {args.env_id} has {obs_space}")
    if args.population_size < 2 or args.population_size % (2 * args.world_size):
        fail(
            f"--population-size {args.population_size} must be a positive multiple of 2 x {args.world_size} "
            "process(es): antithetic pairs, split evenly over the processes"
        )
    if args.sigma <= 0:
        fail(f"--sigma must be positive, not {args.sigma}")
    if args.num_generations < 1:
        fail("--num-generations must be at least 1")
    if args.eval_episodes < 1:
        fail("--eval-episodes must be at least 1")
    if any(width < 1 for width in args.hidden_sizes):
        fail(f"--hidden-sizes must be positive, not {' '.join(map(str, args.hidden_sizes))}")
    if args.max_episode_steps < 0 or args.horizon < 1:
        fail(f"{args.env_id} has no time limit: pass --max-episode-steps, the horizon of an episode")


def gather_members(local: torch.Tensor, world_size: int) -> torch.Tensor:
    """All processes' member rows, in member order (process r holds the r-th slice). The only data exchanged."""
    if world_size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts)


def main(args: Args) -> None:
    # --- set-up: processes (torchrun sets WORLD_SIZE, RANK, LOCAL_RANK) ---
    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(args.resume, args.env_id)
        computed = ("resume", "horizon", "world_size")
        differ = [k for k, v in ckpt["args"].items() if k not in computed and getattr(args, k) != v]
        if differ:
            print(f"resuming with the checkpoint's arguments, which differ from this command line in: {', '.join(differ)}")
        args = Args(**{**ckpt["args"], "resume": args.resume, "hidden_sizes": tuple(ckpt["args"]["hidden_sizes"])})
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    obs_space, action_space = env_spaces(args.env_id)
    args.horizon = args.max_episode_steps or time_limit(args.env_id)
    check_args(args, obs_space, action_space)
    if rank == 0 and args.capture_video and not can_render(args.env_id):
        print(f"warning: {args.env_id} cannot render on this machine (no OpenGL?); running without --capture-video")
        args.capture_video = False
    use_cuda = torch.cuda.is_available() and args.cuda
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if args.world_size > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    safe_id = args.env_id.replace("/", "-").replace(":", "-")
    run_name = ckpt["run_name"] if ckpt else f"{safe_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)
    if rank == 0:  # only process 0 writes logs, checkpoints and models
        os.makedirs(run_dir, exist_ok=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # the same seed gives every process the same initial parameters; only process 0 saves them
    continuous = isinstance(action_space, gym.spaces.Box)
    obs_dim = obs_space.shape[0]
    n_out = int(np.prod(action_space.shape)) if continuous else int(action_space.n)
    policy = Policy(obs_dim, n_out, args.hidden_sizes)
    theta = nn.utils.parameters_to_vector(policy.parameters()).detach().to(device).requires_grad_(True)
    policy = policy.to(device)
    # Adam's defaults are the starter code's (beta1 0.9, beta2 0.999, epsilon 1e-8)
    optimizer = torch.optim.Adam([theta], lr=args.learning_rate)
    obs_rms = RunningMeanStd((obs_dim,), device) if args.norm_obs else None
    global_step, start_generation = 0, 1
    if ckpt:
        policy.load_state_dict(ckpt["model"])
        with torch.no_grad():
            theta.copy_(nn.utils.parameters_to_vector(policy.parameters()))
        optimizer.load_state_dict(ckpt["optimizer"])
        if obs_rms is not None:
            obs_rms.load_state_dict(ckpt["obs_rms"])
        global_step, start_generation = ckpt["global_step"], ckpt["generation"] + 1
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if rank == 0:
            print(f"resumed {run_dir} at generation {ckpt['generation']} (step {global_step:,})")

    writer = None
    if rank == 0:
        # purge_step: a run resumed after a hard kill drops the events logged after its checkpoint, so no step repeats
        writer = SummaryWriter(run_dir, purge_step=global_step + 1 if ckpt else None)
        if not ckpt:
            table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
            writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    members = args.population_size // args.world_size
    first_member = rank * members
    low, high = (None, None)
    if continuous:
        low, high = (torch.as_tensor(b, dtype=torch.float32, device=device) for b in (action_space.low, action_space.high))
    my_pairs = range(first_member // 2, (first_member + members) // 2)
    all_pairs = range(args.population_size // 2)

    def sync_policy() -> None:
        with torch.no_grad():
            nn.utils.vector_to_parameters(theta.detach(), policy.parameters())

    def checkpoint_state(generation: int) -> dict:
        sync_policy()
        rng = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())
        return dict(
            args=dataclasses.asdict(args),
            run_name=run_name,
            model=policy.state_dict(),
            optimizer=optimizer.state_dict(),
            obs_rms=obs_rms.state_dict() if obs_rms else None,
            global_step=global_step,
            generation=generation,
            rng=rng,
        )

    # Ctrl-C and SIGTERM finish the current generation, write a checkpoint and exit; a second one kills at once
    stop = []

    def request_stop(signum, _frame):
        stop.append(signum)
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    layer_shapes = policy.layer_shapes()
    last_eval = float("nan")
    start_time, start_step, eval_seconds, last_print = time.time(), global_step, 0.0, 0.0

    for generation in range(start_generation, args.num_generations + 1):
        # --- perturbation: this process's slice of the antithetic population ---
        with torch.no_grad():
            noise = pair_noise(args.seed, generation, all_pairs, theta.numel(), device)
            thetas = perturb(theta.detach(), noise[my_pairs.start : my_pairs.stop], args.sigma)
            layers = stack_layers(thetas, layer_shapes)
        shift, scale = frozen_normalizer(obs_rms, obs_dim, device)

        # --- rollout: one episode per member, the whole slice in one batch; env i plays member first_member + i ---
        envs = make_env(args.env_id, members, generation_env_seed(args.seed, generation) + first_member)
        results, _ = rollout(envs, layers, shift, scale, low, high, args.horizon, device)
        envs.close()

        # --- exchange: fitness, length and observation sums per member, nothing else ---
        results = gather_members(torch.as_tensor(results, device=device), args.world_size)
        fitness, lengths = results[:, 0], results[:, 1]

        # --- update: centered ranks, ES gradient, weight decay, Adam ---
        with torch.no_grad():
            shaped = centered_ranks(fitness)
            grad = es_gradient(shaped, noise, args.sigma)
            # the starter code feeds Adam -g + l2coeff * theta with g = sum_i F_i eps_i / P, i.e. sigma * grad
            theta.grad = -(args.sigma * grad) + args.l2_coef * theta.detach()
        optimizer.step()
        if obs_rms is not None:  # the next generation's statistics, from every member's real steps
            obs_rms.update_from_sums(results[:, 2 : 2 + obs_dim].sum(0), results[:, 2 + obs_dim :].sum(0), lengths.sum())
        stats = torch.stack([fitness.mean(), fitness.max(), lengths.mean(), lengths.sum(), grad.norm().double()])
        mean_return, max_return, mean_length, gen_steps, grad_norm = stats.tolist()  # one host sync per generation
        global_step += int(gen_steps)

        # --- logging (process 0) ---
        sps = int((global_step - start_step) / max(time.time() - start_time - eval_seconds, 1e-9))
        if writer is not None:
            writer.add_scalar("charts/episodic_return", mean_return, global_step)
            writer.add_scalar("charts/max_return", max_return, global_step)
            writer.add_scalar("charts/episodic_length", mean_length, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("losses/grad_norm", grad_norm, global_step)

        # --- evaluation of the unperturbed mean policy (process 0), checkpoint, stop requests ---
        if args.eval_every and generation % args.eval_every == 0 and rank == 0:
            t0 = time.time()
            sync_policy()
            video = os.path.join(run_dir, "videos", f"eval_{generation}.mp4") if args.capture_video else None
            eval_returns = evaluate(policy, obs_rms, args, device, video)
            last_eval = float(np.mean(eval_returns))
            writer.add_scalar("eval/episodic_return", last_eval, global_step)
            eval_seconds += time.time() - t0
        if rank == 0 and (time.time() - last_print > args.progress_interval or generation == args.num_generations):
            last_print = time.time()
            done_gens = generation - start_generation + 1
            eta = (time.time() - start_time) / done_gens * (args.num_generations - generation)
            print(
                f"generation {generation}/{args.num_generations} ({100 * generation / args.num_generations:.0f}%)"
                f" | step {global_step:,} | SPS {sps:,} | return mean {mean_return:.1f} max {max_return:.1f}"
                f" | eval {last_eval:.1f} | ETA {int(eta // 60)}m{int(eta % 60):02d}s",
                flush=True,
            )
        if args.world_size > 1:  # every process stops after the same generation, or the exchanges would hang
            flag = torch.tensor([len(stop)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and not stop:
                stop.append(signal.SIGTERM)
        checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
        periodic = args.checkpoint_every and generation % args.checkpoint_every == 0
        if rank == 0 and (periodic or stop):
            save_checkpoint(checkpoint_path, checkpoint_state(generation))
        if stop:
            if writer is not None:
                writer.close()
                launcher = f"torchrun --nproc_per_node {args.world_size}" if args.world_size > 1 else "python"
                resume = f"{launcher} {sys.argv[0]} --env-id {args.env_id} --resume {checkpoint_path}"
                print(f"stopped at generation {generation} (step {global_step:,}); resume with: {resume}", flush=True)
            if args.world_size > 1:
                dist.barrier()
                dist.destroy_process_group()
            sys.exit(128 + stop[0])

    if args.world_size > 1:
        dist.destroy_process_group()
    if rank != 0:
        return
    writer.flush()

    # --- final model: saved, reloaded from disk, evaluated with frozen statistics ---
    if args.save_model:
        sync_policy()
        model_path = os.path.join(run_dir, "es.model")
        save_checkpoint(
            model_path,
            dict(
                args=dataclasses.asdict(args),
                run_name=run_name,
                model=policy.state_dict(),
                obs_rms=obs_rms.state_dict() if obs_rms else None,
            ),
        )
        state = load_checkpoint(model_path, args.env_id)
        eval_policy = Policy(obs_dim, n_out, tuple(state["args"]["hidden_sizes"])).to(device)
        eval_policy.load_state_dict(state["model"])
        eval_rms = None
        if state["obs_rms"] is not None:
            eval_rms = RunningMeanStd((obs_dim,), device)
            eval_rms.load_state_dict(state["obs_rms"])
        video = os.path.join(run_dir, "videos", "final.mp4") if args.capture_video else None
        eval_returns = evaluate(eval_policy, eval_rms, args, device, video)
        for r in eval_returns:  # all at the final step, one point per episode
            writer.add_scalar("eval/episodic_return", r, global_step)
        mean, std = np.mean(eval_returns), np.std(eval_returns)
        print(f"evaluation of {model_path}: mean return {mean:.1f} +- {std:.1f} over {len(eval_returns)} episodes")
        print(f"model: {model_path}")
    writer.close()
    print(f"tensorboard logs: {run_dir}   (view with: tensorboard --logdir runs)")


if __name__ == "__main__":
    main(parse_args())
