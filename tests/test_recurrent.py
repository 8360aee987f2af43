"""Recurrent policies (--rnn): the memory's pass over spans against a step-by-step loop, a first minibatch whose
probabilities are the rollout's, a state zeroed at exactly the first step of each episode, evaluation that carries
it, runs end to end (smoke, save and reload, stop and resume) and bad input."""

import pytest
import torch

from conftest import (
    CPU,
    assert_one_error_line,
    load_algorithm,
    load_file,
    only_run,
    run_algorithm,
    run_bad_input,
    scalars,
    stop_run,
)

ppo, a2c, rnd_ppo = load_algorithm("ppo"), load_algorithm("a2c"), load_algorithm("rnd_ppo")


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
        for s, e in zip(first_steps, [*first_steps[1:], T][: len(first_steps)], strict=True):
            with torch.no_grad():
                fresh[s:e, b] = agent.get_value(obs[s:e, b : b + 1], None, torch.zeros(e - s, 1))
            count += 1
    return fresh, count


def run_recording_updates(monkeypatch, tmp_path, module, flags: list[str], record) -> None:
    """module's main with flags, in this process, on the CPU; before each call of its update (training_steps'),
    record(agent, *the update's arguments) runs, with the weights the update starts from."""
    training_steps = module.training_steps

    def recording_training_steps(agent, optimizer, args):
        act, update = training_steps(agent, optimizer, args)

        def recording_update(*arguments):
            with torch.no_grad():
                record(agent, *arguments)
            return update(*arguments)

        return act, recording_update

    monkeypatch.setattr(module, "training_steps", recording_training_steps)
    monkeypatch.chdir(tmp_path)
    module.main(module.parse_args([*flags, CPU, "--progress-interval", "1000"]))


def recorded_run(monkeypatch, tmp_path, rnn: str):
    """ppo.py --rnn <rnn>, 4 envs x 64 steps, 2 minibatches, 2 epochs, 3 iterations (CartPole's random episodes last
    about 20 steps, so several end inside every rollout). Each minibatch update is recorded, before its step, with the
    log-probabilities and values the agent gives its inputs now, and episode_values of its sequences."""
    calls = []

    def record(agent, mb, memory):
        _, newlogprob, _, newvalue, _ = agent.get_action_and_value(mb["obs"], mb["actions"], **memory)
        fresh, episodes = episode_values(agent, mb["obs"], mb["valid"].view(mb["obs"].shape[0], -1))
        calls.append(dict(logprobs=mb["logprobs"], values=mb["values"], valid=mb["valid"], newlogprob=newlogprob,
                          newvalue=newvalue, fresh=fresh.flatten(), episodes=episodes))  # fmt: skip

    flags = [
        "--env-id", "CartPole-v1", "--rnn", rnn, "--rnn-size", "16", "--num-envs", "4", "--num-steps", "64",
        "--num-minibatches", "2", "--update-epochs", "2", "--total-timesteps", "768",
    ]  # fmt: skip
    run_recording_updates(monkeypatch, tmp_path, ppo, flags, record)
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


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_a2c_replays_each_rollout_with_the_state_zeroed_at_exactly_each_episodes_first_step(monkeypatch, tmp_path, rnn):
    """a2c.py's update replays the whole rollout from the state it started with (carried over from the rollout
    before): before the step, the values of that replay on each episode's steps (episodes found from the reset steps
    alone) equal a fresh pass from a zero state over that episode alone, for 3 rollouts of 16 steps whose episodes
    cross rollout boundaries."""
    checked = []

    def record(agent, batch, memory):
        obs, valid = batch["obs"], batch["valid"]
        replayed = agent.get_value(obs, memory["state"], memory["starts"])
        fresh, episodes = episode_values(agent, obs, valid.view(obs.shape[0], -1))
        known = ~fresh.flatten().isnan()
        torch.testing.assert_close(fresh.flatten()[known], replayed[known], atol=1e-5, rtol=1e-5)
        checked.append(episodes)

    flags = ["--env-id", "CartPole-v1", "--rnn", rnn, "--rnn-size", "16", "--num-envs", "4", "--num-steps", "16",
             "--total-timesteps", "192"]  # fmt: skip
    run_recording_updates(monkeypatch, tmp_path, a2c, flags, record)
    assert len(checked) == 3 and sum(checked) >= 4, checked


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


RND_TINY = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--num-iterations-obs-norm-init", "1",
            "--max-episode-steps", "40", "--total-timesteps", "256"]  # fmt: skip


@pytest.mark.parametrize(
    "script, env_id, rnn, flags",
    [
        ("ppo", "CartPole-v1", "lstm", ["--total-timesteps", "1024"]),
        ("ppo", "CartPole-v1", "gru", ["--total-timesteps", "1024"]),
        (
            "ppo",
            "Pendulum-v1",
            "lstm",
            ["--total-timesteps", "2048", "--num-envs", "2", "--num-steps", "512", "--num-minibatches", "2"],
        ),
        (
            "ppo",
            "Breakout-v5",
            "lstm",
            ["--total-timesteps", "256", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"],
        ),
        ("a2c", "CartPole-v1", "lstm", ["--total-timesteps", "1024"]),
        ("a2c", "Pendulum-v1", "gru", ["--total-timesteps", "1024"]),
        ("rnd_ppo", "Breakout-v5", "lstm", RND_TINY),
        ("rnd_ppo", "Breakout-v5", "gru", [*RND_TINY, "--chunk-size", "64"]),
    ],
)
def test_smoke_recurrent_runs_train_save_reload_and_evaluate(tmp_path, script, env_id, rnn, flags):
    """Vector and image observations, Discrete and Box actions, in the three files: the run trains (check_run: finite
    logs, weights that moved), saves, reloads the model from disk with its memory and evaluates it."""
    run_algorithm(script, "--env-id", env_id, "--rnn", rnn, *flags, "--save-model", "--eval-episodes", "2", CPU, cwd=tmp_path)
    run = only_run(tmp_path)
    state = load_file(run / f"{script}.model")
    assert any(k.startswith("memory.") for k in state["model"])
    if script == "ppo" and env_id == "Breakout-v5":  # the recurrent Atari preset sees one frame per observation
        assert state["model"]["encoder.0.weight"].shape[1] == 1 and state["args"]["frame_stack"] == 1
    assert len(scalars(run)["eval/episodic_return"]) == 2  # one per evaluation episode


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_rnd_minibatches_replay_whole_envs_and_see_the_rollouts_probabilities(rnn):
    """rnd_ppo.py's minibatches with memory: groups of whole envs, each chunk (a smaller group) with its rows of the
    minibatch, time first; replayed from the rollout's initial state, each chunk gives back the log-probabilities and
    values the step-by-step rollout acted with, episode starts inside included."""
    torch.manual_seed(0)
    spec = rnd_ppo.envpool.make_spec("Breakout-v5")
    agent = rnd_ppo.Agent(spec.observation_space, spec.action_space, rnn, 16)
    T, N = 6, 4
    obs = torch.randint(0, 255, (T, N) + spec.observation_space.shape, dtype=torch.uint8)
    starts = (torch.rand(T, N) < 0.3).float()
    state0 = state = torch.randn(2 if rnn == "lstm" else 1, N, 16)
    logprobs, values = torch.zeros(T, N), torch.zeros(T, N)
    with torch.no_grad():
        for t in range(T):
            action, logprobs[t], values[t], _, state = agent.act(obs[t], False, state, starts[t])
    args = rnd_ppo.Args(num_envs=N, num_steps=T, num_minibatches=2, chunk_size=T, update_proportion=0.5)
    args.batch_size, args.minibatch_size = T * N, T * N // 2
    memory = (state0, starts, rnd_ppo.memory_spans(starts.numpy() > 0))
    seen = []
    for mb, chunks, chosen in rnd_ppo.minibatches(args, torch.device("cpu"), memory):
        assert len(mb) == T * 2 and len(chosen) == T and set(chosen.tolist()) <= set(mb.tolist())
        for c, rows, seq in chunks:
            assert torch.equal(mb[rows], c) and len(c) == T  # one env per chunk: chunk_size T
            with torch.no_grad():
                logits, ext_value, _, _ = agent(obs.flatten(0, 1)[c].unflatten(0, (T, -1)), *seq)
            env = int(c[0]) % N
            assert (c % N == env).all() and torch.equal(c // N, torch.arange(T))
            torch.testing.assert_close(ext_value, values[:, env], atol=1e-5, rtol=1e-5)
            seen.append(env)
    assert sorted(seen) == list(range(N))


def test_the_recurrent_part_reads_the_same_in_the_three_files():
    """ppo.py and a2c.py have one Agent; rnd_ppo.py's differs in its trunk and heads, and shares the memory's
    methods word for word (the recurrent functions themselves are held by test_shared_code)."""
    import inspect

    assert inspect.getsource(ppo.Agent) == inspect.getsource(a2c.Agent)
    for method in ("initial_state", "hidden"):
        assert inspect.getsource(getattr(ppo.Agent, method)) == inspect.getsource(getattr(rnd_ppo.Agent, method)), method
    for name in ("recurrent_layer", "zero_state", "memory_features", "run_memory", "memory_spans"):
        assert (
            inspect.getsource(getattr(ppo, name))
            == inspect.getsource(getattr(a2c, name))
            == inspect.getsource(getattr(rnd_ppo, name))
        )


def test_a_stopped_recurrent_run_resumes_with_no_gap(tmp_path):
    total, batch = 10240, 8 * 32  # the recurrent preset's envs x steps
    flags = ["--rnn", "lstm", "--total-timesteps", str(total), "--progress-interval", "0", CPU]
    stop_run("ppo", *flags, cwd=tmp_path, at=3072)
    run = only_run(tmp_path)
    run_algorithm("ppo", "--resume", str(run / "checkpoint.pt"), cwd=tmp_path)
    steps = [s for s, _, _ in scalars(run)["charts/learning_rate"]]
    assert steps == list(range(batch, total + 1, batch))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rnn", "lstm", "--num-minibatches", "3"], r"--num-minibatches 3 does not divide --num-envs 8: with --rnn"),
        (["--rnn", "gru", "--compile"], r"--compile is for runs without --rnn.*; leave it out"),
        (["--rnn", "rnn"], r"rnn"),
        (["--rnn", "lstm", "--frame-stack", "1"], r"--frame-stack is for envpool's Atari ids, and \S+ is not one"),
    ],
)
def test_bad_recurrent_input_gets_one_clear_line(flags, message, tmp_path):
    assert_one_error_line("ppo", run_bad_input("ppo", flags, tmp_path, "Acrobot-v1"), message)


@pytest.mark.parametrize(
    "script, flags, message",
    [
        ("a2c", ["--rnn", "lstm", "--compile"], r"--compile and --cudagraphs compile .*; leave them out with --rnn"),
        ("rnd_ppo", ["--rnn", "lstm", "--compile"], r"--compile runs a feed-forward policy in one process"),
        ("rnd_ppo", ["--rnn", "lstm", "--num-envs", "6", "--num-minibatches", "4"], r"--num-minibatches 4 does not divide"),
    ],
)
def test_bad_recurrent_input_of_a2c_and_rnd_gets_one_clear_line(script, flags, message, tmp_path):
    assert_one_error_line(script, run_bad_input(script, flags, tmp_path, "Pong-v5"), message)


def test_rnn_takes_the_recurrent_preset_and_a_given_flag_still_wins():
    """--rnn lstm on a classic env starts from RNN_PRESETS["classic"] (every key a real flag), on an Atari env from the
    atari preset with one frame; a flag on the command line wins over it; without --rnn, or on a family with no
    recurrent preset, the family's defaults stay."""
    preset = ppo.RNN_PRESETS["classic"]
    assert all(set(p) <= {f.name for f in ppo.dataclasses.fields(ppo.Args)} for p in ppo.RNN_PRESETS.values())
    args = ppo.parse_args(["--env-id", "CartPole-v1", "--rnn", "lstm"])
    assert all(getattr(args, k) == v for k, v in preset.items())
    assert ppo.parse_args(["--env-id", "CartPole-v1", "--rnn", "gru", "--num-envs", "4"]).num_envs == 4
    assert ppo.parse_args(["--env-id", "CartPole-v1"]).num_envs == ppo.Args.num_envs
    breakout = ppo.parse_args(["--env-id", "Breakout-v5", "--rnn", "lstm"])
    assert breakout.frame_stack == 1 and breakout.num_envs == ppo.PRESETS["atari"]["num_envs"]
    assert ppo.parse_args(["--env-id", "Breakout-v5"]).frame_stack == 4
    pendulum = ppo.parse_args(["--env-id", "Pendulum-v1", "--rnn", "lstm"])
    assert pendulum.num_envs == ppo.PRESETS["mujoco"]["num_envs"] and pendulum.rnn_size == ppo.Args.rnn_size
