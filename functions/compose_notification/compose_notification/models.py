"""What the "Compose … notification" states pass in (the run's state document) and get back."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from d2ops_core.bounded_text import MAX_SNS_SUBJECT
from d2ops_core.cost import RunCost
from d2ops_core.documents.run_state import RunState

# SNS Publish's Subject: ASCII, one line, fewer than 100 characters (d2ops_core.bounded_text.sns_subject).
MAX_SUBJECT = MAX_SNS_SUBJECT


class NotificationEvent(BaseModel):
    outcome: Literal["succeeded", "failed"]
    run_id: str = Field(min_length=1, max_length=80)
    at: datetime = Field(description="when the notification is composed ($$.State.EnteredTime): the endpoint "
                                     "time so far ends here")
    document: RunState = Field(description="the run's $ (d2ops_core.documents.run_state), read section by section")

    @field_validator("document", mode="before")
    @classmethod
    def _by_section(cls, value: Any) -> RunState:
        # A malformed section is left out (and said in the cost's reasons), never the notification lost.
        return RunState.read(value)


class NotificationFields(BaseModel):
    """Merged into the notification's JSON message, beside the failure or champion record."""

    cost: RunCost | None = Field(description="the run's SageMaker cost (d2ops_core.cost); None when unknown")
    cost_summary: str = Field(description="one line for people: the total and its parts, or why it is unknown")
    cost_unknown: str | None = Field(None, description="why the cost (or part of it) could not be computed")
    # When the gate refuses, the first question is what changed in the data: the diff's line and document.
    data_changes: str | None = Field(None, description="what changed in the data since the champion (gate refusals "
                                                       "only): the run's dataset diff in one line")
    dataset_diff_uri: str | None = Field(None, description="the full diff (runs/<run id>/dataset-diff.json)")
    gate_comparison: str | None = Field(
        None, description="the interval of challenger - champion the gate judged, in one line, with how many more "
                          "val images would narrow it to the tolerance when it is wider (None: no champion compared)")
    review: str | None = Field(
        None, description="when the gate asked a person: who decided, when and why ('approved by <ARN> at <time>: "
                          "<reason>'), or that nobody did in time (None: the gate's numbers decided)")


class Notification(BaseModel):
    subject: str = Field(max_length=MAX_SUBJECT, pattern=r"^[\x20-\x7e]+$")
    fields: NotificationFields

    def payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
