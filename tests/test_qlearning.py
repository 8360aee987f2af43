"""qlearning.py: the update by hand, the exact optimum on toy text (computed here by value iteration on gymnasium's
transition tables) and the start states it assumes, the discretiser, the episode cap, one logged point per episode,
seeding, save + reload, bad input, stop and resume."""

import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (
    CPU,
    assert_one_error_line,
    load_algorithm,
    load_file,
    only_run,
    run_algorithm,
    scalars,
    values,
)

qlearning = load_algorithm("qlearning")

# envpool keeps the ids that gymnasium 1.4 renamed
GYMNASIUM_ID = {"FrozenLake-v1": "FrozenLake-v1", "Taxi-v3": "Taxi-v4", "CliffWalking-v0": "CliffWalking-v1"}


# ---------------------------------------------------------------------------------------------------------------
# Reference: value iteration and exact policy evaluation on gymnasium's env.unwrapped.P, plain loops
# ---------------------------------------------------------------------------------------------------------------
def expected_step(P, s, a, v):
    """E[r + v(s')] over the outcomes of (s, a), with v(s') = 0 where the outcome ends the episode."""
    return sum(p * (r + (0.0 if terminated else v[s2])) for p, s2, r, terminated in P[s][a])


def optimum_and_greedy_value(gym_id: str, horizon: int, table: np.ndarray | None = None):
    """Expected undiscounted return over `horizon` steps from gymnasium's start distribution: the optimum by
    finite-horizon value iteration, and (given a Q table) that of the table's greedy policy, evaluated exactly."""
    env = gym.make(gym_id).unwrapped
    P, start, states, num_actions = env.P, env.initial_state_distrib, range(env.observation_space.n), env.action_space.n
    v_opt, v_pi = np.zeros(len(states)), np.zeros(len(states))
    policy = table.argmax(1) if table is not None else None
    for _ in range(horizon):
        v_opt = np.array([max(expected_step(P, s, a, v_opt) for a in range(num_actions)) for s in states])
        if policy is not None:
            v_pi = np.array([expected_step(P, s, policy[s], v_pi) for s in states])
    return float(start @ v_opt), float(start @ v_pi)


def train_with_defaults(env_id: str, tmp_path, seed: int = 1):
    """On the CPU (qlearning.py's default too), where the margins below were measured."""
    proc = run_algorithm("qlearning", "--env-id", env_id, "--seed", str(seed), "--save-model", CPU, cwd=tmp_path)
    run = only_run(tmp_path)
    model = load_file(run / "qlearning.model")
    assert model["args"]["env_id"] == env_id
    return proc, run, model["q"].numpy()


# ---------------------------------------------------------------------------------------------------------------
# The update
# ---------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------
# The exact optimum on toy text
# ---------------------------------------------------------------------------------------------------------------
def test_envpool_toy_text_has_the_dynamics_of_gymnasiums_tables():
    """Every transition envpool makes is one gymnasium's P table allows, so the exact figures below hold for the envs
    the script trains on. (envpool's Taxi also starts with the passenger at the destination; gymnasium's does not.)"""
    rng = np.random.default_rng(0)
    for env_id, gym_id in GYMNASIUM_ID.items():
        P = gym.make(gym_id).unwrapped.P
        envs = qlearning.make_env(env_id, 16, seed=0)
        obs, _ = envs.reset()
        valid, slips = np.ones(16, dtype=bool), 0
        for _ in range(300):
            actions = rng.integers(0, len(P[0]), 16)
            next_obs, reward, term, trunc, _ = envs.step(actions)
            for i in np.flatnonzero(valid & ~trunc):
                outcomes = [(s2, r, d) for _, s2, r, d in P[int(obs[i])][int(actions[i])]]
                assert (int(next_obs[i]), float(reward[i]), bool(term[i])) in outcomes, (env_id, obs[i], actions[i])
                slips += len(outcomes) > 1
            valid, obs = ~(term | trunc), next_obs
        assert (slips > 0) == (env_id == "FrozenLake-v1")  # slippery as gymnasium's, the others deterministic
        envs.close()


def test_exact_returns_start_states_are_envpools_as_transition_tables_says():
    """transition_tables takes gymnasium's start distribution. envpool's FrozenLakes and CliffWalking start in its single
    start state; envpool's Taxi-v3 starts uniformly over gymnasium's 300 start states and the 100 where the passenger
    waits at the destination, so its optimum over envpool's starts is 9.555, not 7.93. 8,000 seeded resets: each of
    the 400 Taxi states is expected 20 times (one missing by chance: 400 * e^-20)."""
    taxi = gym.make("Taxi-v4").unwrapped
    at_destination = [s for s in range(500) if taxi.decode(s)[2] == taxi.decode(s)[3]]
    for env_id in ("FrozenLake-v1", "FrozenLake8x8-v1", "CliffWalking-v0", "Taxi-v3"):
        tables = qlearning.transition_tables(env_id)
        start = tables[3]
        envs = qlearning.make_env(env_id, 8000, seed=0)
        counts = np.bincount(envs.reset()[0], minlength=len(start))
        envs.close()
        if env_id != "Taxi-v3":
            assert start.max() == 1.0 and counts.tolist() == (8000 * start).astype(int).tolist(), env_id
            continue
        assert len(at_destination) == 100 and (start[at_destination] == 0).all()
        support = np.flatnonzero(counts)
        assert support.tolist() == sorted(np.flatnonzero(start).tolist() + at_destination)
        chi2 = ((counts[support] - 20.0) ** 2 / 20.0).sum()
        assert chi2 < 399 + 5 * np.sqrt(2 * 399)  # uniform over the 400: 399 degrees of freedom, 5 standard deviations
        envpool_start = counts / counts.sum()
        assert qlearning.exact_return(tables, None, 200) == pytest.approx(7.93)
        assert qlearning.exact_return(tables[:3] + (envpool_start,), None, 200) == pytest.approx(9.555, abs=0.05)


def test_frozenlake_greedy_policy_within_002_of_the_exact_optimum(tmp_path):
    """Slippery 4x4, 100-step limit: the optimum success probability is 0.744 (a time-dependent policy); the best
    greedy policy of a discounted table, 0.7402. Seeds 1-5 all end at 0.7402 with the defaults (300k steps), and
    stay within 0.02 from 40k-220k steps on."""
    proc, run, table = train_with_defaults("FrozenLake-v1", tmp_path)
    optimum, greedy = optimum_and_greedy_value("FrozenLake-v1", 100, table)
    assert optimum == pytest.approx(0.744, abs=5e-4)
    assert greedy >= optimum - 0.02
    # shown: the text grid, the exact curve and the reloaded table's evaluation
    assert "greedy policy:\n" in proc.stdout and re.search(r"\n[←↓→↑] H [←↓→↑] H\n", proc.stdout)
    assert values(run, "eval/exact_return")[-1] == pytest.approx(greedy)
    assert len(values(run, "eval/episodic_return")) == 1000
    assert abs(np.mean(values(run, "eval/episodic_return")) - greedy) < 0.05  # 1000 episodes: 3.6 standard errors


def test_cliffwalking_greedy_return_is_the_optimum_minus_13(tmp_path):
    """No time limit in the env: the preset caps episodes at 100 steps (truncated, bootstrapped). Seeds 1-3 reach
    -13 by 10k-20k steps of the default 100k."""
    _, _, table = train_with_defaults("CliffWalking-v0", tmp_path)
    optimum, greedy = optimum_and_greedy_value("CliffWalking-v1", 100, table)
    assert optimum == -13.0 and greedy == -13.0


def test_taxi_greedy_mean_return_over_start_states_within_01_of_the_optimum(tmp_path):
    """Over gymnasium's 300 start states, 200-step limit. Seeds 1-3 end at exactly 7.93 with the defaults (300k
    steps) and are within 0.1 from 80k-100k steps on."""
    _, _, table = train_with_defaults("Taxi-v3", tmp_path)
    optimum, greedy = optimum_and_greedy_value("Taxi-v4", 200, table)
    assert optimum == pytest.approx(7.93, abs=1e-9)
    assert greedy >= optimum - 0.1


# ---------------------------------------------------------------------------------------------------------------
# Discretiser, episode cap
# ---------------------------------------------------------------------------------------------------------------
def test_discretiser_maps_bounds_edges_and_out_of_range_values_to_the_right_cells():
    space = gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 10.0]), dtype=np.float64)
    grid = qlearning.make_grid(space, 4, None, None)  # edges at -0.5, 0, 0.5 and 2.5, 5, 7.5
    obs = torch.tensor(
        [
            [-1.0, 0.0],  # the lower bounds: first cell
            [1.0, 10.0],  # the upper bounds: last cell
            [-7.0, 99.0],  # out of range: the edge cells
            [-0.5, 2.5],  # on an inner edge: the cell above
            [0.49, 7.49],
            [0.0, 5.0],
        ],
        dtype=torch.float64,
    )
    cells = [(0, 0), (3, 3), (0, 3), (1, 1), (2, 2), (2, 2)]
    assert qlearning.discretise(obs, grid).tolist() == [4 * i + j for i, j in cells]
    assert grid.num_states == 16
    assert qlearning.discretise(torch.tensor([3, 0, 15], dtype=torch.int32), qlearning.Grid()).tolist() == [3, 0, 15]
    # bounds given as flags replace the space's
    given = qlearning.make_grid(space, 2, (0.0, 0.0), (2.0, 1.0))
    assert qlearning.discretise(torch.tensor([[0.99, 0.5]], dtype=torch.float64), given).tolist() == [1]


def test_episode_cap_truncates_then_resets_on_the_next_step():
    """envpool's CliffWalking ignores max_episode_steps, so a capped one is gymnasium's: truncated at 5 steps, with
    next-step autoreset as envpool's."""
    envs = qlearning.make_env("CliffWalking-v0", 2, seed=0, max_episode_steps=5)
    obs, _ = envs.reset()
    assert obs.tolist() == [36, 36]
    up_then_right = [np.array([0, 1])] * 7  # env 0 walks into the top wall, env 1 into the cliff (back to the start)
    seen = [envs.step(a) for a in up_then_right]
    assert [s[3].tolist() for s in seen] == [[False, False]] * 4 + [[True, True]] + [[False, False]] * 2
    assert seen[5][0].tolist() == [36, 36] and seen[5][1].tolist() == [0.0, 0.0]  # the reset step
    assert seen[4][0].tolist() == [0, 36] and seen[6][0].tolist() == [24, 36]  # real last observation, then going on


# ---------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env_id, flags, states",
    [
        ("MountainCar-v0", ["--total-timesteps", "20000", "--eval-every", "10000", "--eval-episodes", "5"], 400),
        ("corridor_env:Corridor-v0", ["--total-timesteps", "5000", "--bins", "2", "--num-envs", "4"], 32),
    ],
)
def test_box_observations_train_save_reload_and_evaluate(env_id, flags, states, tmp_path, test_env):
    proc = run_algorithm("qlearning", "--env-id", env_id, "--save-model", *flags, cwd=tmp_path, env=test_env)
    run = only_run(tmp_path)
    assert f"model: {run.relative_to(tmp_path) / 'qlearning.model'}" in proc.stdout
    assert "tensorboard logs:" in proc.stdout.splitlines()[-1]
    tags = {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate", "charts/epsilon"}
    assert tags | {"losses/td_error", "eval/episodic_return"} <= set(scalars(run))
    model = load_file(run / "qlearning.model")
    assert model["q"].shape[0] == states and model["q"].abs().sum() > 0
    assert model["grid"]["bins"] == (int(flags[flags.index("--bins") + 1]) if "--bins" in flags else 20)
    if "--eval-every" in flags:  # one periodic evaluation (its mean), then the final one's five episodes
        assert [s for s, _, _ in scalars(run)["eval/episodic_return"]] == [10048] + [19968] * 5


def test_episodic_return_is_one_point_per_finished_episode(tmp_path):
    """FrozenLake's return is 0 or 1 per episode; a mean over a logging window would be a fraction, one per window."""
    total, log_every = 6400, 3200  # 100 vector steps of 64 envs, two logging windows
    run_algorithm("qlearning", "--total-timesteps", str(total), "--log-every", str(log_every), cwd=tmp_path)
    run = only_run(tmp_path)
    returns, lengths = scalars(run)["charts/episodic_return"], scalars(run)["charts/episodic_length"]
    assert [s for s, _, _ in returns] == [s for s, _, _ in lengths]
    assert len(returns) > 100 and {v for _, v, _ in returns} <= {0.0, 1.0}
    assert all(s % 64 == 0 and 0 < s <= total for s, _, _ in returns)
    assert all(v == int(v) and 1 <= v <= 100 for _, v, _ in lengths)  # whole episodes under the 100-step limit
    # each env's 100 steps: its finished episodes, a reset step after each, and the unfinished one (< 100 steps)
    assert total - 64 * 100 < sum(v for _, v, _ in lengths) + len(lengths) <= total + 64


def test_resume_report_names_only_the_given_flags_that_differ(tmp_path):
    """The computed num_iterations differs between a parsed command line (0) and a checkpoint's args: never named,
    neither as a change a resumed run takes nor as one it refuses."""
    run_algorithm("qlearning", "--total-timesteps", "6400", "--checkpoint-every", "6400", cwd=tmp_path)
    checkpoint = str(only_run(tmp_path) / "checkpoint.pt")
    longer = ["--total-timesteps", "12800", "--log-every", "1280", "--seed", "1"]  # the finished run extended
    resumed = run_algorithm("qlearning", "--resume", checkpoint, *longer, cwd=tmp_path)
    assert "resuming with --log-every 1280 (the checkpoint has 10000)" in resumed.stdout
    assert "num-iterations" not in resumed.stdout and "--seed" not in resumed.stdout
    tyro_error = run_algorithm("qlearning", "--num-iterations", "5", cwd=tmp_path, check=False)
    assert_one_error_line("qlearning", tyro_error, r"Unrecognized options: --num-iterations")  # not a flag
