"""OpenAI evolution strategies (Salimans et al. 2017), a population as one envpool batch; `bash benchmark/es.sh`.

Reading guide: the algorithm comes first, down to the line that begins `# The algorithm ends here`: Args, the
policy and its batched population form, the maths (observation statistics, antithetic perturbation, centered
ranks, the ES gradient), one generation's rollout, and `main`, the loop of generations. Below that line: this
file's machinery (presets, envs, torchrun, evaluation, checks, the start and end of a run), then the run
plumbing all eight files share.
"""

import os
from dataclasses import dataclass
from typing import Literal

if "OMP_NUM_THREADS" not in os.environ:  # before torch loads: idle threads sleep, not spin (docs/speed.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import gymnasium as gym
import numpy as np
import torch
import tyro
from torch import nn


@dataclass
class Args:
    # --- algorithm ---
    num_generations: int = 100
    """generations (one update of the mean parameters each); raised on --resume, it extends a finished run"""
    population_size: int = 256
    """members per generation over all processes: antithetic pairs, so even (a multiple of 2 x processes)"""
    sigma: float = 0.02
    """standard deviation of the parameter noise"""
    learning_rate: float = 0.01
    """Adam step size"""
    l2_coef: float = 0.005
    """L2 weight decay coefficient, added to the (sigma-scaled) ES gradient as in Salimans et al.'s code"""
    hidden_sizes: tuple[int, ...] = (32, 32)
    """widths of the policy's tanh hidden layers, each in [1, 16384] (none: a linear policy)"""
    norm_obs: bool = True
    """normalise observations with running statistics gathered from the rollouts (clipped to +-5)"""
    max_episode_steps: int = 0
    """horizon: steps per member's episode at most (0: the env's own time limit)"""

    # --- run settings ---
    exp_name: str = "es"
    """name of this experiment, part of the run directory name"""
    env_id: str = "CartPole-v1"
    """envpool id (CartPole-v1, Pendulum-v1, HalfCheetah-v4, ...) or any gymnasium id, 'module:Env-v0' too"""
    preset: Literal["auto", "classic", "control", "mujoco"] = "auto"
    """defaults: classic (32-32, 100 generations), control (Box classic control), mujoco (256-256, 500)"""
    seed: int = 1
    """seed of python, numpy, torch, the noise and the envs; on CPU the same seed gives the same run"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available (under torchrun, GPU LOCAL_RANK)"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final model to runs/<run>/es.model, then reload it from disk and evaluate it"""
    eval_every: int = 10
    """evaluate the unperturbed mean policy every this many generations (0: at the end, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many generations (0: only on Ctrl-C / SIGTERM)"""
    resume: str = ""
    """a checkpoint.pt to resume from; the run goes on in its directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""

    # --- computed at start-up ---
    horizon: tyro.conf.Suppress[int] = 0
    """max_episode_steps or the env's time limit (computed)"""
    world_size: tyro.conf.Suppress[int] = 1
    """processes sharing the population, WORLD_SIZE under torchrun (computed)"""


# --- the policy, one member alone and the whole population in one batched pass ---
# Huang et al. 2022, detail 2: orthogonal weights, zero biases
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Policy(nn.Module):
    """Deterministic tanh MLP, one member alone: logits (Discrete, argmax acts) or pre-tanh actions (Box).
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


def stack_layers(thetas: torch.Tensor, layer_shapes: list[tuple[int, int]]) -> list[tuple]:
    """(P, D) parameters -> per layer: weights (P, in, out) and biases (P, 1, out), contiguous for baddbmm."""
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
        if w.shape[1] <= 8:  # few inputs (classic control): multiply-and-sum beats the CPU's bmm 2x
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


def tanh_bounds(space: gym.Space, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Box: the float32 action bounds that to_action scales tanh to, on the device; Discrete: (None, None)."""
    if not isinstance(space, gym.spaces.Box):
        return None, None
    return tuple(torch.as_tensor(b, dtype=torch.float32, device=device) for b in (space.low, space.high))


# --- the maths: observation statistics, noise, antithetic perturbation, centered ranks, the ES gradient ---
def update_mean_var_count(mean, var, count, batch_mean, batch_var, batch_count):
    """Merge a batch's moments into running ones (Chan et al. 1979, parallel variance)."""
    delta = batch_mean - mean
    total = count + batch_count
    new_mean = mean + delta * batch_count / total
    m2 = var * count + batch_var * batch_count + delta**2 * count * batch_count / total
    return new_mean, m2 / total, total


class ObsStatistics:
    """Running mean and variance of the observations acted on, in float64 on the device; every process keeps
    the same, merged from the sums of every member's observations after each generation (update_from_sums)."""

    def __init__(self, shape: tuple, device: torch.device):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.tensor(1e-4, dtype=torch.float64, device=device)  # as gymnasium's wrappers

    def state_dict(self) -> dict:
        return dict(mean=self.mean.cpu(), var=self.var.cpu(), count=self.count.cpu())

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = (state[k].to(self.mean.device) for k in ("mean", "var", "count"))


def update_from_sums(rms: ObsStatistics, total: torch.Tensor, total_sq: torch.Tensor, count: torch.Tensor):
    """Merge count observations, given by their sums of x and x^2 (what the processes exchange), into rms."""
    if count <= 0:
        return
    batch_mean = total / count
    batch_var = (total_sq / count - batch_mean**2).clamp(min=0.0)
    merged = update_mean_var_count(rms.mean, rms.var, rms.count, batch_mean, batch_var, count)
    rms.mean, rms.var, rms.count = merged


def frozen_normalizer(rms: ObsStatistics | None, obs_dim: int, device: torch.device):
    """(shift, scale) in float32, fixed for a generation: all its members see the same statistics."""
    if rms is None:
        return torch.zeros(obs_dim, device=device), torch.ones(obs_dim, device=device)
    return rms.mean.float(), torch.sqrt(rms.var + 1e-8).float()


def normalize_frozen(obs: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, clip: float = 5.0):
    # Salimans et al.'s code clips normalised observations to +-5
    return ((obs - shift) / scale).clamp(-clip, clip)


def pair_seed(seed: int, generation: int, pair: int) -> int:
    """The seed of pair `pair`'s noise in `generation`: a function of those alone, not of the process."""
    return int(np.random.SeedSequence([seed, generation, pair]).generate_state(1, np.uint64)[0] >> 1)


def pair_noise(seed: int, generation: int, pairs: range, dim: int, device: torch.device) -> torch.Tensor:
    """Noise of the given pairs, (len(pairs), dim), regenerated from their seeds (processes exchange none)."""
    noise = torch.empty((len(pairs), dim), device=device)
    gen = torch.Generator(device=device)
    for row, pair in enumerate(pairs):
        gen.manual_seed(pair_seed(seed, generation, pair))
        noise[row] = torch.randn(dim, generator=gen, device=device)
    return noise


def perturb(theta: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """Antithetic population (2 pairs, D): member 2j is theta + sigma eps_j, 2j + 1 is theta - sigma eps_j."""
    signed = torch.stack([noise, -noise], dim=1).reshape(-1, noise.shape[1])
    return theta.unsqueeze(0) + sigma * signed


def centered_ranks(fitness: torch.Tensor) -> torch.Tensor:
    """Fitness shaping of Salimans et al. 2017: ranks 0..P-1 scaled to [-0.5, 0.5]. Ties share their mean rank
    (the starter code breaks them by sort order), so a pair whose members tie pushes nowhere."""
    num = fitness.numel()
    order = torch.argsort(fitness, stable=True)
    ranks = torch.empty(num, dtype=torch.float64, device=fitness.device)
    ranks[order] = torch.arange(num, dtype=torch.float64, device=fitness.device)
    _, inverse, counts = torch.unique(fitness, return_inverse=True, return_counts=True)
    rank_sums = torch.zeros(counts.numel(), dtype=torch.float64, device=fitness.device)
    rank_sums.index_add_(0, inverse, ranks)
    return (rank_sums / counts)[inverse] / (num - 1) - 0.5


def es_gradient(shaped: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """The ES estimate of grad E[F(theta + sigma eps)]: 1 / (P sigma) sum_i F_i eps_i over the antithetic
    population (eps_2j = eps_j, eps_2j+1 = -eps_j), i.e. sum_j (F_2j - F_2j+1) eps_j / (P sigma)."""
    weights = (shaped[0::2] - shaped[1::2]).to(noise.dtype)
    return weights @ noise / (shaped.numel() * sigma)


# --- one generation's episodes ---
def generation_env_seed(seed: int, generation: int) -> int:
    """Member 0's env seed in a generation (member m's is this + m): new envs each time (docs/es.md, detail 5)."""
    return int(np.random.SeedSequence([seed, generation]).generate_state(1)[0] % 2**30)


@dataclass
class Episodes:
    """A generation's episodes by name: views of one float64 row per member (return, length, the sums of the
    observations acted on and of their squares), the rows that rollout fills and the processes exchange."""

    returns: np.ndarray | torch.Tensor
    lengths: np.ndarray | torch.Tensor
    obs_sum: np.ndarray | torch.Tensor
    obs_sq: np.ndarray | torch.Tensor

    @staticmethod
    def of(rows: np.ndarray | torch.Tensor, obs_dim: int) -> "Episodes":
        obs_sum = rows[:, 2 : 2 + obs_dim]
        obs_sq = rows[:, 2 + obs_dim :]
        return Episodes(returns=rows[:, 0], lengths=rows[:, 1], obs_sum=obs_sum, obs_sq=obs_sq)


def rollout(envs, layers, shift, scale, low, high, horizon: int, device: torch.device, global_step: int = 0):
    """Each env plays one episode with its member's parameters, all in one batch until the longest ends; the
    steps after a member's done (a reset step, a new episode) do not count. Returns the rows of Episodes."""
    obs, _ = envs.reset()
    num, obs_dim = obs.shape
    rows = np.zeros((num, 2 + 2 * obs_dim))
    episodes = Episodes.of(rows, obs_dim)  # views: what is added to them lands in rows
    alive = np.ones(num, dtype=bool)
    for t in range(horizon):
        o = np.asarray(obs, dtype=np.float64) * alive[:, None]
        episodes.obs_sum += o
        episodes.obs_sq += o * o
        x = normalize_frozen(torch.as_tensor(obs, dtype=torch.float32, device=device), shift, scale)
        with torch.no_grad():
            action = to_action(population_forward(layers, x), low, high).cpu().numpy()
        # a NaN or inf from the env ends the run in one line
        obs, reward, term, trunc, _ = finite_step(envs.step(action), global_step + (t + 1) * num)
        episodes.returns += np.where(alive, reward, 0.0)
        episodes.lengths += alive
        alive &= ~(term | trunc)
        if not alive.any():
            break
    return rows


def main(args: Args) -> None:
    # --- set-up: checks, processes, device, storage, checkpoint, run directory, writer (below the marker) ---
    run = start_run(args)  # under torchrun, one process per share of the population; only process 0 writes
    device = run.device
    continuous = isinstance(run.action_space, gym.spaces.Box)
    obs_dim = run.obs_space.shape[0]
    n_out = int(np.prod(run.action_space.shape)) if continuous else int(run.action_space.n)

    # the same seed gives every process the same initial parameters, theta, which ES perturbs as one vector
    policy = Policy(obs_dim, n_out, args.hidden_sizes)
    theta = nn.utils.parameters_to_vector(policy.parameters()).detach().to(device).requires_grad_(True)
    policy = policy.to(device)
    # Adam's defaults are the starter code's (beta1 0.9, beta2 0.999, epsilon 1e-8)
    optimizer = torch.optim.Adam([theta], lr=args.learning_rate)
    obs_rms = ObsStatistics((obs_dim,), device) if args.norm_obs else None
    global_step, start_generation = restore_run(run, theta, optimizer, obs_rms)  # 0, 1 unless resumed

    # this process's slice of the population: members first_member .. first_member + members - 1
    members = args.population_size // args.world_size
    first_member = run.rank * members
    my_pairs = range(first_member // 2, (first_member + members) // 2)
    all_pairs = range(args.population_size // 2)
    low, high = tanh_bounds(run.action_space, device)  # (None, None) for Discrete actions: the argmax acts
    layer_shapes = policy.layer_shapes()

    for generation in range(start_generation, args.num_generations + 1):
        # --- perturb: this process's slice of the antithetic population, the noise regenerated from seeds ---
        with torch.no_grad():
            noise = pair_noise(args.seed, generation, all_pairs, theta.numel(), device)
            thetas = perturb(theta.detach(), noise[my_pairs.start : my_pairs.stop], args.sigma)
            layers = stack_layers(thetas, layer_shapes)
        shift, scale = frozen_normalizer(obs_rms, obs_dim, device)

        # --- play: one episode per member, the slice in one batch (env i plays member first_member + i) ---
        envs = make_env(args.env_id, members, generation_env_seed(args.seed, generation) + first_member)
        rows = rollout(envs, layers, shift, scale, low, high, args.horizon, device, global_step)
        envs.close()
        # torchrun: the processes exchange one row per member (return, length, observation sums), nothing else
        rows = gather(torch.as_tensor(rows, device=device), args.world_size)
        episodes = Episodes.of(rows, obs_dim)

        # --- ranks and gradient, then the update: weight decay and Adam ---
        with torch.no_grad():
            grad = es_gradient(centered_ranks(episodes.returns), noise, args.sigma)
            # the starter code feeds Adam -g + l2coeff * theta with g = sum_i F_i eps_i / P, i.e. sigma * grad
            theta.grad = -(args.sigma * grad) + args.l2_coef * theta.detach()
        optimizer.step()
        if obs_rms is not None:  # the next generation's statistics, from every member's real steps
            update_from_sums(obs_rms, episodes.obs_sum.sum(0), episodes.obs_sq.sum(0), episodes.lengths.sum())
        # on the host, once a generation: the episodes to log, the gradient and parameters to check for NaN
        ep_returns = episodes.returns.cpu().numpy()
        ep_lengths = episodes.lengths.cpu().numpy()
        grad_norm = grad.norm().item()
        global_step += int(ep_lengths.sum())
        check_training({"grad norm": grad_norm, "parameter sum": theta.detach().sum().item()}, global_step)

        # --- logging (process 0): every member's episode, then the generation's aggregates ---
        if run.rank == 0:
            run.log_episodes(ep_returns, ep_lengths, global_step)
            run.writer.add_scalar("charts/population_mean_return", ep_returns.mean(), global_step)
            run.writer.add_scalar("charts/max_return", ep_returns.max(), global_step)
            run.writer.add_scalar("losses/grad_norm", grad_norm, global_step)
            extra = f" | population mean {ep_returns.mean():.1f} max {ep_returns.max():.1f} | step {global_step:,}"
            run.log(global_step, generation, extra, force=generation == args.num_generations)

        # --- evaluation of the mean policy, checkpoint (process 0), stop requests (every process at once) ---
        end_iteration(run, args, generation, global_step, policy, theta, optimizer, obs_rms)

    # --- end: the final model saved, reloaded from disk and evaluated with frozen statistics (process 0) ---
    end_run(args, run, policy, obs_rms, global_step)


# The algorithm ends here; a learner may stop. Below: this file's machinery (envs, torchrun, checks), then the shared plumbing.
import traceback

import torch.distributed as dist

CHECKPOINT_FORMAT = 1  # the layout of checkpoints and models: raise it when a field changes meaning (a resume refuses another)
RANGES = dict(seed="[0, 1e9]", eval_every="[0, inf)", eval_episodes="[1, inf)", checkpoint_every="[0, inf)",
              progress_interval="[0, inf)", num_generations="[1, inf)", population_size="[2, 1e6]", sigma="(0, inf)",
              learning_rate="(0, inf)", l2_coef="[0, inf)", max_episode_steps="[0, inf)")  # fmt: skip
# Presets (a flag given wins). classic, Args' own: evolution-strategies-starter's configurations/humanoid.json noise, step
# and decay with a 32-32 policy; mujoco: that file whole; control: benchmark/results/es_pendulum_tuning's on Pendulum-v1.
PRESETS = dict(classic=dict(),
               control=dict(num_generations=300, sigma=0.2, learning_rate=0.25, l2_coef=0.00014, norm_obs=False),
               mujoco=dict(num_generations=500, hidden_sizes=(256, 256)))  # fmt: skip


def preset_defaults(argv: list[str]) -> Args:
    """The chosen preset's defaults; auto: classic for Discrete actions, control for classic control's Box, else mujoco."""
    env_id, preset = flag_value(argv, "env_id", Args.env_id), flag_value(argv, "preset", Args.preset)
    if preset == "auto":
        box = isinstance(env_spaces(env_id)[1], gym.spaces.Box)
        preset = ("control" if env_id in ("Pendulum-v1", "MountainCarContinuous-v0") else "mujoco") if box else "classic"
    return Args(env_id=env_id, **PRESETS.get(preset, {}))


def env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one env, without starting a pool; one line for an id that cannot be made."""
    try:
        if envpool_has(env_id):
            spec = envpool.make_spec(env_id)
            return spec.observation_space, spec.action_space
        with gym.make(env_id) as env:
            return env.observation_space, env.action_space
    except Exception as e:  # an unknown id, a module that does not import, a library short of a system one (Procgen: Qt 5)
        fail(f"env '{env_id}' cannot be made ({type(e).__name__}: {' '.join(str(e).split())}); check the id and its module")


def make_env(env_id: str, num_envs: int, seed: int, render: bool = False):
    """A vector env that autoresets on the next step (rollout masks it out); env i seeded seed + i, as its member's index."""
    render_kwargs = dict(render_mode="rgb_array") if render else {}
    if envpool_has(env_id):
        return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **render_kwargs)
    next_step = dict(autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", vector_kwargs=next_step, **render_kwargs)
    envs.reset(seed=seed)
    return envs


def can_render(env_id: str, backend: str = "auto") -> bool:
    """--capture-video's rule, checked first: envpool's MuJoCo ends the process without OpenGL; gymnasium's needs pygame."""
    if backend == "gymnasium" or not envpool_has(env_id):
        return importlib.util.find_spec("pygame") is not None
    mujoco = envpool.registration.registry.specs[env_id][0].startswith("envpool.mujoco")
    return not mujoco or bool(os.environ.get("DISPLAY")) or os.environ.get("MUJOCO_GL") in ("egl", "osmesa")


# --- several processes (torchrun): what one process alone does not need ---
def gather(local, world_size: int):
    """Every process's `local` in process order: a tensor's rows concatenated, any other (picklable) value in a list."""
    if not isinstance(local, torch.Tensor):
        everyone = [local] * world_size
        if world_size > 1:
            dist.all_gather_object(everyone, local)
        return everyone
    if world_size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts)


def start_processes(args: Args, small: bool = False) -> tuple[int, torch.device, str | None]:
    """Seeds (the same everywhere: the same initial weights), device, torchrun's group; returns (rank, device, note)."""
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    processes, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
    device, note = seed_and_device(args, small), None
    if device.type == "cuda" and processes > gpus:  # NCCL refuses two processes on one GPU: all on the CPU with gloo
        device = torch.device("cpu")
        note = f"{processes} processes on a node with {gpus} GPU(s) run on the CPU; pass --nproc_per_node {gpus} to torchrun"
    elif device.type == "cuda":
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    if args.world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        sys.excepthook = lost_process_line
    return rank, device, note


def lost_process_line(kind, error, tb) -> None:
    """torchrun's exception hook: a collective that fails as another process is gone ends this one in one line."""
    if not any("torch/distributed" in frame.filename for frame in traceback.extract_tb(tb)):
        return sys.__excepthook__(kind, error, tb)
    gone = f"process {os.environ['RANK']} stops: another process of this run is gone ({kind.__name__} in a collective)"
    print(f"{SCRIPT}: error: {gone}; torchrun's report names the one that failed first", file=sys.stderr, flush=True)


def leave(run: "Run", stopped_at: str = "", stay: bool = False) -> None:
    """The end of this process's work: a stop's resume line (process 0) and exit status 128 + signal; under torchrun, the
    group left together, then os._exit, but for a process that stays (process 0, to save the final model)."""
    if stopped_at and run.rank == 0:
        run.close()
        print(f"stopped at {stopped_at}; resume with: {resume_command(run.args, run.dir)}", flush=True)
    code = 128 + run.stop[0] if stopped_at else 0
    if dist.is_initialized():  # a barrier first: a process that left while another was in its last exchange was seen to abort
        dist.barrier()
        dist.destroy_process_group()
    if run.args.world_size > 1 and not stay:  # past the teardown, where one was seen to abort (one launch in 50, gloo)
        sys.stdout.flush()
        os._exit(code)
    if code:
        sys.exit(code)


def stop_everywhere(stop: list[int], world_size: int, device: torch.device) -> bool:
    """Whether to stop now, the same answer on every process (or the next exchange would hang); one host sync."""
    if world_size == 1:
        return bool(stop)
    stopping = bool(gather(torch.tensor([len(stop)], device=device), world_size).any())  # a later signal: the next time
    if stopping and not stop:
        stop.append(signal.SIGTERM)
    return stopping


@torch.no_grad()
def evaluate(policy: Policy, obs_rms: ObsStatistics | None, args: Args, device: torch.device, video: str | None = None):
    """The returns of one episode (up to the horizon) on each of args.eval_episodes envs, statistics frozen; video: env 0's."""
    envs = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, render=video is not None)
    low, high = tanh_bounds(envs.single_action_space, device)
    shift, scale = frozen_normalizer(obs_rms, int(np.prod(envs.single_observation_space.shape)), device)
    obs, _ = envs.reset()
    returns, finished, frames = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool), []
    for _ in range(args.horizon):
        if video is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        x = normalize_frozen(torch.as_tensor(obs, dtype=torch.float32, device=device), shift, scale)
        obs, reward, term, trunc, _ = envs.step(to_action(policy(x), low, high).cpu().numpy())
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
        if finished.all():
            break
    envs.close()
    write_video(video, frames)
    return returns


def storage(args: Args, obs_space: gym.Space, action_space: gym.Space, device: torch.device) -> dict:
    """For check_storage: a generation's noise (a row per pair) and this process's members twice (flat, and stacked)."""
    n_out = int(np.prod(action_space.shape)) if isinstance(action_space, gym.spaces.Box) else int(action_space.n)
    widths = [obs_space.shape[0], *args.hidden_sizes, n_out]
    dim = sum((n_in + 1) * n_out for n_in, n_out in zip(widths, widths[1:], strict=False))
    population = f"the population (--population-size {args.population_size} x {dim:,} parameters)"
    fix = "lower --population-size or --hidden-sizes, or spread the population over more processes with torchrun"
    return {population: (4 * dim * (args.population_size // 2 + 2 * args.population_size // args.world_size), device, fix)}


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    """What the ranges cannot tell: the spaces, the horizon, the hidden sizes, the population's split over processes."""
    bounded = isinstance(action_space, gym.spaces.Box) and np.isfinite(np.r_[action_space.low, action_space.high]).all()
    vector = isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
    if not vector or not (bounded or isinstance(action_space, gym.spaces.Discrete)):  # tanh is scaled to the bounds
        fail(f"es.py needs vector observations and Discrete or bounded Box actions, and {args.env_id} has {obs_space} "
             f"and {action_space}; pick an env with those")  # fmt: skip
    refuse_meaningless(args, [
        (("preset",), {n for p in PRESETS.values() for n in p} <= args.typed, "only sets defaults, and all it sets are given"),
        (("eval_episodes", "capture_video"), not (args.eval_every > 0 or args.save_model),
         "sets the evaluations, and this run has none (see --eval-every and --save-model)"),
    ])  # fmt: skip
    if not all(1 <= width <= 16384 for width in args.hidden_sizes):  # far beyond Salimans et al.'s 64 to 256 units
        fail(f"--hidden-sizes {' '.join(map(str, args.hidden_sizes))} has a width below 1 or above 16384; pass 1 to 16384")
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.population_size % (n := 2 * args.world_size):
        fail(f"--population-size {args.population_size} must be a positive multiple of 2 x {args.world_size} process(es) "
             f"(antithetic pairs, split evenly over the processes); pass {-(-args.population_size // n) * n}")  # fmt: skip
    # the horizon: --max-episode-steps, else the env's time limit (gym.make, not gym.spec, imports a 'module:Env-v0' module)
    spec = envpool.make_spec(args.env_id).config if envpool_has(args.env_id) else gym.make(args.env_id).spec
    args.horizon = int(args.max_episode_steps or spec.max_episode_steps or 0)
    if args.horizon < 1:
        fail(f"{args.env_id} has no time limit, so an episode may never end; pass --max-episode-steps, the horizon")
    if args.capture_video and int(os.environ.get("RANK", "0")) == 0 and not can_render(args.env_id):  # process 0 evaluates
        fail(f"--capture-video: {args.env_id} cannot render here (it needs OpenGL or pygame); pass --no-capture-video")


def start_run(args: Args) -> "Run":
    obs_space, action_space = env_spaces(args.env_id)
    check_args(args, obs_space, action_space)
    rank, device, note = start_processes(args, small=True)
    check_storage(storage(args, obs_space, action_space, device))
    ckpt = load_checkpoint(args.resume, args.env_id) if args.resume else None
    share = f"playing {args.population_size // args.world_size} of the {args.population_size} members"
    run = Run(args, ckpt, device, args.num_generations, unit="generation", done=ckpt["generation"] if ckpt else 0, share=share)
    if rank == 0 and note:
        print(note, flush=True)
    run.obs_space, run.action_space = obs_space, action_space
    return run


def restore_run(run: "Run", theta, optimizer, obs_rms) -> tuple[int, int]:
    if not (ckpt := run.ckpt):
        return 0, 1
    theta.detach().copy_(nn.utils.parameters_to_vector(ckpt["model"].values()))  # the policy's weights, in that order
    optimizer.load_state_dict(ckpt["optimizer"])
    if obs_rms is not None:
        obs_rms.load_state_dict(ckpt["obs_rms"])
    rng_state(run.device, restore=ckpt["rng"])
    if run.rank == 0:
        print(f"resumed {run.dir} at generation {ckpt['generation']} (step {ckpt['global_step']:,})")
    return ckpt["global_step"], ckpt["generation"] + 1


def end_iteration(run: "Run", args: Args, generation: int, global_step: int, policy, theta, optimizer, obs_rms):
    nn.utils.vector_to_parameters(theta.detach(), policy.parameters())
    if run.rank == 0 and crossed(generation, 1, args.eval_every):
        with run.paused():
            run.log_eval(evaluate(policy, obs_rms, args, run.device, run.video(generation)), global_step)
    stopping = stop_everywhere(run.stop, args.world_size, run.device)  # torchrun: the same answer on every process
    if run.rank == 0 and (crossed(generation, 1, args.checkpoint_every) or stopping):
        statistics = obs_rms.state_dict() if obs_rms else None
        run.checkpoint(model=policy.state_dict(), optimizer=optimizer.state_dict(), obs_rms=statistics,
                       global_step=global_step, generation=generation, rng=rng_state(run.device))  # fmt: skip
    if stopping:
        leave(run, stopped_at=f"generation {generation} (step {global_step:,})")


def end_run(args: Args, run: "Run", policy: Policy, obs_rms, global_step: int) -> None:
    leave(run, stay=run.rank == 0)  # process 0 stays, to save the final model
    if args.save_model:  # evaluated as a user who loads it: the weights and statistics read back from disk
        state = run.save_and_reload(model=policy.state_dict(), obs_rms=obs_rms.state_dict() if obs_rms else None)
        policy.load_state_dict(state["model"])  # (end_iteration put theta into policy)
        if obs_rms is not None:
            obs_rms.load_state_dict(state["obs_rms"])
        run.log_eval(evaluate(policy, obs_rms, args, run.device, run.video()), global_step, run.model_path)
    run.finish(global_step)
    leave(run)


# ===============================================================================================================
# Run plumbing: the same text in every algorithm file, from this heading to the end (tests/test_shared_code.py compares)
# ===============================================================================================================
import contextlib
import dataclasses
import errno
import importlib.util
import io
import itertools
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
import warnings

import envpool
import numpy as np
import torch
import tyro
from torch.utils.tensorboard import SummaryWriter

warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")  # envpool's float64 bounds
SCRIPT = os.path.basename(__file__)
RANK, WORLD = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's: process 0 writes


@dataclasses.dataclass
class Tracking:
    """The shared block's own flags, which every script's Args gains below, after its own."""

    track: bool = False
    """send the run to Weights & Biases: tensorboard scalars, arguments, code, captured videos (WANDB_MODE=offline works)"""
    wandb_project_name: str = "single-file-rl"
    """the W&B project of the run, with --track"""
    wandb_entity: str = ""
    """the W&B team or user of the run, with --track (empty: your default entity)"""
    wandb_tags: tuple[str, ...] = ()
    """tags of the W&B run, with --track"""


Args = dataclasses.dataclass(type("Args", (Tracking, Args), {"__doc__": Args.__doc__}))


def fail(message: str):
    """Bad input ends here: one line `<script>: error: <what is wrong>; <what to do>` and exit status 2, as tyro's."""
    if os.environ.get("LOCAL_RANK", "0") == "0":  # under torchrun every process checks, and the first of each machine says
        print(f"{SCRIPT}: error: {message}", file=sys.stderr, flush=True)
    else:  # torchrun ends a job's other processes when one exits: first let process 0, which checks the same, say it
        time.sleep(3)
    sys.exit(2)


def parse_args(argv: list[str] | None = None) -> Args:
    """The command line over the chosen preset's defaults (which --help shows), checked; with --resume, the checkpoint's."""
    argv = sys.argv[1:] if argv is None else list(argv)
    defaults, captured = preset_defaults(argv), io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):  # --help opens with the docstring's first paragraph
            args = tyro.cli(Args, default=defaults, args=argv, description=__doc__.split("\n\n")[0])
    except SystemExit as e:
        if e.code:  # tyro's error box (plain text where the output is not UTF-8) as one line: the message between rules
            rows = [row.strip("│|╭╮╰╯ ") if row.strip("│|╭╮╰╯ ─-") else "" for row in captured.getvalue().splitlines()[1:]]
            message = " ".join(itertools.takewhile(bool, itertools.dropwhile(lambda row: not row, rows))).rstrip(".")
            fail(f"{message}; see {SCRIPT} --help")
        raise
    # the flags typed ('--name v', '--name=v', '--no-name'), as against defaults; not a field, so neither saved nor shown
    names = {arg[2:].partition("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}
    args.typed = frozenset((names | {n.removeprefix("no_") for n in names}) & {f.name for f in dataclasses.fields(Args)})
    check_ranges(args)
    args = resumed_args(args) if args.resume else args
    if getattr(args, "capture_video", False) and importlib.util.find_spec("imageio_ffmpeg") is None:
        fail("--capture-video needs imageio's ffmpeg plugin, which this Python lacks; pip install 'imageio[ffmpeg]'")
    if args.track and importlib.util.find_spec("wandb") is None:
        fail("--track sends the run to Weights & Biases, and this Python lacks wandb; pip install wandb, or leave out --track")
    refuse_meaningless(args, [(("wandb_project_name", "wandb_entity", "wandb_tags"), not args.track, "needs --track")])
    return args


def check_ranges(args: Args) -> None:
    """Each numeric flag in its interval in RANGES ('[1, inf)', '(0, 1]'); NaN is in none."""
    for name, interval in RANGES.items():
        low, high = (float(bound) for bound in interval[1:-1].split(","))
        value = getattr(args, name)
        above = value is None or (value > low if interval[0] == "(" else value >= low)
        if not (above and (value is None or (value < high if interval[-1] == ")" else value <= high))):
            fail(f"--{name.replace('_', '-')} {value} is out of range; pass a value in {interval}")
    if not args.exp_name or os.sep in args.exp_name:
        fail(f"--exp-name '{args.exp_name}' must be a plain name (part of the run directory's); pass one without '{os.sep}'")


def refuse_meaningless(args: Args, rules: list[tuple[tuple[str, ...], bool, str]]) -> None:
    """Each rule is (flags, whether this run makes them meaningless, why): such a flag, typed with any value, is refused."""
    for names, holds, why in rules:
        if typed := [name for name in names if holds and name in getattr(args, "typed", ())]:
            fail(f"--{typed[0].replace('_', '-')} {why}; leave it out")


def flag_value(argv: list[str], name: str, default: str) -> str:
    """The value of --name ('--name v' or '--name=v', dashes or underscores) before tyro parses the whole line."""
    for i, arg in enumerate(argv):
        key, eq, given = arg.partition("=")
        if key in (f"--{name.replace('_', '-')}", f"--{name}") and (eq or i + 1 < len(argv) and argv[i + 1][:2] != "--"):
            default = given if eq else argv[i + 1]
    return default


# The flags a resumed run may change: how long it runs, how it reports, what it writes and where it computes. A longer
# run follows its schedules (a learning rate annealed to the end) to the new length, as if it had been started with it.
RESUMABLE = ("total_timesteps", "num_generations", "checkpoint_every", "save_buffer", "eval_every", "eval_episodes",
             "eval_deterministic", "eval_epsilon", "progress_interval", "log_every", "log_interval", "capture_video",
             "save_model", "cuda", "track", "wandb_project_name", "wandb_entity", "wandb_tags")  # fmt: skip


def resumed_args(args: Args) -> Args:
    """--resume goes on with the checkpoint's arguments: a typed flag in RESUMABLE is applied, another that differs refused."""
    state = load_checkpoint(args.resume, args.env_id)
    defaults = {f.name: f.default for f in dataclasses.fields(Args)}
    saved = {**defaults, **state["args"]}  # a field newer than the checkpoint: the run it holds had its default
    finished = os.path.join("runs", state["run_name"], "finished")  # where the resumed run writes: has it ended there?
    end = int(open(finished).read()) if os.path.isfile(finished) else -1
    budget = "num_generations" if "num_generations" in saved else "total_timesteps"
    longer = budget in args.typed and getattr(args, budget) > saved[budget]  # a longer run goes on from any checkpoint
    if (at := state.get("global_step", end)) <= end and not longer:  # a finished run's checkpoint, resumed as it was
        again = "train nothing" if at == end else f"train those steps again into runs/{state['run_name']}, over their events"
        fail(f"'{args.resume}' holds step {at:,} of a run that finished at step {end:,}: resumed, it would {again}; "
             f"pass a --{budget.replace('_', '-')} above {saved[budget]} to extend the run")  # fmt: skip
    for name in sorted(args.typed - {"resume"}, key=list(defaults).index):
        value, flag, was = getattr(args, name), f"--{name.replace('_', '-')}", saved[name]
        reached = {"total_timesteps": ("step", "global_step"), "num_generations": ("generation", "generation")}.get(name)
        if value == was:
            continue
        if name not in RESUMABLE:
            keeps = f"differs from the checkpoint's {was}, and a resumed run keeps the settings it learned with"
            fail(f"{flag} {value} {keeps}; leave out {flag} (or pass {was}), or start a new run without --resume")
        if reached and value <= (at := state.get(reached[1], -1)):  # the resumed run would stop at once
            fail(f"{flag} {value} does not go past the checkpoint's {reached[0]} {at:,}, where the run resumes; "
                 f"pass a {flag} above {at} to extend the run")  # fmt: skip
        if RANK == 0:
            print(f"resuming with {flag} {value} (the checkpoint has {was})", flush=True)
        saved[name] = value
    resumed = Args(**{**{k: v for k, v in saved.items() if k in defaults}, "resume": args.resume})
    resumed.typed, resumed.wandb_id = args.typed, state.get("wandb_id")  # the W&B run a tracked run goes on in
    return resumed


def seed_and_device(args: Args, small: bool = False) -> torch.device:
    """Every RNG seeded; the device; one torch thread for a small network on the CPU (a second does not pay its waking)."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cpu" and small and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    return device


def check_storage(stores: dict[str, tuple[int, torch.device, str]]) -> None:
    """The big stores, {name with its flags: (bytes, device, fix)}: one over 0.9 of its device's free memory is refused."""
    for name, (size, device, fix) in stores.items():
        if device.type == "cuda":
            free, memory = torch.cuda.mem_get_info(device)[0], "GPU memory"
        else:
            with open("/proc/meminfo") as f:
                free, memory = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), "memory"
        if size > 0.9 * free:
            fail(f"{name} needs {size / 2**30:.3g} GiB and this machine has {free / 2**30:.3g} GiB of {memory} free; {fix}")


def rng_state(device: torch.device, restore: dict | None = None) -> dict:
    """This process's RNG states, for a checkpoint; with restore, those of a checkpoint put back first."""
    if restore is not None:
        random.setstate(restore["python"])
        np.random.set_state(restore["numpy"])
        torch.set_rng_state(restore["torch"])
        if device.type == "cuda" and restore["cuda"] is not None:
            torch.cuda.set_rng_state_all(restore["cuda"])
    cuda = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(), cuda=cuda)


class Run:
    """A run's stop requests (run.stop) and what it writes, process 0 alone under torchrun: runs/<run>, made once every
    check has passed; its tensorboard events (with --track, mirrored to W&B); the progress line; checkpoints; the final
    model; evaluations; videos; the end. A run started by a checkpoint (ckpt) goes on in its directory, from its step."""

    last: "Run | None" = None  # the run in progress, whose events a run that stops in error closes (run_main)
    kept: tuple[str | None, int | None] = (None, None)  # the checkpoint (path, step) a resume can start from

    def __init__(self, args: Args, ckpt: dict | None, device: torch.device, total: int, unit="step", done=None, share=""):
        self.args, self.device, self.total, self.unit, self.ckpt, Run.last = args, device, total, unit, ckpt, self
        self.rank, self.stop, self.writer = RANK, [], None
        for signum in (signal.SIGINT, signal.SIGTERM):  # checkpoint and exit at the loop's next boundary; again: now
            signal.signal(signum, lambda signum, _: (self.stop.append(signum), signal.signal(signum, signal.SIG_DFL)))
        step = ckpt["global_step"] if ckpt else 0
        self.start_step, self.start_done = step, step if done is None else done
        self.start_time, self.paused_seconds, self.last_print, self.recent_returns = time.time(), 0.0, 0.0, []
        name = f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.dir = os.path.join("runs", ckpt["run_name"] if ckpt else name)
        if RANK != 0:
            return
        threads, machines = torch.get_num_threads(), WORLD // int(os.environ.get("LOCAL_WORLD_SIZE", str(WORLD)))
        what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{threads} thread{'s' * (threads > 1)}"
        where = f" in each of {WORLD} processes on {machines} machine{'s' * (machines > 1)}, each {share}" if WORLD > 1 else ""
        print(f"{SCRIPT}: training on {device} ({what}){where}, torch {torch.__version__}", flush=True)
        if args.track:  # a W&B run named as the run directory (or the resumed one); its files stay in ./wandb
            import wandb

            try:
                run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity or None, resume="allow",
                                 name=os.path.basename(self.dir), tags=list(args.wandb_tags) or None,
                                 id=getattr(args, "wandb_id", None), config=dataclasses.asdict(args),
                                 sync_tensorboard=True, save_code=True)  # fmt: skip
            except Exception as e:  # W&B's own errors (no login, no network) as one line, before the run directory is made
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                fail(f"--track: Weights & Biases did not start ({why}); log in with wandb login, or set WANDB_MODE=offline")
            args.wandb_id = run.id  # saved in checkpoints (not a field: not a hyperparameter)
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as e:
            fail(f"cannot write the run directory {self.dir} ({e.strerror}); run from a directory where runs/ can be written")
        # purge_step: a run resumed after a hard kill drops the events logged after its checkpoint, so no step repeats
        self.writer = SummaryWriter(self.dir, purge_step=step + 1 if ckpt else None)
        if not ckpt:
            table = "\n".join(f"|{k}|{v}|" for k, v in dataclasses.asdict(args).items())
            self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    def log_episodes(self, returns, lengths, global_step: int) -> None:
        for episodic_return, length in zip(returns, lengths, strict=True):
            self.writer.add_scalar("charts/episodic_return", episodic_return, global_step)
            self.writer.add_scalar("charts/episodic_length", length, global_step)
            self.recent_returns = (self.recent_returns + [float(episodic_return)])[-20:]

    def log(self, global_step: int, done: int, extra: str = "", force: bool = False) -> int:
        """charts/SPS (over training time), and every --progress-interval s `<unit> done/total (%) | SPS | return | ETA`."""
        seconds = max(time.time() - self.start_time - self.paused_seconds, 1e-9)
        sps = int((global_step - self.start_step) / seconds)
        self.writer.add_scalar("charts/SPS", sps, global_step)
        if force or time.time() - self.last_print > self.args.progress_interval:
            self.last_print, mean = time.time(), f"{np.mean(self.recent_returns):.1f}" if self.recent_returns else "n/a"
            eta = seconds / max(done - self.start_done, 1) * (self.total - done)
            line = f"{self.unit} {done:,}/{self.total:,} ({100 * done / self.total:.0f}%) | SPS {sps:,}"
            line += f" | return {mean} (last {len(self.recent_returns)} episodes){extra}"
            print(f"{line} | ETA {int(eta // 60)}m{int(eta % 60):02d}s", flush=True)
        return sps

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside (evaluations) does not count towards SPS and the ETA."""
        start = time.time()
        yield
        self.paused_seconds += time.time() - start

    def checkpoint(self, **state) -> None:
        save_checkpoint(os.path.join(self.dir, "checkpoint.pt"), "checkpoint", self.args, self.dir, **state)

    def save_and_reload(self, **state) -> dict:
        """--save-model: the final model written, then read back from disk, as a user who loads it reads it."""
        self.model_path = os.path.join(self.dir, f"{SCRIPT[:-3]}.model")
        save_checkpoint(self.model_path, "model", self.args, self.dir, **state)
        return load_checkpoint(self.model_path, self.args.env_id, kind="model")

    def video(self, at: int | None = None) -> str | None:
        """The path of the video of an evaluation at step `at` (None: the final one); None without --capture-video."""
        return os.path.join(self.dir, "videos", f"eval_{at}.mp4" if at else "final.mp4") if self.args.capture_video else None

    def log_eval(self, returns: np.ndarray, global_step: int, model_path: str | None = None) -> None:
        """An evaluation's mean at its step; the reloaded final model's (model_path): one point per episode, at the last."""
        for value in returns if model_path else [np.mean(returns)]:
            self.writer.add_scalar("eval/episodic_return", float(value), global_step)
        episodes = f"over {len(returns)} episode{'s' * (len(returns) > 1)}"
        if model_path is None:
            print(f"eval at step {global_step:,}: mean return {np.mean(returns):.1f} {episodes}", flush=True)
        else:
            print(f"evaluation of {model_path}: mean return {np.mean(returns):.1f} +- {np.std(returns):.1f} {episodes}")
            print(f"model: {model_path}")

    def close(self) -> None:
        """The events flushed; with --track, the W&B run finished after them, so that it holds the last scalars."""
        self.writer.close()
        if (wandb := sys.modules.get("wandb")) and wandb.run is not None:  # imported with --track only
            wandb.finish()

    def stop_and_exit(self, where: str):
        """A stop request's end, once its checkpoint is written: the events closed, the command that resumes the run."""
        self.close()
        print(f"stopped at {where}; resume with: {resume_command(self.args, self.dir)}", flush=True)
        sys.exit(128 + self.stop[0])

    def finish(self, global_step: int) -> None:
        """The events closed, and the step the run finished at noted, against a resume of a checkpoint it went past."""
        self.close()
        with contextlib.suppress(OSError), open(os.path.join(self.dir, "finished"), "w") as f:
            f.write(f"{global_step}\n")
        print(f"tensorboard logs: {self.dir}   (view with: tensorboard --logdir runs)")


def crossed(count: int, advanced: int, every: int) -> bool:
    """The evaluation and checkpoint schedule: True when the last `advanced` steps passed a multiple of every (0: never)."""
    return every > 0 and count // every > (count - advanced) // every


def save_checkpoint(path: str, kind: str, args: Args, run_dir: str, **state) -> None:
    """A checkpoint.pt or a final model, marked for load_checkpoint; written to a .tmp, renamed: no kill leaves it broken."""
    marks = dict(script=SCRIPT, kind=kind, args=dataclasses.asdict(args), run_name=os.path.basename(run_dir))
    marks.update(format=CHECKPOINT_FORMAT, fields=sorted(state), wandb_id=getattr(args, "wandb_id", None))
    if (bad := non_finite(state)) is not None:  # the backstop: the loop's own checks stop a run before this
        at = f" at step {state['global_step']:,}" if "global_step" in state else ""
        raise NonFinite(f"{bad} holds a NaN or inf{at}, so no {kind} was written from it")
    try:
        torch.save({**marks, **state}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    except (OSError, RuntimeError) as error:  # torch's zip writer says only "unexpected pos" where the disk is full
        with contextlib.suppress(OSError):
            os.remove(f"{path}.tmp")
        folder = os.path.dirname(path) or "."
        full = isinstance(error, RuntimeError) and os.path.isdir(folder) and shutil.disk_usage(folder).free < 1 << 20
        cause = os.strerror(errno.ENOSPC) if full else getattr(error, "strerror", None) or str(error).strip().splitlines()[0]
        end_in_error(f"cannot write {path}: {cause}", args)
    if kind == "checkpoint":
        Run.kept = (path, state.get("global_step"))


def non_finite(state, name: str = "") -> str | None:
    """The name of the first floating tensor or array with a NaN or inf in a checkpoint's (nested) state, or None."""
    if isinstance(state, dict | list | tuple):
        items = state.items() if isinstance(state, dict) else enumerate(state)
        return next((bad for k, v in items if (bad := non_finite(v, f"{name}.{k}".lstrip(".")))), None)
    floating = torch.is_tensor(state) or isinstance(state, np.ndarray) and state.dtype.kind == "f"  # (integers are finite)
    return name if floating and not torch.isfinite(torch.as_tensor(state)).all() else None


class NonFinite(ValueError):
    """A NaN or inf in the env's data (finite_step) or in training (check_training): the run ends in one line (run_main)."""


# A write that failed for want of room or rights: a full disk or quota, a read-only disk, a folder removed under the run
UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENOENT, errno.EACCES)


def run_main(main, args) -> None:
    """main(args); a NaN or inf, or a write that fails for want of room or rights, ends the run in one line (no traceback)."""
    threading.excepthook = lambda hook: getattr(hook.exc_value, "errno", 0) in UNWRITABLE or threading.__excepthook__(hook)
    try:
        main(args)
    except (NonFinite, BrokenPipeError) as error:  # BrokenPipeError: the reader of stdout has gone (`| head`)
        if Run.last is not None and Run.last.writer is not None:
            Run.last.writer.close()  # the events up to it kept
        isinstance(error, BrokenPipeError) and os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush
        end_in_error(str(error), args)
    except OSError as error:  # a write elsewhere (the events' thread says its own at the next write)
        if error.errno not in UNWRITABLE:
            raise
        folder = os.path.dirname(Run.kept[0]) if Run.kept[0] else "the run directory"
        end_in_error(f"cannot write {os.fsdecode(error.filename) if error.filename else 'into ' + folder}: {error.strerror}",
                     args)  # fmt: skip


def end_in_error(what: str, args):
    """A run that cannot go on says so in one line, with the checkpoint it left to resume from, and exits 1."""
    kept, step = Run.kept
    if RANK != 0:
        left = "process 0 writes the run's checkpoints"
    elif kept is None or not os.path.exists(kept):
        left = "no checkpoint to resume from (--checkpoint-every N writes one every N steps)"
    else:
        at = f" (step {step:,})" if step is not None else ""
        resume = resume_command(args, os.path.dirname(kept))
        left = f"the last checkpoint, {kept}{at}, is as it was; resume from it with: {resume}"
    print(f"{SCRIPT}: error: {what}; {left}", file=sys.stderr, flush=True)
    sys.exit(1)


def resume_command(args, run_dir: str) -> str:
    launcher = f"torchrun --nproc_per_node {args.world_size}" if getattr(args, "world_size", 1) > 1 else "python"
    return f"{launcher} {sys.argv[0]} --env-id {args.env_id} --resume {os.path.join(run_dir, 'checkpoint.pt')}"


def finite_step(out: tuple, global_step: int) -> tuple:
    """A vector env's step once its rewards and observations are finite (as SB3's VecCheckNan), at one sum per array."""
    for what, x in (("reward", out[1]), ("observation", out[0])):
        if x.dtype.kind == "f" and not np.isfinite(np.add.reduce(x, axis=None)) and not (ok := np.isfinite(x)).all():
            env = int(np.flatnonzero(~ok.reshape(len(x), -1).all(axis=1))[0])  # (an overflowing sum of finite values passes)
            where = f"env {env}" + (f" of process {RANK}" if WORLD > 1 else "")
            raise NonFinite(f"the env's {what} is {x[~ok][0]} at step {global_step:,} ({where}), and nothing learned from it")
    return out


def parameter_sum(*modules) -> torch.Tensor:
    """The sum of every parameter, on the device: NaN or inf once any is, for check_training at the iteration's sync."""
    return torch.stack([p.detach().float().sum() for m in modules for p in m.parameters()]).sum().reshape(1)


def check_training(values: dict | list, global_step: int) -> dict | list:
    """An iteration's losses (and parameter sum), floats on the host, named or not, returned once finite."""
    for name, value in values.items() if isinstance(values, dict) else (("a loss", v) for v in values):
        if not np.isfinite(value):
            causes = "a learning rate too large, or rewards too large (scale them)"
            raise NonFinite(f"training turned non-finite at step {global_step:,} ({name} {value}): {causes}")
    return values


# The numpy types a checkpoint holds (RNG state, host statistics), allowed by name to PyTorch's safe unpickler
NUMPY_TYPES = [np.ndarray, np.dtype, np.zeros(1).__reduce__()[0], np.float64(0).__reduce__()[0]]
NUMPY_TYPES += [type(np.dtype(t)) for t in "bool uint8 int8 int16 int32 int64 uint32 uint64 float32 float64".split()]


def load_checkpoint(path: str, env_id: str, kind: str = "checkpoint") -> dict:
    """A checkpoint (or final model) of this script and env, or one line that says what the file is instead."""
    what = f"the runs/<run>/{'checkpoint.pt' if kind == 'checkpoint' else SCRIPT[:-3] + '.model'} of a {SCRIPT} run"
    if not os.path.isfile(path):
        fail(f"checkpoint '{path}' does not exist; pass {what}")
    try:
        # weights_only: the safe unpickler (tensors, plain values, NUMPY_TYPES only); mmap: a large checkpoint read as used
        with torch.serialization.safe_globals(NUMPY_TYPES):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # the safe unpickler's refusal names the object it met
        if found := "WeightsUnpickler" in str(e) and re.search(r"GLOBAL (\S+)|got <class '([^']+)'>", str(e)):
            unread = f"holds {found.group(1) or found.group(2)} beside tensors and plain values, so it was not read"
            fail(f"'{path}' {unread} (nothing in it ran); pass {what}, from a source you trust")
        fail(f"'{path}' cannot be read as a checkpoint ({type(e).__name__}); pass {what}")
    # what the file is: this script's checkpoint or final model, of this layout (CHECKPOINT_FORMAT), with every field
    marks = state if isinstance(state, dict) else {}
    script, found_kind, layout = marks.get("script"), marks.get("kind"), marks.get("format", 0)
    missing = [k for k in ("args", "run_name", *marks.get("fields", ())) if k not in marks]
    missing += ["args.env_id"] * ("env_id" not in marks.get("args", {}))
    if (script, found_kind, layout) != (SCRIPT, kind, CHECKPOINT_FORMAT) or missing:
        found = f"a {script} {found_kind} of format {layout}" if script else "a file no script of this project wrote"
        found += f" (which lacks {', '.join(missing)})" if missing and script == SCRIPT else ""
        other = f", or run {script}" if script and script != SCRIPT else ""
        fail(f"'{path}' is {found}, not a {SCRIPT} {kind} of format {CHECKPOINT_FORMAT}; pass {what}{other}")
    if state["args"]["env_id"] != env_id:
        fail(f"checkpoint '{path}' is for {state['args']['env_id']}, not {env_id}; pass --env-id {state['args']['env_id']}")
    if kind == "checkpoint":  # the one a failed write names
        Run.kept = (path, state.get("global_step"))
    return state


def write_video(path: str | None, frames: list) -> None:
    """A video is a view of the run, not its state: one that cannot be written is warned about, and the run goes on."""
    if path is None or not frames:
        return
    import imageio  # only needed for --capture-video; imageio-ffmpeg ships its own ffmpeg binary

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        imageio.mimsave(path, frames, fps=30, macro_block_size=1)
        if (wandb := sys.modules.get("wandb")) and wandb.run is not None:  # with --track, beside the scalars
            wandb.log({f"videos/{os.path.basename(path)[:-4]}": wandb.Video(path, format="mp4")})
    except OSError as error:
        print(f"{SCRIPT}: warning: cannot write {path}: {error.strerror or error}; the run goes on", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.remove(path)  # no video cut short


def envpool_has(env_id: str) -> bool:
    return ":" not in env_id and env_id in envpool.list_all_envs()  # "module:Id" is gymnasium's


if __name__ == "__main__":
    run_main(main, parse_args())
