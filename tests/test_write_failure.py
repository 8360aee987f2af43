"""A checkpoint that cannot be written (a full disk) ends the run in one line in every file: the file and the cause,
the earlier checkpoint left intact and named with the command to resume from it, exit status 1, no .tmp left."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from algos import load_algorithm
from conftest import CPU, ROOT, SMOKE_FLAGS, load_file, one_thread, only_run, run_algorithm, run_in_process

# each file's short run with a checkpoint every few updates: the first is written, the second meets a full disk
CHECKPOINTED = {
    "ppo": ["--total-timesteps", "3072", "--checkpoint-every", "1024"],
    "a2c": ["--total-timesteps", "2000", "--checkpoint-every", "500"],
    "dqn": ["--total-timesteps", "2500", *SMOKE_FLAGS["dqn"], "--checkpoint-every", "1000"],
    "ddpg_td3": ["--env-id", "Pendulum-v1", "--total-timesteps", "500", *SMOKE_FLAGS["ddpg_td3"], "--checkpoint-every", "200"],
    "es": ["--population-size", "8", "--num-generations", "4", "--checkpoint-every", "1"],
    "qlearning": ["--total-timesteps", "30000", "--checkpoint-every", "10000"],
    "ppg_procgen": [*SMOKE_FLAGS["ppg_procgen"], "--total-timesteps", "512", "--checkpoint-every", "128"],
    "rnd_ppo": [*SMOKE_FLAGS["rnd_ppo"], "--total-timesteps", "512", "--checkpoint-every", "128"],
}  # fmt: skip


def full_disk_on_second_checkpoint():
    """torch.save as on a disk that fills during the second checkpoint: part of the .tmp written, then torch's zip
    writer's own error (which names no cause), with the folder's free space at 0."""
    real_save, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        if str(path).endswith("checkpoint.pt.tmp"):
            calls.append(path)
            if len(calls) == 2:
                Path(path).write_bytes(b"PK\x03\x04 cut short")
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        return real_save(obj, path, *args, **kwargs)

    full = shutil._ntuple_diskusage(total=1 << 30, used=1 << 30, free=0)
    return mock.patch.object(torch, "save", save), mock.patch.object(shutil, "disk_usage", lambda _path: full)


@pytest.mark.parametrize("name", sorted(CHECKPOINTED))
def test_a_checkpoint_that_meets_a_full_disk_stops_in_one_line_and_keeps_the_earlier_one(name, tmp_path):
    flags = [*CHECKPOINTED[name], "--progress-interval", "0", CPU]

    def call(module):
        save, usage = full_disk_on_second_checkpoint()
        with save, usage:
            module.main(module.parse_args(flags))

    proc = run_in_process(name, call, tmp_path)
    run = only_run(tmp_path)
    kept = os.path.join(os.path.relpath(run, tmp_path), "checkpoint.pt")
    ckpt = load_file(run / "checkpoint.pt")  # the first checkpoint, whole
    step, env_id = ckpt["global_step"], ckpt["args"]["env_id"]
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"{name}.py: error: cannot write {kept}: No space left on device; the last checkpoint, {kept} (step {step:,}), is as "
        f"it was; resume from it with: python {sys.argv[0]} --env-id {env_id} --resume {kept}"
    ]
    assert not list(tmp_path.rglob("*.tmp"))


def test_an_unwritable_folder_is_named_with_its_cause_and_no_checkpoint_yet(tmp_path):
    """A model written into a folder that is gone: the cause from the error, and no checkpoint to offer."""
    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if str(path).endswith(".model.tmp"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_save(obj, path, *args, **kwargs)

    def call(module):
        with mock.patch.object(torch, "save", save):
            module.main(module.parse_args(["--total-timesteps", "1024", "--save-model", "--progress-interval", "0", CPU]))

    proc = run_in_process("ppo", call, tmp_path)
    model = os.path.join(os.path.relpath(only_run(tmp_path), tmp_path), "ppo.model")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"ppo.py: error: cannot write {model}: Read-only file system; no checkpoint to resume from "
        "(--checkpoint-every N writes one every N steps)"
    ]


def test_a_real_full_tmpfs_leaves_the_earlier_checkpoint_which_resumes(tmp_path):
    """The same on a real filesystem where the test may mount one: a tmpfs that a filler file fills once the first
    checkpoint is in place. Whatever meets the full disk first (tensorboard's events thread, or torch.save), one line
    and no traceback, the free space read from the disk, and the run resumed from the checkpoint that the line names."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)]
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("no tmpfs can be mounted here (the faked full disk above covers every file)")
    try:
        fill = (  # after the first checkpoint's rename, a file takes the rest of the disk
            "import os, runpy, sys\nreal = os.replace\n"
            "def replace(a, b):\n    real(a, b)\n    if str(b).endswith('checkpoint.pt') and not os.path.exists('fill'):\n"
            "        with open('fill', 'wb') as f:\n            try:\n                while True: f.write(b'0' * 65536)\n"
            "            except OSError: pass\nos.replace = replace\nsys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        )
        script = str(ROOT / "algorithms" / "ppo.py")
        flags = [*CHECKPOINTED["ppo"], "--progress-interval", "0", CPU]
        env = one_thread(None)
        proc = subprocess.run([sys.executable, "-c", fill, script, *flags], cwd=disk, capture_output=True, text=True, env=env)
        run = only_run(disk)
        kept = os.path.join(os.path.relpath(run, disk), "checkpoint.pt")
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        # the events' thread or the checkpoint meets the full disk first, whichever writes next
        what, cause = last.split(": No space left on device; ")
        assert what.startswith("ppo.py: error: cannot write ") and os.path.relpath(run, disk) in what, last
        assert cause.startswith(f"the last checkpoint, {kept} (step 1,024), is as it was; resume from it with: python "), last
        assert proc.stderr.strip().splitlines() == [last] and not list(disk.rglob("*.tmp"))
        os.remove(disk / "fill")
        step = load_file(run / "checkpoint.pt")["global_step"]
        resumed = run_algorithm("ppo", "--resume", kept, cwd=disk)
        assert f"resumed {os.path.relpath(run, disk)} at step {step:,}" in resumed.stdout
    finally:
        subprocess.run(["umount", str(disk)])


@pytest.mark.parametrize("name", sorted(CHECKPOINTED))
def test_a_video_that_cannot_be_written_is_said_in_one_line_and_the_run_goes_on(name, tmp_path, capsys):
    """A video's folder that cannot be made (a file stands where it would go): a warning line, no exception, no file."""
    (tmp_path / "videos").write_text("a file, not a folder")
    path = str(tmp_path / "videos" / "final.mp4")
    load_algorithm(name).write_video(path, [np.zeros((8, 8, 3), dtype=np.uint8)] * 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{name}.py: warning: cannot write {path}: File exists; the run goes on"]
    assert not os.path.exists(path)


def test_output_whose_reader_has_gone_ends_the_run_in_one_line(tmp_path):
    """`ppo.py ... | head -3`: the reader of stdout goes after a few lines; the next print meets a broken pipe, and the run
    ends in one line on stderr naming the checkpoint to resume from, exit status 1, no traceback."""
    flags = ["--total-timesteps", "40960", "--checkpoint-every", "512", "--progress-interval", "0", CPU]
    cmd = [sys.executable, str(ROOT / "algorithms" / "ppo.py"), *flags]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=one_thread(None))
    assert proc.stdout.readline().startswith(b"ppo.py: training on cpu")
    while not proc.stdout.readline().startswith(b"step 1,024/"):  # a checkpoint written at step 512
        pass
    proc.stdout.close()
    err = proc.stderr.read().decode().strip().splitlines()
    assert proc.wait(timeout=120) == 1 and len(err) == 1, err
    assert err[0].startswith("ppo.py: error: [Errno 32] Broken pipe; the last checkpoint, runs/"), err
