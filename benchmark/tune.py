"""Tune an algorithm's flags with Optuna: each trial runs the script over envs x seeds, side by side.

    python benchmark/tune.py --script ppo --env-ids CartPole-v1 Acrobot-v1 --trials 50 --seeds 2 \\
        --param learning-rate=log:1e-5:1e-2 --param num-steps=cat:64,128,256 -- --total-timesteps 100000

Everything after `--` goes to every run. A trial's value is the mean over its runs of each run's score: the mean of
eval/episodic_return at the run's last evaluation, or of its last --last-episodes training returns; with several envs,
each score is first scaled by the env's target scores, (x - low) / (high - low). While the runs train, the mean of
their recent training returns is reported to the pruner every --report-every env steps, and a pruned trial's runs are
killed. The study folder (benchmark/tuning/<study name>/ by default) holds study.db, trials.md, history.png,
importances.png and runs/trial_<number>/<env>__<seed>/ (each run's output.log and its runs/ directory).

The same command goes on with a stopped study (Ctrl-C, a killed machine): it runs only the trials still missing, and
only prints the results once the study has --trials finished (COMPLETE or PRUNED) trials. Several machines can work on
one study through a shared --storage (a database URL, or a .log / .journal file on a shared file system).
Guide: docs/tuning.md.
"""

import argparse
import ast
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # plots are files; no display is needed, nor wanted under a scheduler
import matplotlib.pyplot as plt
import numpy as np
import optuna
from optuna.trial import TrialState
from optuna.visualization.matplotlib import plot_optimization_history, plot_param_importances
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from run import format_seconds

# optuna flags the heartbeat and the matplotlib plots as experimental on every use
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("int", "float", "log", "cat")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
# The tuner gives every run these; typed after `--` they would make all runs of a trial the same run, or hide them
SET_BY_TUNER = ("env_id", "seed", "exp_name")
# Target scores (low, high) that put envs on one scale: low is the mean return of a uniformly random policy (100
# episodes with gymnasium, seeds 0-99), high is the env's gymnasium reward_threshold ("solved"); Pendulum has no
# threshold, and 0 is its best possible return (every step's reward is <= 0). Other envs: --target ENV=LOW:HIGH.
TARGETS = {
    "CartPole-v1": (25.0, 475.0),
    "Acrobot-v1": (-500.0, -100.0),
    "MountainCar-v0": (-200.0, -110.0),
    "Pendulum-v1": (-1200.0, 0.0),
}


def fail(message: str):
    """Bad input: one line `tune.py: error: <what>; <fix>` and exit status 2, as the scripts do."""
    print(f"tune.py: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors (a missing or malformed option) in the same one line
        fail(f"{message}; see python benchmark/tune.py --help")


def script_fields(script: str) -> dict[str, str]:
    """The flags of algorithms/<script>.py as {field name: annotation}, read from its Args class with ast: importing
    the script would import torch and envpool for each check. Args gains the shared block's Tracking flags (--track). Fields
    tyro suppresses are computed, not flags."""
    tree = ast.parse((ROOT / "algorithms" / f"{script}.py").read_text())
    parts = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in ("Args", "Tracking")]
    fields = {n.target.id: ast.unparse(n.annotation) for part in parts for n in part.body if isinstance(n, ast.AnnAssign)}
    return {name: kind for name, kind in fields.items() if "Suppress" not in kind}


def parse_param(text: str, fields: dict[str, str]) -> tuple[str, str, list]:
    """`name=kind:spec` as (flag name with dashes, kind, [low, high] or the categories as typed)."""
    name, _, spec = text.partition("=")
    kind, _, bounds = spec.partition(":")
    field = name.strip("-").replace("-", "_")
    if field not in fields:
        fail(f"--param {text}: {name} is not a flag of the script; pass one of its flags (see its --help)")
    if field in SET_BY_TUNER:
        fail(f"--param {text}: the tuner sets --{field.replace('_', '-')} itself; tune another flag")
    if kind not in KINDS:
        fail(f"--param {text}: unknown kind {kind!r}; write name=int:LOW:HIGH, float:LOW:HIGH, log:LOW:HIGH or cat:a,b")
    flag = field.replace("_", "-")
    if kind == "cat":
        choices = bounds.split(",")
        if not bounds or "" in choices or len(set(choices)) != len(choices):
            fail(f"--param {text}: cat needs distinct, non-empty values; write {flag}=cat:a,b,c")
        if fields[field] == "bool" and {c.lower() for c in choices} - {"true", "false"}:
            fail(f"--param {text}: --{flag} is a boolean flag; write {flag}=cat:true,false")
        return flag, kind, choices
    if fields[field] == "bool":
        fail(f"--param {text}: --{flag} is a boolean flag; write {flag}=cat:true,false")
    if kind != "int" and fields[field] == "int":
        fail(f"--param {text}: --{flag} takes integers; write {flag}=int:LOW:HIGH or {flag}=cat:...")
    try:
        low, high = ((int if kind == "int" else float)(b) for b in bounds.split(":"))
    except ValueError:
        fail(f"--param {text}: {kind} needs two {'integers' if kind == 'int' else 'numbers'}; write {flag}={kind}:LOW:HIGH")
    if low >= high or (kind == "log" and low <= 0):
        fail(f"--param {text}: needs LOW < HIGH{' and LOW > 0 (log scale)' if kind == 'log' else ''}; change the bounds")
    return flag, kind, [low, high]


def parse_enqueue(text: str, params: dict[str, tuple]) -> dict:
    """`name=value,name=value` as the trial's parameters, each checked against its --param."""
    values = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        flag = name.strip("-").replace("_", "-")
        if flag not in params:
            fail(f"--enqueue {text}: {name} is not a tuned parameter; enqueue values of the --param flags only")
        kind, spec = params[flag]
        try:
            values[flag] = value if kind == "cat" else (int if kind == "int" else float)(value)
        except ValueError:
            fail(f"--enqueue {text}: {flag} needs a number; write {flag}=<number>")
        if (kind == "cat" and value not in spec) or (kind != "cat" and not spec[0] <= values[flag] <= spec[1]):
            fail(f"--enqueue {text}: {flag}={value} is outside its --param {kind}:{':'.join(map(str, spec))}; change it")
    return values


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str], dict[str, str]]:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = Parser(prog="tune.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", required=True, help="script name in algorithms/, e.g. ppo")
    p.add_argument("--env-ids", nargs="+", required=True, help="env ids each trial runs on")
    p.add_argument("--trials", type=int, required=True, help="finished (COMPLETE or PRUNED) trials the study ends with")
    p.add_argument("--seeds", type=int, default=1, help="seeds 1..K per env in each trial (default: 1)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=KIND:SPEC",
                   help="a tuned flag, repeatable: int:LOW:HIGH, float:LOW:HIGH, log:LOW:HIGH (log scale), cat:a,b,c "
                        "(true,false for a boolean flag)")  # fmt: skip
    p.add_argument("--enqueue", action="append", default=[], metavar="NAME=VALUE,...",
                   help="a trial with these parameters, run before the sampler's (repeatable), e.g. the defaults")  # fmt: skip
    p.add_argument("--target", action="append", default=[], metavar="ENV=LOW:HIGH",
                   help=f"an env's score scale, for several envs (repeatable); built in: {', '.join(TARGETS)}")  # fmt: skip
    p.add_argument("--objective", choices=("auto", "train", "eval"), default="auto",
                   help="a run's score: eval/episodic_return at its last evaluation (auto: where the run evaluated; "
                        "eval: required), or the mean of its last --last-episodes training returns (train)")  # fmt: skip
    p.add_argument("--last-episodes", type=int, default=20, help="training episodes a score averages (default: 20)")
    p.add_argument("--report-every", type=int, default=10_000, help="env steps between reports to the pruner (default: 10000)")
    p.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median",
                   help="how trials stop early: optuna's MedianPruner (default), HyperbandPruner, or none")  # fmt: skip
    p.add_argument("--prune-startup", type=int, default=5, help="median: trials that finish before any is pruned (default: 5)")
    p.add_argument(
        "--prune-warmup", type=int, default=2, help="median: reports a trial makes before it may be pruned (default: 2)"
    )
    p.add_argument(
        "--sampler-seed", type=int, default=1, help="seed of the TPE sampler: a study repeats, up to run timing (default: 1)"
    )
    p.add_argument("--workers", type=int, default=1, help="trials at once on this machine (default: 1)")
    p.add_argument("--study-name", help="study name (default: <script>_<env ids>)")
    p.add_argument("--out", default=str(ROOT / "benchmark" / "tuning"), help="parent of study folders")
    p.add_argument("--storage", help="optuna storage: a database URL, or a .log/.journal file for many machines "
                                     "(default: sqlite:///<out>/<study name>/study.db)")  # fmt: skip
    args = p.parse_args(argv)
    if not (ROOT / "algorithms" / f"{args.script}.py").is_file():
        known = sorted(s.stem for s in (ROOT / "algorithms").glob("*.py"))
        fail(f"no algorithms/{args.script}.py; pass one of {', '.join(known)}")
    for name in ("trials", "seeds", "workers", "last_episodes", "report_every"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1; pass a positive number")
    if min(args.prune_startup, args.prune_warmup) < 0:
        fail("--prune-startup and --prune-warmup must be 0 or more; pass a smaller count")
    fields = script_fields(args.script)
    args.params = {}
    for text in args.param:
        flag, kind, spec = parse_param(text, fields)
        if flag in args.params:
            fail(f"--param {flag} is given twice; keep one")
        args.params[flag] = (kind, spec)
    if not args.params:
        fail("nothing to tune; pass at least one --param NAME=KIND:SPEC")
    for arg in (a for a in extra if a.startswith("--")):
        name = arg[2:].partition("=")[0].replace("-", "_")
        field = name[3:] if name.startswith("no_") and fields.get(name[3:]) == "bool" else name
        if field not in fields:
            fail(f"{arg} after -- is not a flag of {args.script}.py; see python algorithms/{args.script}.py --help")
        if field in SET_BY_TUNER:
            fail(f"{arg} after --: the tuner sets --env-id, --seed and --exp-name itself; use --env-ids and --seeds")
        if field.replace("_", "-") in args.params:
            fail(f"{arg} after -- is also tuned by --param; drop one of them")
    args.enqueued = [parse_enqueue(text, args.params) for text in args.enqueue]
    args.targets = dict(TARGETS)
    for text in args.target:
        env_id, _, bounds = text.rpartition("=")
        try:
            low, high = (float(b) for b in bounds.split(":"))
        except ValueError:
            fail(f"--target {text}: write ENV=LOW:HIGH with two numbers")
        if not env_id or low >= high:
            fail(f"--target {text}: needs an env id and LOW < HIGH; write ENV=LOW:HIGH")
        args.targets[env_id] = (low, high)
    missing = [e for e in args.env_ids if e not in args.targets]
    if len(args.env_ids) > 1 and missing:
        fail(f"no target scores for {', '.join(missing)}, so its returns cannot be averaged with other envs'; "
             f"pass --target {missing[0]}=LOW:HIGH (e.g. a random policy's score and a solved score)")  # fmt: skip
    args.study_name = safe_name(args.study_name or f"{args.script}_{'_'.join(args.env_ids)}")
    return args, extra, fields


def safe_name(text: str) -> str:
    """A folder name from an env id or a study name ('ALE/Pong-v5', 'module:Env-v0')."""
    return re.sub(r"[^\w.-]+", "-", text)


def open_storage(url: str):
    """A .log or .journal path is a JournalStorage file: appends under a file lock, which many workers on several
    machines can share over a network file system. Anything else is a database URL. The heartbeat marks a trial whose
    tuner died (kill -9, a lost machine) FAIL after the grace period, so that it is not left RUNNING for good."""
    if url.endswith((".log", ".journal")):
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))
    return optuna.storages.RDBStorage(url, heartbeat_interval=10, grace_period=30)


class Stop(Exception):
    """Ends the whole study, not one trial: Ctrl-C or SIGTERM (code 130), or a run's bad-input line (code 2)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.message, self.code = message, code


class RunFailed(Exception):
    """A run crashed: its trial fails, and the study goes on with other parameters."""


class Run:
    """One run of a trial in its own folder and process group, and what it has logged so far."""

    def __init__(self, env_id: str, seed: int, cmd: list[str], cwd: Path, env: dict):
        self.env_id, self.seed = env_id, seed
        cwd.mkdir(parents=True, exist_ok=True)
        self.cwd, self.log = cwd, cwd / "output.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)
        self.acc, self.step, self.ended = None, 0, False
        self.returns: list[tuple[int, float]] = []
        self.evals: list[tuple[int, float]] = []

    def read(self) -> None:
        """Load the events written since the last call: the accumulator keeps its place in the event file."""
        if self.acc is None:
            found = sorted((self.cwd / "runs").glob("*/events.out.tfevents.*"))
            if not found:
                return
            self.acc = EventAccumulator(str(found[0].parent), size_guidance={"scalars": 0})
        self.acc.Reload()
        tags = self.acc.Tags()["scalars"]
        self.step = max((self.acc.Scalars(t)[-1].step for t in tags), default=0)
        for tag, points in (("charts/episodic_return", "returns"), ("eval/episodic_return", "evals")):
            setattr(self, points, [(e.step, e.value) for e in self.acc.Scalars(tag)] if tag in tags else [])

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the whole group: torchrun's workers too
            except ProcessLookupError:
                pass
        self.proc.wait()


class Tuner:
    def __init__(self, args: argparse.Namespace, extra: list[str], fields: dict[str, str], study_dir: Path):
        self.args, self.extra, self.fields, self.study_dir = args, extra, fields, study_dir
        self.stop: Stop | None = None
        self.stopping = threading.Event()
        # the finished trials' count for the progress line, under a lock: two trials that end together each take their own
        self.finished, self.lock = 0, threading.Lock()
        # the runs share the cores: more torch threads than cores only spin (CONTRIBUTING.md); an OMP_NUM_THREADS
        # given to the tuner caps each run's, for a machine that other work shares
        threads = max(1, (os.cpu_count() or 1) // (args.workers * len(args.env_ids) * args.seeds))
        threads = min(threads, int(os.environ.get("OMP_NUM_THREADS") or threads))
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)}

    def request_stop(self, stop: Stop) -> None:
        self.stop = self.stop or stop
        self.stopping.set()

    def halt(self, message: str):
        """Stop the study on input that every trial would meet again."""
        self.request_stop(Stop(message, 2))
        raise self.stop

    def flags(self, params: dict) -> list[str]:
        """A trial's parameters as the script's flags; a boolean flag is --name or --no-name."""
        out = []
        for flag, value in params.items():
            if self.fields[flag.replace("-", "_")] == "bool":
                out.append(f"--{flag}" if value.lower() == "true" else f"--no-{flag}")
            else:
                out += [f"--{flag}", str(value)]
        return out

    def score(self, env_id: str, x: float) -> float:
        if len(self.args.env_ids) == 1:
            return x
        low, high = self.args.targets[env_id]
        return (x - low) / (high - low)

    def objective(self, trial: optuna.Trial) -> float:
        args = self.args
        params = {
            flag: trial.suggest_categorical(flag, spec) if kind == "cat"
            else trial.suggest_int(flag, *spec) if kind == "int"
            else trial.suggest_float(flag, *spec, log=kind == "log")
            for flag, (kind, spec) in args.params.items()
        }  # fmt: skip
        script = [sys.executable, str(ROOT / "algorithms" / f"{args.script}.py")]
        folder = self.study_dir / "runs" / f"trial_{trial.number}"
        if self.stopping.is_set():  # stopped between two trials
            raise self.stop
        runs = [
            Run(e, s, [*script, "--env-id", e, "--seed", str(s), "--exp-name", "tune", *self.flags(params), *self.extra],
                folder / f"{safe_name(e)}__{s}", self.env)
            for e in args.env_ids
            for s in range(1, args.seeds + 1)
        ]  # fmt: skip
        try:
            reported = 0
            while True:
                for r in runs:
                    r.ended = r.proc.poll() is not None  # before the read, so that it reads the last events
                    r.read()
                # grid point m is reached once every run logged a step past m * report_every (or ended there): the
                # scripts log in step order, so by then each run's returns up to that step are all in
                reached = min(r.step if r.ended else r.step - 1 for r in runs)
                while reported < reached // args.report_every:
                    reported += 1
                    upto = reported * args.report_every
                    recent = [(r.env_id, [v for s, v in r.returns if s <= upto][-args.last_episodes :]) for r in runs]
                    if all(x for _, x in recent):  # else a run has no episode yet to judge it by
                        trial.report(float(np.mean([self.score(e, np.mean(x)) for e, x in recent])), reported)
                        if trial.should_prune():
                            raise optuna.TrialPruned(f"at step {upto:,}")
                if all(r.ended for r in runs):
                    break
                if self.stopping.wait(2.0):
                    raise self.stop
            for r in runs:
                if r.proc.returncode == 2:  # the script refused its flags: every trial would, so stop the study
                    line = next((x for x in r.log.read_text().splitlines() if ": error:" in x), f"see {r.log}")
                    self.halt(f"{r.env_id} seed {r.seed} of trial {trial.number} refused its flags: {line}")
                if r.proc.returncode != 0:
                    trial.set_user_attr("error", f"{r.env_id} seed {r.seed} exited {r.proc.returncode}, see {r.log}")
                    raise RunFailed(trial.user_attrs["error"])
            return float(np.mean([self.score(r.env_id, self.run_score(r)) for r in runs]))
        finally:
            for r in runs:
                r.kill()

    def run_score(self, r: Run) -> float:
        """The mean of the evaluation at the run's last evaluated step (--save-model logs one point per episode), or
        of its last training returns."""
        if self.args.objective != "train" and r.evals:
            return float(np.mean([v for s, v in r.evals if s == r.evals[-1][0]]))
        if self.args.objective == "eval":
            self.halt(f"--objective eval, but {r.env_id} seed {r.seed} logged no eval/episodic_return; pass "
                      "--save-model or --eval-every N after --, or use --objective auto")  # fmt: skip
        if not r.returns:
            self.halt(f"{r.env_id} seed {r.seed} finished no training episode; give the runs more --total-timesteps")
        return float(np.mean([v for _, v in r.returns[-self.args.last_episodes :]]))

    def progress(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """The line printed as each trial ends: finished count, its state and value, the best so far."""
        value = f" value {trial.value:.4g}" if trial.value is not None else ""
        best = max(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.value, default=None)
        best = f" (best {best.value:.4g} at #{best.number})" if best else ""
        error = f" {trial.user_attrs['error']}" if "error" in trial.user_attrs else ""
        seconds = trial.duration.total_seconds() if trial.duration else 0
        with self.lock:  # the count and its line together: two trials that end at once print whole lines, in order
            self.finished += trial.state in FINISHED
            print(f"trial {self.finished}/{self.args.trials} (#{trial.number}) {trial.state.name}{value}{best}{error} | "
                  f"{format_seconds(seconds)}", flush=True)  # fmt: skip


def settings(args: argparse.Namespace, extra: list[str]) -> dict:
    """What makes trials comparable: a study goes on only with the same."""
    keys = ("script", "env_ids", "seeds", "objective", "last_episodes", "report_every")
    params = {flag: [kind, spec] for flag, (kind, spec) in args.params.items()}  # as JSON gives them back
    targets = {e: list(args.targets[e]) for e in args.env_ids if e in args.targets and len(args.env_ids) > 1}
    return {**{k: getattr(args, k) for k in keys}, "params": params, "extra": extra, "targets": targets}


def summarise(study: optuna.Study, tuner: Tuner) -> None:
    """Print the best trial as command lines; write trials.md, history.png and importances.png."""
    args, study_dir = tuner.args, tuner.study_dir
    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.COMPLETE for t in trials):
        best = study.best_trial
        print(f"best trial: #{best.number}, value {best.value:.4g}")
        for env_id in args.env_ids:
            flags = tuner.flags(best.params) + tuner.extra
            print(shlex.join(["python", f"algorithms/{args.script}.py", "--env-id", env_id, *flags]))
    else:
        print("no trial has completed yet")
    names = list(args.params)
    rows = ["| number | state | value | " + " | ".join(names) + " | duration |", "|---" * (len(names) + 4) + "|"]
    for t in trials:
        value = "" if t.value is None else f"{t.value:.4g}"
        duration = format_seconds(t.duration.total_seconds()) if t.duration else ""
        params = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (t.params.get(n, "") for n in names)]
        cells = [str(t.number), t.state.name, value, *params, duration]
        rows.append("| " + " | ".join(cells) + " |")
    (study_dir / "trials.md").write_text(f"# Study {study.study_name}\n\n" + "\n".join(rows) + "\n")
    plot_optimization_history(study).figure.savefig(study_dir / "history.png", bbox_inches="tight")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    varied = any(len({repr(t.params.get(n)) for t in complete}) > 1 for n in names)
    (study_dir / "importances.png").unlink(missing_ok=True)  # none from an earlier summary outlives its study's state
    if len(complete) >= 2 and varied:
        plot_param_importances(study).figure.savefig(study_dir / "importances.png", bbox_inches="tight")
    else:
        print("no importances.png: it needs two complete trials whose parameters differ")
    plt.close("all")
    written = "trials.md, history.png" + (", importances.png" if (study_dir / "importances.png").is_file() else "")
    print(f"study folder: {study_dir} ({written}, runs/)")


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    args, extra, fields = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the tuner prints its own line per trial
    study_dir = Path(args.out) / args.study_name
    created = not study_dir.exists()
    study_dir.mkdir(parents=True, exist_ok=True)
    url = args.storage or f"sqlite:///{(study_dir / 'study.db').resolve()}"
    pruner = {
        "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=args.prune_startup, n_warmup_steps=args.prune_warmup),
        "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=1, max_resource="auto"),
        "none": optuna.pruners.NopPruner,
    }[args.pruner]()
    try:
        study = optuna.create_study(
            storage=open_storage(url), study_name=args.study_name, direction="maximize", pruner=pruner, load_if_exists=True
        )
    except Exception as e:  # anything a storage backend raises: a bad URL, a missing driver or folder
        if created:
            shutil.rmtree(study_dir)
        fail(f"cannot open --storage {url}: {str(e).splitlines()[0] if str(e) else type(e).__name__}; pass a reachable "
             "database URL or a .log file in an existing folder")  # fmt: skip
    if study.user_attrs.get("settings", settings(args, extra)) != settings(args, extra):
        fail(f"study {args.study_name} was made with other settings ({study.user_attrs['settings']}); pass the same, "
             "or another --study-name")  # fmt: skip
    study.set_user_attr("settings", settings(args, extra))
    # TPE draws its first trials at random from its seed: a resumed study seeds past the trials it has, or it would
    # draw the parameters of its first trials again
    study.sampler = optuna.samplers.TPESampler(seed=args.sampler_seed + len(study.get_trials(deepcopy=False)))
    for params in args.enqueued:
        study.enqueue_trial(params, skip_if_exists=True)
    tuner = Tuner(args, extra, fields, study_dir)
    tuner.finished = len(study.get_trials(deepcopy=False, states=FINISHED))

    # Ctrl-C and SIGTERM only ask: each trial kills its runs and fails, and no storage write is cut in half
    def interrupt(*_):
        tuner.request_stop(Stop("interrupted", 130))

    handlers = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while (missing := args.trials - len(study.get_trials(deepcopy=False, states=FINISHED))) > 0:
            print(f"study {args.study_name}: {missing} trial(s) to run, {args.workers} at a time", flush=True)
            try:
                study.optimize(
                    tuner.objective, n_trials=missing, n_jobs=args.workers, catch=(RunFailed,),
                    callbacks=[optuna.study.MaxTrialsCallback(args.trials, states=FINISHED), tuner.progress],
                )  # fmt: skip
            except Stop:  # optuna has marked the trial FAIL; tuner.stop says why
                pass
            if tuner.stop:
                break
            if len(study.get_trials(deepcopy=False, states=FINISHED)) == args.trials - missing:
                print(f"every trial of this round failed; see the output.log files in {study_dir / 'runs'}", file=sys.stderr)
                raise SystemExit(1)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if tuner.stop and tuner.stop.code == 2:
        fail(f"{tuner.stop.message}; change the --param range or the flags after --")
    if tuner.stop:
        print("interrupted; the finished trials are saved, go on with the same command:")
        print(shlex.join(["python", "benchmark/tune.py", *argv]))
        raise SystemExit(130)
    summarise(study, tuner)
    return study_dir


if __name__ == "__main__":
    main()
