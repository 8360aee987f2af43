"""Run one algorithm over envs x seeds, a few runs at a time, each logging to its own tensorboard directory.

    python benchmark/run.py --algo ppo --env-ids CartPole-v1 Acrobot-v1 --seeds 3 -- --total-timesteps 500000

Everything after `--` goes to every run. The benchmark folder (benchmark/runs/<name>/ by default) holds runs/
(the scripts' own run directories), logs/ (each run's output), bench.json (what was asked) and status.json
(each run's state, exit code and times). `python benchmark/report.py <folder>` turns it into plots and a table.

A benchmark stopped part way (Ctrl-C, SIGTERM, a machine that went away) goes on with

    python benchmark/run.py --name <name> --resume

which keeps the finished runs, resumes each stopped (or failed) run from its last checkpoint.pt (the script's own
--resume: pass --checkpoint-every after `--` to have one) and starts the rest, with bench.json's envs, seeds and flags.
Each run's time is the sum of its segments (status.json): the report's wall time leaves out the time it stood still.
Seeds run START..START+N-1 (`--start-seed`, `--seeds`): a benchmark folder lost before its last seeds ran goes on
in a new folder with, e.g., `--start-seed 2 --seeds 2`.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the progress line every script prints: "step 1,024/500,000 ... ETA 1m05s" (es.py counts generations instead)
ETA_RE = re.compile(r"(step|generation) ([\d,]+)/([\d,]+).*ETA (\d+)m(\d+)s")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", help="script name in algorithms/, e.g. ppo")
    p.add_argument("--env-ids", nargs="+", help="env ids to run")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds per env (default: 3)")
    p.add_argument(
        "--start-seed", type=int, default=None, help="first seed (default: 1): seeds START..START+N-1, e.g. to add seeds later"
    )
    p.add_argument("--name", default=None, help="benchmark folder name (default: <algo>_<unix time>)")
    p.add_argument("--out", default=str(ROOT / "benchmark" / "runs"), help="parent folder of benchmark folders")
    p.add_argument("--jobs", type=int, default=None, help="runs at the same time (default: the cores; --resume: as before)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS per run (default 1: torch spins when cores are shared; --resume: as before)",
    )
    p.add_argument("--status-interval", type=float, default=10.0, help="seconds between status views")
    p.add_argument(
        "--resume", action="store_true", help="go on with the benchmark folder --name: its envs, seeds and flags, its runs"
    )
    args = p.parse_args(argv)
    if args.resume:
        if args.algo or args.env_ids or args.seeds or args.start_seed is not None or extra:
            p.error("--resume takes the algorithm, envs, seeds and flags from the folder's bench.json; pass only --name")
        bench_dir = Path(args.out) / (args.name or "")
        if not args.name or not (bench_dir / "bench.json").is_file() or not (bench_dir / "status.json").is_file():
            p.error(f"--resume needs --name of a benchmark folder with bench.json and status.json; {bench_dir} has none")
        meta = json.loads((bench_dir / "bench.json").read_text())
        args.algo, args.env_ids, args.seeds, extra = meta["algo"], meta["env_ids"], len(meta["seeds"]), meta["extra_args"]
        args.start_seed = meta["seeds"][0]
        args.jobs = meta.get("jobs") if args.jobs is None else args.jobs  # as the folder was started, unless given
        args.threads = meta.get("threads") if args.threads is None else args.threads
    elif not args.algo or not args.env_ids:
        p.error("--algo and --env-ids are required (or --name and --resume to go on with a stopped benchmark)")
    args.seeds = 3 if args.seeds is None else args.seeds
    args.jobs = (os.cpu_count() or 1) if args.jobs is None else args.jobs
    args.threads = 1 if args.threads is None else args.threads
    args.start_seed = 1 if args.start_seed is None else args.start_seed
    script = ROOT / "algorithms" / f"{args.algo}.py"
    if not script.is_file():
        known = sorted(s.stem for s in (ROOT / "algorithms").glob("*.py"))
        p.error(f"no algorithms/{args.algo}.py; known: {', '.join(known)}")
    if args.seeds < 1 or args.jobs < 1:
        p.error("--seeds and --jobs must be at least 1")
    if args.start_seed < 0:
        p.error(f"--start-seed must be 0 or more (got {args.start_seed})")
    return args, extra


def format_seconds(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def last_progress(log_path: Path) -> tuple[str, ...] | None:
    """(unit, step, total, minutes, seconds) of the last progress line in a run's log, or None before the first."""
    matches = ETA_RE.findall(log_path.read_text(errors="replace")) if log_path.exists() else []
    return matches[-1] if matches else None


def run_eta(log_path: Path) -> str:
    """The last progress line's step and ETA, as the script printed them."""
    if (progress := last_progress(log_path)) is None:
        return "starting"
    unit, step, total, m, s = progress
    return f"{unit} {step}/{total}, ETA {m}m{s}s"


def eta_seconds(log_path: Path) -> float | None:
    progress = last_progress(log_path)
    return int(progress[3]) * 60 + int(progress[4]) if progress else None


def segments(job: dict) -> list[list[float]]:
    """The [start, end] intervals a run ran in: one, or one more per --resume (status.json files from before
    segments were kept have start and end only); a running run's last end is None."""
    if job.get("segments"):
        return job["segments"]
    return [[job["start"], job.get("end")]] if "start" in job else []


def run_seconds(job: dict) -> float:
    """Time a run spent running, leaving out the time it stood stopped between segments."""
    return sum(end - start for start, end in segments(job) if end is not None)


def status_view(jobs: list[dict], bench_dir: Path, num_slots: int) -> str:
    counts = {s: sum(j["status"] == s for j in jobs) for s in ("done", "failed", "running", "waiting")}
    durations = [run_seconds(j) for j in jobs if j["status"] == "done"]
    running_left = [eta_seconds(bench_dir / j["log"]) for j in jobs if j["status"] == "running"]
    per_run = sum(durations) / len(durations) if durations else max([e for e in running_left if e] or [0])
    # the waiting runs queue behind the running ones, num_slots at a time; a run still starting takes a whole run's
    # time, unknown until a run has finished
    eta = max([per_run if e is None else e for e in running_left] or [0]) + counts["waiting"] * per_run / num_slots
    known = durations or None not in running_left
    lines = [
        f"[{time.strftime('%H:%M:%S')}] done {counts['done']}/{len(jobs)} | failed {counts['failed']} | "
        f"running {counts['running']} | waiting {counts['waiting']} | ETA {format_seconds(eta) if known else 'n/a'}"
    ]
    for j in jobs:
        if j["status"] == "running":
            lines.append(f"  running {j['env_id']} seed {j['seed']}: {run_eta(bench_dir / j['log'])}")
        elif j["status"] == "failed":
            lines.append(f"  failed  {j['env_id']} seed {j['seed']}: exit {j['returncode']}, see {j['log']}")
    return "\n".join(lines)


def find_run_dir(bench_dir: Path, algo: str, env_id: str, seed: int) -> str | None:
    safe_id = env_id.replace("/", "-").replace(":", "-")
    found = sorted((bench_dir / "runs").glob(f"{safe_id}__{algo}__{seed}__*"))
    return str(found[-1].relative_to(bench_dir)) if found else None


def resumed_jobs(bench_dir: Path) -> list[dict]:
    """status.json's runs, the unfinished ones made to wait again. A run killed with the runner (still marked running)
    ends its last segment at its log's last write."""
    jobs = json.loads((bench_dir / "status.json").read_text())
    for j in jobs:
        if j["status"] == "done":
            continue
        spans = segments(j)
        if spans and spans[-1][1] is None:
            log = bench_dir / j["log"]
            spans[-1][1] = log.stat().st_mtime if log.exists() else spans[-1][0]
        j.update(status="waiting", segments=spans)
    return jobs


def run_command(bench_dir: Path, algo: str, job: dict, extra: list[str]) -> list[str]:
    """The script's command line for a run: a fresh start, or its own --resume where it left a checkpoint.pt."""
    cmd = [sys.executable, str(ROOT / "algorithms" / f"{algo}.py"), "--env-id", job["env_id"]]
    run_dir = find_run_dir(bench_dir, algo, job["env_id"], job["seed"])
    if run_dir and (bench_dir / run_dir / "checkpoint.pt").is_file():
        return cmd + ["--resume", os.path.join(run_dir, "checkpoint.pt")]
    return cmd + ["--seed", str(job["seed"]), "--exp-name", algo, *extra]


def main(argv: list[str] | None = None) -> Path:
    args, extra = parse_args(argv)
    bench_dir = Path(args.out) / (args.name or f"{args.algo}_{int(time.time())}")
    (bench_dir / "logs").mkdir(parents=True, exist_ok=True)
    meta = {
        "algo": args.algo,
        "env_ids": args.env_ids,
        "seeds": list(range(args.start_seed, args.start_seed + args.seeds)),
        "extra_args": extra,
        "jobs": args.jobs,
        "threads": args.threads,
    }
    if args.resume:
        jobs = resumed_jobs(bench_dir)
    else:
        (bench_dir / "bench.json").write_text(json.dumps(meta, indent=2))
        jobs = [
            {"env_id": e, "seed": s, "status": "waiting", "log": f"logs/{e.replace('/', '-')}__{s}.log", "segments": []}
            for e in args.env_ids
            for s in meta["seeds"]
        ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    procs: dict[int, subprocess.Popen] = {}
    last_view = 0.0

    def save_status():
        (bench_dir / "status.json").write_text(json.dumps(jobs, indent=2))

    print(f"benchmark folder: {bench_dir}")
    previous_handler = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the runs as Ctrl-C does
    try:
        while any(j["status"] in ("waiting", "running") for j in jobs):
            for i, j in enumerate(jobs):  # collect finished runs
                if i in procs and procs[i].poll() is not None:
                    j["returncode"], j["end"] = procs.pop(i).returncode, time.time()
                    j["segments"][-1][1] = j["end"]
                    j["status"] = "done" if j["returncode"] == 0 else "failed"
                    j["run_dir"] = find_run_dir(bench_dir, args.algo, j["env_id"], j["seed"])
            for i, j in enumerate(jobs):  # start waiting ones while slots are free
                if j["status"] == "waiting" and len(procs) < args.jobs:
                    cmd = run_command(bench_dir, args.algo, j, extra)
                    with open(bench_dir / j["log"], "a" if "--resume" in cmd else "w") as log:
                        procs[i] = subprocess.Popen(cmd, cwd=bench_dir, stdout=log, stderr=subprocess.STDOUT, env=env)
                    now = time.time()
                    j.update(status="running", start=j.get("start", now), command=" ".join(cmd[1:]))
                    j["segments"].append([now, None])
            save_status()
            if time.time() - last_view >= args.status_interval:
                last_view = time.time()
                print(status_view(jobs, bench_dir, args.jobs), flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:  # the scripts checkpoint on SIGTERM; say how to go on
        for p in procs.values():
            p.terminate()
        for i, p in procs.items():
            jobs[i].update(status="stopped", returncode=p.wait(), end=time.time())
            jobs[i]["segments"][-1][1] = jobs[i]["end"]
        save_status()
        print(f"interrupted; go on with: python benchmark/run.py --out {args.out} --name {bench_dir.name} --resume")
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    save_status()
    print(status_view(jobs, bench_dir, args.jobs))
    print(f"report: python benchmark/report.py {bench_dir}")
    return bench_dir


if __name__ == "__main__":
    main()
