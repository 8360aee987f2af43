"""The big stores a run keeps (each script's storage() and the shared check_storage): the figure against what the
buffers of a real run take, a store too large for the machine refused in one line before anything is allocated or
written, and an env count out of proportion to the run named as the flag at fault."""

import sys

import numpy as np
import pytest
import torch

from conftest import CPU, assert_one_error_line, load_algorithm, run_bad_input, run_in_process

# The stores storage() reckons: compared with the tensors and arrays main holds at its end
BUFFERS = ("the rollout", "the phase", "the replay buffer", "the population", "the table", "the exact optimum")

# Small runs whose buffers outweigh the few other arrays main keeps (episode counters, the last observation): one
# per path that stores differently (vector or uint8 observations, Box or Discrete actions, frames once or whole)
RUNS = {
    "ppo CartPole": ("ppo", "--env-id CartPole-v1 --num-envs 4 --num-steps 256 --total-timesteps 1024"),
    "ppo Pendulum": ("ppo", "--env-id Pendulum-v1 --num-envs 2 --num-steps 512 --num-minibatches 4 --total-timesteps 1024"),
    "ppo Breakout": ("ppo", "--env-id Breakout-v5 --num-envs 2 --num-steps 64 --total-timesteps 128"),
    "a2c CartPole": ("a2c", "--env-id CartPole-v1 --num-envs 16 --num-steps 64 --total-timesteps 1024"),
    "a2c Breakout": ("a2c", "--env-id Breakout-v5 --num-envs 2 --num-steps 32 --total-timesteps 64"),
    "rnd_ppo": (
        "rnd_ppo",
        "--num-envs 2 --num-steps 32 --num-minibatches 2 --num-iterations-obs-norm-init 1 --total-timesteps 64",
    ),
    "ppg_procgen": ("ppg_procgen", "--num-envs 2 --num-steps 32 --num-minibatches 2 --n-pi 2 --e-aux 1 --total-timesteps 128"),
    "dqn CartPole": ("dqn", "--env-id CartPole-v1 --buffer-size 20000 --learning-starts 128 --total-timesteps 300"),
    "dqn Breakout": ("dqn", "--env-id Breakout-v5 --buffer-size 2000 --learning-starts 128 --total-timesteps 300"),
    "ddpg_td3": ("ddpg_td3", "--env-id Pendulum-v1 --buffer-size 20000 --learning-starts 256 --total-timesteps 300"),
    "es": ("es", "--env-id CartPole-v1 --population-size 64 --num-generations 1 --max-episode-steps 20"),
    "qlearning": ("qlearning", "--env-id Taxi-v3 --total-timesteps 100"),
}


def held_bytes(value, seen: set) -> int:
    """Bytes of the tensors and arrays a value holds (in dicts, lists, tuples and plain objects, such as a replay
    buffer), each storage counted once; networks, optimisers and envs are not storage."""
    if isinstance(value, (torch.nn.Parameter, torch.nn.Module, torch.optim.Optimizer)):
        return 0
    if type(value).__module__.startswith(("gymnasium", "envpool")):
        return 0  # an env or its spaces
    if isinstance(value, torch.Tensor):
        key, size = ("torch", value.untyped_storage().data_ptr()), value.untyped_storage().nbytes()
    elif isinstance(value, np.ndarray):
        base = value if value.base is None else value.base
        key, size = ("numpy", id(base)), base.nbytes if isinstance(base, np.ndarray) else 0
    else:
        key, size = id(value), None
    if key in seen:
        return 0
    seen.add(key)
    if size is not None:
        return size
    if isinstance(value, dict):
        return sum(held_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(held_bytes(v, seen) for v in value)
    if hasattr(value, "__dict__") and not callable(value):
        return sum(held_bytes(v, seen) for v in vars(value).values())
    return 0


@pytest.mark.parametrize("run", RUNS)
def test_a_small_run_says_its_device_first_and_keeps_what_its_storage_reckons(run, tmp_path):
    """The first line a run prints names its device. Then main's locals when it returns: every tensor and array it
    holds, against storage()'s buffers for the same flags, within a tenth."""
    name, flags = RUNS[run]
    flags = [*flags.split(), CPU, "--seed", "1"]
    held, reckoned = {}, {}

    def call(module):
        def profile(frame, event, _arg):
            if event == "return" and frame.f_code is module.main.__code__:
                held.update(frame.f_locals)

        args = module.parse_args(flags)
        obs_space, action_space = module.env_spaces(args.env_id)
        check = module.check_args(args, obs_space, action_space)
        extra = (check,) if name == "qlearning" else ()  # its grid
        reckoned.update(module.storage(args, obs_space, action_space, torch.device("cpu"), *extra))
        sys.setprofile(profile)
        try:
            module.main(module.parse_args(flags))
        finally:
            sys.setprofile(None)

    proc = run_in_process(name, call, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"{name}.py: training on cpu ("), proc.stdout[:500]
    buffers = sum(size for store, (size, _, _) in reckoned.items() if store.startswith(BUFFERS))
    seen = set()
    by_name = {key: held_bytes(value, seen) for key, value in held.items()}  # to say what differs, where it does
    taken = sum(by_name.values())
    assert buffers > 0 and abs(buffers - taken) <= 0.1 * taken, f"{buffers} {taken} " + str(
        sorted((v, k) for k, v in by_name.items() if v)
    )


# Flags whose storage no machine here has: each refused in one line naming the store, the flags that size it, the
# memory it needs and the fix, before a run directory exists (run_bad_input checks) and before anything is allocated
# (an allocation of this size would end in the allocator's traceback, not in one line). ppo.py and rnd_ppo.py run on the
# CPU here so that the store named and the sums are the host's on any machine (on a GPU they are the GPU's)
TOO_LARGE = {
    "ppo": (
        "--env-id Breakout-v5 --num-envs 100000 --total-timesteps 10000000000 --no-cuda",
        r"the rollout \(--num-envs 100000 x --num-steps 128 steps of 4x84x84 observations\) needs 337 GiB and this "
        r"machine has .* GiB of memory free; lower --num-envs or --num-steps",
    ),
    "a2c": ("--env-id Breakout-v5 --num-envs 1000000 --total-timesteps 100000000000", r"needs .* GiB .* lower --num-envs"),
    "rnd_ppo": (
        "--num-envs 100000 --total-timesteps 100000000000 --no-cuda",
        r"the rollout \(--num-envs 100000 x --num-steps 128",
    ),
    "ppg_procgen": ("--n-pi 100000", r"the phase \(100000 rollouts of .* pass --preset small \(N_pi 8\), or a smaller"),
    "dqn": (
        "--env-id Breakout-v5 --buffer-size 100000000000",
        r"the replay buffer \(--buffer-size 100000000000 of 4x84x84 observations\) needs .* lower --buffer-size",
    ),
    "ddpg_td3": (
        "--buffer-size 100000000000",
        r"the replay buffer \(--buffer-size 100000000000 of 11-dim .* lower --buffer-size",
    ),
    "es": (
        "--population-size 1000000 --hidden-sizes 1024 1024",
        r"the population \(--population-size 1000000 x 1,056,770 parameters\) needs .* lower --population-size",
    ),
    "qlearning": (
        "--env-id Acrobot-v1 --bins 1000000",
        r"the table \(--bins 1000000 \^ 6 dimensions = 1e\+36 rows x 3 actions\) needs .* GiB .*; lower --bins, or use dqn",
    ),
}


@pytest.mark.parametrize("name", sorted(TOO_LARGE))
def test_storage_too_large_for_the_machine_is_refused_in_one_line(name, tmp_path):
    flags, message = TOO_LARGE[name]
    proc = run_bad_input(name, flags.split(), tmp_path, "CartPole-v1")
    assert_one_error_line(name, proc, message)


def test_check_storage_refuses_a_store_over_nine_tenths_of_its_devices_free_memory(capsys, monkeypatch):
    """Each store against the free memory of its own device: a rollout on the GPU does not take host memory."""
    ppo = load_algorithm("ppo")
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(ppo.torch.cuda, "mem_get_info", lambda device: (4 * 2**30, 8 * 2**30))
    ppo.check_storage({"the rollout": (3 * 2**30, cpu, "a"), "the replay buffer": (3.5 * 2**30, gpu, "b")})
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as e:  # 3.7 GiB on a GPU with 4 GiB free: over nine tenths
        ppo.check_storage({"the rollout (--num-steps 7)": (3.7 * 2**30, gpu, "lower --num-steps")})
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "the rollout (--num-steps 7) needs 3.7 GiB and this machine has 4 GiB of GPU memory free; lower --num-steps" in err
    with pytest.raises(SystemExit):  # the host's own free memory, whatever it is, cannot hold a thousand times itself
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        ppo.check_storage({"the rollout": (1000 * free, cpu, "a")})


# An env count so large that one rollout outruns the whole run: the refusal names --num-envs as a flag to change (ppo.py
# and a2c.py name the budget beside it; the others name the budget instead where it is further below its default)
OUT_OF_PROPORTION = {
    "ppo": "--env-id CartPole-v1 --num-envs 5000",
    "a2c": "--env-id CartPole-v1 --num-envs 5000 --total-timesteps 20000",
    "rnd_ppo": "--num-envs 4000000",
    "ppg_procgen": "--num-envs 100000",
}


@pytest.mark.parametrize("name", sorted(OUT_OF_PROPORTION))
def test_an_env_count_out_of_proportion_names_num_envs(name, tmp_path):
    flags = OUT_OF_PROPORTION[name].split()
    proc = run_bad_input(name, flags, tmp_path, "CartPole-v1")
    num_envs = flags[flags.index("--num-envs") + 1]
    assert_one_error_line(
        name, proc, rf"--num-envs {num_envs}\b.*; (pass --num-envs at most \d+|raise it, or lower --num-envs)"
    )
