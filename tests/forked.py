"""Runs of the algorithm files without the cost of their imports: each run forks from a server process that imported
torch, envpool, gymnasium and tyro once (multiprocessing's forkserver, its preload), then runs the script as
`python algorithms/<name>.py ...` does: as __main__, with its own argv, folder, environment, sys.path, output and exit
status. A smoke run of a few seconds spends most of them importing; a forked child starts in milliseconds.

The server imported torch with one OpenMP thread (libgomp reads OMP_NUM_THREADS when it loads), so a run that asks for
another thread count, or one that a test runs under torchrun or with --compile (inductor's compile workers), is left to
a real subprocess: see can_fork."""

import atexit
import ctypes
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from multiprocessing import forkserver

# what a run imports that costs time (python -X importtime: torch and torch._dynamo about 0.9 s of a 2.5 s start)
PRELOAD = ["torch", "torch._dynamo", "numpy", "gymnasium", "tyro", "torch.utils.tensorboard", "envpool", "forked"]
# Seconds a run's shutdown may take, once its script has ended (the interpreter joining threads, running exit handlers:
# well under one on the development machine), and the exit status of one that takes longer
SHUTDOWN_LIMIT = 10.0
SHUTDOWN_HUNG = 124
_context = None
_base_path: list[str] = []


def can_fork(args, env: dict) -> bool:
    """A run the server can stand in for: one thread, and nothing that starts compile workers or logs to wandb."""
    return (
        env.get("OMP_NUM_THREADS") == "1"
        # the interpreter reads PYTHON* variables as it starts: main applies PYTHONPATH and PYTHONWARNINGS, and any
        # other must be this process's own (the server's)
        and all(
            env.get(k) == os.environ.get(k)
            for k in {*env, *os.environ} - {"PYTHONPATH", "PYTHONWARNINGS"}
            if k.startswith("PYTHON")
        )
        and not {"--compile", "--track"} & set(args)
        and os.environ.get("TESTS_SUBPROCESS") != "1"  # TESTS_SUBPROCESS=1: every run a real subprocess, to compare
    )


def context():
    """The forkserver context, its server started (once per test worker) with one OpenMP thread."""
    global _context
    if _context is None:
        # sys.path as a fresh interpreter has it before its script's folder and PYTHONPATH: -I leaves both out
        code = "import json, sys; print(json.dumps(sys.path))"
        _base_path[:] = json.loads(subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True).stdout)
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        os.environ["OMP_NUM_THREADS"] = "1"  # the server inherits this process's environment as it starts
        try:
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return _context


def run(cmd: list[str], cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout) for cmd = [python,
    script, *args]: the child forked from the server where can_fork, else that subprocess itself."""
    if not can_fork(cmd[2:], env):
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    child = Started(cmd, cwd, env)
    stdout, stderr = child.finish(timeout)
    return subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)


def popen(cmd: list[str], cwd, env: dict):
    """subprocess.Popen(cmd, cwd=cwd, env=env, stdout=PIPE, text=True), or a Started fork where can_fork."""
    if not can_fork(cmd[2:], env):
        return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True, env=env)
    return Started(cmd, cwd, env)


class Started:
    """What a test uses of subprocess.Popen(cmd, stdout=PIPE, text=True) for a forked run: its output line by line as it
    comes (stdout), send_signal, communicate (the rest of the output; stderr goes to this process's) and returncode."""

    def __init__(self, cmd: list[str], cwd, env: dict):
        self._tmp = tempfile.TemporaryDirectory()
        self._out, self._err = (os.path.join(self._tmp.name, name) for name in ("out", "err"))
        open(self._out, "w").close()
        where = (cmd[1], cmd[2:], str(cwd), env, self._out, self._err, _base_path, SHUTDOWN_LIMIT)
        self._child = context().Process(target=main, args=where)
        self._child.start()
        self.args, self.pid, self.returncode = cmd, self._child.pid, None
        self._reader = open(self._out, errors="replace")
        self.stdout = self._lines()

    def _lines(self):
        """The lines of the output as the child flushes them, until it has exited and all is read."""
        partial = ""
        while True:
            alive = self._child.is_alive()
            partial += self._reader.readline()
            if partial.endswith("\n") or (partial and not alive):
                yield partial
                partial = ""
            elif not alive:
                return
            else:
                time.sleep(0.02)

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def finish(self, timeout: float | None) -> tuple[str, str]:
        """Wait for the exit (killing the child after timeout seconds): the output not yet read, and the errors."""
        self._child.join(timeout)
        timed_out = self._child.exitcode is None
        if timed_out:
            self._child.kill()
            self._child.join()
        self.returncode = self._child.exitcode
        with self._reader, open(self._err, errors="replace") as errors:
            stdout, stderr = self._reader.read(), errors.read()
        self._tmp.cleanup()
        if timed_out:
            raise subprocess.TimeoutExpired(self.args, timeout, output=stdout, stderr=stderr)
        return stdout, stderr

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        stdout, stderr = self.finish(timeout)
        sys.stderr.write(stderr)
        return stdout, None


def main(script: str, args: list[str], cwd: str, env: dict, out: str, err: str, base_path: list[str], limit: float) -> None:
    """The child: the script as __main__, as `python script *args` runs it in cwd with env, and its exit."""
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    pythonpath = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.abspath(script)), *pythonpath, *base_path]
    sys.argv = [script, *args]
    sys.warnoptions[:] = [w for w in env.get("PYTHONWARNINGS", "").split(",") if w]
    warnings._processoptions(sys.warnoptions)
    atexit._clear()  # the server's own exit handlers are not the run's
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # what the interpreter does at exit: wait for the threads that are not daemons, then the exit handlers; where a real
    # one would wait for ever, the child ends after `limit` seconds, saying what it waited for
    threading.Thread(target=hung, args=(limit,), daemon=True).start()
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    # the C library's exit, as the interpreter's last step: the exit handlers of the libraries the run loaded (C++
    # destructors among them, where a crash at exit happens) run here too; os._exit, multiprocessing's, skips them
    ctypes.CDLL(None).exit(code & 0xFF)


def hung(limit: float) -> None:
    """The child's end, `limit` seconds into its shutdown: a thread that is not a daemon and never ends (or an exit handler
    that never returns) would keep a real interpreter, and the test waiting on it, there for ever."""
    time.sleep(limit)
    waiting = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    what = f"the threads {waiting}, which are not daemons," if waiting else "an exit handler"
    os.write(2, f"forked.py: the script had ended, and {what} still ran {limit} s later; Python waits for them\n".encode())
    os._exit(SHUTDOWN_HUNG)
