"""The monitor's event (EventBridge Scheduler's input, or a person's / a test's) and what it returns."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.documents.monitoring import WindowVerdict


class MonitorEvent(BaseModel):
    """The schedule sends ``{}``: the last full window. A given ``window_start`` (UTC) asks for that window, so
    a missed hour can be computed afterwards and tests ask for the one they wrote capture into."""

    model_config = ConfigDict(extra="ignore")

    window_start: datetime | None = Field(None, description="the window's start (UTC); default: the last full one")
    window_minutes: int | None = Field(None, ge=1, le=24 * 60, description="default: the WINDOW_MINUTES setting")


class MonitorResult(BaseModel):
    endpoint: str
    window_start: datetime
    verdict: WindowVerdict
    records: int
    drifted: list[str] = Field(description="the statistics that moved")
    window_uri: str
    already_computed: bool = Field(description="the window's document existed: returned as it was, nothing sent")
    notified: bool
