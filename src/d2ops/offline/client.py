"""Reach the offline stack's APIs from a command: the running runtime's, or a runtime started for it.

While ``d2ops demo`` or ``d2ops run`` holds the work dir, ``d2ops status`` and ``d2ops graph``
read that runtime's status API and Step Functions endpoint (published in
``<work dir>/runtime.json``); otherwise they start a runtime on the work dir just long enough
to answer from the recorded runs. Requests are SigV4-signed with the offline credentials, as the
status API's IAM check requires.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psutil

from d2ops.offline.runtime import CREDENTIALS, RUNTIME_INFO, OfflineRuntime, offline_credentials
from d2ops.offline.stack import REGION, load_stack
from d2ops.sigv4 import SignedStatusApi, StatusApiError

__all__ = ["OfflineApis", "RunningRuntime", "StatusApiError", "connect", "offline_status_api", "running_gateway",
           "running_runtime"]


def offline_status_api(url: str) -> SignedStatusApi:
    """A client for an offline status API at ``url``, signing as the offline identity."""
    return SignedStatusApi(url, offline_credentials(), REGION)


@dataclass
class OfflineApis:
    status_api: str
    sfn: Any
    state_machine_arn: str

    def get(self, path: str) -> Any:
        return offline_status_api(self.status_api).get(path)


def _running(work_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((work_dir / RUNTIME_INFO).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int) or pid == os.getpid() or not psutil.pid_exists(pid):
        return None
    return info


@dataclass(frozen=True)
class RunningRuntime:
    """Where the runtime another process holds a work dir with listens, and its stack parameters."""

    moto: str
    gateway: str
    parameters: dict[str, str]


def running_runtime(work_dir: Path) -> RunningRuntime | None:
    """The runtime another process holds ``work_dir`` with (`d2ops demo`, `d2ops run`), or None."""
    info = _running(work_dir.resolve())
    if info is None or not isinstance(info.get("moto"), str) or not isinstance(info.get("gateway"), str):
        return None
    parameters = info.get("parameters")
    return RunningRuntime(moto=info["moto"], gateway=info["gateway"],
                          parameters={str(k): str(v) for k, v in parameters.items()}
                          if isinstance(parameters, dict) else {})


def running_gateway(work_dir: Path) -> str | None:
    """The gateway URL (SageMaker, SageMaker Runtime, Step Functions) of the runtime holding ``work_dir``.

    None when no other process runs one there: the offline endpoint lives only inside its runtime.
    """
    info = _running(work_dir.resolve())
    gateway = None if info is None else info.get("gateway")
    return gateway if isinstance(gateway, str) else None


@contextlib.contextmanager
def connect(work_dir: Path) -> Iterator[OfflineApis]:
    stack = load_stack()
    info = _running(work_dir.resolve())
    if info is not None:
        session: Any = boto3.session.Session(aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                             aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        yield OfflineApis(status_api=info["status_api"],
                          sfn=session.client("stepfunctions", region_name=REGION, endpoint_url=info["gateway"]),
                          state_machine_arn=stack.state_machine_arn)
        return
    with OfflineRuntime(work_dir) as rt:
        yield OfflineApis(status_api=rt.status_api.url, sfn=rt.client("stepfunctions"),
                          state_machine_arn=rt.stack.state_machine_arn)
