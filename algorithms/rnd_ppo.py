"""RND (Random Network Distillation, Burda et al. 2019) with PPO on envpool Atari; `benchmark/rnd_ppo.sh`.

Reading guide: this part is the algorithm, down to the line that begins `# The algorithm ends here`: Args,
the agent and RND's networks, the running statistics, the maths of the intrinsic reward and of both advantage
streams, the update and `main`. Below it: this file's machinery (envs, rooms, torchrun, evaluation, checks,
start_run, end_run), then the run plumbing all eight files share. docs/rnd_ppo.md has the sources.
"""

import os
from dataclasses import dataclass
from typing import Literal, NamedTuple

if "OMP_NUM_THREADS" not in os.environ:  # before torch loads: idle threads sleep, not spin (docs/speed.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import tyro
from torch import nn
from torch.nn import functional as F


@dataclass
class Args:
    # --- algorithm: PPO (the defaults are the paper's and the reference's; docs/rnd_ppo.md has sources) ---
    total_timesteps: int = 491_520_000
    """env steps of all envs (30K rollouts x 128 envs x 128 steps, about 2B frames); --resume may raise it"""
    learning_rate: float = 1e-4
    """Adam learning rate (policy, both value heads and the predictor)"""
    num_envs: int = 128
    """parallel envs"""
    num_steps: int = 128
    """steps per env per rollout"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0 (off in the reference; CleanRL's ppo_rnd_envpool.py anneals)"""
    gamma: float = 0.999
    """discount of the extrinsic (episodic) return"""
    int_gamma: float = 0.99
    """discount of the intrinsic (non-episodic) return, and of the intrinsic reward filter"""
    gae_lambda: float = 0.95
    """lambda of generalised advantage estimation (both streams)"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """epochs over each rollout"""
    norm_adv: bool = False
    """standardise the combined advantages per minibatch (CleanRL's ppo_rnd_envpool.py; not the reference)"""
    clip_coef: float = 0.1
    """surrogate clipping coefficient"""
    ent_coef: float = 0.001
    """entropy bonus coefficient"""
    vf_coef: float = 1.0
    """weight of the value losses 0.5 (V_ext - R_ext)^2 + 0.5 (V_int - R_int)^2 (the reference's 1)"""
    max_grad_norm: float = 0.0
    """global gradient norm clip (0: none, as the reference; CleanRL's clips at 0.5)"""
    reward_clip: bool = True
    """train on the sign of the extrinsic reward, as the reference (the logged return is the raw score)"""
    # --- algorithm: RND ---
    ext_coef: float = 2.0
    """weight of the extrinsic advantage in the combined advantage"""
    int_coef: float = 1.0
    """weight of the intrinsic advantage in the combined advantage"""
    update_proportion: float = 0.25
    """fraction of each minibatch the predictor is trained on"""
    num_iterations_obs_norm_init: int = 50
    """rollouts of random actions (num_steps of every env) that start the observation statistics (0: none)"""
    chunk_size: int = 0
    """observations per forward/backward pass of a minibatch, the same update (0: 256 on CPU, all on CUDA)"""
    # --- memory: a recurrent policy ---
    rnn: Literal["none", "lstm", "gru"] = "none"
    """a recurrent layer between the encoder and the heads (none: the paper's feed-forward policy)"""
    rnn_size: int = 128
    """units of the recurrent layer (and of its state)"""
    # --- env: the paper's Atari settings ---
    env_id: str = "MontezumaRevenge-v5"
    """envpool Atari id (MontezumaRevenge-v5, Venture-v5, ...); rooms are logged for Montezuma and Pitfall"""
    sticky_action_prob: float = 0.25
    """probability that the emulator repeats the previous action on each frame (sticky actions)"""
    max_episode_steps: int = 4500
    """episode cap in agent steps (4,500 x 4 frames = 18,000 frames); the cap is a truncation"""
    # --- run settings ---
    exp_name: str = "rnd_ppo"
    """name of this experiment, part of the run directory name"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    compile: bool = False
    """torch.compile the acting step, the minibatch chunks and the optimiser step (off: eager code runs)"""
    cudagraphs: bool = False
    """CUDA graphs on top of --compile (torch.compile's "reduce-overhead"); needs CUDA, implies --compile"""
    bf16: bool = False
    """the agent's trunk and RND's networks in bfloat16 autocast; weights, heads and losses stay float32"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 to runs/<run>/videos"""
    save_model: bool = False
    """save the final model to runs/<run>/rnd_ppo.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate on separate envs every this many env steps (0: only after training, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    eval_deterministic: bool = False
    """evaluate the greedy policy (argmax); off: the sampled policy, the one trained and reported"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    resume: str = ""
    """a checkpoint.pt to resume from; the run goes on in its directory, with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    # --- computed by check_args ---
    batch_size: tyro.conf.Suppress[int] = 0
    """num_envs * num_steps (computed)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """batch_size // num_minibatches (computed)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """total_timesteps // batch_size (computed)"""
    world_size: tyro.conf.Suppress[int] = 1
    """processes training together (WORLD_SIZE under torchrun), each with num_envs / world_size (computed)"""


# Networks: the reference's (openai/random-network-distillation), with its gains; Huang et al. 2022, detail 2:
# orthogonal weights, zero biases
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The reference's CnnPolicy (cnn_policy_param_matched.py, extrahid): three convolutions (the third 4x4;
    CleanRL's 3x3), dense 256 and 448 (--rnn: then the recurrent layer), a residual dense layer each for the
    policy and both values; orthogonal gains sqrt(2), 0.1 in the residual layers, 0.01 on the heads."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, rnn="none", rnn_size=128, bf16=False):
        super().__init__()
        self.dtype = torch.bfloat16 if bf16 else torch.float32  # --bf16: the trunk in bfloat16 autocast
        self.trunk = nn.Sequential(
            layer_init(nn.Conv2d(obs_space.shape[0], 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 4, stride=1)), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        with torch.no_grad():
            n_flat = self.trunk(torch.zeros(1, *obs_space.shape)).shape[1]
        self.trunk.extend([layer_init(nn.Linear(n_flat, 256)), nn.ReLU()])
        self.trunk.extend([layer_init(nn.Linear(256, 448)), nn.ReLU()])
        n_head = 448 if rnn == "none" else rnn_size
        self.extra_policy = layer_init(nn.Linear(n_head, n_head), std=0.1)
        self.extra_value = layer_init(nn.Linear(n_head, n_head), std=0.1)
        self.actor = layer_init(nn.Linear(n_head, int(action_space.n)), std=0.01)
        self.critic_ext = layer_init(nn.Linear(n_head, 1), std=0.01)
        self.critic_int = layer_init(nn.Linear(n_head, 1), std=0.01)
        self.memory = recurrent_layer(rnn, 448, rnn_size)  # last: a feed-forward agent draws the same weights
        # channels-last convolutions: 25-30% faster on a CPU (oneDNN, measured on one core); suit tensor cores
        self.to(memory_format=torch.channels_last)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        # frames stay uint8 in storage and become float (--bf16: bfloat16, the trunk autocast) only here
        device_type = "cuda" if x.is_cuda else "cpu"  # autocast's
        with torch.autocast(device_type, torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            return self.trunk(x.contiguous(memory_format=torch.channels_last).to(self.dtype) / 255.0).float()

    def initial_state(self, num_envs: int, device: torch.device) -> torch.Tensor | None:
        return None if self.memory is None else zero_state(self.memory, num_envs, device)

    def hidden(self, x: torch.Tensor, state=None, starts=None, spans=None):
        """The features the heads see, and the memory's state after them (None without memory)."""
        if self.memory is None:
            return self.encode(x), None
        return memory_features(self.memory, self.encode, x, state, starts, spans)

    def forward(self, x: torch.Tensor, state=None, starts=None, spans=None):
        """Policy logits, extrinsic value, intrinsic value, and the memory's state after x (see hidden)."""
        h, state = self.hidden(x, state, starts, spans)
        policy_h, value_h = h + F.relu(self.extra_policy(h)), h + F.relu(self.extra_value(h))
        logits = self.actor(policy_h)
        return logits, self.critic_ext(value_h).squeeze(-1), self.critic_int(value_h).squeeze(-1), state

    def act(self, x: torch.Tensor, deterministic: bool = False, state=None, starts=None):
        """Action, its log-probability, both values and the memory's state, for one step of all envs."""
        logits, ext_value, int_value, state = self(x, state, starts)
        # validate_args=False: argument checks cost a host sync per call on CUDA
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        action = logits.argmax(-1) if deterministic else dist.sample()
        return action, dist.log_prob(action), ext_value, int_value, state


def rnd_network(predictor: bool) -> nn.Sequential:
    """The reference's target and predictor (define_self_prediction_rew) on one normalised frame: leaky-ReLU
    convolutions (TF's slope 0.2), then 512 linear (target) or 512-512-512 with ReLUs; gains sqrt(2)."""
    layers = [
        layer_init(nn.Conv2d(1, 32, 8, stride=4)), nn.LeakyReLU(0.2),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.LeakyReLU(0.2),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.LeakyReLU(0.2),
        nn.Flatten(),
    ]  # fmt: skip
    if predictor:
        layers += [layer_init(nn.Linear(3136, 512)), nn.ReLU(), layer_init(nn.Linear(512, 512)), nn.ReLU()]
        return nn.Sequential(*layers, layer_init(nn.Linear(512, 512)))
    return nn.Sequential(*layers, layer_init(nn.Linear(3136, 512)))


class RNDModel(nn.Module):
    """A fixed random target network and a predictor trained to match it; its error is the novelty."""

    def __init__(self, bf16: bool = False):
        super().__init__()
        self.dtype = torch.bfloat16 if bf16 else torch.float32  # --bf16: both networks in bfloat16 autocast
        self.target, self.predictor = rnd_network(predictor=False), rnd_network(predictor=True)
        self.target.requires_grad_(False)
        self.to(memory_format=torch.channels_last)  # as the Agent's

    def error(self, x: torch.Tensor) -> torch.Tensor:
        """Squared prediction error per observation, mean of the 512 features (the reference's int_rew)."""
        x = x.contiguous(memory_format=torch.channels_last)
        device_type = "cuda" if x.is_cuda else "cpu"  # autocast's
        with torch.autocast(device_type, torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            predicted, target = self.predictor(x).float(), self.target(x).float()  # the error in float32
        return ((predicted - target) ** 2).mean(-1)


# The memory (--rnn): one recurrent layer, run over whole sequences, its state zeroed where an episode starts
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


# Running statistics, on the device: the observations' per pixel (RND's input) and the intrinsic return's
def update_mean_var_count(mean, var, count, batch_mean, batch_var, batch_count):
    """Merge a batch's moments into running ones (Chan et al. 1979, parallel variance)."""
    delta = batch_mean - mean
    total = count + batch_count
    new_mean = mean + delta * batch_count / total
    m2 = var * count + batch_var * batch_count + delta**2 * count * batch_count / total
    return new_mean, m2 / total, total


class RunningMeanStd:
    """Mean and variance of everything passed to update(), on the device in float64; under torchrun, of every
    process's rows in process order: every process keeps the statistics of one process with all the envs."""

    def __init__(self, shape: tuple, device: torch.device, world_size: int = 1):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.tensor(1e-4, dtype=torch.float64, device=device)  # as gymnasium's wrappers
        self.world_size = world_size

    def update(self, x: torch.Tensor) -> None:
        x = gather(x.double(), self.world_size)
        self.mean, self.var, self.count = update_mean_var_count(
            self.mean, self.var, self.count, x.mean(0), x.var(0, unbiased=False), x.shape[0]
        )

    def state_dict(self) -> dict:
        return dict(mean=self.mean.cpu(), var=self.var.cpu(), count=self.count.cpu())

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = (state[k].to(self.mean.device) for k in ("mean", "var", "count"))


def update_frame_stats(rms: RunningMeanStd, frames: torch.Tensor, chunk: int = 64, world_size: int = 1):
    """Merge the per-pixel moments of uint8 frames (n, 1, 84, 84) into rms: sums of pixels and squares over
    chunks of 64 frames in float32 (whole numbers below 2^24: exact; in the cache), added up in float64."""
    flat = frames.flatten(1)
    total = torch.zeros(flat.shape[1], dtype=torch.float64, device=frames.device)
    squares = torch.zeros_like(total)
    for part in flat.split(chunk):
        x = part.float()
        total += x.sum(0)
        squares += (x * x).sum(0)
    n = frames.shape[0]
    if world_size > 1:  # under torchrun, every process's frames (as many in each): their sums added up
        sums = torch.stack([total, squares])
        dist.all_reduce(sums)
        (total, squares), n = sums, n * world_size
    mean = total / n
    var = (squares / n - mean**2).clamp(min=0.0)
    mean, var = mean.reshape(frames.shape[1:]), var.reshape(frames.shape[1:])
    rms.mean, rms.var, rms.count = update_mean_var_count(rms.mean, rms.var, rms.count, mean, var, n)


def init_obs_stats(envs, obs_rms: RunningMeanStd, frames: torch.Tensor, num_actions: int, args: Args):
    """Observation statistics from random actions (the reference's collect_random_statistics, run_atari.py):
    rollouts of every env into `frames`, the statistics updated after each; yields their count (progress)."""
    num_steps, num_envs = frames.shape[:2]
    for i in range(args.num_iterations_obs_norm_init):
        for step in range(num_steps):
            next_obs = envs.step(torch.randint(num_actions, (num_envs,)).numpy())[0]
            frames[step] = torch.as_tensor(next_obs[:, -1:], device=frames.device)
        update_frame_stats(obs_rms, frames.flatten(0, 1), world_size=args.world_size)
        yield i + 1


# The maths of RND: the intrinsic reward and its normalisation, both advantage streams, the losses
def normalize_frames(frames: torch.Tensor, rms: RunningMeanStd, clip: float = 5.0) -> torch.Tensor:
    """RND's input: (x - mean) / std per pixel, clipped to [-5, 5] (the reference's ph_mean / ph_std; no
    epsilon: the variance starts at 1, count 1e-4, so it stays positive where a pixel never changes)."""
    return ((frames.float() - rms.mean.float()) / rms.var.float().sqrt()).clamp(-clip, clip)


def prediction_errors(rnd: RNDModel, frames: torch.Tensor, rms: RunningMeanStd, chunk: int) -> torch.Tensor:
    """Each rollout step's intrinsic reward: the novelty of the frame it reached, (T, N, 1, 84, 84)."""
    flat = frames.flatten(0, 1)
    errors = torch.empty(flat.shape[0], device=flat.device)
    with torch.no_grad():
        for i in range(0, flat.shape[0], chunk):
            errors[i : i + chunk] = rnd.error(normalize_frames(flat[i : i + chunk], rms))
    return errors.reshape(frames.shape[:2])


def forward_filter(rewards: torch.Tensor, rewems: torch.Tensor, valid: torch.Tensor, gamma: float):
    """The reference's RewardForwardFilter over a (T, N) rollout: rewems = gamma * rewems + r per env, across
    episode ends (non-episodic), not on a reset step (valid 0). Returns the value at each step, the last."""
    filtered = torch.empty_like(rewards)
    for t in range(rewards.shape[0]):
        rewems = torch.where(valid[t].bool(), rewems * gamma + rewards[t], rewems)
        filtered[t] = rewems
    return filtered, rewems


def normalize_intrinsic(rewards, rewems, valid, rms: RunningMeanStd, gamma: float, world_size: int = 1):
    """Intrinsic rewards over the running std of their discounted sum (Burda et al. 2019, section 2.4; ppo_agent.py),
    updated first with the rollout's filtered values (not the reset steps'). Returns rewards, rewems."""
    filtered, rewems = forward_filter(rewards, rewems, valid, gamma)
    if world_size > 1:  # under torchrun, every process's values, laid out as one process's (T, all envs)
        filtered, valid = (gather(x.T.contiguous(), world_size).T for x in (filtered, valid))
    kept = filtered[valid.bool()]
    if kept.numel():
        rms.update(kept)
    return (rewards / rms.var.sqrt()).float(), rewems


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


def intrinsic_gae(rewards, values, next_value, valid, gamma: float, gae_lambda: float):
    """GAE of the non-episodic intrinsic return (the reference's use_news=0), across episode ends. A reset
    step (valid 0) is skipped, as the reference has none, and gets advantage 0 (docs/rnd_ppo.md, detail 7)."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam, nextvalues = torch.zeros_like(next_value), next_value
    for t in reversed(range(num_steps)):
        gae = rewards[t] + gamma * nextvalues - values[t] + gamma * gae_lambda * lastgaelam
        keep = valid[t].bool()
        lastgaelam, nextvalues = torch.where(keep, gae, lastgaelam), torch.where(keep, values[t], nextvalues)
        advantages[t] = gae * valid[t]
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def standardize(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Advantages to mean 0, std 1 over a minibatch's valid entries (CleanRL's norm_adv); reset steps: 0."""
    mean = masked_mean(advantages, mask)
    var = ((advantages - mean) ** 2 * mask).sum() / (mask.sum() - 1.0).clamp(min=1.0)
    return (advantages - mean) / (var.sqrt() + 1e-8) * mask


def annealed_lr(learning_rate: float, iteration: int, num_iterations: int, anneal: bool) -> float:
    """Linear decay from learning_rate at iteration 1 to 0 after the last (Huang et al. 2022, detail 4)."""
    return learning_rate * (1.0 - (iteration - 1.0) / num_iterations) if anneal else learning_rate


def rnd_ppo_loss(logits, actions, oldlogprob, advantages, ext_value, int_value, ext_returns, int_returns, mask, count, args):
    """Clipped surrogate - entropy bonus + both value losses (unclipped, as the reference's), means over the
    `count` valid entries of the whole minibatch (the chunks' losses add up). Returns the loss and, detached,
    the means of its terms (policy, ext value, int value, entropy), approx KL and clip fraction."""
    dist = torch.distributions.Categorical(logits=logits, validate_args=False)
    logratio = dist.log_prob(actions) - oldlogprob
    ratio = logratio.exp()
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef))
    v_ext, v_int = 0.5 * (ext_value - ext_returns) ** 2, 0.5 * (int_value - int_returns) ** 2
    entropy = dist.entropy()
    with torch.no_grad():  # Schulman's "approx KL" estimator k3, http://joschu.net/blog/kl-approx.html
        approx_kl, clipped = (ratio - 1) - logratio, ((ratio - 1.0).abs() > args.clip_coef).float()
    sums = (torch.stack([pg, v_ext, v_int, entropy, approx_kl, clipped]) * mask).sum(1) / count
    pg_loss, ext_v_loss, int_v_loss, entropy_loss = sums[:4]
    return pg_loss - args.ent_coef * entropy_loss + args.vf_coef * (ext_v_loss + int_v_loss), sums.detach()


def predictor_loss(errors: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The predictor's loss (the reference's aux_loss): the chosen valid frames' errors, over count."""
    return (errors * mask).sum() / count


# The update: minibatches in chunks whose gradients add up, one optimiser step for PPO and the predictor
def training_steps(agent: Agent, rnd: RNDModel, optimizer: torch.optim.Optimizer, params: list, args: Args):
    """The acting step, a chunk of PPO's and of the predictor's loss (forward, loss, backward: the chunks'
    gradients add up) and the optimiser step; eager as written here, or compiled (--compile)."""

    def ppo_chunk(mb: dict, advantages, valid, count, memory: "Memory | None" = None):
        if memory is None:
            logits, ext_value, int_value, _ = agent(mb["obs"])
        else:  # whole envs' steps, time first, replayed as (T, envs) sequences from the rollout's first state
            obs = mb["obs"].unflatten(0, (args.num_steps, -1))
            logits, ext_value, int_value, _ = agent(obs, memory.state, memory.starts, memory.spans)
        loss, sums = rnd_ppo_loss(
            logits, mb["actions"], mb["logprobs"], advantages, ext_value, int_value, mb["ext_returns"],
            mb["int_returns"], valid, count, args,
        )  # fmt: skip
        loss.backward()
        return sums

    def predictor_chunk(x, valid, count):
        loss = predictor_loss(rnd.error(x), valid, count)
        loss.backward()
        return loss.detach()

    def step():
        if args.world_size > 1:  # every process takes the same step: the mean of all processes' gradients
            average_gradients(params, args.world_size)
        if args.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=not args.compile)

    steps = dict(act=agent.act, ppo_chunk=ppo_chunk, predictor_chunk=predictor_chunk, step=step)
    if not args.compile:
        return steps
    # --compile, as LeanRL: a graph per shape; gradients made once, zeroed in place (pytorch/pytorch#169545)
    for p in params:
        p.grad = torch.zeros_like(p)
    mode = "reduce-overhead" if args.cudagraphs else "default"  # reduce-overhead: inductor's CUDA graph trees
    return {name: torch.compile(fn, mode=mode, dynamic=False) for name, fn in steps.items()}


class Memory(NamedTuple):
    """What the update replays a recurrent policy's sequences from (--rnn): the state every env (or a chunk's)
    started the rollout with, the episode starts (T, envs) and run_memory's spans."""

    state: torch.Tensor
    starts: torch.Tensor
    spans: list


def minibatches(args: Args, device: torch.device, memory: Memory | None, batch_size: int | None = None):
    """An epoch's minibatches: (batch indices, chunks, the indices the predictor trains on), a chunk as
    (indices, positions in the minibatch, memory). Without memory: random steps, the predictor on the first
    update_proportion (a random subset; the reference draws each entry with that probability). With memory
    (the rollout's first state, episode starts, run_memory's spans): random groups of whole envs, time first,
    in chunks of whole envs."""
    batch_size = batch_size or args.batch_size  # this process's share of the batch (under torchrun)
    minibatch_size = batch_size // args.num_minibatches
    num_predicted = max(1, round(args.update_proportion * minibatch_size))
    if memory is None:
        for mb in torch.randperm(batch_size, device=device).split(minibatch_size):
            offsets = range(0, len(mb), args.chunk_size)
            chunks = [(mb[i : i + args.chunk_size], slice(i, i + args.chunk_size), None) for i in offsets]
            yield mb, chunks, mb[:num_predicted]
        return
    state, starts, spans = memory
    T, N = starts.shape
    steps = torch.arange(T, device=device)[:, None]
    size = max(1, args.chunk_size // T)  # envs per chunk
    for group in torch.randperm(N, device=device).split(N // args.num_minibatches):
        mb = (steps * N + group).flatten()  # step t of env e is entry t * N + e of the flattened rollout
        chunks = []
        for j in range(0, len(group), size):
            envs = group[j : j + size]
            rows = (steps * len(group) + torch.arange(j, j + len(envs), device=device)).flatten()
            chunks.append((mb[rows], rows, Memory(state[:, envs], starts[:, envs], spans)))
        yield mb, chunks, mb[torch.randperm(len(mb), device=device)[:num_predicted]]


def rnd_ppo_update(steps: dict, batch: dict, obs_rms: RunningMeanStd, args: Args, memory=None):
    """Epochs of minibatches in chunks whose gradients add up: PPO's loss on all, the predictor's on its
    chosen frames, one optimiser step for both. Returns each loss term's mean over the minibatches, by name."""
    names = ("policy_loss", "ext_value_loss", "int_value_loss", "entropy", "approx_kl", "clipfrac")
    device = batch["valid"].device
    ppo_sums = torch.zeros(len(names), device=device)
    rnd_loss = torch.zeros((), device=device)
    for _epoch in range(args.update_epochs):
        for mb, chunks, chosen in minibatches(args, device, memory, len(batch["valid"])):
            valid = batch["valid"][mb]
            count = valid.sum().clamp(min=1.0)
            advantages = batch["advantages"][mb]
            if args.norm_adv:
                advantages = standardize(advantages, valid)
            for c, rows, seq in chunks:
                chunk = {k: batch[k][c] for k in ("obs", "actions", "logprobs", "ext_returns", "int_returns")}
                ppo_sums += steps["ppo_chunk"](chunk, advantages[rows], valid[rows], count, seq)
            predicted_count = batch["valid"][chosen].sum().clamp(min=1.0)
            for c in chosen.split(args.chunk_size):
                x = normalize_frames(batch["frames"][c], obs_rms)
                rnd_loss += steps["predictor_chunk"](x, batch["valid"][c], predicted_count)
            steps["step"]()
    num_updates = args.update_epochs * args.num_minibatches
    return dict(zip(names, ppo_sums / num_updates, strict=True), rnd_loss=rnd_loss / num_updates)


# The training loop
def main(args: Args) -> None:
    # --- set-up: checks, processes, device, run directory, writer, stop requests and this process's envs ---
    run = start_run(args)  # under torchrun, one process per share of the envs; only process 0 writes
    device = run.device
    T, N = args.num_steps, args.num_envs // args.world_size  # this process's envs
    agent = Agent(run.obs_space, run.action_space, args.rnn, args.rnn_size, args.bf16).to(device)
    rnd = RNDModel(args.bf16).to(device)
    params = list(agent.parameters()) + list(rnd.predictor.parameters())
    # one fused Adam for all (the eps of the reference's TF Adam); compiled: foreach, and a rate tensor
    lr0 = torch.tensor(args.learning_rate, device=device) if args.compile else args.learning_rate
    optimizer = torch.optim.Adam(params, lr=lr0, fused=not args.compile)
    steps = training_steps(agent, rnd, optimizer, params, args)
    obs_rms = RunningMeanStd((1,) + run.obs_space.shape[1:], device)  # per pixel of one frame
    reward_rms = RunningMeanStd((), device)  # of the intrinsic return
    nets = dict(model=agent, rnd=rnd, optimizer=optimizer, obs_rms=obs_rms, reward_rms=reward_rms)  # saved
    if args.world_size > 1:  # the same initial weights everywhere; each process samples its own actions
        torch.manual_seed(args.seed + run.rank)

    # rollout storage on the device: uint8 frame stacks, and each next observation's newest frame (RND's)
    obs = torch.zeros((T, N) + run.obs_space.shape, dtype=torch.uint8, device=device)
    frames = torch.zeros((T, N, 1) + run.obs_space.shape[1:], dtype=torch.uint8, device=device)
    actions = torch.zeros((T, N), dtype=torch.long, device=device)
    logprobs, ext_values, int_values = (torch.zeros((T, N), device=device) for _ in range(3))
    step_rows = torch.zeros((4, T, N), device=device)  # a step's four rows, filled on the host, then one copy
    rewards, terminations, dones, valid = step_rows  # its rows, by name
    run.envs.reset()
    # a resumed run's state from its checkpoint; a new run's observation statistics from random steps
    statistics = init_obs_stats(run.envs, obs_rms, frames, int(run.action_space.n), args)
    rewems, global_step, start_iteration = restore_run(args, run, nets, statistics)  # a new run: zeros, 0, 1
    next_obs = torch.as_tensor(run.envs.reset()[0], device=device)  # whole games from here on
    next_valid = np.ones(N, dtype=bool)  # False on the reset step that follows a done
    # memory (None without): the state, zeroed where an episode starts (run_memory), and the rollout's starts
    state, next_start = agent.initial_state(N, device), torch.ones(N, device=device)
    starts = None if state is None else torch.zeros((T, N), device=device)
    ep_return, ep_length = np.zeros(N), np.zeros(N, dtype=np.int64)

    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = annealed_lr(args.learning_rate, iteration, args.num_iterations, args.anneal_lr)
        group = optimizer.param_groups[0]
        group["lr"] = group["lr"].fill_(lr) if args.compile else lr  # compiled: the rate tensor, in place

        # --- rollout ---
        rollout_state = state  # with memory, where the update replays from
        finished = []  # (step, returns, lengths) of the episodes that end, for the log
        for step in range(T):
            global_step += args.num_envs  # every process's envs
            obs[step] = next_obs
            with torch.no_grad():
                actions[step], logprobs[step], ext_values[step], int_values[step], state = steps["act"](
                    next_obs, False, state, next_start
                )
            stepped = run.envs.step(actions[step].cpu().numpy())
            next_obs_np, reward, term, trunc, info = finite_step(stepped, global_step)  # NaN or inf: stops
            done = term | trunc
            # the extrinsic reward clipped to its sign in the learner, as the reference's ClipRewardEnv
            trained = np.sign(reward) if args.reward_clip else reward
            step_rows[:, step] = torch.from_numpy(np.array([trained, term, done, next_valid], "float32"))
            if state is not None:
                # an episode starts at the step after the reset step, where the memory is zeroed: the reset
                # step acts on the episode's last observation, whose value (a truncation's bootstrap) needs it
                starts[step], next_start = next_start, 1.0 - valid[step]
            next_obs = torch.as_tensor(next_obs_np, device=device)
            frames[step] = next_obs[:, -1:]
            # the logged episode: the whole game or the cap, scored raw; its length without the reset step
            episode_end = info["terminated"].astype(bool) | trunc
            ep_return = ep_return + info["reward"]
            ep_length = ep_length + next_valid
            finished.append((global_step, ep_return[episode_end], ep_length[episode_end]))
            ep_return, ep_length = np.where(episode_end, 0.0, ep_return), np.where(episode_end, 0, ep_length)
            run.rooms.step(info, episode_end, global_step)  # the games with rooms: logged, not learned from
            next_valid = ~done

        # --- intrinsic rewards (from the statistics before this rollout, as the reference's), advantages ---
        with torch.no_grad():
            int_rewards = prediction_errors(rnd, frames, obs_rms, args.chunk_size)
            int_rewards, rewems = normalize_intrinsic(
                int_rewards, rewems, valid, reward_rms, args.int_gamma, args.world_size
            )  # fmt: skip
            update_frame_stats(obs_rms, frames.flatten(0, 1), world_size=args.world_size)
            _, next_ext_value, next_int_value, _ = agent(next_obs, state, next_start)
            ext_advantages, ext_returns = compute_gae(
                rewards, ext_values, next_ext_value, terminations, dones, valid, args.gamma, args.gae_lambda
            )
            int_advantages, int_returns = intrinsic_gae(
                int_rewards, int_values, next_int_value, valid, args.int_gamma, args.gae_lambda
            )
        batch = dict(
            obs=obs.flatten(0, 1), frames=frames.flatten(0, 1), actions=actions.flatten(),
            logprobs=logprobs.flatten(), valid=valid.flatten(),
            advantages=(args.ext_coef * ext_advantages + args.int_coef * int_advantages).flatten(),
            ext_returns=ext_returns.flatten(), int_returns=int_returns.flatten(),
        )  # fmt: skip

        # --- update: PPO and the predictor ---
        spans = None if state is None else memory_spans(starts.cpu().numpy() > 0)  # one host copy
        memory = None if state is None else Memory(rollout_state, starts, spans)
        stats = rnd_ppo_update(steps, batch, obs_rms, args, memory)

        # --- logging (process 0: every process's episodes, one host sync), evaluation, checkpoint, stop ---
        stats["intrinsic_reward"] = masked_mean(int_rewards, valid)
        explained = dict(ext=(ext_values, ext_returns), int=(int_values, int_returns))  # values, returns
        end_iteration(run, args, nets, finished, stats, explained, valid, lr, rewems, global_step, iteration)

    # --- end: the final model (process 0), both networks and every statistic, saved, reloaded, evaluated ---
    end_run(args, run, nets, rewems, global_step)


# The algorithm ends here; a learner may stop. Below: this file's machinery (envs, torchrun, checks), then the shared plumbing.
import traceback  # (signal and sys: the shared block imports them)

CHECKPOINT_FORMAT = 2  # the layout of checkpoints and models: raise it when a field changes (a resume refuses another)
RANGES = dict(  # every numeric flag's interval, checked before anything else happens
    seed="[0, 1e9]", eval_every="[0, inf)", eval_episodes="[1, inf)", checkpoint_every="[0, inf)",
    progress_interval="[0, inf)", sticky_action_prob="[0, 1]", max_episode_steps="[1, inf)", total_timesteps="[1, inf)",
    learning_rate="(0, inf)", num_envs="[1, inf)", num_steps="[1, inf)", gamma="[0, 1]", int_gamma="[0, 1]",
    gae_lambda="[0, 1]", num_minibatches="[1, inf)", update_epochs="[1, inf)", clip_coef="(0, inf)", ent_coef="[0, inf)",
    vf_coef="[0, inf)", max_grad_norm="[0, inf)", ext_coef="[0, inf)", int_coef="[0, inf)", update_proportion="(0, 1]",
    num_iterations_obs_norm_init="[0, inf)", chunk_size="[0, inf)", rnn_size="[1, 16384]",
)  # fmt: skip


def preset_defaults(argv: list[str]) -> Args:  # the paper's setting: rnd_ppo.py has no other preset
    return Args()


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


def make_env(env_id: str, num_envs: int, seed: int, max_episode_steps: int, sticky_action_prob: float, render=False):
    """envpool Atari as the reference's make_atari and wrap_deepmind (atari_wrappers.py): sticky actions on every frame,
    the episode cap (a truncation), no life-loss episodes, no no-op starts (envpool's noop_max 1 runs one) nor FIRE on
    reset, 4 max-pooled frames a step, 4 stacked 84x84 grey frames, raw rewards (the learner clips), next-step autoreset."""
    return envpool.make(
        env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, repeat_action_probability=sticky_action_prob,
        max_episode_steps=max_episode_steps, noop_max=1, use_fire_reset=False, episodic_life=False, reward_clip=False,
        **(dict(render_mode="rgb_array") if render else {}),
    )  # fmt: skip


class Rooms:
    """Rooms from the RAM, as the reference's MontezumaInfoWrapper (other games: none): a step's room joins its env's
    episode (a reset step's, the next one's); `finished`: (step, rooms) since the last log; `seen`: all, checkpointed."""

    ADDRESS = {"MontezumaRevenge": 3, "Pitfall": 1}  # the room byte's address in the RAM

    def __init__(self, env_id: str, num_envs: int, seen: np.ndarray):
        self.address, self.seen, self.finished = self.ADDRESS.get(env_id.split("-")[0]), seen, []
        self.episode_rooms = np.zeros((num_envs, 256), dtype=bool)

    def step(self, info: dict, episode_end: np.ndarray, global_step: int) -> None:
        if self.address is not None:
            self.episode_rooms[np.arange(len(episode_end)), info["ram"][:, self.address]] = True
            self.finished += [(global_step, rooms) for rooms in self.episode_rooms[episode_end].sum(1)]
            self.seen = self.seen | self.episode_rooms.any(0)
            self.episode_rooms[episode_end] = False

    def log(self, run: "Run", global_step: int) -> str:
        """Every process's finished episodes' rooms and all rooms seen, logged by process 0; the progress line's part."""
        everyone = gather((self.seen, self.finished), run.args.world_size)  # one exchange for both
        self.seen, self.finished = np.logical_or.reduce([seen for seen, _ in everyone]), []
        if run.rank != 0 or self.address is None:
            return ""
        for step, rooms in sorted((entry for _, rows in everyone for entry in rows), key=lambda entry: entry[0]):
            run.writer.add_scalar("charts/episode_rooms", rooms, step)
        run.writer.add_scalar("charts/rooms_visited_total", int(self.seen.sum()), global_step)
        return f" | rooms {int(self.seen.sum())}"


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    resid = returns - values
    var_resid = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return torch.where(var_returns > 0, 1 - var_resid / var_returns, torch.full_like(var_returns, torch.nan))


def evaluate(agent: Agent, args: Args, device: torch.device, video: str | None = None):
    """The raw scores of one full episode on each of eval_episodes envs (the training settings); video: env 0's."""
    n = args.eval_episodes
    envs = make_env(args.env_id, n, args.seed + 100_000, args.max_episode_steps, args.sticky_action_prob, video is not None)
    obs, _ = envs.reset()
    returns, finished = np.zeros(n), np.zeros(n, dtype=bool)
    frames, state = [], agent.initial_state(n, device)  # memory carried through each first episode
    while not finished.all():
        if video is not None and not finished[0]:
            frames.append(np.asarray(envs.render())[0])
        with torch.no_grad():
            action, _, _, _, state = agent.act(torch.as_tensor(obs, device=device), args.eval_deterministic, state)
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
    envs.close()
    write_video(video, frames)
    return returns


def end_iteration(run: "Run", args: Args, nets: dict, finished: list, stats: dict, explained: dict, valid, lr, rewems,
                  global_step: int, iteration: int) -> None:  # fmt: skip
    """Process 0 logs every process's episodes and rooms, `stats`, both heads' explained variance (`explained`: values,
    returns) and the rate, stops on a NaN or inf, evaluates when due; a checkpoint when due or on any process's stop."""
    episodes, rooms = gather_episodes(finished, args.world_size), run.rooms.log(run, global_step)
    if run.rank == 0:
        for step, returns, lengths in episodes:
            run.log_episodes(returns, lengths, step)
        ev = [explained_variance(*explained[head], valid) for head in ("ext", "int")]  # NaN where the returns are flat
        weights = parameter_sum(nets["model"], nets["rnd"])[0]
        *terms, ev_ext, ev_int, total = torch.stack([*stats.values(), *ev, weights]).tolist()  # one host sync
        logged = dict(zip(stats, terms, strict=True))
        check_training({**logged, "parameter sum": total}, global_step)
        for name, value in {**logged, "explained_variance": ev_ext, "int_explained_variance": ev_int}.items():
            run.writer.add_scalar(f"{'charts' if name == 'intrinsic_reward' else 'losses'}/{name}", value, global_step)
        run.writer.add_scalar("charts/learning_rate", lr, global_step)
        run.log(global_step, global_step, rooms, force=iteration == args.num_iterations)
        if crossed(global_step, args.batch_size, args.eval_every):
            with run.paused():
                run.log_eval(evaluate(nets["model"], args, run.device, run.video(global_step)), global_step)
    stopping = stop_everywhere(run.stop, args.world_size, run.device)  # the same on every process
    if crossed(global_step, args.batch_size, args.checkpoint_every) or stopping:  # with every process's share
        every_rewems, rngs = gather(rewems, args.world_size), gather(rng_state(run.device), args.world_size)
        if run.rank == 0:
            run.checkpoint(**{key: net.state_dict() for key, net in nets.items()}, rewems=every_rewems.cpu(),
                           rooms_seen=run.rooms.seen, global_step=global_step, iteration=iteration, rng=rngs)  # fmt: skip
    if stopping:
        run.envs.close()
        leave(run, stopped_at=f"step {global_step:,}")


def storage(args: Args, obs_space: gym.Space, action_space: gym.Space, device: torch.device) -> dict:
    """The rollout, for check_storage: uint8 frame stacks and next frames, int64 actions, 12 float32 (T, N) tensors."""
    T, N = args.num_steps, args.num_envs
    frames = int(np.prod(obs_space.shape)) + int(np.prod(obs_space.shape[1:]))  # a stack and its next frame
    return {f"the rollout (--num-envs {N} x --num-steps {T})": (T * N * (frames + 8 + 12 * 4), device, "lower them")}


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    """What the ranges alone cannot tell: an Atari env, and flags that only make sense together; sets the sizes."""
    if not (envpool_has(args.env_id) and hasattr(envpool.make_spec(args.env_id).config, "episodic_life")):
        fail(f"rnd_ppo.py runs envpool's Atari games, and {args.env_id} is not one; run ppo.py for it")
    refuse_meaningless(args, [
        (("rnn_size",), args.rnn == "none", "sizes the recurrent layer, and this run has none (see --rnn)"),
        (("eval_episodes", "eval_deterministic", "capture_video"), not (args.eval_every > 0 or args.save_model),
         "sets the evaluations, and this run has none (see --eval-every and --save-model)"),
    ])  # fmt: skip
    cuda = args.cuda and torch.cuda.is_available()
    if args.cudagraphs and not cuda:  # typed, or a resumed checkpoint's
        fail("--cudagraphs needs a CUDA device, and this run is on the CPU; leave it out (--compile works on the CPU)")
    args.compile = args.compile or args.cudagraphs
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # --rnn: the spans change with every rollout (a compile each); torchrun: gradients are averaged outside the graph
    if args.compile and (args.rnn != "none" or args.world_size > 1):
        fail("--compile runs a feed-forward policy in one process; leave out --compile and --cudagraphs")
    if args.num_envs % args.world_size:
        fail(f"--num-envs {args.num_envs} does not split evenly over {args.world_size} processes; pass a multiple of them")
    envs_each, per = args.num_envs // args.world_size, " per process" if args.world_size > 1 else ""
    # a minibatch is steps; with --rnn, whole envs (their sequences)
    count, unit = (envs_each, "envs") if args.rnn != "none" else (envs_each * args.num_steps, "steps")
    if count % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the rollout's {count} {unit}{per}; pass one that does")
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations < 1:
        rollout = f"--num-envs {args.num_envs} x --num-steps {args.num_steps} = {args.batch_size} steps"
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout ({rollout}); raise it, or lower the others")
    args.chunk_size = args.chunk_size or (args.minibatch_size if cuda else 256)


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
    """Every check (env, flags, storage, the checkpoint and its process count), then this process, the Run and its envs."""
    obs_space, action_space = env_spaces(args.env_id)
    check_args(args, obs_space, action_space)
    rank, device, note = start_processes(args)
    check_storage(storage(args, obs_space, action_space, device))
    ckpt = load_checkpoint(args.resume, args.env_id) if args.resume else None
    rng = process_rng(ckpt, rank, args.world_size) if ckpt else None
    n = args.num_envs // args.world_size
    run = Run(args, ckpt, device, args.num_iterations * args.batch_size, share=f"stepping {n} of the {args.num_envs} envs")
    for line in (note, args.bf16 and bf16_note(device)):
        if line and rank == 0:
            print(line, flush=True)
    # process r steps envs r*n .. r*n + n-1; a resumed run's take a fresh seed
    seed = args.seed + (ckpt["global_step"] if ckpt else 0) + rank * n
    run.envs = make_env(args.env_id, n, seed, args.max_episode_steps, args.sticky_action_prob)
    run.obs_space, run.action_space, run.rng = obs_space, action_space, rng
    return run


def restore_run(args: Args, run: "Run", nets: dict, statistics):
    """A resumed run's networks, optimiser and statistics (`nets`), rooms and this process's RNG states from its
    checkpoint, or a new run's observation statistics from random steps (`statistics`: init_obs_stats), timed out of
    the run's SPS. Returns this process's envs' intrinsic reward filter state, the step and the iteration to go on from."""
    n, ckpt = args.num_envs // args.world_size, run.ckpt
    run.rooms = Rooms(args.env_id, n, ckpt["rooms_seen"].copy() if ckpt else np.zeros(256, bool))
    if ckpt is not None:
        for key, net in nets.items():
            net.load_state_dict(ckpt[key])
        rng_state(run.device, restore=run.rng)
        if run.rank == 0:
            print(f"resumed {run.dir} at step {ckpt['global_step']:,}")
        return ckpt["rewems"].chunk(args.world_size)[run.rank].to(run.device), ckpt["global_step"], ckpt["iteration"] + 1
    start, random_steps = time.time(), args.num_iterations_obs_norm_init * args.num_steps * args.num_envs
    if run.rank == 0 and random_steps:  # the line ends when they do
        print(f"observation statistics from {random_steps:,} random steps", end="", flush=True)
    with run.paused():
        list(statistics)  # the random rollouts, stepped as they are drawn
    if run.rank == 0 and random_steps:
        seconds = time.time() - start
        print(f" in {seconds:.1f} s", flush=True)
        run.writer.add_scalar("charts/obs_norm_init_seconds", seconds, 0)
    return torch.zeros(n, device=run.device), 0, 1


def end_run(args: Args, run: "Run", nets: dict, rewems: torch.Tensor, global_step: int) -> None:
    """Envs closed, filter states gathered, processes left together; then process 0 saves, reloads and evaluates the model."""
    run.envs.close()
    rewems = gather(rewems, args.world_size)
    leave(run, stay=run.rank == 0)  # process 0 stays, to save the final model
    if args.save_model:  # what the policy and its intrinsic reward need: both networks, every statistic
        model = {key: nets[key].state_dict() for key in ("model", "rnd", "obs_rms", "reward_rms")}
        eval_agent = Agent(run.obs_space, run.action_space, args.rnn, args.rnn_size, args.bf16).to(run.device)
        eval_agent.load_state_dict(run.save_and_reload(**model, rewems=rewems.cpu())["model"])
        run.log_eval(evaluate(eval_agent, args, run.device, run.video()), global_step, run.model_path)
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
