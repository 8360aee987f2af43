"""a2c.py: n-step returns, the loss (and its equality with PPO's at ratio 1), RMSprop, runs end to end, learning."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (
    CPU,
    flat_params,
    load_algorithm,
    load_file,
    only_run,
    run_algorithm,
    scalars,
    stop_run,
    twenty_episode_means,
)

a2c = load_algorithm("a2c")
ppo = load_algorithm("ppo")

TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/explained_variance",
    "eval/episodic_return",
}


# ---------------------------------------------------------------------------------------------------------------
# n-step returns
# ---------------------------------------------------------------------------------------------------------------
def reference_nstep_returns(rewards, values, next_value, terms, truncs, valid, gamma):
    """Discounted rewards up to the episode's end or the rollout's, one env at a time; bootstrap with the value of
    the next observation unless the episode terminated."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    returns = [[values[t][e] for e in range(num_envs)] for t in range(num_steps)]  # reset steps: no advantage
    for e in range(num_envs):
        for t in range(num_steps):
            if not valid[t][e]:
                continue
            total, discount = 0.0, 1.0
            for k in range(t, num_steps):
                total += discount * rewards[k][e]
                discount *= gamma
                if terms[k][e]:
                    break
                if truncs[k][e] or k == num_steps - 1:
                    total += discount * (values[k + 1][e] if k + 1 < num_steps else next_value[e])
                    break
            returns[t][e] = total
    return returns


def nstep(rewards, values, next_value, terms, truncs, valid, gamma):
    f = torch.tensor
    terms, truncs = f(terms, dtype=torch.float32), f(truncs, dtype=torch.float32)
    valid = f(valid, dtype=torch.float32)
    dones = torch.maximum(terms, truncs)
    return a2c.compute_gae(f(rewards), f(values), f(next_value), terms, dones, valid, gamma, a2c.Args.gae_lambda)


def test_nstep_returns_by_hand_across_truncation_reset_step_and_termination():
    # env 0: t1 truncates (values[2] is V(real final obs)), t2 is the reset step, t4 terminates; env 1 runs on
    # and bootstraps from next_value
    rewards = [[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]
    vals = [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0], [5.0, 0.0]]
    terms = [[0, 0], [0, 0], [0, 0], [0, 0], [1, 0]]
    truncs = [[0, 0], [1, 0], [0, 0], [0, 0], [0, 0]]
    valid = [[1, 1], [1, 1], [0, 1], [1, 1], [1, 1]]
    adv, ret = nstep(rewards, vals, [6.0, 8.0], terms, truncs, valid, gamma=0.5)
    assert ret[:, 0].tolist() == pytest.approx([1 + 0.5 * 2.5, 1 + 0.5 * 3, 3.0, 1 + 0.5 * 2, 2.0])
    assert ret[:, 1].tolist() == pytest.approx([2.1875, 2.375, 2.75, 3.5, 1 + 0.5 * 8])
    assert adv[2, 0] == 0  # the reset step carries no advantage


@pytest.mark.parametrize("seed", range(3))
def test_nstep_returns_match_reference_on_random_episodes(seed):
    rng = np.random.default_rng(seed)
    num_steps, num_envs = 5, 16
    terms = rng.random((num_steps, num_envs)) < 0.15
    truncs = (rng.random((num_steps, num_envs)) < 0.15) & ~terms
    valid = np.ones((num_steps, num_envs), dtype=bool)
    valid[1:] = ~(terms | truncs)[:-1]
    valid[0] = rng.random(num_envs) < 0.7  # a rollout may start on a reset step
    rewards = np.where(valid, rng.normal(size=(num_steps, num_envs)), 0.0)
    vals = rng.normal(size=(num_steps, num_envs))
    next_value = rng.normal(size=num_envs)
    args = (rewards.tolist(), vals.tolist(), next_value.tolist(), terms.tolist(), truncs.tolist(), valid.tolist())
    _, ret = nstep(*args, gamma=0.99)
    np.testing.assert_allclose(ret.numpy(), np.array(reference_nstep_returns(*args, gamma=0.99)), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# The loss, and PPO's at ratio 1
# ---------------------------------------------------------------------------------------------------------------
def batch(obs_space, action_space, rnn="none", n=32, seed=0):
    """An agent and a rollout-shaped batch for it, with a few masked (reset-step) entries. With memory, the
    observations are 4 envs' sequences of n / 4 steps with episode starts inside, replayed from a random state (the
    memory arguments of get_action_and_value; empty without)."""
    torch.manual_seed(seed)
    agent = a2c.Agent(obs_space, action_space, rnn, 16)
    obs = torch.as_tensor(np.stack([obs_space.sample() for _ in range(n)]), dtype=torch.float32)
    memory = ()
    if rnn != "none":
        obs = obs.view(n // 4, 4, -1)
        starts = (torch.rand(n // 4, 4) < 0.2).float()
        memory = (torch.randn(2 if rnn == "lstm" else 1, 4, 16), starts, a2c.memory_spans(starts.numpy() > 0))
    with torch.no_grad():
        actions = agent.get_action_and_value(obs, None, False, *memory)[0]
    advantages, returns = torch.randn(n), torch.randn(n)
    mask = (torch.rand(n) > 0.2).float()
    return agent, obs, actions, advantages, returns, mask, memory


def grads(agent, loss):
    agent.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in agent.parameters()]


SPACES = {
    "discrete": (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)),
    "continuous": (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,))),
}


@pytest.mark.parametrize("rnn", ["none", "lstm", "gru"])
@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("ent_coef, vf_coef, norm_adv", [(0.0, 0.0, False), (0.01, 0.5, False), (0.01, 0.25, True)])
def test_ppo_with_one_epoch_one_minibatch_has_the_a2c_gradient(space, ent_coef, vf_coef, norm_adv, rnn):
    """Huang et al. 2022, "A2C is a special case of PPO": on the rollout it was collected with, PPO's ratio is 1, so
    clipping is inactive and the gradient of ratio * A is that of logprob * A. ppo.py halves its squared error and
    a2c.py does not (as SB3), so PPO's vf_coef is twice A2C's; advantage normalisation is the same code in both. With
    memory the gradients flow back through the replayed sequences (episode starts inside), the same in both."""
    agent, obs, actions, advantages, returns, mask, memory = batch(*SPACES[space], rnn)
    _, logprob, entropy, value, _ = agent.get_action_and_value(obs, actions, False, *memory)
    a2c_loss, _ = a2c.a2c_loss(logprob, entropy, value, advantages, returns, mask, ent_coef, vf_coef, norm_adv)
    a2c_grads = grads(agent, a2c_loss)
    _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(obs, actions, False, *memory)
    ppo_loss, stats = ppo.ppo_loss(
        newlogprob, newlogprob.detach(), entropy, newvalue, newvalue.detach(), advantages, returns, mask,
        clip_coef=0.2, clip_vloss=False, ent_coef=ent_coef, vf_coef=2 * vf_coef, norm_adv=norm_adv,
    )  # fmt: skip
    ppo_grads = grads(agent, ppo_loss)
    assert stats["clipfrac"] == 0  # no clipped entry
    assert any(g.abs().sum() > 0 for g in a2c_grads)
    for g_a2c, g_ppo in zip(a2c_grads, ppo_grads, strict=True):
        torch.testing.assert_close(g_a2c, g_ppo, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------------------------
# Optimiser, presets
# ---------------------------------------------------------------------------------------------------------------
def test_rmsprop_tf_like_puts_eps_inside_the_root_and_starts_the_mean_square_at_one():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = a2c.RMSpropTF([p], lr=0.1, alpha=0.9, eps=1e-5)
    # the state exists before the first step and each step updates that tensor in place: a tensor made inside a step
    # that --cudagraphs captures would live in the graph's memory, overwritten by the next replay
    square_avg = opt.state[p]["square_avg"]
    assert square_avg.tolist() == [1.0, 1.0]
    expected, ms = np.array([1.0, -2.0]), np.ones(2)
    for g in ([0.5, -3.0], [0.0, 1.0], [2.0, 0.0]):
        p.grad = torch.tensor(g)
        opt.step()
        assert opt.state[p]["square_avg"] is square_avg
        ms = 0.9 * ms + 0.1 * np.square(g)
        expected = expected - 0.1 * np.array(g) / np.sqrt(ms + 1e-5)
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-6)
    state = opt.state_dict()  # checkpoints carry it like any torch optimiser's
    opt2 = a2c.RMSpropTF([torch.nn.Parameter(torch.zeros(2))], lr=0.1, alpha=0.9, eps=1e-5)
    opt2.load_state_dict(state)
    np.testing.assert_allclose(opt2.state_dict()["state"][0]["square_avg"].numpy(), ms, rtol=1e-6)


def test_optimiser_is_rmsprop_with_baselines_settings():
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = a2c.make_optimizer(params, a2c.Args())
    assert isinstance(opt, torch.optim.RMSprop)
    assert opt.defaults["alpha"] == 0.99 and opt.defaults["eps"] == 1e-5 and opt.defaults["lr"] == 7e-4
    assert isinstance(a2c.make_optimizer(params, a2c.Args(rmsprop_tf_like=True)), a2c.RMSpropTF)


def test_compiled_update_and_acting_step_equal_the_eager_ones():
    """--compile traces the same functions: from the same weights and rollout, one compiled update (loss, clipped
    gradient, RMSprop with the rate as a tensor) leaves the same weights as the eager one, and the compiled acting step
    scores the same actions with the same log-probabilities and values."""
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    torch.manual_seed(0)
    obs, actions = torch.randn(40, 4), torch.randint(0, 2, (40,))
    advantages, returns, valid = torch.randn(40), torch.randn(40), (torch.rand(40) > 0.1).float()
    results = []
    for compile_ in (False, True):
        args = a2c.Args(compile=compile_)
        torch.manual_seed(1)
        agent = a2c.Agent(obs_space, action_space)
        optimizer = a2c.make_optimizer(agent.parameters(), args)
        if compile_:
            optimizer.param_groups[0]["lr"] = torch.tensor(args.learning_rate)
        act, update = a2c.training_steps(agent, optimizer, args)
        before = flat_params(agent)
        with torch.no_grad():
            _, logprob, entropy, value, _ = act(obs, actions)
        batch = dict(obs=obs, actions=actions, values=torch.zeros(40), advantages=advantages, returns=returns, valid=valid)
        stats = torch.stack([torch.stack(list(update(batch, {}).values())) for _ in range(3)])
        results.append((logprob, entropy, value, stats, flat_params(agent)))
    for eager, compiled in zip(*results, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(results[0][4], before)  # the update did move the weights


def test_rmsprop_tf_like_takes_the_rate_as_a_float_or_a_tensor():
    """Compiled runs hold the learning rate in a tensor (annealing it then does not recompile): the same step either way."""
    params = [torch.nn.Parameter(torch.tensor([1.0, -2.0])) for _ in range(2)]
    for p, lr in zip(params, (0.1, torch.tensor(0.1)), strict=True):
        opt = a2c.RMSpropTF([p], lr=lr, alpha=0.9, eps=1e-5)
        for _ in range(2):
            p.grad = torch.tensor([0.5, 3.0])
            opt.step()
    torch.testing.assert_close(params[0].detach(), params[1].detach())
    assert not torch.equal(params[0].detach(), torch.tensor([1.0, -2.0]))


def test_presets_set_real_flags_and_a_given_flag_wins():
    """The figures are rl-baselines3-zoo's hyperparams/a2c.yml over SB3's A2C defaults: CartPole-v1 8 envs and no
    entropy bonus (5 steps and lambda 1 from SB3); Atari 16 envs, ent_coef 0.01, vf_coef 0.25 and RMSpropTFLike;
    MuJoCo `normalize: true`."""
    for preset in a2c.PRESETS.values():
        assert set(preset) <= {f.name for f in dataclasses.fields(a2c.Args)}
    cartpole = a2c.parse_args(["--env-id", "CartPole-v1"])
    assert (cartpole.num_envs, cartpole.num_steps, cartpole.gae_lambda, cartpole.ent_coef) == (8, 5, 1.0, 0.0)
    breakout = a2c.parse_args(["--env-id", "Breakout-v5"])  # auto: image observations
    assert (breakout.num_envs, breakout.ent_coef, breakout.vf_coef, breakout.rmsprop_tf_like) == (16, 0.01, 0.25, True)
    pendulum = a2c.parse_args(["--env-id", "Pendulum-v1"])  # auto: Box actions
    # the zoo's `normalize: true` trains with SB3's VecNormalize defaults: observations and rewards
    assert pendulum.norm_obs and pendulum.norm_reward and pendulum.num_envs == 1
    assert a2c.parse_args(["--env-id", "Breakout-v5", "--vf-coef", "0.5"]).vf_coef == 0.5
    assert a2c.parse_args(["--env-id", "CartPole-v1", "--preset", "atari"]).num_envs == 16
    # the mujoco preset on uint8 frames: its --norm-obs is left off (the network scales them), the rest stays
    frames = a2c.parse_args(["--env-id", "Breakout-v5", "--preset", "mujoco"])
    a2c.check_args(frames, *a2c.env_spaces("Breakout-v5"))
    assert not frames.norm_obs and frames.norm_reward and frames.num_envs == 1


# ---------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env_id, flags",
    [
        ("CartPole-v1", "--total-timesteps 2000 --capture-video --eval-every 1000 --eval-episodes 3".split()),
        ("Pendulum-v1", "--total-timesteps 2000 --num-envs 4 --eval-episodes 2 --compile --anneal-lr".split()),
        ("Breakout-v5", "--total-timesteps 160 --num-envs 2 --eval-episodes 1".split()),
    ],
)
def test_smoke_trains_saves_reloads_and_evaluates(env_id, flags, tmp_path):
    proc = run_algorithm("a2c", "--env-id", env_id, "--save-model", *flags, cwd=tmp_path)
    run = only_run(tmp_path)
    assert f"model: {run.relative_to(tmp_path) / 'a2c.model'}" in proc.stdout
    assert "tensorboard logs:" in proc.stdout.splitlines()[-1]
    # 160 Breakout steps end no game
    expected = TAGS - {"charts/episodic_return", "charts/episodic_length"} if env_id == "Breakout-v5" else TAGS
    assert expected <= set(scalars(run))
    model = load_file(run / "a2c.model")
    assert model["args"]["env_id"] == env_id
    assert (model["obs_rms"] is not None) == (env_id == "Pendulum-v1")  # the mujoco preset normalises observations
    if "--eval-every" in flags:  # two periodic evaluations (their means), then the final one's three episodes
        assert [step for step, _, _ in scalars(run)["eval/episodic_return"]] == [1000, 2000, 2000, 2000, 2000]
        assert {p.name for p in (run / "videos").iterdir()} == {"eval_1000.mp4", "eval_2000.mp4", "final.mp4"}
        assert (run / "videos" / "final.mp4").stat().st_size > 1000


def test_sigterm_checkpoints_and_the_resumed_run_logs_each_step_once(tmp_path):
    total, batch, log_every = 40_000, 40, 10
    # a progress line every log interval (400 steps): the reader signals at step 2,000, long before the run's 40,000
    flags = ["--total-timesteps", str(total), "--progress-interval", "0", "--log-interval", str(log_every)]
    stop_run("a2c", *flags, cwd=tmp_path, at=2000)
    run = only_run(tmp_path)
    ckpt = load_file(run / "checkpoint.pt")
    assert 2000 <= ckpt["global_step"] < total
    assert "square_avg" in ckpt["optimizer"]["state"][0]  # RMSprop's state goes on
    run_algorithm("a2c", "--resume", str(run / "checkpoint.pt"), cwd=tmp_path)
    steps = [s for s, _, _ in scalars(run)["charts/learning_rate"]]
    # every log interval once, plus the step the run stopped at
    assert steps == sorted(set(range(batch * log_every, total + 1, batch * log_every)) | {ckpt["global_step"]})


# ---------------------------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.learning
def test_a2c_cartpole_reaches_475_within_150k_steps(tmp_path):
    """The classic preset does not anneal its learning rate, so a 150k-step run is the first 150k steps of the 500k
    benchmark run. Measured on 2 CPU cores (one thread; 8 CartPoles stepped by gymnasium, --env-backend auto): seeds 1-5
    first reach a 20-episode mean of 475 at 57,152 / 64,632 / 94,856 / 107,440 / 111,056 steps, so the worst seed has
    39k steps of slack, seed 1 (this one) 93k. About 25 s here. On the CPU, where the margin was measured."""
    run_algorithm("a2c", "--seed", "1", "--total-timesteps", "150000", CPU, cwd=tmp_path, timeout=900)
    _, means = twenty_episode_means(only_run(tmp_path))  # every window of 20 consecutive episodes
    assert len(means) and means.max() >= 475, f"best 20-episode mean {means.max() if len(means) else None}"
