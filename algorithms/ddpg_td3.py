"""DDPG (Lillicrap et al. 2016) and TD3 (Fujimoto et al. 2018) in one file; benchmark: `bash benchmark/ddpg_td3.sh`."""

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
import tyro
from torch import nn
from torch.utils.tensorboard import SummaryWriter

# envpool declares float64 bounds for float32 observations; gymnasium warns about it on every env made
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")


@dataclass
class Args:
    # --- run infrastructure ---
    exp_name: str = "td3"
    """name of this experiment, part of the run directory name (default: the --algo)"""
    env_id: str = "Hopper-v4"
    """envpool id (Hopper-v4, HalfCheetah-v5, Pendulum-v1, ...) or any gymnasium id with Box actions, including
    'module:Env-v0'"""
    algo: Literal["td3", "ddpg"] = "td3"
    """td3 switches on its three changes to DDPG (--twin-critics, --policy-frequency 2, --target-policy-smoothing);
    ddpg switches them off; each flag given on the command line wins"""
    preset: Literal["auto", "classic", "mujoco"] = "auto"
    """defaults for a family: mujoco (CleanRL td3_continuous_action.py / ddpg_continuous_action.py: 1M steps, 1M
    buffer, 25k random steps first), classic (Pendulum-v1: 15k steps, 1k random steps first, lr 1e-3, 64-64 MLPs);
    auto picks classic for Pendulum-v1 and MountainCarContinuous-v0, mujoco for every other id"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final actor to runs/<run>/<algo>.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate the policy on separate envs every this many env steps (0: only after training, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env), with the deterministic actor (no exploration noise)"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    save_buffer: bool = False
    """put the replay buffer in checkpoint.pt (about 110 MB for Hopper's 1M transitions); a resume without it has
    lost the experience gathered so far and refills the buffer for --learning-starts steps of the current policy
    before updating again"""
    resume: str = ""
    """path of a checkpoint.pt to resume from; the run goes on in the same directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    log_every: int = 1000
    """env steps between the loss and SPS scalars"""

    # --- algorithm ---
    total_timesteps: int = 1_000_000
    """total env steps over all envs"""
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
    """std of the Gaussian noise added to the actor's action while training, as a fraction of the half-range of the
    action bounds"""
    learning_starts: int = 25_000
    """env steps of uniformly random actions gathered before the first gradient step"""
    twin_critics: bool = True
    """TD3's clipped double Q: two critics, the target takes their minimum (DDPG: one critic)"""
    policy_frequency: int = 2
    """TD3's delayed updates: one actor and target update per this many critic updates (DDPG: 1)"""
    target_policy_smoothing: bool = True
    """TD3's target policy smoothing: clipped Gaussian noise on the target action (DDPG: none)"""
    policy_noise: float = 0.2
    """std of the smoothing noise, as a fraction of the half-range of the action bounds"""
    noise_clip: float = 0.5
    """the smoothing noise is clipped to +-noise_clip (same units as --policy-noise)"""


# TD3 is DDPG plus three changes; each preset only changes defaults and any flag given on the command line wins.
ALGOS = {
    "td3": dict(exp_name="td3", twin_critics=True, policy_frequency=2, target_policy_smoothing=True),
    "ddpg": dict(exp_name="ddpg", twin_critics=False, policy_frequency=1, target_policy_smoothing=False),
}
# The settings of CleanRL's td3_continuous_action.py and ddpg_continuous_action.py (those of Fujimoto et al. 2018,
# with 256-256 networks), whose published MuJoCo results benchmark/ddpg_td3.sh reproduces; classic is sized for
# Pendulum-v1 (budget measured in tests/test_ddpg_td3.py).
PRESETS = {
    "mujoco": dict(),
    "classic": dict(total_timesteps=15_000, learning_rate=1e-3, buffer_size=100_000, learning_starts=1000, hidden_size=64),
}
CLASSIC_CONTROL = ("Pendulum-v1", "MountainCarContinuous-v0")


def fail(message: str):
    """Bad input ends with one line on stderr and exit status 1, never a traceback."""
    raise SystemExit(f"ddpg_td3.py: error: {message}")


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


def make_env(env_id: str, num_envs: int, seed: int, render: bool = False):
    """A vector env with next-step autoreset: envpool when it has the id, gymnasium otherwise.

    After a step that ends an episode, the next step ignores its action and returns reward 0 and the first
    observation of the next episode; that step never enters the replay buffer.
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
        f"import sys; sys.path.insert(0, {here!r}); import ddpg_td3; "
        f"envs = ddpg_td3.make_env({env_id!r}, 1, 0, render=True); envs.reset(); envs.render()"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


def update_episode_stats(ep_return, ep_length, raw_reward, valid, episode_end):
    """Running return and length per env; returns the new running values and the finished episodes' ones.

    `valid` is False on the reset step of the next-step autoreset (not a real transition, not counted).
    """
    ep_return = ep_return + raw_reward
    ep_length = ep_length + valid
    finished_returns, finished_lengths = ep_return[episode_end], ep_length[episode_end]
    ep_return = np.where(episode_end, 0.0, ep_return)
    ep_length = np.where(episode_end, 0, ep_length)
    return ep_return, ep_length, finished_returns, finished_lengths


# ---------------------------------------------------------------------------------------------------------------
# Replay buffer
# ---------------------------------------------------------------------------------------------------------------
class ReplayBuffer:
    """Preallocated on the device: observation, action, reward, next observation and termination of each real
    transition. Sampling draws indices on the device with its own generator, so the update loop never waits on
    the host. The reset step of the next-step autoreset is never written (`valid` False)."""

    def __init__(self, capacity: int, obs_dim: int, action_dim: int, device: torch.device, seed: int):
        self.capacity, self.device = capacity, device
        self.obs = torch.zeros((capacity, obs_dim), device=device)
        self.actions = torch.zeros((capacity, action_dim), device=device)
        self.rewards = torch.zeros(capacity, device=device)
        self.next_obs = torch.zeros((capacity, obs_dim), device=device)
        self.terminations = torch.zeros(capacity, device=device)
        self.pos, self.size = 0, 0  # pos: the next slot to write
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def add(self, obs, actions, rewards, next_obs, terminations, valid: np.ndarray) -> None:
        """Write the transitions of the envs where `valid` (tensors with one row per env)."""
        if not valid.all():
            rows = torch.as_tensor(np.flatnonzero(valid), device=self.device)
            obs, actions, rewards, next_obs, terminations = (x[rows] for x in (obs, actions, rewards, next_obs, terminations))
        k = len(obs)
        if k == 0:
            return
        if self.pos + k <= self.capacity:  # a slice: no index tensor to build
            slots = slice(self.pos, self.pos + k)
        else:
            slots = torch.arange(self.pos, self.pos + k, device=self.device) % self.capacity
        self.obs[slots], self.actions[slots], self.rewards[slots] = obs, actions, rewards
        self.next_obs[slots], self.terminations[slots] = next_obs, terminations
        self.pos = (self.pos + k) % self.capacity
        self.size = min(self.size + k, self.capacity)

    def sample(self, batch_size: int):
        idx = torch.randint(0, self.size, (batch_size,), device=self.device, generator=self.generator)
        return self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx], self.terminations[idx]

    def state_dict(self) -> dict:
        arrays = dict(obs=self.obs, actions=self.actions, rewards=self.rewards, next_obs=self.next_obs)
        return {**arrays, "terminations": self.terminations, "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        for k in ("obs", "actions", "rewards", "next_obs", "terminations"):
            getattr(self, k).copy_(state[k])
        self.pos, self.size = state["pos"], state["size"]


# ---------------------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------------------
# No orthogonal layer_init here: Fujimoto et al.'s TD3.py and CleanRL keep PyTorch's default nn.Linear
# initialisation (uniform in +-1/sqrt(fan_in)), and their results are the ones the presets reproduce.
class Actor(nn.Module):
    """Deterministic policy: a two-hidden-layer ReLU MLP whose tanh output is scaled to the env's action bounds."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, hidden: int):
        super().__init__()
        action_dim = int(np.prod(action_space.shape))
        self.network = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, action_dim),
            nn.Tanh(),
        )
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)
        self.bounds = (low.numpy(), high.numpy(), ((high - low) / 2.0).numpy())  # host copies, for acting

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x) * self.action_scale + self.action_bias


class Critics(nn.Module):
    """num_critics Q-networks Q(s, a) -> (num_critics, batch) computed as ONE batched MLP: each layer's weights
    are stacked on a leading critic axis and applied with one batched matmul (torch.baddbmm), so TD3's twin critics
    cost one forward and one backward pass instead of two."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int, num_critics: int):
        super().__init__()
        sizes = [obs_dim + action_dim, hidden, hidden, 1]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = 1.0 / np.sqrt(fan_in)  # nn.Linear's default initialisation, for each critic
            self.weights.append(nn.Parameter(torch.empty(num_critics, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num_critics, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, params: list | None = None) -> torch.Tensor:
        params = params if params is not None else list(zip(self.weights, self.biases, strict=True))
        x = torch.cat([obs, actions], -1)
        x = x.expand(params[0][0].shape[0], *x.shape)
        for i, (w, b) in enumerate(params):
            x = torch.baddbmm(b, x, w)
            x = torch.relu(x) if i < len(params) - 1 else x
        return x.squeeze(-1)

    def first_critic_frozen(self) -> list:
        """The first critic's weights, detached: the actor's loss backpropagates into the action only (as TD3.py,
        the actor follows Q1), and no time goes into critic gradients that would be thrown away."""
        return [(w[:1].detach(), b[:1].detach()) for w, b in zip(self.weights, self.biases, strict=True)]


# ---------------------------------------------------------------------------------------------------------------
# The algorithm's maths
# ---------------------------------------------------------------------------------------------------------------
def smoothed_target_actions(next_actions, noise, noise_clip: float, action_scale, low, high):
    """TD3's target policy smoothing (Fujimoto et al. 2018, eq. 15): a' = clip(mu'(s') + clip(noise, -c, c) * scale,
    low, high). `noise` is N(0, policy_noise) in units of the half-range of the bounds, like noise_clip."""
    return (next_actions + noise.clamp(-noise_clip, noise_clip) * action_scale).clamp(low, high)


def td_target(rewards, terminations, next_q, gamma: float):
    """r + gamma * (1 - terminated) * min_i Q'_i(s', a') over the critics of next_q (num_critics, batch): with two,
    TD3's clipped double Q; with one, DDPG's target.

    A truncated transition has terminations 0 and bootstraps from the real final observation s'.
    """
    return rewards + gamma * (1.0 - terminations) * next_q.min(0).values


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging, target <- tau * online + (1 - tau) * target, as one fused op over all parameters."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def update(batch, actor, target_actor, critic, target_critic, q_optimizer, actor_optimizer, update_index: int, args: Args):
    """One critic gradient step; on every policy_frequency-th (update_index counts them from 1) also an actor step
    and the Polyak updates of both targets (Fujimoto et al. 2018, Algorithm 1).

    Returns (stats, actor_updated); stats = (qf1_loss, qf2_loss, qf1_values, actor_loss) as a tensor on the
    device, so the caller accumulates it without a host sync.
    """
    obs, actions, rewards, next_obs, terminations = batch
    with torch.no_grad():
        next_actions = target_actor(next_obs)
        if args.target_policy_smoothing:
            noise = torch.randn_like(next_actions) * args.policy_noise
            next_actions = smoothed_target_actions(
                next_actions,
                noise,
                args.noise_clip,
                target_actor.action_scale,
                target_actor.action_low,
                target_actor.action_high,
            )
        targets = td_target(rewards, terminations, target_critic(next_obs, next_actions), args.gamma)
    q = critic(obs, actions)
    per_critic = ((q - targets) ** 2).mean(1)
    q_optimizer.zero_grad(set_to_none=True)
    per_critic.sum().backward()  # the sum: each critic gets the gradient of its own MSE
    q_optimizer.step()

    actor_updated = update_index % args.policy_frequency == 0
    actor_loss = torch.zeros((), device=q.device)
    if actor_updated:
        actor_loss = -critic(obs, actor(obs), critic.first_critic_frozen()).mean()
        actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        actor_optimizer.step()
        soft_update(target_actor, actor, args.tau)
        soft_update(target_critic, critic, args.tau)
    stats = torch.stack([per_critic[0], per_critic[-1], q[0].mean(), actor_loss]).detach()
    return stats, actor_updated


def select_actions(actor: Actor, obs: torch.Tensor, noise: float, rng: np.random.Generator, random_actions: bool):
    """Uniformly random actions within the bounds before learning starts, then the actor's action plus Gaussian
    noise of std `noise` times the half-range of the bounds, clipped to the bounds."""
    low, high, scale = actor.bounds
    if random_actions:
        return rng.uniform(low, high, (len(obs), len(low))).astype(np.float32)
    with torch.inference_mode():
        action = actor(obs).cpu().numpy()
    if noise > 0:
        action = action + rng.normal(0.0, 1.0, action.shape) * noise * scale
    return np.clip(action, low, high).astype(np.float32)


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
        fail(f"checkpoint '{path}' does not exist; pass the checkpoint.pt or <algo>.model of an earlier run")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        fail(f"checkpoint '{path}' cannot be read ({type(e).__name__}: {e}); it is not a ddpg_td3.py checkpoint")
    if not isinstance(state, dict) or "model" not in state or "args" not in state:
        fail(f"'{path}' is not a ddpg_td3.py checkpoint (it has no model and args)")
    if env_id is not None and state["args"]["env_id"] != env_id:
        fail(f"checkpoint '{path}' is for {state['args']['env_id']}, not {env_id}; pass --env-id {state['args']['env_id']}")
    return state


def evaluate(actor: Actor, args: Args, device: torch.device, video_path: str | None = None) -> np.ndarray:
    """Play one full episode with the deterministic actor (no exploration noise) on each of args.eval_episodes envs.
    Returns the episodes' returns. Video: env 0's episode, when it renders.
    """
    envs = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, render=video_path is not None)
    obs, _ = envs.reset()
    returns, finished = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool)
    frames = []
    while not finished.all():
        if video_path is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        action = select_actions(actor, torch.as_tensor(obs, dtype=torch.float32, device=device), 0.0, None, False)
        obs, reward, term, trunc, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
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
    """tyro CLI whose defaults are the chosen algo's and preset's, so that --help shows the values a run will use."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env-id", "--env_id", dest="env_id", default=Args.env_id)
    pre.add_argument("--algo", default=Args.algo)
    pre.add_argument("--preset", default=Args.preset)
    known, _ = pre.parse_known_args(argv)
    preset = known.preset
    if preset == "auto":
        preset = "classic" if known.env_id in CLASSIC_CONTROL else "mujoco"
    defaults = Args(env_id=known.env_id, algo=known.algo, **ALGOS.get(known.algo, {}), **PRESETS.get(preset, {}))
    return tyro.cli(Args, default=defaults, args=argv, description=__doc__)


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    if isinstance(action_space, gym.spaces.Discrete):
        fail(f"ddpg_td3.py needs Box actions; {args.env_id} has {action_space}: use dqn.py for discrete actions")
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        fail(f"ddpg_td3.py handles 1-D Box action spaces; {args.env_id} has {action_space}")
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        fail(f"ddpg_td3.py scales the actor's tanh output to the action bounds; {args.env_id} has unbounded {action_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"ddpg_td3.py needs a vector observation; {args.env_id} has {obs_space}")
    if min(args.num_envs, args.batch_size, args.policy_frequency, args.hidden_size) < 1:
        fail("--num-envs, --batch-size, --policy-frequency and --hidden-size must be at least 1")
    if args.learning_starts < args.batch_size:
        fail(f"--learning-starts {args.learning_starts} is less than --batch-size {args.batch_size}")
    if args.buffer_size < args.batch_size:
        fail(f"--buffer-size {args.buffer_size} is less than --batch-size {args.batch_size}")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of {args.num_envs} envs")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau {args.tau} must lie in (0, 1]")
    if min(args.exploration_noise, args.policy_noise, args.noise_clip) < 0:
        fail("--exploration-noise, --policy-noise and --noise-clip must not be negative")
    if args.eval_episodes < 1:
        fail("--eval-episodes must be at least 1")


def main(args: Args) -> None:
    # --- set-up ---
    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(args.resume, args.env_id)
        ignored = [k for k, v in ckpt["args"].items() if k != "resume" and getattr(args, k) != v and k in Args.__annotations__]
        if ignored and any(getattr(args, k) != getattr(Args(), k) for k in ignored):
            print(f"resuming with the checkpoint's arguments; ignoring --{', --'.join(k.replace('_', '-') for k in ignored)}")
        args = Args(**{**ckpt["args"], "resume": args.resume})
    obs_space, action_space = env_spaces(args.env_id)
    check_args(args, obs_space, action_space)
    if args.capture_video and not can_render(args.env_id):
        print(f"warning: {args.env_id} cannot render on this machine (no OpenGL?); running without --capture-video")
        args.capture_video = False
    safe_id = args.env_id.replace("/", "-").replace(":", "-")
    run_name = ckpt["run_name"] if ckpt else f"{safe_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)
    os.makedirs(run_dir, exist_ok=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # envs are not restored by a resume, so its envs take a fresh seed
    global_step = ckpt["global_step"] if ckpt else 0
    envs = make_env(args.env_id, args.num_envs, args.seed + global_step)
    obs_dim, action_dim, N = int(np.prod(obs_space.shape)), int(np.prod(action_space.shape)), args.num_envs

    num_critics = 2 if args.twin_critics else 1
    actor = Actor(obs_dim, action_space, args.hidden_size).to(device)
    target_actor = Actor(obs_dim, action_space, args.hidden_size).to(device)
    target_actor.load_state_dict(actor.state_dict())
    critic = Critics(obs_dim, action_dim, args.hidden_size, num_critics).to(device)
    target_critic = Critics(obs_dim, action_dim, args.hidden_size, num_critics).to(device)
    target_critic.load_state_dict(critic.state_dict())
    # fused: one kernel for all parameters instead of a loop over tensors
    q_optimizer = torch.optim.Adam(critic.parameters(), lr=args.learning_rate, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    explore_rng = np.random.default_rng(args.seed)  # random actions and exploration noise
    rb = ReplayBuffer(args.buffer_size, obs_dim, action_dim, device, args.seed)
    train_from, critic_updates = args.learning_starts, 0
    if ckpt:
        actor.load_state_dict(ckpt["model"])
        target_actor.load_state_dict(ckpt["target_actor"])
        critic.load_state_dict(ckpt["critic"])
        target_critic.load_state_dict(ckpt["target_critic"])
        q_optimizer.load_state_dict(ckpt["q_optimizer"])
        actor_optimizer.load_state_dict(ckpt["actor_optimizer"])
        critic_updates = ckpt["critic_updates"]
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        explore_rng.bit_generator.state = ckpt["rng"]["explore"]
        rb.generator.set_state(ckpt["rng"]["buffer"])
        saved_buffer = ckpt.pop("replay_buffer", None)
        if saved_buffer is not None:
            rb.load_state_dict(saved_buffer)
        else:  # the experience is lost: gather learning_starts steps again before the next gradient step
            train_from = max(train_from, global_step + args.learning_starts)
        print(f"resumed {run_dir} at step {global_step:,}" + ("" if rb.size else " (replay buffer not saved: refilling it)"))

    # purge_step: a run resumed after a hard kill drops the events logged after its checkpoint, so no step repeats
    writer = SummaryWriter(run_dir, purge_step=global_step + 1 if ckpt else None)
    if not ckpt:
        table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    def checkpoint_state(with_buffer: bool) -> dict:
        rng = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())
        rng["cuda"] = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
        rng.update(explore=explore_rng.bit_generator.state, buffer=rb.generator.get_state())
        return dict(
            args=dataclasses.asdict(args),
            run_name=run_name,
            model=actor.state_dict(),
            target_actor=target_actor.state_dict(),
            critic=critic.state_dict(),
            target_critic=target_critic.state_dict(),
            q_optimizer=q_optimizer.state_dict(),
            actor_optimizer=actor_optimizer.state_dict(),
            replay_buffer=rb.state_dict() if with_buffer else None,
            global_step=global_step,
            critic_updates=critic_updates,
            rng=rng,
        )

    # Ctrl-C and SIGTERM finish the current step, write a checkpoint and exit; a second one kills at once
    stop = []

    def request_stop(signum, _frame):
        stop.append(signum)
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    def to_tensor(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=device)

    obs = to_tensor(envs.reset()[0])
    next_valid = np.ones(N, dtype=bool)  # False on the reset step that follows a done
    ep_return, ep_length = np.zeros(N), np.zeros(N, dtype=np.int64)
    recent_returns: list[float] = []
    stats, num_critic_stats, num_actor_stats = torch.zeros(4, device=device), 0, 0
    start_time, start_step, eval_seconds, last_print = time.time(), global_step, 0.0, 0.0
    env_seconds, act_seconds, update_seconds = 0.0, 0.0, 0.0

    while global_step < args.total_timesteps:
        # --- acting ---
        global_step += N
        t0 = time.perf_counter()
        actions = select_actions(actor, obs, args.exploration_noise, explore_rng, global_step <= args.learning_starts)
        t1 = time.perf_counter()
        next_obs_np, reward, term, trunc, _ = envs.step(actions)
        t2 = time.perf_counter()
        act_seconds, env_seconds = act_seconds + t1 - t0, env_seconds + t2 - t1
        # next_obs is the real final observation after a truncation (the reset comes on the next step), and a
        # truncated transition keeps terminated 0: it bootstraps; the reset step (next_valid False) is not written
        next_obs = to_tensor(next_obs_np)
        rb.add(obs, to_tensor(actions), to_tensor(reward), next_obs, to_tensor(term), next_valid)
        obs = next_obs

        ep_return, ep_length, fin_returns, fin_lengths = update_episode_stats(
            ep_return, ep_length, reward, next_valid, term | trunc
        )
        for r, length in zip(fin_returns, fin_lengths, strict=True):
            writer.add_scalar("charts/episodic_return", r, global_step)
            writer.add_scalar("charts/episodic_length", length, global_step)
            recent_returns = (recent_returns + [float(r)])[-20:]
        next_valid = ~(term | trunc)

        # --- update: one gradient step per env step ---
        if global_step > train_from:
            t0 = time.perf_counter()
            for _ in range(N):
                critic_updates += 1
                batch = rb.sample(args.batch_size)
                step_stats, actor_updated = update(
                    batch, actor, target_actor, critic, target_critic, q_optimizer, actor_optimizer, critic_updates, args
                )
                stats += step_stats
                num_critic_stats, num_actor_stats = num_critic_stats + 1, num_actor_stats + actor_updated
            update_seconds += time.perf_counter() - t0

        # --- logging: one host sync per log interval ---
        if global_step // args.log_every > (global_step - N) // args.log_every or global_step >= args.total_timesteps:
            if num_critic_stats:
                qf1_loss, qf2_loss, qf1_values, actor_loss = stats.tolist()
                writer.add_scalar("losses/qf1_loss", qf1_loss / num_critic_stats, global_step)
                if args.twin_critics:
                    writer.add_scalar("losses/qf2_loss", qf2_loss / num_critic_stats, global_step)
                writer.add_scalar("losses/qf1_values", qf1_values / num_critic_stats, global_step)
                if num_actor_stats:
                    writer.add_scalar("losses/actor_loss", actor_loss / num_actor_stats, global_step)
                stats, num_critic_stats, num_actor_stats = torch.zeros(4, device=device), 0, 0
            sps = int((global_step - start_step) / max(time.time() - start_time - eval_seconds, 1e-9))
            writer.add_scalar("charts/SPS", sps, global_step)
            if time.time() - last_print > args.progress_interval or global_step >= args.total_timesteps:
                last_print = time.time()
                eta = (args.total_timesteps - global_step) / max(sps, 1)
                mean_return = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
                print(
                    f"step {global_step:,}/{args.total_timesteps:,} ({100 * global_step / args.total_timesteps:.0f}%)"
                    f" | SPS {sps:,} | return {mean_return} (last {len(recent_returns)} episodes)"
                    f" | ETA {int(eta // 60)}m{int(eta % 60):02d}s",
                    flush=True,
                )

        # --- evaluation, checkpoint, stop requests ---
        if args.eval_every and global_step // args.eval_every > (global_step - N) // args.eval_every:
            t0 = time.time()
            video = os.path.join(run_dir, "videos", f"eval_{global_step}.mp4") if args.capture_video else None
            eval_returns = evaluate(actor, args, device, video)
            writer.add_scalar("eval/episodic_return", float(np.mean(eval_returns)), global_step)
            print(f"eval at step {global_step:,}: mean return {np.mean(eval_returns):.1f} over {len(eval_returns)} episodes")
            eval_seconds += time.time() - t0
        checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
        periodic = args.checkpoint_every and global_step // args.checkpoint_every > (global_step - N) // args.checkpoint_every
        if periodic or stop:
            save_checkpoint(checkpoint_path, checkpoint_state(args.save_buffer))
        if stop:
            writer.close()
            envs.close()
            resume = f"python {sys.argv[0]} --env-id {args.env_id} --resume {checkpoint_path}"
            print(f"stopped at step {global_step:,}; resume with: {resume}")
            sys.exit(128 + stop[0])

    envs.close()
    writer.flush()
    train_seconds = max(time.time() - start_time - eval_seconds, 1e-9)
    print(
        f"time: env steps {100 * env_seconds / train_seconds:.0f}%, acting {100 * act_seconds / train_seconds:.0f}%,"
        f" updates {100 * update_seconds / train_seconds:.0f}%,"
        f" replay writes and logging {100 * (1 - (env_seconds + act_seconds + update_seconds) / train_seconds):.0f}%"
    )

    # --- final model: saved, reloaded from disk, evaluated ---
    if args.save_model:
        model_path = os.path.join(run_dir, f"{args.algo}.model")
        state = dict(args=dataclasses.asdict(args), run_name=run_name, model=actor.state_dict(), critic=critic.state_dict())
        save_checkpoint(model_path, state)
        state = load_checkpoint(model_path, args.env_id)
        eval_actor = Actor(obs_dim, action_space, args.hidden_size).to(device)
        eval_actor.load_state_dict(state["model"])
        video = os.path.join(run_dir, "videos", "final.mp4") if args.capture_video else None
        eval_returns = evaluate(eval_actor, args, device, video)
        for r in eval_returns:  # all at the final step, one point per episode
            writer.add_scalar("eval/episodic_return", r, global_step)
        mean, std = np.mean(eval_returns), np.std(eval_returns)
        print(f"evaluation of {model_path}: mean return {mean:.1f} +- {std:.1f} over {len(eval_returns)} episodes")
        print(f"model: {model_path}")
    writer.close()
    print(f"tensorboard logs: {run_dir}   (view with: tensorboard --logdir runs)")


if __name__ == "__main__":
    main(parse_args())
