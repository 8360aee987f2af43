"""A2C, the synchronous A3C (Mnih et al. 2016), as SB3 and OpenAI Baselines run it (benchmark/a2c.sh).

Reading guide: the algorithm down to `# The algorithm ends here`; below, its machinery and shared plumbing."""

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
from torch.distributions import Categorical, Independent, Normal


@dataclass
class Args:
    total_timesteps: int = 500_000
    """total env steps over all envs; may be raised on --resume to extend a run"""
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
    """RMSprop epsilon (Baselines' and SB3's: PyTorch's 1e-8 blows tiny gradients up)"""
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
    """normalise float observations with running statistics, clipped to +-10 (not uint8 frames or bytes)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return (clipped to +-10)"""
    episodic_life: bool = True
    """Atari only: a lost life ends the training episode (the logged episode is still the full game)"""
    reward_clip: bool = True
    """Atari only: train on the sign of the reward (the logged return is still the raw score)"""
    rnn: Literal["none", "lstm", "gru"] = "none"
    """a recurrent layer between the observation encoder and the heads (none: a feed-forward policy)"""
    rnn_size: int = 128
    """units of the recurrent layer (and of its state)"""
    # --- run settings ---
    exp_name: str = "a2c"
    """name of this experiment, part of the run directory name"""
    env_id: str = "CartPole-v1"
    """envpool id (CartPole-v1, Breakout-v5, HalfCheetah-v4, ...) or gymnasium id (also 'module:Env-v0')"""
    env_backend: Literal["auto", "envpool", "gymnasium"] = "auto"
    """who steps the envs (auto: gymnasium in this process for a few cheap envs, else envpool's threads)"""
    preset: Literal["auto", "classic", "atari", "mujoco"] = "auto"
    """a family's rl-baselines3-zoo defaults (docs/a2c.md); auto picks one from the env's spaces"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    compile: bool = False
    """torch.compile the acting step and the update (off: the eager code is the one to read; docs/speed.md)"""
    cudagraphs: bool = False
    """CUDA graphs on top of --compile (its "reduce-overhead" mode); needs a CUDA device, implies --compile"""
    bf16: bool = False
    """frames: the trunk in bfloat16 autocast; weights, heads and losses stay float32 (docs/speed.md)"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos (envs that can render)"""
    save_model: bool = False
    """save the final model to runs/<run>/a2c.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate on separate envs every this many env steps (0: only after training, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    eval_deterministic: bool = False
    """evaluate the greedy policy (argmax / Gaussian mean); off: sampling, as CleanRL's PPO evaluation does"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    resume: str = ""
    """a checkpoint.pt to resume from; the run goes on in its directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    log_interval: int = 100
    """iterations between loss, SPS and learning-rate logs (SB3's A2C default); losses averaged over them"""
    batch_size: tyro.conf.Suppress[int] = 0
    """num_envs * num_steps (computed)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """total_timesteps // batch_size (computed)"""
    world_size: tyro.conf.Suppress[int] = 1
    """processes training together (torchrun's WORLD_SIZE), each stepping num_envs / world_size (computed)"""


# Networks: CleanRL's, initialised as Huang et al. 2022 (detail 2: orthogonal weights, zero biases)
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(n_in: int, n_out: int, std: float) -> nn.Sequential:
    """CleanRL's 64-64 tanh MLP; the last layer's weights drawn with gain `std`."""
    layers = [layer_init(nn.Linear(n_in, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh()]
    return nn.Sequential(*layers, layer_init(nn.Linear(64, n_out), std=std))


class Agent(nn.Module):
    """Actor-critic: a Nature CNN trunk (frames) or two 64-64 tanh MLPs (vectors); --rnn: memory first."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, rnn="none", rnn_size=128, bf16=False):
        super().__init__()
        self.dtype = torch.bfloat16 if bf16 else torch.float32  # the trunk's input
        self.continuous = isinstance(action_space, gym.spaces.Box)
        self.frames = len(obs_space.shape) == 3  # (C, H, W)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        n_features = 512 if self.frames else int(np.prod(obs_space.shape))
        n_head = n_features if rnn == "none" else rnn_size
        if self.frames:  # Mnih et al. 2015 Nature CNN
            self.encoder = nn.Sequential(
                layer_init(nn.Conv2d(obs_space.shape[0], 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            )  # fmt: skip
            with torch.no_grad():
                n_flat = self.encoder(torch.zeros(1, *obs_space.shape)).shape[1]
            self.encoder.extend([layer_init(nn.Linear(n_flat, 512)), nn.ReLU()])
            self.encoder.to(memory_format=torch.channels_last)  # oneDNN's and cuDNN's fast kernels: (H, W, C)
            self.actor = layer_init(nn.Linear(n_head, n_out), std=0.01)
            self.critic = layer_init(nn.Linear(n_head, 1), std=1.0)
        else:
            self.encoder = nn.Flatten()
            self.actor = mlp(n_head, n_out, std=0.01)
            self.critic = mlp(n_head, 1, std=1.0)
        if self.continuous:  # Huang et al. 2022, continuous detail 2: a state-independent log std, 0 at first
            self.actor_logstd = nn.Parameter(torch.zeros(1, n_out))
        self.memory = recurrent_layer(rnn, n_features, rnn_size)  # last: without it, the same weights

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        # uint8 scaled to [0, 1] here (network_input); --bf16: the trunk in autocast, its features float32
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            return self.encoder(network_input(x, self.dtype)).float()

    def initial_state(self, num_envs: int, device: torch.device) -> torch.Tensor | None:
        return None if self.memory is None else zero_state(self.memory, num_envs, device)

    def hidden(self, x: torch.Tensor, state=None, starts=None, spans=None):
        """The features the heads see, and the memory's state after them (None without memory)."""
        if self.memory is None:
            return self.encode(x), None
        return memory_features(self.memory, self.encode, x, state, starts, spans)

    def get_value(self, x: torch.Tensor, state=None, starts=None) -> torch.Tensor:
        return self.critic(self.hidden(x, state, starts)[0]).squeeze(-1)

    def get_action_and_value(self, x, action=None, deterministic=False, state=None, starts=None, spans=None):
        """Action (sampled unless given or deterministic), log-probability, entropy, value, memory state."""
        h, state = self.hidden(x, state, starts, spans)
        if self.continuous:  # a Gaussian per action dimension, its log std state-independent
            mean = self.actor(h)
            dist = Independent(Normal(mean, self.actor_logstd.expand_as(mean).exp(), validate_args=False), 1)
        else:
            dist = Categorical(logits=self.actor(h), validate_args=False)
        if action is None:
            action = dist.mode if deterministic else dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(h).squeeze(-1), state


def network_input(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An observation in `dtype`: uint8 (frames, bytes) scaled to [0, 1] on .to's copy; floats as they are."""
    return x.to(dtype).mul_(1.0 / 255.0) if x.dtype == torch.uint8 else x.to(dtype)


def recurrent_layer(rnn: str, n_in: int, size: int) -> nn.Module | None:
    """--rnn's nn.LSTM or nn.GRU (None: "none"), as CleanRL's ppo_atari_lstm.py: orthogonal, biases 0."""
    if rnn == "none":
        return None
    layer = (nn.LSTM if rnn == "lstm" else nn.GRU)(n_in, size)
    for name, param in layer.named_parameters():
        nn.init.constant_(param, 0.0) if name.startswith("bias") else nn.init.orthogonal_(param, 1.0)
    return layer


def zero_state(memory: nn.Module, num_envs: int, device: torch.device) -> torch.Tensor:
    """The state before an episode: zeros, (2, envs, size) for an LSTM (h and c), (1, envs, size) a GRU's."""
    return torch.zeros((2 if isinstance(memory, nn.LSTM) else 1, num_envs, memory.hidden_size), device=device)


def memory_features(memory: nn.Module, encode, x: torch.Tensor, state=None, starts=None, spans=None):
    """Agent.hidden with memory: x a step (B, ...) or sequences (T, B, ...) from `state`; features, state."""
    one_step = starts is None or starts.dim() == 1
    x = x.unsqueeze(0) if one_step else x
    h = encode(x.flatten(0, 1)).unflatten(0, x.shape[:2])
    state = zero_state(memory, x.shape[1], x.device) if state is None else state
    starts = torch.zeros(x.shape[:2], device=x.device) if starts is None else starts.reshape(x.shape[:2])
    h, state = run_memory(memory, h, state, starts, list(range(x.shape[0] + 1)) if spans is None else spans)
    return h.flatten(0, 1), state


def run_memory(memory: nn.Module, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor, spans: list):
    """(T, B, F) features from `state`, zeroed where `starts` is 1 (an episode's first); a call per span."""
    outputs = []
    for a, b in zip(spans[:-1], spans[1:], strict=False):
        state = state * (1.0 - starts[a]).view(1, -1, 1)
        if isinstance(memory, nn.LSTM):
            out, (h, c) = memory(x[a:b], (state[:1].contiguous(), state[1:].contiguous()))
            state = torch.cat([h, c])
        else:
            out, state = memory(x[a:b], state.contiguous())
        outputs.append(out)
    return torch.cat(outputs), state


def memory_spans(starts: np.ndarray) -> list[int]:
    """run_memory's spans for (T, N) episode starts: 0 < ... < T, one beginning wherever an episode starts."""
    return sorted({0, starts.shape[0]} | set(np.flatnonzero(starts.any(axis=1)).tolist()))


# The algorithm's maths: pure functions, tensors (or arrays) in and out (tests/test_maths_ppo_a2c.py)
def compute_gae(rewards, values, next_value, terminations, dones, valid, gamma: float, gae_lambda: float):
    """Generalised advantage estimation (Schulman et al. 2016) over a (T, N) rollout; values[t + 1] is the
    final observation's (next-step autoreset): a truncation bootstraps from it, a termination does not."""
    num_steps = rewards.shape[0]
    advantages, lastgaelam = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues * (1.0 - terminations[t]) - values[t]
        lastgaelam = (delta + gamma * gae_lambda * (1.0 - dones[t]) * lastgaelam) * valid[t]
        advantages[t] = lastgaelam
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def a2c_loss(logprob, entropy, value, advantages, returns, mask, ent_coef: float, vf_coef: float, norm_adv):
    """Policy gradient + value loss - entropy bonus over valid entries (Mnih et al. 2016), and the terms."""
    if norm_adv:
        mean = masked_mean(advantages, mask)
        var = ((advantages - mean) ** 2 * mask).sum() / (mask.sum() - 1.0).clamp(min=1.0)
        advantages = (advantages - mean) / (var.sqrt() + 1e-8)
    pg_loss = masked_mean(-advantages.detach() * logprob, mask)
    v_loss = masked_mean((value - returns) ** 2, mask)  # not halved, as SB3 and Baselines (ppo.py halves it)
    entropy_loss = masked_mean(entropy, mask)
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    return loss, dict(policy_loss=pg_loss.detach(), value_loss=v_loss.detach(), entropy=entropy_loss.detach())


def annealed_lr(learning_rate: float, iteration: int, num_iterations: int, anneal: bool) -> float:
    """Linear decay from learning_rate at iteration 1 to 0 after the last (Huang et al. 2022, detail 4)."""
    return learning_rate * (1.0 - (iteration - 1.0) / num_iterations) if anneal else learning_rate


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    resid = returns - values
    var_resid = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return torch.where(var_returns > 0, 1 - var_resid / var_returns, torch.full_like(var_returns, torch.nan))


def update_mean_var_count(mean, var, count, batch_mean, batch_var, batch_count):
    """Merge a batch's moments into running ones (Chan et al. 1979, parallel variance)."""
    delta = batch_mean - mean
    total = count + batch_count
    new_mean = mean + delta * batch_count / total
    m2 = var * count + batch_var * batch_count + delta**2 * count * batch_count / total
    return new_mean, m2 / total, total


def normalize_obs(obs: np.ndarray, rms: "RunningMeanStd | None", clip: float = 10.0) -> np.ndarray:
    """Float observations as float32, standardised and clipped with statistics; uint8 ones as they are."""
    if rms is None:
        return obs if obs.dtype == np.uint8 else obs.astype(np.float32, copy=False)
    return np.clip((obs - rms.mean) / np.sqrt(rms.var + 1e-8), -clip, clip).astype(np.float32)


def scale_reward(reward, discounted_return, done, rms: "RunningMeanStd", gamma: float, clip: float = 10.0):
    """Rewards over the running std of the discounted return (Huang et al. 2022, continuous detail 8)."""
    discounted_return = discounted_return * gamma + reward
    rms.update(discounted_return[:, None])
    return np.clip(reward / np.sqrt(rms.var + 1e-8), -clip, clip), np.where(done, 0.0, discounted_return)


class RunningMeanStd:
    """Mean and variance of all update() saw, float64 on the host; under torchrun, of every process's rows."""

    def __init__(self, shape: tuple, device: torch.device, world_size: int = 1):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4  # as gymnasium's wrappers
        self.device, self.world_size = device, world_size  # where, and among how many, rows are exchanged

    def update(self, x: np.ndarray) -> None:
        x = x.astype(np.float64)
        if self.world_size > 1:
            x = gather(torch.from_numpy(x).to(self.device), self.world_size).cpu().numpy()
        self.mean, self.var, self.count = update_mean_var_count(self.mean, self.var, self.count, x.mean(0), x.var(0), len(x))

    def state_dict(self) -> dict:
        return {k: torch.from_numpy(np.asarray(getattr(self, k))) for k in ("mean", "var", "count")}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"].double().numpy(), state["var"].double().numpy(), float(state["count"])


def to_obs_tensor(obs: np.ndarray, device: torch.device, obs_rms: RunningMeanStd | None) -> torch.Tensor:
    """One copy per step: uint8 stays uint8, floats become float32, normalised on the host with --norm-obs."""
    if obs_rms is not None:
        obs = obs.astype(np.float32)  # the statistics see what the network sees
        obs_rms.update(obs)
    x = torch.as_tensor(normalize_obs(obs, obs_rms), device=device)
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def update_episode_stats(ep_return, ep_length, raw_reward, valid, episode_end):
    """Running return and length per env, and the finished episodes' ones. `valid`: False on an autoreset's
    step (not counted); `episode_end`: the logged episode's end (Atari with episodic life: the game's)."""
    ep_return = ep_return + raw_reward
    ep_length = ep_length + valid
    finished_returns, finished_lengths = ep_return[episode_end], ep_length[episode_end]
    ep_return = np.where(episode_end, 0.0, ep_return)
    ep_length = np.where(episode_end, 0, ep_length)
    return ep_return, ep_length, finished_returns, finished_lengths


def make_optimizer(params, args: Args) -> torch.optim.Optimizer:
    settings = dict(lr=args.learning_rate, alpha=args.rmsprop_alpha, eps=args.rmsprop_eps)  # A3C's RMSprop
    if args.rmsprop_tf_like:  # TensorFlow's, eps inside the root
        return RMSpropTF(params, **settings)
    return torch.optim.RMSprop(params, **settings, foreach=True)  # foreach: a few ops over all parameters


class RMSpropTF(torch.optim.Optimizer):
    """TensorFlow's RMSprop (Baselines' A2C, SB3's RMSpropTFLike): eps inside the root, mean square from 1."""

    def __init__(self, params, lr: float, alpha: float, eps: float):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))
        for p in (p for group in self.param_groups for p in group["params"]):
            self.state[p]["square_avg"] = torch.ones_like(p)  # not in step(): a graph replay overwrites it

    @torch.no_grad()
    def step(self):
        for group, p in ((g, p) for g in self.param_groups for p in g["params"] if p.grad is not None):
            square_avg = self.state[p]["square_avg"].mul_(group["alpha"])
            square_avg.addcmul_(p.grad, p.grad, value=1.0 - group["alpha"])
            p.sub_(group["lr"] * p.grad / (square_avg + group["eps"]).sqrt())  # lr: a float or a tensor


def training_steps(agent: Agent, optimizer: torch.optim.Optimizer, args: Args):
    """The acting step and the update (loss, gradient, RMSprop step), both compiled by --compile (LeanRL)."""

    def update(batch: dict, memory: dict) -> dict:
        optimizer.zero_grad(set_to_none=True)
        _, logprob, entropy, value, _ = agent.get_action_and_value(batch["obs"], batch["actions"], **memory)
        loss, stats = a2c_loss(logprob, entropy, value, batch["advantages"], batch["returns"], batch["valid"],
                               args.ent_coef, args.vf_coef, args.norm_adv)  # fmt: skip
        loss.backward()
        if args.world_size > 1:  # torchrun: every process steps with all processes' mean gradient
            average_gradients(agent.parameters(), args.world_size)
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    return compiled_if_asked(agent, optimizer, update, args)


def main(args: Args) -> None:
    # --- set-up: checks, processes, run directory, writer, this process's envs (start_run, below); agent ---
    run = start_run(args)
    device = run.device
    agent = Agent(run.obs_space, run.action_space, args.rnn, args.rnn_size, args.bf16).to(device)
    optimizer = make_optimizer(agent.parameters(), args)
    act, update = training_steps(agent, optimizer, args)
    obs_rms = RunningMeanStd(run.obs_space.shape, device, args.world_size) if args.norm_obs else None
    return_rms = RunningMeanStd((), device, args.world_size) if args.norm_reward else None
    if args.world_size > 1:  # torchrun: the same weights, but each process samples its own actions
        torch.manual_seed(args.seed + run.rank)
    global_step, start_iteration = restore_run(args, run, agent, optimizer, obs_rms, return_rms)
    next_obs = to_obs_tensor(run.envs.reset()[0], device, obs_rms)
    T, N = args.num_steps, args.num_envs // args.world_size  # the rollout, preallocated on the device
    obs = torch.zeros((T, N) + run.obs_space.shape, dtype=next_obs.dtype, device=device)  # uint8 stays uint8
    if agent.frames:  # channels-last, (H, W, C) in memory, seen as (C, H, W), as the trunk's kernels want
        obs = obs.movedim(-3, -1).contiguous().movedim(-1, -3)
    action_dtype = torch.float32 if agent.continuous else torch.long
    actions = torch.zeros((T, N) + run.action_space.shape, dtype=action_dtype, device=device)
    values = torch.zeros((T, N), device=device)
    step_rows = torch.zeros((4, T, N), device=device)  # a step's rows, filled on the host, then one copy
    rewards, terminations, dones, valid = step_rows.unbind()
    next_valid = np.ones(N, dtype=bool)  # False on the reset step after a done
    state = agent.initial_state(N, device)  # recurrent: carried step to step, zeroed where an episode starts
    next_start = torch.ones(N, device=device)
    starts = None if state is None else torch.zeros((T, N), device=device)
    discounted_return = np.zeros(N)  # --norm-reward's
    ep_return, ep_length = np.zeros(N), np.zeros(N, dtype=np.int64)  # the logged episodes' running ones
    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = annealed_lr(args.learning_rate, iteration, args.num_iterations, args.anneal_lr)
        optimizer.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"].fill_(lr) if args.compile else lr
        # --- rollout ---
        rollout_state = state  # recurrent: where the update replays each env's sequence from
        finished = []  # (step, returns, lengths) of the episodes that end in this rollout
        for step in range(T):
            global_step += args.num_envs  # every process's envs
            obs[step] = next_obs
            with torch.no_grad():
                action, _, _, value, state = act(next_obs, state=state, starts=next_start)
            actions[step], values[step] = action, value
            env_action = action.cpu().numpy()
            if agent.continuous:  # the Gaussian sample is stored unclipped; the env sees it clipped
                env_action = np.clip(env_action, run.action_space.low, run.action_space.high)
            next_obs_np, reward, term, trunc, info = finite_step(run.envs.step(env_action), global_step)
            done = term | trunc
            train_reward = reward.astype(np.float32)  # as the rollout stores it, scaled with --norm-reward
            if return_rms is not None:
                train_reward, discounted_return = scale_reward(train_reward, discounted_return, done, return_rms, args.gamma)
            step_rows[:, step] = torch.from_numpy(np.array([train_reward, term, done, next_valid], "float32"))
            if state is not None:  # recurrent: zeroed after the reset step (it acts on the last observation)
                starts[step], next_start = next_start, 1.0 - valid[step]
            next_obs = to_obs_tensor(next_obs_np, device, obs_rms)
            end = info["terminated"].astype(bool) | trunc if run.is_atari else done  # Atari: the whole game
            score = info["reward"] if run.is_atari else reward  # the raw score, not the clipped one
            ep_return, ep_length, *ended = update_episode_stats(ep_return, ep_length, score, next_valid, end)
            finished.append((global_step, *ended))
            next_valid = ~done
        # --- advantages: n-step returns (GAE with lambda 1 by default) ---
        with torch.no_grad():
            next_value = agent.get_value(next_obs, state, next_start)
        advantages, returns = compute_gae(rewards, values, next_value, terminations, dones, valid, args.gamma, args.gae_lambda)
        # --- update: one gradient step on the whole rollout (memory: each env's sequence from its start) ---
        spans = None if state is None else memory_spans(starts.cpu().numpy() > 0)
        memory = {} if state is None else dict(state=rollout_state, starts=starts, spans=spans)
        batch = dict(obs=obs.flatten(0, 1) if state is None else obs, actions=actions.flatten(0, 1),
                     values=values.flatten(), advantages=advantages.flatten(), returns=returns.flatten(),
                     valid=valid.flatten())  # fmt: skip
        stats = update(batch, memory)
        # --- logging (process 0, every --log-interval iterations), evaluation, checkpoint, stop requests ---
        end_iteration(args, run, (agent, optimizer, obs_rms, return_rms), finished, stats, batch, lr, global_step, iteration)
    end_run(args, run, agent, obs_rms, global_step)  # the final model saved, reloaded and evaluated


# The algorithm ends here; a learner may stop. Below: this file's machinery (envs, torchrun, checks), then the shared plumbing.
import traceback  # (signal and sys: the shared block imports them)

import torch.distributed as dist

CHECKPOINT_FORMAT = 2  # the layout of checkpoints and models: raised when a field changes, so --resume refuses another
NETS = ("model", "optimizer", "obs_rms", "return_rms")  # the states a checkpoint holds of the nets main hands end_iteration

RANGES = dict(  # every numeric flag's interval, checked before anything else happens
    seed="[0, 1e9]", eval_every="[0, inf)", eval_episodes="[1, inf)", checkpoint_every="[0, inf)",
    progress_interval="[0, inf)", log_interval="[1, inf)", total_timesteps="[1, inf)", learning_rate="(0, inf)",
    num_envs="[1, inf)", num_steps="[1, inf)", gamma="[0, 1]", gae_lambda="[0, 1]", rmsprop_alpha="[0, 1)",
    rmsprop_eps="(0, inf)", ent_coef="[0, inf)", vf_coef="[0, inf)", max_grad_norm="(0, inf)", rnn_size="[1, 16384]",
)  # fmt: skip

# rl-baselines3-zoo's hyperparams/a2c.yml over SB3's A2C defaults (Args'), whose results benchmark/a2c.sh reproduces
# (classic: its CartPole-v1 entry; mujoco's `normalize: true`: VecNormalize's defaults); a typed flag wins over them
PRESETS = dict(
    classic=dict(),
    atari=dict(total_timesteps=10_000_000, num_envs=16, ent_coef=0.01, vf_coef=0.25, rmsprop_tf_like=True),
    mujoco=dict(total_timesteps=1_000_000, num_envs=1, norm_obs=True, norm_reward=True),
)


def preset_defaults(argv: list[str]) -> Args:
    """The defaults of the preset the command line asks for; auto picks it from the env's spaces."""
    env_id, preset = flag_value(argv, "env_id", Args.env_id), flag_value(argv, "preset", Args.preset)
    if preset == "auto":
        obs, act = env_spaces(env_id)
        preset = "atari" if len(obs.shape or ()) == 3 else "mujoco" if isinstance(act, gym.spaces.Box) else "classic"
    return Args(env_id=env_id, **PRESETS.get(preset, {}))


# --- envs ---
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
    """A vector env with next-step autoreset (the loop masks the reset step out), and whether it is envpool's Atari."""
    render_kwargs = dict(render_mode="rgb_array") if render else {}
    if pick_backend(env_id, num_envs, backend, render) == "envpool":
        atari = dict(episodic_life=episodic_life, reward_clip=reward_clip) if atari_id(env_id) else {}
        return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **atari, **render_kwargs), bool(atari)
    autoreset = dict(autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)  # gymnasium 1.x's, as envpool's
    envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", vector_kwargs=autoreset, **render_kwargs)
    envs.reset(seed=seed)
    return envs, False


def atari_id(env_id: str) -> bool:
    """An envpool Atari id (its config has the life-loss option), whose observations stack frames."""
    return envpool_has(env_id) and hasattr(envpool.make_spec(env_id).config, "episodic_life")


def can_render(env_id: str, backend: str = "auto") -> bool:
    """--capture-video's rule, checked first: envpool's MuJoCo ends the process without OpenGL; gymnasium's needs pygame."""
    if backend == "gymnasium" or not envpool_has(env_id):
        return importlib.util.find_spec("pygame") is not None
    mujoco = envpool.registration.registry.specs[env_id][0].startswith("envpool.mujoco")
    return not mujoco or bool(os.environ.get("DISPLAY")) or os.environ.get("MUJOCO_GL") in ("egl", "osmesa")


def compiled_if_asked(agent: Agent, optimizer: torch.optim.Optimizer, update, args: Args):
    """training_steps' two functions, compiled with --compile (LeanRL's way), the rate then a tensor: no recompiles."""
    if not args.compile:
        return agent.get_action_and_value, update
    optimizer.param_groups[0]["lr"] = torch.tensor(args.learning_rate, device=next(agent.parameters()).device)
    mode = "reduce-overhead" if args.cudagraphs else "default"  # reduce-overhead: inductor's CUDA graph trees
    return torch.compile(agent.get_action_and_value, mode=mode), torch.compile(update, mode=mode)


def bf16_note(device: torch.device) -> str:
    """The start line's word where bfloat16 is emulated, so --bf16 likely slower than float32: a GPU before Ampere
    (compute capability 8), or a CPU whose /proc/cpuinfo (Linux, as envpool) names no AVX512-BF16, AMX or Arm BF16."""
    if device.type == "cuda":
        native = torch.cuda.get_device_capability(device)[0] >= 8
    else:
        with open("/proc/cpuinfo") as f:
            native = not {"avx512_bf16", "amx_bf16", "bf16"}.isdisjoint(f.read().split())
    return "" if native else f"note: no native bfloat16 on {device}: --bf16 is likely slower than float32"


def evaluate(agent: Agent, obs_rms: RunningMeanStd | None, args: Args, device: torch.device, video: str | None = None):
    """The returns of each eval env's first whole episode (raw score, no life loss or clipping), statistics frozen."""
    envs, _ = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, False, False, args.env_backend, video is not None)
    obs, _ = envs.reset()
    returns, finished = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool)
    frames, state = [], agent.initial_state(args.eval_episodes, device)  # memory carried through each first episode
    while not finished.all():
        if video is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        with torch.no_grad():
            x = torch.as_tensor(normalize_obs(obs, obs_rms), device=device)
            action, _, _, _, state = agent.get_action_and_value(x, deterministic=args.eval_deterministic, state=state)
            action = action.cpu().numpy()
        if agent.continuous:
            action = np.clip(action, envs.single_action_space.low, envs.single_action_space.high)
        obs, reward, term, trunc, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
    envs.close()
    write_video(video, frames)
    return returns


def restore_run(args: Args, run: "Run", agent, optimizer, obs_rms, return_rms) -> tuple[int, int]:
    """--resume: weights, RMSprop's state, statistics and this process's RNGs put back; the step and iteration to go on."""
    if (ckpt := run.ckpt) is None:
        return 0, 1
    for key, net in zip(NETS, (agent, optimizer, obs_rms, return_rms), strict=True):
        if net is not None:  # the statistics: with --norm-obs and --norm-reward
            net.load_state_dict(ckpt[key])
    rng_state(run.device, restore=process_rng(ckpt, run.rank, args.world_size))
    if run.rank == 0:
        print(f"resumed {run.dir} at step {ckpt['global_step']:,}")
    return ckpt["global_step"], ckpt["iteration"] + 1


def storage(args: Args, obs_space: gym.Space, action_space: gym.Space, device: torch.device) -> dict:
    """The rollout for check_storage: observations as they come (uint8 as uint8), actions, seven float32 (T, N) rows."""
    T, N, shape = args.num_steps, args.num_envs, "x".join(map(str, obs_space.shape))
    obs_bytes = int(np.prod(obs_space.shape)) * (1 if obs_space.dtype == np.uint8 else 4)
    action_bytes = 4 * int(np.prod(action_space.shape)) if isinstance(action_space, gym.spaces.Box) else 8
    rollout = f"the rollout (--num-envs {N} x --num-steps {T} steps of {shape} observations)"
    return {rollout: (T * N * (obs_bytes + action_bytes + 7 * 4), device, "lower --num-envs or --num-steps")}


def check_frame_size(env_id: str, obs_space: gym.Space) -> None:
    """Frames too small for the Nature CNN (36x36 -> 8x8 -> 3x3 -> 1x1 through its three layers): refused in one line."""
    if len(obs_space.shape) == 3 and min(obs_space.shape[1:]) < 36:
        h, w = obs_space.shape[1:]
        fail(f"the Nature CNN takes frames of at least 36x36, and {env_id} has {h}x{w}; scale them up, or flatten them")


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    """What the ranges alone cannot tell: the env's spaces, and flags that only make sense together; the sizes."""
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        fail(f"a2c.py handles Discrete and Box action spaces; {args.env_id} has {action_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        hint = "use qlearning.py for Discrete observations" if isinstance(obs_space, gym.spaces.Discrete) else "wrap the env"
        fail(f"a2c.py needs a vector or a (C, H, W) image observation, and {args.env_id} has {obs_space}; {hint}")
    check_frame_size(args.env_id, obs_space)
    refuse_meaningless(args, [  # --norm-obs: normalised floats do not fit the uint8 storage
        (("norm_obs",), obs_space.dtype == np.uint8, f"is for float observations, and {args.env_id} has uint8 ones"),
        (("episodic_life", "reward_clip"), not atari_id(args.env_id),
         f"is for envpool's Atari ids, and {args.env_id} is not one"),
        (("rnn_size",), args.rnn == "none", "sizes the recurrent layer, and this run has none (see --rnn)"),
        (("eval_episodes", "eval_deterministic", "capture_video"), not (args.eval_every > 0 or args.save_model),
         "sets the evaluations, and this run has none (see --eval-every and --save-model)"),
        (("bf16",), len(obs_space.shape) != 3, f"runs the convolutional trunk of frames, and {args.env_id} has vectors"),
    ])  # fmt: skip
    args.norm_obs = args.norm_obs and obs_space.dtype != np.uint8  # a preset's: uint8 observations are scaled, not normalised
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device, and this run is on the CPU; leave it out (--compile works on the CPU)")
    args.compile = args.compile or args.cudagraphs
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # --rnn's update spans change length every rollout (a compile each); torchrun averages gradients outside the update
    if args.compile and (args.rnn != "none" or args.world_size > 1):
        fail("--compile and --cudagraphs compile one process's feed-forward update; leave them out with --rnn or torchrun")
    if args.num_envs % args.world_size:
        fail(f"--num-envs {args.num_envs} does not split evenly over {args.world_size} processes; "
             f"pass a multiple of {args.world_size}")  # fmt: skip
    args.batch_size = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout (--num-envs {args.num_envs} x --num-steps "
             f"{args.num_steps} = {args.batch_size} steps); raise it, or lower --num-envs or --num-steps")  # fmt: skip
    if args.capture_video and not can_render(args.env_id, args.env_backend):  # typed, or a resumed checkpoint's
        fail(f"--capture-video: {args.env_id} cannot render here (it needs OpenGL or pygame); pass --no-capture-video")


# --- several processes (torchrun): what one process alone does not need, so not part of the shared plumbing ---
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


def average_gradients(parameters, world_size: int) -> None:
    """Gradients replaced by their mean over the processes, in one all-reduce of one flat buffer; by hand, as CleanRL's
    ppo_atari_multigpu.py does, since DDP hooks the wrapped module's forward, which the update reaches around."""
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads]) / world_size
    dist.all_reduce(flat)
    for g, mean in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(mean.view_as(g))


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


def gather_episodes(finished: list, world_size: int) -> list:
    """Every process's (step, returns, lengths) of an iteration's episodes, in step order, then process order."""
    return sorted((entry for rows in gather(finished, world_size) for entry in rows), key=lambda entry: entry[0])


def process_rng(ckpt: dict, rank: int, world_size: int) -> dict:
    """This process's RNG states in a checkpoint, which holds every process's; refused for another number of them."""
    if (written := len(ckpt["rng"])) != world_size:
        launcher = f"torchrun --nproc_per_node {written}" if written > 1 else "python (one process)"
        fail(f"the checkpoint was written by {written} process(es), and this run has {world_size}; resume it with {launcher}")
    return ckpt["rng"][rank]


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


# --- what main calls: start_run, end_iteration (logging, evaluation, checkpoint, stop), end_run ---
def start_run(args: Args) -> "Run":
    """Every check before the run directory is made; then this process (torchrun: its share), the run and its envs."""
    obs_space, action_space = env_spaces(args.env_id)
    check_args(args, obs_space, action_space)
    backend = pick_backend(args.env_id, args.num_envs, args.env_backend)  # one line where the chosen backend lacks the env
    rank, device, note = start_processes(args, small=len(obs_space.shape) == 1)
    check_storage(storage(args, obs_space, action_space, device))
    ckpt = load_checkpoint(args.resume, args.env_id) if args.resume else None
    if ckpt is not None:  # a checkpoint of another number of processes: refused before anything is written
        process_rng(ckpt, rank, args.world_size)
    n = args.num_envs // args.world_size
    run = Run(args, ckpt, device, args.num_iterations * args.batch_size, share=f"stepping {n} of the {args.num_envs} envs")
    for line in (note, args.bf16 and bf16_note(device)):
        if line and rank == 0:
            print(line, flush=True)
    # a resumed run's envs take a fresh seed; process r steps envs r*n .. r*n + n-1, with the backend one process would pick
    seed = args.seed + (ckpt["global_step"] if ckpt else 0) + rank * n
    run.envs, run.is_atari = make_env(args.env_id, n, seed, args.episodic_life, args.reward_clip, backend)
    run.obs_space, run.action_space = obs_space, action_space
    run.loss_sums, run.updates, run.finished = 0.0, 0, []  # end_iteration's, since its last log
    return run


def end_iteration(args: Args, run: "Run", nets: tuple, finished: list, stats: dict, batch: dict, lr, global_step, iteration):
    """Process 0 checks for NaN or inf (one sync), logs every --log-interval iterations and evaluates; then the checkpoint."""
    agent, optimizer, obs_rms, return_rms = nets
    run.loss_sums = run.loss_sums + torch.stack(list(stats.values()))
    run.updates, run.finished = run.updates + 1, run.finished + finished
    if run.rank == 0:
        *sums, total = torch.cat([run.loss_sums, parameter_sum(agent)]).tolist()
        check_training({**dict(zip(stats, sums, strict=True)), "parameter sum": total}, global_step)
    stopping = stop_everywhere(run.stop, args.world_size, run.device)
    if iteration % args.log_interval == 0 or iteration == args.num_iterations or stopping:
        episodes = gather_episodes(run.finished, args.world_size)
        if run.rank == 0:
            explained = explained_variance(batch["values"], batch["returns"], batch["valid"]).reshape(1)
            for step, ended_returns, ended_lengths in episodes:
                run.log_episodes(ended_returns, ended_lengths, step)
            means = torch.cat([run.loss_sums / run.updates, explained]).tolist()
            for name, value in zip((*stats, "explained_variance"), means, strict=True):
                run.writer.add_scalar(f"losses/{name}", value, global_step)
            run.writer.add_scalar("charts/learning_rate", lr, global_step)
            run.log(global_step, global_step, force=iteration == args.num_iterations)
        run.loss_sums, run.updates, run.finished = 0.0, 0, []
    if run.rank == 0 and crossed(global_step, args.batch_size, args.eval_every):
        with run.paused():
            run.log_eval(evaluate(agent, obs_rms, args, run.device, run.video(global_step)), global_step)
    if crossed(global_step, args.batch_size, args.checkpoint_every) or stopping:
        rngs = gather(rng_state(run.device), args.world_size)
        if run.rank == 0:  # None: a statistic this run does not keep
            state = {key: None if net is None else net.state_dict() for key, net in zip(NETS, nets, strict=True)}
            run.checkpoint(**state, global_step=global_step, iteration=iteration, rng=rngs)
    if stopping:
        run.envs.close()
        leave(run, stopped_at=f"step {global_step:,}")


def end_run(args: Args, run: "Run", agent: Agent, obs_rms, global_step: int) -> None:
    """The envs closed, the processes left together; process 0 saves, reloads and evaluates the final model (--save-model)."""
    run.envs.close()
    leave(run, stay=run.rank == 0)  # process 0 stays, to save the final model
    if args.save_model:  # as a user who loads the model evaluates it: a new agent, the statistics frozen
        state = run.save_and_reload(model=agent.state_dict(), obs_rms=obs_rms.state_dict() if obs_rms else None)
        eval_agent = Agent(run.obs_space, run.action_space, args.rnn, args.rnn_size, args.bf16).to(run.device)
        eval_agent.load_state_dict(state["model"])
        eval_rms = RunningMeanStd(run.obs_space.shape, run.device) if state["obs_rms"] is not None else None
        if eval_rms is not None:
            eval_rms.load_state_dict(state["obs_rms"])
        run.log_eval(evaluate(eval_agent, eval_rms, args, run.device, run.video()), global_step, run.model_path)
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
