"""Where a training job is, and the line and the loss curve that say so: one home for every reader.

Two readers turn a job's metric lines (``d2ops_core.metrics``) into a :class:`Progress`:

- the offline follower of ``d2ops demo`` / ``d2ops run`` reads the job's log as it grows
  (``d2ops.offline.log_progress.ProgressParser``);
- the status API reads the values SageMaker scraped from the same lines with the job's
  MetricDefinitions and published to CloudWatch (offline: the local SageMaker publishes them to
  moto's CloudWatch the same way), :func:`progress_from_series`.

Both print it with :func:`format_progress` (``d2ops status`` prints the status API's), and the
status API bounds the loss curve it answers with :func:`downsample`.

Standard library only (the Lambda layer ships it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_MAX_SECONDS_SHOWN = 100 * 3600
# The loss curve the status API answers: enough points for a chart a few hundred pixels wide.
MAX_SERIES_POINTS = 200

Point = tuple[float, float]  # (iteration, value)


@dataclass(frozen=True)
class Progress:
    """Where the job is: the newest training iteration its lines named, and the newest of each value."""

    iteration: int
    total: int | None = None
    loss: float | None = None
    images_per_second: float | None = None
    seconds_per_iteration: float | None = None
    learning_rate: float | None = None

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, max(0.0, self.iteration / self.total))

    @property
    def seconds_left(self) -> float | None:
        """Iterations still to run times the job's own seconds per iteration (None where unknown)."""
        seconds = self.seconds_per_iteration
        if not self.total or seconds is None or not math.isfinite(seconds) or seconds <= 0:
            return None
        return max(0, self.total - self.iteration) * seconds


def _number(value: float, decimals: int) -> str:
    """Fixed decimals where they read well (0.812, 10.40), three significant digits beyond (1.23e+05)."""
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 10 ** -decimals <= abs(value) < 1000:
        return f"{value:.{decimals}f}"
    return f"{value:.3g}"


def _duration(seconds: float) -> str:
    if seconds >= _MAX_SECONDS_SHOWN:
        return f"{_MAX_SECONDS_SHOWN // 3600}+ h"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_progress(label: str, progress: Progress) -> str:
    """``Train model: iter 120/250 (48%)  loss 0.812  10.4 img/s  ~0:38 left`` (what is known of it)."""
    head = f"{label}: iter {progress.iteration}"
    fraction = progress.fraction
    if progress.total and fraction is not None:
        head += f"/{progress.total} ({math.floor(fraction * 100)}%)"
    parts = [head]
    if progress.loss is not None:
        parts.append(f"loss {_number(progress.loss, 3)}")
    speed = progress.images_per_second
    if speed is not None and math.isfinite(speed) and speed > 0:
        parts.append(f"{_number(speed, 2 if speed < 10 else 1)} img/s")
    left = progress.seconds_left
    if left is not None and progress.total is not None and progress.iteration < progress.total:
        parts.append(f"~{_duration(left)} left")
    return "  ".join(parts)


def downsample(points: Sequence[Point], max_points: int = MAX_SERIES_POINTS) -> list[Point]:
    """At most ``max_points`` points of a curve, in order: consecutive runs of points averaged.

    A long series is cut into ``max_points`` runs of (nearly) equal length; each becomes the mean of
    its values at its last iteration, so the newest point is always the newest iteration and a
    noisy loss reads as its trend. Points with a value that is not a finite number are left out
    (a NaN loss has no place on the chart; the latest value still says it).
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    finite = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    if len(finite) <= max_points:
        return finite
    out: list[Point] = []
    for bucket in range(max_points):
        start = bucket * len(finite) // max_points
        end = (bucket + 1) * len(finite) // max_points
        run = finite[start:end]
        out.append((run[-1][0], math.fsum(y for _, y in run) / len(run)))
    return out


def _latest(series: Sequence[Point]) -> float | None:
    return series[-1][1] if series else None


def progress_from_series(series: Mapping[str, Sequence[Point]]) -> tuple[Progress | None, list[Point]]:
    """A job's published metrics (metric name -> ``(time, value)`` points, oldest first) -> where it is
    and its loss curve (``(iteration, loss)``, downsampled).

    ``train:iteration`` and ``train:total_iterations`` are what the job's MetricDefinitions read from
    its ``train:loss`` lines (``d2ops_core.metrics``); the loss of a time bucket is paired with the
    iteration of the same bucket. No iteration published yet: no progress (None) and no curve.
    """
    iterations = [(t, v) for t, v in series.get("train:iteration", ()) if math.isfinite(v) and v >= 0]
    if not iterations:
        return None, []
    at = dict(iterations)
    curve = [(at[t], loss) for t, loss in series.get("train:loss", ()) if t in at]
    total = _latest(series.get("train:total_iterations", ()))
    progress = Progress(
        iteration=int(iterations[-1][1]),
        total=int(total) if total is not None and math.isfinite(total) and total >= 1 else None,
        loss=_latest(series.get("train:loss", ())),
        images_per_second=_latest(series.get("train:images_per_second", ())),
        seconds_per_iteration=_latest(series.get("train:iter_seconds", ())),
        learning_rate=_latest(series.get("train:lr", ())))
    return progress, downsample(curve)
