"""benchmark/studies/lockstep.py without CleanRL: its scripted env against the envpool API each side calls, and the
harness run on ppo.py against copies of itself: an unchanged copy matches to the bit (the same data, weights and draws
reach both sides), a planted change in the loss is reported as DIFFERS at the first step, and a network of another shape
is refused before its weights are copied; and the study's own check of itself: at its pushed learning rate the ratio,
the value change and the gradient norm pass their clips, and its planted one-sided policy clip is reported as differing
(each pair's planted change still finds its line in ours). Also the pieces the DQN and TD3 pairs add: CleanRL's twin
critics laid out as ours' batched ones, the layers a ReLU's kink may reach, and the stacked frames of the Atari DQN
pair; and those of the PPG and RND pairs: procgen's frames as each side reads them, the edits and replaced functions
that make ours' departures CleanRL's, one optimiser over two modules, and RND's fixed target network."""

import shutil
import sys
import urllib.error
import urllib.request

import envpool
import numpy as np
import pytest
import torch

from benchmark.studies import lockstep
from conftest import ROOT, load_algorithm

SPEC = lockstep.PAIRS["ppo-atari"][3]


def test_the_scripted_pool_speaks_envpools_gymnasium_api_as_breakout_does():
    real = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=2, seed=0)
    scripted = lockstep.ScriptedPool(SPEC, 2, "gymnasium")
    assert scripted.observation_space == real.observation_space and scripted.action_space == real.action_space
    obs, real_obs = scripted.reset()[0], real.reset()[0]
    assert obs.shape == real_obs.shape and obs.dtype == real_obs.dtype
    for out, real_out in ((scripted.step(np.zeros(2)), real.step(np.zeros(2, dtype=np.int32))),):
        assert len(out) == len(real_out) == 5
        for mine, theirs in zip(out[:4], real_out[:4], strict=True):
            assert mine.shape == theirs.shape and mine.dtype.kind == theirs.dtype.kind
        for key in ("reward", "terminated", "lives", "env_id"):  # what ppo.py and CleanRL's wrapper read
            assert out[4][key].shape == real_out[4][key].shape and out[4][key].dtype.kind == real_out[4][key].dtype.kind
        assert not (out[2] | out[3]).any() and (out[4]["lives"] > 0).all()  # no episode ends


def test_the_old_gym_api_gives_the_same_data_as_the_gymnasium_one():
    new, old = lockstep.ScriptedPool(SPEC, 3, "gymnasium"), lockstep.ScriptedPool(SPEC, 3, "gym")
    np.testing.assert_array_equal(new.reset()[0], old.reset())
    for _ in range(3):
        obs, reward, term, trunc, info = new.step(np.ones(3))
        old_obs, old_reward, done, old_info = old.step(np.ones(3))
        np.testing.assert_array_equal(obs, old_obs)
        np.testing.assert_array_equal(reward, old_reward)
        np.testing.assert_array_equal(term | trunc, done)
        np.testing.assert_array_equal(info["reward"], old_info["reward"])
    frames = [lockstep.scripted_frames(step, 3, SPEC["obs_shape"]) for step in (1, 2)]
    assert not np.array_equal(*frames)  # the frames change from step to step


# 2 iterations of 4 envs x 32 steps, 2 epochs of 2 minibatches: 8 optimiser steps, at the learning rate the study's PPO
# pairs take in their first scenario (ten times the atari preset's), where ratios leave the clip range
FLAGS = ["--env-id", "Breakout-v5", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
FLAGS += ["--total-timesteps", "256", "--learning-rate", "0.0025", "--no-cuda"]


def planted(tmp_path, name: str, old: str, new: str):
    """A copy of ppo.py with one change."""
    text = (ROOT / "algorithms" / "ppo.py").read_text()
    assert text.count(old) == 1, old
    folder = tmp_path / name
    folder.mkdir()
    (folder / "ppo.py").write_text(text.replace(old, new))
    return folder / "ppo.py"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An unchanged copy of ppo.py, run as the reference side once, with episode ends."""
    tmp = tmp_path_factory.mktemp("lockstep")
    (tmp / "copy").mkdir()
    shutil.copy(ROOT / "algorithms" / "ppo.py", tmp / "copy" / "ppo.py")
    record = tmp / "reference.pt"
    failed = lockstep.side_process("reference", "ppo-atari", tmp / "copy" / "ppo.py", FLAGS, record, None, "", ends=True)
    assert not failed, failed
    return record


def ours(script, reference, tmp_path, same=()) -> str:
    """Our side against the reference, both with episode ends (scenario 2's data, which holds scenario 1's)."""
    failed = lockstep.side_process("ours", "ppo-atari", script, FLAGS, tmp_path / "ours.pt", reference, "", True, same)
    return failed or lockstep.pair_line("ppo-atari", tmp_path / "ours.pt", reference)


def test_an_unchanged_copy_matches_to_the_bit(reference, tmp_path):
    line = ours(ROOT / "algorithms" / "ppo.py", reference, tmp_path)
    assert line == "ppo-atari: max difference 0 after 8 optimiser steps: match", line


def test_ours_with_its_differences_made_cleanrls_differs_from_an_unchanged_copy(reference, tmp_path):
    """make_same reaches ppo.py's maths (scenario 2 of the CleanRL pairs rests on it): with truncations bootstrapped as
    terminations and the reset step learned from, ppo.py is no longer its own copy once the data holds both."""
    line = ours(ROOT / "algorithms" / "ppo.py", reference, tmp_path, same=list(lockstep.PAIRS["ppo-atari"][5]))
    assert line.startswith("ppo-atari: DIFFERS at step "), line


def test_with_ends_the_step_after_an_end_is_envpools_reset_step():
    pool, ended, counts = lockstep.ScriptedPool(dict(SPEC, ends=True), 8, "gymnasium"), np.zeros(8, dtype=bool), [0, 0]
    pool.reset()
    for _ in range(300):
        _, reward, term, trunc, info = pool.step(np.zeros(8))
        assert not (term | trunc)[ended].any() and (reward[ended] == 0).all()  # the reset step: no end, reward 0
        np.testing.assert_array_equal(info["terminated"], term)  # every termination a game over
        ended, counts = term | trunc, [counts[0] + term.sum(), counts[1] + trunc.sum()]
    assert counts[0] > 50 and counts[1] > 20, counts  # both kinds of end, often (about 3.5% and 1.5% of env steps)


def test_a_planted_change_in_the_loss_differs_at_the_first_step(reference, tmp_path):
    script = planted(tmp_path, "planted", "v_loss = 0.5 * masked_mean(torch.max(", "v_loss = 0.55 * masked_mean(torch.max(")
    line = ours(script, reference, tmp_path)
    assert line.startswith("ppo-atari: DIFFERS at step 1, "), line


def test_the_planted_one_sided_policy_clip_differs_where_the_scenario_reaches_the_clips(reference, tmp_path):
    """The study's planted change of ppo.py's clip (PLANTED, the PPO pairs') against an unchanged copy: at the pushed
    learning rate (FLAGS) the ratio, the value change and the gradient norm pass their clips (install_reach), and the
    planted copy is reported as differing, stopping there. At the preset's own learning rate the ratio never leaves its
    range and the planted change matches: a match then says nothing about the clip."""
    reach = torch.load(reference, weights_only=True)["reach"]
    (ratio_out, ratio_all), (value_out, value_all) = reach["clamps"][(0.9, 1.1)], reach["clamps"][(-0.1, 0.1)]
    assert ratio_all == value_all == 256 * 2 and ratio_out > 0 and value_out > 0, lockstep.reach_text(reach)
    assert any(norm > bound for norm, bound in reach["norms"]) and len(reach["norms"]) == 8, reach["norms"]
    script, mine = ROOT / "algorithms" / "ppo.py", tmp_path / "planted.pt"
    failed = lockstep.side_process("ours", "ppo-atari", script, FLAGS, mine, reference, "", True, plant=True)
    assert not failed, failed
    line = lockstep.pair_line("ppo-atari", mine, reference)
    assert line.startswith("ppo-atari: DIFFERS at step "), line
    assert torch.load(mine, weights_only=True)["stopped"], line  # at the first difference, not after all 8 steps


@pytest.mark.parametrize("pair", list(lockstep.PLANTED))
def test_each_planted_change_still_edits_ours_where_it_expects(pair):
    """Each pair's planted change, on ours with the pair's departures made CleanRL's as the study runs it: a change to
    ours' file that moves the planted line is caught here rather than in the study."""
    script = ROOT / "algorithms" / lockstep.PAIRS[pair][1][0]
    text = lockstep.patched(script.read_text(), list(lockstep.PAIRS[pair][3].get("departures", ())))
    edited = lockstep.planted(text, pair)
    assert edited != text
    compile(edited, str(script), "exec")
    with pytest.raises(SystemExit, match="to plant"):
        lockstep.planted(edited, pair)


def test_a_network_of_another_shape_is_refused_before_its_weights_are_copied(reference, tmp_path):
    script = planted(tmp_path, "narrower", "nn.Conv2d(64, 64, 3, stride=1)", "nn.Conv2d(64, 32, 3, stride=1)")
    line = ours(script, reference, tmp_path)
    assert "the networks differ" in line and "copied by position only where roles and shapes match" in line, line


def test_cleanrls_twin_critics_laid_out_as_ours_give_ours_critics_the_same_q_values():
    torch.manual_seed(0)
    twins = [torch.nn.Sequential(torch.nn.Linear(14, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                 torch.nn.Linear(32, 1)) for _ in range(2)]  # fmt: skip
    critics = load_algorithm("ddpg_td3").Critics(11, 3, 32, 2)
    with torch.no_grad():
        for mine, theirs in zip(critics.parameters(), lockstep.as_critics([*twins[0].parameters(), *twins[1].parameters()]),
                                strict=True):  # fmt: skip
            mine.copy_(theirs)
        obs, actions = torch.randn(5, 11), torch.randn(5, 3)
        expected = torch.stack([q(torch.cat([obs, actions], 1)).squeeze(1) for q in twins])
        assert torch.allclose(critics(obs, actions), expected, atol=1e-6)


def test_a_weight_and_its_bias_are_one_layer_in_the_order_the_layers_come():
    names = ["network.0.weight", "network.0.bias", "network.2.weight", "network.2.bias", "weights.0", "biases.0"]
    assert lockstep.layer_ids(names) == [0, 0, 1, 1, 2, 2]


def record(offsets: dict, roles=("trunk", "trunk"), outputs: int = 2) -> dict:
    """One optimiser step of a two-layer network (layer 1 with `outputs` units), each unit's rows shifted by
    offsets[(layer, unit)]; `roles` of the two layers."""
    shapes = [(4, 3), (4,), (outputs, 4), (outputs,)]
    tensors = [torch.zeros(shape) for shape in shapes]
    for (layer, unit), offset in offsets.items():
        tensors[2 * layer][unit] += offset
    moments = [torch.zeros(shape) for shape in shapes for _ in range(2)]
    names = [(roles[i // 2], shape) for i, shape in enumerate(shapes)]
    return dict(names=[names], layers=[[0, 0, 1, 1]], optimisers=["Adam"], steps=[(0, tensors, moments)], losses=[1.0])


def test_a_kink_may_reach_the_layers_beneath_its_unit_but_not_a_second_unit_of_its_own_layer():
    kink, reference = record({(1, 0): 1e-3, (0, 1): 1e-3, (0, 2): 1e-3}), record({})
    assert lockstep.compare(kink, reference)[3] is None
    assert lockstep.compare(record({(1, 0): 1e-3, (1, 1): 1e-3}), reference)[3].startswith("DIFFERS at step 1")


def test_a_one_unit_head_or_a_second_role_is_never_a_kink():
    head = record({(1, 0): 1e-3, (0, 1): 1e-3}, outputs=1)  # a value head's one output, and the layer beneath
    assert lockstep.compare(head, record({}, outputs=1))[3].startswith("DIFFERS at step 1")
    roles = ("trunk", "actor")
    two_roles = record({(1, 0): 1e-3, (0, 1): 1e-3}, roles)
    assert lockstep.compare(two_roles, record({}, roles))[3].startswith("DIFFERS at step 1")
    assert lockstep.compare(record({(1, 0): 1e-3}, roles), record({}, roles))[3] is None  # one unit alone: a kink


def test_the_atari_dqn_pairs_stacks_are_one_new_frame_a_step_as_an_emulators():
    pool = lockstep.ScriptedPool(lockstep.PAIRS["dqn-atari"][3], 2, "gymnasium")
    first, _ = pool.reset()
    assert (first == first[:, :1]).all()  # after a reset, four copies of the first frame
    second = pool.step(np.zeros(2, dtype=np.int64))[0]
    assert (second[:, :3] == first[:, 1:]).all() and not (second[:, 3] == first[:, 3]).all()


def test_the_procgen_stand_ins_give_each_side_the_same_frames_in_its_own_layout(monkeypatch):
    """Ours reads envpool's Procgen spaces and pool (3x64x64); CleanRL's ppg_procgen.py reads procgen's ProcgenEnv under
    gym 0.23, a dict of 64x64x3 "rgb" frames and a list of infos: the same scripted frames, channels last."""
    import types

    import gymnasium

    spec = lockstep.PAIRS["ppg"][3]
    real = envpool.make_spec("StarpilotEasy-v0")
    ours = lockstep.ScriptedPool(spec, 2, "gymnasium")
    assert ours.observation_space == real.observation_space and ours.action_space == real.action_space
    gym = types.SimpleNamespace(Env=object, spaces=gymnasium.spaces)  # gym 0.23's names, which CleanRL needs alone
    monkeypatch.setitem(sys.modules, "gym", gym)
    pools = []
    theirs = lockstep.procgen_pool(spec, 2, pools)
    assert theirs.observation_space["rgb"].shape == (64, 64, 3) and theirs.action_space.n == real.action_space.n
    np.testing.assert_array_equal(theirs.reset()["rgb"], ours.reset()[0].transpose(0, 2, 3, 1))
    obs, reward, done, infos = theirs.step(np.zeros(2))
    mine = ours.step(np.zeros(2))
    np.testing.assert_array_equal(obs["rgb"], mine[0].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(reward, mine[1])
    assert infos == [{}, {}] and not done.any() and pools[-1].step_count == 1  # the pool the actions' script follows


@pytest.mark.parametrize("pair", ["ppg", "rnd"])
def test_each_departure_still_edits_ours_where_it_expects_and_the_edited_file_compiles(pair):
    """The PPG and RND pairs make ours' departures CleanRL's by editing a copy of ours (TEXT_PATCHES) and by replacing
    its functions (make_same): a change to ours' file that moves an edited line, or renames a replaced function, is
    caught here rather than in the study."""
    script = ROOT / "algorithms" / lockstep.PAIRS[pair][1][0]
    departures = list(lockstep.PAIRS[pair][3]["departures"])
    text = script.read_text()
    edited = lockstep.patched(text, departures)
    assert (edited != text) == any(d in lockstep.TEXT_PATCHES for d in departures)
    names = {"__file__": str(script), "__name__": "lockstep_check"}
    exec(compile(edited, str(script), "exec"), names)  # defines everything; runs nothing (no __main__)
    functions = {"ppg": ("normalize_advantages", "training_steps"), "rnd": ("normalize_intrinsic",)}[pair]
    replaced = {k: names[k] for k in functions}
    lockstep.make_same(names, departures)
    assert all(names[k] is not v for k, v in replaced.items())
    if pair == "rnd":  # an edit whose line has moved on is refused, not skipped
        with pytest.raises(SystemExit, match="no longer has 'nn.LeakyReLU"):
            lockstep.patched(text.replace("nn.LeakyReLU(0.2)", "nn.LeakyReLU(0.3)", 1), departures)


def test_one_optimiser_over_the_agent_and_the_predictor_is_named_and_its_fixed_target_found():
    rnd = load_algorithm("rnd_ppo")
    import gymnasium

    agent = rnd.Agent(gymnasium.spaces.Box(0, 255, (4, 84, 84), np.uint8), gymnasium.spaces.Discrete(4))
    model = rnd.RNDModel()
    params = list(agent.parameters()) + list(model.predictor.parameters())
    names, module = lockstep.optimised_module(params, lockstep.PAIRS["rnd"][4])
    assert module is agent and names[0] == "trunk.0.weight" and names[-1].startswith("predictor.")
    assert len(names) == len(params)
    fixed = lockstep.fixed_network(params, "target")
    assert [id(t) for t in fixed] == [id(t) for t in model.target.parameters()]


@pytest.mark.parametrize("pair", ["ppo-continuous", "a2c"])
def test_the_ith_scripted_env_made_shows_row_i_of_the_pool_under_a_vector_env(pair):
    """ppo_continuous_action.py wraps each env (gymnasium.make, then its normalisation wrappers) before gymnasium's
    SyncVectorEnv steps them, Stable-Baselines3's A2C steps a DummyVecEnv of gymnasium.make's envs; ours steps one
    pool: env i made is row i of that pool, so both sides see the same streams, and different ones in each env."""
    import gymnasium

    spec, pools = lockstep.PAIRS[pair][3], []
    n = spec.get("envs", 1)
    envs = gymnasium.vector.SyncVectorEnv([lambda: lockstep.single_env(spec, pools) for _ in range(n)])
    pool = lockstep.ScriptedPool(spec, n, "gymnasium")
    assert envs.single_action_space == pool.single_action_space
    if pair == "ppo-continuous":  # Hopper's shapes, as ours reads them from envpool
        real = envpool.make_spec("Hopper-v4")
        assert envs.single_observation_space.shape == real.observation_space.shape
        assert pool.single_action_space.shape == real.action_space.shape
    first = envs.reset(seed=1)[0]
    np.testing.assert_array_equal(first, pool.reset()[0])
    assert len(np.unique(first, axis=0)) == n
    for _ in range(3):
        space = envs.single_action_space
        obs, reward = envs.step(np.zeros((n, *space.shape), dtype=space.dtype))[:2]
        mine = pool.step(np.zeros(n))
        np.testing.assert_array_equal(obs, mine[0])
        np.testing.assert_array_equal(reward, mine[1])
    assert pools[-1].step_count == 3  # the pool whose step the scripted actions follow


def test_a_cleanrl_folder_without_its_history_is_refused_in_one_line(tmp_path, capsys):
    """--cleanrl names a folder holding CleanRL's files but no git history (an unpacked archive): the study reads the
    files at its pinned commit from the history, so it stops in one line that says so and how to get a clone, exit 2."""
    (tmp_path / "cleanrl").mkdir()
    (tmp_path / "cleanrl" / "ppo.py").write_text("# CleanRL's file, unpacked\n")
    with pytest.raises(SystemExit) as stop:
        lockstep.main(["--cleanrl", str(tmp_path), "--only", "ppo-atari"])
    error = capsys.readouterr().err.splitlines()[-1]
    assert stop.value.code == 2 and f"holding CleanRL's commit {lockstep.CLEANRL_COMMIT[:8]}" in error
    assert "git clone https://github.com/vwxyzjn/cleanrl" in error


def test_cleanrl_files_that_cannot_be_downloaded_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """Without --cleanrl the study downloads CleanRL's files; offline it stops in one line naming the clone to pass."""

    def offline(url, timeout):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(SystemExit) as stop:
        lockstep.cleanrl_file("cleanrl/ppo.py", None, tmp_path)
    error = capsys.readouterr().err.splitlines()[-1]
    assert stop.value.code == 2 and "cleanrl/ppo.py cannot be downloaded (<urlopen error Name or service not known>)" in error
    assert "pass the clone's folder as --cleanrl" in error
