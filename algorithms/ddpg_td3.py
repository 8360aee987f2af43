"""DDPG (Lillicrap et al. 2016) and TD3 (Fujimoto et al. 2018) in one file; benchmark: benchmark/ddpg_td3.sh.

Reading guide: from here to the line `# The algorithm ends here` is the algorithm: Args, the actor and the
batched critics, the maths (target policy smoothing, the TD target, Polyak averaging, exploration noise), the
critic and the delayed actor updates, the replay buffer, and main, the training loop. Below that line: this
file's machinery (presets, envs, evaluation, storage, checks, the start, checkpoints and end of a run), then
the run plumbing all eight files share.
"""

import os
from dataclasses import dataclass
from typing import Literal, NamedTuple

if "OMP_NUM_THREADS" not in os.environ:  # before torch loads: idle threads sleep, not spin (docs/speed.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import gymnasium as gym
import numpy as np
import torch
from torch import nn


@dataclass
class Args:
    # --- algorithm (the mujoco preset's values; --algo and --preset, below the marker, set several) ---
    algo: Literal["td3", "ddpg"] = "td3"
    """td3: twin critics, target policy smoothing; ddpg: neither; both delay the actor; a flag given wins"""
    total_timesteps: int = 1_000_000
    """total env steps over all envs; raised on --resume, it extends a finished or stopped run"""
    learning_rate: float = 3e-4
    """Adam learning rate of the actor and the critics"""
    num_envs: int = 1
    """parallel envs, all feeding one replay buffer; one gradient step per env step"""
    buffer_size: int = 1_000_000
    """replay buffer capacity in transitions"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """Polyak rate of the target networks: target <- tau * online + (1 - tau) * target"""
    batch_size: int = 256
    """transitions per gradient step"""
    hidden_size: int = 256
    """width of the two hidden ReLU layers of the actor and of each critic"""
    exploration_noise: float = 0.1
    """std of the Gaussian noise on the actor's action in training, in half-ranges of the bounds"""
    learning_starts: int = 25_000
    """env steps of uniformly random actions gathered before the first gradient step"""
    twin_critics: bool = True
    """TD3's clipped double Q: two critics, the target takes their minimum (DDPG: one critic)"""
    policy_frequency: int = 2
    """one actor and target update per this many critic updates (TD3's delay; 1: Lillicrap's DDPG)"""
    target_policy_smoothing: bool = True
    """TD3's target policy smoothing: clipped Gaussian noise on the target action (DDPG: none)"""
    policy_noise: float = 0.2
    """std of the smoothing noise, as a fraction of the half-range of the action bounds"""
    noise_clip: float = 0.5
    """the smoothing noise is clipped to +-noise_clip (same units as --policy-noise)"""
    # --- run settings ---
    env_id: str = "Hopper-v4"
    """envpool id (Hopper-v4, Pendulum-v1, ...) or a gymnasium id with Box actions, module:Env-v0 too"""
    preset: Literal["auto", "classic", "mujoco"] = "auto"
    """defaults for a family: mujoco (CleanRL's) or classic (Pendulum-v1); auto: by the env id"""
    exp_name: str = "td3"
    """name of this experiment, part of the run directory name; the --algo's name unless given"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    compile: bool = False
    """torch.compile the acting step and both updates (on a CPU slower than eager: see the docs)"""
    cudagraphs: bool = False
    """CUDA graphs on top of --compile (its "reduce-overhead" mode); needs CUDA, implies --compile"""
    bf16: bool = False
    """the layers in bfloat16 autocast; weights, optimisers, targets and losses stay float32"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final actor to runs/<run>/ddpg_td3.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate the policy on separate envs every this many env steps (0: at the end, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env), with the deterministic actor (no exploration noise)"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    save_buffer: bool = False
    """put the replay buffer in checkpoint.pt; a resume without it refills it for --learning-starts steps"""
    resume: str = ""
    """a checkpoint.pt to resume from; the run goes on in its directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    log_every: int = 1000
    """env steps between the loss and SPS scalars"""


# No orthogonal layer_init: Fujimoto et al.'s TD3.py and CleanRL keep PyTorch's default (uniform in
# +-1/sqrt(fan_in)). --bf16: the layers run in bfloat16 autocast and hand back float32, so targets, losses and
# noise stay float32 (autocast "cpu" off CUDA: the storage reckoning runs the critics on the meta device).
class Actor(nn.Module):
    """Deterministic policy: a two-hidden-layer ReLU MLP whose tanh output is scaled to the action bounds."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, hidden: int, bf16: bool = False):
        super().__init__()
        action_dim = int(np.prod(action_space.shape))
        self.bf16 = bf16
        self.network = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                     nn.Linear(hidden, action_dim), nn.Tanh())  # fmt: skip
        # on the host even where the layers are built on another device (storage's meta device)
        low = torch.as_tensor(action_space.low, dtype=torch.float32, device="cpu")
        high = torch.as_tensor(action_space.high, dtype=torch.float32, device="cpu")
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)
        self.bounds = dict(low=low.numpy(), high=high.numpy())  # host copies, for acting

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda" if x.is_cuda else "cpu", torch.bfloat16, enabled=self.bf16):
            return self.network(x).float() * self.action_scale + self.action_bias


class Critics(nn.Module):
    """num_critics Q-networks Q(s, a) -> (num_critics, batch) as ONE batched MLP: each layer's weights stacked
    on a leading critic axis, applied with one torch.baddbmm, so TD3's twin critics cost one forward and one
    backward pass."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int, num_critics: int, bf16: bool = False):
        super().__init__()
        sizes = [obs_dim + action_dim, hidden, hidden, 1]
        self.bf16 = bf16
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = 1.0 / np.sqrt(fan_in)  # nn.Linear's default initialisation, for each critic
            self.weights.append(nn.Parameter(torch.empty(num_critics, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num_critics, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, params: list | None = None) -> torch.Tensor:
        params = params if params is not None else list(zip(self.weights, self.biases, strict=True))
        x = torch.cat([obs, actions], -1)
        x = x.expand(params[0][0].shape[0], *x.shape)
        with torch.autocast("cuda" if x.is_cuda else "cpu", torch.bfloat16, enabled=self.bf16):
            for i, (w, b) in enumerate(params):
                x = torch.baddbmm(b, x, w)
                x = torch.relu(x) if i < len(params) - 1 else x
        return x.squeeze(-1).float()

    def first_critic_frozen(self) -> list:
        """The first critic's weights, detached: the actor's loss backpropagates into the action only (as
        TD3.py, the actor follows Q1), and no time goes into critic gradients that would be thrown away."""
        return [(w[:1].detach(), b[:1].detach()) for w, b in zip(self.weights, self.biases, strict=True)]


def smoothed_target_actions(next_actions, noise, noise_clip: float, action_scale, low, high):
    """TD3's target policy smoothing (Fujimoto et al. 2018, eq. 15): a' = clip(mu'(s') + clip(noise, -c, c) *
    scale, low, high). `noise` is N(0, policy_noise) in half-ranges of the bounds, like noise_clip."""
    return (next_actions + noise.clamp(-noise_clip, noise_clip) * action_scale).clamp(low, high)


def td_target(rewards, terminations, next_q, gamma: float):
    """r + gamma * (1 - terminated) * min_i Q'_i(s', a') over the critics of next_q (num_critics, batch): with
    two, TD3's clipped double Q; with one, DDPG's. A truncation (terminated 0) bootstraps from the real s'."""
    return rewards + gamma * (1.0 - terminations) * next_q.min(0).values


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging, target <- tau * online + (1 - tau) * target, as one fused op over all parameters;
    tau = 1 is the hard copy of Mnih et al. 2015 (lerp with weight 1 returns the online values exactly)."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def exploration_actions(actions, noise, action_scale, low, high):
    """TD3's exploration (Fujimoto et al. 2018, Algorithm 1): a = clip(mu(s) + noise * scale, low, high).
    `noise` is N(0, exploration_noise) in units of the half-range of the bounds."""
    return (actions + noise * action_scale).clamp(low, high)


class Batch(NamedTuple):
    """Transitions, one row each: what the replay buffer stores and samples."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminations: torch.Tensor


def critic_update(batch: Batch, target_actor, critic, target_critic, q_optimizer, args: Args) -> dict:
    """One critic gradient step towards the TD target, TD3's (target policy smoothing, clipped double Q) or
    DDPG's. Returns each critic's loss and the first one's mean Q, on the device (summed with no sync)."""
    obs, actions, rewards, next_obs, terminations = batch
    with torch.no_grad():
        next_actions = target_actor(next_obs)
        if args.target_policy_smoothing:
            noise = torch.randn_like(next_actions) * args.policy_noise
            low, high = target_actor.action_low, target_actor.action_high
            scale = target_actor.action_scale
            next_actions = smoothed_target_actions(next_actions, noise, args.noise_clip, scale, low, high)
        targets = td_target(rewards, terminations, target_critic(next_obs, next_actions), args.gamma)
    q = critic(obs, actions)
    per_critic = ((q - targets) ** 2).mean(1)
    q_optimizer.zero_grad(set_to_none=True)
    per_critic.sum().backward()  # the sum: each critic gets the gradient of its own MSE
    q_optimizer.step()
    losses = dict(zip(("qf1_loss", "qf2_loss"), per_critic.detach(), strict=False))  # qf2: twin critics
    return {**losses, "qf1_values": q[0].detach().mean()}


def actor_update(obs, actor, target_actor, critic, target_critic, actor_optimizer, tau: float) -> dict:
    """The delayed step (Fujimoto et al. 2018, Algorithm 1): the actor ascends the first critic's Q, then the
    Polyak updates of both targets. Returns the actor loss, detached."""
    actor_loss = -critic(obs, actor(obs), critic.first_critic_frozen()).mean()
    actor_optimizer.zero_grad(set_to_none=True)
    actor_loss.backward()
    actor_optimizer.step()
    soft_update(target_actor, actor, tau)
    soft_update(target_critic, critic, tau)
    return {"actor_loss": actor_loss.detach()}


def training_steps(actor, target_actor, critic, target_critic, q_optimizer, actor_optimizer, args: Args):
    """The acting step, the critic update and the actor + target update: the three functions `--compile` hands
    to torch.compile (as LeanRL's td3_continuous_action_torchcompile.py: the same code, traced once)."""

    def act(obs):
        """The actor's action plus Gaussian exploration noise, clipped to the bounds."""
        action = actor(obs)
        noise = torch.randn_like(action) * args.exploration_noise
        return exploration_actions(action, noise, actor.action_scale, actor.action_low, actor.action_high)

    def update_critic(batch):
        return critic_update(batch, target_actor, critic, target_critic, q_optimizer, args)

    def update_actor(obs):
        return actor_update(obs, actor, target_actor, critic, target_critic, actor_optimizer, args.tau)

    if not args.compile:
        return act, update_critic, update_actor
    mode = "reduce-overhead" if args.cudagraphs else "default"  # reduce-overhead: inductor's CUDA graph trees
    return tuple(torch.compile(step, mode=mode) for step in (act, update_critic, update_actor))


def select_actions(act, obs: torch.Tensor, bounds: dict, rng: np.random.Generator, random_actions: bool):
    """Uniformly random actions within the bounds before learning starts, then those of `act` (the acting
    step, or the deterministic actor in evaluation), clipped: tanh * scale + bias can pass a bound by a
    rounding error."""
    low, high = bounds["low"], bounds["high"]
    if random_actions:
        return rng.uniform(low, high, (len(obs), len(low))).astype(np.float32)
    with torch.no_grad():
        return np.clip(act(obs).cpu().numpy(), low, high)


class ReplayBuffer:
    """Preallocated on the device: observation, action, reward, next observation and termination of each real
    transition. Sampling draws indices on the device with its own generator, so the update loop never waits on
    the host. The reset step of the next-step autoreset is never written (`valid` False)."""

    def __init__(self, capacity: int, obs_dim: int, action_dim: int, device: torch.device, seed: int):
        self.capacity = capacity
        self.device = device
        self.obs = torch.zeros((capacity, obs_dim), device=device)
        self.actions = torch.zeros((capacity, action_dim), device=device)
        self.rewards = torch.zeros(capacity, device=device)
        self.next_obs = torch.zeros((capacity, obs_dim), device=device)
        self.terminations = torch.zeros(capacity, device=device)
        self.pos, self.size = 0, 0  # pos: the next slot to write
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def add(self, obs, actions, rewards, next_obs, terminations, valid: np.ndarray) -> None:
        """Write the transitions of the envs where `valid` (arrays or tensors, a row per env) in float32."""
        given = Batch(obs, actions, rewards, next_obs, terminations)
        new = Batch(*(torch.as_tensor(x, dtype=torch.float32, device=self.device) for x in given))
        if not valid.all():
            rows = torch.as_tensor(np.flatnonzero(valid), device=self.device)
            new = Batch(*(x[rows] for x in new))
        k = len(new.obs)
        if k == 0:
            return
        if self.pos + k <= self.capacity:  # a slice: no index tensor to build
            slots = slice(self.pos, self.pos + k)
        else:
            slots = torch.arange(self.pos, self.pos + k, device=self.device) % self.capacity
        for name, x in new._asdict().items():
            getattr(self, name)[slots] = x
        self.pos = (self.pos + k) % self.capacity
        self.size = min(self.size + k, self.capacity)

    def sample(self, batch_size: int) -> Batch:
        idx = torch.randint(0, self.size, (batch_size,), device=self.device, generator=self.generator)
        return Batch(*(getattr(self, name)[idx] for name in Batch._fields))


class LossSums(dict):
    """Each loss's (sum, count) on the device, added as it comes: a compiled step replayed as a CUDA graph
    overwrites its outputs. `means` reads them all with one host sync, once per log interval."""

    def add(self, losses: dict[str, torch.Tensor]) -> None:
        for name, value in losses.items():
            total, count = self.get(name, (0.0, 0))
            self[name] = (total + value, count + 1)

    def means(self) -> dict[str, float]:
        totals = torch.stack([total for total, _ in self.values()]).tolist()
        return {name: t / count for (name, (_, count)), t in zip(self.items(), totals, strict=True)}


def main(args: Args) -> None:
    # --- set-up: checks, device, run directory, writer (start_run); the networks, optimisers and buffer ---
    run = start_run(args)
    device = run.device
    N = args.num_envs
    obs_dim, action_dim = int(np.prod(run.obs_space.shape)), int(np.prod(run.action_space.shape))
    num_critics = 2 if args.twin_critics else 1
    actor = Actor(obs_dim, run.action_space, args.hidden_size, args.bf16).to(device)
    target_actor = Actor(obs_dim, run.action_space, args.hidden_size, args.bf16).to(device)
    target_actor.load_state_dict(actor.state_dict())
    critic = Critics(obs_dim, action_dim, args.hidden_size, num_critics, args.bf16).to(device)
    target_critic = Critics(obs_dim, action_dim, args.hidden_size, num_critics, args.bf16).to(device)
    target_critic.load_state_dict(critic.state_dict())
    # fused: one kernel for all parameters; compiled, the rate is a tensor, not a constant traced into a step
    lr = torch.tensor(args.learning_rate, device=device) if args.compile else args.learning_rate
    q_optimizer = torch.optim.Adam(critic.parameters(), lr=lr, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=lr, fused=True)
    # what a checkpoint holds of them, under its keys
    nets = dict(model=actor, target_actor=target_actor, critic=critic, target_critic=target_critic)
    nets.update(q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)
    act, update_critic, update_actor = training_steps(
        actor, target_actor, critic, target_critic, q_optimizer, actor_optimizer, args
    )
    explore_rng = np.random.default_rng(args.seed)  # the random actions; the exploration noise is torch's
    rb = ReplayBuffer(args.buffer_size, obs_dim, action_dim, device, args.seed)
    global_step = 0
    critic_updates = 0  # the actor's delay counts them
    train_from = args.learning_starts  # the step after which gradient steps begin
    if run.ckpt:  # weights, optimisers, counters, random states, the replay buffer if --save-buffer kept it
        global_step, critic_updates, train_from = restore_run(args, run, nets, explore_rng, rb)
    # envs are not restored by a resume, so its envs take a fresh seed
    envs = make_env(args.env_id, N, args.seed + global_step)
    obs = torch.as_tensor(envs.reset()[0], dtype=torch.float32, device=device)
    next_valid = np.ones(N, dtype=bool)  # False on the reset step that follows a done
    ep_return, ep_length = np.zeros(N), np.zeros(N, dtype=np.int64)
    losses = LossSums()

    while global_step < args.total_timesteps:
        # --- act: uniformly random until learning starts, then the actor plus exploration noise ---
        global_step += N
        actions = select_actions(act, obs, actor.bounds, explore_rng, global_step <= args.learning_starts)
        next_obs_np, reward, term, trunc, _ = finite_step(envs.step(actions), global_step)  # stops on NaN

        # --- step and store: the reset step of the next-step autoreset (next_valid False) is never written;
        # after a truncation next_obs is the real final observation and terminated stays 0: it bootstraps ---
        next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
        rb.add(obs, actions, reward, next_obs, term, next_valid)
        obs = next_obs
        done = term | trunc
        ep_return += reward
        ep_length += next_valid  # the reset step (reward 0) is no step of an episode
        run.log_episodes(ep_return[done], ep_length[done], global_step)
        ep_return[done], ep_length[done] = 0.0, 0
        next_valid = ~done

        # --- learn: one gradient step per env step; the TD target inside critic_update, the actor delayed ---
        if global_step > train_from:
            for _ in range(N):
                critic_updates += 1
                batch = rb.sample(args.batch_size)
                losses.add(update_critic(batch))
                if critic_updates % args.policy_frequency == 0:  # TD3's delayed actor and target updates
                    losses.add(update_actor(batch.obs))

        # --- logging, when these N steps reach a multiple of --log-every: each loss's mean, one host sync ---
        last = global_step >= args.total_timesteps
        if global_step % args.log_every < N or last:
            if losses:
                for name, mean in check_training(losses.means(), global_step).items():  # NaN/inf: one line
                    run.writer.add_scalar(f"losses/{name}", mean, global_step)
                losses = LossSums()
            run.log(global_step, global_step, force=last)

        # --- an evaluation every --eval-every steps, a checkpoint every --checkpoint-every and on Ctrl-C ---
        end_iteration(args, run, envs, nets, rb, explore_rng, global_step, critic_updates)

    # --- end: the final actor saved, reloaded from disk and evaluated (--save-model) ---
    end_run(args, run, envs, actor, critic, global_step)


# The algorithm ends here; a learner may stop. Below: this file's machinery, then the shared run plumbing.
CHECKPOINT_FORMAT = 1  # the layout of checkpoints and models: raise it when a field changes meaning (a resume refuses another)
RANGES = dict(seed="[0, 1e9]", eval_every="[0, inf)", eval_episodes="[1, inf)", checkpoint_every="[0, inf)",
              progress_interval="[0, inf)", log_every="[1, inf)", total_timesteps="[1, inf)", learning_rate="(0, inf)",
              num_envs="[1, inf)", buffer_size="[1, inf)", gamma="[0, 1]", tau="(0, 1]", batch_size="[1, inf)",
              hidden_size="[1, 65536]", exploration_noise="[0, inf)", learning_starts="[0, inf)",
              policy_frequency="[1, inf)", policy_noise="[0, inf)", noise_clip="[0, inf)")  # fmt: skip
# What --algo and --preset set (a flag given wins): td3, mujoco are Args' own, CleanRL's td3_ and ddpg_continuous_action.py's
# (Fujimoto et al. 2018's, 256-256; both delay the actor), whose results benchmark/ddpg_td3.sh reproduces; classic: Pendulum.
ALGOS = dict(td3=dict(), ddpg=dict(exp_name="ddpg", twin_critics=False, target_policy_smoothing=False))
PRESETS = dict(mujoco=dict(), classic=dict(total_timesteps=15_000, learning_rate=1e-3, buffer_size=100_000,
                                           learning_starts=1000, hidden_size=64))  # fmt: skip


def preset_defaults(argv: list[str]) -> Args:
    """The defaults of the --algo and --preset asked for; auto: classic for classic control, mujoco for the rest."""
    env_id, algo, preset = (flag_value(argv, name, getattr(Args, name)) for name in ("env_id", "algo", "preset"))
    family = "classic" if env_id in ("Pendulum-v1", "MountainCarContinuous-v0") else "mujoco"
    algo = algo if algo in ALGOS else Args.algo  # tyro names an unknown --algo in its own error
    return Args(env_id=env_id, algo=algo, **ALGOS[algo], **PRESETS.get(family if preset == "auto" else preset, {}))


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
    """A vector env that autoresets on the next step (a reset step, never stored): envpool's, or gymnasium's NEXT_STEP mode."""
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


def bf16_note(device: torch.device) -> str:
    """The start line's word where bfloat16 is emulated, so --bf16 likely slower than float32: a GPU before Ampere
    (compute capability 8), or a CPU whose /proc/cpuinfo (Linux, as envpool) names no AVX512-BF16, AMX or Arm BF16."""
    if device.type == "cuda":
        native = torch.cuda.get_device_capability(device)[0] >= 8
    else:
        with open("/proc/cpuinfo") as f:
            native = not {"avx512_bf16", "amx_bf16", "bf16"}.isdisjoint(f.read().split())
    return "" if native else f"note: no native bfloat16 on {device}: --bf16 is likely slower than float32"


def evaluate(actor: Actor, args: Args, device: torch.device, video: str | None = None) -> np.ndarray:
    """The returns of one episode of the deterministic actor (no exploration noise) on each of --eval-episodes envs."""
    envs = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, render=video is not None)
    obs, _ = envs.reset()
    returns, finished, frames = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool), []
    while not finished.all():
        if video is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        action = select_actions(actor, torch.as_tensor(obs, dtype=torch.float32, device=device), actor.bounds, None, False)
        obs, reward, term, trunc, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
    envs.close()
    write_video(video, frames)
    return returns


def storage(args: Args, obs_space: gym.Space, action_space: gym.Space, device: torch.device) -> dict:
    """The replay buffer, for check_storage: float32 observation, action, reward, next observation and termination a slot."""
    obs_dim, action_dim = int(np.prod(obs_space.shape)), int(np.prod(action_space.shape))
    buffer = f"the replay buffer (--buffer-size {args.buffer_size} of {obs_dim}-dim observations)"
    return {buffer: (args.buffer_size * 4 * (2 * obs_dim + action_dim + 2), device, "lower --buffer-size")}


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    """What the ranges alone cannot tell: the env's spaces, and flags that only make sense together."""
    if (processes := int(os.environ.get("WORLD_SIZE", "1"))) > 1:
        fail(f"it trains one learner from one replay buffer, and torchrun started {processes} processes; run it with python")
    if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1 and action_space.is_bounded()):
        fix = "use dqn.py" if isinstance(action_space, gym.spaces.Discrete) else "wrap the env"
        fail(f"ddpg_td3.py needs bounded 1-D Box actions (its tanh, scaled to them); {args.env_id} has {action_space}: {fix}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"ddpg_td3.py needs a vector observation; {args.env_id} has {obs_space}")
    refuse_meaningless(args, [
        (("policy_noise", "noise_clip"), not args.target_policy_smoothing,
         "shapes TD3's target policy smoothing, and this run has none (--algo ddpg or --no-target-policy-smoothing)"),
        (("eval_episodes", "capture_video"), not (args.eval_every > 0 or args.save_model),
         "sets the evaluations, and this run has none (see --eval-every and --save-model)"),
    ])  # fmt: skip
    if args.buffer_size < args.batch_size:
        fail(f"--buffer-size {args.buffer_size} is less than --batch-size {args.batch_size}; raise it")
    if not args.batch_size <= args.learning_starts < args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} is under --batch-size or leaves no gradient step; change it")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of {args.num_envs} envs; raise it")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device, and this run is on the CPU; leave it out (--compile works on the CPU)")
    args.compile = args.compile or args.cudagraphs
    if args.capture_video and not can_render(args.env_id):  # typed, or a resumed checkpoint's
        fail(f"--capture-video: {args.env_id} cannot render here (it needs OpenGL or pygame); pass --no-capture-video")


def start_run(args: Args) -> "Run":
    """Every check, then the device, the checkpoint read and the Run (run directory, writer), with the env's spaces."""
    obs_space, action_space = env_spaces(args.env_id)
    check_args(args, obs_space, action_space)
    device = seed_and_device(args, small=True)
    check_storage(storage(args, obs_space, action_space, device))
    ckpt = load_checkpoint(args.resume, args.env_id) if args.resume else None
    run = Run(args, ckpt, device, -(-args.total_timesteps // args.num_envs) * args.num_envs)  # whole vector steps, as it runs
    if args.bf16 and (slow := bf16_note(device)):
        print(slow, flush=True)
    run.obs_space, run.action_space = obs_space, action_space
    return run


def restore_run(args: Args, run: "Run", nets: dict, explore_rng, rb: ReplayBuffer) -> tuple[int, int, int]:
    """A resume's networks, optimisers, counters, RNG states and saved replay buffer; returns the counters and train_from."""
    ckpt = run.ckpt
    for key, net in nets.items():
        net.load_state_dict(ckpt[key])
    rng_state(run.device, restore=ckpt["rng"])
    explore_rng.bit_generator.state = ckpt["rng"]["explore"]
    rb.generator.set_state(ckpt["rng"]["buffer"])
    global_step, saved = ckpt["global_step"], ckpt.pop("replay_buffer")
    if saved is not None:
        for name in Batch._fields:
            getattr(rb, name).copy_(saved[name])
        rb.pos, rb.size = saved["pos"], saved["size"]
    refill = f" (replay buffer not saved: refilling it for {args.learning_starts:,} steps)" if saved is None else ""
    print(f"resumed {run.dir} at step {global_step:,}{refill}")
    return global_step, ckpt["critic_updates"], args.learning_starts + (global_step if saved is None else 0)


def end_iteration(args: Args, run: "Run", envs, nets: dict, rb, explore_rng, global_step: int, critic_updates: int) -> None:
    """Each step's end: an evaluation every --eval-every steps, a checkpoint every --checkpoint-every and at a stop."""
    if crossed(global_step, args.num_envs, args.eval_every):
        with run.paused():
            run.log_eval(evaluate(nets["model"], args, run.device, run.video(global_step)), global_step)
    if crossed(global_step, args.num_envs, args.checkpoint_every) or run.stop:
        rng = dict(rng_state(run.device), explore=explore_rng.bit_generator.state, buffer=rb.generator.get_state())
        buffer = {name: getattr(rb, name) for name in (*Batch._fields, "pos", "size")} if args.save_buffer else None
        states = {key: net.state_dict() for key, net in nets.items()}
        run.checkpoint(**states, replay_buffer=buffer, global_step=global_step, critic_updates=critic_updates, rng=rng)
    if run.stop:
        envs.close()
        run.stop_and_exit(f"step {global_step:,}")


def end_run(args: Args, run: "Run", envs, actor: Actor, critic: Critics, global_step: int):
    """The envs closed; with --save-model the final actor saved, reloaded from disk and evaluated; then the run's end."""
    envs.close()
    if args.save_model:  # as a user who loads it: a new actor, from the file read back
        state = run.save_and_reload(model=actor.state_dict(), critic=critic.state_dict())
        eval_actor = Actor(int(np.prod(run.obs_space.shape)), run.action_space, args.hidden_size, args.bf16).to(run.device)
        eval_actor.load_state_dict(state["model"])
        run.log_eval(evaluate(eval_actor, args, run.device, run.video()), global_step, run.model_path)
    run.finish(global_step)


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
