"""rnd_ppo.py: the intrinsic reward's filter and statistics against hand computations, the two advantage streams
across episode ends, novelty that fades with training, the room counter, runs end to end (save + reload, seeds,
bad input, stop and resume)."""

import numpy as np
import pytest
import torch
from pixel_corridor import LENGTH, PixelCorridor

from conftest import (
    SMOKE_FLAGS,
    flat_params,
    load_algorithm,
    load_file,
    only_run,
    run_algorithm,
    scalars,
)

rnd_ppo = load_algorithm("rnd_ppo")

# a tiny configuration: 4 envs x 32 steps, 2 minibatches, one rollout of random steps for the observation statistics,
# episodes capped at 40 steps (so truncations and their reset steps happen)
TINY = SMOKE_FLAGS["rnd_ppo"]
TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/intrinsic_reward",
    "charts/episode_rooms",
    "charts/rooms_visited_total",
    "charts/obs_norm_init_seconds",
    "losses/policy_loss",
    "losses/ext_value_loss",
    "losses/int_value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/rnd_loss",
    "losses/explained_variance",
    "losses/int_explained_variance",
    "eval/episodic_return",
}


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def atari_frames(env_id: str, n: int, seed: int = 0) -> torch.Tensor:
    """n last frames (uint8, (n, 1, 84, 84)) of one env of env_id under uniformly random actions, the paper's settings."""
    envs = rnd_ppo.make_env(env_id, 1, seed, 4500, 0.25)
    obs, _ = envs.reset()
    out, rng = [], np.random.default_rng(seed)
    for _ in range(n):
        obs = envs.step(rng.integers(0, envs.action_space.n, 1))[0]
        out.append(obs[0, -1:])
    envs.close()
    return torch.as_tensor(np.stack(out))


# ---------------------------------------------------------------------------------------------------------------
# The intrinsic reward: statistics, observation clipping, the forward filter
# ---------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------
# The two advantage streams across episode ends
# ---------------------------------------------------------------------------------------------------------------
# One env, 9 steps: a termination at step 2 (its reset step is 3) and a truncation at step 5 (its reset step is 6).
# values[t] is the value of the observation stored at step t; a reset step stores the ended episode's final frame, so
# values[3] and values[6] are the final frames' values, values[4] and values[7] the next episodes' first frames'.
TERM = [0, 0, 1, 0, 0, 0, 0, 0, 0]
DONE = [0, 0, 1, 0, 0, 1, 0, 0, 0]
VALID = [1, 1, 1, 0, 1, 1, 0, 1, 1]
REWARDS = [0.5, -1.0, 2.0, 7.0, 0.25, 1.5, 9.0, -0.5, 1.0]  # 7.0 and 9.0 on reset steps: never counted
VALUES = [0.3, -0.2, 0.8, 0.6, 0.1, -0.4, 0.9, 0.2, 0.7]
NEXT_VALUE = 0.35
GAMMA, LAMBDA = 0.9, 0.8


def as_column(x):
    return torch.tensor(x, dtype=torch.float64).reshape(-1, 1)


def test_a_reward_after_an_episode_end_reaches_the_intrinsic_advantage_before_it_but_not_the_extrinsic_one():
    def both(rewards):
        r = as_column(rewards)
        ext = rnd_ppo.compute_gae(
            r, as_column(VALUES), t([NEXT_VALUE]), as_column(TERM), as_column(DONE), as_column(VALID), GAMMA, LAMBDA
        )[0]
        intr = rnd_ppo.intrinsic_gae(r, as_column(VALUES), t([NEXT_VALUE]), as_column(VALID), GAMMA, LAMBDA)[0]
        return ext.flatten(), intr.flatten()

    ext, intr = both(REWARDS)
    for later in (4, 7):  # the first step of the episode after the termination, and after the truncation
        changed = list(REWARDS)
        changed[later] += 1.0
        ext2, intr2 = both(changed)
        before = 1 if later == 4 else 5  # a step of the previous episode
        assert ext2[before] == ext[before]
        assert intr2[before] - intr[before] == pytest.approx(
            (GAMMA * LAMBDA) ** sum(VALID[before:later]), rel=1e-12
        )  # one step of the stream per valid step between them: the reset step is not one
    # a reset step's own reward counts nowhere
    changed = list(REWARDS)
    changed[3] += 100.0
    ext2, intr2 = both(changed)
    assert torch.equal(ext2, ext) and torch.equal(intr2, intr)


# ---------------------------------------------------------------------------------------------------------------
# --compile
# ---------------------------------------------------------------------------------------------------------------
def compiled_or_eager_update(obs: torch.Tensor, frames: torch.Tensor, compiled: bool):
    """The acting step and rnd_ppo_update through training_steps on 8 observations (2 PPO chunks of 4 and one predictor
    chunk of 2 per minibatch, 2 optimiser steps), from the same weights; returns the acting step's outputs, the loss
    terms and the weights (of both networks)."""
    torch.manual_seed(0)
    spec = rnd_ppo.envpool.make_spec("MontezumaRevenge-v5")
    agent, rnd = rnd_ppo.Agent(spec.observation_space, spec.action_space), rnd_ppo.RNDModel()
    params = list(agent.parameters()) + list(rnd.predictor.parameters())
    # a tensor rate when compiled, as main; eps 1e-3: with the default 1e-8, Adam's first step is lr * sign(g) wherever
    # |g| > 1e-7, so a float-rounding difference on a gradient that is 0 but for rounding would flip a whole step
    optimizer = torch.optim.Adam(params, lr=torch.tensor(1e-4) if compiled else 1e-4, eps=1e-3)
    args = rnd_ppo.Args(compile=compiled, num_minibatches=1, update_epochs=2, chunk_size=4, update_proportion=0.25)
    args.batch_size = args.minibatch_size = 8
    steps = rnd_ppo.training_steps(agent, rnd, optimizer, params, args)
    with torch.no_grad():
        acted = [x.clone() for x in steps["act"](obs)[:4]]  # the fifth: no memory state
    obs_rms = rnd_ppo.RunningMeanStd((1, 84, 84), torch.device("cpu"))
    rnd_ppo.update_frame_stats(obs_rms, frames)
    gen, valid = torch.Generator().manual_seed(1), torch.ones(8)
    valid[5] = 0
    batch = dict(
        obs=obs, frames=frames, actions=torch.randint(0, 18, (8,), generator=gen),
        logprobs=-2.9 + 0.1 * torch.randn(8, generator=gen), advantages=torch.randn(8, generator=gen),
        ext_returns=torch.randn(8, generator=gen), int_returns=torch.randn(8, generator=gen), valid=valid,
    )  # fmt: skip
    torch.manual_seed(2)  # the minibatch permutation
    stats = rnd_ppo.rnd_ppo_update(steps, batch, obs_rms, args)
    return acted, stats, flat_params(params)


def test_compiled_steps_give_what_the_eager_ones_give():
    """--compile: from the same weights and batch, the compiled update (PPO and predictor chunks whose gradients add up,
    the Adam step with the rate a tensor) gives the eager update's loss terms and weights, and the compiled acting step
    the eager network's log-probability and both values of the actions it samples."""
    last = atari_frames("MontezumaRevenge-v5", 11)
    obs = torch.cat([last[i : i + 8] for i in range(4)], dim=1)  # (8, 4, 84, 84) stacks of consecutive frames
    frames = last[3:]  # each stack's newest frame, what RND sees
    _, eager_stats, eager_weights = compiled_or_eager_update(obs, frames, compiled=False)
    acted, stats, weights = compiled_or_eager_update(obs, frames, compiled=True)
    torch.testing.assert_close(stats, eager_stats, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, eager_weights, rtol=1e-5, atol=1e-5)
    action, logprob, ext_value, int_value = acted
    torch.manual_seed(0)
    spec = rnd_ppo.envpool.make_spec("MontezumaRevenge-v5")
    with torch.no_grad():  # the weights the acting step saw
        logits, eager_ext, eager_int, _ = rnd_ppo.Agent(spec.observation_space, spec.action_space)(obs)
    torch.testing.assert_close(logprob, logits.log_softmax(-1).gather(1, action[:, None]).squeeze(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ext_value, eager_ext, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(int_value, eager_int, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Novelty fades
# ---------------------------------------------------------------------------------------------------------------
def test_novelty_fades_on_frames_the_predictor_trains_on_and_stays_on_frames_it_never_saw():
    """The predictor trained (100 Adam steps at the default lr 1e-4) on 64 Montezuma frames, with observation statistics
    from them: its error there falls, while on 64 Venture frames, which it never saw, it stays high. Measured with
    weight seeds 0, 1, 2: the trained error fell 8.7-9.0x (asserted: 4x); Venture's kept 47-56% of its start (asserted:
    30%) and ended 554-623x the trained error (asserted: 100x)."""
    seen, unseen = atari_frames("MontezumaRevenge-v5", 64, seed=1), atari_frames("Venture-v5", 64, seed=2)
    torch.manual_seed(0)
    rms = rnd_ppo.RunningMeanStd((1, 84, 84), torch.device("cpu"))
    rnd_ppo.update_frame_stats(rms, seen)
    rnd = rnd_ppo.RNDModel()
    optimizer = torch.optim.Adam(rnd.predictor.parameters(), lr=1e-4)
    x_seen, x_unseen = rnd_ppo.normalize_frames(seen, rms), rnd_ppo.normalize_frames(unseen, rms)

    def errors():
        with torch.no_grad():
            return rnd.error(x_seen).mean().item(), rnd.error(x_unseen).mean().item()

    seen_before, unseen_before = errors()
    for _ in range(100):
        loss = rnd.error(x_seen).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seen_after, unseen_after = errors()
    assert seen_after < seen_before / 4
    assert unseen_after > 0.3 * unseen_before and unseen_after > 100 * seen_after


# ---------------------------------------------------------------------------------------------------------------
# Rooms
# ---------------------------------------------------------------------------------------------------------------
def test_the_room_counter_on_a_recorded_ram_sequence_matches_a_hand_count():
    """Two envs' room bytes after each step. Env 0 visits rooms 1, 0, 4 and 0 again, ends (3 rooms), then starts over
    in room 1 (the reset step's room is the new episode's), goes to 2, ends (2 rooms). Env 1 stays in room 1 and then
    reaches room 9 without ending. The run has seen rooms 0, 1, 2, 4, 9."""
    rooms = [[1, 1], [0, 1], [4, 1], [0, 1], [1, 1], [2, 9], [2, 9]]
    ends = [[0, 0], [0, 0], [0, 0], [1, 0], [0, 0], [0, 0], [1, 0]]
    counter = rnd_ppo.Rooms("MontezumaRevenge-v5", 2, np.zeros(256, dtype=bool))
    for step in range(len(rooms)):
        ram = np.zeros((2, 128), dtype=np.uint8)
        ram[:, 3] = rooms[step]  # Montezuma's room byte
        counter.step({"ram": ram}, np.array(ends[step], dtype=bool), 10 * step)
    assert counter.finished == [(30, 3), (60, 2)]
    assert np.flatnonzero(counter.seen).tolist() == [0, 1, 2, 4, 9]
    assert np.flatnonzero(counter.episode_rooms[1]).tolist() == [1, 9] and not counter.episode_rooms[0].any()
    none = np.zeros(256, dtype=bool)
    assert rnd_ppo.Rooms("Pitfall-v5", 1, none).address == 1 and rnd_ppo.Rooms("Venture-v5", 1, none).address is None


def test_montezumas_first_room_is_room_1_at_the_ram_address_the_counter_reads():
    envs = rnd_ppo.make_env("MontezumaRevenge-v5", 2, 0, 4500, 0.25)
    envs.reset()
    info = envs.step(np.zeros(2, dtype=np.int64))[-1]
    envs.close()
    counter = rnd_ppo.Rooms("MontezumaRevenge-v5", 2, np.zeros(256, dtype=bool))
    counter.step(info, np.ones(2, dtype=bool), 8)
    assert info["ram"].shape == (2, 128) and counter.finished == [(8, 1), (8, 1)]
    assert np.flatnonzero(counter.seen).tolist() == [1]


# ---------------------------------------------------------------------------------------------------------------
# Runs end to end
# ---------------------------------------------------------------------------------------------------------------
def test_the_learning_checks_pixel_corridor_steps_as_envpool_atari_does():
    """The learning check's stand-in for Atari (tests/pixel_corridor.py) keeps envpool's conventions, or the check
    would test rnd_ppo.py on episodes it never meets: 4 stacked uint8 frames, the end scored in info["reward"] and
    info["terminated"], the cap a truncation, and the next-step autoreset (the step after a done ignores its action,
    scores 0 and returns the new episode's first frame in all 4 slots)."""
    envs = PixelCorridor(num_envs=2, max_episode_steps=LENGTH - 1)
    obs, _ = envs.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8 and (obs == obs[:, :1]).all()
    first = obs[0, 0].copy()
    for _ in range(LENGTH - 1):  # env 0 walks right (action 0), env 1 stays (action 2)
        obs, reward, term, trunc, info = envs.step(np.array([0, 2]))
        assert not (obs[0, -1] == obs[0, -2]).all() and (obs[1] == first).all()
    assert term.tolist() == [True, False] and trunc.tolist() == [False, True]
    assert reward.tolist() == [1.0, 0.0] and info["reward"].tolist() == [1.0, 0.0] and info["terminated"].tolist() == [1, 0]
    obs, reward, term, trunc, _ = envs.step(np.array([0, 0]))  # the reset step: actions ignored
    assert reward.tolist() == [0.0, 0.0] and not term.any() and not trunc.any() and (obs == first).all()


def test_smoke_trains_saves_reloads_and_evaluates(tmp_path):
    flags = [*TINY, "--total-timesteps", "256", "--save-model", "--eval-every", "128", "--eval-episodes", "2"]
    proc = run_algorithm("rnd_ppo", *flags, "--capture-video", cwd=tmp_path)
    assert "observation statistics from 128 random steps in" in proc.stdout
    run = only_run(tmp_path)
    logged = scalars(run)
    assert TAGS <= set(logged)
    assert [s for s, _, _ in logged["charts/rooms_visited_total"]] == [128, 256]
    assert all(v == 40 for _, v, _ in logged["charts/episodic_length"])  # the cap (a truncation) ends every episode
    model = load_file(run / "rnd_ppo.model")
    assert {"model", "rnd", "obs_rms", "reward_rms", "rewems"} <= set(model)
    assert "critic_int.weight" in model["model"] and {"predictor.11.weight", "target.0.weight"} <= set(model["rnd"])
    # the statistics saw the random steps and both rollouts' frames (4 envs x 32 steps each time)
    assert model["obs_rms"]["count"].item() == pytest.approx(3 * 128 + 1e-4)
    assert model["reward_rms"]["count"].item() > 200 and model["rewems"].shape == (4,)
    assert f"model: {run.relative_to(tmp_path) / 'rnd_ppo.model'}" in proc.stdout
    assert {p.name for p in (run / "videos").iterdir()} == {"eval_128.mp4", "eval_256.mp4", "final.mp4"}


def test_a_game_without_rooms_logs_no_room_tags(tmp_path):
    run_algorithm("rnd_ppo", "--env-id", "Venture-v5", *TINY, "--total-timesteps", "128", cwd=tmp_path)
    logged = scalars(only_run(tmp_path))
    assert "charts/episode_rooms" not in logged and "charts/rooms_visited_total" not in logged
    assert "losses/rnd_loss" in logged
