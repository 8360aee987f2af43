"""Devices: a checkpoint written on CUDA resumes on a CPU-only machine, es.py's processes find a device each under
torchrun whatever the number of GPUs, and torch's OpenMP threads sleep while they wait. Runs on a CPU (the CUDA side is
simulated: see cuda_tagged)."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch

from conftest import CPU, ROOT, load_algorithm, load_file, only_run, run_algorithm, scalars

es = load_algorithm("es")


@contextlib.contextmanager
def cuda_tagged():
    """torch.save writes every storage as if it lived on cuda:0, as a checkpoint saved by a CUDA run is; loading such a
    file without map_location on a machine without CUDA fails."""
    entry = (-1, lambda storage: "cuda:0", lambda storage, location: None)
    torch.serialization._package_registry.insert(0, entry)
    try:
        yield
    finally:
        torch.serialization._package_registry.remove(entry)


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a CUDA checkpoint on a machine without CUDA")
@pytest.mark.parametrize(
    "algo, flags",
    [
        ("ppo", ["--total-timesteps", "2560", "--checkpoint-every", "1024"]),
        ("dqn", ["--total-timesteps", "1500", "--learning-starts", "500", "--checkpoint-every", "1000"]),
    ],
)
def test_a_checkpoint_written_on_cuda_resumes_on_the_cpu(algo, flags, tmp_path):
    run_algorithm(algo, "--env-id", "CartPole-v1", *flags, "--progress-interval", "0", cwd=tmp_path)
    run = only_run(tmp_path)
    checkpoint = run / "checkpoint.pt"
    (run / "finished").unlink()  # the run went past its checkpoint: without this, the resume is refused
    state = load_file(checkpoint)
    for rng in state["rng"] if isinstance(state["rng"], list) else [state["rng"]]:  # ppo.py: one per process
        rng["cuda"] = [torch.zeros(16, dtype=torch.uint8)]  # a CUDA run's generator states come along too
    with cuda_tagged():
        torch.save(state, checkpoint)
    with pytest.raises(RuntimeError, match="CUDA"):  # the file really is CUDA-tagged: a plain load fails here
        torch.load(checkpoint, weights_only=False)
    proc = run_algorithm(algo, "--resume", str(checkpoint), cwd=tmp_path)
    assert f"resumed {run.relative_to(tmp_path)} at step {state['global_step']:,}" in proc.stdout
    assert max(step for step, _, _ in scalars(run)["charts/SPS"]) > state["global_step"]  # it trained on from there


@pytest.mark.parametrize(
    "device, local_rank, local_world_size, gpus, expected",
    [
        ("cpu", 1, 2, 0, "cpu"),  # --no-cuda or no GPU: gloo on the CPU
        ("cuda", 1, 2, 2, "cuda:1"),  # a GPU per process (NCCL)
        ("cuda", 0, 1, 1, "cuda:0"),  # one process, one GPU
        ("cuda", 1, 2, 1, "cpu"),  # two processes, one GPU: rank 1 used to ask for cuda:1 and fail
    ],
)
def test_each_torchrun_process_gets_a_device_that_exists(device, local_rank, local_world_size, gpus, expected, monkeypatch):
    """The device start_processes gives the process torchrun started as LOCAL_RANK of LOCAL_WORLD_SIZE on a node with
    `gpus` GPUs (faked), and the line process 0 says where the processes outnumber the GPUs."""
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # start_processes leaves this process's thread count alone
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    args = es.Args(cuda=device == "cuda")  # world_size 1: the group is not joined
    _, got, note = es.start_processes(args, small=True)
    assert str(got) == expected
    assert (note is not None) == (device == "cuda" and local_world_size > gpus)


def test_the_first_line_of_a_run_names_the_device(tmp_path):
    proc = run_algorithm("ppo", "--env-id", "CartPole-v1", "--total-timesteps", "512", CPU, cwd=tmp_path)
    assert proc.stdout.splitlines()[0] == f"ppo.py: training on cpu (1 thread), torch {torch.__version__}"


@pytest.mark.parametrize(
    "name, env, spin",
    [(p.stem, {}, "0") for p in sorted((ROOT / "algorithms").glob("*.py"))]
    + [("ppo", {"OMP_WAIT_POLICY": "ACTIVE"}, "30000000000"), ("ppo", {"OMP_NUM_THREADS": "2"}, "300000")],
)
def test_openmp_threads_wait_passively_unless_the_user_says_otherwise(name, env, spin):
    """A spinning OpenMP thread takes a busy machine's core from threads that have work (docs/speed.md): each file asks
    libgomp to sleep at once (GOMP_SPINCOUNT 0; 300,000 spins by default) before torch loads it, and keeps a policy or a
    thread count the user set. OMP_DISPLAY_ENV makes libgomp print what it read as it loads."""
    user = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS"}
    env = {**{k: v for k, v in os.environ.items() if k not in user}, "OMP_DISPLAY_ENV": "VERBOSE", **env}
    script = ROOT / "algorithms" / f"{name}.py"
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"GOMP_SPINCOUNT = '{spin}'" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available() or (os.cpu_count() or 1) < 2, reason="torch's own default is one thread")
@pytest.mark.parametrize("env_id, small", [("CartPole-v1", True), ("obs_envs:FloatFrames-v0", False)])
def test_a_small_network_trains_on_one_thread_and_frames_on_torchs_default(env_id, small, tmp_path):
    """An MLP of vectors gains nothing from a second thread and loses most of its speed to it on a busy machine; a CNN of
    frames keeps torch's default, a thread a core (this machine has at least 2). The user's OMP_NUM_THREADS is unset."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(ROOT / "algorithms" / "ppo.py"), "--env-id", env_id, "--total-timesteps", "1024", CPU]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("training on cpu (1 thread)" in proc.stdout.splitlines()[0]) == small, proc.stdout.splitlines()[0]
