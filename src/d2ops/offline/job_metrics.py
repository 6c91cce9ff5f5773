"""A local training job's metrics, as SageMaker publishes them: its log through its MetricDefinitions.

SageMaker applies a training job's MetricDefinitions regexes to its log as it runs and publishes
each value found to CloudWatch (``d2ops_core.platform``: namespace, the ``TrainingJobName``
dimension); that is where the status API reads a running job's progress and loss curve. The
offline SageMaker does the same with the local job's log and moto's CloudWatch, so the status API
runs one code path in both places.

:class:`MetricScraper` is the one place the definitions are applied (FinalMetricDataList uses it
too); :class:`MetricPublisher` follows the growing log.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from d2ops.offline.log_progress import LineSplitter
from d2ops_core import platform

log = logging.getLogger(__name__)

PUBLISH_INTERVAL = 1.0  # seconds between reads of the log (SageMaker publishes about once a minute)
MAX_DATA_PER_CALL = 1000  # PutMetricData's limit on MetricData entries
READ_CHUNK = 1 << 20


class MetricScraper:
    """The job's MetricDefinitions applied to one log line, as SageMaker does: group 1 of each regex's first match."""

    def __init__(self, definitions: Iterable[dict[str, Any]]) -> None:
        self.compiled: list[tuple[str, re.Pattern[str]]] = []
        for definition in definitions:
            try:
                self.compiled.append((str(definition["Name"]), re.compile(str(definition["Regex"]))))
            except (KeyError, re.error):
                continue  # CreateTrainingJob validation would have refused it; nothing to scrape

    def scrape(self, line: str) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        for name, regex in self.compiled:
            match = regex.search(line)
            if match:
                with contextlib.suppress(ValueError, IndexError):
                    found.append((name, float(match.group(1))))
        return found


def publishable(value: float) -> bool:
    """What CloudWatch takes: a finite number within its range (a 400-digit loss is no data point)."""
    return math.isfinite(value) and abs(value) <= platform.CLOUDWATCH_MAX_MAGNITUDE


class MetricPublisher:
    """While a job runs: each whole line its log gains, scraped and put to CloudWatch (a thread).

    :meth:`stop` reads what is left (a last line without its newline included) and publishes it, so
    the job's last iteration is in CloudWatch before the job is described as ended. A CloudWatch
    that refuses or cannot be reached costs the job nothing: the failure is logged, the values dropped.
    """

    def __init__(self, cloudwatch: Any, job_name: str, log_path: Path, definitions: Iterable[dict[str, Any]],
                 *, interval: float = PUBLISH_INTERVAL) -> None:
        self.cloudwatch = cloudwatch
        self.job_name = job_name
        self.log_path = log_path
        self.scraper = MetricScraper(definitions)
        self.interval = interval
        self.published = 0  # data points put
        self._splitter = LineSplitter()
        self._log: BinaryIO | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"metrics-{job_name}", daemon=True)

    def start(self) -> MetricPublisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._publish(self._read() + self._splitter.flush())
        if self._log is not None:
            self._log.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._publish(self._read())

    def _read(self) -> list[str]:
        if self._log is None:
            try:
                self._log = self.log_path.open("rb")
            except OSError:  # not written yet (the job is still downloading its channels)
                return []
        lines: list[str] = []
        while chunk := self._log.read(READ_CHUNK):
            lines += self._splitter.feed(chunk)
        return lines

    def _publish(self, lines: list[str]) -> None:
        now = datetime.now(UTC)
        data = [{"MetricName": name, "Value": value, "Timestamp": now,
                 "Dimensions": [{"Name": platform.TRAINING_METRICS_DIMENSION, "Value": self.job_name}]}
                for line in lines for name, value in self.scraper.scrape(line) if publishable(value)]
        for start in range(0, len(data), MAX_DATA_PER_CALL):
            batch = data[start:start + MAX_DATA_PER_CALL]
            try:
                self.cloudwatch.put_metric_data(Namespace=platform.TRAINING_METRICS_NAMESPACE, MetricData=batch)
            except Exception as exc:  # botocore's errors and a moto that has stopped alike
                log.warning("training job %s: %d metric values not published: %s", self.job_name, len(batch), exc)
                continue
            self.published += len(batch)
