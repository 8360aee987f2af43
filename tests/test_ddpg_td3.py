"""ddpg_td3.py: targets, delayed and Polyak updates, the replay buffer against envpool, end-to-end runs, resume,
learning."""

import dataclasses
import os
import signal

import envpool
import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (
    CPU,
    SMOKE_FLAGS,
    assert_one_error_line,
    flat_params,
    load_algorithm,
    load_file,
    only_run,
    run_algorithm,
    run_in_process,
    scalars,
    seeded_runs,
    stop_run,
    values,
)

td3 = load_algorithm("ddpg_td3")


# ---------------------------------------------------------------------------------------------------------------
# The maths
# ---------------------------------------------------------------------------------------------------------------


def test_twin_critics_in_one_batched_pass_equal_two_separate_mlps():
    critics = td3.Critics(3, 2, 8, 2)
    obs, actions = torch.randn(5, 3), torch.randn(5, 2)
    q = critics(obs, actions)
    assert q.shape == (2, 5)
    for i in range(2):
        x = torch.cat([obs, actions], 1)
        w, b = critics.weights, critics.biases
        h = torch.relu(x @ w[0][i] + b[0][i])
        h = torch.relu(h @ w[1][i] + b[1][i])
        torch.testing.assert_close(q[i], (h @ w[2][i] + b[2][i]).squeeze(-1))
    torch.testing.assert_close(critics(obs, actions, critics.first_critic_frozen())[0], q[0].detach())


def td3_steps(args, seed: int = 0):
    """Networks, optimisers (the learning rate a tensor when compiled, as main has it) and the three steps of
    training_steps, from a seed: two calls with one seed start from the same weights."""
    torch.manual_seed(seed)
    space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    num_critics = 2 if args.twin_critics else 1
    actor, target_actor = td3.Actor(3, space, args.hidden_size), td3.Actor(3, space, args.hidden_size)
    target_actor.load_state_dict(actor.state_dict())
    critic = td3.Critics(3, 2, args.hidden_size, num_critics)
    target_critic = td3.Critics(3, 2, args.hidden_size, num_critics)
    target_critic.load_state_dict(critic.state_dict())
    lr = torch.tensor(1e-3) if args.compile else 1e-3
    q_opt = torch.optim.Adam(critic.parameters(), lr=lr, fused=True)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=lr, fused=True)
    nets = (actor, target_actor, critic, target_critic)
    return nets, td3.training_steps(*nets, q_opt, actor_opt, args)


def random_batch(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    obs, next_obs = torch.randn(n, 3, generator=g), torch.randn(n, 3, generator=g)
    actions = torch.rand(n, 2, generator=g) * torch.tensor([2.0, 2.0]) + torch.tensor([-1.0, 0.0])
    terminations = (torch.rand(n, generator=g) < 0.2).float()
    return td3.Batch(obs, actions, torch.randn(n, generator=g), next_obs, terminations)


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_critic_step_moves_only_the_critics_and_actor_step_the_actor_and_both_targets(algo):
    args = td3.Args(**td3.ALGOS[algo], batch_size=16, hidden_size=8)
    nets, (act, update_critic, update_actor) = td3_steps(args)
    batch = random_batch(16)
    before = [flat_params(n) for n in nets]
    q_stats = update_critic(batch)
    critics = ["qf1_loss", "qf2_loss"] if algo == "td3" else ["qf1_loss"]
    assert list(q_stats) == [*critics, "qf1_values"] and not any(v.requires_grad for v in q_stats.values())
    assert [not torch.equal(b, flat_params(n)) for b, n in zip(before, nets, strict=True)] == [False, False, True, False]
    before = [flat_params(n) for n in nets]
    actor_loss = update_actor(batch.obs)["actor_loss"]
    assert actor_loss.shape == () and not actor_loss.requires_grad
    assert [not torch.equal(b, flat_params(n)) for b, n in zip(before, nets, strict=True)] == [True, True, False, True]
    # the targets move by tau towards the online networks (Polyak), not onto them
    assert not torch.allclose(flat_params(nets[1]), flat_params(nets[0]))


def test_exploration_noise_is_scaled_to_the_half_range_and_clipped_to_the_bounds():
    scale, low, high = torch.tensor([1.0, 0.5]), torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 1.0])
    mu = torch.tensor([[0.0, 0.5], [0.9, 0.9]])
    noise = torch.tensor([[0.3, -0.4], [0.5, 0.5]])
    got = td3.exploration_actions(mu, noise, scale, low, high)
    torch.testing.assert_close(got, torch.tensor([[0.3, 0.5 - 0.2], [1.0, 1.0]]))


def test_compiled_steps_match_the_eager_ones():
    """--compile traces the same three functions: from the same weights, batches and RNG state, three critic and actor
    updates give the same losses, weights and targets, and the acting step the same noisy actions. Inductor draws its
    own random numbers (repeatable from the seed, but not eager's); fallback_random makes it draw eager's here, so
    that the smoothing and exploration noise match too."""
    results = {}
    for compiled in (False, True):
        args = td3.Args(batch_size=32, hidden_size=16, compile=compiled)
        nets, (act, update_critic, update_actor) = td3_steps(args)
        torch.manual_seed(2)
        with torch._inductor.config.patch(fallback_random=True):
            stats = []
            for i in range(3):
                batch = random_batch(32, seed=10 + i)
                stats += [*update_critic(batch).values(), *update_actor(batch.obs).values()]
            with torch.no_grad():
                actions = act(random_batch(5, seed=20)[0])
        results[compiled] = [*stats, *(flat_params(n) for n in nets), actions]
    eager, compiled = results[False], results[True]
    start = [flat_params(n) for n in td3_steps(td3.Args(batch_size=32, hidden_size=16))[0]]
    assert all(not torch.equal(s, e) for s, e in zip(start, eager[-5:-1], strict=True))  # every network has moved
    for e, c in zip(eager, compiled, strict=True):
        assert torch.allclose(e, c, atol=1e-5), (e, c)
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 2.0])
    assert ((low <= compiled[-1]) & (compiled[-1] <= high)).all()


# ---------------------------------------------------------------------------------------------------------------
# The replay buffer
# ---------------------------------------------------------------------------------------------------------------
def test_reset_step_never_enters_the_buffer_and_truncation_keeps_the_final_observation():
    """Hopper-v4 with a 15-step limit and random actions, fed to the buffer as main() does: it falls (termination)
    and runs out of time (truncation); every stored transition is a real one, with envpool's observations."""
    envs = envpool.make("Hopper-v4", env_type="gymnasium", num_envs=3, seed=0, max_episode_steps=15)
    rb = td3.ReplayBuffer(10_000, 11, 3, torch.device("cpu"), 0)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset()
    next_valid, expected, counts = np.ones(3, dtype=bool), [], dict(terminations=0, truncations=0)
    f32 = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    for _ in range(300):
        actions = rng.uniform(-1, 1, (3, 3)).astype(np.float32)
        next_obs, reward, term, trunc, _ = envs.step(actions)
        rb.add(f32(obs), f32(actions), f32(reward), f32(next_obs), f32(term), next_valid)
        for e in np.flatnonzero(next_valid):
            expected.append((obs[e], actions[e], reward[e], next_obs[e], term[e]))
        counts["terminations"] += int((term & ~trunc).sum())
        counts["truncations"] += int((trunc & ~term).sum())
        next_valid, obs = ~(term | trunc), next_obs
    assert counts["terminations"] >= 5 and counts["truncations"] >= 5, counts
    assert rb.size == len(expected) < 900  # the reset steps are missing
    for i, (o, a, r, n, t) in enumerate(expected):
        torch.testing.assert_close(rb.obs[i], f32(o))
        torch.testing.assert_close(rb.actions[i], f32(a))
        torch.testing.assert_close(rb.next_obs[i], f32(n))
        assert rb.rewards[i] == f32(r) and rb.terminations[i] == float(t)
    # truncated transitions keep terminations 0 (they bootstrap from the next observation stored above)
    assert rb.terminations[: rb.size].sum() == counts["terminations"]


def test_buffer_wraps_around_and_samples_only_written_slots():
    rb = td3.ReplayBuffer(5, 1, 1, torch.device("cpu"), 0)
    for k in range(7):
        x = torch.full((1, 1), float(k))
        rb.add(x, x, torch.tensor([float(k)]), x + 1, torch.zeros(1), np.ones(1, dtype=bool))
    assert rb.size == 5 and rb.pos == 2
    assert sorted(rb.rewards.tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]
    obs, actions, rewards, next_obs, terms = rb.sample(64)
    assert set(rewards.tolist()) <= {2.0, 3.0, 4.0, 5.0, 6.0}
    torch.testing.assert_close(next_obs, obs + 1)


# ---------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------
TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "losses/qf1_loss",
    "losses/qf2_loss",
    "losses/actor_loss",
    "losses/qf1_values",
    "eval/episodic_return",
}
# one thread: 1,000s of small gradient steps with torch's threads spinning on 2 shared cores run 100x slower
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = SMOKE_FLAGS["ddpg_td3"]


@pytest.mark.parametrize(
    "env_id, flags",
    [
        ("Pendulum-v1", ["--total-timesteps", "800", "--capture-video", "--eval-every", "400", "--eval-episodes", "2"]),
        ("Hopper-v4", ["--total-timesteps", "600", "--num-envs", "2", "--eval-episodes", "2"]),
        # DDPG, on a gymnasium id (envpool is not used for 'module:Env' ids)
        ("gymnasium.envs.classic_control:Pendulum-v1", ["--total-timesteps", "600", "--algo", "ddpg", "--eval-episodes", "2"]),
    ],
)
def test_smoke_trains_saves_reloads_and_evaluates(env_id, flags, tmp_path):
    proc = run_algorithm("ddpg_td3", "--env-id", env_id, "--save-model", *TINY, *flags, cwd=tmp_path, env=ONE_THREAD)
    run = only_run(tmp_path)
    algo = "ddpg" if "ddpg" in flags else "td3"
    assert f"model: {run.relative_to(tmp_path) / 'ddpg_td3.model'}" in proc.stdout
    assert "tensorboard logs:" in proc.stdout.splitlines()[-1]
    expected = TAGS - {"losses/qf2_loss"} if algo == "ddpg" else TAGS
    assert expected <= set(scalars(run))
    assert ("losses/qf2_loss" in scalars(run)) == (algo == "td3")
    model = load_file(run / "ddpg_td3.model")
    assert model["args"]["env_id"] == env_id and model["args"]["algo"] == algo
    if "--eval-every" in flags:  # two periodic evaluations (their means), then the final one's two episodes
        assert [step for step, _, _ in scalars(run)["eval/episodic_return"]] == [400, 800, 800, 800]
        assert {p.name for p in (run / "videos").iterdir()} == {"eval_400.mp4", "eval_800.mp4", "final.mp4"}


def test_algo_and_family_presets_set_real_flags_and_a_given_flag_wins():
    for preset in [*td3.ALGOS.values(), *td3.PRESETS.values()]:
        assert set(preset) <= {f.name for f in dataclasses.fields(td3.Args)}
    a = td3.parse_args(["--env-id", "Hopper-v4"])
    assert (a.algo, a.twin_critics, a.policy_frequency, a.target_policy_smoothing) == ("td3", True, 2, True)
    assert (a.total_timesteps, a.learning_starts, a.buffer_size) == (1_000_000, 25_000, 1_000_000)
    d = td3.parse_args(["--env-id", "Hopper-v4", "--algo", "ddpg"])
    assert (d.exp_name, d.twin_critics, d.policy_frequency, d.target_policy_smoothing) == ("ddpg", False, 2, False)
    assert td3.parse_args(["--algo", "ddpg", "--policy-frequency", "1"]).policy_frequency == 1
    assert td3.parse_args(["--env-id", "Pendulum-v1"]).total_timesteps == td3.PRESETS["classic"]["total_timesteps"]
    assert td3.parse_args(["--env-id", "Pendulum-v1", "--preset", "mujoco"]).learning_starts == 25_000


# The Args of CleanRL's ddpg_continuous_action.py and td3_continuous_action.py (github.com/vwxyzjn/cleanrl, cleanrl/,
# read at commit 004f8a0), and their 256-256 networks; their published MuJoCo results are benchmark/ddpg_td3.sh's
# references. CleanRL's DDPG delays its actor too (policy_frequency 2), and has no target smoothing noise.
CLEANRL_DDPG = dict(
    total_timesteps=1_000_000,
    learning_rate=3e-4,
    num_envs=1,
    buffer_size=1_000_000,
    gamma=0.99,
    tau=0.005,
    batch_size=256,
    exploration_noise=0.1,
    learning_starts=25_000,
    policy_frequency=2,
    hidden_size=256,
    twin_critics=False,
    target_policy_smoothing=False,
)
CLEANRL_TD3 = {**CLEANRL_DDPG, "twin_critics": True, "target_policy_smoothing": True, "policy_noise": 0.2, "noise_clip": 0.5}


@pytest.mark.parametrize("algo, cleanrl", [("ddpg", CLEANRL_DDPG), ("td3", CLEANRL_TD3)])
def test_mujoco_preset_holds_cleanrls_settings(algo, cleanrl):
    args = td3.parse_args(["--env-id", "Hopper-v4", "--algo", algo])
    assert {k: getattr(args, k) for k in cleanrl} == cleanrl


def test_compiled_run_logs_repeats_with_its_seed_and_delays_the_actor(tmp_path):
    """--compile on the CPU, end to end: the run finishes and logs; the same seed gives the same run (inductor draws
    its random numbers from seeds it takes from torch's generator); and the actor's Adam took one step per
    policy_frequency critic steps (main's delay, read from the checkpoint)."""
    tags = ("charts/SPS", "charts/episodic_return", "losses/qf1_loss", "losses/actor_loss")
    flags = ["--env-id", "Pendulum-v1", "--total-timesteps", "500", "--compile", "--checkpoint-every", "500", *TINY]

    def read(run):
        ckpt = load_file(run / "checkpoint.pt")
        adam_steps = [int(ckpt[k]["state"][0]["step"]) for k in ("q_optimizer", "actor_optimizer")]
        return [values(run, t) for t in tags[1:]], adam_steps, ckpt["critic_updates"], "charts/SPS" in scalars(run)

    runs = seeded_runs("ddpg_td3", (7, 7), tmp_path, *flags, read=read, env=ONE_THREAD)
    assert runs[0][0] == runs[1][0] and all(runs[0][0])
    assert runs[0][1] == [200, 100] and runs[0][2] == 200  # 500 steps, 300 random: 200 critic and 100 actor steps
    assert runs[0][3]


BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


@pytest.mark.parametrize(
    "obs_space, action_space, message",
    [
        (BOX, gym.spaces.Discrete(2), r"needs bounded 1-D Box actions .*; .* has Discrete\(2\): use dqn.py"),
        (BOX, gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32), r"needs bounded 1-D Box actions .*; .* has Box.*: wrap the env"),
        (BOX, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), r"needs bounded 1-D Box actions .*; .*inf.*: wrap the env"),
        (gym.spaces.Box(0, 255, (3, 84, 84), np.uint8), BOX, r"needs a vector observation"),
        (gym.spaces.Dict(a=BOX), BOX, r"needs a vector observation"),
    ],
)
def test_spaces_it_cannot_handle_get_one_clear_line(obs_space, action_space, message, tmp_path):
    proc = run_in_process("ddpg_td3", lambda m: m.check_args(m.Args(env_id="Some-v0"), obs_space, action_space), tmp_path)
    assert_one_error_line("ddpg_td3", proc, message)


@pytest.mark.parametrize("sig, save_buffer", [(signal.SIGTERM, True), (signal.SIGKILL, False)])
def test_stopped_run_resumes_with_no_gap_and_no_repeated_step(sig, save_buffer, tmp_path):
    """SIGTERM writes a checkpoint at once (here with the replay buffer); SIGKILL falls back to the last periodic
    one and the resumed run purges the events logged after it, then refills the buffer it did not save."""
    total, log_every = 2000, 200
    flags = ["--env-id", "Pendulum-v1", "--total-timesteps", str(total), "--progress-interval", "0"]
    flags += ["--checkpoint-every", "600", *TINY] + (["--save-buffer"] if save_buffer else [])
    stop_run("ddpg_td3", *flags, cwd=tmp_path, at=800, sig=sig, env=ONE_THREAD)  # between two periodic checkpoints
    run = only_run(tmp_path)
    ckpt = load_file(run / "checkpoint.pt")
    assert 600 <= ckpt["global_step"] < total
    assert (ckpt["replay_buffer"] is not None) == save_buffer
    if save_buffer:
        # every step but the reset steps (one per 200-step Pendulum episode)
        assert ckpt["global_step"] - ckpt["global_step"] // 200 <= ckpt["replay_buffer"]["size"] < ckpt["global_step"]
    resumed = run_algorithm(
        "ddpg_td3", "--env-id", "Pendulum-v1", "--resume", str(run / "checkpoint.pt"), cwd=tmp_path, env=ONE_THREAD
    )
    assert f"resumed {run.relative_to(tmp_path)} at step {ckpt['global_step']:,}" in resumed.stdout
    assert ("refilling" in resumed.stdout) != save_buffer
    assert only_run(tmp_path) == run  # the same tensorboard run goes on
    assert [s for s, _, _ in scalars(run)["charts/SPS"]] == list(range(log_every, total + 1, log_every))
    loss_steps = [s for s, _, _ in scalars(run)["losses/qf1_loss"]]
    assert loss_steps == sorted(set(loss_steps)) and loss_steps[-1] == total
    if not save_buffer:  # no gradient step while the buffer refills for --learning-starts steps
        assert not [s for s in loss_steps if ckpt["global_step"] < s <= ckpt["global_step"] + 300]


# ---------------------------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.learning
def test_td3_pendulum_reaches_minus_250_within_10k_steps(tmp_path):
    """TD3 with the classic preset (1k random steps, lr 1e-3, 64-64 MLPs) on Pendulum-v1, 10k steps. Measured on 2
    loaded CPU cores: the mean return of the last 10 episodes first reaches -250 at 7,436, 8,039, 7,235, 8,240 and
    8,642 steps for seeds 1-5 (at 10k it stands at -128, -162, -228, -166, -245), so seed 1 has 2,564 steps of
    slack and the worst seed 1,358. The check is "reaches", not "holds": seed 3 dips to -439 at 12k. About 25 s of
    CPU (60 s of wall time on a loaded machine). On the CPU, where the margin was measured."""
    flags = ["--env-id", "Pendulum-v1", "--seed", "1", "--total-timesteps", "10000", CPU]
    run_algorithm("ddpg_td3", *flags, cwd=tmp_path, env=ONE_THREAD)
    returns = values(only_run(tmp_path), "charts/episodic_return")
    rolling = [np.mean(returns[i - 10 : i]) for i in range(10, len(returns) + 1)]
    assert len(returns) >= 40 and max(rolling) >= -250, rolling[-5:]
