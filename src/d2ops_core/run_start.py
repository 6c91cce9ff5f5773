"""Starting a run: which dataset upload it belongs to, the execution input, and the one start.

The S3 trigger (``functions/start_pipeline``) and the status API's ``POST /runs``
(``functions/status_api``) both start runs through :func:`start_run`, so a run started by
either is the same Step Functions execution: the execution name (the run id,
d2ops_core.run_ids) is derived only from the dataset name, version and the manifest object's
version id (or ETag), and Step Functions refuses a second execution with a used name. A changed
re-upload gets a new version id, hence a new run.

Standard library and pydantic only: Lambdas import this through the CoreLayer.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from d2ops_core.dataset_identity import DatasetRef
from d2ops_core.run_ids import execution_arn, run_id_for
from d2ops_core.s3_layout import dataset_prefix, parse_manifest_key


class Trigger(BaseModel):
    """How a run was started. Deterministic for one upload, so identical inputs repeat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["s3-event", "api"]
    object_key: str
    object_version: str


class StartedRun(BaseModel):
    run_id: str
    execution_arn: str
    already_started: bool


def object_version_token(version_id: str | None, etag: str | None) -> str:
    """The manifest upload's identity: its version id, or its ETag when the bucket is unversioned."""
    if version_id and version_id != "null":
        return version_id
    if etag:
        return etag.strip('"')
    raise ValueError("the manifest object has neither a version id nor an ETag")


def dataset_ref(bucket: str, key: str, version_id: str | None, etag: str | None) -> DatasetRef:
    name, version = parse_manifest_key(key)
    return DatasetRef(bucket=bucket, prefix=dataset_prefix(name, version), name=name, version=version,
                      manifest_key=key, manifest_version=object_version_token(version_id, etag))


def execution_input(dataset: DatasetRef, trigger: Trigger) -> dict[str, Any]:
    return {"dataset": dataset.model_dump(), "trigger": trigger.model_dump()}


def delivery_token() -> str:
    """A token unique to one StartExecution call (see :func:`start_run`)."""
    return uuid.uuid4().hex


class _StepFunctionsClient(Protocol):
    exceptions: Any

    def start_execution(self, **kwargs: Any) -> Any: ...


def start_run(sfn: _StepFunctionsClient, state_machine_arn: str, dataset: DatasetRef,
              trigger: Trigger) -> StartedRun:
    """Start the run for this dataset upload, or report the one already started.

    The run id (execution name) makes the start idempotent: Step Functions never runs two
    executions of one name. It answers a used name with ``ExecutionAlreadyExists``, except
    while the first execution is still running *with identical input*: then it returns that
    execution as if it had just started it, so 100 concurrent duplicate deliveries all said
    "started". Each call therefore carries its own ``delivery`` token: the input of a second
    call never matches the first's, every call but the one that started the run gets
    ``ExecutionAlreadyExists``, and exactly one caller reports ``started``.
    """
    run_id = run_id_for(dataset.name, dataset.version, dataset.manifest_version)
    arn = execution_arn(state_machine_arn, run_id)
    document = {**execution_input(dataset, trigger), "delivery": delivery_token()}
    try:
        response = sfn.start_execution(stateMachineArn=state_machine_arn, name=run_id,
                                       input=json.dumps(document, sort_keys=True))
    except sfn.exceptions.ExecutionAlreadyExists:
        return StartedRun(run_id=run_id, execution_arn=arn, already_started=True)
    return StartedRun(run_id=run_id, execution_arn=response["executionArn"], already_started=False)
