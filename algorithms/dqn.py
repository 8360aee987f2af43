"""DQN (Mnih et al. 2015) and Double DQN (van Hasselt et al. 2016); benchmark: `bash benchmark/dqn.sh`.

Reading guide: the algorithm first (Args, the Q-network, the maths, the update step, the replay buffer, main's
training loop), up to the line `# The algorithm ends here`; below it, this file's machinery (presets, envs,
evaluation, checks, checkpoints, the start and the end of a run), then the run plumbing all eight files share.
"""

import os
import time
from dataclasses import dataclass
from typing import Literal

if "OMP_NUM_THREADS" not in os.environ:  # before torch loads: idle threads sleep, not spin (docs/speed.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import gymnasium as gym
import numpy as np
import torch
from torch import nn


@dataclass
class Args:
    # --- algorithm (the classic preset's values; --preset, below the marker, sets others for Atari) ---
    total_timesteps: int = 500_000
    """total env steps over all envs; raised on --resume, it extends a finished or stopped run"""
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
    """Double DQN (van Hasselt et al. 2016): the online net picks the next action, the target net values it"""
    loss: Literal["mse", "huber"] = "mse"
    """TD loss: mse as CleanRL, whose results the presets reproduce; huber as Mnih et al. 2015"""
    max_grad_norm: float = 0.0
    """global gradient norm clip (0: none, as CleanRL and Mnih et al. 2015)"""
    episodic_life: bool = True
    """Atari only: a lost life ends the training episode (the logged episode is still the full game)"""
    reward_clip: bool = True
    """Atari only: train on the sign of the reward (the logged return is still the raw score)"""

    # --- run settings ---
    exp_name: str = "dqn"
    """name of this experiment, part of the run directory name"""
    env_id: str = "CartPole-v1"
    """envpool or gymnasium id with Discrete actions (CartPole-v1, Breakout-v5, 'module:Env-v0', ...)"""
    env_backend: Literal["auto", "envpool", "gymnasium"] = "auto"
    """who steps the envs: envpool's C++ threads or gymnasium in-process; auto: gymnasium for cheap ones"""
    preset: Literal["auto", "classic", "atari"] = "auto"
    """defaults of a reference: classic (CleanRL dqn.py), atari (dqn_atari.py); auto: atari for images"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    compile: bool = False
    """torch.compile the acting step and the TD update: slower on a CPU, faster on a GPU (docs/dqn.md)"""
    cudagraphs: bool = False
    """CUDA graphs on top of --compile (its "reduce-overhead" mode); needs a CUDA device, implies --compile"""
    bf16: bool = False
    """frames: the convolutional trunk in bfloat16 autocast; weights, Q-values and losses stay float32"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final model to runs/<run>/dqn.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate on separate envs every this many env steps (0: only at the end, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    eval_epsilon: float = 0.05
    """evaluation's epsilon (as CleanRL), so that an Atari policy that never fires cannot stall"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    save_buffer: bool = False
    """checkpoint the buffer too; else a resumed run refills it for --learning-starts steps before training"""
    resume: str = ""
    """a checkpoint.pt to resume from; the run goes on in its directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    log_every: int = 1000
    """env steps between the loss, epsilon and SPS scalars"""


class QNetwork(nn.Module):
    """Q-values of every action: Nature CNN (Mnih et al. 2015) for (C, H, W) frames, a 120-84 ReLU MLP
    (CleanRL dqn.py) for vectors. No orthogonal init: CleanRL's dqn.py and dqn_atari.py, whose results the
    presets reproduce, keep PyTorch's default nn.Linear and nn.Conv2d init (uniform in +-1/sqrt(fan_in))."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, bf16: bool = False):
        super().__init__()
        self.dtype = torch.bfloat16 if bf16 else torch.float32  # the convolutional trunk's, under autocast
        if len(obs_space.shape) == 3:
            encoder = nn.Sequential(
                nn.Conv2d(obs_space.shape[0], 32, 8, stride=4), nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            )  # fmt: skip
            with torch.no_grad():
                n_flat = encoder(torch.zeros(1, *obs_space.shape)).shape[1]
            head = [nn.Linear(n_flat, 512), nn.ReLU(), nn.Linear(512, int(action_space.n))]
            # channels-last: the (H, W, C) layout that oneDNN's and cuDNN's fast kernels take
            self.network = nn.Sequential(*encoder, *head).to(memory_format=torch.channels_last)
        else:
            # no nn.Flatten: observations are vectors, and every op costs microseconds on a net this small
            hidden = [nn.Linear(obs_space.shape[0], 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU()]
            self.network = nn.Sequential(*hidden, nn.Linear(84, int(action_space.n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:  # vectors, float or uint8 (network_input scales uint8 ones to [0, 1])
            return self.network(network_input(x, torch.float32))
        # frames become floats only here (--bf16: bfloat16, the trunk autocast), channels-last while uint8
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            h = self.network[:-1](network_input(x.contiguous(memory_format=torch.channels_last), self.dtype))
        return self.network[-1](h.float())  # the Q-values in float32


def network_input(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An observation in `dtype`: uint8 (frames, bytes) scaled to [0, 1] on .to's copy; floats as they are."""
    return x.to(dtype).mul_(1.0 / 255.0) if x.dtype == torch.uint8 else x.to(dtype)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon from start_e at step 0 to end_e at step `duration`, then constant (Mnih et al. 2015)."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def td_target(rewards, terminations, next_q_target, gamma: float, next_q_online=None):
    """r + gamma * (1 - terminated) * Q_target(s', a'), a' the target network's argmax (DQN) or, given its
    next Q-values, the online network's (Double DQN, van Hasselt et al. 2016); a truncation bootstraps."""
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


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging, target <- tau * online + (1 - tau) * target, as one fused op over all parameters;
    tau = 1 is the hard copy of Mnih et al. 2015 (lerp with weight 1 returns the online values exactly)."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def select_actions(act, obs: torch.Tensor, epsilon: float, n_actions: int, rng: np.random.Generator):
    """Epsilon-greedy per env, `act` giving the greedy actions (the argmax of the Q-values); the network runs
    only when some env acts greedily, and random actions are drawn only for the envs that explore."""
    explore = rng.random(obs.shape[0]) < epsilon
    if explore.all():
        return rng.integers(0, n_actions, obs.shape[0])
    with torch.no_grad():
        actions = act(obs).cpu().numpy()
    if explore.any():
        actions[explore] = rng.integers(0, n_actions, int(explore.sum()))
    return actions


def training_steps(q_network: QNetwork, target_network: QNetwork, optimizer: torch.optim.Optimizer, args):
    """The greedy acting step and the TD update, which --compile hands to torch.compile (as LeanRL)."""

    def act(obs):
        return q_network(obs).argmax(1)

    def update(batch: dict) -> dict:
        """A replay batch's TD target, loss, gradient (norm clipped if asked), Adam step; the loss, mean Q."""
        with torch.no_grad():
            next_q_online = q_network(batch["next_obs"]) if args.double_q else None
            next_q_target = target_network(batch["next_obs"])
            targets = td_target(batch["rewards"], batch["terminations"], next_q_target, args.gamma, next_q_online)
        loss, q_mean = q_loss(q_network(batch["obs"]), batch["actions"], targets, args.loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
        optimizer.step()
        return {"td_loss": loss.detach(), "q_values": q_mean.detach()}

    if not args.compile:
        return act, update
    mode = "reduce-overhead" if args.cudagraphs else "default"  # reduce-overhead: inductor's CUDA graph trees
    return torch.compile(act, mode=mode), torch.compile(update, mode=mode)


class ReplayBuffer:
    """Replay memory with each observation once, in time order per env (docs/dqn.md, detail 11): slot t holds
    step t's observation (stacked: the newest frame alone, stacks rebuilt as envpool builds them), the action,
    reward and termination, and whether t -> t+1 is a real transition (not an autoreset's reset step)."""

    def __init__(self, capacity: int, num_envs: int, obs_space: gym.Space, stacked: bool, rng):
        self.capacity = capacity
        self.num_envs = num_envs
        self.stack = obs_space.shape[0] if stacked else 1
        frame_shape = obs_space.shape[1:] if stacked else obs_space.shape
        obs_dtype = np.uint8 if obs_space.dtype == np.uint8 else np.float32
        self.frames = np.zeros((capacity, num_envs, *frame_shape), dtype=obs_dtype)
        self.actions = np.zeros((capacity, num_envs), dtype=np.int64)
        self.rewards = np.zeros((capacity, num_envs), dtype=np.float32)
        self.terminations = np.zeros((capacity, num_envs), dtype=np.float32)
        self.valid = np.zeros((capacity, num_envs), dtype=bool)
        self.first = np.zeros((capacity, num_envs), dtype=bool)  # the first observation of a full reset
        self.pos = -1  # slot of the newest observation
        self.size = 0
        self.rng = np.random.default_rng(rng)  # a seed, or a generator used as it is

    def add_obs(self, obs: np.ndarray, first) -> None:
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.frames[self.pos] = obs[:, -1] if self.stack > 1 else obs
        self.first[self.pos] = first
        self.valid[self.pos] = False  # its transition is not complete yet (and an overwritten one is gone)

    def add(self, actions, rewards, terminations, valid, next_obs: np.ndarray, next_first) -> None:
        """The newest slot's transition (valid: False on the reset step of the next-step autoreset), then
        next_obs after it (next_first: where it is the first observation of a game over or a truncation)."""
        self.actions[self.pos] = actions
        self.rewards[self.pos] = rewards
        self.terminations[self.pos] = terminations
        self.valid[self.pos] = valid
        self.add_obs(next_obs, next_first)

    def sampleable(self, slots: np.ndarray, envs: np.ndarray) -> np.ndarray:
        # in a full buffer, the stacks of the stack - 1 oldest slots would reach into overwritten frames
        too_old = (self.size == self.capacity) & ((slots - self.pos) % self.capacity < self.stack)
        return self.valid[slots, envs] & ~too_old

    def stacks(self, slots: np.ndarray, envs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Observations and next observations of the transitions at (slots, envs)."""
        if self.stack == 1:
            return self.frames[slots, envs], self.frames[(slots + 1) % self.capacity, envs]
        k = self.stack
        window = (slots[:, None] + np.arange(-k + 1, 2)) % self.capacity  # k - 1 older, the slot, the next
        first = self.first[window, envs[:, None]]
        obs = []
        for lo in (0, 1):  # the observation's stack, then the next one's
            # frames before the newest episode start in the stack repeat its first frame, as envpool's reset
            start = (first[:, lo : lo + k] * np.arange(k)).max(1, keepdims=True)
            cols = lo + np.maximum(np.arange(k), start)
            obs.append(self.frames[np.take_along_axis(window, cols, 1), envs[:, None]])
        return obs[0], obs[1]

    def sample(self, batch_size: int, device: torch.device) -> dict:
        slots = self.rng.integers(0, self.size, batch_size)
        envs = self.rng.integers(0, self.num_envs, batch_size)
        while (bad := ~self.sampleable(slots, envs)).any():  # rejection sampling: few slots are no transition
            slots[bad] = self.rng.integers(0, self.size, int(bad.sum()))
            envs[bad] = self.rng.integers(0, self.num_envs, int(bad.sum()))
        obs, next_obs = self.stacks(slots, envs)
        batch = dict(obs=obs, actions=self.actions[slots, envs], rewards=self.rewards[slots, envs])
        batch.update(next_obs=next_obs, terminations=self.terminations[slots, envs])
        batch = {k: torch.from_numpy(x) for k, x in batch.items()}
        if device.type == "cuda":  # pinned memory, no wait: a pageable copy waits for the GPU's whole queue
            batch = {k: x.pin_memory().to(device, non_blocking=True) for k, x in batch.items()}
        return batch


def main(args: Args) -> None:
    # --- set-up (start_run: checks, device, run directory, writer); networks, optimiser, buffer; a resume ---
    run = start_run(args)
    device = run.device
    N = args.num_envs
    n_actions = int(run.action_space.n)
    q_network = QNetwork(run.obs_space, run.action_space, args.bf16).to(device)
    target_network = QNetwork(run.obs_space, run.action_space, args.bf16).to(device)
    target_network.load_state_dict(q_network.state_dict())
    # fused: one kernel for all parameters (a third faster on small nets); compiled: foreach (inductor fuses)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=not args.compile)
    act, update = training_steps(q_network, target_network, optimizer, args)
    # epsilon-greedy and replay draw from independent streams (generators seeded alike would draw the same)
    explore_seed, replay_seed = np.random.SeedSequence(args.seed).spawn(2)
    explore_rng = np.random.default_rng(explore_seed)
    rb = ReplayBuffer(args.buffer_size // N, N, run.obs_space, stacked=run.is_atari, rng=replay_seed)
    global_step, train_from = restore_run(args, run, q_network, target_network, optimizer, explore_rng, rb)
    seed = args.seed + global_step  # envs are not restored by a resume, so its envs take a fresh seed
    envs, _ = make_env(args.env_id, N, seed, args.episodic_life, args.reward_clip, args.env_backend)
    obs_np = envs.reset()[0]
    rb.add_obs(obs_np, first=True)
    next_valid = np.ones(N, dtype=bool)  # False on the reset step that follows a done
    next_first = np.zeros(N, dtype=bool)  # True on the reset step of a full reset (not a lost life)
    ep_return = np.zeros(N)  # the logged episode's return and length so far, per env
    ep_length = np.zeros(N, dtype=np.int64)
    # each update's loss and mean Q, summed on the device at once (--cudagraphs overwrites a graph's outputs)
    stats = {name: torch.zeros((), device=device) for name in ("td_loss", "q_values")}
    num_updates = 0
    seconds = {"env": 0.0, "update": 0.0}  # where the training time goes, said at the end
    duration = args.exploration_fraction * args.total_timesteps  # env steps over which epsilon decays

    while global_step < args.total_timesteps:
        # --- act: epsilon-greedy, one step of every env ---
        global_step += N
        epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
        actions = select_actions(act, torch.as_tensor(obs_np, device=device), epsilon, n_actions, explore_rng)
        t0 = time.perf_counter()
        next_obs_np, reward, term, trunc, info = finite_step(envs.step(actions), global_step)  # stops at NaN
        seconds["env"] += time.perf_counter() - t0
        # --- store: after a truncation, next_obs is the real final observation (the reset step is next) ---
        rb.add(actions, reward, term, next_valid, next_obs_np, next_first)
        obs_np = next_obs_np
        # --- episodes: for Atari the game (envpool's info["terminated"], not a lost life, or a truncation)
        # at its raw score (info["reward"], not the clipped reward); for other envs the episode as trained
        episode_end = info["terminated"].astype(bool) | trunc if run.is_atari else term | trunc
        ep_return += info["reward"] if run.is_atari else reward
        ep_length += next_valid  # the reset step of the next-step autoreset is no step of an episode
        run.log_episodes(ep_return[episode_end], ep_length[episode_end], global_step)
        ep_return[episode_end] = 0.0
        ep_length[episode_end] = 0
        next_valid = ~(term | trunc)
        next_first = episode_end
        # --- learn: a TD update per train_frequency env steps (over all envs), then the target network ---
        if global_step > train_from:
            t0 = time.perf_counter()
            for _ in range(global_step // args.train_frequency - (global_step - N) // args.train_frequency):
                for name, value in update(rb.sample(args.batch_size, device)).items():
                    stats[name] += value
                num_updates += 1
            # eager: one fused lerp every target_network_frequency steps, no schedule branch in a traced graph
            if crossed(global_step, N, args.target_network_frequency):
                soft_update(target_network, q_network, args.tau)
            seconds["update"] += time.perf_counter() - t0
        # --- logging: the interval's mean loss and Q, epsilon, SPS; one host sync per log interval ---
        if crossed(global_step, N, args.log_every) or global_step >= args.total_timesteps:
            log_training(args, run, stats, num_updates, epsilon, global_step)  # a NaN or inf ends the run
            stats = {name: torch.zeros_like(total) for name, total in stats.items()}
            num_updates = 0
        end_iteration(args, run, envs, global_step, q_network, target_network, optimizer, rb, explore_rng)

    # --- end: where the time went; the final model saved, reloaded and evaluated (end_run, below) ---
    end_run(args, run, envs, q_network, global_step, seconds)


# The algorithm ends here; a learner may stop. Below: this file's machinery (envs, checks, checkpoints), then the plumbing.
CHECKPOINT_FORMAT = 1  # raise it when a checkpoint's fields change: --resume then refuses a file of the old layout in one line
REPLAY_ARRAYS = ("frames", "actions", "rewards", "terminations", "valid", "first")  # the replay buffer with --save-buffer
RANGES = dict(seed="[0, 1e9]", eval_every="[0, inf)", eval_episodes="[1, inf)", eval_epsilon="[0, 1]",
              checkpoint_every="[0, inf)", progress_interval="[0, inf)", log_every="[1, inf)", total_timesteps="[1, inf)",
              learning_rate="(0, inf)", num_envs="[1, inf)", buffer_size="[1, inf)", gamma="[0, 1]", tau="(0, 1]",
              target_network_frequency="[1, inf)", batch_size="[1, inf)", start_e="[0, 1]", end_e="[0, 1]",
              exploration_fraction="(0, 1]", learning_starts="[0, inf)", train_frequency="[1, inf)",
              max_grad_norm="[0, inf)")  # fmt: skip
# Defaults of CleanRL's dqn.py (classic) and dqn_atari.py (atari), whose results benchmark/dqn.sh reproduces; a typed flag wins
PRESETS = dict(classic=dict(), atari=dict(total_timesteps=10_000_000, learning_rate=1e-4, buffer_size=1_000_000,
                                          target_network_frequency=1000, batch_size=32, end_e=0.01, exploration_fraction=0.10,
                                          learning_starts=80_000, train_frequency=4))  # fmt: skip


def preset_defaults(argv: list[str]) -> Args:
    """The defaults of the preset the command line asks for; auto picks atari for image observations."""
    env_id, preset = flag_value(argv, "env_id", Args.env_id), flag_value(argv, "preset", Args.preset)
    image = preset == "auto" and len(env_spaces(env_id)[0].shape or ()) == 3
    return Args(env_id=env_id, **PRESETS.get("atari" if image else preset, {}))  # auto without images: Args' own


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


# With --env-backend auto, gymnasium steps a classic-control id in the process up to this many envs, where its Python
# steps cost less than envpool's hand-off to its worker threads (65-95 us a step inside a loop, docs/speed.md)
GYMNASIUM_UP_TO = {"CartPole-v0": 10, "CartPole-v1": 10, "MountainCarContinuous-v0": 20, "MountainCar-v0": 6,
                   "Pendulum-v1": 6, "Acrobot-v1": 2}  # fmt: skip


def pick_backend(env_id: str, num_envs: int, backend: str, render: bool = False) -> str:
    """The backend that steps env_id (see Args.env_backend); one line where the chosen one lacks the id. auto renders
    with envpool, since gymnasium's classic-control renderer needs pygame, which is not installed."""
    if backend == "auto":
        few = num_envs <= GYMNASIUM_UP_TO.get(env_id, 0) and not render
        return "gymnasium" if few or not envpool_has(env_id) else "envpool"
    if not (envpool_has(env_id) if backend == "envpool" else env_id in gym.registry or ":" in env_id):  # module:Id imports
        fail(f"{backend} has no env '{env_id}'; pass --env-backend auto")
    return backend


def make_env(env_id: str, num_envs: int, seed: int, episodic_life: bool, reward_clip: bool, backend: str, render=False):
    """A vector env with next-step autoreset (docs/conventions.md), of pick_backend's backend; returns (envs, is_atari)."""
    kwargs = dict(render_mode="rgb_array") if render else {}
    if pick_backend(env_id, num_envs, backend, render) == "envpool":
        is_atari = hasattr(envpool.make_spec(env_id).config, "episodic_life")
        kwargs |= dict(episodic_life=episodic_life, reward_clip=reward_clip) if is_atari else {}
        return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **kwargs), is_atari
    # copy=False: each step's observations are copied into the replay buffer before the next step overwrites them
    vector_kwargs = dict(autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP, copy=False)
    envs = gym.make_vec(env_id, num_envs, vectorization_mode="sync", vector_kwargs=vector_kwargs, **kwargs)
    envs.reset(seed=seed)
    return envs, False


def can_render(env_id: str, backend: str = "auto") -> bool:
    """--capture-video's rule, checked first: envpool's MuJoCo ends the process without OpenGL; gymnasium's needs pygame."""
    if backend == "gymnasium" or not envpool_has(env_id):
        return importlib.util.find_spec("pygame") is not None
    mujoco = envpool.registration.registry.specs[env_id][0].startswith("envpool.mujoco")
    return not mujoco or bool(os.environ.get("DISPLAY")) or os.environ.get("MUJOCO_GL") in ("egl", "osmesa")


def evaluate(q_network: QNetwork, args: Args, device: torch.device, video: str | None = None) -> np.ndarray:
    """The returns of one full game (raw score) per eval env, epsilon-greedy with --eval-epsilon; video: env 0's game."""
    envs, _ = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, False, False, args.env_backend, video is not None)
    rng = np.random.default_rng(args.seed + 100_000)  # its own generator: evaluating does not change training
    obs, _ = envs.reset()
    returns, finished, frames = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool), []
    while not finished.all():
        if video is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        obs_t = torch.as_tensor(obs, device=device)
        action = select_actions(lambda x: q_network(x).argmax(1), obs_t, args.eval_epsilon, envs.single_action_space.n, rng)
        obs, reward, term, trunc, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
    envs.close()
    write_video(video, frames)
    return returns


def storage(args: Args, obs_space: gym.Space, action_space: gym.Space, device: torch.device, is_atari: bool) -> dict:
    """The replay buffer in host memory as ReplayBuffer lays it out (one frame a slot on Atari), for check_storage."""
    N, shape = args.num_envs, obs_space.shape
    slot_bytes = int(np.prod(shape[1:] if is_atari else shape)) * (1 if obs_space.dtype == np.uint8 else 4) + 8 + 4 + 4 + 1 + 1
    buffer = f"the replay buffer (--buffer-size {args.buffer_size} of {'x'.join(map(str, shape))} observations)"
    return {buffer: ((args.buffer_size // N) * N * slot_bytes, torch.device("cpu"), "lower --buffer-size")}


def check_frame_size(env_id: str, obs_space: gym.Space) -> None:
    """Frames too small for the Nature CNN (36x36 -> 8x8 -> 3x3 -> 1x1 through its three layers): refused in one line."""
    if len(obs_space.shape) == 3 and min(obs_space.shape[1:]) < 36:
        h, w = obs_space.shape[1:]
        fail(f"the Nature CNN takes frames of at least 36x36, and {env_id} has {h}x{w}; scale them up, or flatten them")


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> bool:
    """The env's spaces and flags that only make sense together; returns whether make_env steps envpool's Atari."""
    if (processes := int(os.environ.get("WORLD_SIZE", "1"))) > 1:
        fail(f"it learns from one replay buffer in one process, and torchrun started {processes}; run it with python")
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(f"dqn.py needs Discrete actions, and {args.env_id} has {action_space}; use ddpg_td3.py for Box ones")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        hint = "use qlearning.py for Discrete observations" if isinstance(obs_space, gym.spaces.Discrete) else "wrap the env"
        fail(f"dqn.py needs a vector or a (C, H, W) image observation, and {args.env_id} has {obs_space}; {hint}")
    check_frame_size(args.env_id, obs_space)
    backend = pick_backend(args.env_id, args.num_envs, args.env_backend)  # refuses a backend without the env
    atari = backend == "envpool" and hasattr(envpool.make_spec(args.env_id).config, "episodic_life")
    refuse_meaningless(args, [
        (("episodic_life", "reward_clip"), not atari, f"is for envpool's Atari ids, and {args.env_id} is not one"),
        (("eval_episodes", "eval_epsilon", "capture_video"), not (args.eval_every > 0 or args.save_model),
         "sets the evaluations, and this run has none (see --eval-every and --save-model)"),
        (("bf16",), len(obs_space.shape) != 3, f"runs the convolutional trunk of frames, and {args.env_id} has vectors"),
    ])  # fmt: skip
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of {args.num_envs} envs; raise it")
    if args.buffer_size < max(args.batch_size, 8 * args.num_envs):
        fail(f"--buffer-size {args.buffer_size} is less than --batch-size {args.batch_size} or 8 slots per env; raise it")
    if not args.batch_size <= args.learning_starts < args.total_timesteps - args.total_timesteps % args.train_frequency:
        fail(f"--learning-starts {args.learning_starts} is under --batch-size or leaves no gradient step; change it")
    if args.start_e < args.end_e:
        fail(f"--start-e {args.start_e} is below --end-e {args.end_e}, so epsilon would never decay; swap them")
    if not (args.cuda and torch.cuda.is_available()) and (args.cudagraphs or "cudagraphs" in getattr(args, "typed", ())):
        fail("--cudagraphs needs a CUDA device, and this run is on the CPU; leave it out (--compile works on the CPU)")
    args.compile = args.compile or args.cudagraphs
    if args.capture_video and not can_render(args.env_id, args.env_backend):  # typed, or a resumed checkpoint's
        fail(f"--capture-video: {args.env_id} cannot render here (it needs OpenGL or pygame); pass --no-capture-video")
    return atari


def bf16_note(device: torch.device) -> str:
    """The start line's word where bfloat16 is emulated, so --bf16 likely slower than float32: a GPU before Ampere
    (compute capability 8), or a CPU whose /proc/cpuinfo (Linux, as envpool) names no AVX512-BF16, AMX or Arm BF16."""
    if device.type == "cuda":
        native = torch.cuda.get_device_capability(device)[0] >= 8
    else:
        with open("/proc/cpuinfo") as f:
            native = not {"avx512_bf16", "amx_bf16", "bf16"}.isdisjoint(f.read().split())
    return "" if native else f"note: no native bfloat16 on {device}: --bf16 is likely slower than float32"


def start_run(args: Args) -> "Run":
    """Every check before the run directory is made, then the device, a --resume's checkpoint and the Run (with the spaces)."""
    obs_space, action_space = env_spaces(args.env_id)
    is_atari = check_args(args, obs_space, action_space)
    device = seed_and_device(args, small=len(obs_space.shape) == 1)
    check_storage(storage(args, obs_space, action_space, device, is_atari))
    ckpt = load_checkpoint(args.resume, args.env_id) if args.resume else None
    run = Run(args, ckpt, device, -(-args.total_timesteps // args.num_envs) * args.num_envs)  # whole vector steps, as it runs
    if args.bf16 and (slow := bf16_note(device)):
        print(slow, flush=True)
    run.obs_space, run.action_space, run.is_atari = obs_space, action_space, is_atari
    return run


def restore_run(args: Args, run: "Run", q_network, target_network, optimizer, explore_rng, rb) -> tuple[int, int]:
    """A resume's networks, Adam's state, random states and saved replay buffer; returns global_step and train_from."""
    if (ckpt := run.ckpt) is None:
        return 0, args.learning_starts
    for key, state in dict(model=q_network, target_model=target_network, optimizer=optimizer).items():
        state.load_state_dict(ckpt[key])
    rng_state(run.device, restore=ckpt["rng"])
    explore_rng.bit_generator.state = ckpt["rng"]["explore"]
    rb.rng.bit_generator.state = ckpt["rng"]["buffer"]
    global_step, saved = ckpt["global_step"], ckpt.pop("replay_buffer")
    if saved is not None:
        for name in REPLAY_ARRAYS:
            getattr(rb, name)[...] = saved[name].numpy()
        rb.pos, rb.size = saved["pos"], saved["size"]
    refill = f" (replay buffer not saved: refilling it for {args.learning_starts:,} steps)" if saved is None else ""
    print(f"resumed {run.dir} at step {global_step:,}{refill}")
    return global_step, args.learning_starts + (global_step if saved is None else 0)  # lost experience: gathered again


def log_training(args: Args, run: "Run", stats: dict, num_updates: int, epsilon: float, global_step: int) -> None:
    """Every --log-every steps: each update statistic's mean (one host sync; a NaN or inf ends the run), epsilon, SPS."""
    if num_updates:
        means = torch.stack([total / num_updates for total in stats.values()]).tolist()
        for name, value in check_training(dict(zip(stats, means, strict=True)), global_step).items():
            run.writer.add_scalar(f"losses/{name}", value, global_step)
    run.writer.add_scalar("charts/epsilon", epsilon, global_step)
    run.log(global_step, global_step, force=global_step >= args.total_timesteps)


def end_iteration(args, run: "Run", envs, global_step: int, q_network, target_network, optimizer, rb, explore_rng) -> None:
    """Each step's end: an evaluation every --eval-every steps, a checkpoint every --checkpoint-every and at a stop."""
    if crossed(global_step, args.num_envs, args.eval_every):
        with run.paused():
            run.log_eval(evaluate(q_network, args, run.device, run.video(global_step)), global_step)
    if crossed(global_step, args.num_envs, args.checkpoint_every) or run.stop:
        # torch.from_numpy shares the memory: torch.save writes a 7 GB buffer without copying it first
        buffer = {name: torch.from_numpy(getattr(rb, name)) for name in REPLAY_ARRAYS} | {"pos": rb.pos, "size": rb.size}
        rng = {**rng_state(run.device), "explore": explore_rng.bit_generator.state, "buffer": rb.rng.bit_generator.state}
        nets = dict(model=q_network.state_dict(), target_model=target_network.state_dict(), optimizer=optimizer.state_dict())
        run.checkpoint(**nets, replay_buffer=buffer if args.save_buffer else None, global_step=global_step, rng=rng)
    if run.stop:
        envs.close()
        run.stop_and_exit(f"step {global_step:,}")


def end_run(args: Args, run: "Run", envs, q_network, global_step: int, seconds: dict) -> None:
    """Where the training time went; with --save-model, the final model saved, reloaded from disk and evaluated."""
    envs.close()
    train_seconds = max(time.time() - run.start_time - run.paused_seconds, 1e-9)
    env, updates = 100 * seconds["env"] / train_seconds, 100 * seconds["update"] / train_seconds
    print(f"time: env steps {env:.0f}%, updates {updates:.0f}%, acting and replay writes {100 - env - updates:.0f}%")
    if args.save_model:  # as a user who loads the model evaluates it: a new network, its weights read back from disk
        eval_network = QNetwork(run.obs_space, run.action_space, args.bf16).to(run.device)
        eval_network.load_state_dict(run.save_and_reload(model=q_network.state_dict())["model"])
        run.log_eval(evaluate(eval_network, args, run.device, run.video()), global_step, run.model_path)
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
