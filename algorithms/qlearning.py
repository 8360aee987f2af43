"""Tabular Q-learning (Watkins 1989; Sutton & Barto 2018, ch. 6.5) over many envs at once; benchmark:
`bash benchmark/qlearning.sh`.

Reading guide: down to the line `# The algorithm ends here`, the algorithm: Args, the grid of Box
observations, the maths (discretise, q_update, schedules, greedy policy, exact return), the episode statistics
and main, the loop. Below it: this file's machinery (presets, envs, exact evaluation, logging, checkpoints,
pictures, storage, checks, start_run, end_run), then the plumbing all eight files share.
"""

import dataclasses
import os
from dataclasses import dataclass

if "OMP_NUM_THREADS" not in os.environ:  # before torch loads: idle threads sleep, not spin (docs/speed.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import numpy as np
import torch
import tyro


@dataclass
class Args:
    # --- the algorithm ---
    env_id: str = "FrozenLake-v1"
    """envpool id (FrozenLake, Taxi, CliffWalking, classic control) or a gymnasium id with Discrete actions"""
    total_timesteps: int = 300_000
    """total env steps over all envs; raised on --resume, it extends a finished or stopped run"""
    num_envs: int = 64
    """parallel envs; each vector step updates the table once with all of their transitions"""
    gamma: float = 0.99
    """discount factor"""
    learning_rate: float = 0.1
    """step size of the update at the start of training"""
    lr_decay: bool = True
    """decay the step size linearly to --end-learning-rate over the run"""
    end_learning_rate: float = 0.01
    """step size at the end of training, with --lr-decay"""
    start_e: float = 1.0
    """epsilon of the epsilon-greedy policy at the start"""
    end_e: float = 0.1
    """floor of epsilon"""
    exploration_fraction: float = 0.5
    """fraction of total_timesteps over which epsilon decays linearly from start_e to end_e"""
    max_episode_steps: int = 0
    """episode cap, truncated (and bootstrapped) like a time limit (0: the env's own)"""
    bins: int = 10
    """Box observations: cells per dimension of the uniform grid"""
    obs_low: tuple[float, ...] | None = None
    """Box observations: the grid's lower bound per dimension (default: the space's; needed if unbounded)"""
    obs_high: tuple[float, ...] | None = None
    """Box observations: the grid's upper bound per dimension (default: the space's; needed if unbounded)"""

    # --- the run ---
    exp_name: str = "qlearning"
    """name of this experiment, part of the run directory name"""
    seed: int = 1
    """seed of python, numpy, torch and the envs; on CPU the same seed gives the same run to the bit"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = False
    """use CUDA when it is available (off by default: a table's updates are too small to gain from a GPU)"""
    save_model: bool = False
    """save the final table to runs/<run>/qlearning.model, then reload it from disk and evaluate it"""
    eval_every: int = 0
    """evaluate the greedy policy on other envs every this many env steps (0: at the end, if --save-model)"""
    eval_episodes: int = 1000
    """episodes per evaluation (one per eval env)"""
    checkpoint_every: int = 0
    """write runs/<run>/checkpoint.pt every this many env steps (0: only on Ctrl-C / SIGTERM)"""
    resume: str = ""
    """path of a checkpoint.pt to resume; the run goes on in its directory with the checkpoint's arguments"""
    progress_interval: float = 5.0
    """seconds between progress lines"""
    log_every: int = 10_000
    """write the learning rate, epsilon, TD error and exact return every this many env steps"""
    optimum_tolerance: float = 0.02
    """toy text: report when the greedy policy's exact return comes within this of the exact optimum"""

    # --- computed at start-up ---
    num_iterations: tyro.conf.Suppress[int] = 0
    """total_timesteps // num_envs vector steps (computed)"""


@dataclass
class Grid:
    """A uniform grid over a Box: `bins` cells per dimension between low and high; values outside fall in the
    edge cells. A Discrete space is its own table (bins = 0)."""

    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    bins: int = 0

    @property
    def num_states(self) -> int:
        return self.bins ** len(self.low)


def discretise(obs: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Row of the table for each observation: Discrete ids as they are; Box vectors by their grid cell.

    A value on an inner bin edge belongs to the cell above it (where the edge is exact in binary floating
    point; an edge such as 1/49 of the range may round to the cell below); values at or beyond the bounds fall
    in the edge cells.
    """
    if not grid.bins:
        return obs.long()
    low = torch.tensor(grid.low, dtype=torch.float64, device=obs.device)
    high = torch.tensor(grid.high, dtype=torch.float64, device=obs.device)
    x = obs.reshape(obs.shape[0], -1).double()
    cells = torch.floor((x - low) / (high - low) * grid.bins).long().clamp(0, grid.bins - 1)
    strides = grid.bins ** torch.arange(cells.shape[1] - 1, -1, -1, device=obs.device)
    return (cells * strides).sum(1)


def q_update(q, states, actions, rewards, next_states, terminations, valid, gamma: float, lr: float):
    """One Watkins Q-learning update of the table `q` (states x actions), in place, from a batch of
    transitions; returns the mean |TD error| over the valid ones.

    target = r + gamma * max_a' Q(s', a'), without the bootstrap where the step terminated; a truncated step
    bootstraps from s', which next-step autoreset hands over as the real final observation. `valid` = 0 masks
    the reset step that follows a done. Duplicates: every target is computed from the table as it was before
    the batch, and a pair that occurs n times moves towards the mean of its n targets by 1 - (1 - lr)^n, what
    n updates in a row would do with equal targets. (Plain `q[s, a] += ...` keeps one arbitrary duplicate:
    last write wins on the CPU, undefined on CUDA. index_add_ counts every duplicate, and its result does not
    depend on their order, up to rounding.)
    """
    num_actions = q.shape[1]
    flat = q.view(-1)
    idx = states * num_actions + actions
    target = rewards + gamma * q[next_states].max(1).values * (1.0 - terminations)
    td = (target - flat[idx]) * valid
    # occurrences of each transition's pair in the batch: O(batch^2), no table-sized work per step
    n = ((idx[:, None] == idx[None, :]) * valid[None, :]).sum(1).clamp(min=1.0)
    flat.index_add_(0, idx, (1.0 - (1.0 - lr) ** n) * td / n)
    return td.abs().sum() / valid.sum().clamp(min=1.0)


def linear_interp(start: float, end: float, duration: float, t: int) -> float:
    """From start at t = 0 to end at t = duration, then end (CleanRL dqn.py's epsilon schedule), in either
    direction; duration 0 is end at once. Schedules both epsilon and the step size."""
    return start + (end - start) * min(t / max(duration, 1e-9), 1.0)


def greedy_actions(q: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Argmax with ties broken towards the lowest action, so the greedy policy is a function of the table."""
    return q[states].argmax(1)


def exact_return(tables, policy: np.ndarray | None, horizon: int) -> float:
    """Expected undiscounted return over `horizon` steps from the start distribution: of `policy` (one action
    per state), or with policy None the optimum by finite-horizon value iteration. `tables`: see
    transition_tables."""
    P, R, T, start = tables
    cont = P - T  # probability of going on to s' without the episode ending
    v = np.zeros(P.shape[0])
    if policy is not None:
        rows = np.arange(len(policy))
        cont_pi, r_pi = cont[rows, policy], R[rows, policy]
        for _ in range(horizon):
            v = r_pi + cont_pi @ v
        return float(start @ v)
    for _ in range(horizon):
        v = (R + cont @ v).max(1)
    return float(start @ v)


def update_episode_stats(ep_return, ep_length, raw_reward, valid, episode_end):
    """Running return and length per env, and the finished episodes' ones. `valid`: False on an autoreset's
    step (not counted); `episode_end`: the logged episode's end (Atari with episodic life: the game's)."""
    ep_return = ep_return + raw_reward
    ep_length = ep_length + valid
    finished_returns, finished_lengths = ep_return[episode_end], ep_length[episode_end]
    ep_return = np.where(episode_end, 0.0, ep_return)
    ep_length = np.where(episode_end, 0, ep_length)
    return ep_return, ep_length, finished_returns, finished_lengths


def main(args: Args) -> None:
    # --- set-up (start_run, below): checks, device, checkpoint, run directory, writer, exact optimum ---
    run = start_run(args)
    device = run.device
    N = args.num_envs
    # the table: a row per state (per grid cell for Box observations), a column per action, zeros to start
    q = torch.zeros((run.num_states, run.num_actions), dtype=torch.float64, device=device)
    if run.ckpt:  # resume
        q.copy_(run.ckpt["q"])
    global_step = run.start_step

    # envs are not restored by a resume, so its envs take a fresh seed
    envs = make_env(args.env_id, N, args.seed + global_step, args.max_episode_steps)
    next_obs = discretise(torch.as_tensor(envs.reset()[0], device=device), run.grid)
    next_valid = np.ones(N, dtype=bool)  # False on the reset step that follows a done
    ep_return = np.zeros(N)
    ep_length = np.zeros(N, dtype=np.int64)
    # the mean |TD error| between log lines, summed on the device: one host sync per log line, not per step
    td_sum = torch.zeros((), dtype=torch.float64, device=device)
    td_count = 0
    exploration_steps = args.exploration_fraction * args.total_timesteps

    for iteration in range(run.start_iteration, args.num_iterations + 1):
        global_step += N
        epsilon = linear_interp(args.start_e, args.end_e, exploration_steps, global_step)
        lr = linear_interp(args.learning_rate, args.end_learning_rate, args.total_timesteps, global_step)
        lr = lr if args.lr_decay else args.learning_rate

        # --- act: epsilon-greedy; Q-learning is off-policy, so it learns greedy values while it explores ---
        states = next_obs
        explore = torch.rand(N, device=device) < epsilon
        random_actions = torch.randint(0, run.num_actions, (N,), device=device)
        actions = torch.where(explore, random_actions, greedy_actions(q, states))

        # --- step: a NaN or inf from the env ends the run in one line (finite_step) ---
        next_obs_np, reward, term, trunc, _ = finite_step(envs.step(actions.cpu().numpy()), global_step)
        done = term | trunc
        step_rows = np.stack([reward, term, next_valid])  # one copy to the device for the three
        rewards, terminations, valid = torch.as_tensor(step_rows, dtype=torch.float64, device=device)
        next_obs = discretise(torch.as_tensor(next_obs_np, device=device), run.grid)

        # --- Q update: the reset step after a done is masked out (valid = 0) ---
        td_sum += q_update(q, states, actions, rewards, next_obs, terminations, valid, args.gamma, lr)
        td_count += 1

        # --- episode statistics: the finished episodes' returns and lengths ---
        ep_return, ep_length, fin_returns, fin_lengths = update_episode_stats(ep_return, ep_length, reward, next_valid, done)
        run.log_episodes(fin_returns, fin_lengths, global_step)
        next_valid = ~done

        # --- logging: every log_every env steps, with the greedy policy's exact return on toy text ---
        last = iteration == args.num_iterations
        if crossed(global_step, N, args.log_every) or last:
            td_error = (td_sum / max(td_count, 1)).item()
            scalars = {"charts/learning_rate": lr, "charts/epsilon": epsilon, "losses/td_error": td_error}
            log_table_progress(args, run, q, scalars, global_step, last)
            td_sum.zero_()
            td_count = 0

        # --- evaluation, checkpoint, stop requests ---
        end_iteration(args, run, q, envs, global_step, iteration)

    # --- end (end_run, below): the greedy policy drawn; the final table saved, reloaded and evaluated ---
    envs.close()
    end_run(args, run, q, global_step)


# The algorithm ends here; a learner may stop. Below: this file's machinery (envs, optimum, checks), then the shared plumbing.
import gymnasium as gym
from gymnasium.envs.toy_text.frozen_lake import MAPS

CHECKPOINT_FORMAT = 1  # raise it when a checkpoint's or model's fields change: --resume then refuses the old layout
RANGES = dict(seed="[0, 1e9]", eval_every="[0, inf)", eval_episodes="[1, inf)", checkpoint_every="[0, inf)",
    progress_interval="[0, inf)", log_every="[1, inf)", total_timesteps="[1, inf)", num_envs="[1, inf)", gamma="[0, 1]",
    learning_rate="(0, 1]", end_learning_rate="(0, 1]", start_e="[0, 1]", end_e="[0, 1]", exploration_fraction="[0, 1]",
    max_episode_steps="[0, inf)", bins="[1, 1000000]", optimum_tolerance="[0, inf)")  # fmt: skip
# Defaults per env that reach the exact optimum (toy text) or a good return (classic control on a grid); typed flags win.
# FrozenLake8x8: the best greedy policy under its 200-step limit; Taxi, deterministic: asynchronous value iteration.
PRESETS = {
    "FrozenLake8x8-v1": dict(total_timesteps=4_000_000, gamma=0.995),
    "Taxi-v3": dict(learning_rate=1.0, end_learning_rate=1.0, optimum_tolerance=0.1),
    "CliffWalking-v0": dict(total_timesteps=100_000, max_episode_steps=100, learning_rate=0.5, end_learning_rate=0.5),
    "MountainCar-v0": dict(total_timesteps=5_000_000, bins=20, gamma=1.0, learning_rate=0.2),
    "CartPole-v1": dict(total_timesteps=5_000_000, obs_low=(-2.4, -3.0, -0.21, -3.5), obs_high=(2.4, 3.0, 0.21, 3.5)),
    "Acrobot-v1": dict(total_timesteps=5_000_000, bins=6),
}
PRESETS["CliffWalking-v1"] = PRESETS["CliffWalking-v0"]
# gymnasium 1.4 renamed these; its transition tables (env.unwrapped.P) have the dynamics of envpool's envs
GYMNASIUM_IDS = {"Taxi-v3": "Taxi-v4", "CliffWalking-v0": "CliffWalking-v1"}


def preset_defaults(argv: list[str]) -> Args:
    """The defaults of the preset of the env the command line names (PRESETS; none for other envs)."""
    env_id = flag_value(argv, "env_id", Args.env_id)
    return Args(env_id=env_id, **PRESETS.get(env_id, {}))


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


def make_env(env_id: str, num_envs: int, seed: int, max_episode_steps: int = 0):
    """A vector env with next-step autoreset (docs/conventions.md): envpool's where it has the id, gymnasium's otherwise."""
    if envpool_has(env_id) and not (max_episode_steps and episode_horizon(env_id) is None):
        cap = dict(max_episode_steps=episode_horizon(env_id, max_episode_steps)) if max_episode_steps else {}
        return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **cap)
    # gymnasium 1.x resets on the next step too; it runs a capped CliffWalking, as envpool ignores a cap where it has no limit
    next_step = dict(vectorization_mode="sync", vector_kwargs=dict(autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP))
    envs = gym.make_vec(GYMNASIUM_IDS.get(env_id, env_id), num_envs, **next_step, max_episode_steps=max_episode_steps or None)
    envs.reset(seed=seed)
    return envs


def make_grid(obs_space: gym.Space, bins: int, obs_low, obs_high) -> Grid:
    """The grid over Box observations, between the flags' bounds or the space's."""
    low = np.asarray(obs_low if obs_low is not None else obs_space.low, dtype=np.float64).reshape(-1)
    high = np.asarray(obs_high if obs_high is not None else obs_space.high, dtype=np.float64).reshape(-1)
    if low.size != (dims := int(np.prod(obs_space.shape))) or high.size != dims:
        fail(f"--obs-low and --obs-high need {dims} values each, one per dimension of {obs_space}; pass {dims} to each")
    if (bad := np.flatnonzero(~(np.isfinite(low) & np.isfinite(high) & (high > low)))).size:
        fail(f"the grid is unbounded or empty in dimensions {bad.tolist()}; bound it with --obs-low and --obs-high")
    return Grid(tuple(low.tolist()), tuple(high.tolist()), bins)


def episode_horizon(env_id: str, max_episode_steps: int = 0) -> int | None:
    """The steps an episode lasts at most: the env's limit or max_episode_steps, the shorter; None where neither is set."""
    if envpool_has(env_id):
        limit = envpool.make_spec(env_id).config.max_episode_steps
    else:
        with gym.make(env_id) as env:  # imports the module of a 'module:Env-v0' id, which gym.spec does not
            limit = env.spec.max_episode_steps
    return min([h for h in (limit, max_episode_steps) if h and h < 2**31 - 1], default=None)  # envpool's "none": 2**31 - 1


def transition_tables(env_id: str):
    """(P[s, a, s'], expected reward R[s, a], terminal mass T[s, a, s'], start distribution) from gymnasium's
    env.unwrapped.P over Discrete states (toy text); None elsewhere. gymnasium's Taxi starts from 300 states (optimum 7.93,
    the published figure), envpool's Taxi-v3 from 400 (optimum 9.555; docs/qlearning.md, implementation detail 11)."""
    try:
        env = gym.make(GYMNASIUM_IDS.get(env_id, env_id)).unwrapped
    except gym.error.Error:
        return None
    if not hasattr(env, "P"):  # (the callers' observations are Discrete)
        return None
    n, m = env.observation_space.n, env.action_space.n  # states, actions
    P, R, T = np.zeros((n, m, n)), np.zeros((n, m)), np.zeros((n, m, n))
    for s, a in np.ndindex(n, m):
        for p, s2, r, terminated in env.P[s][a]:
            P[s, a, s2] += p
            R[s, a] += p * r
            T[s, a, s2] += p * terminated
    return P, R, T, np.asarray(env.initial_state_distrib)


def log_table_progress(args: Args, run: "Run", q: torch.Tensor, scalars: dict, global_step: int, last: bool):
    """The scalars (a NaN or inf ends the run), the greedy policy's exact return on toy text, the progress line."""
    for tag, value in check_training(scalars, global_step).items():
        run.writer.add_scalar(tag, value, global_step)
    exact_text = ""
    if run.tables is not None:
        with run.paused():
            greedy = exact_return(run.tables, q.argmax(1).cpu().numpy(), run.horizon)
        run.writer.add_scalar("eval/exact_return", greedy, global_step)
        within = run.optimum - greedy <= args.optimum_tolerance  # reached: the first log of the stretch within it
        run.reached = (run.reached or (global_step, time.time() - run.start_time - run.paused_seconds)) if within else None
        exact_text = f" | greedy exact {greedy:.4f} of {run.optimum:.4f}"
    run.log(global_step, global_step, exact_text, force=last)


def end_iteration(args: Args, run: "Run", q: torch.Tensor, envs, global_step: int, iteration: int):
    """Each step's end: an evaluation every --eval-every steps, a checkpoint every --checkpoint-every and at a stop."""
    if crossed(global_step, args.num_envs, args.eval_every):
        with run.paused():
            run.log_eval(evaluate(q, run.grid, args), global_step)
    if crossed(global_step, args.num_envs, args.checkpoint_every) or run.stop:
        grid = dataclasses.asdict(run.grid)
        run.checkpoint(q=q.cpu(), grid=grid, global_step=global_step, iteration=iteration, rng=rng_state(run.device))
    if run.stop:
        envs.close()
        run.stop_and_exit(f"step {global_step:,}")


def evaluate(q: torch.Tensor, grid: Grid, args: Args) -> np.ndarray:
    """Play one episode of the greedy policy on each of args.eval_episodes envs; returns the episodes' returns."""
    envs = make_env(args.env_id, args.eval_episodes, args.seed + 100_000, args.max_episode_steps)
    obs, _ = envs.reset()
    returns, finished = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, dtype=bool)
    while not finished.all():
        action = greedy_actions(q, discretise(torch.as_tensor(obs, device=q.device), grid)).cpu().numpy()
        obs, reward, term, trunc, _ = envs.step(action)
        returns += np.where(finished, 0.0, reward)  # each env's first episode only
        finished |= term | trunc
    envs.close()
    return returns


def storage(args: Args, obs_space: gym.Space, action_space: gym.Space, device: torch.device, grid: Grid) -> dict:
    """For check_storage: the float64 table on the device; on toy text, transition_tables' arrays in host memory."""
    rows, num_actions = (grid.num_states if grid.bins else int(obs_space.n)), int(action_space.n)  # exact integers
    size = f"--bins {args.bins} ^ {len(grid.low)} dimensions = {float(rows):.2g}" if grid.bins else f"{rows:,}"
    fix = "lower --bins, or use dqn.py" if grid.bins else "use dqn.py"
    stores = {f"the table ({size} rows x {num_actions} actions)": (rows * num_actions * 8, device, fix)}
    toy_text = "toy_text" in str(getattr(gym.registry.get(GYMNASIUM_IDS.get(args.env_id, args.env_id)), "entry_point", ""))
    if not grid.bins and toy_text and episode_horizon(args.env_id, args.max_episode_steps):
        need = 8 * rows * num_actions * (2 * rows + 1)
        stores[f"the exact optimum's transition tables ({rows:,} states)"] = (need, torch.device("cpu"), "use dqn.py")
    return stores


def check_args(args: Args, obs_space: gym.Space, action_space: gym.Space) -> Grid:
    """The env's spaces (a table of sensible size) and flags that only make sense together; returns the table's grid."""
    if (processes := int(os.environ.get("WORLD_SIZE", "1"))) > 1:
        fail(f"it trains one table updated step by step in one process, and torchrun started {processes}; run it with python")
    env_id, discrete = args.env_id, isinstance(obs_space, gym.spaces.Discrete)
    if not isinstance(action_space, gym.spaces.Discrete) or action_space.start != 0:
        fail(f"it needs a Discrete action space (a column per action); {env_id} has {action_space}; use ppo.py or ddpg_td3.py")
    if not (discrete and obs_space.start == 0 or isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) != 3):
        fail(f"it needs Discrete or Box vector observations (a table row each); {env_id} has {obs_space}; use dqn.py (images)")
    grid = Grid() if discrete else make_grid(obs_space, args.bins, args.obs_low, args.obs_high)
    # the exact optimum needs a row per state, gymnasium's transition table and a horizon: looked up only when asked
    typed = "optimum_tolerance" in getattr(args, "typed", ())
    no_exact = typed and not (discrete and episode_horizon(env_id, args.max_episode_steps) and transition_tables(env_id))
    refuse_meaningless(args, [
        (("bins", "obs_low", "obs_high"), discrete, f"shapes the grid over Box observations, and {env_id}'s are Discrete"),
        (("end_learning_rate",), not args.lr_decay, "is where --lr-decay ends, and this run keeps its step size"),
        (("eval_episodes",), not (args.eval_every or args.save_model), "sets the evaluations, and this run has none"),
        (("optimum_tolerance",), no_exact, "is for the exact optimum: toy text with a time limit or --max-episode-steps"),
    ])  # fmt: skip
    args.num_iterations = args.total_timesteps // args.num_envs
    if args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of the {args.num_envs} envs; raise it")
    return grid


def start_run(args: Args) -> "Run":
    """Every check before the run directory is made, then the device, the checkpoint, the Run, the exact optimum (toy text)."""
    obs_space, action_space = env_spaces(args.env_id)
    grid = check_args(args, obs_space, action_space)
    device = seed_and_device(args, small=True)
    check_storage(storage(args, obs_space, action_space, device, grid))
    ckpt = load_checkpoint(args.resume, args.env_id) if args.resume else None
    run = Run(args, ckpt, device, args.num_iterations * args.num_envs)  # whole vector steps: the total it reaches
    run.grid, run.num_actions, run.num_states = grid, action_space.n, grid.num_states if grid.bins else obs_space.n
    run.start_iteration = run.ckpt["iteration"] + 1 if run.ckpt else 1
    if run.ckpt:
        rng_state(device, restore=run.ckpt["rng"])
        print(f"resumed {run.dir} at step {run.start_step:,}")
    run.horizon, run.reached = episode_horizon(args.env_id, args.max_episode_steps), None
    run.tables = transition_tables(args.env_id) if not grid.bins and run.horizon else None
    if run.tables:
        run.optimum = exact_return(run.tables, None, run.horizon)
        print(f"exact optimum over {run.horizon} steps from gymnasium's start states (value iteration): {run.optimum:.4f}")
    return run


def end_run(args: Args, run: "Run", q: torch.Tensor, global_step: int) -> None:
    """When the greedy policy came within the tolerance of the optimum; on the grid worlds, the greedy policy as a text
    grid; with --save-model the final table saved, reloaded from disk and evaluated; then the run's end."""
    if run.reached is not None:
        (step, seconds), tol = run.reached, args.optimum_tolerance
        print(f"greedy policy within {tol} of the optimum from step {step:,} on ({seconds:.1f} s of training)")
    lake, cliff = "←↓→↑", (["." * 12] * 3 + ["S" + "C" * 10 + "G"], "↑→↓←")  # the arrows in the order of the actions
    maps = {"FrozenLake-v1": (MAPS["4x4"], lake), "FrozenLake8x8-v1": (MAPS["8x8"], lake), "CliffWalking-v1": cliff}
    if (found := maps.get(GYMNASIUM_IDS.get(args.env_id, args.env_id))) is not None:  # holes, cliff, goal: their letters
        cells, arrows = np.array([list(row) for row in found[0]]), np.array(list(found[1]))
        labels = np.where(np.isin(cells, list("HGC")), cells, arrows[q.argmax(1).cpu().numpy().reshape(cells.shape)])
        print("greedy policy:\n" + "\n".join(" ".join(line) for line in labels))
    if args.save_model:
        state = run.save_and_reload(q=q.cpu(), grid=dataclasses.asdict(run.grid))
        run.log_eval(evaluate(state["q"].to(run.device), Grid(**state["grid"]), args), global_step, run.model_path)
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
