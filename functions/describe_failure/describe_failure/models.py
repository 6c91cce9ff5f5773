"""The state document of a failed run, as the "Describe failure" state passes it (``$``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class CaughtError(BaseModel):
    """What a Catch put at ``$.error``: the error name and its raw Cause."""

    model_config = ConfigDict(extra="allow")

    Error: str = Field(max_length=256)
    Cause: str | None = None


class FailureRecord(BaseModel):
    """``$.failure`` as a "Record … failure" state built it (one-line summary in ``cause``)."""

    model_config = ConfigDict(extra="allow")

    error: str
    cause: str


class FailedRunDocument(BaseModel):
    """The whole state document; everything but ``failure.cause`` passes through unchanged."""

    model_config = ConfigDict(extra="allow")

    failure: FailureRecord
    error: CaughtError | None = None

    def described(self, cause: str) -> dict[str, Any]:
        document = self.model_dump(mode="json", exclude_none=False)
        document["failure"]["cause"] = cause
        return document
