"""Recurrent policies (--rnn): the memory's pass over spans against a step-by-step loop, a first minibatch whose
probabilities are the rollout's, a state zeroed at exactly the first step of each episode, evaluation that carries
it, runs end to end (smoke, save and reload, stop and resume) and bad input."""

import pytest
import torch

from conftest import CPU, assert_one_error_line, load_algorithm, only_run, run_algorithm, run_bad_input, scalars, stop_run

ppo = load_algorithm("ppo")


def step_by_step(memory, x, state, starts):
    """The reference: one call of the layer per step, the state zeroed by hand before each episode's first step."""
    outputs = []
    for t in range(x.shape[0]):
        keep = (1.0 - starts[t]).view(1, -1, 1)
        if isinstance(memory, torch.nn.LSTM):
            out, (h, c) = memory(x[t : t + 1], (state[:1] * keep, state[1:] * keep))
            state = torch.cat([h, c])
        else:
            out, state = memory(x[t : t + 1], state * keep)
        outputs.append(out)
    return torch.cat(outputs), state


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
@pytest.mark.parametrize("seed", range(4))
def test_the_memory_over_spans_equals_a_step_by_step_loop(rnn, seed):
    """run_memory calls the layer once per span between episode starts; the outputs and the final state must be the
    step-by-step loop's, for random starts (none, a few, every step) and a nonzero initial state."""
    gen = torch.Generator().manual_seed(seed)
    T, B, F, H = 12, 5, 3, 7
    memory = ppo.recurrent_layer(rnn, F, H)
    x, state = torch.randn(T, B, F, generator=gen), torch.randn(2 if rnn == "lstm" else 1, B, H, generator=gen)
    starts = (torch.rand(T, B, generator=gen) < [0.0, 0.1, 0.3, 1.0][seed]).float()
    spans = ppo.memory_spans(starts.numpy() > 0)
    assert spans[0] == 0 and spans[-1] == T and len(spans) - 1 == 1 + sum(starts[1:].any(1).tolist())
    with torch.no_grad():
        out, final = ppo.run_memory(memory, x, state, starts, spans)
        ref_out, ref_final = step_by_step(memory, x, state, starts)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(final, ref_final, rtol=1e-5, atol=1e-6)


def test_the_recurrent_layer_is_initialised_as_cleanrl_initialises_its_lstm():
    """Orthogonal weights with gain 1 over the whole stacked gate matrix, as CleanRL, and zero biases."""
    layer = ppo.recurrent_layer("lstm", 16, 16)
    for name, p in layer.named_parameters():
        if name.startswith("bias"):
            assert (p == 0).all(), name
        else:
            torch.testing.assert_close(p.T @ p, torch.eye(16), atol=1e-4, rtol=0)  # the (64, 16) matrix: orthonormal columns
    assert ppo.recurrent_layer("none", 16, 16) is None


def episode_values(agent, obs: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, int]:
    """For (T, B, ...) sequences: each episode's values from a fresh pass from a zero state over that episode alone,
    the episodes found from the reset steps only (valid 0; the next episode's first observation is the step after),
    each up to and including the reset step that acts on its last observation. NaN before the first episode start
    (the state carried from the rollout before). Returns them, (T, B), and the number of episodes."""
    T, B = valid.shape
    fresh, count = torch.full((T, B), float("nan")), 0
    for b in range(B):
        first_steps = [t + 1 for t in range(T - 1) if valid[t, b] == 0]
        for s, e in zip(first_steps, first_steps[1:] + [T], strict=True):
            with torch.no_grad():
                fresh[s:e, b] = agent.get_value(obs[s:e, b : b + 1], None, torch.zeros(e - s, 1))
            count += 1
    return fresh, count


def recorded_run(monkeypatch, tmp_path, rnn: str, env_id: str = "CartPole-v1"):
    """ppo.py --rnn <rnn> in this process, 4 envs x 64 steps, 2 minibatches, 2 epochs, 3 iterations (CartPole's random
    episodes last about 20 steps, so several end inside every rollout). Each minibatch update is recorded, before its
    step, with the log-probabilities and values the agent gives its inputs now, and episode_values of its sequences."""
    calls = []
    training_steps = ppo.training_steps

    def recording_training_steps(agent, optimizer, args):
        act, update = training_steps(agent, optimizer, args)

        def recording_update(obs, actions, logprobs, values, advantages, returns, valid, state=None, starts=None, spans=None):
            with torch.no_grad():
                _, newlogprob, _, newvalue, _ = agent.get_action_and_value(obs, actions, False, state, starts, spans)
            fresh, episodes = episode_values(agent, obs, valid.view(obs.shape[0], -1))
            calls.append(dict(logprobs=logprobs, values=values, valid=valid, newlogprob=newlogprob, newvalue=newvalue,
                              fresh=fresh.flatten(), episodes=episodes))  # fmt: skip
            return update(obs, actions, logprobs, values, advantages, returns, valid, state, starts, spans)

        return act, recording_update

    monkeypatch.setattr(ppo, "training_steps", recording_training_steps)
    monkeypatch.chdir(tmp_path)
    flags = [
        "--env-id", env_id, "--rnn", rnn, "--rnn-size", "16", "--num-envs", "4", "--num-steps", "64", "--num-minibatches",
        "2", "--update-epochs", "2", "--total-timesteps", "768", CPU, "--progress-interval", "1000",
    ]  # fmt: skip
    ppo.main(ppo.parse_args(flags))
    return calls


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_the_first_minibatch_of_each_update_sees_exactly_the_rollouts_probabilities(monkeypatch, tmp_path, rnn):
    """The replay from the rollout's initial state, over sequences with episode ends inside, gives back the
    log-probabilities and values the rollout acted with (ratio 1, the check of the "37 implementation details" write-up)
    on the first minibatch of every update, before any step; later minibatches have moved."""
    calls = recorded_run(monkeypatch, tmp_path, rnn)
    per_update = 2 * 2  # epochs x minibatches
    assert len(calls) == 3 * per_update
    for i, call in enumerate(calls):
        valid = call["valid"] > 0
        assert (~valid).any()  # reset steps: episodes ended inside this minibatch's sequences
        ratio = (call["newlogprob"] - call["logprobs"])[valid].exp()
        if i % per_update == 0:
            torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0)
            torch.testing.assert_close(call["newvalue"][valid], call["values"][valid], atol=1e-5, rtol=1e-5)
        else:
            assert (ratio - 1).abs().max() > 1e-4


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_the_state_is_zero_at_exactly_the_first_step_of_each_episode(monkeypatch, tmp_path, rnn):
    """The values the rollout acted with on each episode's steps, up to and including the reset step that acts on its
    last observation (a truncation's bootstrap), equal a fresh pass from a zero state over that episode alone
    (episode_values). A state zeroed one step early or late, or not at all, changes them."""
    calls = recorded_run(monkeypatch, tmp_path, rnn)
    for call in calls[::4]:  # the first minibatch of each update: the weights the rollout acted with
        known = ~call["fresh"].isnan()
        torch.testing.assert_close(call["fresh"][known], call["values"][known], atol=1e-5, rtol=1e-5)
    assert sum(call["episodes"] for call in calls[::4]) >= 6


def test_evaluation_carries_the_state_from_zeros_through_each_episode():
    """evaluate() starts from the zero state and gives each step the state the previous one returned."""
    agent = ppo.Agent(*ppo.env_spaces("CartPole-v1"), "lstm", 8)
    given, returned = [], []
    act = agent.get_action_and_value

    def watched(x, action=None, deterministic=False, state=None, starts=None, spans=None):
        given.append(state.clone())
        out = act(x, action, deterministic, state, starts, spans)
        returned.append(out[4].clone())
        return out

    agent.get_action_and_value = watched
    args = ppo.Args(env_id="CartPole-v1", eval_episodes=2, rnn="lstm", rnn_size=8)
    returns = ppo.evaluate(agent, None, args, torch.device("cpu"))
    assert len(returns) == 2 and len(given) >= 8
    assert (given[0] == 0).all() and given[0].shape == (2, 2, 8)
    for before, after in zip(given[1:], returned[:-1], strict=True):
        assert torch.equal(before, after)
    assert not (returned[-1] == 0).all()


@pytest.mark.parametrize(
    "env_id, rnn, flags",
    [
        ("CartPole-v1", "lstm", ["--total-timesteps", "1024"]),
        ("CartPole-v1", "gru", ["--total-timesteps", "1024"]),
        (
            "Pendulum-v1",
            "lstm",
            ["--total-timesteps", "2048", "--num-envs", "2", "--num-steps", "512", "--num-minibatches", "2"],
        ),
        (
            "Breakout-v5",
            "lstm",
            ["--total-timesteps", "256", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"],
        ),
    ],
)
def test_smoke_recurrent_runs_train_save_reload_and_evaluate(tmp_path, env_id, rnn, flags):
    """Vector and image observations, Discrete and Box actions: the run trains (check_run: finite logs, weights that
    moved), saves, reloads the model from disk with its memory and evaluates it."""
    run_algorithm("ppo", "--env-id", env_id, "--rnn", rnn, *flags, "--save-model", "--eval-episodes", "2", CPU, cwd=tmp_path)
    run = only_run(tmp_path)
    state = torch.load(run / "ppo.model", weights_only=False)
    assert any(k.startswith("memory.") for k in state["model"])
    assert len(scalars(run)["eval/episodic_return"]) == 2  # one per evaluation episode


def test_a_stopped_recurrent_run_resumes_with_no_gap(tmp_path):
    total, batch = 10240, 512
    flags = ["--rnn", "lstm", "--total-timesteps", str(total), "--progress-interval", "0", CPU]
    stop_run("ppo", *flags, cwd=tmp_path, at=3072)
    run = only_run(tmp_path)
    run_algorithm("ppo", "--resume", str(run / "checkpoint.pt"), cwd=tmp_path)
    steps = [s for s, _, _ in scalars(run)["charts/learning_rate"]]
    assert steps == list(range(batch, total + 1, batch))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rnn", "lstm", "--num-minibatches", "3"], r"--num-minibatches 3 does not divide --num-envs 4: with --rnn"),
        (["--rnn", "gru", "--compile"], r"--rnn gru runs eagerly.*leave out --compile"),
        (["--rnn", "rnn"], r"rnn"),
    ],
)
def test_bad_recurrent_input_gets_one_clear_line(flags, message, tmp_path):
    assert_one_error_line("ppo", run_bad_input("ppo", flags, tmp_path, "Acrobot-v1"), message)
