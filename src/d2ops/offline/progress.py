"""Progress lines while a pipeline run runs offline: a line per state entered and left, and a
training job's iterations, loss, images/s and time left, read from the job's log as it grows.

The run (``d2ops.offline.pipeline``) registers these as history listeners and polls the follower
while it waits; they print and never drive the run.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from d2ops.offline.log_progress import DEFAULT_MIN_INTERVAL, LineSplitter, ProgressReporter
from d2ops_core.pipeline_stages import EXPECTED_MISSES, expected_miss, miss_settled

Printer = Callable[[str], None]

class ProgressPrinter:
    """History events -> one line per state entered and left (with its duration and error)."""

    def __init__(self, out: Printer, run_id: str | None = None) -> None:
        self.out = out
        self.run_id = run_id
        self.started = time.monotonic()
        self._entered: dict[str, datetime] = {}
        self._errors: dict[str, str] = {}
        self._current: str | None = None
        self._visits: dict[str, int] = {}
        self._pending: tuple[str, float, str, list[str]] | None = None

    def _settle_miss(self, entered: str | None, clock: str) -> None:
        """Print the pending expected miss once the state ``entered`` (None: the run ended) tells what it was."""
        if self._pending is None:
            return
        name, took, error, since = self._pending
        if entered is not None:
            since.append(entered)
            if not miss_settled(name, since):
                return  # still deciding: the run has not recovered, recorded a failure nor left the stage yet
        self._pending = None
        miss = expected_miss(name, error, since)
        self.out(f"{clock} ok {name} ({took:.1f}s, missed: {miss.meaning})" if miss
                 else f"{clock} !! {name} ({took:.1f}s, caught {error})")

    def stamp(self) -> str:
        """Seconds since the run began, as each progress line starts."""
        return f"[{time.monotonic() - self.started:7.1f}s]"

    def __call__(self, execution_name: str, event: dict[str, Any]) -> None:
        if self.run_id is not None and execution_name != self.run_id:
            return
        kind = event["type"]
        clock = self.stamp()
        if kind.endswith("StateEntered"):
            name = event["stateEnteredEventDetails"]["name"]
            self._settle_miss(name, clock)
            self._entered[name] = event["timestamp"]
            self._current = name
            self._visits[name] = self._visits.get(name, 0) + 1
            if kind.startswith("Parallel"):  # a stage (d2ops_core.pipeline_stages) begins
                self.out(f"{clock} == {name}")
            elif self._visits[name] == 1 and (kind.startswith("Task") or kind.startswith("Wait")):
                self.out(f"{clock}   -> {name}")
        elif kind.endswith("StateExited"):
            name = event["stateExitedEventDetails"]["name"]
            start = self._entered.pop(name, event["timestamp"])
            took = (event["timestamp"] - start).total_seconds()
            error = self._errors.pop(name, None)
            if error and name in EXPECTED_MISSES and error in EXPECTED_MISSES[name].errors:
                # an error the definition expects (the first run's endpoint lookup): said once the run shows
                # whether it recovered (a miss) or went to its failure path (caught)
                self._pending = (name, took, error, [])
            elif error:
                self.out(f"{clock} !! {name} ({took:.1f}s, caught {error})")
            elif self._visits.get(name, 0) == 1 and not kind.startswith("Choice"):
                self.out(f"{clock} ok {name} ({took:.1f}s)")  # loops (the endpoint wait) print once
        elif kind.endswith("Failed") or kind.endswith("TimedOut"):
            details: dict[str, Any] = next((v for k, v in event.items() if k.endswith("EventDetails")), {}) or {}
            if kind.startswith("Execution"):
                self._settle_miss(None, clock)
                self.out(f"{clock} run FAILED: {details.get('error')}: {str(details.get('cause', ''))[:300]}")
            elif self._current and details.get("error"):  # ParallelStateFailed names none: its branch's state did
                self._errors[self._current] = str(details["error"])
        elif kind == "ExecutionSucceeded":
            self.out(f"{clock} run SUCCEEDED")
        elif kind == "ExecutionAborted":
            self.out(f"{clock} run ABORTED")


class _LogTail:
    """What a growing log file gained since the last read, as whole lines (a new or truncated file starts over).

    The file stays open while it is followed: a file put in its place (a job of the same name started
    again) then has another inode number than the open one, even on file systems that reuse the numbers
    of deleted files (ext4 does, at once), which a number saved from an earlier read could not tell.
    """

    CHUNK = 1 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self._log: BinaryIO | None = None
        self.splitter = LineSplitter()

    def read(self, *, to_end: bool = False) -> list[str]:
        try:
            if self._log is not None and self._replaced(self._log):
                self.close()
            if self._log is None:
                self._log = self.path.open("rb", buffering=0)
                self.splitter = LineSplitter()
            lines: list[str] = []
            while True:
                chunk = self._log.read(self.CHUNK)
                lines += self.splitter.feed(chunk)
                if not chunk or not to_end:
                    break
        except OSError:  # not created yet (the job is still downloading its channels)
            return []
        return lines + self.splitter.flush() if to_end else lines

    def _replaced(self, log: BinaryIO) -> bool:
        """Another file at the path, or this one truncated (a gone path: the open file still holds the log)."""
        try:
            on_path = os.stat(self.path).st_ino
        except FileNotFoundError:
            return False
        opened = os.fstat(log.fileno())
        return on_path != opened.st_ino or opened.st_size < log.tell()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _is_training_job(details: dict[str, Any]) -> bool:
    return details.get("resourceType") == "sagemaker" and \
        str(details.get("resource", "")).startswith("createTrainingJob")


@dataclass
class _FollowedJob:
    execution: str  # the execution whose state created the job
    tail: _LogTail
    reporter: ProgressReporter
    announcement: str | None  # where to look, said once (once the follower knows the execution is its run)
    ended: bool = False  # its task ended before the follower knew that


class TrainingProgressFollower:
    """While a ``createTrainingJob.sync`` state waits: progress lines from the job's own metric lines.

    As a history listener it learns which job the state created (TaskScheduled's parameters) and
    when the state's task ended; :meth:`poll` (the run's wait loop, every half second) reads what
    the job's log gained and prints a progress line at most every ``min_interval`` seconds. When the
    task ends, what is left of the log is read at once, so the last progress line (where the job
    ended) comes before the state's own ``ok``/``!!`` line. Nothing is printed for a job whose log
    holds no metric line.

    It follows one execution, ``run_id``: other executions' events are ignored. The run id is known
    only once the trigger answered, so until then the training jobs executions schedule are held,
    silent, one per execution, and those of executions other than ``run_id`` (other runs live in
    the same work directory) dropped when it is set: it never follows a job whose end it would not
    hear of.
    """

    def __init__(self, job_log: Callable[[str], Path], out: Printer, stamp: Callable[[], str], *,
                 run_id: str | None = None, min_interval: float = DEFAULT_MIN_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_log = job_log
        self.out = out
        self.stamp = stamp
        self._run_id = run_id
        self.min_interval = min_interval
        self.clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, str] = {}  # the state each execution entered last
        self._jobs: dict[str, _FollowedJob] = {}  # by execution; the followed one's alone once run_id is set

    @property
    def run_id(self) -> str | None:
        return self._run_id

    @run_id.setter
    def run_id(self, run_id: str) -> None:
        with self._lock:
            self._run_id = run_id
            for execution in [e for e in self._jobs if e != run_id]:
                self._drop(execution)

    def __call__(self, execution_name: str, event: dict[str, Any]) -> None:
        if self._run_id is not None and execution_name != self._run_id:
            return
        kind = event["type"]
        if kind.endswith("StateEntered"):
            self._states[execution_name] = event["stateEnteredEventDetails"]["name"]
        elif kind == "TaskScheduled":
            details = event.get("taskScheduledEventDetails") or {}
            if not _is_training_job(details):
                return
            try:
                name = json.loads(details.get("parameters") or "{}").get("TrainingJobName")
            except (ValueError, AttributeError):
                return
            if isinstance(name, str) and name:
                label, log = self._states.get(execution_name, name), self.job_log(name)
                with self._lock:
                    self._drop(execution_name)
                    # the job starts (imports, data, model) before it logs an iteration: say where to look
                    job = self._jobs[execution_name] = _FollowedJob(execution_name, _LogTail(log), ProgressReporter(
                        label, min_interval=self.min_interval, clock=self.clock),
                        f"{label}: training job {name}, log {_shown(log)}")
                    if execution_name == self._run_id:
                        self._announce(job)
        elif kind in ("TaskSucceeded", "TaskFailed", "TaskTimedOut"):
            details = next((v for k, v in event.items() if k.endswith("EventDetails")), None) or {}
            if _is_training_job(details):
                self._ended(execution_name)
        elif kind.startswith("Execution") and kind != "ExecutionStarted":
            self._ended(execution_name)

    def poll(self) -> None:
        with self._lock:
            job = self._followed()
            if job is None:
                return
            self._announce(job)
            if job.ended:
                self._finish(job)
            else:
                self._print(job.reporter.feed(job.tail.read()))

    def finish(self) -> None:
        """Read the rest of the job's log, print where it ended, stop following it."""
        with self._lock:
            job = self._followed()
            if job is not None:
                self._announce(job)
                self._finish(job)
            for execution in list(self._jobs):
                self._drop(execution)

    def _followed(self) -> _FollowedJob | None:
        return self._jobs.get(self._run_id) if self._run_id is not None else None

    def _ended(self, execution: str) -> None:
        with self._lock:
            job = self._jobs.get(execution)
            if job is None:
                return
            if execution == self._run_id:
                self._announce(job)
                self._finish(job)
            else:
                job.ended = True  # said once run_id names its execution

    def _announce(self, job: _FollowedJob) -> None:
        self._print(job.announcement)
        job.announcement = None

    def _finish(self, job: _FollowedJob) -> None:
        self._print(job.reporter.feed(job.tail.read(to_end=True)))
        self._print(job.reporter.finish())
        self._drop(job.execution)

    def _drop(self, execution: str) -> None:
        job = self._jobs.pop(execution, None)
        if job is not None:
            job.tail.close()

    def _print(self, line: str | None) -> None:
        if line is not None:
            self.out(f"{self.stamp()}      {line}")
