"""DQN (Mnih et al. 2015) and Double DQN (van Hasselt et al. 2016); benchmark: `bash benchmark/dqn.sh`."""

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
    exp_name: str = "dqn"
    """name of this experiment, part of the run directory name"""
    env_id: str = "CartPole-v1"
    """envpool id (CartPole-v1, Breakout-v5, ...) or any gymnasium id with Discrete actions, including 'module:Env-v0'"""
    env_backend: Literal["auto", "envpool", "gymnasium"] = "auto"
    """who steps the envs: envpool (C++ worker threads) or a gymnasium vector env in this process; auto takes
    gymnasium for a single classic-control env that does not render, whose Python step (13-46 us) is cheaper than
    envpool's hand-off to its worker thread (~65 us), and envpool for everything else it has"""
    preset: Literal["auto", "classic", "atari"] = "auto"
    """defaults that reproduce a family's reference: classic (CleanRL dqn.py), atari (CleanRL dqn_atari.py: 10M steps,
    1M buffer, lr 1e-4, batch 32, train every 4 steps, target copy every 1000); auto picks atari for image observations"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final model to runs/<run>/dqn.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate the policy on separate envs every this many env steps (0: only after training, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    eval_epsilon: float = 0.05
    """evaluation is epsilon-greedy with this epsilon (CleanRL's evaluation: 0.05), so that a greedy Atari policy
    that never presses FIRE cannot stall until the time limit"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    save_buffer: bool = False
    """put the replay buffer in checkpoint.pt (about 7 GB for the Atari preset); a resume without it refills the
    buffer for --learning-starts steps before updating again and has lost the experience gathered so far"""
    resume: str = ""
    """path of a checkpoint.pt to resume from; the run goes on in the same directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    log_every: int = 1000
    """env steps between the loss, epsilon and SPS scalars"""

    # --- algorithm ---
    total_timesteps: int = 500_000
    """total env steps over all envs"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    num_envs: int = 1
    """parallel envs, all feeding one replay buffer"""
    buffer_size: int = 10_000
    """replay buffer capacity in env steps over all envs (each env gets buffer_size // num_envs)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target network update rate: 1.0 copies the online network, less is Polyak averaging"""
    target_network_frequency: int = 500
    """env steps between target network updates"""
    batch_size: int = 128
    """transitions per gradient step"""
    start_e: float = 1.0
    """epsilon at the start of the linear exploration schedule"""
    end_e: float = 0.05
    """epsilon at the end of the schedule and after it"""
    exploration_fraction: float = 0.5
    """fraction of total_timesteps over which epsilon goes from start_e to end_e"""
    learning_starts: int = 10_000
    """env steps of experience gathered before the first gradient step"""
    train_frequency: int = 10
    """env steps per gradient step (with several envs, several gradient steps per vector step when needed)"""
    double_q: bool = False
    """Double DQN (van Hasselt et al. 2016): the online network picks the next action, the target network values it"""
    loss: Literal["mse", "huber"] = "mse"
    """TD loss: mse as CleanRL's dqn.py and dqn_atari.py (whose results the presets reproduce); huber is the error
    clipping of Mnih et al. 2015"""
    max_grad_norm: float = 0.0
    """global gradient norm clip (0: none, as CleanRL and Mnih et al. 2015)"""
    episodic_life: bool = True
    """Atari only: a lost life ends the training episode (the logged episode is still the full game)"""
    reward_clip: bool = True
    """Atari only: train on the sign of the reward (the logged return is still the raw score)"""


# The settings of CleanRL's dqn.py and dqn_atari.py, whose published results benchmark/dqn.sh reproduces.
# A preset only changes defaults: any flag given on the command line wins.
PRESETS = {
    "classic": dict(),
    "atari": dict(
        total_timesteps=10_000_000,
        learning_rate=1e-4,
        buffer_size=1_000_000,
        target_network_frequency=1000,
        batch_size=32,
        end_e=0.01,
        exploration_fraction=0.10,
        learning_starts=80_000,
        train_frequency=4,
    ),
}


def fail(message: str):
    """Bad input ends with one line on stderr and exit status 1, never a traceback."""
    raise SystemExit(f"dqn.py: error: {message}")


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


def pick_backend(env_id: str, num_envs: int, backend: str, render: bool = False) -> str:
    """The backend that steps env_id (see Args.env_backend); a clear error where the chosen one lacks the id.
    auto renders with envpool, since gymnasium's classic-control renderer needs pygame, which is not installed."""
    in_envpool = ":" not in env_id and env_id in envpool.list_all_envs()
    spec = gym.registry.get(env_id)
    classic = spec is not None and str(spec.entry_point).startswith("gymnasium.envs.classic_control")
    if backend == "auto":
        return "gymnasium" if not in_envpool or (classic and num_envs == 1 and not render) else "envpool"
    if backend == "envpool" and not in_envpool:
        fail(f"envpool has no env '{env_id}'; pass --env-backend gymnasium (or auto)")
    if backend == "gymnasium" and spec is None and ":" not in env_id:
        fail(f"gymnasium has no env '{env_id}' registered; pass --env-backend envpool (or auto)")
    return backend


def make_env(env_id: str, num_envs: int, seed: int, episodic_life: bool, reward_clip: bool, backend: str, render=False):
    """A vector env with next-step autoreset, from the backend pick_backend chooses.

    Returns (envs, is_atari). After a step that ends an episode, the next step ignores its action and returns
    reward 0 and the first observation of the next episode; that step never enters the replay buffer.
    """
    render_kwargs = dict(render_mode="rgb_array") if render else {}
    if pick_backend(env_id, num_envs, backend, render) == "envpool":
        is_atari = hasattr(envpool.make_spec(env_id).config, "episodic_life")
        atari_kwargs = dict(episodic_life=episodic_life, reward_clip=reward_clip) if is_atari else {}
        envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **atari_kwargs, **render_kwargs)
        return envs, is_atari
    # gymnasium 1.x vector envs autoreset on the next step too, like envpool (AutoresetMode.NEXT_STEP)
    envs = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        # copy=False: each step's observations are copied into the replay buffer before the next step overwrites them
        vector_kwargs=dict(autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP, copy=False),
        **render_kwargs,
    )
    envs.reset(seed=seed)
    return envs, False


def can_render(env_id: str, backend: str) -> bool:
    """envpool's MuJoCo renderer needs OpenGL and, where it has none, ends the whole process: try it in a child."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import dqn; "
        f"envs, _ = dqn.make_env({env_id!r}, 1, 0, False, False, {backend!r}, render=True); envs.reset(); envs.render()"
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
# Replay buffer
# ---------------------------------------------------------------------------------------------------------------
class ReplayBuffer:
    """Preallocated replay memory holding each observation once, in time order per env.

    Slot t of env e holds the observation the env returned at its step t (for envpool Atari only the newest 84x84
    frame of the 4-frame stack), with the action taken from it, the reward, the termination flag, and whether
    t -> t+1 is a real transition. The next observation of slot t is slot t+1, so nothing is stored twice: a 1M
    Atari buffer is 1M frames (7 GB) instead of 2M stacks (56 GB). The reset step of the next-step autoreset
    occupies no transition: the final observation's slot is marked not valid, since its successor is the next
    episode's first observation.

    Stacks are rebuilt as envpool 1.2.5 builds them (tests/test_dqn.py checks this against envpool): after a full
    reset (game over or truncation) the stack is four copies of the first frame, so the slot is marked `first`
    and no older frame is read through it; after a life loss under episodic life the stack carries on across
    the reset step, so a life loss is no boundary for frames. The `stack - 1` oldest slots of a full buffer are
    not sampled, since their stacks reach into overwritten slots.
    """

    def __init__(self, capacity: int, num_envs: int, obs_shape: tuple, obs_dtype, stack: int, seed: int):
        self.capacity, self.num_envs, self.stack, self.obs_shape = capacity, num_envs, stack, tuple(obs_shape)
        frame_shape = self.obs_shape[1:] if stack > 1 else self.obs_shape
        self.frames = np.zeros((capacity, num_envs) + frame_shape, dtype=obs_dtype)
        self.actions = np.zeros((capacity, num_envs), dtype=np.int64)
        self.rewards = np.zeros((capacity, num_envs), dtype=np.float32)
        self.terminations = np.zeros((capacity, num_envs), dtype=np.float32)
        self.valid = np.zeros((capacity, num_envs), dtype=bool)
        self.first = np.zeros((capacity, num_envs), dtype=bool)
        self.pos, self.size = -1, 0  # pos: slot of the newest observation
        self.rng = np.random.default_rng(seed)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.frames, self.actions, self.rewards, self.terminations, self.valid, self.first))

    def _write_obs(self, obs: np.ndarray, first) -> None:
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.frames[self.pos] = obs[:, -1] if self.stack > 1 else obs
        self.first[self.pos] = first
        self.valid[self.pos] = False  # its transition is not complete yet (and an overwritten one is gone)

    def start(self, obs: np.ndarray) -> None:
        """The observations of freshly reset envs (the start of training, or of a resumed run)."""
        self._write_obs(obs, True)

    def add(self, actions, rewards, terminations, valid, next_obs: np.ndarray, next_first) -> None:
        """Complete the newest slot's transition and store next_obs after it.

        valid: False where this step was the reset step of the next-step autoreset (never a transition).
        next_first: True where next_obs is the first observation of a full reset (game over or truncation).
        """
        p = self.pos
        self.actions[p], self.rewards[p], self.terminations[p], self.valid[p] = actions, rewards, terminations, valid
        self._write_obs(next_obs, next_first)

    def sampleable(self, slots: np.ndarray, envs: np.ndarray) -> np.ndarray:
        ok = self.valid[slots, envs]
        if self.size == self.capacity and self.stack > 1:
            age = (slots - self.pos) % self.capacity  # 1 = the oldest slot
            ok &= age >= self.stack
        return ok

    def stacks(self, slots: np.ndarray, envs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Observations and next observations of the transitions at (slots, envs)."""
        if self.stack == 1:
            return self.frames[slots, envs], self.frames[(slots + 1) % self.capacity, envs]
        k = self.stack
        window = (slots[:, None] + np.arange(-k + 1, 2)) % self.capacity  # k - 1 older slots, the slot, the next one
        first = self.first[window, envs[:, None]]
        rows = np.arange(len(slots))[:, None]

        def rebuild(lo: int) -> np.ndarray:
            # frames before the newest episode start inside the window repeat that start's frame, as envpool's reset
            start = (first[:, lo : lo + k] * np.arange(k)).max(1, keepdims=True)
            cols = lo + np.maximum(np.arange(k), start)
            return self.frames[window[rows, cols], envs[:, None]]

        return rebuild(0), rebuild(1)

    def sample(self, batch_size: int, device: torch.device):
        slots = self.rng.integers(0, self.size, batch_size)
        envs = self.rng.integers(0, self.num_envs, batch_size)
        for _ in range(1000):  # rejection sampling: almost every slot is a valid transition
            bad = ~self.sampleable(slots, envs)
            if not bad.any():
                break
            slots[bad] = self.rng.integers(0, self.size, int(bad.sum()))
            envs[bad] = self.rng.integers(0, self.num_envs, int(bad.sum()))
        else:
            raise RuntimeError("the replay buffer holds no complete transition")
        obs, next_obs = self.stacks(slots, envs)
        to = lambda x: torch.from_numpy(x).to(device)  # noqa: E731
        return (
            to(obs),
            to(self.actions[slots, envs]),
            to(self.rewards[slots, envs]),
            to(next_obs),
            to(self.terminations[slots, envs]),
        )

    def state_dict(self) -> dict:
        # torch.from_numpy shares the memory: torch.save writes a 7 GB buffer without copying it first
        arrays = dict(frames=self.frames, actions=self.actions, rewards=self.rewards, terminations=self.terminations)
        arrays.update(valid=self.valid, first=self.first)
        return {**{k: torch.from_numpy(v) for k, v in arrays.items()}, "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        for k in ("frames", "actions", "rewards", "terminations", "valid", "first"):
            getattr(self, k)[...] = state[k].numpy()
        self.pos, self.size = state["pos"], state["size"]


# ---------------------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------------------
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    # Huang et al. 2022, detail 2: orthogonal weights, zero biases
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """Q-values of every action: Nature CNN (Mnih et al. 2015) for (C, H, W) frames, a 120-84 ReLU MLP (CleanRL
    dqn.py) for vector observations."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space):
        super().__init__()
        obs_shape, n_actions = obs_space.shape, int(action_space.n)
        if len(obs_shape) == 3:
            encoder = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
            )
            with torch.no_grad():
                n_flat = encoder(torch.zeros(1, *obs_shape)).shape[1]
            self.network = nn.Sequential(*encoder, layer_init(nn.Linear(n_flat, 512)), nn.ReLU())
            self.network.append(layer_init(nn.Linear(512, n_actions), std=1.0))
            self.scale = 1.0 / 255.0
        else:
            # no nn.Flatten: observations are already vectors, and every op costs microseconds on a net this small
            self.network = nn.Sequential(
                layer_init(nn.Linear(obs_shape[0], 120)),
                nn.ReLU(),
                layer_init(nn.Linear(120, 84)),
                nn.ReLU(),
                layer_init(nn.Linear(84, n_actions), std=1.0),
            )
            self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # frames stay uint8 in the buffer and become float only here
        x = x.float()
        return self.network(x * self.scale if self.scale != 1.0 else x)


# ---------------------------------------------------------------------------------------------------------------
# The algorithm's maths
# ---------------------------------------------------------------------------------------------------------------
def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon from start_e at step 0 to end_e at step `duration`, then constant (Mnih et al. 2015)."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def td_target(rewards, terminations, next_q_target, gamma: float, next_q_online=None):
    """r + gamma * (1 - terminated) * Q_target(s', a'): the target network's max (DQN), or, given the online
    network's next Q-values, its argmax valued by the target network (Double DQN, van Hasselt et al. 2016).

    A truncated transition has terminations 0 and bootstraps from the real final observation s'.
    """
    if next_q_online is None:
        next_value = next_q_target.max(1).values
    else:
        next_value = next_q_target.gather(1, next_q_online.argmax(1, keepdim=True)).squeeze(1)
    return rewards + gamma * next_value * (1.0 - terminations)


def q_loss(q_values, actions, targets, loss: str):
    """TD loss of the taken actions' Q-values; returns (loss, mean Q of the taken actions)."""
    q_taken = q_values.gather(1, actions.unsqueeze(1)).squeeze(1)
    if loss == "huber":
        value = nn.functional.smooth_l1_loss(q_taken, targets)
    else:
        value = nn.functional.mse_loss(q_taken, targets)
    return value, q_taken.mean()


def soft_update(target_network: nn.Module, q_network: nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target; tau = 1 is the hard copy of Mnih et al. 2015."""
    with torch.no_grad():
        for t, q in zip(target_network.parameters(), q_network.parameters(), strict=True):
            if tau < 1.0:
                t.mul_(1.0 - tau).add_(q, alpha=tau)
            else:
                t.copy_(q)


def select_actions(q_network: nn.Module, obs: torch.Tensor, epsilon: float, n_actions: int, rng: np.random.Generator):
    """Epsilon-greedy per env; the network runs only when some env acts greedily, and random actions are drawn only
    for the envs that explore."""
    explore = rng.random(obs.shape[0]) < epsilon
    if explore.all():
        return rng.integers(0, n_actions, obs.shape[0])
    with torch.no_grad():
        actions = q_network(obs).argmax(1).cpu().numpy()
    if explore.any():
        actions[explore] = rng.integers(0, n_actions, int(explore.sum()))
    return actions


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
        fail(f"checkpoint '{path}' does not exist; pass the checkpoint.pt or dqn.model of an earlier run")
    try:
        # mmap: a saved replay buffer (gigabytes) is paged in while it is copied, not read into memory first
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:
        fail(f"checkpoint '{path}' cannot be read ({type(e).__name__}: {e}); it is not a dqn.py checkpoint")
    if not isinstance(state, dict) or "model" not in state or "args" not in state:
        fail(f"'{path}' is not a dqn.py checkpoint (it has no model and args)")
    if env_id is not None and state["args"]["env_id"] != env_id:
        fail(f"checkpoint '{path}' is for {state['args']['env_id']}, not {env_id}; pass --env-id {state['args']['env_id']}")
    return state


def evaluate(q_network: QNetwork, args: Args, device: torch.device, video_path: str | None = None) -> np.ndarray:
    """Play one full episode (raw score, no life loss, no reward clipping) on each of args.eval_episodes envs,
    epsilon-greedy with args.eval_epsilon. Returns the episodes' returns. Video: env 0's episode, when it renders.
    """
    render = video_path is not None
    envs, _ = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, False, False, args.env_backend, render)
    rng = np.random.default_rng(args.seed + 100_000)  # its own generator: evaluating does not change training
    n_actions = int(envs.single_action_space.n)
    obs, _ = envs.reset()
    returns, finished = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool)
    frames = []
    while not finished.all():
        if video_path is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        action = select_actions(q_network, torch.as_tensor(obs, device=device), args.eval_epsilon, n_actions, rng)
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
        obs_space, _ = env_spaces(known.env_id)
        preset = "atari" if len(obs_space.shape or ()) == 3 else "classic"
    defaults = Args(env_id=known.env_id, **PRESETS.get(preset, {}))
    return tyro.cli(Args, default=defaults, args=argv, description=__doc__)


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    if isinstance(action_space, gym.spaces.Box):
        fail(f"dqn.py needs Discrete actions; {args.env_id} has {action_space}: use ddpg_td3.py for continuous actions")
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(f"dqn.py handles Discrete action spaces; {args.env_id} has {action_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail(f"dqn.py needs a vector or a (C, H, W) image observation; {args.env_id} has {obs_space}")
    if args.num_envs < 1 or args.batch_size < 1 or args.train_frequency < 1 or args.target_network_frequency < 1:
        fail("--num-envs, --batch-size, --train-frequency and --target-network-frequency must be at least 1")
    if args.buffer_size // args.num_envs < 8:
        fail(f"--buffer-size {args.buffer_size} gives under 8 slots to each of --num-envs {args.num_envs} envs")
    if args.learning_starts < args.batch_size:
        fail(f"--learning-starts {args.learning_starts} is less than --batch-size {args.batch_size}")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of {args.num_envs} envs")
    if not 0.0 < args.tau <= 1.0 or not 0.0 < args.exploration_fraction <= 1.0:
        fail("--tau and --exploration-fraction must lie in (0, 1]")
    if args.eval_episodes < 1:
        fail("--eval-episodes must be at least 1")
    pick_backend(args.env_id, args.num_envs, args.env_backend)  # fails here, before a run directory is made


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
    if args.capture_video and not can_render(args.env_id, args.env_backend):
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
    n_actions, N = int(action_space.n), args.num_envs
    envs, is_atari = make_env(args.env_id, N, args.seed + global_step, args.episodic_life, args.reward_clip, args.env_backend)

    q_network = QNetwork(obs_space, action_space).to(device)
    target_network = QNetwork(obs_space, action_space).to(device)
    target_network.load_state_dict(q_network.state_dict())
    # fused: one kernel for all parameters, a third faster than the per-tensor loop on small networks
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    explore_rng = np.random.default_rng(args.seed)  # epsilon-greedy coins and random actions
    # envpool Atari frames are stored once and restacked; other observations are stored whole
    stack = obs_space.shape[0] if is_atari else 1
    obs_dtype = np.uint8 if obs_space.dtype == np.uint8 else np.float32
    rb = ReplayBuffer(args.buffer_size // N, N, obs_space.shape, obs_dtype, stack, args.seed)
    train_from = args.learning_starts
    if ckpt:
        q_network.load_state_dict(ckpt["model"])
        target_network.load_state_dict(ckpt["target_model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        explore_rng.bit_generator.state = ckpt["rng"]["explore"]
        rb.rng.bit_generator.state = ckpt["rng"]["buffer"]
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
        rng.update(explore=explore_rng.bit_generator.state, buffer=rb.rng.bit_generator.state)
        return dict(
            args=dataclasses.asdict(args),
            run_name=run_name,
            model=q_network.state_dict(),
            target_model=target_network.state_dict(),
            optimizer=optimizer.state_dict(),
            replay_buffer=rb.state_dict() if with_buffer else None,
            global_step=global_step,
            rng=rng,
        )

    # Ctrl-C and SIGTERM finish the current step, write a checkpoint and exit; a second one kills at once
    stop = []

    def request_stop(signum, _frame):
        stop.append(signum)
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    obs_np = envs.reset()[0]
    rb.start(obs_np)
    next_valid = np.ones(N, dtype=bool)  # False on the reset step that follows a done
    next_first = np.zeros(N, dtype=bool)  # True on the reset step of a full reset (not a lost life)
    ep_return, ep_length = np.zeros(N), np.zeros(N, dtype=np.int64)
    recent_returns: list[float] = []
    losses, q_means = [], []  # per-update losses and Q means, averaged when logged
    start_time, start_step, eval_seconds, last_print = time.time(), global_step, 0.0, 0.0
    env_seconds, update_seconds = 0.0, 0.0
    duration = args.exploration_fraction * args.total_timesteps
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")

    while global_step < args.total_timesteps:
        # --- acting ---
        global_step += N
        epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
        actions = select_actions(q_network, torch.as_tensor(obs_np, device=device), epsilon, n_actions, explore_rng)
        t0 = time.perf_counter()
        next_obs_np, reward, term, trunc, info = envs.step(actions)
        env_seconds += time.perf_counter() - t0
        # next_obs is the real final observation after a truncation (the reset comes on the next step)
        rb.add(actions, reward, term, next_valid, next_obs_np, next_first)
        obs_np = next_obs_np

        # episode statistics on the raw score of the full game (envpool's info["reward"], info["terminated"])
        done = term | trunc
        raw_reward = info["reward"] if is_atari else reward
        game_over = (info["terminated"].astype(bool) | trunc) if is_atari else done
        ep_return, ep_length, fin_returns, fin_lengths = update_episode_stats(
            ep_return, ep_length, raw_reward, next_valid, game_over
        )
        for r, length in zip(fin_returns, fin_lengths, strict=True):
            writer.add_scalar("charts/episodic_return", r, global_step)
            writer.add_scalar("charts/episodic_length", length, global_step)
            recent_returns = (recent_returns + [float(r)])[-20:]
        next_valid, next_first = ~done, game_over

        # --- update ---
        if global_step > train_from:
            t0 = time.perf_counter()
            for _ in range(global_step // args.train_frequency - (global_step - N) // args.train_frequency):
                obs, b_actions, b_rewards, next_obs, b_terms = rb.sample(args.batch_size, device)
                with torch.no_grad():
                    next_q_online = q_network(next_obs) if args.double_q else None
                    targets = td_target(b_rewards, b_terms, target_network(next_obs), args.gamma, next_q_online)
                loss, q_mean = q_loss(q_network(obs), b_actions, targets, args.loss)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if args.max_grad_norm > 0:
                    nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                optimizer.step()
                # kept as a list and stacked once per log interval: no stack and add per update
                losses.append(loss.detach())
                q_means.append(q_mean.detach())
            if global_step // args.target_network_frequency > (global_step - N) // args.target_network_frequency:
                soft_update(target_network, q_network, args.tau)
            update_seconds += time.perf_counter() - t0

        # --- logging: one host sync per log interval ---
        if global_step // args.log_every > (global_step - N) // args.log_every or global_step >= args.total_timesteps:
            if losses:
                td_loss, q_values = torch.stack([torch.stack(losses), torch.stack(q_means)]).mean(1).tolist()
                writer.add_scalar("losses/td_loss", td_loss, global_step)
                writer.add_scalar("losses/q_values", q_values, global_step)
                losses, q_means = [], []
            writer.add_scalar("charts/epsilon", epsilon, global_step)
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
            eval_returns = evaluate(q_network, args, device, video)
            writer.add_scalar("eval/episodic_return", float(np.mean(eval_returns)), global_step)
            print(f"eval at step {global_step:,}: mean return {np.mean(eval_returns):.1f} over {len(eval_returns)} episodes")
            eval_seconds += time.time() - t0
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
        f"time: env steps {100 * env_seconds / train_seconds:.0f}%, updates {100 * update_seconds / train_seconds:.0f}%,"
        f" acting and replay writes {100 * (1 - (env_seconds + update_seconds) / train_seconds):.0f}%"
    )

    # --- final model: saved, reloaded from disk, evaluated ---
    if args.save_model:
        model_path = os.path.join(run_dir, "dqn.model")
        save_checkpoint(model_path, dict(args=dataclasses.asdict(args), run_name=run_name, model=q_network.state_dict()))
        state = load_checkpoint(model_path, args.env_id)
        eval_network = QNetwork(obs_space, action_space).to(device)
        eval_network.load_state_dict(state["model"])
        video = os.path.join(run_dir, "videos", "final.mp4") if args.capture_video else None
        eval_returns = evaluate(eval_network, args, device, video)
        for r in eval_returns:  # all at the final step, one point per episode
            writer.add_scalar("eval/episodic_return", r, global_step)
        mean, std = np.mean(eval_returns), np.std(eval_returns)
        print(f"evaluation of {model_path}: mean return {mean:.1f} +- {std:.1f} over {len(eval_returns)} episodes")
        print(f"model: {model_path}")
    writer.close()
    print(f"tensorboard logs: {run_dir}   (view with: tensorboard --logdir runs)")


if __name__ == "__main__":
    main(parse_args())
