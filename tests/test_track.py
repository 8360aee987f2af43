"""--track (Weights & Biases), with WANDB_MODE=offline: the run W&B writes on disk for a later `wandb sync` holds the
run's arguments and the scalars of its tensorboard events, a resumed run goes on in the same W&B run, a run without
--track never imports wandb, and bad input (W&B flags without --track, no wandb, no network, no login) gets one line."""

import json
import shutil
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest
from wandb.proto import wandb_internal_pb2

from conftest import (
    CPU,
    ROOT,
    assert_one_error_line,
    load_file,
    one_thread,
    only_run,
    run_algorithm,
    run_bad_input,
    run_dirs,
    run_in_process,
)
from tblog import read_scalars

TINY = ["--total-timesteps", "2048", "--num-envs", "2", "--num-steps", "64", CPU]


def offline(tmp_path, **extra) -> dict:
    """A W&B that writes to disk only, with no login of this machine's user."""
    return {"WANDB_MODE": "offline", "HOME": str(tmp_path), "WANDB_API_KEY": "", **extra}


def wandb_records(path):
    """The records of a W&B run file (run-<id>.wandb): a 7-byte header (':W&B', magic, version), then LevelDB's log
    format: 32 KiB blocks of chunks, each a 7-byte header (checksum, length, type: 1 whole, 2 first, 3 middle, 4 last)
    and its bytes; a block's last 6 bytes or fewer are padding."""
    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending, pos = pending + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_offline_run(folder):
    """(the run record, {tag: [(global_step, value)]}) of one offline run folder."""
    run, history = None, {}
    for record in wandb_records(next(folder.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for tag, value in items.items():
                if not tag.startswith("_") and tag != "global_step":
                    history.setdefault(tag, []).append((items["global_step"], value))
    return run, history


def offline_runs(cwd):
    return sorted((cwd / "wandb").glob("offline-run-*"))


def test_an_offline_run_holds_the_arguments_the_code_and_the_tensorboard_scalars(tmp_path):
    # run as a user does, from the folder that holds algorithms/, so that W&B saves the script's code
    (tmp_path / "algorithms").mkdir()
    shutil.copy(ROOT / "algorithms" / "ppo.py", tmp_path / "algorithms" / "ppo.py")
    cmd = [sys.executable, "algorithms/ppo.py", *TINY, "--track", "--wandb-tags", "smoke", "tiny"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=one_thread(offline(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,), run_dir = offline_runs(tmp_path), only_run(tmp_path)
    run, history = read_offline_run(folder)
    assert run.display_name == run_dir.name and list(run.tags) == ["smoke", "tiny"]
    config = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in run.config.update}
    assert config["env_id"] == "CartPole-v1" and config["total_timesteps"] == 2048 and config["track"] is True
    assert (folder / "files" / "code" / "algorithms" / "ppo.py").read_text() == (ROOT / "algorithms" / "ppo.py").read_text()
    # every tag of the events, each step's value, and nothing else; W&B keeps one value a step (two episodes that end at
    # the same step: the last), where tensorboard keeps both
    scalars = read_scalars(str(run_dir))
    assert sorted(history) == sorted(scalars)
    for tag, points in scalars.items():
        last = {step: np.float32(value) for step, value, _ in points}  # tensorboard's float32, as W&B reads it
        assert [(step, np.float32(value)) for step, value in history[tag]] == list(last.items()), tag


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tmp_path):
    env = offline(tmp_path)
    run_algorithm("ppo", *TINY, "--track", "--checkpoint-every", "1024", cwd=tmp_path, env=env)
    (first,) = offline_runs(tmp_path)
    ckpt = only_run(tmp_path) / "checkpoint.pt"
    wandb_id = load_file(ckpt)["wandb_id"]
    assert first.name.endswith(f"-{wandb_id}")
    run_algorithm("ppo", "--resume", str(ckpt), "--total-timesteps", "3072", cwd=tmp_path, env=env)
    assert len(run_dirs(tmp_path)) == 1
    second = next(f for f in offline_runs(tmp_path) if f != first)
    run, history = read_offline_run(second)
    assert run.run_id == wandb_id and second.name.endswith(f"-{wandb_id}")
    # the resumed part only: from the checkpoint's step to the new end
    steps = [step for step, _ in history["charts/learning_rate"]]
    assert min(steps) > 2048 and max(steps) == 3072


def test_a_run_without_track_never_imports_wandb(tmp_path):
    cmd = [sys.executable, "-X", "importtime", str(ROOT / "algorithms" / "ppo.py"), *TINY]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=one_thread(None))
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "torch" in imported and not [m for m in imported if m.split(".")[0] == "wandb"]
    assert not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("name", ["ppo", "a2c", "dqn", "ddpg_td3", "es", "qlearning", "ppg_procgen", "rnd_ppo"])
def test_a_wandb_flag_without_track_is_refused(name, tmp_path):
    proc = run_bad_input(name, ["--wandb-tags", "baseline"], tmp_path, "Acrobot-v1")
    assert_one_error_line(name, proc, r"--wandb-tags needs --track; leave it out")


def test_track_without_wandb_installed_says_how_to_install_it(tmp_path, monkeypatch):
    def parse(module):
        monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None if name == "wandb" else True)
        module.parse_args(["--track"])

    assert_one_error_line("ppo", run_in_process("ppo", parse, tmp_path), r"this Python lacks wandb; pip install wandb")


def test_track_without_network_says_how_to_go_offline(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port that nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": "0" * 40, "WANDB_MODE": "online", "WANDB_INIT_TIMEOUT": "10"}
    env["WANDB_BASE_URL"] = f"http://127.0.0.1:{port}"
    proc = run_algorithm("ppo", *TINY, "--track", cwd=tmp_path, env=env, check=False)
    assert_one_error_line("ppo", proc, r"Weights & Biases did not start \(.*\).*set WANDB_MODE=offline")
    assert not (tmp_path / "runs").exists()


def test_track_without_login_says_how_to_log_in_and_leaves_no_run_directory(tmp_path):
    with socket.socket() as server:  # a server that W&B's pre-check reaches; wandb.init finds no key before it talks
        server.bind(("127.0.0.1", 0))
        server.listen()
        env = {"HOME": str(tmp_path), "WANDB_API_KEY": "", "WANDB_MODE": "online"}
        env["WANDB_BASE_URL"] = f"http://127.0.0.1:{server.getsockname()[1]}"
        proc = run_algorithm("ppo", *TINY, "--track", cwd=tmp_path, env=env, check=False)
    assert_one_error_line("ppo", proc, r"Weights & Biases did not start \(.*\); log in with wandb login.*WANDB_MODE=offline")
    assert not (tmp_path / "runs").exists()


def test_under_torchrun_process_0_alone_opens_the_wandb_run_with_every_process_episodes(tmp_path):
    from test_torchrun import torchrun

    flags = ["--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "64", CPU, "--track"]
    torchrun(str(ROOT / "algorithms" / "ppo.py"), *flags, cwd=tmp_path, env=offline(tmp_path))
    (folder,) = offline_runs(tmp_path)  # one W&B run, not one per process
    _, history = read_offline_run(folder)
    scalars = read_scalars(str(only_run(tmp_path)))
    last = {step: np.float32(value) for step, value, _ in scalars["charts/episodic_return"]}
    assert [(step, np.float32(value)) for step, value in history["charts/episodic_return"]] == list(last.items())
