"""PPG, Phasic Policy Gradient (Cobbe et al. 2021), on Procgen through envpool (benchmark/ppg_procgen.sh).

Reading guide: to the line `# The algorithm ends here`, the whole algorithm (Args, networks, maths, updates,
main); below it, the plumbing main calls by name, then that of all eight files. More in docs/ppg_procgen.md"""

import os
import time
from dataclasses import dataclass
from typing import Literal

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
    # --- algorithm: the task and the policy phase (PPO); the docs page's "Flags that matter" says more ---
    env_id: str = "StarpilotEasy-v0"
    """envpool Procgen id (StarpilotEasy-v0, BigfishHard-v0, ...) or procgen name (starpilot: its Easy one)"""
    num_levels: int = 0
    """levels to train and evaluate on (0: unlimited, the paper's setting; else a fixed set of levels)"""
    start_level: int = 0
    """seed of the first level of the set (with --num-levels)"""
    arch: Literal["dual", "detach"] = "dual"
    """dual: the paper's PPG, a value network of its own; detach: one CNN, the value head on its features"""
    total_timesteps: int = 25_000_000
    """total env steps over all envs; a --resume may raise it (--anneal-lr then follows the new total)"""
    learning_rate: float = 5e-4
    """Adam learning rate of the policy phase"""
    num_envs: int = 64
    """parallel envs"""
    num_steps: int = 256
    """steps per env per rollout"""
    anneal_lr: bool = False
    """anneal both learning rates linearly to 0 over the whole run (off in the reference)"""
    gamma: float = 0.999
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalised advantage estimation"""
    num_minibatches: int = 8
    """minibatches per policy-phase epoch"""
    update_epochs: int = 1
    """epochs over each rollout (E_pi = E_V in the paper)"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 1.0
    """weight of the value loss 0.5 (V - R)^2 (the reference's 0.5 on the squared error)"""
    max_grad_norm: float = 0.0
    """global gradient norm clip (0: none, as the reference)"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (clipped to +-10), as the reference"""
    # --- algorithm: auxiliary phase ---
    preset: Literal["paper", "small"] = "paper"
    """paper: the reference's settings (N_pi 32, a 6.4 GB phase); small: N_pi 8 (1.6 GB), a little behind"""
    n_pi: int = 32
    """N_pi: policy iterations per phase, whose frames the auxiliary phase trains on (6.4 GB at 32)"""
    e_aux: int = 6
    """E_aux: auxiliary epochs over the phase's frames (0: none, PPO with a separate value network)"""
    aux_learning_rate: float = 5e-4
    """Adam learning rate of the auxiliary phase (its own optimiser, as the reference)"""
    aux_rollouts: int = 4
    """whole rollouts (one env's num_steps) per auxiliary minibatch, as the reference's aux_mbsize"""
    beta_clone: float = 1.0
    """weight of the KL from the policy before the auxiliary phase to the policy being trained"""
    vf_true_weight: float = 1.0
    """weight of the value network's extra training on the same targets in the auxiliary phase"""
    # --- run settings ---
    exp_name: str = "ppg_procgen"
    """name of this experiment, part of the run directory name"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use CUDA when it is available (the phase's frames then live on the GPU)"""
    chunk_size: int = 0
    """observations per forward-backward pass of a minibatch (0: 32 on CPU, 128 with --bf16; CUDA: all)"""
    compile: bool = False
    """torch.compile the acting step, both phases' chunks and optimiser steps (off: the eager code reads)"""
    cudagraphs: bool = False
    """CUDA graphs on top of --compile (torch.compile's "reduce-overhead"); needs CUDA, implies --compile"""
    bf16: bool = False
    """the IMPALA trunks in bfloat16 autocast; weights, heads and losses stay float32 (docs/speed.md)"""
    capture_video: bool = False
    """write MP4s of the evaluation episodes of env 0 (its 64x64 observations) to runs/<run>/videos"""
    save_model: bool = False
    """save the final model to runs/<run>/ppg_procgen.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate on separate envs every this many env steps (0: only after training, with --save-model)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per eval env)"""
    eval_deterministic: bool = False
    """evaluate the greedy policy (argmax); off: the sampled policy, the one trained and reported"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps, with the phase's frames (0: on a stop)"""
    resume: str = ""
    """a checkpoint.pt to resume from; the run goes on in its directory, with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    # --- computed at start-up (in check_args) ---
    batch_size: tyro.conf.Suppress[int] = 0
    """num_envs * num_steps (computed)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """batch_size // num_minibatches; each process's share of it is its minibatch (computed)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """total_timesteps // batch_size (computed)"""
    world_size: tyro.conf.Suppress[int] = 1
    """processes training together (WORLD_SIZE under torchrun), each with num_envs / world_size (computed)"""


# Networks: the reference's (openai/phasic-policy-gradient) IMPALA CNN, init and head scales
def normed_init(layer: nn.Module, scale: float = 1.0) -> nn.Module:
    # The reference's init (phasic_policy_gradient/torch_util.py, NormedLinear / NormedConv2d): PyTorch's
    # default weights rescaled so that each output unit's fan-in weights have norm `scale`; zero biases
    with torch.no_grad():
        dims = tuple(range(1, layer.weight.dim()))
        layer.weight.mul_(scale / layer.weight.norm(p=2, dim=dims, keepdim=True))
        layer.bias.zero_()
    return layer


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, scale: float):
        super().__init__()
        self.conv0 = normed_init(nn.Conv2d(channels, channels, 3, padding=1), np.sqrt(scale))
        self.conv1 = normed_init(nn.Conv2d(channels, channels, 3, padding=1), np.sqrt(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaCNN(nn.Sequential):
    """Espeholt et al. 2018: three stacks (conv 3x3, max-pool 3x3 stride 2, two residual blocks) of 16, 32, 32
    channels, then 256 ReLU units; scales as the reference's impala_cnn.py: 1/sqrt(3) per stack, 1.4 dense."""

    def __init__(self, obs_shape: tuple, chans=(16, 32, 32), out_size: int = 256, blocks: int = 2):
        layers = []
        channels, height, width = obs_shape
        stack_scale = 1 / np.sqrt(len(chans))
        for out in chans:
            conv = normed_init(nn.Conv2d(channels, out, 3, padding=1))
            layers += [conv, nn.MaxPool2d(3, stride=2, padding=1)]
            layers += [ResidualBlock(out, stack_scale / np.sqrt(blocks)) for _ in range(blocks)]
            channels, height, width = out, (height + 1) // 2, (width + 1) // 2
        dense = normed_init(nn.Linear(channels * height * width, out_size), 1.4)
        super().__init__(*layers, nn.Flatten(), nn.ReLU(), dense, nn.ReLU())


class Agent(nn.Module):
    """Policy network (IMPALA CNN, policy and auxiliary value heads) and value head, on a CNN of its own
    ('dual', the paper's PPG) or on the policy's features, gradient stopped ('detach', CleanRL's)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, arch: str = "dual", bf16: bool = False):
        super().__init__()
        self.dtype = torch.bfloat16 if bf16 else torch.float32  # the trunks' input (--bf16: in autocast)
        self.policy_net = ImpalaCNN(obs_space.shape)
        self.value_net = ImpalaCNN(obs_space.shape) if arch == "dual" else None
        self.actor = normed_init(nn.Linear(256, int(action_space.n)), 0.1)
        self.aux_critic = normed_init(nn.Linear(256, 1), 0.1)
        self.critic = normed_init(nn.Linear(256, 1), 0.1)
        # channels-last convolutions run about twice as fast on a CPU (oneDNN) and suit tensor cores on a GPU
        self.to(memory_format=torch.channels_last)

    def frames(self, x: torch.Tensor) -> torch.Tensor:
        # frames stay uint8 in storage, float (--bf16: bfloat16) only here, laid out channels-last as uint8
        return x.contiguous(memory_format=torch.channels_last).to(self.dtype) / 255.0

    def features(self, cnn: ImpalaCNN, x: torch.Tensor) -> torch.Tensor:
        # --bf16: the trunk in bfloat16 autocast (weights stay float32); float32 features for the heads
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            return cnn(x).float()

    def value_features(self, x: torch.Tensor, policy_features: torch.Tensor | None = None) -> torch.Tensor:
        if self.value_net is not None:
            return self.features(self.value_net, x)
        # 'detach': the value loss trains the value head only, never the policy's features
        return (self.features(self.policy_net, x) if policy_features is None else policy_features).detach()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy logits, auxiliary value and value, with one pass through each CNN."""
        x = self.frames(x)
        h = self.features(self.policy_net, x)
        logits, aux_value = self.actor(h), self.aux_critic(h).squeeze(-1)
        return logits, aux_value, self.critic(self.value_features(x, h)).squeeze(-1)

    def policy(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy logits and the auxiliary value, both from the policy network."""
        h = self.features(self.policy_net, self.frames(x))
        return self.actor(h), self.aux_critic(h).squeeze(-1)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.value_features(self.frames(x))).squeeze(-1)

    def act(self, x: torch.Tensor, deterministic: bool = False):
        """Action, its log-probability and the value, for one step of all envs."""
        logits, _, value = self(x)
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        action = logits.argmax(-1) if deterministic else dist.sample()
        return action, dist.log_prob(action), value


# The algorithm's maths: the reward statistics and scaling, GAE, both phases' losses
def update_mean_var_count(mean, var, count, batch_mean, batch_var, batch_count):
    """Merge a batch's moments into running ones (Chan et al. 1979, parallel variance)."""
    delta = batch_mean - mean
    total = count + batch_count
    new_mean = mean + delta * batch_count / total
    m2 = var * count + batch_var * batch_count + delta**2 * count * batch_count / total
    return new_mean, m2 / total, total


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


class RunningMeanStd:
    """Mean and variance of everything passed to update(), in float64 numpy on the host, where the env's
    rows arrive (half the time of tensor operations on a row, docs/speed.md). Under torchrun, of every
    process's rows in process order: every process keeps those one process with all the envs would."""

    def __init__(self, shape: tuple, device: torch.device, world_size: int = 1):
        self.mean, self.var = np.zeros(shape), np.ones(shape)
        self.count = 1e-4  # as gymnasium's wrappers
        self.device = device  # where processes exchange their rows
        self.world_size = world_size

    def update(self, x: np.ndarray) -> None:
        x = x.astype(np.float64)
        if self.world_size > 1:
            x = gather(torch.from_numpy(x).to(self.device), self.world_size).cpu().numpy()
        moments = update_mean_var_count(self.mean, self.var, self.count, x.mean(0), x.var(0), len(x))
        self.mean, self.var, self.count = moments

    def state_dict(self) -> dict:
        count = torch.tensor(self.count, dtype=torch.float64)
        return dict(mean=torch.from_numpy(self.mean), var=torch.from_numpy(self.var), count=count)

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var = state["mean"].double().numpy(), state["var"].double().numpy()
        self.count = float(state["count"])


def scale_reward(reward, discounted_return, done, rms: "RunningMeanStd", gamma: float, clip: float = 10.0):
    """Rewards (numpy rows) over the running std of the discounted return (Huang et al. 2022, continuous
    detail 8), clipped; and the return for the next step. Every step counts, the reset step too."""
    discounted_return = discounted_return * gamma + reward
    rms.update(discounted_return[:, None])
    return np.clip(reward / np.sqrt(rms.var + 1e-8), -clip, clip), np.where(done, 0.0, discounted_return)


def compute_gae(rewards, values, next_value, terminations, dones, valid, gamma: float, gae_lambda: float):
    """Generalised advantage estimation (Schulman et al. 2016) over a (num_steps, num_envs) rollout. With
    next-step autoreset values[t + 1] is the final observation's value: a truncation bootstraps from it, a
    termination does not; `dones` cuts the recursion, and the reset step after it (valid 0) gets 0."""
    num_steps = rewards.shape[0]
    advantages, lastgaelam = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues * (1.0 - terminations[t]) - values[t]
        lastgaelam = (delta + gamma * gae_lambda * (1.0 - dones[t]) * lastgaelam) * valid[t]
        advantages[t] = lastgaelam
    return advantages, advantages + values


def normalize_advantages(advantages: torch.Tensor, valid: torch.Tensor, world_size: int = 1) -> torch.Tensor:
    """Once per batch (all processes'), before the minibatches, without reset steps (compute_advantage)."""
    moments = torch.stack([valid.sum(), (advantages * valid).sum()])
    if world_size > 1:
        dist.all_reduce(moments)
    count = moments[0]
    mean = moments[1] / count
    squares = ((advantages - mean) ** 2 * valid).sum()
    if world_size > 1:
        dist.all_reduce(squares)
    return (advantages - mean) / ((squares / count).sqrt() + 1e-8) * valid


POLICY_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")  # the policy phase's terms
AUX_STATS = ("aux_value_loss", "bc_kl", "aux_true_value_loss")  # the auxiliary phase's


def policy_loss(
    logits, actions, oldlogprob, advantages, newvalue, returns, mask, count, clip_coef, ent_coef, vf_coef
):  # fmt: skip
    """Clipped surrogate - entropy bonus + value loss over a chunk, as means over the minibatch's `count`
    valid entries (the chunks' losses add up); returns it and the detached terms, in POLICY_STATS' order."""
    dist = torch.distributions.Categorical(logits=logits, validate_args=False)
    logratio = dist.log_prob(actions) - oldlogprob
    ratio = logratio.exp()
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    v = 0.5 * (newvalue - returns) ** 2  # no value clipping: the reference has none
    entropy = dist.entropy()
    with torch.no_grad():
        approx_kl = (ratio - 1) - logratio  # Schulman's estimator k3, http://joschu.net/blog/kl-approx.html
        clipped = ((ratio - 1.0).abs() > clip_coef).float()
    sums = (torch.stack([pg, v, entropy, approx_kl, clipped]) * mask).sum(1) / count
    mean = dict(zip(POLICY_STATS, sums, strict=True))
    return mean["policy_loss"] - ent_coef * mean["entropy"] + vf_coef * mean["value_loss"], sums.detach()


def categorical_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
    """KL(old || new) per row, as the reference's td.kl_divergence(oldpd, pd)."""
    # by hand: torch.distributions.kl_divergence normalises logits with logsumexp, not the same run to the bit
    old_logp, new_logp = F.log_softmax(old_logits, -1), F.log_softmax(new_logits, -1)
    return (old_logp.exp() * (old_logp - new_logp)).sum(-1)


def aux_loss(logits, old_logits, aux_value, value, returns, mask, count, beta_clone, vf_true_weight):
    """Cobbe et al. 2021, eq. 2 and 4: 0.5 (V_aux - R)^2 (policy network) + beta_clone KL(pi_old || pi) +
    vf_true_weight 0.5 (V - R)^2 (value network), means as in policy_loss; the loss and terms (AUX_STATS)."""
    aux_value_loss = 0.5 * (aux_value - returns) ** 2
    terms = torch.stack([aux_value_loss, categorical_kl(old_logits, logits), 0.5 * (value - returns) ** 2])
    sums = (terms * mask).sum(1) / count
    mean = dict(zip(AUX_STATS, sums, strict=True))
    loss = mean["aux_value_loss"] + beta_clone * mean["bc_kl"] + vf_true_weight * mean["aux_true_value_loss"]
    return loss, sums.detach()


# The update: the optimiser step, both phases' minibatches
def optimizer_step(optimizer: torch.optim.Optimizer, params: list, max_grad_norm: float, set_to_none: bool = True) -> None:
    if max_grad_norm > 0:
        nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)


def average_gradients(parameters, world_size: int) -> None:
    """Gradients replaced by their mean over the processes, in one all-reduce of one flat buffer; by hand, as CleanRL's
    ppo_atari_multigpu.py does, since DDP hooks the wrapped module's forward, which the update reaches around."""
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads]) / world_size
    dist.all_reduce(flat)
    for g, mean in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(mean.view_as(g))


def annealed_lr(learning_rate: float, iteration: int, num_iterations: int, anneal: bool) -> float:
    """Linear decay from learning_rate at iteration 1 to 0 after the last (Huang et al. 2022, detail 4)."""
    if not anneal:
        return learning_rate
    return learning_rate * (1.0 - (iteration - 1.0) / num_iterations)


def anneal_learning_rates(optimizer, aux_optimizer, iteration: int, args: Args) -> None:
    """Both phases' rates at a policy iteration, annealed (--anneal-lr) over the whole run, not each phase."""
    for opt, base in ((optimizer, args.learning_rate), (aux_optimizer, args.aux_learning_rate)):
        lr = annealed_lr(base, iteration, args.num_iterations, args.anneal_lr)
        group = opt.param_groups[0]  # compiled: a tensor rate, filled in place, so nothing compiles again
        group["lr"] = group["lr"].fill_(lr) if args.compile else lr


def training_steps(agent: Agent, optimizer, aux_optimizer, args: Args) -> dict:
    """The acting step, a chunk of either phase's minibatch (their gradients add up), each phase's step."""
    params = list(agent.parameters())

    def policy_chunk(obs, actions, logprobs, advantages, returns, valid, count):
        logits, _, newvalue = agent(obs)
        loss, sums = policy_loss(logits, actions, logprobs, advantages, newvalue, returns, valid, count,
                                 args.clip_coef, args.ent_coef, args.vf_coef)  # fmt: skip
        loss.backward()
        return sums

    def aux_chunk(obs, old_logits, returns, valid, count):
        logits, aux_value, value = agent(obs)
        loss, sums = aux_loss(
            logits, old_logits, aux_value, value, returns, valid, count, args.beta_clone, args.vf_true_weight
        )
        loss.backward()
        return sums

    def step(opt):  # either phase's: its own Adam
        if args.world_size > 1:  # every process takes the same step: the mean of all processes' gradients
            average_gradients(params, args.world_size)
        optimizer_step(opt, params, args.max_grad_norm, set_to_none=not args.compile)

    steps = dict(act=agent.act, policy_chunk=policy_chunk, policy_step=lambda: step(optimizer))
    steps.update(aux_chunk=aux_chunk, aux_step=lambda: step(aux_optimizer))
    if not args.compile:
        return steps
    # --compile, as LeanRL: the same code, traced once, a graph per shape. Gradients allocated once, zeroed in
    # place: with CUDA graph trees, the next chunk's replay would overwrite them (pytorch/pytorch#169545)
    for p in params:
        p.grad = torch.zeros_like(p)
    mode = "reduce-overhead" if args.cudagraphs else "default"  # reduce-overhead: inductor's CUDA graph trees
    return {name: torch.compile(fn, mode=mode, dynamic=False) for name, fn in steps.items()}


def policy_update(steps: dict, batch: dict, args: Args) -> dict:
    """PPO on one rollout (this process's share): E_pi epochs of minibatches in chunks; mean loss terms."""
    size = len(batch["obs"])
    stats = torch.zeros(len(POLICY_STATS), device=batch["obs"].device)
    num_updates = 0
    for _epoch in range(args.update_epochs):
        perm = torch.randperm(size, device=batch["obs"].device)
        for mb in perm.split(size // args.num_minibatches):
            count = batch["valid"][mb].sum().clamp(min=1.0)
            for chunk in mb.split(args.chunk_size):  # the batch's keys are policy_chunk's arguments
                stats += steps["policy_chunk"](**{k: v[chunk] for k, v in batch.items()}, count=count)
            steps["policy_step"]()
            num_updates += 1
    return dict(zip(POLICY_STATS, stats / num_updates, strict=True))


def old_policy_logits(agent: Agent, phase_obs: torch.Tensor, chunk: int) -> torch.Tensor:
    """The policy before the auxiliary phase on the phase's frames (compute_presleep_outputs), one tensor."""
    # preallocated: pieces joined at the end fragment the heap (+0.15 GB peak RSS with the defaults on a CPU)
    flat = phase_obs.reshape((-1,) + phase_obs.shape[-3:])
    logits = torch.empty((len(flat), agent.actor.out_features), device=flat.device)
    with torch.no_grad():
        for i in range(0, len(flat), chunk):
            logits[i : i + chunk] = agent.policy(flat[i : i + chunk])[0]
    return logits


def aux_update(steps: dict, phase: dict, slots, envs_idx, args: Args) -> torch.Tensor:
    """One auxiliary minibatch: the rollouts' frames gathered (uint8) from the phase, trained in chunks."""
    time_idx = torch.arange(phase["obs"].shape[1], device=slots.device)
    index = (slots[:, None], time_idx[None, :], envs_idx[:, None])  # (rollouts, T): whole rollouts in order
    obs, old_logits = (phase[k][index].flatten(0, 1) for k in ("obs", "old_logits"))
    returns, valid = phase["returns"][index].flatten(), phase["valid"][index].flatten()
    count = valid.sum().clamp(min=1.0)
    sums = torch.zeros(len(AUX_STATS), device=valid.device)
    for chunk in torch.arange(len(obs), device=valid.device).split(args.chunk_size):
        sums += steps["aux_chunk"](obs[chunk], old_logits[chunk], returns[chunk], valid[chunk], count)
    steps["aux_step"]()
    return sums


def run_aux_phase(steps, phase, state, args, stop, writer, global_step):
    """E_aux epochs over the phase's rollouts (this process's) in random minibatches of whole rollouts, from
    `state` on; returns None at its end, or on a stop request (waiting no hour) the state to resume from."""
    num_envs = phase["obs"].shape[2]
    per_minibatch = args.aux_rollouts // args.world_size  # this process's share
    rollouts = phase["obs"].shape[0] * num_envs
    device = phase["obs"].device
    minibatches = -(-rollouts // per_minibatch)
    old_logits = state["old_logits"].reshape(phase["obs"].shape[:3] + (-1,))
    clock = dict(started=time.time(), last_print=time.time(), done_here=0)  # for the progress line
    while state["epoch"] < args.e_aux:
        if state["done"] == 0:
            state["perm"] = torch.randperm(rollouts, device=device)
            state["sums"] = torch.zeros(len(AUX_STATS), device=device)
        todo = state["perm"][state["done"] * per_minibatch :]
        # minibatches of whole rollouts (env r % num_envs of iteration r // num_envs), as make_minibatches
        for minibatch in todo.split(per_minibatch):
            slots, envs_idx = minibatch // num_envs, minibatch % num_envs
            state["sums"] += aux_update(steps, dict(phase, old_logits=old_logits), slots, envs_idx, args)
            state["done"] += 1
            if aux_minibatch_done(clock, state, minibatches, stop, writer, args):  # a stop asked
                return state
        state["epoch"], state["done"] = state["epoch"] + 1, 0
    # the last epoch's mean loss terms
    log_aux_phase(writer, state["sums"] / minibatches, clock, minibatches, global_step, args.world_size)
    return None


def main(args: Args) -> None:
    # --- set-up: checks, processes, device, run directory, writer, envs (start_run); networks, optimisers ---
    run = start_run(args)
    device = run.device
    envs = run.envs  # this process's share of the envs: envpool's Procgen (make_env)
    agent = Agent(run.obs_space, run.action_space, args.arch, args.bf16).to(device)  # alike in every process
    # an Adam per phase over both networks, default eps, as the reference (compiled: tensor rates, annealed)
    lr = torch.tensor(args.learning_rate, device=device) if args.compile else args.learning_rate
    aux_lr = torch.tensor(args.aux_learning_rate, device=device) if args.compile else args.aux_learning_rate
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, fused=not args.compile)
    aux_optimizer = torch.optim.Adam(agent.parameters(), lr=aux_lr, fused=not args.compile)
    steps = training_steps(agent, optimizer, aux_optimizer, args)
    return_rms = RunningMeanStd((), device, args.world_size) if args.norm_reward else None
    # the phase's frames, once, as uint8, on the device (GPU memory on CUDA); the policy phase writes its
    # rollouts straight into them. Reset steps are kept, masked out of every loss: rollouts whole, in order
    slots = args.n_pi if args.e_aux > 0 else 1
    T = args.num_steps
    N = args.num_envs // args.world_size
    phase = dict(
        obs=torch.empty((slots, T, N) + run.obs_space.shape, dtype=torch.uint8, device=device),
        returns=torch.zeros((slots, T, N), device=device),
        valid=torch.zeros((slots, T, N), device=device),
    )
    if args.world_size > 1:  # torchrun: each process samples its own actions and minibatches
        torch.manual_seed(args.seed + run.rank)
    # what a checkpoint holds; a resume puts it back and says where to go on from (0, 1, None for a new run)
    learner = dict(agent=agent, optimizer=optimizer, aux_optimizer=aux_optimizer, return_rms=return_rms)
    learner["phase"] = phase
    global_step, start_iteration, aux_state = restore_run(args, run, **learner)

    # --- the rollout's storage, (T, N) each; its frames go straight into the phase ---
    actions = torch.zeros((T, N), dtype=torch.long, device=device)
    logprobs = torch.zeros((T, N), device=device)
    values = torch.zeros((T, N), device=device)
    step_rows = torch.zeros((4, T, N), device=device)  # a step's rows, filled on the host, then one copy
    # valid: 0 on the reset step of next-step autoreset, which is no transition
    rewards, terminations, dones, valid = step_rows.unbind()
    next_obs = torch.as_tensor(envs.reset()[0], device=device)
    next_valid = np.ones(N, dtype=bool)
    running_return = np.zeros(N)  # the reward scaling's discounted return
    ep_return = np.zeros(N)
    ep_length = np.zeros(N, dtype=np.int64)

    if aux_state is not None:  # resumed inside an auxiliary phase: its remaining minibatches come first
        aux_state = run_aux_phase(steps, phase, aux_state, args, run.stop, run.writer, global_step)
        # stopped again, the run ends here; the stopped run evaluated and checkpointed this step already
        end_iteration(run, learner, aux_state, global_step, start_iteration - 1, args, steps_done=0)

    for iteration in range(start_iteration, args.num_iterations + 1):
        slot = (iteration - 1) % slots
        anneal_learning_rates(optimizer, aux_optimizer, iteration, args)  # if on, over the whole run
        started = time.time()

        # --- policy phase: rollout, written into the phase buffer ---
        obs = phase["obs"][slot]
        finished = []  # the episodes that end: (step, returns, lengths)
        for step in range(T):
            global_step += args.num_envs  # every process's envs
            obs[step] = next_obs
            with torch.no_grad():
                actions[step], logprobs[step], values[step] = steps["act"](next_obs)
            frames, reward, term, trunc, _ = finite_step(envs.step(actions[step].cpu().numpy()), global_step)
            done = term | trunc
            ep_return += reward  # the raw score; the reset step adds 0 and is not counted
            ep_length += next_valid
            finished.append((global_step, ep_return[done], ep_length[done]))
            ep_return[done] = 0.0
            ep_length[done] = 0
            if return_rms is not None:
                # the reference's RewardNormalizer discounts with 0.99; here --gamma (docs/ppg_procgen.md)
                reward, running_return = scale_reward(reward, running_return, done, return_rms, args.gamma)
            host_rows = np.array([reward, term, done, next_valid], "float32")
            step_rows[:, step] = torch.from_numpy(host_rows)
            next_obs = torch.as_tensor(frames, device=device)
            next_valid = ~done

        # --- advantages, the phase's value targets, PPO update ---
        with torch.no_grad():
            next_value = agent.value(next_obs)
            advantages, returns = compute_gae(
                rewards, values, next_value, terminations, dones, valid, args.gamma, args.gae_lambda
            )
        phase["returns"][slot] = returns
        phase["valid"][slot] = valid
        rollout = dict(obs=obs, actions=actions, logprobs=logprobs, returns=returns, valid=valid)
        rollout["advantages"] = normalize_advantages(advantages, valid, args.world_size)  # once per batch
        batch = {k: v.flatten(0, 1) for k, v in rollout.items()}  # (T * N, ...)
        stats = policy_update(steps, batch, args)
        # process 0, with every process's episodes: one host sync per iteration
        log_iteration(run, learner, finished, stats, values, batch, iteration, started, global_step, args)

        # --- auxiliary phase: after every N_pi policy iterations, not after the last (the reference's) ---
        if args.e_aux > 0 and iteration % args.n_pi == 0 and iteration < args.num_iterations:
            old_logits = old_policy_logits(agent, phase["obs"], args.chunk_size)
            aux_state = dict(epoch=0, done=0, phase=iteration // args.n_pi, old_logits=old_logits)
            aux_state = run_aux_phase(steps, phase, aux_state, args, run.stop, run.writer, global_step)

        # --- evaluation when due (process 0), then a stop if one is asked, else a checkpoint when due ---
        end_iteration(run, learner, aux_state, global_step, iteration, args, steps_done=args.batch_size)

    # --- end: the final model (process 0) saved, reloaded from disk and evaluated ---
    end_run(args, run, agent, global_step)


# The algorithm ends here; a learner may stop. Below: this file's machinery (phases, envs, checks), then the shared plumbing.
import traceback  # (signal and sys: the shared block imports them)

# The layout of this file's checkpoints and models: raised when a field changes, so --resume refuses another in one line
CHECKPOINT_FORMAT = 2

# The interval of every numeric flag, checked by parse_args before anything else happens
RANGES = dict(seed="[0, 1e9]", num_levels="[0, 1e9]", start_level="[0, 1e9]", eval_every="[0, inf)", eval_episodes="[1, inf)",
    checkpoint_every="[0, inf)", progress_interval="[0, inf)", total_timesteps="[1, inf)", learning_rate="(0, inf)",
    num_envs="[1, inf)", num_steps="[1, inf)", gamma="[0, 1]", gae_lambda="[0, 1]", num_minibatches="[1, inf)",
    update_epochs="[1, inf)", clip_coef="(0, inf)", ent_coef="[0, inf)", vf_coef="[0, inf)", max_grad_norm="[0, inf)",
    n_pi="[1, inf)", e_aux="[0, inf)", aux_learning_rate="(0, inf)", aux_rollouts="[1, inf)", beta_clone="[0, inf)",
    vf_true_weight="[0, inf)", chunk_size="[0, inf)")  # fmt: skip


def preset_defaults(argv: list[str]) -> Args:
    # paper: openai/phasic-policy-gradient train.py (but the reward filter's gamma, see scale_reward); small: N_pi 8
    n_pi = 8 if flag_value(argv, "preset", Args.preset) == "small" else Args.n_pi
    env_id = flag_value(argv, "env_id", Args.env_id)  # a game's name (starpilot): its Easy id, which --help shows
    easy = f"{env_id.capitalize()}Easy-v0"
    return Args(env_id=easy if easy in envpool.list_all_envs() else env_id, n_pi=n_pi)


def env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    try:
        envpool_has(env_id)  # registers envpool's Procgen family
        spec = envpool.make_spec(env_id)
    except ImportError as e:  # Procgen's library needs the Qt 5 runtime
        fail(f"envpool cannot load '{env_id}' ({' '.join(str(e).split())}); `make install` adds libqt5gui5 for Procgen")
    return spec.observation_space, spec.action_space


def make_env(env_id: str, num_envs: int, seed: int, num_levels: int = 0, start_level: int = 0):
    """envpool's Procgen as the reference's ProcgenGym3Env: 3x64x64 uint8 frames, unlimited levels unless num_levels."""
    return envpool.make(env_id, "gymnasium", num_envs=num_envs, seed=seed, num_levels=num_levels, start_level=start_level)


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
    """Every check before the run directory is made; then the Run (process 0 writes), with this process's envs."""
    procgen = [name for name in envpool.list_all_envs() if name.endswith(("Easy-v0", "Hard-v0"))]  # 16 games x 2
    if (easy := preset_defaults(["--env-id", args.env_id]).env_id) != args.env_id:  # a game's name means its Easy one
        print(f"--env-id {args.env_id} runs envpool's {easy} (pass {easy[:-7]}Hard-v0 for Hard)")
        args.env_id = easy
    if args.env_id not in procgen:
        fail(f"{SCRIPT} runs the 16 Procgen games (StarpilotEasy-v0, bigfish, ...), not '{args.env_id}'; run ppo.py for it")
    obs_space, action_space = env_spaces(args.env_id)
    check_args(args, obs_space, action_space)
    rank, device, note = start_processes(args)
    N = args.num_envs // args.world_size  # this process's envs
    check_storage(storage(args, obs_space, action_space, device))
    ckpt = load_checkpoint(args.resume, args.env_id) if args.resume else None
    if ckpt is not None:  # refused before anything is written: a checkpoint of another number of processes, missing frames
        process_rng(ckpt, rank, args.world_size)
        saved = ckpt["phase"][rank]  # (written whole, to a .tmp renamed)
        if saved and not os.path.isfile(path := os.path.join("runs", ckpt["run_name"], saved["file"])):
            fail(f"the checkpoint's phase frames {path} are missing; resume from a checkpoint whose frames are beside it")
    run = Run(args, ckpt, device, args.num_iterations * args.batch_size, share=f"stepping {N} of the {args.num_envs} envs")
    run.dir = gather(run.dir, args.world_size)[0]  # process 0's: the others write their frames of the phase there
    for line in (note, args.bf16 and bf16_note(device)):
        if line and rank == 0:
            print(line, flush=True)
    # envs are not restored by a resume, so a resumed run's take a fresh seed; process r steps envs r*N .. r*N + N-1
    run.envs = make_env(args.env_id, N, args.seed + run.start_step + rank * N, args.num_levels, args.start_level)
    run.obs_space, run.action_space = obs_space, action_space
    return run


def aux_minibatch_done(clock: dict, state: dict, minibatches: int, stop: list[int], writer, args: Args) -> bool:
    """After each auxiliary minibatch (a phase may take hours): process 0's progress line; whether to stop, alike in all."""
    clock["done_here"] += 1
    if writer is not None and time.time() - clock["last_print"] > args.progress_interval:
        clock["last_print"] = time.time()
        left = (args.e_aux - state["epoch"]) * minibatches - state["done"]
        eta = (time.time() - clock["started"]) / clock["done_here"] * left
        print(f"auxiliary phase {state['phase']}: epoch {state['epoch'] + 1}/{args.e_aux}, minibatch {state['done']}/"
              f"{minibatches} | ETA of the phase {int(eta // 60)}m{int(eta % 60):02d}s", flush=True)  # fmt: skip
    return stop_everywhere(stop, args.world_size, state["sums"].device)


def log_aux_phase(writer, aux_means: torch.Tensor, clock: dict, minibatches: int, global_step: int, world_size: int):
    """Process 0 logs the last epoch's loss terms (their mean over the processes, which all take part) and the pace."""
    aux_values = mean_over_processes(aux_means, world_size).tolist()
    if writer is None:
        return
    for name, value in check_training(dict(zip(AUX_STATS, aux_values, strict=True)), global_step).items():
        writer.add_scalar(f"losses/{name}", value, global_step)
    seconds = (time.time() - clock["started"]) / max(clock["done_here"] / minibatches, 1e-9)
    writer.add_scalar("charts/aux_epoch_seconds", seconds, global_step)


def end_iteration(run, learner: dict, aux_state, global_step: int, iteration: int, args: Args, steps_done: int) -> None:
    """The evaluation when due (process 0); the checkpoint when due or on a stop, where every process then stops."""
    if run.rank == 0 and crossed(global_step, steps_done, args.eval_every):
        with run.paused():
            run.log_eval(evaluate(learner["agent"], args, run.device, run.video(global_step)), global_step)
    stopping = stop_everywhere(run.stop, args.world_size, run.device)  # the same answer on every process
    if stopping or crossed(global_step, steps_done, args.checkpoint_every):
        write_checkpoint(args, run, **learner, aux_state=aux_state, global_step=global_step, iteration=iteration)
    if stopping:
        run.envs.close()
        leave(run, stopped_at=f"step {global_step:,}" + (", inside an auxiliary phase" if aux_state else ""))


def end_run(args: Args, run: "Run", agent: Agent, global_step: int) -> None:
    """Old phase files removed (a last checkpoint's frames stay); process 0 saves, reloads and evaluates the final model."""
    run.envs.close()
    remove_old_phases(run.dir, run.rank, f"phase_{args.num_iterations}_process{run.rank}.u8")
    leave(run, stay=run.rank == 0)  # process 0 stays, to save the final model
    if args.save_model:
        eval_agent = Agent(run.obs_space, run.action_space, args.arch, args.bf16).to(run.device)
        eval_agent.load_state_dict(run.save_and_reload(model=agent.state_dict())["model"])
        run.log_eval(evaluate(eval_agent, args, run.device, run.video()), global_step, run.model_path)
    run.finish(global_step)
    leave(run)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    resid = returns - values
    var_resid = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return torch.where(var_returns > 0, 1 - var_resid / var_returns, torch.full_like(var_returns, float("nan")))


def log_iteration(run, learner: dict, finished: list, stats: dict, values, batch, iteration, started, global_step, args):
    """Process 0 logs every process's episodes (one exchange), the losses (one host sync), the rate, the progress line."""
    episodes = gather_episodes(finished, args.world_size)
    if run.rank != 0:
        return
    for step, fin_returns, fin_lengths in episodes:
        run.log_episodes(fin_returns, fin_lengths, step)
    explained = explained_variance(values.reshape(-1), batch["returns"], batch["valid"])
    on_device = [torch.stack(list(stats.values())), explained.reshape(1), parameter_sum(learner["agent"])]
    *losses, ev, total = torch.cat(on_device).tolist()
    check_training({**dict(zip(stats, losses, strict=True)), "parameter sum": total}, global_step)
    phase, slot = divmod(iteration - 1, args.n_pi)
    scalars = {**{f"losses/{k}": v for k, v in zip((*stats, "explained_variance"), (*losses, ev), strict=True)},
               "charts/learning_rate": float(learner["optimizer"].param_groups[0]["lr"]), "charts/phase": phase + 1,
               "charts/policy_phase_SPS": int(args.batch_size / (time.time() - started))}  # fmt: skip
    for tag, value in scalars.items():
        run.writer.add_scalar(tag, value, global_step)
    last = iteration == args.num_iterations
    run.log(global_step, global_step, f" | phase {phase + 1}, iteration {slot + 1}/{args.n_pi}", force=last)


def evaluate(agent: Agent, args: Args, device: torch.device, video: str | None = None):
    """The raw returns of one full episode on each of --eval-episodes envs; the video: env 0's 64x64 frames, as the agent's."""
    envs = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, args.num_levels, args.start_level)
    obs, _ = envs.reset()
    returns, finished, frames = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool), []
    while not finished.all():
        if video is not None and not finished[0]:
            frames.append(obs[0].transpose(1, 2, 0))
        with torch.no_grad():
            action = agent.act(torch.as_tensor(obs, device=device), args.eval_deterministic)[0].cpu().numpy()
        obs, reward, term, trunc, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
    envs.close()
    write_video(video, frames)
    return returns


def storage(args: Args, obs_space: gym.Space, action_space: gym.Space, device: torch.device) -> dict:
    """The phase's frames, returns, valid flags and old logits, the rollout's (T, N) tensors; times the processes on a CPU."""
    slots, T, N = (args.n_pi if args.e_aux > 0 else 1), args.num_steps, args.num_envs // args.world_size
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    per_step = int(np.prod(obs_space.shape)) + 2 * 4 + (4 * int(action_space.n) if args.e_aux > 0 else 0)
    phase = f"the phase ({slots} rollouts of --num-envs {N} x --num-steps {T} frames)"
    fix = "pass --preset small (N_pi 8), or a smaller --n-pi, --num-envs or --num-steps"
    return {phase: (sharing * (slots * T * N * per_step + T * N * (8 + 6 * 4)), device, fix)}


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> None:
    """Flags that only make sense together, and the sizes Args computes, checked."""
    refuse_meaningless(args, [
        # measured with envpool 1.2: with unlimited levels, --start-level leaves every level as it was
        (("start_level",), args.num_levels == 0,
         "is the first level of a fixed set, and this run's levels are unlimited (--num-levels 0)"),
        (("n_pi", "preset", "aux_learning_rate", "aux_rollouts", "beta_clone", "vf_true_weight"), args.e_aux == 0,
         "is for the auxiliary phase, and this run has none (--e-aux 0)"),
        (("preset",), "n_pi" in getattr(args, "typed", ()), "only sets the default of --n-pi, and --n-pi is given"),
        (("eval_episodes", "eval_deterministic", "capture_video"), not (args.eval_every > 0 or args.save_model),
         "sets the evaluations, and this run has none (see --eval-every and --save-model)"),
    ])  # fmt: skip
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):  # typed, or a checkpoint's
        fail("--cudagraphs needs a CUDA device, and this run is on the CPU; leave it out (--compile works on the CPU)")
    args.compile = args.compile or args.cudagraphs
    args.world_size = processes = int(os.environ.get("WORLD_SIZE", "1"))
    for flag, value in (("--num-envs", args.num_envs), ("--aux-rollouts", args.aux_rollouts if args.e_aux > 0 else 0)):
        if value % processes:  # each process steps its share of the envs, and trains on its share of an aux minibatch
            fail(f"{flag} {value} does not split evenly over {processes} processes; pass a multiple of {processes}")
    if processes > 1 and args.compile:  # the gradients are averaged between backward and step, outside the compiled update
        fail("--compile runs in one process; leave out --compile and --cudagraphs under torchrun")
    args.batch_size = args.num_envs * args.num_steps  # the sizes Args computes, before the checks of those that do not fit
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_envs // processes * args.num_steps % args.num_minibatches:
        each = f" ({args.num_envs // processes} in each of {processes} processes)" if processes > 1 else ""
        fail(f"batch size {args.num_envs} envs{each} x {args.num_steps} steps = {args.batch_size} does not divide into "
             f"{args.num_minibatches} minibatches; change --num-minibatches, --num-envs or --num-steps")  # fmt: skip
    # the flag out of proportion: the env count where it is further above its default than the budget is below its own
    many_envs = args.num_envs / Args.num_envs > Args.total_timesteps / args.total_timesteps
    if args.num_iterations < 1 and many_envs and args.total_timesteps >= args.num_steps:
        fail(f"--num-envs {args.num_envs} is out of proportion to --total-timesteps {args.total_timesteps} (a rollout "
             f"is more); pass --num-envs at most {args.total_timesteps // args.num_steps}")  # fmt: skip
    if args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout ({args.batch_size} steps); raise it")
    if args.e_aux > 0 and args.aux_rollouts > args.n_pi * args.num_envs:
        fail(f"--aux-rollouts {args.aux_rollouts} is more than a phase's {args.n_pi * args.num_envs} rollouts; pass fewer")
    if args.chunk_size == 0:  # bfloat16 on a CPU gains from larger chunks, float32 does not (benchmark/results/speed_bf16.md)
        on_cuda = args.cuda and torch.cuda.is_available()
        args.chunk_size = args.minibatch_size // processes if on_cuda else (128 if args.bf16 else 32)


def remove_old_phases(run_dir: str, rank: int, keep: str | None) -> None:
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        if name.startswith("phase_") and name.endswith(f"_process{rank}.u8") and name != keep:
            os.remove(os.path.join(run_dir, name))


def write_checkpoint(args: Args, run, agent, optimizer, aux_optimizer, return_rms, phase, aux_state, global_step, iteration):
    """checkpoint.pt (process 0) after a policy iteration or inside an auxiliary phase (aux_state), the frames beside it."""
    filled, name = (iteration - 1) % phase["obs"].shape[0] + 1, f"phase_{iteration}_process{run.rank}.u8"
    # the frames an auxiliary phase is still to train on: a phase not yet whole, or one whose auxiliary phase has begun,
    # or, at the run's last iteration, was skipped (restore_run runs it when a longer --total-timesteps extends the run)
    saved_phase = None
    if args.e_aux > 0 and (filled < args.n_pi or aux_state is not None or iteration >= args.num_iterations):
        # raw, in this process's own file in the run directory on its node, written before the checkpoint that names it
        path = os.path.join(run.dir, name)
        os.makedirs(run.dir, exist_ok=True)
        with open(f"{path}.tmp", "wb") as f:
            for slot in phase["obs"][:filled]:  # slot by slot: from CUDA, one rollout's frames at a time pass through RAM
                slot.cpu().numpy().tofile(f)
        os.replace(f"{path}.tmp", path)
        saved_phase = dict(file=name, filled=filled, **{k: phase[k][:filled].cpu().clone() for k in ("returns", "valid")})
    aux = {k: v.cpu() if torch.is_tensor(v) else v for k, v in aux_state.items()} if aux_state else None
    # gathered once every process has written its frames, so the checkpoint names only whole files
    gathered = gather((saved_phase, aux, rng_state(phase["obs"].device)), args.world_size)
    phases, auxes, rngs = zip(*gathered, strict=True)
    if run.rank == 0:
        run.checkpoint(model=agent.state_dict(), optimizer=optimizer.state_dict(), aux_optimizer=aux_optimizer.state_dict(),
                       return_rms=return_rms.state_dict() if return_rms else None, phase=phases, aux=auxes if aux else None,
                       global_step=global_step, iteration=iteration, rng=rngs)  # fmt: skip
    if args.world_size > 1:
        dist.barrier()  # no process removes the files the last checkpoint named before the new one is written
    remove_old_phases(run.dir, run.rank, saved_phase and name)


def restore_run(args: Args, run, agent, optimizer, aux_optimizer, return_rms, phase):
    """--resume: the learner, this process's phase so far and RNG states; the step, iteration and aux state to go on from."""
    ckpt, rank, device = run.ckpt, run.rank, run.device
    if ckpt is None:
        return 0, 1, None
    for obj, key in ((agent, "model"), (optimizer, "optimizer"), (aux_optimizer, "aux_optimizer"), (return_rms, "return_rms")):
        if obj is not None:  # (no return_rms without --norm-reward)
            obj.load_state_dict(ckpt[key])
    if saved := ckpt["phase"][rank]:  # the frames start_run found, slot by slot: no second copy is ever held
        with open(os.path.join(run.dir, saved["file"]), "rb") as f:
            for slot in phase["obs"][: saved["filled"]]:
                slot.copy_(torch.from_numpy(np.fromfile(f, dtype=np.uint8, count=slot.numel()).reshape(slot.shape)))
        for k in ("returns", "valid"):
            phase[k][: saved["filled"]] = saved[k].to(device)
    rng_state(device, restore=process_rng(ckpt, rank, args.world_size))
    aux_state = ckpt["aux"] and {k: v.to(device) if torch.is_tensor(v) else v for k, v in ckpt["aux"][rank].items()}
    if not aux_state and saved and saved["filled"] == args.n_pi and ckpt["iteration"] < args.num_iterations:
        # the run ended with a whole phase, whose auxiliary phase its last iteration skipped (as the reference's loop
        # does); extended by a longer --total-timesteps, it comes first, as in a run started with that total
        old_logits = old_policy_logits(agent, phase["obs"], args.chunk_size)
        aux_state = dict(epoch=0, done=0, phase=ckpt["iteration"] // args.n_pi, old_logits=old_logits)
    if rank == 0:
        print(f"resumed {run.dir} at step {ckpt['global_step']:,}" + (" in an auxiliary phase" if aux_state else ""))
    return ckpt["global_step"], ckpt["iteration"] + 1, aux_state


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


def mean_over_processes(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """The mean of x over the processes, for a decision every process must take alike."""
    if world_size > 1:
        x = x.clone()
        dist.all_reduce(x)
    return x / world_size


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
