"""The champion: the model currently serving, recorded as ``champion.json`` in the artifacts bucket.

The state machine's "Promote to champion" step writes this object after a deployment
passed its smoke test (the record is assembled by the "Record champion" state of
``statemachine/training_pipeline.asl.json``; the path tests parse it with
:class:`ChampionRecord`). The prepare Lambda reads it to evaluate the challenger against the
champion, the status API reads it for ``GET /models``. An S3 object in the versioned
artifacts bucket is the simplest record all three can read, online and offline, and its
version history is the history of promotions.

Standard library and pydantic only: Lambdas import this through the CoreLayer.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from d2ops.runs import DatasetRef, key_listed

CHAMPION_KEY = "champion.json"


class GateDecision(BaseModel):
    decision: str  # approved | rejected
    approval_status: str  # the Model Registry status: Approved | Rejected
    reason: str


class ChampionRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run_id: str
    dataset: DatasetRef
    model_package_arn: str
    model_name: str
    model_data: str  # s3://.../model.tar.gz, the evaluation job's champion input
    endpoint_name: str
    endpoint_config_name: str
    primary_metric: str
    primary_value: float
    evaluation_uri: str
    gate: GateDecision
    promoted_at: str


class _S3Client(Protocol):
    exceptions: Any

    def get_object(self, **kwargs: Any) -> Any: ...

    def list_objects_v2(self, **kwargs: Any) -> Any: ...


def read_champion(s3: _S3Client, bucket: str) -> ChampionRecord | None:
    """The current champion, or None before the first promotion.

    Existence is asked by listing (:func:`d2ops.runs.key_listed`): readers may list only
    ``champion.json``, and a GET of the missing record could answer 403 rather than 404.
    """
    if not key_listed(s3, bucket, CHAMPION_KEY):
        return None
    try:
        body = s3.get_object(Bucket=bucket, Key=CHAMPION_KEY)["Body"].read()
    except s3.exceptions.NoSuchKey:  # removed between the listing and the read
        return None
    return ChampionRecord.model_validate_json(body)
