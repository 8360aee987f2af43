"""Read scalars out of a run's tensorboard event files: shared by the tests and the benchmark reports.

Imported as `tblog` (benchmark/ is on the path of its scripts, and on pytest's through pytest.ini)."""

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float, float]]]:
    """All scalars of one run directory as {tag: [(step, value, wall_time), ...]} in logged order.

    EventAccumulator applies the purge that a resumed run's SummaryWriter(purge_step=...) asks for, so events
    logged after the checkpoint by a run that was killed hard are dropped, as tensorboard itself shows them.
    """
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
