"""benchmark/: the runner on tiny real runs, the report on hand-made event files with known values."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

import tblog  # as the tools import it: the same module and filter
from benchmark import report, run, speed
from benchmark.studies import cleanrl_speed
from conftest import load_algorithm


def test_runner_runs_envs_x_seeds_and_report_reads_them(tmp_path, capsys):
    bench = run.main(
        ["--algo", "ppo", "--env-ids", "CartPole-v1", "Acrobot-v1", "--seeds", "2", "--out", str(tmp_path),
         "--name", "tiny", "--status-interval", "0", "--", "--total-timesteps", "2048"]
    )  # fmt: skip
    status = json.loads((bench / "status.json").read_text())
    assert [(j["env_id"], j["seed"], j["status"]) for j in status] == [
        ("CartPole-v1", 1, "done"), ("CartPole-v1", 2, "done"), ("Acrobot-v1", 1, "done"), ("Acrobot-v1", 2, "done")
    ]  # fmt: skip
    assert all((bench / j["run_dir"]).is_dir() for j in status)
    assert "done 4/4" in capsys.readouterr().out
    out = report.main([str(bench), "--out", str(tmp_path / "report")])
    text = (out / "report.md").read_text()
    assert re.search(r"\| CartPole-v1 \| 2/2 \| [\d.]+ \+- [\d.]+ \|", text)
    assert (out / "returns_vs_steps.png").stat().st_size > 10_000 and (out / "returns_vs_time.png").is_file()


def test_runner_reports_a_crashed_run(tmp_path):
    bench = run.main(["--algo", "ppo", "--env-ids", "NoSuchEnv-v0", "--seeds", "1", "--out", str(tmp_path), "--name", "x"])
    (job,) = json.loads((bench / "status.json").read_text())
    assert job["status"] == "failed" and job["returncode"] != 0
    assert "cannot be made" in (bench / job["log"]).read_text()


def test_runner_start_seed_picks_the_seeds_and_resume_keeps_them(tmp_path, capsys):
    """--resume keeps the seeds, and the runs at a time and their threads, unless given again."""
    flags = ["--algo", "ppo", "--env-ids", "NoSuchEnv-v0", "--out", str(tmp_path), "--name", "x", "--status-interval", "0"]
    bench = run.main([*flags, "--seeds", "2", "--start-seed", "2", "--jobs", "2", "--threads", "3"])
    assert json.loads((bench / "bench.json").read_text())["seeds"] == [2, 3]
    jobs = json.loads((bench / "status.json").read_text())
    assert [j["seed"] for j in jobs] == [2, 3] and [j["command"].split("--seed ")[1][0] for j in jobs] == ["2", "3"]
    resume = ["--name", "x", "--out", str(tmp_path), "--resume"]
    args, _ = run.parse_args(resume)
    assert (args.start_seed, args.seeds, args.jobs, args.threads) == (2, 2, 2, 3)
    assert run.parse_args([*resume, "--jobs", "1"])[0].jobs == 1
    for bad, message in (
        ([*flags, "--start-seed", "-1"], "--start-seed must be 0 or more"),
        ([*resume, "--start-seed", "2"], "pass only --name"),
    ):
        with pytest.raises(SystemExit):
            run.parse_args(bad)
        assert message in capsys.readouterr().err


def test_runner_stopped_by_sigterm_goes_on_with_resume(tmp_path):
    """SIGTERM to the runner checkpoints its run; --resume goes on from that checkpoint to the full length, appending
    to the log, and the run's time is its two segments, not the time in between."""
    total = 61_440  # 120 iterations of 4 envs x 128 steps
    cmd = [sys.executable, str(run.ROOT / "benchmark" / "run.py"), "--algo", "ppo", "--env-ids", "CartPole-v1",
           "--seeds", "1", "--out", str(tmp_path), "--name", "r", "--", "--total-timesteps", str(total),
           "--checkpoint-every", "2048"]  # fmt: skip
    runner = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob("r/runs/*/checkpoint.pt")) and time.time() < deadline:
        time.sleep(0.2)
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 130 and "--name r --resume" in out
    (job,) = json.loads((tmp_path / "r" / "status.json").read_text())
    assert job["status"] == "stopped" and len(job["segments"]) == 1
    stopped_at = int(re.findall(r"step ([\d,]+)", (tmp_path / "r" / job["log"]).read_text())[-1].replace(",", ""))
    assert stopped_at < total

    time.sleep(2)  # the pause the report leaves out of the run's time
    bench = run.main(["--out", str(tmp_path), "--name", "r", "--resume", "--status-interval", "1000"])
    (job,) = json.loads((bench / "status.json").read_text())
    assert job["status"] == "done" and "--resume" in job["command"] and len(job["segments"]) == 2
    log = (bench / job["log"]).read_text()
    assert "stopped at" in log and "resumed" in log  # both segments' output, in one log
    (summary,) = [report.summarise_run(bench, job)]
    assert summary["total_steps"] == total
    assert summary["wall"] == pytest.approx(sum(b - a for a, b in job["segments"]))
    assert summary["wall"] < job["end"] - job["start"] - 2
    assert summary["seconds"][-1] < job["end"] - job["start"] - 2  # the time axis leaves the pause out too


def test_resume_ends_a_hard_killed_run_at_its_logs_last_write(tmp_path):
    """A runner killed without notice leaves its run marked running with an open segment: resuming closes it at the
    log's modification time (the last progress line), so the dead time after it is not counted."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("step 1/2")
    os.utime(tmp_path / "logs" / "a.log", (1000.0, 1000.0))
    jobs = [
        {"env_id": "A", "seed": 1, "status": "running", "log": "logs/a.log", "start": 400.0, "segments": [[400.0, None]]},
        {"env_id": "A", "seed": 2, "status": "done", "log": "logs/b.log", "start": 0.0, "end": 300.0},  # no segments: old file
        {"env_id": "A", "seed": 3, "status": "waiting", "log": "logs/c.log", "segments": []},
    ]
    (tmp_path / "status.json").write_text(json.dumps(jobs))
    resumed = run.resumed_jobs(tmp_path)
    assert [j["status"] for j in resumed] == ["waiting", "done", "waiting"]
    assert resumed[0]["segments"] == [[400.0, 1000.0]] and run.run_seconds(resumed[0]) == 600.0
    assert run.run_seconds(resumed[1]) == 300.0 and resumed[2]["segments"] == []


def write_run(bench: Path, env_id: str, seed: int, returns: list[float], sps: float = 1000.0, evals=(), exact=(), end=0):
    """A run's events: training episodes, SPS at step `end` (default: the last episode's), then `exact` (exact greedy
    returns) and `evals` (the final evaluation's episodes, all at the last episode's step, as the scripts log them)."""
    run_dir = f"runs/{env_id}__ppo__{seed}__1"
    writer = SummaryWriter(str(bench / run_dir))
    for i, r in enumerate(returns):
        writer.add_scalar("charts/episodic_return", r, 100 * (i + 1))
    writer.add_scalar("charts/SPS", sps, end or 100 * len(returns))
    for i, r in enumerate(exact):
        writer.add_scalar("eval/exact_return", r, 100 * (i + 1))
    writer.add_scalar("eval/episodic_return", -1e6, 50)  # a periodic evaluation earlier in the run: not the final one
    for r in evals:
        writer.add_scalar("eval/episodic_return", r, 100 * len(returns))
    writer.close()
    return {"env_id": env_id, "seed": seed, "status": "done", "returncode": 0, "start": 0.0, "end": 60.0, "run_dir": run_dir}


def test_a_resumed_runs_purge_is_counted_not_warned(tmp_path, capsys, caplog):
    """A run resumed from its step-5 checkpoint (SummaryWriter(purge_step=5)) after it had logged to step 10: the scalars
    past the checkpoint are dropped, as tensorboard shows them, without tensorboard's warning of a "TensorFlow restart";
    the tools' one-line note counts them."""
    for steps, purge_step in ((range(1, 11), None), (range(5, 8), 5)):
        writer = SummaryWriter(str(tmp_path), purge_step=purge_step)
        for step in steps:
            writer.add_scalar("charts/SPS", float(step), step)
        writer.close()
    before = tblog.purges.scalars
    assert [step for step, _, _ in tblog.read_scalars(str(tmp_path))["charts/SPS"]] == [1, 2, 3, 4, 5, 6, 7]
    assert tblog.purges.scalars - before == 6 and tblog.purge_note().split(" scalars ")[1].startswith("that resumed runs")
    assert not capsys.readouterr().err and not [r for r in caplog.records if "out of order" in r.getMessage()]


@pytest.fixture
def hand_made_bench(tmp_path):
    """CartPole-v1: seeds whose last-100 means are exactly 480 and 500; Acrobot-v1: one good seed, one crash,
    one run with no episode; MountainCar-v0: far below its reference; Pendulum-v1: not finished (one run stopped, one
    waiting); Hopper-v4: one crash, one waiting."""
    bench = tmp_path / "bench"
    jobs = [
        write_run(bench, "CartPole-v1", 1, [0.0] * 50 + [480.0] * 100),  # the first 50 fall outside the last 100
        write_run(bench, "CartPole-v1", 2, [500.0] * 120, sps=3000.0),
        write_run(bench, "Acrobot-v1", 1, [-90.0] * 10),
        {"env_id": "Acrobot-v1", "seed": 2, "status": "failed", "returncode": 1, "start": 0.0, "end": 1.0},
        write_run(bench, "Acrobot-v1", 3, []),
        write_run(bench, "MountainCar-v0", 1, [-500.0] * 10, end=499_000),  # 1,000 steps short of 500k: the whole
        {"env_id": "Pendulum-v1", "seed": 1, "status": "stopped", "returncode": 143, "start": 0.0, "end": 1.0},
        {"env_id": "Pendulum-v1", "seed": 2, "status": "waiting"},
        {"env_id": "Hopper-v4", "seed": 1, "status": "failed", "returncode": 1, "start": 0.0, "end": 1.0},
        {"env_id": "Hopper-v4", "seed": 2, "status": "waiting"},
    ]
    (bench / "status.json").write_text(json.dumps(jobs))
    (bench / "bench.json").write_text(json.dumps({"algo": "ppo"}))
    return bench


def test_report_table_on_hand_made_events(hand_made_bench, tmp_path):
    text = (report.main([str(hand_made_bench), "--out", str(tmp_path / "r")]) / "report.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    assert rows["CartPole-v1"][1:4] == ["2/2", "490.0 +- 10.0", "2,000"]  # mean and population std over seeds; SPS
    assert rows["CartPole-v1"][-1].startswith("ok")  # 490 +- 10 is within the reference's 490.0 +- 6.1
    assert rows["Acrobot-v1"][1:3] == ["1/3", "-90.0 +- 0.0"]  # below -86.4 +- 1.3, at 1,000 of its 500,000 steps
    assert rows["Acrobot-v1"][-1] == "too short to compare: 1,000 of 500,000 steps; runs missing |"
    assert "Acrobot-v1 seed 2: crashed (exit 1)" in text and "Acrobot-v1 seed 3: no episodes logged" in text
    assert rows["MountainCar-v0"][-1] == "**short of reference** |"
    assert rows["Pendulum-v1"][1] == "0/2" and rows["Pendulum-v1"][-1] == "not finished |"  # still to go on with --resume
    assert "Pendulum-v1 seed 1: stopped (not finished)" in text and "Pendulum-v1 seed 2: waiting (not finished)" in text
    assert rows["Hopper-v4"][-1] == "**failed** |"  # a crash among them is a failure


def test_report_says_runs_that_ended_before_any_episode_are_too_short_not_failed(tmp_path):
    bench = tmp_path / "bench"
    jobs = [write_run(bench, "Acrobot-v1", seed, []) for seed in (1, 2)]
    (bench / "status.json").write_text(json.dumps(jobs))
    (bench / "bench.json").write_text(json.dumps({"algo": "ppo"}))
    text = (report.main([str(bench), "--out", str(tmp_path / "r")]) / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| Acrobot-v1"))
    assert row.endswith("| too short to compare: no episode ended |") and "seed 2: no episodes logged" in text


def test_report_keep_data_makes_the_same_report_once_the_benchmark_folder_is_gone(hand_made_bench, tmp_path):
    """--keep-data copies bench.json, status.json, the logs and the events beside the report, not the checkpoints."""
    (hand_made_bench / "runs" / "CartPole-v1__ppo__1__1" / "checkpoint.pt").write_bytes(b"not copied")
    text = (report.main([str(hand_made_bench), "--out", str(tmp_path / "r"), "--keep-data"]) / "report.md").read_text()
    shutil.rmtree(hand_made_bench)
    assert (report.main([str(tmp_path / "r")]) / "report.md").read_text() == text
    assert not list((tmp_path / "r").rglob("checkpoint.pt"))
    with pytest.raises(SystemExit):  # into its own folder: nothing to copy, one line
        report.main([str(tmp_path / "r"), "--keep-data"])


def test_speed_row_compares_the_learner_with_the_env_and_replaces_only_its_own_row(tmp_path, capsys):
    """A real row replaces its old one and keeps the others; a later row that fails (here its own flag, which reaches its
    script, makes dqn.py refuse) is said in one line with its script's reason and leaves the table as the rows before it
    wrote it; speed.py then exits 1 naming it."""
    out = tmp_path / "s.md"
    header = "| script | env | envs | steps | script SPS | envpool random-action SPS | fraction kept |\n|---|\n"
    out.write_text(header + "| dqn.py | CartPole-v1 | 1 | kept |\n| ppo.py | CartPole-v1 | 4 | old |\n")
    flags = ["--only", "ppo:CartPole-v1", "dqn:CartPole-v1 --learning-starts 0", "--steps-scale", "0.02"]
    with pytest.raises(SystemExit) as stop:
        speed.main([*flags, "--env-seconds", "0.5", "--no-compile", "--out", str(out)])
    assert stop.value.code == "speed.py: error: 1 of 2 rows failed (dqn:CartPole-v1), each said above"
    refusal = "dqn.py: error: --learning-starts 0 is under --batch-size or leaves no gradient step; change it"
    assert f"speed.py: row dqn:CartPole-v1 failed: dqn.py exited 2: {refusal}" in capsys.readouterr().out.splitlines()
    text = out.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(table) == 2 and table[1] == "| dqn.py | CartPole-v1 | 1 | kept |"  # in CONFIGS order; old row gone
    row = table[0]
    cells = row.strip("|").split(" | ")  # the last cell keeps the space before the closing bar
    learner, env = (float(c.replace(",", "")) for c in cells[4:6])
    assert 0 < learner < env and cells[6] == f"{learner / env:.1%}" and cells[7:] == ["-", "-", "- "]  # no --bf16 on vectors


def test_the_bf16_column_runs_the_row_again_with_bf16_where_the_script_takes_it(monkeypatch):
    calls = []

    def fake_train(algo, env_id, num_envs, steps, flags, processes=1, threads=None):
        calls.append(flags)
        return {"charts/SPS": [(steps, 750.0, 1.0)]}, 10.0

    monkeypatch.setattr(speed, "train", fake_train)
    assert speed.bf16_cell("ppo", "Breakout-v5", 8, 1024, ["--x", "1"], eager_sps=500.0) == "750 (1.50x)"
    assert calls == [["--x", "1", "--bf16"]]
    assert speed.bf16_cell("ppo", "CartPole-v1", 4, 1024, [], eager_sps=500.0) == "-" and len(calls) == 1

    def refusing(algo, env_id, num_envs, steps, flags, processes=1, threads=None):
        raise subprocess.CalledProcessError(2, [sys.executable, f"/x/{algo}.py"], "", "ppo.py: error: no bfloat16 here\n")

    monkeypatch.setattr(speed, "train", refusing)  # the row keeps its eager figures, and the cell says why it has none
    assert speed.bf16_cell("ppo", "Breakout-v5", 8, 1024, [], 500.0) == "crashed (exit 2): ppo.py: error: no bfloat16 here"


def test_scaling_rows_time_one_process_with_two_threads_against_two_processes_with_one(tmp_path, monkeypatch):
    """--scaling: each torchrun row once as 1 process x 2 threads and once as 2 processes x 1 thread, the same budget,
    and the ratio of their SPS (here made up: 1,000 against 1,500)."""
    calls = []

    def fake_train(algo, env_id, num_envs, steps, flags, processes=1, threads=None):
        calls.append((algo, env_id, steps, processes, threads))
        return {"charts/SPS": [(steps, 500.0 * (processes + 1), 1.0)]}, 10.0 * processes

    monkeypatch.setattr(speed, "train", fake_train)
    text = speed.main(["--scaling", "--steps-scale", "0.5", "--out", str(tmp_path / "s.md")])
    assert [c[3:] for c in calls] == [(1, 2), (2, 1)] * len(speed.SCALING)
    assert [c[:3] for c in calls[::2]] == [(a, e, int(n * 0.5)) for a, e, _, n, _ in speed.SCALING]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(speed.SCALING) and all(row.endswith("| 1,000 (10 s) | 1,500 (20 s) | 1.50x |") for row in rows)
    out = os.path.relpath(tmp_path / "s.md", speed.ROOT)
    assert f"Command: `python benchmark/speed.py --scaling --steps-scale 0.5 --out {out}`" in text  # as run
    # --only names the rows to time here too
    calls.clear()
    algo, env_id = speed.SCALING[0][:2]
    text = speed.main(["--scaling", "--only", f"{algo}:{env_id}", "--out", str(tmp_path / "one.md")])
    assert [c[:2] for c in calls] == [(algo, env_id)] * 2
    assert f"--only {algo}:{env_id}" in text


def sps_events(rate: float, start: float = 0.0) -> dict:
    """charts/SPS events every 2,000 steps to 100,000 of a run that steps `rate` per second after `start` seconds."""
    return {"charts/SPS": [(step, 0.0, start + step / rate) for step in range(2000, 100_001, 2000)]}


def test_compiled_speed_is_the_second_half_and_its_break_even_length():
    """Eager 1,000 SPS throughout; compiled, 20 s of compilation, then 2,000 SPS: the second half shows 2,000, and a
    run of L steps takes L/1000 s eager, 20 + L/2000 s compiled, equal at L = 40,000."""
    compiled, eager = sps_events(2000, start=20), sps_events(1000)
    assert speed.late_sps(compiled) == pytest.approx(2000) and speed.late_sps(eager) == pytest.approx(1000)
    # both processes also pay 3 s of start-up
    assert speed.pays_from(3 + 100, 3 + 20 + 50, 100_000, 1000, 2000) == pytest.approx(40_000)
    assert speed.pays_from(3 + 100, 3 + 20 + 125, 100_000, 1000, 800) == float("inf")  # slower compiled: never
    assert math.isnan(speed.late_sps({"charts/SPS": compiled["charts/SPS"][:2]}))  # too few events to halve


def test_report_seed_band_ends_where_the_shortest_seed_ends():
    """Two seeds whose last episodes end 10 steps apart (a resumed run's episodes end off the round numbers): the
    band is their mean to the shorter one's end, never the longer seed alone at the end."""
    x = np.arange(1, 101, dtype=float) * 10
    runs = [{"steps": x, "returns": np.zeros(100)}, {"steps": x - 10, "returns": np.full(100, 100.0)}]
    grid, mean, std = report.seed_band(runs, "steps")
    assert grid[-1] == 990 and mean[-1] == 50 and std[-1] == 50
    assert np.all(np.isnan(mean) | (mean == 50))  # NaN before the 20-episode window fills, else both seeds


def test_report_on_a_lone_run_stopped_at_its_budget(tmp_path, capsys):
    """A run made without run.py (Pong on a lent GPU, stopped at its time budget) is reported from its own folder."""
    job = write_run(tmp_path, "Pong-v5", 1, [-21.0] * 50 + [18.0] * 100, sps=4000.0)
    out = report.main([str(tmp_path / job["run_dir"]), "--lone-run", "ppo", "--out", str(tmp_path / "r")])
    (row,) = [line.split(" | ") for line in (out / "report.md").read_text().splitlines() if line.startswith("| Pong")]
    assert row[1:4] == ["1/1", "18.0 +- 0.0", "4,000"] and row[5] == "15,000"  # last 100 episodes; SPS; steps
    with pytest.raises(SystemExit):  # a folder that is not one run's gets one line
        report.main([str(tmp_path), "--lone-run", "ppo"])
    assert "is not a run's folder" in capsys.readouterr().err


def test_a_crashed_compiled_run_is_a_cell_that_says_why_not_a_lost_row(monkeypatch):
    """An H100 run of a2c.py --cudagraphs crashed and took the row's eager and --compile figures with it."""
    eager = sps_events(1000)

    def train(algo, env_id, num_envs, steps, flags):
        if "--cudagraphs" in flags:
            raise subprocess.CalledProcessError(1, ["a2c.py"], "", "Traceback ...\nRuntimeError: graph output overwritten\n")
        return sps_events(2000), 50.0

    monkeypatch.setattr(speed, "train", train)
    compiled, graphs = speed.compiled_cells("a2c", "Breakout-v5", 16, 100_000, [], (eager, 100.0), cuda=True)
    assert compiled.startswith("2,000 (2.00x eager's 1,000")
    assert graphs == "crashed (exit 1): RuntimeError: graph output overwritten"


def test_report_final_evaluation_and_exact_greedy_return(tmp_path):
    """The final eval column averages the last step's evaluation episodes; where runs log an exact greedy return,
    the verdict compares its last value (not the training return) with the reference."""
    bench = tmp_path / "bench"
    jobs = [
        write_run(bench, "CartPole-v1", 1, [100.0] * 10, evals=[400.0, 500.0], exact=[0.0, 470.0]),
        write_run(bench, "CartPole-v1", 2, [100.0] * 10, evals=[500.0, 500.0], exact=[0.0, 490.0]),
    ]
    (bench / "status.json").write_text(json.dumps(jobs))
    (bench / "bench.json").write_text(json.dumps({"algo": "ppo"}))
    text = (report.main([str(bench), "--out", str(tmp_path / "r")]) / "report.md").read_text()
    (row,) = [line.split(" | ") for line in text.splitlines() if line.startswith("| CartPole-v1")]
    assert row[2] == "100.0 +- 0.0" and row[6:8] == ["475.0 +- 25.0", "480.0 +- 10.0"]
    assert row[-1].startswith("ok")  # 480 +- 10 reaches the reference 490.0 +- 6.1; the training return 100 would not


@pytest.mark.parametrize("script, option", [("ddpg_td3", ["--algo", "ddpg"]), ("ppo", ["--rnn", "lstm", "--norm-obs"])])
def test_report_takes_the_references_of_the_algorithm_a_script_was_run_with(hand_made_bench, tmp_path, script, option):
    """ddpg_td3.py --algo ddpg, ppo.py --rnn lstm: rows keyed "<script>:<value>" win over the script's own rows for
    the same env."""
    (hand_made_bench / "bench.json").write_text(json.dumps({"algo": script, "extra_args": option}))
    name = f"{script}:{option[1]}"
    refs = tmp_path / "refs.csv"
    refs.write_text(
        f"algo,env_id,steps,mean,std,source\n{script},CartPole-v1,1,9.0,,plain paper\n"
        f"{name},CartPole-v1,1,7.0,,variant paper\n{script},Acrobot-v1,1,-5.0,,plain only\n"
    )
    text = (
        report.main([str(hand_made_bench), "--out", str(tmp_path / "r"), "--references", str(refs)]) / "report.md"
    ).read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert text.startswith(f"# {name}:") and "variant paper" in rows["CartPole-v1"] and "plain only" in rows["Acrobot-v1"]


def test_status_view_reads_the_progress_lines_of_step_and_generation_counting_scripts(tmp_path):
    (tmp_path / "ppo.log").write_text("step 1,024/500,000 (0%) | SPS 5,000 | return n/a | ETA 1m40s\n")
    (tmp_path / "es.log").write_text("generation 3/100 (3%) | step 90,000 | SPS 1 | return mean 20.0 | ETA 2m05s\n")
    assert (
        run.run_eta(tmp_path / "ppo.log") == "step 1,024/500,000, ETA 1m40s" and run.eta_seconds(tmp_path / "ppo.log") == 100
    )
    assert run.run_eta(tmp_path / "es.log") == "generation 3/100, ETA 2m05s" and run.eta_seconds(tmp_path / "es.log") == 125


def test_status_view_gives_no_eta_before_a_run_has_a_rate(tmp_path):
    """Runs still starting (no progress line) and none finished: the ETA is not known, so not 0m00s. Once a run has
    finished, a run still starting counts a finished run's time; a running run its own ETA."""
    (tmp_path / "starting.log").write_text("")
    (tmp_path / "ppo.log").write_text("step 1,024/500,000 (0%) | SPS 5,000 | return n/a | ETA 1m40s\n")
    starting = {"env_id": "CartPole-v1", "seed": 1, "status": "running", "log": "starting.log"}
    view = run.status_view([starting, {**starting, "seed": 2}], tmp_path, 2).splitlines()
    assert view[0].endswith("| running 2 | waiting 0 | ETA n/a") and view[1:] == [
        "  running CartPole-v1 seed 1: starting",
        "  running CartPole-v1 seed 2: starting",
    ]
    going = {**starting, "seed": 2, "log": "ppo.log"}
    assert run.status_view([starting, going], tmp_path, 2).splitlines()[0].endswith("| ETA n/a")  # seed 1's time unknown
    done = {**starting, "seed": 3, "status": "done", "segments": [[0.0, 300.0]]}
    assert run.status_view([starting, going, done], tmp_path, 2).splitlines()[0].endswith("| ETA 5m00s")
    assert run.status_view([going, done], tmp_path, 2).splitlines()[0].endswith("| ETA 1m40s")


def test_action_size_of_a_policy_whose_mean_sits_outside_the_bounds(tmp_path):
    """A hand-made a2c.py model whose Gaussian mean is -3 on every observation (Pendulum's bounds are +-2): the tool
    reports 3.00; another file gets one line and a non-zero exit."""
    a2c = load_algorithm("a2c")
    spaces = a2c.gym.spaces
    agent = a2c.Agent(spaces.Box(-8.0, 8.0, (3,)), spaces.Box(-2.0, 2.0, (1,)))
    with torch.no_grad():
        agent.actor[-1].weight.zero_()
        agent.actor[-1].bias.fill_(-3.0)
    model = tmp_path / "a2c.model"
    torch.save({"script": "a2c.py", "kind": "model", "args": {"env_id": "Pendulum-v1", "seed": 1},
                "model": agent.state_dict(), "obs_rms": None}, model)  # fmt: skip
    tool = [sys.executable, str(Path(run.__file__).parent / "studies" / "a2c_action_size.py")]
    proc = subprocess.run([*tool, str(model), "--steps", "50"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Pendulum-v1 seed 1, mean |action| before clipping 3.00 over 50 steps (bounds -2 to 2)" in proc.stdout
    other = tmp_path / "checkpoint.pt"
    torch.save({"script": "ppo.py", "kind": "checkpoint"}, other)
    proc = subprocess.run([*tool, str(other)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0 and "is not an a2c.py model" in proc.stderr


def test_report_compares_another_benchmark_of_the_same_envs_on_the_same_plots(tmp_path, monkeypatch):
    """--compare FOLDER: the other folder's runs get their own table under "Beside it: <its name>" and a second seed
    band, labelled with its name, in each env's panel; a folder that run.py did not write is one error line."""
    with_memory, without = tmp_path / "with_memory", tmp_path / "without"
    for bench, level in ((with_memory, 500.0), (without, 50.0)):
        jobs = [write_run(bench, "CartPole-v1", seed, [level] * 120) for seed in (1, 2)]
        (bench / "status.json").write_text(json.dumps(jobs))
        (bench / "bench.json").write_text(json.dumps({"algo": "ppo"}))
    labels = []
    real_plot = report.plot
    monkeypatch.setattr(
        report, "plot", lambda *a, **k: (labels.append((a[7] if len(a) > 7 else None, a[6])), real_plot(*a, **k))
    )
    text = (report.main([str(with_memory), "--out", str(tmp_path / "r"), "--compare", str(without)]) / "report.md").read_text()
    first, second = text.split("## Beside it: without")
    assert "| CartPole-v1 | 2/2 | 500.0 +- 0.0" in first and "| CartPole-v1 | 2/2 | 50.0 +- 0.0" in second
    assert labels and all(label == "with_memory" and [name for name, _ in others] == ["without"] for label, others in labels)
    with pytest.raises(SystemExit):
        report.main([str(with_memory), "--out", str(tmp_path / "r2"), "--compare", str(tmp_path)])


def test_cleanrl_ports_change_only_the_listed_lines_and_refuse_a_file_they_do_not_fit(tmp_path, monkeypatch, capsys):
    """cleanrl_speed.py applies each port to exactly one place of CleanRL's file and leaves the rest as it is; a file
    where a port's text is missing (another commit) stops the run with one line naming the port."""
    originals = {}

    def fake_file(path, clone, cache):
        ports = [old for file, _, old, _ in cleanrl_speed.PORTS if file == path]
        originals[path] = f"# {path}\n" + "\n# untouched line\n".join(ports) + "\n# the end\n"
        return originals[path]

    monkeypatch.setattr(cleanrl_speed, "cleanrl_file", fake_file)
    cleanrl_speed.write_cleanrl(tmp_path, None, tmp_path)
    for file, _, old, new in cleanrl_speed.PORTS:
        text = (tmp_path / file).read_text()
        assert new in text and old not in text and text.count("# untouched line") == originals[file].count("# untouched")
    assert (tmp_path / "cleanrl_utils" / "__init__.py").is_file()
    monkeypatch.setattr(cleanrl_speed, "cleanrl_file", lambda path, clone, cache: "# another commit\n")
    with pytest.raises(SystemExit) as stop:
        cleanrl_speed.write_cleanrl(tmp_path / "other", None, tmp_path)
    assert "does not apply to cleanrl/" in str(stop.value) and str(stop.value).count("\n") == 0


def test_the_shell_comparisons_fetch_cleanrl_at_the_pinned_commit(tmp_path):
    """benchmark/common.sh's cleanrl_script (the PPG and RND comparisons) downloads CleanRL's file at the commit that
    cleanrl_speed.py pins, never a branch, into a file named by that commit (an older download is not reused)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "curl").write_text('#!/bin/sh\necho "$@" > "$CURL_ARGS"\nfor a; do out=$a; done\necho fetched > "$out"\n')
    (shim / "curl").chmod(0o755)
    deps = tmp_path / "deps"
    (deps / "gym").mkdir(parents=True)  # gym 0.23 counted as installed: no pip
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "DEPS": str(deps), "CURL_ARGS": str(tmp_path / "args")}
    script = "source benchmark/common.sh; cleanrl_script ppo_rnd_envpool.py"
    out = subprocess.run(["bash", "-c", script], cwd=run.ROOT, env=env, capture_output=True, text=True, check=True).stdout
    commit = cleanrl_speed.CLEANRL_COMMIT
    assert out.strip() == str(deps / f"cleanrl_{commit[:8]}_ppo_rnd_envpool.py")
    url = f"https://raw.githubusercontent.com/vwxyzjn/cleanrl/{commit}/cleanrl/ppo_rnd_envpool.py"
    assert url in (tmp_path / "args").read_text().split()


def test_speed_goes_on_past_a_failed_row_and_writes_only_where_asked(tmp_path, monkeypatch, capsys):
    """A row whose run fails (a refusal made up here) is said in one line with its script's own reason, not a traceback;
    the rows after it are measured and written all the same, and speed.py exits 1 naming it. Without --out the table
    goes to benchmark/runs/, never over the committed one. An --only that names no row, or cannot be split into words, is
    refused in one line with exit 2 and nothing written."""
    line = "ppo.py: error: --total-timesteps 1638 is less than one rollout; raise it"

    def fast(algo, env_id, num_envs, steps, flags, processes=1, threads=None):
        if env_id == "Breakout-v5":
            raise subprocess.CalledProcessError(2, [sys.executable, f"/x/algorithms/{algo}.py"], "", f"warning\n{line}\n")
        return {"charts/SPS": [(steps, 100.0, 1.0)]}, 1.0

    monkeypatch.setattr(speed, "train", fast)
    monkeypatch.setattr(speed, "ROOT", tmp_path)  # where the default table would go
    monkeypatch.setattr(speed, "env_sps", lambda env_id, num_envs, seconds: 1000.0)
    with pytest.raises(SystemExit) as stop:
        speed.main(["--only", "ppo", "--no-compile"])
    assert stop.value.code == "speed.py: error: 1 of 2 rows failed (ppo:Breakout-v5), each said above"
    said = capsys.readouterr().out.splitlines()
    assert said[1] == f"speed.py: row ppo:Breakout-v5 failed: ppo.py exited 2: {line}" and len(said) == 2
    table = (tmp_path / "benchmark" / "runs" / "speed.md").read_text()
    assert "| ppo.py | CartPole-v1 |" in table and "| ppo.py | Breakout-v5 |" not in table
    assert not (tmp_path / "benchmark" / "results").exists()
    for only in (["nosuch"], ["ppo:Pong-v5"], ["ppo:CartPole-v1 --x 'unclosed"]):
        with pytest.raises(SystemExit) as stop:
            speed.main(["--only", *only, "--out", str(tmp_path / "never.md")])
        assert stop.value.code == 2 and capsys.readouterr().err.splitlines()[-1].split(": error: ")[1].startswith("--only")
    assert not (tmp_path / "never.md").exists()


def test_steps_scale_leaves_every_row_a_run_its_script_takes():
    """At --steps-scale 0.1 a row's budget stays at least one rollout (ppg_procgen.py and rnd_ppo.py refuse less) and a
    --learning-starts the budget does not pass becomes half the budget (dqn.py refuses a run without a gradient step);
    the other rows are scaled as they are, and a row's own flags from --only come last, so they win."""
    rows = {(algo, env_id): (budget, flags) for algo, env_id, _, budget, flags in speed.selected(speed.CONFIGS, None, 0.1)}
    assert rows["dqn", "CartPole-v1"] == (10_000, ["--learning-starts", "5000"])
    assert rows["dqn", "Breakout-v5"] == (2_000, ["--learning-starts", "1000"])
    assert rows["ddpg_td3", "Hopper-v4"] == (500, ["--learning-starts", "256"])
    assert rows["ppg_procgen", "StarpilotEasy-v0"][0] == 64 * 256 and rows["rnd_ppo", "MontezumaRevenge-v5"][0] == 128 * 128
    assert rows["ppo", "CartPole-v1"] == (10_240, []) and rows["es", "CartPole-v1"] == (2, [])
    assert [row[3] for row in speed.selected(speed.SCALING, ["ppg_procgen"], 0.1)] == [64 * 64]  # its --num-steps 64
    assert speed.selected(speed.CONFIGS, ["dqn:CartPole-v1 --learning-starts 100"], 1.0) == [
        ("dqn", "CartPole-v1", 1, 100_000, ["--learning-starts", "10000", "--learning-starts", "100"])
    ]


def test_report_tables_each_seed_beside_the_reference_curve_at_its_steps(tmp_path):
    """A run far short of its reference's budget is read at the reference curve's steps: each seed's mean of the 20
    episodes ended by the step (episodes every 100 steps, so by step 1,000 the 10 first), the seeds' mean, the curve's
    value; a step past the runs' end is not tabled, nor is an env whose runs end before its curve's first step, nor an
    env without a curve."""
    bench = tmp_path / "bench"
    jobs = [
        write_run(bench, "Pong-v5", 1, list(range(30))),  # episode i ends at step 100 * (i + 1) with return i
        write_run(bench, "Pong-v5", 2, [float(10 * i) for i in range(30)]),
        write_run(bench, "CartPole-v1", 1, [500.0] * 30),
        write_run(bench, "Breakout-v5", 1, [5.0] * 30),
    ]
    (bench / "status.json").write_text(json.dumps(jobs))
    (bench / "bench.json").write_text(json.dumps({"algo": "ppo"}))
    curves = tmp_path / "curves.csv"
    pong_curve = ["ppo,Pong-v5,1000,-12,a", "ppo,Pong-v5,3000,2,a", "ppo,Pong-v5,9000,11,a"]
    curves.write_text("\n".join(["algo,env_id,steps,return,source", *pong_curve, "ppo,Breakout-v5,9000,15,a"]) + "\n")
    out = report.main([str(bench), "--out", str(tmp_path / "r"), "--reference-curves", str(curves)])
    text = (out / "report.md").read_text()
    pong = text.split("## Pong-v5")[1].splitlines()
    rows = [line.split(" | ") for line in pong if line.startswith("| ") and "--" not in line]
    assert rows[0] == ["| steps", "seed 1", "seed 2", "mean of the seeds", "reference curve |"]
    # by step 1,000: returns 0..9 (mean 4.5) and 0..90 (45.0); by 3,000: the last 20 of 0..29, 10..29 (19.5) and 195.0
    assert rows[1:] == [["| 1k", "4.5", "45.0", "24.8", "-12 |"], ["| 3k", "19.5", "195.0", "107.2", "2 |"]]
    assert "## CartPole-v1" not in text and "## Breakout-v5" not in text
