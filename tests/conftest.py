"""Helpers shared by every test: load an algorithm's functions, run it end to end, read what it logged."""

import contextlib
import dataclasses
import functools
import io
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import envpool  # noqa: F401  every env family registered, as a user's own `import envpool` has them
import forked
import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from algos import load_algorithm
from tblog import read_scalars

ROOT = Path(__file__).resolve().parent.parent
# pytest-xdist runs one test per core; the tests' own torch work is small, and more threads would only spin
torch.set_num_threads(1)


def flat_params(params) -> torch.Tensor:
    """A network's (or a parameter list's) weights as one detached vector, copied: to compare before and after a step."""
    params = params.parameters() if isinstance(params, torch.nn.Module) else params
    return torch.cat([p.detach().flatten() for p in params]).clone()


# Subprocess limits: about 30x what a smoke run takes on the 2-core development machine, so that a CI machine three
# times slower and loaded does not time out (learning checks pass their own, measured the same way).
SMOKE_TIMEOUT = 900
# bit-for-bit comparisons and margins measured on CPU need the CPU: CUDA kernels are not bit-deterministic
CPU = "--no-cuda"
# The small sizes of each file's smoke runs, where its defaults would take minutes
SMOKE_FLAGS = {
    "dqn": ["--learning-starts", "500", "--buffer-size", "1000", "--log-every", "500"],
    "ddpg_td3": ["--hidden-size", "32", "--batch-size", "32", "--learning-starts", "300", "--buffer-size", "2000",
                 "--log-every", "200"],
    "ppg_procgen": ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--n-pi", "2", "--e-aux", "1"],
    "rnd_ppo": ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--num-iterations-obs-norm-init", "1",
                "--max-episode-steps", "40", "--no-cuda"],
}  # fmt: skip


def one_thread(env: dict | None) -> dict:
    """A subprocess's environment: this process's, with env's variables added (PATH and PYTHONPATH stay), and one torch
    thread unless OMP_NUM_THREADS is set. torch's OpenMP threads spin while they wait: two of them on a loaded 2-core
    machine ran dqn.py at 30 steps per second. On the CPU the runs are the same with one thread or two (checked for
    dqn.py and ppo.py on CartPole over 30k-200k steps)."""
    env = {**os.environ, **(env or {})}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# How Python starts a traceback it prints: an uncaught or printed error, and one in a __del__, thread or exit handler
TRACEBACKS = ("Traceback (most recent call last)", "Exception ignored in", "Exception in thread")


def run_script(
    script: Path, *args: str, cwd: Path, timeout: float = SMOKE_TIMEOUT, check: bool = True, env=None, fork: bool = True
) -> subprocess.CompletedProcess:
    """Run `python script *args` in cwd and return the CompletedProcess: forked from the server (tests/forked.py), the
    same run less the seconds of imports, or with fork=False a real subprocess. With check, it must exit 0; whatever
    its exit, a run that exits 0 printed no traceback (an error caught and printed, or one at shutdown, which Python
    prints and exits 0 after)."""
    cmd = [sys.executable, str(script), *args]
    environment = one_thread(env)
    if fork:
        proc = forked.run(cmd, cwd, environment, timeout)
    else:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=environment)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if proc.returncode == 0:
        printed = [line for line in proc.stderr.splitlines() if any(start in line for start in TRACEBACKS)]
        assert not printed, f"{' '.join(cmd)} exited 0 and printed {printed[0]!r}\n{proc.stderr[-3000:]}"
    return proc


def run_algorithm(
    name: str, *args: str, cwd: Path, timeout: float = SMOKE_TIMEOUT, check: bool = True, env=None, fork: bool = True
):
    """Run algorithms/<name>.py in cwd (its runs/ lands there; run_script: forked unless fork=False) and return the
    CompletedProcess. A run that ends well printed no traceback and passes check_run (finite logs, a saved model that
    trained), whatever else its test asserts."""
    started = time.time()
    proc = run_script(ROOT / "algorithms" / f"{name}.py", *args, cwd=cwd, timeout=timeout, check=check, env=env, fork=fork)
    if proc.returncode == 0 and (cwd / "runs").is_dir():
        for run_dir in run_dirs(cwd):
            if run_dir.stat().st_mtime >= started - 1:
                check_run(name, run_dir, env)
    return proc


# The network each script builds first after seed_and_device, as its main builds it: a fresh one of a run's seed
FIRST_NETWORK = {
    **dict.fromkeys(
        ("ppo", "a2c", "rnd_ppo"),  # the actor-critics, with the memory --rnn asks for
        lambda m, args, obs_space, action_space: m.Agent(obs_space, action_space, args.rnn, args.rnn_size),
    ),
    "ppg_procgen": lambda m, args, obs_space, action_space: m.Agent(obs_space, action_space, args.arch),
    "dqn": lambda m, args, obs_space, action_space: m.QNetwork(obs_space, action_space),
    "ddpg_td3": lambda m, args, obs_space, action_space: m.Actor(obs_space.shape[0], action_space, args.hidden_size),
    "es": lambda m, args, obs_space, action_space: m.Policy(
        obs_space.shape[0], action_space.shape[0] if action_space.shape else int(action_space.n), tuple(args.hidden_sizes)
    ),
}


def python_paths(env: dict | None) -> list[str]:
    """The folders a subprocess environment puts on PYTHONPATH: what an in-process call must import from too."""
    return [p for p in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if p]


def load_file(path) -> dict:
    """A checkpoint or model file read as the scripts read it: PyTorch's safe loader (weights_only), with the numpy types
    the scripts allow by name (NUMPY_TYPES, the same in every file's shared block), so that nothing in a file runs."""
    with torch.serialization.safe_globals(load_algorithm("ppo").NUMPY_TYPES):
        return torch.load(path, map_location="cpu", weights_only=True)


def check_run(name: str, run_dir: Path, env=None) -> None:
    """What every finished smoke run must show: each logged scalar finite, and a saved model whose weights are finite
    and no longer those of a freshly initialised model of the same seed (a NaN loss or a skipped optimiser step)."""
    for tag, points in scalars(run_dir).items():
        bad = [(step, value) for step, value, _ in points if not math.isfinite(value)]
        assert not bad, f"{run_dir.name}: {tag} logged non-finite values (step, value) {bad[:3]}"
    model_path = run_dir / f"{name}.model"
    if not model_path.is_file():
        return
    state = load_file(model_path)
    saved = {"q": state["q"]} if name == "qlearning" else state["model"]
    assert all(torch.isfinite(v).all() for v in saved.values() if v.is_floating_point()), f"{model_path}: not finite"
    if name == "qlearning":
        assert saved["q"].abs().sum() > 0, f"{model_path}: the table never moved from zeros"
        return
    module = load_algorithm(name)
    fields = {f.name for f in dataclasses.fields(module.Args)}
    args = module.Args(**{k: v for k, v in state["args"].items() if k in fields})
    paths = python_paths(env)
    sys.path[:0] = paths
    try:
        obs_space, action_space = module.env_spaces(args.env_id)
    finally:
        del sys.path[: len(paths)]
    fresh, other = (initial_weights(name, args, seed, obs_space, action_space) for seed in (args.seed, args.seed + 1))
    assert fresh.keys() == saved.keys(), f"{model_path}: the fresh network has other weights than the saved one"
    assert any(not torch.equal(fresh[k], saved[k]) for k in saved), f"{model_path}: the weights never moved"
    # and the fresh network is this run's initialisation, not some network that differs trivially: the saved weights
    # are nearer to it than to another seed's
    assert distance(saved, fresh) < distance(saved, other), f"{model_path}: the fresh network is not this run's start"


def initial_weights(name: str, args, seed: int, obs_space, action_space) -> dict:
    module = load_algorithm(name)
    with torch.random.fork_rng():
        module.seed_and_device(dataclasses.replace(args, seed=seed))
        return FIRST_NETWORK[name](module, args, obs_space, action_space).state_dict()


def distance(a: dict, b: dict) -> float:
    return sum((a[k].double() - b[k].double()).pow(2).sum().item() for k in a if a[k].is_floating_point()) ** 0.5


def stop_run(name: str, *args: str, cwd: Path, at: int, sig: int = signal.SIGTERM, unit: str = "step", env=None) -> str:
    """Start algorithms/<name>.py, send `sig` once its progress line ("<unit> N/total ...") reaches N >= at, wait,
    and check the exit: 128 + sig after the checkpoint that SIGTERM and SIGINT ask for, -9 for SIGKILL. Returns
    its output. On the machine's device: most callers check steps and files, not values to the bit; those that do
    pass CPU."""
    cmd = [sys.executable, str(ROOT / "algorithms" / f"{name}.py"), *args]
    proc = forked.popen(cmd, cwd, one_thread(env))
    for line in proc.stdout:
        if (m := re.match(rf"{unit} ([\d,]+)/", line)) and int(m.group(1).replace(",", "")) >= at:
            proc.send_signal(sig)
            break
    out, _ = proc.communicate(timeout=SMOKE_TIMEOUT)
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), out[-3000:]
    return out


def seeded_runs(name: str, seeds, cwd: Path, *flags: str, tags=(), read=None, env=None, real=()) -> list:
    """Run algorithms/<name>.py once per seed (exp names s0, s1, ...) and return, for each run, read(run_dir), or by
    default the logged values of each of tags. On the CPU (--no-cuda) whatever the machine has: the callers compare
    runs to the bit, which only the CPU repeats (CUDA kernels are not bit-deterministic). The runs whose indices are in
    real take a real subprocess, the others are forked (tests/forked.py)."""
    read = read or (lambda run: [values(run, t) for t in tags])
    runs = []
    for i, seed in enumerate(seeds):
        run_algorithm(name, "--seed", str(seed), "--exp-name", f"s{i}", CPU, *flags, cwd=cwd, env=env, fork=i not in real)
        runs.append(read(next((cwd / "runs").glob(f"*__s{i}__*"))))
    return runs


def marks(script: str, **fields) -> dict:
    """The fields as save_checkpoint marks them for script: its name, its CHECKPOINT_FORMAT and the fields' names."""
    layout = load_algorithm(script.removesuffix(".py")).CHECKPOINT_FORMAT
    return dict(script=script, format=layout, fields=sorted(fields), run_name="r", **fields)


def write_foreign_checkpoint(path: Path, env_id: str, script: str) -> str:
    """A checkpoint of script for another env, for the 'checkpoint is for <env>' error; it has the keys that each
    script checks for before it compares the env."""
    torch.save({"kind": "checkpoint", "args": {"env_id": env_id}, **marks(script, model={}, q=torch.zeros(1))}, path)
    return str(path)


def with_foreign_checkpoint(flags: list[str], cwd: Path, env_id: str, script: str) -> list[str]:
    """flags with the placeholder FOREIGN replaced by the path of a checkpoint of script written for env_id."""
    return [write_foreign_checkpoint(cwd / "foreign.pt", env_id, script) if f == "FOREIGN" else f for f in flags]


def run_in_process(name: str, call, cwd: Path, paths=()) -> subprocess.CompletedProcess:
    """call(module of algorithms/<name>.py) in this process, in cwd, with paths importable, and its exit status and
    output as a subprocess's: bad input ends before training, and a subprocess would add seconds of imports per case.
    A call that is not refused would train, so an alarm ends it after SMOKE_TIMEOUT seconds as a failure."""
    module, out, err, code = load_algorithm(name), io.StringIO(), io.StringIO(), 0
    saved = os.getcwd(), list(sys.path), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def too_long(_signum, _frame):
        raise TimeoutError(f"{name}.py was not refused: it ran for {SMOKE_TIMEOUT} s")

    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(SMOKE_TIMEOUT)
    try:
        os.chdir(cwd)
        sys.path[:0] = list(paths)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                call(module)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        signal.alarm(0)
        os.chdir(saved[0])
        sys.path[:] = saved[1]
        for s, handler in saved[2].items():
            signal.signal(s, handler)
    return subprocess.CompletedProcess([name], code, out.getvalue(), err.getvalue())


class FirstGradients:
    """Watches every optimiser step in its block (torch's global hook) and, after each step, the first gradient that
    reaches each parameter it stepped: that parameter's .grad must be None or zero then, or the step after adds the
    last one's gradient again (an update that drops its zero_grad still learns CartPole). Later gradients before the
    next step may add up (a minibatch in chunks). check() asserts it, and that the watch saw something."""

    def __enter__(self):
        self.waiting, self.hooked, self.steps, self.checked, self.stale = {}, set(), {}, {}, []
        self.handle = register_optimizer_step_post_hook(self.stepped)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def stepped(self, optimizer, _args, _kwargs):
        self.steps[id(optimizer)] = self.steps.get(id(optimizer), 0) + 1
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.waiting[p] = id(optimizer)
                if p not in self.hooked:  # a leaf's hook runs before the gradient is added to its .grad
                    self.hooked.add(p)
                    p.register_hook(functools.partial(self.arrives, p))

    def arrives(self, p, _grad):
        if (optimizer := self.waiting.pop(p, None)) is None:
            return
        self.checked[optimizer] = self.checked.get(optimizer, 0) + 1
        if p.grad is not None and p.grad.any():
            self.stale.append(tuple(p.shape))

    def check(self, name: str, optimisers: int) -> None:
        """No stale gradient; and optimisers optimisers stepped, each seeing gradients arrive after one of its steps."""
        assert not self.stale, f"{name}.py: a gradient was added to the last step's, in parameters shaped {self.stale[:4]}"
        assert len(self.steps) == optimisers, f"{name}.py: {len(self.steps)} optimisers stepped, not {optimisers}"
        assert all(self.checked.get(o, 0) > 0 for o in self.steps), f"{name}.py: an optimiser stepped only once"


def run_bad_input(name: str, flags: list[str], cwd: Path, foreign_env_id: str, env=None) -> subprocess.CompletedProcess:
    """Run algorithms/<name>.py's parse_args and main with bad flags (FOREIGN: a checkpoint of foreign_env_id) in this
    process, with env's PYTHONPATH importable, letting it fail; bad input never leaves a run directory behind."""
    flags = with_foreign_checkpoint(flags, cwd, foreign_env_id, f"{name}.py")
    before = run_dirs(cwd) if (cwd / "runs").is_dir() else []
    paths = python_paths(env)
    proc = run_in_process(name, lambda module: module.main(module.parse_args(flags)), cwd, paths)
    if proc.returncode != 0:
        assert (run_dirs(cwd) if (cwd / "runs").is_dir() else []) == before, proc.stderr
    return proc


def assert_one_error_line(name: str, proc: subprocess.CompletedProcess, message: str) -> None:
    """Bad input: exit status 2, no traceback, and exactly one '<name>.py: error:' line that matches message."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith(f"{name}.py: error:")]
    assert len(error_lines) == 1 and re.search(message, error_lines[0]), proc.stderr


def run_dirs(cwd: Path) -> list[Path]:
    return sorted(p for p in (cwd / "runs").iterdir() if p.is_dir())


def only_run(cwd: Path) -> Path:
    dirs = run_dirs(cwd)
    assert len(dirs) == 1, dirs
    return dirs[0]


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    return read_scalars(str(run_dir))


def values(run_dir: Path, tag: str) -> list[float]:
    return [v for _, v, _ in scalars(run_dir)[tag]]


@pytest.fixture
def test_env():
    """Environment for subprocesses: tests/ on the path for the custom gymnasium env module."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


def twenty_episode_means(run_dir: Path):
    """The rolling 20-episode means of a run's returns, with the step of each window's last episode."""
    points = scalars(run_dir)["charts/episodic_return"]
    steps, returns = np.array([s for s, _, _ in points]), np.array([v for _, v, _ in points])
    return steps[19:], np.convolve(returns, np.ones(20) / 20, mode="valid")
