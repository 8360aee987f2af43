"""dqn.py: TD targets, the frame-sharing replay buffer against envpool, end-to-end runs, resume, learning."""

import dataclasses
import functools
import signal

import envpool
import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (
    CPU,
    SMOKE_FLAGS,
    load_algorithm,
    load_file,
    only_run,
    run_algorithm,
    scalars,
    stop_run,
    twenty_episode_means,
)

dqn = load_algorithm("dqn")


# ---------------------------------------------------------------------------------------------------------------
# The maths
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obs_shape", [(4,), (4, 84, 84)])
def test_qnetwork_keeps_pytorch_default_init_as_cleanrl(obs_shape):
    """CleanRL's dqn.py and dqn_atari.py build their layers plainly: with the same torch seed, QNetwork's weights
    are those of the same layers made with nn.Linear / nn.Conv2d (no orthogonal init)."""
    image = len(obs_shape) == 3
    obs_space = gym.spaces.Box(0, 255 if image else 1, obs_shape, np.uint8 if image else np.float32)
    torch.manual_seed(3)
    q_network = dqn.QNetwork(obs_space, gym.spaces.Discrete(6))
    torch.manual_seed(3)
    if image:
        convs = [torch.nn.Conv2d(4, 32, 8, stride=4), torch.nn.Conv2d(32, 64, 4, stride=2), torch.nn.Conv2d(64, 64, 3)]
        plain = [*convs, torch.nn.Linear(3136, 512), torch.nn.Linear(512, 6)]
    else:
        plain = [torch.nn.Linear(4, 120), torch.nn.Linear(120, 84), torch.nn.Linear(84, 6)]
    expected = [p for layer in plain for p in layer.parameters()]
    assert [p.shape for p in q_network.parameters()] == [p.shape for p in expected]
    for got, want in zip(q_network.parameters(), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_exploration_and_the_replay_buffer_draw_from_independent_streams():
    """As main makes them: the epsilon-greedy generator and the buffer's, from the two seeds spawned from one."""

    def streams(seed):
        explore_seed, replay_seed = np.random.SeedSequence(seed).spawn(2)
        rb = dqn.ReplayBuffer(8, 1, gym.spaces.Box(-1.0, 1.0, (4,), np.float32), False, replay_seed)
        return np.random.default_rng(explore_seed), rb.rng

    explore_rng, buffer_rng = streams(1)
    draws = explore_rng.random(1000), buffer_rng.random(1000)
    assert abs(np.corrcoef(*draws)[0, 1]) < 0.1  # two generators seeded alike would draw the very same numbers
    assert not np.array_equal(draws[1], np.random.default_rng(1).random(1000))
    again = streams(1)
    assert [rng.random() for rng in again] == [rng.random() for rng in streams(1)]
    assert again[0].random() != streams(2)[0].random()


# ---------------------------------------------------------------------------------------------------------------
# The replay buffer
# ---------------------------------------------------------------------------------------------------------------
def fill_buffer(envs, is_atari, capacity, steps, check_every, seed=0):
    """Play random actions, feed the buffer as dqn.main does, keep a copy of everything the envs returned, and at
    every check_every-th step compare every sampleable transition of the buffer with it. Returns the counts seen.
    A copy, since dqn.make_env's gymnasium envs return the same observation array at every step."""
    obs, _ = envs.reset()
    num_envs = obs.shape[0]
    stack = obs.shape[1] if is_atari else 1
    rb = dqn.ReplayBuffer(capacity, num_envs, envs.single_observation_space, is_atari, seed)
    rb.add_obs(obs, True)
    rng = np.random.default_rng(seed)
    obs_hist, action_hist, reward_hist, term_hist = [obs.copy()], [], [None], [None]
    done_hist = [np.zeros(num_envs, dtype=bool)]  # done returned with obs k: transition k is the reset step
    trunc_hist = [np.zeros(num_envs, dtype=bool)]
    next_valid, next_first = np.ones(num_envs, dtype=bool), np.zeros(num_envs, dtype=bool)
    counts = dict(life_losses=0, game_overs=0, truncations=0, checked=0)
    for t in range(1, steps + 1):
        actions = rng.integers(0, envs.single_action_space.n, num_envs)
        obs, reward, term, trunc, info = envs.step(actions)
        rb.add(actions, reward, term, next_valid, obs, next_first)
        game_over = (info["terminated"].astype(bool) | trunc) if is_atari else (term | trunc)
        next_valid, next_first = ~(term | trunc), game_over
        counts["life_losses"] += int((term & ~game_over).sum())
        counts["game_overs"] += int((term & game_over).sum())
        counts["truncations"] += int(trunc.sum())
        obs_hist.append(obs.copy())
        action_hist.append(actions)
        reward_hist.append(reward)
        term_hist.append(term)
        done_hist.append(term | trunc)
        trunc_hist.append(trunc)
        if t % check_every:
            continue
        # slot s holds the observation of step k = t - ((t - s) mod capacity)
        slots, env_ids = (a.ravel() for a in np.meshgrid(np.arange(capacity), np.arange(num_envs), indexing="ij"))
        steps_of = t - (t - slots) % capacity
        ok = rb.sampleable(slots, env_ids) & (steps_of >= 0)
        got_obs, got_next = rb.stacks(slots[ok], env_ids[ok])
        expected = set()
        for k in range(max(0, t - capacity + stack), t):  # transitions whose stacks are still in the buffer
            expected |= {(k, e) for e in range(num_envs) if not done_hist[k][e]}
        assert {(int(k), int(e)) for k, e in zip(steps_of[ok], env_ids[ok], strict=True)} == expected
        for i, (s, e, k) in enumerate(zip(slots[ok], env_ids[ok], steps_of[ok], strict=True)):
            assert not done_hist[k][e]  # the reset step after a final observation is never a transition
            np.testing.assert_array_equal(got_obs[i], obs_hist[k][e])
            np.testing.assert_array_equal(got_next[i], obs_hist[k + 1][e])
            assert rb.actions[s, e] == action_hist[k][e]
            assert rb.rewards[s, e] == reward_hist[k + 1][e]
            assert rb.terminations[s, e] == term_hist[k + 1][e]
            if trunc_hist[k + 1][e] and not term_hist[k + 1][e]:  # truncation alone: not terminal, next observation
                # the real final one (gymnasium can report both at the time limit: then termination wins)
                assert rb.terminations[s, e] == 0
            counts["checked"] += 1
        # sample() draws only from the sampleable transitions
        batch = rb.sample(64, torch.device("cpu"))
        pairs = {(o.tobytes(), n.tobytes()) for o, n in zip(got_obs, got_next, strict=True)}
        sampled = zip(batch["obs"], batch["next_obs"], strict=True)
        assert all((o.numpy().tobytes(), n.numpy().tobytes()) in pairs for o, n in sampled)
    envs.close()
    return counts


def test_frame_sharing_buffer_rebuilds_the_stacks_envpool_returned():
    """Breakout with episodic life: sampled stacks equal envpool's across lost lives (the stack carries on),
    game overs and truncations (the new stack is four copies of the first frame), and a buffer that wraps
    around 20 times."""
    kwargs = dict(num_envs=2, seed=0, episodic_life=True, reward_clip=True, max_episode_steps=170)
    counts = fill_buffer(envpool.make("Breakout-v5", env_type="gymnasium", **kwargs), True, 64, 1300, 13)
    assert counts["life_losses"] >= 10 and counts["game_overs"] >= 2 and counts["truncations"] >= 2, counts
    assert counts["checked"] > 5000


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_reset_step_never_enters_the_buffer_and_truncation_keeps_the_final_observation(backend, monkeypatch):
    """CartPole with an 18-step limit: random play ends episodes by termination and by truncation. Both backends
    of dqn.make_env, as dqn.main makes them (the gymnasium one reuses its observation array)."""
    monkeypatch.setattr(dqn.envpool, "make", functools.partial(envpool.make, max_episode_steps=18))
    monkeypatch.setattr(dqn.gym, "make_vec", functools.partial(gym.make_vec, max_episode_steps=18))
    envs, is_atari = dqn.make_env("CartPole-v1", 3, 0, False, False, backend)
    assert isinstance(envs, gym.vector.SyncVectorEnv) == (backend == "gymnasium")
    counts = fill_buffer(envs, is_atari, 50, 400, 7)
    assert counts["game_overs"] >= 5 and counts["truncations"] >= 5, counts


def test_auto_backend_is_gymnasium_for_classic_control_envs_cheap_enough_in_python_and_envpool_otherwise():
    """Up to GYMNASIUM_UP_TO's count of each classic-control id: 8 CartPoles, 2 Acrobots; other ids envpool has, envpool."""
    pick = dqn.pick_backend
    assert pick("CartPole-v1", 1, "auto") == pick("MountainCar-v0", 1, "auto") == pick("Acrobot-v1", 2, "auto") == "gymnasium"
    assert pick("CartPole-v1", 8, "auto") == pick("Pendulum-v1", 6, "auto") == "gymnasium"
    assert pick("CartPole-v1", 16, "auto") == pick("Acrobot-v1", 4, "auto") == pick("MountainCar-v0", 16, "auto") == "envpool"
    assert (
        pick("Breakout-v5", 1, "auto") == pick("LunarLander-v2", 1, "auto") == pick("HalfCheetah-v4", 1, "auto") == "envpool"
    )
    assert pick("corridor_env:Corridor-v0", 4, "auto") == "gymnasium"  # envpool lacks it
    assert pick("CartPole-v1", 1, "envpool") == "envpool" and pick("CartPole-v1", 8, "gymnasium") == "gymnasium"
    assert pick("CartPole-v1", 1, "auto", render=True) == "envpool"  # gymnasium would need pygame to render it


def test_atari_buffer_of_a_million_transitions_stays_under_7_1_gb():
    # np.zeros maps the memory lazily: nothing is touched here (benchmark/dqn.sh measures the filled buffer). The
    # arrays the buffer holds are counted: every frame once, and the five small fields per slot
    rb = dqn.ReplayBuffer(1_000_000, 1, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), True, 0)
    arrays = [a for a in vars(rb).values() if isinstance(a, np.ndarray)]
    assert sum(a.nbytes for a in arrays) == 1_000_000 * (84 * 84 + 8 + 4 + 4 + 1 + 1) < 7.1e9


@pytest.mark.parametrize("flags", [dict(), dict(double_q=True, loss="huber", max_grad_norm=0.5)])
def test_compiled_update_and_acting_step_equal_the_eager_ones(flags):
    """--compile traces the same two functions: from the same weights and batches, the compiled TD updates give the
    same [loss, mean Q] and the same weights as the eager ones, and the compiled acting step the same actions."""
    obs_space, action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(3)
    torch.manual_seed(0)
    online, target = dqn.QNetwork(obs_space, action_space), dqn.QNetwork(obs_space, action_space)
    target.load_state_dict({k: v + 0.1 for k, v in online.state_dict().items()})  # a target that is not the online net
    runs = {}
    for compiled in (False, True):
        q_network, target_network = dqn.QNetwork(obs_space, action_space), dqn.QNetwork(obs_space, action_space)
        q_network.load_state_dict(online.state_dict())
        target_network.load_state_dict(target.state_dict())
        # as main builds it: fused Adam eagerly, the foreach one (which inductor fuses) compiled
        optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-2, fused=not compiled)
        args = dqn.Args(compile=compiled, **flags)
        act, update = dqn.training_steps(q_network, target_network, optimizer, args)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            greedy = act(10 * torch.randn(256, 4, generator=gen))  # wide enough that every action wins somewhere
        logged = []
        for _ in range(3):  # Adam's state after the first step matters too
            obs, next_obs = torch.randn(64, 4, generator=gen), torch.randn(64, 4, generator=gen)
            actions = torch.randint(0, 3, (64,), generator=gen)
            rewards, terms = torch.randn(64, generator=gen), (torch.rand(64, generator=gen) < 0.2).float()
            out = update(dict(obs=obs, actions=actions, rewards=rewards, next_obs=next_obs, terminations=terms))
            logged.append(torch.stack([out["td_loss"], out["q_values"]]))
        runs[compiled] = torch.stack(logged), [p.detach().clone() for p in q_network.parameters()], greedy
    (eager_logged, eager_params, eager_greedy), (logged, params, greedy) = runs[False], runs[True]
    assert torch.allclose(logged, eager_logged, atol=1e-5), (logged, eager_logged)
    assert not torch.allclose(params[0], online.network[0].weight, atol=1e-3)  # the updates did move the weights
    assert all(torch.allclose(p, e, atol=1e-5) for p, e in zip(params, eager_params, strict=True))
    assert torch.equal(greedy, eager_greedy) and len(set(greedy.tolist())) > 1


# ---------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------
TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "losses/td_loss",
    "losses/q_values",
    "eval/episodic_return",
}
SMALL = SMOKE_FLAGS["dqn"]


@pytest.mark.parametrize(
    "env_id, flags",
    [
        ("CartPole-v1", ["--total-timesteps", "2000", "--capture-video", "--eval-every", "1000", "--eval-episodes", "3"]),
        ("CartPole-v1", ["--total-timesteps", "2000", "--num-envs", "4", "--double-q", "--loss", "huber", "--tau", "0.5"]),
        ("Breakout-v5", "--total-timesteps 300 --num-envs 2 --learning-starts 200 --batch-size 8 --eval-episodes 1".split()),
        ("corridor_env:Corridor-v0", ["--total-timesteps", "2000"]),  # a gymnasium env envpool lacks
    ],
)
def test_smoke_trains_saves_reloads_and_evaluates(env_id, flags, tmp_path, test_env):
    proc = run_algorithm("dqn", "--env-id", env_id, "--save-model", *SMALL, *flags, cwd=tmp_path, env=test_env)
    run = only_run(tmp_path)
    assert f"model: {run.relative_to(tmp_path) / 'dqn.model'}" in proc.stdout
    assert "tensorboard logs:" in proc.stdout.splitlines()[-1]
    # 300 Breakout steps end no game
    expected = TAGS - {"charts/episodic_return", "charts/episodic_length"} if env_id == "Breakout-v5" else TAGS
    assert expected <= set(scalars(run))
    model = load_file(run / "dqn.model")
    assert model["args"]["env_id"] == env_id
    if "--eval-every" in flags:  # two periodic evaluations (their means), then the final one's three episodes
        assert [step for step, _, _ in scalars(run)["eval/episodic_return"]] == [1000, 2000, 2000, 2000, 2000]
        assert {p.name for p in (run / "videos").iterdir()} == {"eval_1000.mp4", "eval_2000.mp4", "final.mp4"}
        assert (run / "videos" / "final.mp4").stat().st_size > 1000


def test_smoke_compiled_on_the_cpu(tmp_path):
    """--compile on the CPU: inductor's C++ code for the acting step and the update trains, logs and finishes."""
    run_algorithm("dqn", "--compile", CPU, "--total-timesteps", "1500", *SMALL, cwd=tmp_path)
    logged = scalars(only_run(tmp_path))
    assert {"charts/SPS", "losses/td_loss", "losses/q_values"} <= set(logged)
    assert [step for step, _, _ in logged["losses/td_loss"]] == [1000, 1500]


def test_presets_set_real_flags_and_a_given_flag_wins():
    """The figures are CleanRL's: dqn_atari.py's buffer of 1M, learning from step 80k, every 4 steps, batches of 32
    at lr 1e-4; dqn.py's buffer of 10k on classic control."""
    for preset in dqn.PRESETS.values():
        assert set(preset) <= {f.name for f in dataclasses.fields(dqn.Args)}
    atari = dqn.parse_args(["--env-id", "Breakout-v5"])
    assert (atari.buffer_size, atari.learning_starts, atari.train_frequency, atari.batch_size) == (1_000_000, 80_000, 4, 32)
    assert dqn.parse_args(["--env-id", "CartPole-v1"]).buffer_size == 10_000
    assert dqn.parse_args(["--env-id", "Breakout-v5", "--batch-size", "64"]).batch_size == 64
    assert dqn.parse_args(["--env-id", "CartPole-v1", "--preset", "atari"]).learning_rate == 1e-4


def test_help_says_a_resume_without_the_buffer_refills_it(capsys):
    with pytest.raises(SystemExit):
        dqn.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "a resumed run refills it for --learning-starts steps before training" in help_text


@pytest.mark.parametrize("sig, save_buffer", [(signal.SIGTERM, False), (signal.SIGKILL, True)])
def test_stopped_run_resumes_with_no_gap_and_no_repeated_step(sig, save_buffer, tmp_path):
    """SIGTERM writes a checkpoint at once (here without the replay buffer: the resumed run says that it refills it, and
    it does); SIGKILL falls back to the last periodic one (here with the buffer) and the resumed run purges the events
    logged after it."""
    total, log_every = 8000, 500
    flags = ["--total-timesteps", str(total), "--progress-interval", "0"]
    flags += ["--checkpoint-every", "2000", *SMALL] + (["--save-buffer"] if save_buffer else [])
    out = stop_run("dqn", *flags, cwd=tmp_path, at=3000, sig=sig)  # between two periodic checkpoints
    if sig != signal.SIGKILL:  # the stop's last line: the command that resumes the run
        assert out.splitlines()[-1].startswith("stopped at step"), out[-1000:]
    run = only_run(tmp_path)
    ckpt = load_file(run / "checkpoint.pt")
    assert 2000 <= ckpt["global_step"] < total
    assert (ckpt["replay_buffer"] is not None) == save_buffer
    if save_buffer:
        assert ckpt["replay_buffer"]["size"] == 1000 and ckpt["replay_buffer"]["valid"].sum() > 900
    resumed = run_algorithm("dqn", "--resume", str(run / "checkpoint.pt"), cwd=tmp_path)
    assert f"resumed {run.relative_to(tmp_path)} at step {ckpt['global_step']:,}" in resumed.stdout
    assert ("refilling" in resumed.stdout) != save_buffer
    assert only_run(tmp_path) == run  # the same tensorboard run goes on
    assert [s for s, _, _ in scalars(run)["charts/epsilon"]] == list(range(log_every, total + 1, log_every))
    loss_steps = [s for s, _, _ in scalars(run)["losses/td_loss"]]
    assert loss_steps == sorted(set(loss_steps)) and loss_steps[-1] == total
    if not save_buffer:  # no gradient step while the buffer refills for --learning-starts steps
        assert not [s for s in loss_steps if ckpt["global_step"] < s <= ckpt["global_step"] + 500]


# ---------------------------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.learning
def test_dqn_cartpole_reaches_200_in_the_first_250k_steps_of_the_classic_run(tmp_path):
    """The classic preset (CleanRL dqn.py, PyTorch's default init: epsilon 1 -> 0.05 over the first 250k steps), one
    env through gymnasium (--env-backend auto), cut at 250k steps: --exploration-fraction 1 keeps epsilon's schedule
    at 250k, so this run is the first 250k steps of the 500k classic run, to the bit. Read from the committed 500k runs
    (benchmark/results/dqn_classic, seeds 1-3, with tblog.read_scalars): the mean over 20 episodes first reaches 200 at
    163,442 / 153,242 / 143,759 steps (random play: about 22), so the worst seed (1, this one) has 87k steps of slack,
    a third of the budget; 475 comes only after epsilon's decay (238,836-298,157), too late to check here. The check is
    "reaches", not "holds": DQN on CartPole dips after it has learned. About 2 minutes here; the limit is 5x that. On
    the CPU, where the margin was measured."""
    flags = ["--seed", "1", "--total-timesteps", "250000", "--exploration-fraction", "1", CPU]
    run_algorithm("dqn", *flags, cwd=tmp_path, timeout=900)
    _, means = twenty_episode_means(only_run(tmp_path))  # every window of 20 consecutive episodes
    assert len(means) and means.max() >= 200, f"best 20-episode mean {means.max() if len(means) else None}"


def test_the_progress_total_is_the_whole_vector_steps_a_run_reaches(tmp_path):
    """With --num-envs 3, the run's last vector step passes --total-timesteps 601 (to 603): the progress line's total is
    the 603 steps the run reaches, and its ETA ends at 0."""
    flags = "--env-id CartPole-v1 --num-envs 3 --total-timesteps 601 --learning-starts 300 --progress-interval 0".split()
    last = [line for line in run_algorithm("dqn", *flags, cwd=tmp_path).stdout.splitlines() if line.startswith("step ")][-1]
    assert last.startswith("step 603/603 (100%)") and last.endswith("| ETA 0m00s"), last
