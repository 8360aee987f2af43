"""Turn a benchmark folder (from benchmark/run.py) into learning-curve plots and a markdown table.

    python benchmark/report.py benchmark/runs/ppo_classic --out benchmark/results/ppo_classic
    python benchmark/report.py runs/Pong-v5__ppo__1__1795517044 --lone-run ppo --out benchmark/results/ppo_atari_pong_h100

Writes returns_vs_steps.png and returns_vs_time.png (one panel per env: mean over seeds, shaded +- one standard
deviation) and report.md, which shows them below its table: per env, the mean and standard deviation over seeds of
each run's mean return over its last 100 training episodes (the definition of CleanRL and openrlbenchmark), SPS, wall
time, the evaluation of the reloaded --save-model model where there is one, the exact greedy return where a tabular
run logs it, and the reference from benchmark/references.csv with its source. A run that crashed or logged no episode
is listed as such, never averaged in.
"""

import argparse
import csv
import json
import shutil
from pathlib import Path

import numpy as np

from run import run_seconds, segments
from tblog import purge_note, read_scalars

HERE = Path(__file__).resolve().parent
LAST_EPISODES = 100
# the curves, shown in the report itself (GitHub renders them), as written beside it
PLOTS = "\n![returns against env steps](returns_vs_steps.png)\n\n![returns against wall time](returns_vs_time.png)\n"


def load_references(path: Path = HERE / "references.csv") -> dict[tuple[str, str], dict]:
    with open(path) as f:
        return {(r["algo"], r["env_id"]): r for r in csv.DictReader(f)}


def load_reference_curves(path: Path = HERE / "reference_curves.csv") -> dict[tuple[str, str], list[tuple[int, float]]]:
    """A reference's learning curve at a few steps, (steps, return) read from its published figure, keyed as the
    references are: the measure for a run that stops far short of the reference's budget."""
    curves = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            curves.setdefault((r["algo"], r["env_id"]), []).append((int(r["steps"]), float(r["return"])))
    return curves


def summarise_run(bench_dir: Path, job: dict) -> dict:
    """One run's outcome: its episodes (step, return, seconds since start), final score, SPS, or why it has none."""
    out = {"env_id": job["env_id"], "seed": job["seed"], "problem": None}
    if job.get("status") != "done":
        status = job.get("status")
        out["problem"] = f"crashed (exit {job.get('returncode')})" if status == "failed" else f"{status} (not finished)"
        return out
    scalars = read_scalars(str(bench_dir / job["run_dir"])) if job.get("run_dir") else {}
    episodes = scalars.get("charts/episodic_return", [])
    if not episodes:
        out["problem"] = "no episodes logged"
        return out
    t0 = min(w for tag in scalars.values() for _, _, w in tag)
    out["steps"] = np.array([s for s, _, _ in episodes], dtype=float)
    out["returns"] = np.array([v for _, v, _ in episodes])
    # a resumed run's events go on after the time it stood stopped: take those gaps out of the time axis
    spans = segments(job)
    gaps = [(a[1], b[0]) for a, b in zip(spans, spans[1:], strict=False)]
    out["seconds"] = np.array([w - t0 - sum(min(max(w - lo, 0.0), hi - lo) for lo, hi in gaps) for _, _, w in episodes])
    out["final"] = float(out["returns"][-LAST_EPISODES:].mean())
    out["sps"] = scalars["charts/SPS"][-1][1] if "charts/SPS" in scalars else float("nan")
    out["wall"] = run_seconds(job) if spans else max(w for tag in scalars.values() for _, _, w in tag) - t0
    out["total_steps"] = max(s for tag in scalars.values() for s, _, _ in tag)
    # the evaluation of the reloaded --save-model model: every episode is logged at the run's last step
    evals = scalars.get("eval/episodic_return", [])
    out["final_eval"] = float(np.mean([v for s, v, _ in evals if s == evals[-1][0]])) if evals else None
    # tabular runs on toy text log the exact return of their greedy policy (no sampling): the figure to compare
    out["exact"] = scalars["eval/exact_return"][-1][1] if "eval/exact_return" in scalars else None
    return out


def lone_run_job(run_dir: Path) -> dict:
    """The status.json entry run.py would have kept for one run's own folder (runs/<env_id>__<algo>__<seed>__<time>, as
    the scripts name it), for a run started without run.py and stopped at a time budget: with no segments kept, its
    time is its events' span."""
    env_id, _, seed, _ = run_dir.name.split("__")
    return {"env_id": env_id, "seed": int(seed), "status": "done", "run_dir": run_dir.name}


def mean_std(xs: list[float]) -> str:
    mean, std = np.mean(xs), np.std(xs)
    digits = 3 if abs(mean) < 10 else 1  # toy-text returns lie in [0, 1]
    return f"{mean:.{digits}f} +- {std:.{digits}f}"


def compare(mean: float, std: float, ref: dict | None, steps: int) -> str:
    """Short of the reference beyond both spreads, or not; a run short of it that stopped before the reference's budget
    (by more than the last iteration: 1,999,872 of 2M is the whole) is too short to tell."""
    if ref is None or ref["mean"] == "":
        return "no reference"
    ref_mean, ref_std = float(ref["mean"]), float(ref["std"] or 0.0)
    if mean + std >= ref_mean - ref_std:
        return "ok"
    budget = int(ref["steps"])
    return f"too short to compare: {steps:,} of {budget:,} steps" if steps * 1.01 < budget else "**short of reference**"


def table(algo: str, runs: list[dict], references: dict) -> str:
    lines = [
        f"# {algo}: mean return of the last {LAST_EPISODES} training episodes, mean +- std over seeds",
        "",
        "`final eval`: the reloaded `--save-model` model's evaluation, where the runs made one. `exact greedy`: the exact",
        "return of the greedy policy (tabular runs on toy text); where it is there, the verdict compares it, not the",
        "training return, with the reference (the exact optimum).",
        "",
        "| env | seeds ok | return | SPS | wall time | steps | final eval | exact greedy | reference | source | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    problems = []
    for env_id in dict.fromkeys(r["env_id"] for r in runs):
        env_runs = [r for r in runs if r["env_id"] == env_id]
        ok = [r for r in env_runs if r["problem"] is None]
        problems += [f"- {env_id} seed {r['seed']}: {r['problem']}" for r in env_runs if r["problem"]]
        ref = references.get((algo, env_id))
        ref_text = f"{ref['mean']}" + (f" +- {ref['std']}" if ref and ref["std"] else "") if ref else "-"
        source = f"{ref['source']} ({int(ref['steps']):,} steps)" if ref else "-"
        if not ok:  # a benchmark still under way (or stopped, to go on with run.py --resume) has not failed
            unfinished = all(r["problem"].endswith("(not finished)") for r in env_runs)
            quiet = all(r["problem"] == "no episodes logged" for r in env_runs)  # runs that ended before an episode did
            verdict = "not finished" if unfinished else "too short to compare: no episode ended" if quiet else "**failed**"
            row = f"| {env_id} | 0/{len(env_runs)} | no result | - | - | - | - | - | {ref_text} | {source} | {verdict} |"
            lines.append(row)
            continue
        finals = np.array([r["final"] for r in ok])
        evals = [r["final_eval"] for r in ok if r["final_eval"] is not None]
        exacts = [r["exact"] for r in ok if r["exact"] is not None]
        scored = np.array(exacts) if len(exacts) == len(ok) else finals
        steps = int(np.mean([r["total_steps"] for r in ok]))
        verdict = compare(scored.mean(), scored.std(), ref, steps)
        verdict = verdict if len(ok) == len(env_runs) else f"{verdict}; runs missing"
        lines.append(
            f"| {env_id} | {len(ok)}/{len(env_runs)} | {mean_std(finals)} "
            f"| {np.mean([r['sps'] for r in ok]):,.0f} | {np.mean([r['wall'] for r in ok]) / 60:.1f} min "
            f"| {steps:,} | {mean_std(evals) if evals else '-'} "
            f"| {mean_std(exacts) if exacts else '-'} | {ref_text} | {source} | {verdict} |"
        )
    if problems:
        lines += ["", "Runs without a result (not averaged in):", *problems]
    return "\n".join(lines) + "\n"


def step_name(steps: int) -> str:
    return f"{steps / 1e6:g}M" if steps >= 1_000_000 else f"{steps / 1e3:g}k"


def curve_table(runs: list[dict], curves: dict, algo: str, every: int = 500_000) -> str:
    """Per env with a reference curve (reference_curves.csv): each seed's mean of the 20 training episodes that ended
    at or before each of the curve's steps the runs reach (and each `every` steps), the seeds' mean, the curve's value.
    A run that ends an iteration short of a round budget (1,999,872 of 2M) reaches that budget."""
    text = ""
    for env_id in dict.fromkeys(r["env_id"] for r in runs):
        ok = [r for r in runs if r["env_id"] == env_id and r["problem"] is None]
        curve = dict(curves.get((algo, env_id), []))
        if not ok or not curve:
            continue
        end = reached(ok)
        steps = sorted({s for s in curve if s <= end} | set(range(every, int(end) + 1, every)))
        if not steps:  # the runs end before the curve's first step: nothing to table
            continue
        lines = [
            f"\n## {env_id}: the mean of the 20 episodes ended by each step, beside the reference's curve\n",
            "The reference's curve is read by eye from its published figure (reference_curves.csv names it): approximate.\n",
            "| steps | " + " | ".join(f"seed {r['seed']}" for r in ok) + " | mean of the seeds | reference curve |",
            "|---" * (len(ok) + 3) + "|",
        ]
        for step in steps:
            ended = [r["returns"][r["steps"] <= step][-20:] for r in ok]
            means = [float(m.mean()) if len(m) else float("nan") for m in ended]
            ref = f"{curve[step]:g}" if step in curve else ""
            cells = " | ".join(f"{m:.1f}" for m in means)
            lines.append(f"| {step_name(step)} | {cells} | {np.mean(means):.1f} | {ref} |")
        text += "\n".join(lines) + "\n"
    return text


def smoothed_curve(x: np.ndarray, y: np.ndarray, grid: np.ndarray, window: int = 20) -> np.ndarray:
    """Rolling mean over `window` episodes, interpolated onto a common grid (NaN outside the run's range)."""
    kernel = np.ones(min(window, len(y))) / min(window, len(y))
    smooth = np.convolve(y, kernel, mode="valid")
    xs = x[len(x) - len(smooth) :]
    return np.interp(grid, xs, smooth, left=np.nan, right=np.nan)


def seed_band(runs: list[dict], x_key: str, window: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seeds' smoothed curves on a common grid up to the shortest run's end: their mean and std, NaN wherever a
    seed has no point yet, so the band never stands for a subset of the seeds (which would jump where a seed ends)."""
    grid = np.linspace(0, min(r[x_key][-1] for r in runs), 200)
    curves = np.array([smoothed_curve(r[x_key], r["returns"], grid, window) for r in runs])
    return grid, curves.mean(0), curves.std(0)


def plot(algo: str, runs: list[dict], references, x_key: str, xlabel: str, path: Path, others=(), label=None, curves=None):
    """One panel per env: the runs' seed band (labelled `label`, by default the algorithm), each of `others` (pairs of
    a label and its runs, e.g. the same envs without an option) on the same axes, and the reference: against steps, its
    curve where the runs end before its budget and reference_curves.csv has one, else its final score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_ids = list(dict.fromkeys(r["env_id"] for r in runs))
    fig, axes = plt.subplots(1, len(env_ids), figsize=(4.5 * len(env_ids), 3.6), squeeze=False)
    for ax, env_id in zip(axes[0], env_ids, strict=True):
        ok = [r for r in runs if r["env_id"] == env_id and r["problem"] is None]
        ax.set_title(env_id)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("episodic return")
        for name, series in ((label or algo, runs), *others):
            ok = [r for r in series if r["env_id"] == env_id and r["problem"] is None]
            if ok:
                grid, mean, std = seed_band(ok, x_key)
                ax.plot(grid, mean, label=f"{name} ({len(ok)} seeds)")
                ax.fill_between(grid, mean - std, mean + std, alpha=0.25)
        ref = references.get((algo, env_id))
        ours = [r for r in runs if r["env_id"] == env_id and r["problem"] is None]
        curve = reference_curve(ours, ref, (curves or {}).get((algo, env_id))) if x_key == "steps" and ours else None
        if curve:
            ax.plot(*zip(*curve, strict=True), "k--o", markersize=3, linewidth=1, label="reference curve (approx.)")
        elif ref and ref["mean"] != "":
            ax.axhline(float(ref["mean"]), color="k", linestyle="--", linewidth=1, label="reference")
        missing = [r for r in runs if r["env_id"] == env_id and r["problem"]]
        if missing:
            unfinished = sum(r["problem"].endswith("(not finished)") for r in missing)
            counts = [(len(missing) - unfinished, "failed"), (unfinished, "not finished")]
            ax.text(0.02, 0.02, ", ".join(f"{n} {what}" for n, what in counts if n), transform=ax.transAxes, color="red")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def reached(runs: list[dict]) -> float:
    """The step the runs reach, for reading them beside a reference's curve: their last episode's, a percent over, so
    that a run whose last episode ends short of a round budget (1,999,872 of 2M) is read at that budget."""
    return max(r["steps"][-1] for r in runs) * 1.01


def reference_curve(runs: list[dict], ref: dict | None, curve: list | None) -> list | None:
    """The reference's curve up to where the runs reach, where they stop short of its budget; else None."""
    end = reached(runs)
    if not curve or (ref and end >= int(ref["steps"])):
        return None
    return [(s, v) for s, v in curve if s <= end] or None


def keep_data(bench_dir: Path, jobs: list[dict], out: Path) -> None:
    """Copy what the report is made from (bench.json, status.json, the logs, each run's events; not its checkpoints or
    models) beside it, so that report.py can make it again from out/ once the benchmark folder is gone."""
    for name in ("bench.json", "status.json"):
        shutil.copy2(bench_dir / name, out / name)
    if (bench_dir / "logs").is_dir():
        shutil.copytree(bench_dir / "logs", out / "logs", dirs_exist_ok=True)
    for job in jobs:
        if job.get("run_dir"):
            (out / job["run_dir"]).mkdir(parents=True, exist_ok=True)
            for events in (bench_dir / job["run_dir"]).glob("events.out.tfevents.*"):
                shutil.copy2(events, out / job["run_dir"] / events.name)


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench_dir", help="a folder written by benchmark/run.py")
    p.add_argument("--out", default=None, help="where the report goes (default: the folder given)")
    p.add_argument("--references", default=str(HERE / "references.csv"), help="reference figures (csv)")
    p.add_argument(
        "--reference-curves",
        default=str(HERE / "reference_curves.csv"),
        help="references' curves at a few steps (csv), tabled beside the runs' at those steps",
    )
    p.add_argument(
        "--lone-run",
        metavar="ALGO",
        default=None,
        help="bench_dir is one run's own folder, made by ALGO's script without run.py (a run stopped at a time budget)",
    )
    p.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="FOLDER",
        help="other run.py folders (or reports kept with --keep-data) whose runs of the same envs are drawn on the same "
        "plots and tabled below, each labelled with its folder's name (e.g. the same settings without an option)",
    )
    p.add_argument(
        "--keep-data",
        action="store_true",
        help="copy the benchmark's bench.json, status.json, logs and events (not checkpoints) into --out beside the report",
    )
    args = p.parse_args(argv)
    bench_dir = Path(args.bench_dir)
    if args.keep_data and (args.lone_run or not args.out or Path(args.out).resolve() == bench_dir.resolve()):
        p.error(
            "--keep-data copies a run.py folder's data into another --out folder; a lone run's events or a report "
            "written into its own folder are there already"
        )
    if args.lone_run:
        if len(bench_dir.name.split("__")) != 4 or not list(bench_dir.glob("events.out.tfevents.*")):
            p.error(f"{bench_dir} is not a run's folder (runs/<env_id>__<algo>__<seed>__<time> with event files)")
        meta, jobs, bench_dir = {"algo": args.lone_run}, [lone_run_job(bench_dir)], bench_dir.parent
    elif not (bench_dir / "status.json").is_file():
        p.error(f"{bench_dir} has no status.json; pass a folder written by benchmark/run.py")
    else:
        meta, jobs = json.loads((bench_dir / "bench.json").read_text()), json.loads((bench_dir / "status.json").read_text())
    out = Path(args.out) if args.out else Path(args.bench_dir)  # a lone run's report goes beside its events
    out.mkdir(parents=True, exist_ok=True)
    algo, extra = meta["algo"], meta.get("extra_args", [])
    # a script with several algorithms (ddpg_td3.py --algo ddpg) has references keyed "script:algo", and a recurrent
    # policy (ppo.py --rnn lstm) "script:rnn"; they win over the script's own
    option = next((flag for flag in ("--algo", "--rnn") if flag in extra[:-1]), None)
    name = f"{algo}:{extra[extra.index(option) + 1]}" if option else algo
    every = load_references(Path(args.references))
    references = {(name, e): r for a in (algo, name) for (k, e), r in every.items() if k == a}
    algo = name
    curves = {(k, e): c for (k, e), c in load_reference_curves(Path(args.reference_curves)).items() if k == name}
    runs = [summarise_run(bench_dir, job) for job in jobs]
    if args.keep_data:
        keep_data(bench_dir, jobs, out)
    others, text = [], table(algo, runs, references) + curve_table(runs, curves, algo)  # the curve under its own runs
    for folder in map(Path, args.compare):
        if not (folder / "status.json").is_file():
            p.error(f"--compare {folder} has no status.json; pass a folder written by benchmark/run.py")
        other = [summarise_run(folder, job) for job in json.loads((folder / "status.json").read_text())]
        others.append((folder.name, other))
        text += f"\n## Beside it: {folder.name}\n" + table(algo, other, references).split("\n", 1)[1]
    label = bench_dir.name if args.compare and not args.lone_run else None
    (out / "report.md").write_text(text + PLOTS)
    plot(algo, runs, references, "steps", "env steps", out / "returns_vs_steps.png", others, label, curves)
    plot(algo, runs, references, "seconds", "wall time (s)", out / "returns_vs_time.png", others, label)
    print((out / "report.md").read_text())
    print(f"plots: {out / 'returns_vs_steps.png'}, {out / 'returns_vs_time.png'}")
    if purge_note():
        print(purge_note())
    return out


if __name__ == "__main__":
    main()
