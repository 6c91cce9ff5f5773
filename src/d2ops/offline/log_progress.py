"""A training job's progress, read from its own metric lines: what `d2ops run` and `d2ops demo` print
while the ``.sync`` training state waits.

Pure: log text in, one short line out. The lines are the job's ``d2ops-metric`` lines, parsed by
``d2ops_core.metrics`` (the module whose regexes SageMaker applies through the job's
MetricDefinitions); ``iter=N/TOTAL`` gives the progress, ``train:loss`` the loss,
``train:images_per_second`` the throughput and ``train:iter_seconds`` the time left. Anything
else in the log (other output, other hosts, half-written or hostile lines) leaves it as it was.

:class:`Progress` and :func:`format_progress` live in ``d2ops_core.training_progress``: the status
API (reading the values SageMaker published from the same lines) and ``d2ops status`` use them too.

The offline runtime's follower (``d2ops.offline.progress``) reads the job's log as it grows
and prints what :class:`ProgressReporter` hands it, at most one line every few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from d2ops.local.job_log import split_host_line
from d2ops_core import metrics
from d2ops_core.training_progress import Progress, format_progress

DEFAULT_MIN_INTERVAL = 5.0
# Both trainers print an iteration's lines in one order, this one last (torchvision_trainer's training
# loop; detectron2_hooks.MetricLineWriter, where it follows train:iter_seconds): with it, the iteration is whole.
_LAST_LINE_OF_AN_ITERATION = "train:images_per_second"


class ProgressParser:
    """Log lines in, :class:`Progress` out.

    Only ``train:*`` lines with an iteration count. The first host that prints one is followed
    (rank 0 prints them; in a multi-host job another host's lines never make progress jump), and
    an iteration earlier than the one reached is taken as it comes (a resumed job restarts there).

    :attr:`progress` is the newest iteration whose lines have all arrived: its last line
    (``train:images_per_second``) or a line of another iteration (detectron2 times no step in its
    first iterations, so they end without one). A log read while an iteration's lines are being
    written so never shows that iteration with the previous one's speed; :meth:`flush` takes the
    iteration as it is when the log ends.
    """

    def __init__(self) -> None:
        self.progress: Progress | None = None
        self.host: str | None = None
        self._arriving: Progress | None = None  # the iteration whose lines are coming in

    def feed(self, line: str) -> bool:
        """One log line; True when it changed the progress."""
        host, text = split_host_line(line)
        host = host or ""  # a line without a host prefix: a job's output read as it is
        parsed = metrics.parse_metric(text)
        if parsed is None or not parsed.name.startswith("train:") or parsed.iteration is None:
            return False
        if self.host is None:
            self.host = host
        elif host != self.host:
            return False
        changed = False
        current = self._arriving or Progress(parsed.iteration)
        if parsed.iteration != current.iteration:
            changed = self.flush()  # the previous iteration printed all it had
            current = replace(current, iteration=parsed.iteration)
        if parsed.total is not None:
            current = replace(current, total=parsed.total)
        field = {"train:loss": "loss", "train:images_per_second": "images_per_second",
                 "train:iter_seconds": "seconds_per_iteration"}.get(parsed.name)
        if field is not None:
            current = replace(current, **{field: parsed.value})
        self._arriving = current
        if parsed.name == _LAST_LINE_OF_AN_ITERATION:
            changed = self.flush() or changed
        return changed

    def flush(self) -> bool:
        """Take the iteration whose lines were coming in as whole (the log ended); True when that changed it."""
        if self._arriving is None or self._arriving == self.progress:
            return False
        self.progress = self._arriving
        return True


class LineSplitter:
    """Bytes of a growing log in, whole lines out: a line still being written waits for its newline."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._pending + chunk
        *complete, self._pending = data.split(b"\n")
        return [line.decode("utf-8", "replace").rstrip("\r") for line in complete]

    def flush(self) -> list[str]:
        """The last line of a log that ended without a newline."""
        rest, self._pending = self._pending, b""
        return [rest.decode("utf-8", "replace").rstrip("\r")] if rest else []


class ProgressReporter:
    """A job's log lines in; progress lines to print out, at most one per ``min_interval`` seconds.

    :meth:`feed` answers a line when the job reached a new iteration and the last line printed is
    ``min_interval`` old (the first at once, the job's last iteration at once);
    :meth:`finish` answers the newest progress if it was held back (or its lines had not all come),
    so the last thing printed is where the job ended.
    """

    def __init__(self, label: str, *, min_interval: float = DEFAULT_MIN_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.min_interval = min_interval
        self.clock = clock
        self.parser = ProgressParser()
        self._printed: Progress | None = None
        self._printed_at: float | None = None

    def feed(self, lines: Iterable[str]) -> str | None:
        for line in lines:
            self.parser.feed(line)
        progress = self.parser.progress
        if progress is None or (self._printed is not None and progress.iteration == self._printed.iteration):
            return None
        now = self.clock()
        done = progress.total is not None and progress.iteration >= progress.total
        if self._printed_at is not None and now - self._printed_at < self.min_interval and not done:
            return None
        return self._print(progress, now)

    def finish(self) -> str | None:
        self.parser.flush()
        progress = self.parser.progress
        if progress is None or progress == self._printed:
            return None
        return self._print(progress, self.clock())

    def _print(self, progress: Progress, now: float) -> str:
        self._printed, self._printed_at = progress, now
        return format_progress(self.label, progress)
