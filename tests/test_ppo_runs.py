"""ppo.py end to end: each env family, save + reload, video, seeding, bad input, stop and resume."""

import numpy as np
import pytest

from conftest import (
    load_algorithm,
    load_file,
    only_run,
    run_algorithm,
    scalars,
    values,
)

ppo = load_algorithm("ppo")

TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "eval/episodic_return",
}


@pytest.mark.parametrize(
    "env_id, flags",
    [
        ("CartPole-v1", ["--total-timesteps", "2048", "--capture-video", "--eval-every", "1024", "--eval-episodes", "3"]),
        ("Pendulum-v1", ["--total-timesteps", "4096", "--num-steps", "1024", "--update-epochs", "2"]),
        ("Breakout-v5", "--total-timesteps 256 --num-envs 2 --num-steps 64 --update-epochs 1 --eval-episodes 1".split()),
        ("corridor_env:Corridor-v0", ["--total-timesteps", "2048"]),  # a gymnasium env envpool lacks
        # envpool's MuJoCo observations are float64: without statistics, training and evaluation still feed float32
        ("HalfCheetah-v4", "--total-timesteps 2048 --num-steps 1024 --no-norm-obs --eval-episodes 1".split()),
    ],
)
def test_smoke_trains_saves_reloads_and_evaluates(env_id, flags, tmp_path, test_env):
    proc = run_algorithm("ppo", "--env-id", env_id, "--save-model", *flags, cwd=tmp_path, env=test_env)
    run = only_run(tmp_path)
    assert f"model: {run.relative_to(tmp_path) / 'ppo.model'}" in proc.stdout
    assert "tensorboard logs:" in proc.stdout.splitlines()[-1]
    # 256 Breakout steps end no game; test_episodic_return_is_the_raw_atari_score covers its episodes
    expected = TAGS - {"charts/episodic_return", "charts/episodic_length"} if env_id == "Breakout-v5" else TAGS
    assert expected <= set(scalars(run))
    model = load_file(run / "ppo.model")
    assert model["args"]["env_id"] == env_id
    # MuJoCo-style runs carry their observation statistics, moved away from their initial values
    assert (model["obs_rms"] is not None) == (env_id == "Pendulum-v1")
    if model["obs_rms"] is not None:
        assert model["obs_rms"]["count"] > 4096 and model["obs_rms"]["mean"].abs().sum() > 0
    if "--eval-every" in flags:  # two periodic evaluations (their means), then the final one's three episodes
        assert [step for step, _, _ in scalars(run)["eval/episodic_return"]] == [1024, 2048, 2048, 2048, 2048]
        assert {p.name for p in (run / "videos").iterdir()} == {"eval_1024.mp4", "eval_2048.mp4", "final.mp4"}
    if "--capture-video" in flags:
        assert (run / "videos" / "final.mp4").stat().st_size > 1000


def test_frame_stack_sets_the_channels_of_the_network(tmp_path):
    """--frame-stack 2: the network a run trains takes two channels (the stacking itself: test_ppo_logic.py)."""
    tiny = "--num-envs 1 --num-steps 32 --num-minibatches 1 --total-timesteps 32 --checkpoint-every 32".split()
    run_algorithm("ppo", "--env-id", "Breakout-v5", "--frame-stack", "2", *tiny, cwd=tmp_path)
    assert load_file(only_run(tmp_path) / "checkpoint.pt")["model"]["encoder.0.weight"].shape[1] == 2


def test_episodic_length_is_the_whole_atari_game_not_one_life(tmp_path):
    """Training ends an episode at each lost life (episodic life); the logged episode is the whole game of five lives
    (the raw score is checked game by game in the next test)."""
    run_algorithm("ppo", *"--env-id Breakout-v5 --total-timesteps 4096 --num-envs 4 --num-steps 128 --update-epochs 1".split(),
                  cwd=tmp_path)  # fmt: skip
    lengths = values(only_run(tmp_path), "charts/episodic_length")
    # full games of a near-random policy, not single lives: a life of random Breakout lasts under 100 steps
    assert len(lengths) > 0 and min(lengths) > 100


def test_logged_return_is_the_sum_of_envpools_raw_rewards_over_the_whole_game(tmp_path, monkeypatch):
    """SpaceInvaders scores 5-30 points an alien, so the clipped reward (1 an alien) and the raw score differ. The
    envs main trains on are watched: each game's sum of info["reward"] up to info["terminated"] (game over, not a
    lost life) must be what charts/episodic_return logged, game by game."""
    games, running = [], np.zeros(4)

    def watched_make_env(*args, **kwargs):
        envs, is_atari = make_env(*args, **kwargs)
        step = envs.step

        def watched_step(action):
            nonlocal running
            out = step(action)
            _, _, _, trunc, info = out
            running += info["reward"]
            for i in np.flatnonzero(info["terminated"].astype(bool) | trunc):
                games.append(float(running[i]))
                running[i] = 0.0
            return out

        envs.step = watched_step
        return envs, is_atari

    make_env = ppo.make_env
    monkeypatch.setattr(ppo, "make_env", watched_make_env)
    monkeypatch.chdir(tmp_path)
    flags = "--env-id SpaceInvaders-v5 --total-timesteps 3072 --num-envs 4 --num-steps 128 --update-epochs 1"
    ppo.main(ppo.parse_args([*flags.split(), "--no-cuda", "--progress-interval", "1000"]))
    logged = values(only_run(tmp_path), "charts/episodic_return")
    # a game with a kill scores at least 5 raw points per alien against 1 clipped, so the two cannot agree
    assert len(games) >= 1 and max(games) > 0 and logged == games
