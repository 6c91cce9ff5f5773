"""Reach the offline stack's APIs from a command: the running runtime's, or a runtime started for it.

While ``d2ops demo`` or ``d2ops run`` holds the work dir, ``d2ops status`` and ``d2ops graph``
read that runtime's status API and Step Functions endpoint (published in
``<work dir>/runtime.json``); otherwise they start a runtime on the work dir just long enough
to answer from the recorded runs. Requests are SigV4-signed with that runtime's own credentials
(from ``runtime.json``, or the in-process runtime's), as its status API and gateway require.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import psutil
from botocore.credentials import Credentials

from d2ops.offline.runtime import RUNTIME_INFO, OfflineRuntime, offline_credentials
from d2ops.offline.stack import REGION, load_stack
from d2ops.sigv4 import SignedStatusApi, StatusApiError

__all__ = ["OfflineApis", "RunningRuntime", "StatusApiError", "connect", "offline_status_api", "running_runtime",
           "session_for"]


def offline_status_api(url: str, credentials: Credentials | None = None) -> SignedStatusApi:
    """A client for an offline status API at ``url``, signing as ``credentials`` (default: the in-process
    runtime's)."""
    return SignedStatusApi(url, credentials or offline_credentials(), REGION)


@dataclass
class OfflineApis:
    status_api: str
    sfn: Any
    state_machine_arn: str
    # the runtime's: its status API and gateway answer only these (default: the in-process runtime's)
    credentials: Credentials = field(default_factory=offline_credentials)

    def get(self, path: str) -> Any:
        return offline_status_api(self.status_api, self.credentials).get(path)

    def call(self, method: str, path: str, document: Any = None) -> Any:
        """A JSON request to the status API (``POST /runs/{runId}/decision``), as SignedStatusApi.call."""
        return offline_status_api(self.status_api, self.credentials).call(method, path, document)

    def session(self) -> Any:
        """A boto3 session signing as the runtime's identity."""
        return session_for(self.credentials)


def session_for(credentials: Credentials) -> Any:
    """A boto3 session with ``credentials``, in the offline stack's region."""
    return boto3.session.Session(aws_access_key_id=credentials.access_key, aws_secret_access_key=credentials.secret_key,
                                 aws_session_token=credentials.token, region_name=REGION)


def _credentials(info: dict[str, Any]) -> Credentials | None:
    values = info.get("credentials")
    if not isinstance(values, dict) or not all(isinstance(values.get(k), str) for k in
                                               ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")):
        return None
    return Credentials(values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"], values["AWS_SESSION_TOKEN"])


def _running(work_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((work_dir / RUNTIME_INFO).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int) or pid == os.getpid() or not psutil.pid_exists(pid) or _credentials(info) is None:
        return None
    return info


@dataclass(frozen=True)
class RunningRuntime:
    """Where the runtime another process holds a work dir with listens, and its stack parameters."""

    moto: str
    gateway: str
    parameters: dict[str, str]
    credentials: Credentials  # the runtime's own (its gateway and status API answer only these)
    status_api: str = ""  # its status API's base URL (d2ops approve / reject post decisions there)

    def session(self) -> Any:
        """A boto3 session signing as the runtime's identity."""
        return session_for(self.credentials)


def running_runtime(work_dir: Path) -> RunningRuntime | None:
    """The runtime another process holds ``work_dir`` with (`d2ops demo`, `d2ops run`), or None."""
    info = _running(work_dir.resolve())
    if info is None or not isinstance(info.get("moto"), str) or not isinstance(info.get("gateway"), str):
        return None
    parameters = info.get("parameters")
    credentials = _credentials(info)
    assert credentials is not None  # _running() said so
    return RunningRuntime(moto=info["moto"], gateway=info["gateway"],
                          parameters={str(k): str(v) for k, v in parameters.items()}
                          if isinstance(parameters, dict) else {}, credentials=credentials,
                          status_api=str(info.get("status_api") or ""))


@contextlib.contextmanager
def connect(work_dir: Path) -> Iterator[OfflineApis]:
    stack = load_stack()
    info = _running(work_dir.resolve())
    if info is not None:
        credentials = _credentials(info)
        assert credentials is not None  # _running() said so
        yield OfflineApis(status_api=info["status_api"],
                          sfn=session_for(credentials).client("stepfunctions", endpoint_url=info["gateway"]),
                          state_machine_arn=stack.state_machine_arn, credentials=credentials)
        return
    with OfflineRuntime(work_dir) as rt:
        yield OfflineApis(status_api=rt.status_api.url, sfn=rt.client("stepfunctions"),
                          state_machine_arn=rt.stack.state_machine_arn, credentials=rt.credentials)
