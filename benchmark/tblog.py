"""Read scalars out of a run's tensorboard event files: shared by the tests and the benchmark reports.

Imported as `tblog` (benchmark/ is on the path of its scripts, and on pytest's through pytest.ini)."""

import logging
import re

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


class Purges(logging.Filter):
    """Keeps tensorboard's warning of each purge out of the output and counts the scalars it drops: a resumed run asks
    for the purge (SummaryWriter(purge_step=...)), so the warning's "likely caused by a TensorFlow restart" is no news."""

    def __init__(self):
        super().__init__()
        self.scalars = 0

    def filter(self, record: logging.LogRecord) -> bool:
        found = re.match(r"Detected out of order event\.step.* Removing (\d+) scalars", record.getMessage())
        self.scalars += int(found[1]) if found else 0
        return found is None


purges = Purges()
logging.getLogger("tensorboard").addFilter(purges)


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float, float]]]:
    """All scalars of one run directory as {tag: [(step, value, wall_time), ...]} in logged order.

    EventAccumulator applies the purge that a resumed run's SummaryWriter(purge_step=...) asks for, so events
    logged after the checkpoint by a run that was killed hard are dropped, as tensorboard itself shows them
    (counted in `purges.scalars`).
    """
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def purge_note() -> str:
    """A line for a tool's output where the runs it read had events purged, else nothing."""
    if not purges.scalars:
        return ""
    return f"{purges.scalars:,} scalars that resumed runs had logged past their checkpoint left out, as tensorboard does"
