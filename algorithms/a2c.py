"""A2C, the synchronous A3C (Mnih et al. 2016), as SB3 and OpenAI Baselines run it; benchmark: `bash benchmark/a2c.sh`."""

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
    exp_name: str = "a2c"
    """name of this experiment, part of the run directory name"""
    env_id: str = "CartPole-v1"
    """envpool id (CartPole-v1, Breakout-v5, HalfCheetah-v4, ...) or any gymnasium id, including 'module:Env-v0'"""
    preset: Literal["auto", "classic", "atari", "mujoco"] = "auto"
    """defaults that reproduce a family's rl-baselines3-zoo reference: classic (SB3's A2C defaults, 8 envs x 5 steps,
    500k steps), atari (10M steps, 16 envs, ent 0.01, vf 0.25, TensorFlow-like RMSprop), mujoco (1M steps, 1 env x 5
    steps, observation normalisation); auto picks atari for image observations, mujoco for Box actions, classic
    otherwise"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final model to runs/<run>/a2c.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate the policy on separate envs every this many env steps (0: only after training, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    eval_deterministic: bool = False
    """evaluate the greedy policy (argmax / Gaussian mean); off by default, sampling as CleanRL's PPO evaluation does,
    since a greedy Atari policy can stall (never pressing FIRE) until the 27,000-step time limit"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    resume: str = ""
    """path of a checkpoint.pt to resume from; the run goes on in the same directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    log_interval: int = 100
    """iterations between loss, SPS and learning-rate logs (SB3's A2C default); losses are averaged over them"""

    # --- algorithm ---
    total_timesteps: int = 500_000
    """total env steps over all envs"""
    learning_rate: float = 7e-4
    """RMSprop learning rate"""
    num_envs: int = 8
    """parallel envs"""
    num_steps: int = 5
    """steps per env per rollout (the n of the n-step returns)"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0 (off, as in SB3; OpenAI Baselines anneals)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 1.0
    """lambda of generalised advantage estimation (1.0: plain n-step returns)"""
    rmsprop_alpha: float = 0.99
    """RMSprop smoothing constant"""
    rmsprop_eps: float = 1e-5
    """RMSprop epsilon"""
    rmsprop_tf_like: bool = False
    """RMSprop as TensorFlow computes it (epsilon inside the square root, mean square initialised to 1)"""
    norm_adv: bool = False
    """normalise advantages over the rollout"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient (the loss is the plain mean squared error, as in SB3 and Baselines)"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    norm_obs: bool = False
    """normalise observations with running statistics (clipped to +-10)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return (clipped to +-10)"""
    episodic_life: bool = True
    """Atari only: a lost life ends the training episode (the logged episode is still the full game)"""
    reward_clip: bool = True
    """Atari only: train on the sign of the reward (the logged return is still the raw score)"""

    # --- computed at start-up ---
    batch_size: tyro.conf.Suppress[int] = 0
    """num_envs * num_steps (computed)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """total_timesteps // batch_size (computed)"""


# rl-baselines3-zoo's hyperparams/a2c.yml on top of SB3's A2C defaults (lr 7e-4, 5 steps, gamma 0.99, lambda 1,
# vf 0.5, grad clip 0.5, RMSprop eps 1e-5), whose published results benchmark/a2c.sh reproduces. classic is its
# CartPole-v1 entry (Acrobot and MountainCar add 16 envs and normalisation in a2c.sh); mujoco its MuJoCo entries
# ("normalize" there is observations only). A preset only changes defaults: any flag given on the command line wins.
PRESETS = {
    "classic": dict(),
    "atari": dict(total_timesteps=10_000_000, num_envs=16, ent_coef=0.01, vf_coef=0.25, rmsprop_tf_like=True),
    "mujoco": dict(total_timesteps=1_000_000, num_envs=1, norm_obs=True),
}


def fail(message: str):
    """Bad input ends with one line on stderr and exit status 1, never a traceback."""
    raise SystemExit(f"a2c.py: error: {message}")


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


def make_env(env_id: str, num_envs: int, seed: int, episodic_life: bool, reward_clip: bool, render: bool = False):
    """A vector env with next-step autoreset: envpool when it has the id, gymnasium otherwise.

    Returns (envs, is_atari). After a step that ends an episode, the next step ignores its action and returns
    reward 0 and the first observation of the next episode; the training loop masks that step out.
    """
    render_kwargs = dict(render_mode="rgb_array") if render else {}
    if ":" not in env_id and env_id in envpool.list_all_envs():
        is_atari = hasattr(envpool.make_spec(env_id).config, "episodic_life")
        atari_kwargs = dict(episodic_life=episodic_life, reward_clip=reward_clip) if is_atari else {}
        envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **atari_kwargs, **render_kwargs)
        return envs, is_atari
    # gymnasium 1.x vector envs autoreset on the next step too, like envpool (AutoresetMode.NEXT_STEP)
    envs = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs=dict(autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP),
        **render_kwargs,
    )
    envs.reset(seed=seed)
    return envs, False


def can_render(env_id: str) -> bool:
    """envpool's MuJoCo renderer needs OpenGL and, where it has none, ends the whole process: try it in a child."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import a2c; "
        f"envs, _ = a2c.make_env({env_id!r}, 1, 0, False, False, render=True); envs.reset(); envs.render()"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


def update_episode_stats(ep_return, ep_length, raw_reward, valid, episode_end):
    """Running return and length per env; returns the new running values and the finished episodes' ones.

    `valid` is False on the reset step of the next-step autoreset (not a real transition, not counted).
    `episode_end` is the end of the logged episode: for Atari with episodic life, game over or truncation,
    not a lost life, so the logged return is the full game's raw score.
    """
    ep_return = ep_return + raw_reward
    ep_length = ep_length + valid
    finished_returns, finished_lengths = ep_return[episode_end], ep_length[episode_end]
    ep_return = np.where(episode_end, 0.0, ep_return)
    ep_length = np.where(episode_end, 0, ep_length)
    return ep_return, ep_length, finished_returns, finished_lengths


# ---------------------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------------------
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    # Huang et al. 2022, detail 2: orthogonal weights, zero biases
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor-critic chosen from the spaces: Nature CNN (shared trunk) for image observations, two separate
    64-64 tanh MLPs for vector observations; categorical policy for Discrete, Gaussian for Box actions."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space):
        super().__init__()
        obs_shape = obs_space.shape
        self.continuous = isinstance(action_space, gym.spaces.Box)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        if len(obs_shape) == 3:  # (C, H, W) uint8 frames; Mnih et al. 2015 Nature CNN
            self.encoder = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
            )
            with torch.no_grad():
                n_flat = self.encoder(torch.zeros(1, *obs_shape)).shape[1]
            self.encoder.append(layer_init(nn.Linear(n_flat, 512)))
            self.encoder.append(nn.ReLU())
            self.actor = layer_init(nn.Linear(512, n_out), std=0.01)
            self.critic = layer_init(nn.Linear(512, 1), std=1.0)
            self.scale = 1.0 / 255.0
        else:
            n_in = int(np.prod(obs_shape))
            self.encoder = nn.Flatten()
            self.actor = nn.Sequential(
                layer_init(nn.Linear(n_in, 64)),
                nn.Tanh(),
                layer_init(nn.Linear(64, 64)),
                nn.Tanh(),
                layer_init(nn.Linear(64, n_out), std=0.01),
            )
            self.critic = nn.Sequential(
                layer_init(nn.Linear(n_in, 64)),
                nn.Tanh(),
                layer_init(nn.Linear(64, 64)),
                nn.Tanh(),
                layer_init(nn.Linear(64, 1), std=1.0),
            )
            self.scale = 1.0
        if self.continuous:
            # Huang et al. 2022, continuous detail 2: state-independent log std, initialised to 0
            self.actor_logstd = nn.Parameter(torch.zeros(1, n_out))

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        # frames stay uint8 in storage and become float only here
        return self.encoder(x.float() * self.scale)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.hidden(x)).squeeze(-1)

    def distribution(self, h: torch.Tensor) -> torch.distributions.Distribution:
        # validate_args=False: argument checks cost a host sync per call on CUDA
        if self.continuous:
            mean = self.actor(h)
            return torch.distributions.Normal(mean, self.actor_logstd.expand_as(mean).exp(), validate_args=False)
        return torch.distributions.Categorical(logits=self.actor(h), validate_args=False)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None, deterministic: bool = False):
        h = self.hidden(x)
        dist = self.distribution(h)
        if action is None:
            if deterministic:
                action = dist.mean if self.continuous else dist.probs.argmax(-1)
            else:
                action = dist.sample()
        logprob, entropy = dist.log_prob(action), dist.entropy()
        if self.continuous:
            logprob, entropy = logprob.sum(-1), entropy.sum(-1)
        return action, logprob, entropy, self.critic(h).squeeze(-1)


# ---------------------------------------------------------------------------------------------------------------
# Running statistics for observation and reward normalisation
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

    def update(self, x: torch.Tensor) -> None:
        x = x.double()
        self.mean, self.var, self.count = update_mean_var_count(
            self.mean, self.var, self.count, x.mean(0), x.var(0, unbiased=False), x.shape[0]
        )

    def state_dict(self) -> dict:
        return dict(mean=self.mean.cpu(), var=self.var.cpu(), count=self.count.cpu())

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = (state[k].to(self.mean.device) for k in ("mean", "var", "count"))


def normalize_obs(obs: torch.Tensor, rms: RunningMeanStd | None, clip: float = 10.0) -> torch.Tensor:
    if rms is None:
        return obs
    return ((obs - rms.mean) / torch.sqrt(rms.var + 1e-8)).clamp(-clip, clip).float()


def scale_reward(reward, discounted_return, done, rms: RunningMeanStd, gamma: float, clip: float = 10.0):
    """Divide rewards by the running std of the discounted return (Huang et al. 2022, continuous detail 6).

    Every step counts as a sample, as in gymnasium's NormalizeReward: the reset step's return is 0, and
    skipping it would need a host sync per step. Returns (scaled reward, discounted return for the next step).
    """
    discounted_return = discounted_return * gamma + reward
    rms.update(discounted_return.unsqueeze(-1))
    scaled = (reward / torch.sqrt(rms.var + 1e-8)).clamp(-clip, clip).float()
    return scaled, torch.where(done, torch.zeros_like(discounted_return), discounted_return)


# ---------------------------------------------------------------------------------------------------------------
# The algorithm's maths
# ---------------------------------------------------------------------------------------------------------------
def compute_gae(rewards, values, next_value, terminations, dones, valid, gamma: float, gae_lambda: float):
    """Generalised advantage estimation (Schulman et al. 2016) over a (num_steps, num_envs) rollout.

    With next-step autoreset the observation after a truncated step is the real final observation, so
    values[t + 1] is V(final obs): truncation bootstraps from it, termination does not (its value is
    multiplied by 0). `dones` (termination or truncation) cuts the recursion. The reset step that follows
    (valid = 0) gets advantage 0 and is masked out of the loss.
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues * (1.0 - terminations[t]) - values[t]
        lastgaelam = (delta + gamma * gae_lambda * (1.0 - dones[t]) * lastgaelam) * valid[t]
        advantages[t] = lastgaelam
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def a2c_loss(
    logprob,
    entropy,
    value,
    advantages,
    returns,
    mask,
    ent_coef: float,
    vf_coef: float,
    norm_adv: bool,
):
    """Policy gradient + value regression - entropy bonus over the valid entries of the rollout (Mnih et al. 2016).

    Returns the total loss and, detached, (policy loss, value loss, entropy).
    """
    if norm_adv:
        mean = masked_mean(advantages, mask)
        var = ((advantages - mean) ** 2 * mask).sum() / (mask.sum() - 1.0).clamp(min=1.0)
        advantages = (advantages - mean) / (var.sqrt() + 1e-8)
    pg_loss = masked_mean(-advantages.detach() * logprob, mask)
    # the plain mean squared error, as SB3's and Baselines' A2C (ppo.py halves it), so vf_coef means what it does there
    v_loss = masked_mean((value - returns) ** 2, mask)
    entropy_loss = masked_mean(entropy, mask)
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    return loss, torch.stack([pg_loss, v_loss, entropy_loss]).detach()


class RMSpropTF(torch.optim.Optimizer):
    """RMSprop as TensorFlow 1 computes it, and so OpenAI Baselines' A2C: epsilon inside the square root and the mean
    square initialised to 1, which keeps the first steps small (SB3's RMSpropTFLike, used by rl-baselines3-zoo on Atari)."""

    def __init__(self, params, lr: float, alpha: float, eps: float):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.state[p]["square_avg"] = torch.ones_like(p)
                square_avg = self.state[p]["square_avg"]
                square_avg.mul_(group["alpha"]).addcmul_(p.grad, p.grad, value=1.0 - group["alpha"])
                p.addcdiv_(p.grad, (square_avg + group["eps"]).sqrt(), value=-group["lr"])


def make_optimizer(params, args: Args) -> torch.optim.Optimizer:
    # alpha 0.99 and eps 1e-5 as Baselines and SB3, not PyTorch's eps 1e-8: the step is lr * g / (sqrt(mean g^2) + eps),
    # so a tiny eps blows near-zero gradients up to full-size steps, noise with a 5-step rollout; 1e-5 damps them.
    # A3C was tuned with TensorFlow's RMSprop (Mnih et al. 2016), whose eps sits inside the root: --rmsprop-tf-like.
    if args.rmsprop_tf_like:
        return RMSpropTF(params, lr=args.learning_rate, alpha=args.rmsprop_alpha, eps=args.rmsprop_eps)
    return torch.optim.RMSprop(params, lr=args.learning_rate, alpha=args.rmsprop_alpha, eps=args.rmsprop_eps)


def annealed_lr(learning_rate: float, iteration: int, num_iterations: int, anneal: bool) -> float:
    """Linear decay from learning_rate at iteration 1 towards 0 after the last (Huang et al. 2022, detail 4)."""
    if not anneal:
        return learning_rate
    return learning_rate * (1.0 - (iteration - 1.0) / num_iterations)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    resid = returns - values
    var_resid = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return torch.where(var_returns > 0, 1 - var_resid / var_returns, torch.full_like(var_returns, float("nan")))


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
        fail(f"checkpoint '{path}' does not exist; pass the checkpoint.pt or a2c.model of an earlier run")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        fail(f"checkpoint '{path}' cannot be read ({type(e).__name__}: {e}); it is not an a2c.py checkpoint")
    if not isinstance(state, dict) or "model" not in state or "args" not in state:
        fail(f"'{path}' is not an a2c.py checkpoint (it has no model and args)")
    if env_id is not None and state["args"]["env_id"] != env_id:
        fail(f"checkpoint '{path}' is for {state['args']['env_id']}, not {env_id}; pass --env-id {state['args']['env_id']}")
    return state


def evaluate(
    agent: Agent,
    obs_rms: RunningMeanStd | None,
    args: Args,
    device: torch.device,
    video_path: str | None = None,
) -> np.ndarray:
    """Play one full episode (raw score, no life loss, no reward clipping) on each of args.eval_episodes envs.

    Normalisation statistics are frozen. Returns the episodes' returns. Video: env 0's episode, when it renders.
    """
    envs, _ = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, False, False, render=video_path is not None)
    obs, _ = envs.reset()
    returns, finished = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool)
    frames = []
    while not finished.all():
        if video_path is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        with torch.no_grad():
            x = normalize_obs(torch.as_tensor(obs, device=device), obs_rms)
            action = agent.get_action_and_value(x, deterministic=args.eval_deterministic)[0].cpu().numpy()
        if agent.continuous:
            action = np.clip(action, envs.single_action_space.low, envs.single_action_space.high)
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
    """tyro CLI whose defaults are the chosen preset's, so that --help shows the values a run will use."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env-id", "--env_id", dest="env_id", default=Args.env_id)
    pre.add_argument("--preset", default=Args.preset)
    known, _ = pre.parse_known_args(argv)
    preset = known.preset
    if preset == "auto":
        obs_space, action_space = env_spaces(known.env_id)
        image = len(obs_space.shape or ()) == 3
        preset = "atari" if image else "mujoco" if isinstance(action_space, gym.spaces.Box) else "classic"
    defaults = Args(env_id=known.env_id, **PRESETS.get(preset, {}))
    return tyro.cli(Args, default=defaults, args=argv, description=__doc__)


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        fail(f"a2c.py handles Discrete and Box action spaces; {args.env_id} has {action_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail(f"a2c.py needs a vector or a (C, H, W) image observation; {args.env_id} has {obs_space}")
    if args.num_envs < 1 or args.num_steps < 1 or args.log_interval < 1:
        fail("--num-envs, --num-steps and --log-interval must be at least 1")
    if args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout ({args.batch_size} steps)")
    if args.eval_episodes < 1:
        fail("--eval-episodes must be at least 1")


def main(args: Args) -> None:
    # --- set-up ---
    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(args.resume, args.env_id)
        computed = ("resume", "batch_size", "num_iterations")
        differ = [k for k, v in ckpt["args"].items() if k not in computed and getattr(args, k) != v]
        if differ:
            print(f"resuming with the checkpoint's arguments, which differ from this command line in: {', '.join(differ)}")
        args = Args(**{**ckpt["args"], "resume": args.resume})
    args.batch_size = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // max(args.batch_size, 1)
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

    agent = Agent(obs_space, action_space).to(device)
    optimizer = make_optimizer(agent.parameters(), args)
    obs_rms = RunningMeanStd(obs_space.shape, device) if args.norm_obs else None
    return_rms = RunningMeanStd((), device) if args.norm_reward else None
    global_step, start_iteration = 0, 1
    if ckpt:
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if obs_rms is not None:
            obs_rms.load_state_dict(ckpt["obs_rms"])
        if return_rms is not None:
            return_rms.load_state_dict(ckpt["return_rms"])
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        print(f"resumed {run_dir} at step {global_step:,}")

    # purge_step: a run resumed after a hard kill drops the events logged after its checkpoint, so no step repeats
    writer = SummaryWriter(run_dir, purge_step=global_step + 1 if ckpt else None)
    if not ckpt:
        table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    # envs are not restored by a resume, so its envs take a fresh seed
    envs, is_atari = make_env(args.env_id, args.num_envs, args.seed + global_step, args.episodic_life, args.reward_clip)
    continuous = isinstance(action_space, gym.spaces.Box)
    low, high = (action_space.low, action_space.high) if continuous else (None, None)

    def checkpoint_state(iteration: int) -> dict:
        rng = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())
        rng["cuda"] = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
        return dict(
            args=dataclasses.asdict(args),
            run_name=run_name,
            model=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            obs_rms=obs_rms.state_dict() if obs_rms else None,
            return_rms=return_rms.state_dict() if return_rms else None,
            global_step=global_step,
            iteration=iteration,
            rng=rng,
        )

    # Ctrl-C and SIGTERM finish the current iteration, write a checkpoint and exit; a second one kills at once
    stop = []

    def request_stop(signum, _frame):
        stop.append(signum)
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    # rollout storage, preallocated on the device; frames stay uint8
    T, N = args.num_steps, args.num_envs
    obs_dtype = torch.uint8 if len(obs_space.shape) == 3 else torch.float32
    obs = torch.zeros((T, N) + obs_space.shape, dtype=obs_dtype, device=device)
    actions = torch.zeros((T, N) + action_space.shape, dtype=torch.float32 if continuous else torch.long, device=device)
    rewards, terminations, dones, values, valid = (torch.zeros((T, N), device=device) for _ in range(5))

    def obs_to_tensor(o: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(o, device=device)
        x = x if obs_dtype == torch.uint8 else x.float()
        if obs_rms is not None:
            obs_rms.update(x)
            x = normalize_obs(x, obs_rms)
        return x

    next_obs = obs_to_tensor(envs.reset()[0])
    next_valid = np.ones(N, dtype=bool)  # False on the reset step that follows a done
    discounted_return = torch.zeros(N, dtype=torch.float64, device=device)
    ep_return, ep_length = np.zeros(N), np.zeros(N, dtype=np.int64)
    recent_returns: list[float] = []
    start_time, start_step, eval_seconds, last_print = time.time(), global_step, 0.0, 0.0
    stats, num_updates = torch.zeros(3, device=device), 0  # summed over the log interval, on the device

    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = annealed_lr(args.learning_rate, iteration, args.num_iterations, args.anneal_lr)
        optimizer.param_groups[0]["lr"] = lr

        # --- rollout ---
        for step in range(T):
            global_step += N
            obs[step] = next_obs
            with torch.no_grad():
                action, _, _, value = agent.get_action_and_value(next_obs)
            actions[step], values[step] = action, value
            env_action = action.cpu().numpy()
            if continuous:  # the Gaussian sample is stored unclipped; only the env sees the clipped action
                env_action = np.clip(env_action, low, high)
            next_obs_np, reward, term, trunc, info = envs.step(env_action)
            done = term | trunc
            step_data = torch.as_tensor(np.stack([reward, term, done, next_valid]), dtype=torch.float32, device=device)
            rewards[step], terminations[step], dones[step], valid[step] = step_data
            if return_rms is not None:
                rewards[step], discounted_return = scale_reward(
                    step_data[0].double(), discounted_return, step_data[2].bool(), return_rms, args.gamma
                )
            next_obs = obs_to_tensor(next_obs_np)

            # episode statistics on the raw score of the full game (envpool's info["reward"], info["terminated"])
            raw_reward = info["reward"] if is_atari else reward
            episode_end = (info["terminated"].astype(bool) | trunc) if is_atari else done
            ep_return, ep_length, fin_returns, fin_lengths = update_episode_stats(
                ep_return, ep_length, raw_reward, next_valid, episode_end
            )
            for r, length in zip(fin_returns, fin_lengths, strict=True):
                writer.add_scalar("charts/episodic_return", r, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
                recent_returns = (recent_returns + [float(r)])[-20:]
            next_valid = ~done

        # --- advantages ---
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            advantages, returns = compute_gae(
                rewards, values, next_value, terminations, dones, valid, args.gamma, args.gae_lambda
            )
        b_obs = obs.reshape((-1,) + obs_space.shape)
        b_actions = actions.reshape((-1,) + action_space.shape)
        b_advantages, b_returns, b_values, b_valid = (x.reshape(-1) for x in (advantages, returns, values, valid))

        # --- update: one gradient step on the whole rollout ---
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs, b_actions)
        loss, step_stats = a2c_loss(
            newlogprob, entropy, newvalue, b_advantages, b_returns, b_valid, args.ent_coef, args.vf_coef, args.norm_adv
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        stats += step_stats
        num_updates += 1

        # --- logging: one host sync per log interval, since 5-step rollouts make an iteration short ---
        sps = int((global_step - start_step) / max(time.time() - start_time - eval_seconds, 1e-9))
        if iteration % args.log_interval == 0 or iteration == args.num_iterations or stop:
            pg_loss, v_loss, entropy_loss = (stats / num_updates).tolist()
            stats, num_updates = torch.zeros(3, device=device), 0
            writer.add_scalar("charts/learning_rate", lr, global_step)
            writer.add_scalar("losses/value_loss", v_loss, global_step)
            writer.add_scalar("losses/policy_loss", pg_loss, global_step)
            writer.add_scalar("losses/entropy", entropy_loss, global_step)
            writer.add_scalar(
                "losses/explained_variance", explained_variance(b_values, b_returns, b_valid).item(), global_step
            )
            writer.add_scalar("charts/SPS", sps, global_step)
        if time.time() - last_print > args.progress_interval or iteration == args.num_iterations:
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
        if args.eval_every and global_step // args.eval_every > (global_step - args.batch_size) // args.eval_every:
            t0 = time.time()
            video = os.path.join(run_dir, "videos", f"eval_{global_step}.mp4") if args.capture_video else None
            eval_returns = evaluate(agent, obs_rms, args, device, video)
            writer.add_scalar("eval/episodic_return", float(np.mean(eval_returns)), global_step)
            print(f"eval at step {global_step:,}: mean return {np.mean(eval_returns):.1f} over {len(eval_returns)} episodes")
            eval_seconds += time.time() - t0
        checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
        periodic = (
            args.checkpoint_every
            and global_step // args.checkpoint_every > (global_step - args.batch_size) // args.checkpoint_every
        )
        if periodic or stop:
            save_checkpoint(checkpoint_path, checkpoint_state(iteration))
        if stop:
            writer.close()
            envs.close()
            resume = f"python {sys.argv[0]} --env-id {args.env_id} --resume {checkpoint_path}"
            print(f"stopped at step {global_step:,}; resume with: {resume}")
            sys.exit(128 + stop[0])

    envs.close()
    writer.flush()

    # --- final model: saved, reloaded from disk, evaluated with frozen statistics ---
    if args.save_model:
        model_path = os.path.join(run_dir, "a2c.model")
        save_checkpoint(
            model_path,
            dict(
                args=dataclasses.asdict(args),
                run_name=run_name,
                model=agent.state_dict(),
                obs_rms=obs_rms.state_dict() if obs_rms else None,
            ),
        )
        state = load_checkpoint(model_path, args.env_id)
        eval_agent = Agent(obs_space, action_space).to(device)
        eval_agent.load_state_dict(state["model"])
        eval_rms = None
        if state["obs_rms"] is not None:
            eval_rms = RunningMeanStd(obs_space.shape, device)
            eval_rms.load_state_dict(state["obs_rms"])
        video = os.path.join(run_dir, "videos", "final.mp4") if args.capture_video else None
        eval_returns = evaluate(eval_agent, eval_rms, args, device, video)
        for r in eval_returns:  # all at the final step, one point per episode
            writer.add_scalar("eval/episodic_return", r, global_step)
        mean, std = np.mean(eval_returns), np.std(eval_returns)
        print(f"evaluation of {model_path}: mean return {mean:.1f} +- {std:.1f} over {len(eval_returns)} episodes")
        print(f"model: {model_path}")
    writer.close()
    print(f"tensorboard logs: {run_dir}   (view with: tensorboard --logdir runs)")


if __name__ == "__main__":
    main(parse_args())
