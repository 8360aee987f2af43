"""Bad input, the same way for every script: each numeric flag outside its range, tyro's own parse errors, a
checkpoint that is not this script's, and a run directory that cannot be made. Each ends in one line
`<script>.py: error: ...` and exit status 2, before anything is written. The cross-flag and space checks of each
script are tabled in its own test file."""

import dataclasses
import math
import re
import sys
import typing
from pathlib import Path

import pytest
import torch

from conftest import ROOT, assert_one_error_line, load_algorithm, marks, run_in_process, run_script

ALGORITHMS = sorted(p.stem for p in (ROOT / "algorithms").glob("*.py"))
MODULES = {name: load_algorithm(name) for name in ALGORITHMS}


def numeric_flags(module) -> dict[str, type]:
    """The int and float flags of a script's Args (float | None included; the computed, suppressed fields not)."""
    out = {}
    for field in dataclasses.fields(module.Args):
        kind = field.type
        if typing.get_origin(kind) is typing.Annotated:
            continue  # tyro.conf.Suppress: computed at start-up, not a flag
        kinds = set(typing.get_args(kind)) - {type(None)} if typing.get_origin(kind) is not None else {kind}
        if kinds and kinds <= {int, float} and bool not in kinds:
            out[field.name] = float if float in kinds else int
    return out


def outside(interval: str, kind: type) -> list[str]:
    """Values just outside each finite bound of an interval like '[1, inf)' or '(0, 1]', and NaN for floats."""
    low, high = (float(b) for b in interval[1:-1].split(","))
    step = 1 if kind is int else 0.5
    values = []
    if math.isfinite(low):
        values.append(low if interval[0] == "(" else low - step)
    if math.isfinite(high):
        values.append(high if interval[-1] == ")" else high + step)
    values = [int(v) if kind is int else v for v in values]
    return [str(v) for v in values] + (["nan"] if kind is float else [])


def parse_error(name: str, argv: list[str], tmp_path: Path) -> str:
    """Run the script's parse_args in this process; it must exit 2 with one error line and nothing else, returned."""
    proc = run_in_process(name, lambda module: module.parse_args(argv), tmp_path)
    assert proc.returncode != 0, f"{name}.py accepted {' '.join(argv)}"
    assert_one_error_line(name, proc, "")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr.strip()


# What each numeric flag's meaning admits, stated here rather than read from the scripts' RANGES, so that a range
# widened or narrowed there is caught: a fraction, a count, a rate, a seed. A new flag gets its interval here too.
FRACTION, AT_LEAST_1, NONNEGATIVE, POSITIVE = "[0, 1]", "[1, inf)", "[0, inf)", "(0, inf)"
# fmt: off
EVERY_SCRIPT = dict(seed="[0, 1e9]", eval_every=NONNEGATIVE, eval_episodes=AT_LEAST_1, checkpoint_every=NONNEGATIVE,
                    progress_interval=NONNEGATIVE)
ON_POLICY = dict(total_timesteps=AT_LEAST_1, learning_rate=POSITIVE, num_envs=AT_LEAST_1, num_steps=AT_LEAST_1,
                 gamma=FRACTION, gae_lambda=FRACTION, ent_coef=NONNEGATIVE, vf_coef=NONNEGATIVE)
PPO_LIKE = dict(ON_POLICY, num_minibatches=AT_LEAST_1, update_epochs=AT_LEAST_1, clip_coef=POSITIVE)
OFF_POLICY = dict(log_every=AT_LEAST_1, total_timesteps=AT_LEAST_1, learning_rate=POSITIVE, num_envs=AT_LEAST_1,
                  buffer_size=AT_LEAST_1, gamma=FRACTION, tau="(0, 1]", batch_size=AT_LEAST_1, learning_starts=NONNEGATIVE)
OWN_FLAGS = {
    "ppo": dict(PPO_LIKE, max_grad_norm=POSITIVE, target_kl=POSITIVE, frame_stack=AT_LEAST_1, rnn_size="[1, 16384]"),
    "a2c": dict(ON_POLICY, log_interval=AT_LEAST_1, rmsprop_alpha="[0, 1)", rmsprop_eps=POSITIVE,
                max_grad_norm=POSITIVE, rnn_size="[1, 16384]"),
    "dqn": dict(OFF_POLICY, eval_epsilon=FRACTION, target_network_frequency=AT_LEAST_1, start_e=FRACTION,
                end_e=FRACTION, exploration_fraction="(0, 1]", train_frequency=AT_LEAST_1, max_grad_norm=NONNEGATIVE),
    "ddpg_td3": dict(OFF_POLICY, hidden_size="[1, 65536]", exploration_noise=NONNEGATIVE,
                     policy_frequency=AT_LEAST_1, policy_noise=NONNEGATIVE, noise_clip=NONNEGATIVE),
    "es": dict(num_generations=AT_LEAST_1, population_size="[2, 1e6]", sigma=POSITIVE, learning_rate=POSITIVE,
               l2_coef=NONNEGATIVE, max_episode_steps=NONNEGATIVE),
    "qlearning": dict(log_every=AT_LEAST_1, total_timesteps=AT_LEAST_1, num_envs=AT_LEAST_1, gamma=FRACTION,
                      learning_rate="(0, 1]", end_learning_rate="(0, 1]", start_e=FRACTION, end_e=FRACTION,
                      exploration_fraction=FRACTION, max_episode_steps=NONNEGATIVE, bins="[1, 1000000]",
                      optimum_tolerance=NONNEGATIVE),
    "ppg_procgen": dict(PPO_LIKE, num_levels="[0, 1e9]", start_level="[0, 1e9]", max_grad_norm=NONNEGATIVE,
                        n_pi=AT_LEAST_1, e_aux=NONNEGATIVE, aux_learning_rate=POSITIVE, aux_rollouts=AT_LEAST_1,
                        beta_clone=NONNEGATIVE, vf_true_weight=NONNEGATIVE, chunk_size=NONNEGATIVE),
    "rnd_ppo": dict(PPO_LIKE, sticky_action_prob=FRACTION, max_episode_steps=AT_LEAST_1, int_gamma=FRACTION,
                    max_grad_norm=NONNEGATIVE, ext_coef=NONNEGATIVE, int_coef=NONNEGATIVE, update_proportion="(0, 1]",
                    num_iterations_obs_norm_init=NONNEGATIVE, chunk_size=NONNEGATIVE, rnn_size="[1, 16384]"),
}
# fmt: on
BOUNDS = {name: {**EVERY_SCRIPT, **flags} for name, flags in OWN_FLAGS.items()}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_numeric_flag_has_a_range(name):
    """Every int and float flag is checked by its script (RANGES) and has its interval stated above."""
    module = MODULES[name]
    assert set(numeric_flags(module)) == set(getattr(module, "RANGES", {})), "flags without a range, or ranges of no flag"
    assert set(numeric_flags(module)) == set(BOUNDS[name]), "flags without an interval in BOUNDS, or BOUNDS of no flag"


CASES = [
    (name, flag, value)
    for name in ALGORITHMS
    for flag, kind in numeric_flags(MODULES[name]).items()
    if flag in BOUNDS[name]  # a flag without an interval fails the test above
    for value in outside(BOUNDS[name][flag], kind)
]


def bounds(interval: str, kind: type) -> list[str]:
    """The finite closed bounds of an interval like '[1, inf)' or '[0, 1]': values a flag must accept."""
    low, high = (float(b) for b in interval[1:-1].split(","))
    values = [low] * (interval[0] == "[" and math.isfinite(low)) + [high] * (interval[-1] == "]" and math.isfinite(high))
    return [str(int(v) if kind is int else v) for v in values]


ON_BOUND = [
    (name, flag, value)
    for name in ALGORITHMS
    for flag, kind in numeric_flags(MODULES[name]).items()
    for value in bounds(BOUNDS[name].get(flag, "(-inf, inf)"), kind)
]


@pytest.mark.parametrize("name, flag, value", ON_BOUND, ids=[f"{n}-{f}={v}" for n, f, v in ON_BOUND])
def test_a_value_on_a_closed_bound_is_accepted(name, flag, value, tmp_path):
    """The range check is not off by one: a closed interval's own bound passes it. The check alone, on the defaults with
    the flag set (tyro's parse of each value, a tenth of a second, is the out-of-range test's)."""
    args = dataclasses.replace(MODULES[name].Args(), **{flag: numeric_flags(MODULES[name])[flag](float(value))})
    proc = run_in_process(name, lambda module: module.check_ranges(args), tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name, flag, value", CASES, ids=[f"{n}-{f}={v}" for n, f, v in CASES])
def test_a_value_out_of_range_gets_one_line(name, flag, value, tmp_path):
    option = f"--{flag.replace('_', '-')}"
    line = parse_error(name, [option, value], tmp_path)
    assert f"{option} " in line and f"out of range; pass a value in {BOUNDS[name][flag]}" in line, line


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--no-such-flag", "1"], r"Unrecognized options: --no-such-flag"),
        (["--seed", "one"], r"Error parsing --seed"),
        (["--seed"], r"Missing value for argument '--seed'"),
        (["--exp-name", "a/b"], r"--exp-name 'a/b' must be a plain name"),
    ],
)
def test_tyro_errors_and_names_read_as_one_line(name, argv, message, tmp_path):
    line = parse_error(name, argv, tmp_path)
    assert re.search(message, line), line
    assert line.endswith(f"see {name}.py --help") or "--exp-name" in argv


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_checkpoint_that_is_not_this_scripts_gets_one_line(name, tmp_path):
    env_id = MODULES[name].parse_args([]).env_id
    other = "dqn.py" if name != "dqn" else "ppo.py"
    own = marks(f"{name}.py", model={})  # this script's marks, as save_checkpoint writes them
    files = {
        "missing.pt": None,
        "garbage.pt": b"not a checkpoint",
        "foreign.pt": dict(script=other, kind="checkpoint", args=dict(env_id=env_id)),
        "legacy.pt": dict(args=dict(env_id=env_id), model={}),  # written before checkpoints named their script
        f"{name}.model": dict(kind="model", args=dict(env_id=env_id), **own),
        "other_env.pt": dict(kind="checkpoint", args=dict(env_id="Foo-v0"), **own),
        # written before checkpoints carried a format number, or by a version with another layout
        "unnumbered.pt": dict(script=f"{name}.py", kind="checkpoint", args=dict(env_id=env_id), run_name="r", model={}),
        "other_format.pt": dict(kind="checkpoint", args=dict(env_id=env_id), **{**own, "format": 99}),
        # a field it names is gone (cut short, or edited by hand)
        "cut_short.pt": dict(kind="checkpoint", args=dict(env_id=env_id), **{**own, "fields": ["model", "optimizer"]}),
        "no_env_id.pt": dict(kind="checkpoint", args=dict(seed=1), **own),
    }
    expected = {
        "missing.pt": r"does not exist; pass the runs/<run>/checkpoint.pt",
        "garbage.pt": r"cannot be read as a checkpoint",
        "foreign.pt": rf"is a {other} checkpoint of format 0, not a {name}\.py .*, or run {other}$",
        "legacy.pt": r"is a file no script of this project wrote, not a",
        f"{name}.model": rf"is a {name}\.py model of format \d+, not a {name}\.py checkpoint of format \d+; pass the runs/",
        "other_env.pt": rf"is for Foo-v0, not {env_id}; pass --env-id Foo-v0",
        "unnumbered.pt": rf"is a {name}\.py checkpoint of format 0, not a {name}\.py checkpoint of format "
        rf"{MODULES[name].CHECKPOINT_FORMAT}; pass the runs/<run>/checkpoint\.pt of a {name}\.py run$",
        "other_format.pt": rf"is a {name}\.py checkpoint of format 99, not a {name}\.py checkpoint of format",
        "cut_short.pt": r"checkpoint of format \d+ \(which lacks optimizer\), not a",
        "no_env_id.pt": r"lacks args.env_id",
    }
    for file, content in files.items():
        path = tmp_path / file
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            torch.save(content, path)
        line = parse_error(name, ["--resume", str(path)], tmp_path)
        assert re.search(expected[file], line), (file, line)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_run_directory_that_cannot_be_made_gets_one_line(name, tmp_path):
    (tmp_path / "runs").write_text("a file where the runs directory would go")
    proc = run_script(ROOT / "algorithms" / f"{name}.py", cwd=tmp_path, check=False)  # forked: the imports done once
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(f"{name}.py: error: cannot write the run directory runs/"), proc.stderr


WITH_CUDAGRAPHS = [n for n in ALGORITHMS if "cudagraphs" in {f.name for f in dataclasses.fields(MODULES[n].Args)}]


@pytest.mark.parametrize("name", WITH_CUDAGRAPHS)
def test_cudagraphs_on_the_cpu_is_refused(name, tmp_path):
    """CUDA graphs exist only on a GPU: --cudagraphs with --no-cuda (or on a machine without one) ends in one line."""
    proc = run_in_process(name, lambda module: module.main(module.parse_args(["--cudagraphs", "--no-cuda"])), tmp_path)
    assert_one_error_line(name, proc, "--cudagraphs needs a CUDA device.*--compile works on the CPU")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_procgen_id_without_the_qt_runtime_gets_one_line(name, tmp_path, monkeypatch):
    """envpool's Procgen library needs the Qt 5 runtime; without it, its import raises a multi-line ImportError (seen on
    a GPU machine that had no Qt) that used to end every script in a traceback."""
    message = "Procgen could not load its Qt runtime.\nInstall the Qt5 Core/Gui shared libraries, for example via ..."

    def no_qt(env_id):
        raise ImportError(message)

    monkeypatch.setattr(MODULES[name].envpool, "make_spec", no_qt)
    proc = run_in_process(name, lambda module: module.main(module.parse_args(["--env-id", "StarpilotEasy-v0"])), tmp_path)
    assert_one_error_line(name, proc, "'StarpilotEasy-v0' .*Qt runtime. Install the Qt5 Core/Gui shared libraries")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if "capture_video" in MODULES[n].Args.__dataclass_fields__])
def test_capture_video_without_the_ffmpeg_plugin_is_refused_before_the_run(name, tmp_path, monkeypatch):
    """Without imageio-ffmpeg, imageio would write the first video with another format's writer and fail there, after
    the training before it; the plugin is looked for at start-up (a None entry in sys.modules hides a package)."""
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    proc = run_in_process(name, lambda module: module.parse_args(["--capture-video"]), tmp_path)
    assert_one_error_line(name, proc, r"--capture-video .* ffmpeg plugin.*pip install 'imageio\[ffmpeg\]'")
    assert not (tmp_path / "runs").exists()
