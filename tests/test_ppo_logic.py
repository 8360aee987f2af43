"""ppo.py's maths against plain reference code: GAE, episode statistics, running statistics, schedule, loss."""

import dataclasses

import numpy as np
import pytest
import torch

from conftest import ROOT, load_algorithm

ppo = load_algorithm("ppo")


def reference_gae(rewards, values, next_value, terms, truncs, valid, gamma, lam):
    """Advantage as the forward sum of discounted TD errors up to the episode's end, one env at a time."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    adv = [[0.0] * num_envs for _ in range(num_steps)]
    for e in range(num_envs):
        for t in range(num_steps):
            if not valid[t][e]:
                continue
            total, discount = 0.0, 1.0
            for k in range(t, num_steps):
                v_next = values[k + 1][e] if k + 1 < num_steps else next_value[e]
                total += discount * (rewards[k][e] + gamma * v_next * (0.0 if terms[k][e] else 1.0) - values[k][e])
                if terms[k][e] or truncs[k][e]:
                    break
                discount *= gamma * lam
            adv[t][e] = total
    return adv


def gae(rewards, values, next_value, terms, truncs, valid, gamma, lam):
    f = torch.tensor
    terms, truncs = f(terms, dtype=torch.float32), f(truncs, dtype=torch.float32)
    return ppo.compute_gae(
        f(rewards), f(values), f(next_value), terms, torch.maximum(terms, truncs), f(valid, dtype=torch.float32), gamma, lam
    )


def test_gae_by_hand_truncation_bootstraps_termination_does_not_reset_step_is_zero():
    # t1 truncates: values[2] is V(real final obs); t2 is the reset step; t3 terminates
    adv, ret = gae([[1.0], [1.0], [0.0], [1.0]], [[1.0], [2.0], [3.0], [4.0]], [5.0], [[0], [0], [0], [1]],
                   [[0], [1], [0], [0]], [[1], [1], [0], [1]], gamma=0.5, lam=1.0)  # fmt: skip
    assert adv[:, 0].tolist() == pytest.approx([1.25, 0.5, 0.0, -3.0])
    assert ret[:, 0].tolist() == pytest.approx([2.25, 2.5, 3.0, 1.0])


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_reference_on_random_episodes(seed):
    rng = np.random.default_rng(seed)
    num_steps, num_envs = 40, 3
    terms = rng.random((num_steps, num_envs)) < 0.08
    truncs = (rng.random((num_steps, num_envs)) < 0.08) & ~terms
    done = terms | truncs
    valid = np.ones((num_steps, num_envs), dtype=bool)
    valid[1:] = ~done[:-1]
    valid[0] = rng.random(num_envs) < 0.7  # a rollout may start on a reset step
    rewards = np.where(valid, rng.normal(size=(num_steps, num_envs)), 0.0)  # the reset step's reward is 0
    values = rng.normal(size=(num_steps, num_envs))
    next_value = rng.normal(size=num_envs)
    args = (rewards.tolist(), values.tolist(), next_value.tolist(), terms.tolist(), truncs.tolist(), valid.tolist())
    adv, ret = gae(*args, gamma=0.99, lam=0.95)
    expected = np.array(reference_gae(*args, gamma=0.99, lam=0.95))
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-5, atol=1e-5)


def test_episode_stats_across_termination_truncation_and_life_loss():
    # env 0: 3 steps then terminated, reset step, 2 steps then truncated
    # env 1 (Atari, episodic life): life lost at t1 (a training done, not an episode end), reset step, game over at t4
    raw = np.array([[1, 0], [1, 5], [1, 0], [0, 2], [4, 3], [2, 0]], dtype=float)
    valid = np.array([[1, 1], [1, 1], [1, 0], [0, 1], [1, 1], [1, 0]], dtype=bool)
    end = np.array([[0, 0], [0, 0], [1, 0], [0, 0], [0, 1], [1, 0]], dtype=bool)
    ep_return, ep_length, finished = np.zeros(2), np.zeros(2, dtype=np.int64), []
    for t in range(6):
        ep_return, ep_length, fin_r, fin_l = ppo.update_episode_stats(ep_return, ep_length, raw[t], valid[t], end[t])
        finished += [(t, float(r), int(n)) for r, n in zip(fin_r, fin_l, strict=True)]
    # env 1's game: 4 real steps (t0, t1, t3, t4; t2 is the reset step after the lost life), raw score 10
    assert finished == [(2, 3.0, 3), (4, 10.0, 4), (5, 6.0, 2)]


def test_episode_stats_give_envpool_breakout_full_game_score_and_length():
    """With episodic life, a logged episode is the whole game: its length is envpool's own step count."""
    envs, is_atari = ppo.make_env("Breakout-v5", 1, seed=3, episodic_life=True, reward_clip=True, backend="auto")
    assert is_atari
    envs.reset()
    rng = np.random.default_rng(0)
    ep_return, ep_length, valid = np.zeros(1), np.zeros(1, dtype=np.int64), np.ones(1, dtype=bool)
    game_score, games, life_losses = 0.0, 0, 0
    while games < 2:
        _, reward, term, trunc, info = envs.step(rng.integers(0, 4, 1))
        game_score += info["reward"][0]
        end = info["terminated"].astype(bool) | trunc
        life_losses += int(term[0] and not end[0])
        ep_return, ep_length, fin_r, fin_l = ppo.update_episode_stats(ep_return, ep_length, info["reward"], valid, end)
        assert np.all(reward <= 1.0)  # training reward is clipped, the logged one is not
        if end[0]:
            assert fin_r[0] == game_score and fin_l[0] == info["elapsed_step"][0]
            game_score, games = 0.0, games + 1
        valid = ~(term | trunc)
    assert life_losses >= 4  # the games really crossed lost lives


def test_frame_stack_sets_the_frames_of_an_atari_observation():
    """--frame-stack k: envpool stacks the latest k frames, the newest last (the frame a 1-frame stack shows); the
    network's channels: test_ppo_runs.py."""
    for k in (1, 2):
        envs, _ = ppo.make_env("Breakout-v5", 2, 0, True, True, "auto", frame_stack=k)
        obs, _ = envs.reset()
        assert obs.shape == (2, k, 84, 84) and obs.dtype == np.uint8
        frames = [envs.step(np.ones(2, dtype=np.int64))[0] for _ in range(3)]
        if k == 2:
            assert np.array_equal(frames[2][:, 0], frames[1][:, 1])  # the older frame is the previous step's newest
        envs.close()


def test_make_env_autoresets_on_the_next_step_for_envpool_and_gymnasium(monkeypatch):
    """The convention the rollout relies on: after done, one reset step with reward 0 and no done."""
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    for env_id, backend in (("CartPole-v1", "envpool"), ("CartPole-v1", "gymnasium"), ("corridor_env:Corridor-v0", "auto")):
        envs, _ = ppo.make_env(env_id, 1, seed=0, episodic_life=False, reward_clip=False, backend=backend)
        envs.reset()
        action = np.ones(1, dtype=np.int64)
        done_at = None
        for t in range(600):
            obs, reward, term, trunc, _ = envs.step(action)
            if done_at is not None:
                assert reward[0] == 0 and not (term[0] or trunc[0])
                break
            if term[0] or trunc[0]:
                done_at = t
        assert done_at is not None
        envs.close()


def test_presets_set_real_flags_and_a_given_flag_wins():
    """The figures are CleanRL's: ppo_atari_envpool.py clips at 0.1, ppo_continuous_action.py normalises observations
    and collects 2048 steps, ppo.py collects 128 steps per env on classic control."""
    for preset in ppo.PRESETS.values():
        assert set(preset) <= {f.name for f in dataclasses.fields(ppo.Args)}
    assert ppo.parse_args(["--env-id", "Breakout-v5"]).clip_coef == 0.1  # auto: image observations
    assert ppo.parse_args(["--env-id", "Pendulum-v1"]).norm_obs  # auto: Box actions
    assert ppo.parse_args(["--env-id", "CartPole-v1"]).num_steps == 128
    assert ppo.parse_args(["--env-id", "Breakout-v5", "--clip-coef", "0.3"]).clip_coef == 0.3
    assert ppo.parse_args(["--env-id", "CartPole-v1", "--preset", "mujoco"]).num_steps == 2048


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_policy_head_samples_and_scores_as_the_distribution_its_outputs_define(env_id):
    """get_action_and_value (shared by ppo.py and a2c.py) against Categorical and Normal built here from the actor's
    outputs: the same sampled actions from the same seed, the same greedy actions (argmax, mean), and the same
    log-probabilities, entropies and gradients, to the bit; a change there would change every run."""
    obs_space, action_space = ppo.env_spaces(env_id)
    torch.manual_seed(3)
    agent = ppo.Agent(obs_space, action_space)
    with torch.no_grad():
        agent.actor[-1].weight.mul_(100.0)  # far from uniform, so that the samples tell the probabilities apart
    obs = torch.randn(256, *obs_space.shape)

    def reference(action=None, deterministic=False):
        mean = agent.actor(obs)
        if agent.continuous:
            dist = torch.distributions.Normal(mean, agent.actor_logstd.expand_as(mean).exp(), validate_args=False)
        else:
            dist = torch.distributions.Categorical(logits=mean, validate_args=False)
        if action is None:
            action = (dist.mean if agent.continuous else dist.probs.argmax(-1)) if deterministic else dist.sample()
        logprob, entropy = dist.log_prob(action), dist.entropy()
        if agent.continuous:
            logprob, entropy = logprob.sum(-1), entropy.sum(-1)
        return action, logprob, entropy

    for deterministic in (False, True):
        torch.manual_seed(5)
        ours = agent.get_action_and_value(obs, deterministic=deterministic)[:3]
        torch.manual_seed(5)
        theirs = reference(deterministic=deterministic)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    action = ours[0].detach()
    weights = torch.randn(256, generator=torch.Generator().manual_seed(1))
    grads = []
    for out in (agent.get_action_and_value(obs, action)[1:3], reference(action)[1:]):
        agent.zero_grad()
        ((out[0] * weights).sum() + out[1].sum()).backward()
        grads.append([p.grad.clone() for p in agent.actor.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
