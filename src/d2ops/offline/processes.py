"""Keep the work dir to one runtime at a time, and leave no stray processes behind.

- A lock (``flock`` on ``<work dir>/runtime.lock``) makes a second runtime on the same work
  dir fail with a clear message; the kernel drops it when the holder dies, even by SIGKILL.
- The runtime becomes a Linux child subreaper, so processes that daemonise (TorchServe's
  ``torchserve --start`` leaves a detached java) stay its descendants.
- A watcher thread records every descendant (pid + creation time) in
  ``<work dir>/processes.json``. A runtime killed with SIGKILL cannot clean up, so the next
  one reads that file and ends whatever is still alive with the same pid *and* creation
  time (a reused pid is left alone).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil

from d2ops.offline.store import write_json_atomic

PR_SET_CHILD_SUBREAPER = 36
WATCH_SECONDS = 1.0


class RuntimeBusy(Exception):
    """Another runtime holds the work dir."""


def _set_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _end(processes: list[psutil.Process], grace: float = 5.0) -> list[psutil.Process]:
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)
    return processes


class ProcessWarden:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.lock_path = work_dir / "runtime.lock"
        self.table_path = work_dir / "processes.json"
        self._lock_file: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = psutil.Process()
        self._baseline: set[tuple[int, float]] = set()  # processes that predate the runtime are not ours

    def acquire(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        handle = open(self.lock_path, "a+")  # noqa: SIM115 - held open for the runtime's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RuntimeBusy(f"another d2ops offline runtime (pid {holder}) is using {self.work_dir}; wait for it "
                              "to finish, stop it, or pass a different --work-dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock_file = handle
        self._baseline = {self._key(p) for p in self._me.children(recursive=True)}
        _set_subreaper()

    def reap_leftovers(self) -> list[str]:
        """End the processes a killed runtime left behind; one message per process ended."""
        messages: list[str] = []
        try:
            table = json.loads(self.table_path.read_text("utf-8"))
        except (OSError, ValueError):
            return messages
        leftovers = []
        for entry in table.get("processes", []):
            try:
                proc = psutil.Process(int(entry["pid"]))
                if abs(proc.create_time() - float(entry["create_time"])) < 0.01 and proc.pid != os.getpid():
                    leftovers.append(proc)
                    messages.append(f"stopped leftover process {proc.pid} ({entry.get('name', '?')}) "
                                    "from an interrupted run")
            except (psutil.Error, KeyError, ValueError):
                continue
        _end(leftovers)
        self.table_path.unlink(missing_ok=True)
        return messages

    @staticmethod
    def _key(proc: psutil.Process) -> tuple[int, float]:
        try:
            return proc.pid, proc.create_time()
        except psutil.Error:
            return proc.pid, 0.0

    def descendants(self) -> list[psutil.Process]:
        """Processes started under this runtime (not those its host process had before it)."""
        try:
            children = self._me.children(recursive=True)
        except psutil.Error:
            return []
        return [p for p in children if self._key(p) not in self._baseline]

    def _record(self) -> None:
        entries = []
        for proc in self.descendants():
            with contextlib.suppress(psutil.Error):
                entries.append({"pid": proc.pid, "create_time": proc.create_time(), "name": proc.name()})
        write_json_atomic(self.table_path, {"runtime_pid": os.getpid(), "processes": entries})

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            with contextlib.suppress(OSError):
                self._record()

    def start_watching(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="offline-process-warden", daemon=True)
        self._thread.start()

    def end_descendants(self) -> int:
        procs = self.descendants()
        _end(procs)
        return len(procs)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.end_descendants()
        self.table_path.unlink(missing_ok=True)
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None


def install_signal_handlers() -> None:
    """SIGTERM/SIGHUP end the process through KeyboardInterrupt, so cleanup code runs."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
