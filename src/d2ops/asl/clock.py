"""Time for executions: a real clock for the offline runtime, a virtual one for tests.

A ``VirtualClock`` never sleeps: it starts at the wall clock (or a given moment), and Wait states
and retry back-offs advance its time instantly, so recorded timestamps stay consistent (a 30 s Wait
shows 30 s between events) while tests run in milliseconds. ``Cancel`` is the stop signal sleeps
and tasks watch (an abort, a failed sibling branch); cancels chain, so stopping an execution stops
every branch in it.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

_POLL_SECONDS = 0.05


class Cancel:
    """A stop flag that is also set when its parent is."""

    def __init__(self, parent: Cancel | None = None) -> None:
        self._event = threading.Event()
        self.parent = parent

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set() or (self.parent is not None and self.parent.is_set())

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` of real time; True as soon as this (or a parent) is set."""
        deadline = _monotonic() + max(0.0, seconds)
        while not self.is_set():
            remaining = deadline - _monotonic()
            if remaining <= 0:
                return False
            self._event.wait(min(remaining, _POLL_SECONDS))
        return True


def _monotonic() -> float:
    return time.monotonic()


class Clock:
    """Real time: ``now`` is the wall clock (UTC) and ``sleep`` really waits (until cancelled)."""

    virtual = False

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float, cancel: Cancel | None = None) -> None:
        (cancel or Cancel()).wait(seconds)


class VirtualClock(Clock):
    """Simulated time that advances only when something sleeps (instantly, in any thread)."""

    virtual = True

    def __init__(self, start: datetime | None = None) -> None:
        # The wall clock by default (UTC, to the millisecond, as the service's timestamps are), so a
        # TimestampPath a definition computes from "now" is neither years ahead nor in the past.
        now = datetime.now(UTC)
        self._now = start or now.replace(microsecond=now.microsecond // 1000 * 1000)
        if self._now.tzinfo is None:
            raise ValueError("VirtualClock start must be timezone-aware")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def sleep(self, seconds: float, cancel: Cancel | None = None) -> None:
        if cancel is not None and cancel.is_set():
            return
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move on ``seconds`` (negative: not at all); a span past the calendar's end stops at its last moment,
        so a caller sleeping "forever" (inf, 1e20) cannot overflow the clock."""
        with self._lock:
            room = datetime.max.replace(tzinfo=UTC) - self._now
            seconds = max(0.0, seconds)  # NaN too
            try:
                self._now += room if seconds >= room.total_seconds() else timedelta(seconds=seconds)
            except OverflowError:  # within a microsecond of the end, rounded past it
                self._now += room

    def set(self, moment: datetime) -> None:
        """Move to ``moment`` (used to give sequentially simulated branches the same start time)."""
        with self._lock:
            self._now = moment


def iso(moment: datetime) -> str:
    """The context object's timestamp format: ISO 8601, UTC, milliseconds, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
