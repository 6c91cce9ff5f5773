"""Execution records on disk, so ``d2ops status`` can answer after the runtime stopped.

One JSON file per execution under ``<work dir>/executions/``, rewritten atomically (temp
file + ``os.replace``) whenever the execution records an event, so a killed process leaves
either the previous or the new record, never half a file. Timestamps are ISO 8601 strings
on disk and timezone-aware datetimes in memory (what boto3 returns).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from d2ops.asl.interpreter import describe_response


class ExecutionRecord(BaseModel):
    """DescribeExecution plus the history: everything the local Step Functions API serves."""

    model_config = ConfigDict(extra="forbid")

    execution_arn: str
    state_machine_arn: str
    name: str
    status: str
    start_date: datetime
    stop_date: datetime | None = None
    input: str
    output: str | None = None
    error: str | None = None
    cause: str | None = None
    history: list[dict[str, Any]]

    def describe(self) -> dict[str, Any]:
        return describe_response(arn=self.execution_arn, state_machine_arn=self.state_machine_arn, name=self.name,
                                 status=self.status, start_date=self.start_date, input=self.input,
                                 stop_date=self.stop_date, output=self.output, error=self.error, cause=self.cause)

    def list_item(self) -> dict[str, Any]:
        item: dict[str, Any] = {"executionArn": self.execution_arn, "stateMachineArn": self.state_machine_arn,
                                "name": self.name, "status": self.status, "startDate": self.start_date}
        if self.stop_date is not None:
            item["stopDate"] = self.stop_date
        return item


# Records on disk are JSON; datetimes (boto3's and the emulators' timestamps) travel as {"$datetime": iso}, and
# come back as datetimes. Every offline record store writes and reads them with these two.
def encode_datetimes(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dict):
        return {k: encode_datetimes(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode_datetimes(v) for v in value]
    return value


def decode_datetimes(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$datetime"}:
            return datetime.fromisoformat(value["$datetime"])
        return {k: decode_datetimes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_datetimes(v) for v in value]
    return value


def write_json_atomic(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(document, out, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ExecutionStore:
    """Reads and writes `ExecutionRecord`s in one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.json"  # execution names never contain a path separator

    def save(self, record: ExecutionRecord) -> None:
        document = encode_datetimes(record.model_dump())
        write_json_atomic(self._path(record.name), document)

    def load_all(self) -> tuple[list[ExecutionRecord], list[str]]:
        """Every readable record, and a message for each file that could not be read."""
        records: list[ExecutionRecord] = []
        problems: list[str] = []
        for path in sorted(self.root.glob("*.json")):
            try:
                records.append(ExecutionRecord.model_validate(decode_datetimes(json.loads(path.read_text("utf-8")))))
            except (OSError, ValueError) as exc:
                problems.append(f"{path}: unreadable execution record ({exc.__class__.__name__}); moved aside")
                path.replace(path.with_suffix(".corrupt"))
        for leftover in self.root.glob(".*.tmp"):  # a write interrupted by a kill
            leftover.unlink(missing_ok=True)
        return records, problems
