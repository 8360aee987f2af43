"""Learning checks: each algorithm, with its defaults and a fixed seed, reaches a measured threshold."""

import os

import envpool
import numpy as np
import pytest
from pixel_corridor import ENV_ID, with_pixel_corridor

from benchmark.studies import corridor
from conftest import CPU, ROOT, load_algorithm, only_run, run_algorithm, run_in_process, scalars, twenty_episode_means, values

ppo_module = load_algorithm("ppo")


def first_step_at_200(run) -> int | None:
    """The step at which CartPole's 20-episode mean first reaches 200 (None: never)."""
    steps, means = twenty_episode_means(run)
    reached = steps[means >= 200]
    return int(reached[0]) if len(reached) else None


@pytest.mark.learning
def test_ppo_learns_cartpole_and_compiled_as_the_eager_code_does(tmp_path):
    """CartPole's random policy scores about 22; PPO with the classic defaults over a 49,152-step budget (its learning
    rate annealed over it) must bring the 20-episode mean to 200. --compile traces the same acting step and update
    (torch.compile, inductor's CPU code), so learning must not change: with one seed, both runs reach 200 at nearly the
    same step. Measured on 2 CPU cores (one thread, 4 CartPoles stepped by gymnasium, --env-backend auto; two threads
    give the same run to the bit): seeds 1-3 first reached 200 at the same step eager and compiled (21,764 / 19,836 /
    18,544; compiled sampling and float sums drift apart only later), so the worst seed has 27k steps of slack; peaks
    233-256 eager, 221-270 compiled. The bar: both reach 200, within 5,000 steps of each other. The full 500k-step run
    (the benchmark, benchmark/ppo.sh classic) reaches 500. On the CPU, where it was measured."""
    for name, flags in (("eager", []), ("compiled", ["--compile"])):
        run_algorithm("ppo", "--seed", "1", "--total-timesteps", "49152", "--exp-name", name, CPU, *flags, cwd=tmp_path)
    eager, compiled = (first_step_at_200(next((tmp_path / "runs").glob(f"*__{n}__*"))) for n in ("eager", "compiled"))
    assert eager is not None and compiled is not None, (eager, compiled)
    assert abs(eager - compiled) <= 5000, (eager, compiled)


def random_policy_return(env_id: str, steps: int, num_envs: int = 16, **level) -> float:
    """Mean return of the episodes a uniform random policy finishes in `steps` steps of num_envs envpool envs."""
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=0, **level)
    envs.reset()
    rng, running, finished = np.random.default_rng(0), np.zeros(num_envs), []
    for _ in range(steps):
        _, reward, term, trunc, _ = envs.step(rng.integers(0, envs.action_space.n, num_envs))
        running += reward
        finished += list(running[term | trunc])
        running[term | trunc] = 0
    return float(np.mean(finished))


def ppg_run_with_aux_losses(cwd, argv: list[str]) -> np.ndarray:
    """ppg_procgen.py with argv, in this process, its auxiliary minibatches' loss sums recorded as they come (the file
    logs only each phase's last epoch); returns them as (phases, epochs, terms) means over each epoch's minibatches."""
    recorded, args = [], None

    def run(module):
        nonlocal args
        aux_update = module.aux_update

        def recording(steps, phase, slots, envs_idx, run_args):
            sums = aux_update(steps, phase, slots, envs_idx, run_args)
            recorded.append(sums.tolist())
            return sums

        module.aux_update = recording
        args = module.parse_args(argv)
        module.main(args)

    proc = run_in_process("ppg_procgen", run, cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    minibatches = -(-args.n_pi * args.num_envs // args.aux_rollouts)
    return np.array(recorded).reshape(-1, args.e_aux, minibatches, 3).mean(axis=2)


@pytest.mark.learning
def test_ppg_learns_a_level_where_no_constant_action_scores_and_its_auxiliary_losses_fall(tmp_path):
    """Jumper (Easy), level 18 only: a uniform random policy reaches the carrot in 56% of its episodes (5.6 over 322
    episodes, measured here), and every one of the 15 constant actions scores 0 (the left ones fall, the others wait
    for the time limit): a policy must act on what it sees. PPG with --arch detach (one CNN, so half the time of the
    default two: the phases' code is the same, and the second CNN is checked in test_ppg_procgen.py), 16 envs x 32
    steps, 3 policy epochs, phases of 4 policy iterations with 2 auxiliary epochs, 8,192 steps (so 3 auxiliary phases).
    Measured on 2 CPU cores, one thread, seeds 1-4: the episodes of the third quarter average 7.44 / 7.81 / 5.93 / 7.59
    and of the last 8.41 / 8.39 / 8.50 / 8.54; over the last half 8.02 / 8.13 / 7.28 / 8.14. The bar, on the last half:
    random + 1.25, 3 standard deviations of a random policy's mean over such a window (about 140 episodes of 0 or 10)
    above it, and 0.4 below the worst seed.
    The auxiliary phase must do its work: summed over the phases, the auxiliary value loss of the last epoch is below
    0.9 of the first epoch's (measured 0.72 / 0.77 / 0.64 / 0.79; an auxiliary phase that does not step, or whose loss
    does not reach the value head, leaves it at 1). About 1.5 minutes here."""
    random_return = random_policy_return("JumperEasy-v0", 600, num_levels=1, start_level=18)
    aux = ppg_run_with_aux_losses(tmp_path, [
        "--env-id", "JumperEasy-v0", "--num-levels", "1", "--start-level", "18", "--seed", "1", "--num-envs", "16",
        "--num-steps", "32", "--num-minibatches", "4", "--update-epochs", "3", "--n-pi", "4", "--e-aux", "2",
        "--total-timesteps", "8192", "--arch", "detach", CPU,
    ])  # fmt: skip
    logged = scalars(only_run(tmp_path))["charts/episodic_return"]
    last_half = [value for step, value, _ in logged if step > 8192 // 2]
    assert len(last_half) >= 50 and np.mean(last_half) >= random_return + 1.25, (random_return, np.mean(last_half))
    assert aux.shape[:2] == (3, 2), aux.shape
    first, final = aux[:, 0, 0].sum(), aux[:, -1, 0].sum()
    assert final <= 0.9 * first, (first, final)


def last_20_mean(run) -> float:
    """Mean return of a run's last 20 training episodes."""
    returns = values(run, "charts/episodic_return")
    assert len(returns) >= 20, len(returns)
    return float(np.mean(returns[-20:]))


@pytest.mark.learning
def test_ppo_gaussian_policy_learns_inverted_pendulum_within_20k_steps(tmp_path):
    """The Box-action path (Gaussian policy, observation and reward normalisation, the mujoco preset): a uniform random
    policy keeps InvertedPendulum-v4 up for 6.1 steps on average (4,509 episodes, measured here). Measured on 2 CPU
    cores, one thread, seeds 1-3 (the learning rate annealed over these 20k steps): the last 20 episodes average
    123.5 / 161.4 / 176.3. The bar, 60, is under half the worst seed and 10 times random. About 40 s here."""
    run_algorithm("ppo", "--env-id", "InvertedPendulum-v4", "--seed", "1", "--total-timesteps", "20000", CPU, cwd=tmp_path)
    assert last_20_mean(only_run(tmp_path)) >= 60


@pytest.mark.learning
def test_a2c_gaussian_policy_learns_inverted_pendulum_within_15k_steps(tmp_path):
    """As the PPO check, for A2C's Box-action path (rl-baselines3-zoo's MuJoCo settings: normalisation, one env).
    Measured on 2 CPU cores, one thread, seeds 1-3: the last 20 episodes of 15,000 steps average 418.2 / 558.0 /
    612.4 (all reach 1,000, the maximum, by 30k). The bar, 200, is under half the worst seed and 30 times random.
    About 40 s here."""
    run_algorithm("a2c", "--env-id", "InvertedPendulum-v4", "--seed", "1", "--total-timesteps", "15000", CPU, cwd=tmp_path)
    assert last_20_mean(only_run(tmp_path)) >= 200


@pytest.mark.learning
def test_ddpg_learns_pendulum_within_10k_steps(tmp_path):
    """--algo ddpg (one critic, no target smoothing, actor every step): a uniform random policy scores -1,287 on
    Pendulum-v1 (64 episodes, measured here). The committed benchmark (benchmark/results/ddpg_td3_ddpg_pendulum, same
    flags, seeds 1-3) has the last 20 episodes before step 10,000 at -206 / -229 / -307. The bar, -700, leaves the
    worst seed 390 of margin and is 590 above random. About half a minute here."""
    flags = ["--algo", "ddpg", "--env-id", "Pendulum-v1", "--seed", "1", "--total-timesteps", "10000", CPU]
    run_algorithm("ddpg_td3", *flags, cwd=tmp_path)
    assert last_20_mean(only_run(tmp_path)) >= -700


@pytest.mark.learning
def test_qlearning_learns_mountaincar_on_a_discretised_grid(tmp_path):
    """Q-learning on MountainCar-v0's observations discretised to a 20 x 20 grid, with the file's preset (5M steps):
    a policy that never reaches the flag scores -200 in every episode. The committed benchmark
    (benchmark/results/qlearning_classic, the same flags, seeds 1-3) ends with its last 20 episodes at -149.1 / -141.8
    / -146.2; the bar, -175, leaves the worst seed 26 of margin, and every episode above -200 is one that reached the
    flag. About 50 s here."""
    run_algorithm("qlearning", "--env-id", "MountainCar-v0", "--seed", "1", CPU, cwd=tmp_path)
    assert last_20_mean(only_run(tmp_path)) >= -175


def corridor_run(cwd, name: str, *flags: str):
    """rnd_ppo.py, unchanged, on tests/pixel_corridor.py's corridor of 40 cells with benchmark/studies/corridor.py's
    settings (16 envs x 64 steps, two random rollouts for the observation statistics, on the CPU), 12,288 steps, in
    this process; returns the returns of the episodes that ended in the last quarter of the run."""
    argv = ["--env-id", ENV_ID, "--exp-name", name, "--seed", "1", *corridor.FLAGS, "--total-timesteps", "12288", *flags]
    proc = run_in_process("rnd_ppo", lambda m: (with_pixel_corridor(m), m.main(m.parse_args(argv))), cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = scalars(next((cwd / "runs").glob(f"*__{name}__*")))["charts/episodic_return"]
    return [value for step, value, _ in logged if step > 12288 * 3 // 4]


@pytest.mark.learning
def test_rnd_finds_the_reward_that_the_same_run_without_intrinsic_reward_does_not(tmp_path):
    """A hard-exploration task in small: a corridor of 40 cells drawn as Atari frames, 1 for reaching its far end in
    100 steps, nothing else (tests/pixel_corridor.py). A uniform random walk got there in none of 200,000 episodes
    (measured here; on 30 cells, in 11), so the extrinsic reward alone gives PPO nothing to learn from; RND's novelty
    leads the agent to cells it has not seen, and so to the reward. Measured on 2 CPU cores, one thread, seeds 1-4
    (`python benchmark/studies/corridor.py --compare intrinsic --seeds 1 2 3 4`, these runs): the episodes of the last
    quarter (steps 9,217-12,288) average 0.57 / 0.28 / 0.68 / 0.41 with RND, whose envs stood on all 40 cells in every
    seed, and 0 with --int-coef 0, whose envs saw 14-29 cells. The bars: 0.14 with the intrinsic reward (half the worst
    seed), at most 0.05 without. About 2 minutes here."""
    with_rnd, without = corridor_run(tmp_path, "rnd"), corridor_run(tmp_path, "no_rnd", "--int-coef", "0")
    assert len(with_rnd) >= 20 and len(without) >= 20, (len(with_rnd), len(without))
    assert np.mean(with_rnd) >= 0.14 and np.mean(without) <= 0.05, (np.mean(with_rnd), np.mean(without))


@pytest.mark.learning
def test_ppo_with_memory_solves_velocity_masked_cartpole_and_without_it_does_not(tmp_path):
    """CartPole with its velocities hidden (benchmark/masked_envs.py): a policy must remember earlier positions to
    balance. `--rnn lstm` and its classic recurrent preset (rl-baselines3-zoo's settings), 100k steps: measured on 2
    CPU cores, one thread, seeds 1-3, the last 20 episodes average 467.4 / 500.0 / 500.0. The same flags without
    memory reached 44.4 over 100k steps (seed 1; sb3-contrib's tests note about 50 for a policy without memory), and
    38.5 / 45.9 over the 50k steps run here (seeds 1-2, its best episode 110 / 123). The bars: 300 with the LSTM, at
    most 150 without. About a minute here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmark"), os.environ.get("PYTHONPATH", "")]))
    flags = ["--env-id", "masked_envs:CartPoleNoVel-v1", "--seed", "1", CPU]
    run_algorithm("ppo", *flags, "--total-timesteps", "100000", "--rnn", "lstm", "--exp-name", "lstm", cwd=tmp_path, env=env)
    # the recurrent preset's settings, given as flags, less the memory's own size
    preset = {k.replace("_", "-"): v for k, v in ppo_module.RNN_PRESETS["classic"].items() if k != "rnn_size"}
    same = [f"--{k}" if v is True else f"--no-{k}" if v is False else f"--{k}={v}" for k, v in preset.items()]
    run_algorithm("ppo", *flags, "--total-timesteps", "50000", *same, "--exp-name", "ff", cwd=tmp_path, env=env)
    with_memory, without = (last_20_mean(next((tmp_path / "runs").glob(f"*__{n}__*"))) for n in ("lstm", "ff"))
    assert with_memory >= 300 and without <= 150, (with_memory, without)
