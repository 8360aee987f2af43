"""ppg_procgen.py: the auxiliary loss and the clipped policy loss against hand computations, the auxiliary phase's
mechanism, the phase buffer's contents, runs end to end (save + reload, seeds, bad input, stop and resume)."""

import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import (
    CPU,
    ROOT,
    SMOKE_FLAGS,
    SMOKE_TIMEOUT,
    assert_one_error_line,
    flat_params,
    load_algorithm,
    load_file,
    one_thread,
    only_run,
    run_algorithm,
    run_bad_input,
    run_in_process,
    scalars,
    stop_run,
)

ppg = load_algorithm("ppg_procgen")

# a tiny configuration: 4 envs x 32 steps, phases of 2 policy iterations, one auxiliary epoch (on the machine's device)
TINY = SMOKE_FLAGS["ppg_procgen"]
TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/policy_phase_SPS",
    "charts/learning_rate",
    "charts/phase",
    "charts/aux_epoch_seconds",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "losses/aux_value_loss",
    "losses/bc_kl",
    "losses/aux_true_value_loss",
    "eval/episodic_return",
}


def small_agent(seed=0, arch="dual"):
    torch.manual_seed(seed)
    spec = ppg.envpool.make_spec("StarpilotEasy-v0")
    return ppg.Agent(spec.observation_space, spec.action_space, arch)


def frames(n, seed=0):
    """n real Starpilot frames (random actions), uint8 (n, 3, 64, 64)."""
    envs = ppg.make_env("StarpilotEasy-v0", 1, seed)
    obs, _ = envs.reset()
    out, rng = [obs[0]], np.random.default_rng(seed)
    while len(out) < n:
        obs = envs.step(rng.integers(0, 15, 1))[0]
        out.append(obs[0])
    envs.close()
    return torch.as_tensor(np.stack(out))


# ---------------------------------------------------------------------------------------------------------------
# The losses against hand computations
# ---------------------------------------------------------------------------------------------------------------
def log_softmax(row):
    top = max(row)
    z = math.log(sum(math.exp(x - top) for x in row)) + top
    return [x - z for x in row]


def test_kl_term_is_zero_and_flat_when_the_policy_has_not_moved():
    logits = torch.randn(8, 15, dtype=torch.float64, requires_grad=True)
    kl = ppg.categorical_kl(logits.detach(), logits)
    assert torch.all(kl.abs() < 1e-12)
    kl.sum().backward()
    assert torch.all(logits.grad.abs() < 1e-12)  # the clone term does not pull an unmoved policy anywhere
    moved = ppg.categorical_kl(logits.detach(), logits.detach() + torch.randn(8, 15, dtype=torch.float64))
    assert torch.all(moved > 0)


def test_normed_init_and_the_impala_cnn_shape():
    agent = small_agent()
    for layer in agent.modules():
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            norms = layer.weight.flatten(1).norm(dim=1)
            assert torch.allclose(norms, norms[0].expand_as(norms), rtol=1e-5) and (layer.bias == 0).all()
    assert torch.allclose(agent.actor.weight.norm(dim=1), torch.full((15,), 0.1))
    assert torch.allclose(agent.policy_net[-2].weight.norm(dim=1), torch.full((256,), 1.4))
    logits, aux_value = agent.policy(frames(3))
    assert logits.shape == (3, 15) and aux_value.shape == (3,) and agent.value(frames(3)).shape == (3,)


def test_one_pass_gives_what_policy_and_value_give_and_detach_keeps_value_gradients_off_the_policy_features():
    x = frames(4)
    for arch in ("dual", "detach"):
        agent = small_agent(arch=arch)
        logits, aux_value, value = agent(x)
        torch.testing.assert_close((logits, aux_value), agent.policy(x))
        torch.testing.assert_close(value, agent.value(x))
        value.sum().backward()
        assert agent.critic.weight.grad.abs().sum() > 0
        assert all(p.grad is None for p in agent.policy_net.parameters())  # the value loss never reaches the policy CNN
    assert agent.value_net is None and sum(p.numel() for p in agent.parameters()) < sum(
        p.numel() for p in small_agent().parameters()
    )


def test_chunks_give_the_gradient_of_the_whole_minibatch():
    """The auxiliary step in chunks of 5 observations leaves the same weights as one pass over the minibatch."""
    obs, results = frames(24).reshape(2, 12, 1, 3, 64, 64), []
    for chunk in (5, 24):
        agent = small_agent()
        phase = dict(
            obs=obs, returns=torch.linspace(-1, 1, 24).reshape(2, 12, 1), valid=torch.ones(2, 12, 1),
            old_logits=torch.randn(2, 12, 1, 15, generator=torch.Generator().manual_seed(0)),
        )  # fmt: skip
        phase["valid"][0, 3] = 0
        args = ppg.Args(chunk_size=chunk, num_envs=1)
        opt = torch.optim.SGD(agent.parameters(), lr=0.1)
        ppg.aux_update(ppg.training_steps(agent, opt, opt, args), phase, torch.tensor([0, 1]), torch.tensor([0, 0]), args)
        results.append(torch.cat([p.flatten() for p in agent.parameters()]))
    assert torch.allclose(results[0], results[1], atol=1e-6)


def compiled_and_eager_steps(obs: torch.Tensor, compiled: bool):
    """Both phases' updates through training_steps on 8 frames (2 chunks of 4 per minibatch, 2 optimiser steps each),
    from the same weights; returns the acting step's outputs, the loss terms and the weights."""
    agent, gen = small_agent(), torch.Generator().manual_seed(0)
    args = ppg.Args(compile=compiled, num_envs=1, num_minibatches=1, update_epochs=2, chunk_size=4)
    args.batch_size = args.minibatch_size = 8
    lr = torch.tensor(5e-4) if compiled else 5e-4  # as main: a tensor rate when compiled
    # eps 1e-3: with the default 1e-8, Adam's first step is lr * sign(g) wherever |g| > 1e-7, so a float-rounding
    # difference on a gradient that is 0 but for rounding (a few dozen of 1.2M weights here) flips a whole step
    optimizer, aux_optimizer = (torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-3) for _ in range(2))
    steps = ppg.training_steps(agent, optimizer, aux_optimizer, args)
    with torch.no_grad():
        acted = [x.clone() for x in steps["act"](obs)]
    valid = torch.ones(8)
    valid[3] = 0
    batch = dict(
        obs=obs, actions=torch.randint(0, 15, (8,), generator=gen), logprobs=-2.7 + 0.1 * torch.randn(8, generator=gen),
        advantages=torch.randn(8, generator=gen), returns=torch.randn(8, generator=gen), valid=valid,
    )  # fmt: skip
    torch.manual_seed(1)  # the minibatch permutation
    policy_stats = ppg.policy_update(steps, batch, args)
    phase = dict(
        obs=obs.reshape(2, 4, 1, 3, 64, 64), returns=batch["returns"].reshape(2, 4, 1), valid=valid.reshape(2, 4, 1),
        old_logits=torch.randn(2, 4, 1, 15, generator=gen),
    )  # fmt: skip
    aux_sums = [ppg.aux_update(steps, phase, torch.tensor([1, 0]), torch.tensor([0, 0]), args) for _ in range(2)]
    weights = flat_params(agent)
    return acted, torch.cat([torch.stack(list(policy_stats.values())), *aux_sums]), weights


def test_compiled_steps_give_what_the_eager_ones_give():
    """--compile: from the same weights and batch, the compiled policy-phase and auxiliary updates (chunks whose
    gradients add up, Adam steps, the rate a tensor) give the eager updates' loss terms and weights, and the compiled
    acting step the eager network's log-probability and value of the actions it samples. Random frames: Procgen's flat
    regions give equal maxima in the max-pools, whose gradient eager and inductor hand to different (equally valid)
    entries, which moved 0.1% of the weights by up to 1e-4 with real frames."""
    obs = torch.randint(0, 256, (8, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    eager_acted, eager_stats, eager_weights = compiled_and_eager_steps(obs, compiled=False)
    acted, stats, weights = compiled_and_eager_steps(obs, compiled=True)
    torch.testing.assert_close(stats, eager_stats, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, eager_weights, rtol=1e-5, atol=1e-5)
    action, logprob, value = acted
    _, eager_logprob, eager_value = eager_acted
    eager_logits = small_agent()(obs)[0].detach()  # the weights the acting step saw
    torch.testing.assert_close(
        logprob, eager_logits.log_softmax(-1).gather(1, action[:, None]).squeeze(1), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(value, eager_value, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# The auxiliary phase's mechanism
# ---------------------------------------------------------------------------------------------------------------
def aux_phase_on_a_fixed_batch(beta_clone: float, epochs: int = 40):
    """run_aux_phase on 2 rollouts of 16 real frames with fixed random value targets; returns (aux-value error before,
    after, value error before, after, mean KL to the pre-phase policy after)."""
    agent = small_agent()
    obs = frames(32).reshape(2, 16, 1, 3, 64, 64).transpose(0, 1).reshape(16, 2, 3, 64, 64)[None]  # (1, T=16, N=2)
    returns = torch.randn(1, 16, 2, generator=torch.Generator().manual_seed(1))
    phase = dict(obs=obs, returns=returns, valid=torch.ones(1, 16, 2))
    args = ppg.Args(num_envs=2, e_aux=epochs, aux_rollouts=1, beta_clone=beta_clone, chunk_size=64, progress_interval=1e9)
    flat = obs.reshape(-1, 3, 64, 64)

    def errors():
        with torch.no_grad():
            logits, aux_value = agent.policy(flat)
            target = returns.flatten()
            return ((aux_value - target) ** 2).mean().item(), ((agent.value(flat) - target) ** 2).mean().item(), logits

    aux_before, v_before, old_logits = errors()
    state = dict(epoch=0, done=0, phase=1, old_logits=ppg.old_policy_logits(agent, obs, 64))
    assert torch.allclose(state["old_logits"], old_logits, atol=1e-5)
    optimizer = torch.optim.Adam(agent.parameters(), lr=5e-4)
    steps = ppg.training_steps(agent, optimizer, optimizer, args)
    assert ppg.run_aux_phase(steps, phase, state, args, [], DummyWriter(), 0) is None
    aux_after, v_after, new_logits = errors()
    return aux_before, aux_after, v_before, v_after, ppg.categorical_kl(old_logits, new_logits).mean().item()


class DummyWriter:
    def __init__(self):
        self.logged = {}

    def add_scalar(self, tag, value, step):
        self.logged[tag] = value


def test_aux_phase_fits_the_value_targets_while_the_policy_stays_close():
    """The joint loss is L = 0.5 E(V_aux - R)^2 + beta KL(pi_old || pi) + 0.5 E(V - R)^2 and starts with KL = 0. When the
    phase ends with a lower joint loss (asserted), beta KL_end <= L_start - (value terms at the end) <= value terms at
    the start, so KL_end <= (0.5 aux error + 0.5 value error at the start) / beta: the bound asserted. Without the clone
    term (beta 0) nothing holds the policy, and it moves further. Measured (4 rollouts, 40 epochs): squared errors 1.03 and
    1.02 fall to 0.024 and 0.010, KL 9e-5 with beta 1 against 0.011 with beta 0."""
    aux_before, aux_after, v_before, v_after, kl = aux_phase_on_a_fixed_batch(beta_clone=1.0)
    assert aux_after < 0.25 * aux_before and v_after < 0.25 * v_before
    assert 0.5 * aux_after + kl + 0.5 * v_after < 0.5 * aux_before + 0.5 * v_before  # the joint loss fell
    assert kl <= 0.5 * (aux_before + v_before) - 0.5 * (aux_after + v_after)
    kl_unheld = aux_phase_on_a_fixed_batch(beta_clone=0.0)[-1]
    assert kl < kl_unheld


# ---------------------------------------------------------------------------------------------------------------
# The phase buffer, through a real run in this process
# ---------------------------------------------------------------------------------------------------------------
def test_phase_buffer_holds_every_frame_the_policy_saw_in_order(tmp_path, monkeypatch):
    """Record every observation the envs return and every phase buffer the auxiliary phase receives: slot i, step t,
    env e holds the frame env e showed at iteration i's step t, reset steps included (the reference's gym3 envs have no
    reset step: their done step already shows the next level's first frame; here the reset step's frame, the ended
    level's last, is kept and masked out by `valid`)."""
    seen, phases = [], []
    make_env, run_aux_phase = ppg.make_env, ppg.run_aux_phase

    class Recorder:
        def __init__(self, envs):
            self.envs = envs

        def reset(self):
            obs, info = self.envs.reset()
            seen.append(obs.copy())
            return obs, info

        def step(self, action):
            out = self.envs.step(action)
            seen.append(out[0].copy())
            return out

        def __getattr__(self, name):
            return getattr(self.envs, name)

    def recording_make_env(env_id, num_envs, seed, *levels):
        envs = make_env(env_id, num_envs, seed, *levels)
        return Recorder(envs) if num_envs == 3 else envs

    def recording_aux(steps, phase, state, *rest):
        phases.append({k: v.clone() for k, v in phase.items()})
        return run_aux_phase(steps, phase, state, *rest)

    monkeypatch.setattr(ppg, "make_env", recording_make_env)
    monkeypatch.setattr(ppg, "run_aux_phase", recording_aux)
    flags = ["--env-id", "BigfishEasy-v0", "--num-envs", "3", "--num-steps", "60", "--num-minibatches", "1"]
    # on the CPU: the phase buffers are read here as numpy arrays
    flags += ["--n-pi", "2", "--e-aux", "1", "--total-timesteps", str(3 * 60 * 5), CPU, "--progress-interval", "1e9"]
    proc = run_in_process("ppg_procgen", lambda m: m.main(m.parse_args(flags)), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(phases) == 2  # after iterations 2 and 4, not after the last (5)
    seen = np.stack(seen)  # (1 + 5 * 60, 3, 3, 64, 64): the first reset, then one per step
    for p, phase in enumerate(phases):
        for slot in range(2):
            first = (2 * p + slot) * 60
            np.testing.assert_array_equal(phase["obs"][slot].numpy(), seen[first : first + 60])
    valid = torch.cat([ph["valid"].reshape(-1, 3) for ph in phases]).numpy()
    assert (valid == 0).any()  # some reset steps happened (Bigfish's random episodes are short), so the check bites


def test_help_shows_the_id_a_game_name_runs(tmp_path):
    proc = run_in_process("ppg_procgen", lambda module: module.parse_args(["--env-id", "bigfish", "--help"]), tmp_path)
    assert proc.returncode == 0 and "(default: BigfishEasy-v0)" in " ".join(proc.stdout.split()), proc.stdout


# ---------------------------------------------------------------------------------------------------------------
# Runs end to end
# ---------------------------------------------------------------------------------------------------------------
def test_smoke_trains_saves_reloads_evaluates_and_anneals_over_the_whole_run(tmp_path):
    flags = [*TINY, "--total-timesteps", "768", "--save-model", "--anneal-lr", "--eval-every", "384", "--eval-episodes", "2"]
    proc = run_algorithm("ppg_procgen", "--env-id", "bigfish", *flags, "--capture-video", cwd=tmp_path)
    assert "--env-id bigfish runs envpool's BigfishEasy-v0" in proc.stdout
    run = only_run(tmp_path)
    assert "BigfishEasy-v0__ppg_procgen" in run.name
    logged = scalars(run)
    assert TAGS <= set(logged)
    # 6 iterations of 128 steps: auxiliary phases after iterations 2 and 4
    assert [s for s, _, _ in logged["losses/bc_kl"]] == [256, 512]
    assert [v for _, v, _ in logged["charts/phase"]] == [1, 1, 2, 2, 3, 3]
    # the learning rate falls over the whole run, not restarting at each phase (CleanRL's ppg_procgen.py anneals with
    # the iteration within the phase, so its rate goes back up at every phase)
    lrs = [v for _, v, _ in logged["charts/learning_rate"]]
    np.testing.assert_allclose(lrs, [5e-4 * (1 - i / 6) for i in range(6)], rtol=1e-6)
    model = load_file(run / "ppg_procgen.model")
    assert model["args"]["env_id"] == "BigfishEasy-v0" and "critic.weight" in model["model"]
    assert f"model: {run.relative_to(tmp_path) / 'ppg_procgen.model'}" in proc.stdout
    assert {p.name for p in (run / "videos").iterdir()} == {"eval_384.mp4", "eval_768.mp4", "final.mp4"}


def test_detach_architecture_trains_saves_and_reloads(tmp_path):
    proc = run_algorithm("ppg_procgen", *TINY, "--arch", "detach", "--total-timesteps", "512", "--save-model", cwd=tmp_path)
    model = load_file(only_run(tmp_path) / "ppg_procgen.model")
    assert model["args"]["arch"] == "detach" and not any(k.startswith("value_net.") for k in model["model"])
    assert "ppg_procgen.model: mean return" in proc.stdout


def stop_when(flags, cwd, starts_with: str) -> str:
    """conftest.stop_run for a line that is not a step count (the auxiliary phase's): SIGTERM when a line starts with
    `starts_with`; the run checkpoints and exits 128 + 15."""
    cmd = [sys.executable, str(ROOT / "algorithms" / "ppg_procgen.py"), *flags]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True, env=one_thread(None))
    for line in proc.stdout:
        if line.startswith(starts_with):
            proc.send_signal(signal.SIGTERM)
            break
    out, _ = proc.communicate(timeout=SMOKE_TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    return out


def test_a_resume_whose_phase_frames_are_gone_is_refused_before_anything_is_written(tmp_path):
    """The checkpoint at the run's end keeps the frames of its unfinished phase beside it; with them gone, the resume is
    refused in one line, and the run directory is left as it was (no second events file)."""
    run_algorithm("ppg_procgen", *TINY, CPU, "--total-timesteps", "384", "--checkpoint-every", "384", cwd=tmp_path)
    run = only_run(tmp_path)
    for frames in run.glob("phase_*.u8"):
        frames.unlink()
    before = sorted(p.name for p in run.iterdir())
    flags = ["--resume", str(run / "checkpoint.pt"), "--total-timesteps", "512"]
    proc = run_bad_input("ppg_procgen", flags, tmp_path, "BigfishEasy-v0")
    assert_one_error_line("ppg_procgen", proc, r"the checkpoint's phase frames .* are missing; resume from")
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.parametrize("where, device", [("step 256/", []), ("auxiliary phase 2:", [CPU])])
def test_a_stop_mid_phase_or_inside_the_auxiliary_phase_resumes_without_losing_or_repeating_steps(where, device, tmp_path):
    """A stop at iteration 2 of phase 2 (its first slot's frames go beside the checkpoint) or inside phase 2's
    auxiliary phase (all of the phase's frames, the old policy's logits and the minibatch reached). The stop inside
    the auxiliary phase runs on the CPU: the signal must land before the phase's 8 minibatches end, timing measured
    there (a GPU may finish them first)."""
    flags = [*TINY, *device, "--total-timesteps", "1024", "--progress-interval", "0", "--aux-rollouts", "1"]
    if where.startswith("step"):
        stop_run("ppg_procgen", *flags, cwd=tmp_path, at=384)
    else:
        stop_when(flags, tmp_path, where)
    run = only_run(tmp_path)
    ckpt = load_file(run / "checkpoint.pt")
    (saved,) = ckpt["phase"]  # one process's
    if where.startswith("step"):
        # the signal lands at the end of iteration 3, or, when it comes a moment late, in the auxiliary phase after 4
        assert ckpt["iteration"] in (3, 4) and saved["filled"] == (ckpt["iteration"] - 1) % 2 + 1
    else:
        assert ckpt["iteration"] == 4 and 1 <= ckpt["aux"][0]["done"] < 8 and saved["filled"] == 2
    assert (run / saved["file"]).stat().st_size == saved["filled"] * 128 * 3 * 64 * 64
    out = run_algorithm("ppg_procgen", "--resume", str(run / "checkpoint.pt"), cwd=tmp_path).stdout
    assert f"resumed {run.relative_to(tmp_path)}" in out
    logged = scalars(run)
    assert [s for s, _, _ in logged["charts/phase"]] == list(range(128, 1025, 128))  # each iteration once
    assert [s for s, _, _ in logged["losses/bc_kl"]] == [256, 512, 768]  # each auxiliary phase once
    assert not list(run.glob("phase_*.u8"))  # frames kept for a resume are removed when the run ends
