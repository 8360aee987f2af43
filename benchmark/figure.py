"""The README's figure: one learning-curve panel per committed benchmark, each beside its published reference.

    python benchmark/figure.py                      # writes benchmark/results/overview.png
    python benchmark/figure.py --out /tmp/fig.png

Made from the data committed under benchmark/results/ (each benchmark's bench.json, status.json and event files,
which `report.py --keep-data` copies there, or a lone run's events), with report.py's own curves: the mean over seeds
of each seed's 20-episode rolling mean (an exact return as logged), shaded +- one standard deviation, up to where the
shortest seed ends.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from report import HERE, load_reference_curves, load_references, lone_run_job, reference_curve, seed_band
from tblog import purge_note, read_scalars

RESULTS = HERE / "results"

# One panel per committed benchmark that has a published reference: (title, results folder, its headline env, the tag
# plotted, the algo as in references.csv). The tag is the training return, except for tabular Q-learning, whose
# reference (the optimum) is about the exact return of its greedy policy. A run that ends before its reference's budget
# is drawn beside the reference's curve (reference_curves.csv) where there is one, as in the reports.
PANELS = [
    ("PPO", "ppo_classic", "Acrobot-v1", "charts/episodic_return", "ppo"),
    ("PPO", "ppo_mujoco_hopper", "Hopper-v4", "charts/episodic_return", "ppo"),
    ("PPO, 3.3M of 10M steps", "ppo_atari_pong_h100", "Pong-v5", "charts/episodic_return", "ppo"),
    ("PPO, 2M steps, 2-core CPU", "ppo_atari_pong_2m", "Pong-v5", "charts/episodic_return", "ppo"),
    ("PPO, 1M steps, 2-core CPU", "bf16_learning/ppo_breakout_1m_float32", "Breakout-v5", "charts/episodic_return", "ppo"),
    ("DQN", "dqn_classic", "CartPole-v1", "charts/episodic_return", "dqn"),
    ("A2C", "a2c_cartpole", "CartPole-v1", "charts/episodic_return", "a2c"),
    ("A2C", "a2c_acrobot", "Acrobot-v1", "charts/episodic_return", "a2c"),
    ("A2C", "a2c_mountaincar", "MountainCar-v0", "charts/episodic_return", "a2c"),
    ("TD3, seeds 2-3", "ddpg_td3_td3_mujoco/halfcheetah_seeds_2_3", "HalfCheetah-v4", "charts/episodic_return", "ddpg_td3"),
    ("ES", "es_cartpole", "CartPole-v1", "charts/episodic_return", "es"),
    ("Q-learning, greedy", "qlearning_toytext", "Taxi-v3", "eval/exact_return", "qlearning"),
]


def benchmark_runs(folder: Path, env_id: str, tag: str) -> list[dict]:
    """Each finished seed of env_id in a committed benchmark folder, as report.py's curves take them: steps and values
    of `tag`. A folder without bench.json holds one lone run (report.py --lone-run) under runs/."""
    if (folder / "status.json").is_file():
        jobs = json.loads((folder / "status.json").read_text())
    else:
        jobs = [lone_run_job(d) | {"run_dir": f"runs/{d.name}"} for d in sorted((folder / "runs").iterdir())]
    runs = []
    for job in jobs:
        if job["env_id"] != env_id or job.get("status") != "done":
            continue
        points = read_scalars(str(folder / job["run_dir"])).get(tag, [])
        if points:
            runs.append({"steps": np.array([s for s, _, _ in points], float), "returns": np.array([v for _, v, _ in points])})
    if not runs:
        raise SystemExit(f"figure.py: error: {folder} holds no finished {env_id} run with {tag}; rerun its benchmark")
    return runs


def draw(out: Path, panels: list[tuple] = PANELS, columns: int = 4) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    references, curves = load_references(), load_reference_curves()
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.6 * rows), squeeze=False)
    for ax, (title, folder, env_id, tag, algo) in zip(axes.flat, panels, strict=False):
        runs = benchmark_runs(RESULTS / folder, env_id, tag)
        # episodes are smoothed over 20 as in the reports; an exact return, logged every --log-every steps, is not
        grid, mean, std = seed_band(runs, "steps", window=20 if tag == "charts/episodic_return" else 1)
        ax.plot(grid, mean, label=f"ours ({len(runs)} seed{'s' * (len(runs) > 1)})")
        ax.fill_between(grid, mean - std, mean + std, alpha=0.25)
        ref = references.get((algo, env_id))
        curve = reference_curve(runs, ref, curves.get((algo, env_id)))
        if curve:
            ax.plot(*zip(*curve, strict=True), "k--o", markersize=3, linewidth=1, label="reference curve (approx.)")
        elif ref and ref["mean"] != "":
            ax.axhline(float(ref["mean"]), color="k", linestyle="--", linewidth=1, label="reference")
        ax.set_title(f"{env_id}: {title}", fontsize=9)
        ax.set_xlabel("env steps", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return len(panels)


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(RESULTS / "overview.png"), help="where the figure goes (PNG)")
    out = Path(p.parse_args(argv).out)
    print(f"{draw(out)} panels: {out}")
    if purge_note():
        print(purge_note())
    return out


if __name__ == "__main__":
    main()
