"""Input of the S3 trigger: EventBridge "Object Created" events for the data bucket."""

from __future__ import annotations

from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from pydantic import BaseModel

from d2ops_core.run_start import StartedRun

ObjectCreatedEvent = S3EventNotificationEventBridgeModel


class TriggerResult(BaseModel):
    """What the trigger did: started a run, found it already started, or ignored the object."""

    action: str  # started | already-started | ignored
    key: str
    run_id: str | None = None
    execution_arn: str | None = None
    reason: str | None = None

    @classmethod
    def from_run(cls, key: str, run: StartedRun) -> TriggerResult:
        return cls(action="already-started" if run.already_started else "started", key=key,
                   run_id=run.run_id, execution_arn=run.execution_arn)
