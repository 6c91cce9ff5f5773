"""``GET /endpoints/{endpointName}/monitoring``: the monitor's windows of an endpoint, newest first.

The monitor (functions/monitor_endpoint) writes one :class:`MonitoringWindow` per window of capture at
``monitoring/<endpoint>/windows/<YYYY-MM-DDTHH:MMZ>.json``, so the keys sort by time. S3 lists keys in
ascending order only; the newest ``limit`` of a year of hourly windows (8,760 keys) is found without listing
them all: the listing starts after ``to - span`` (``StartAfter``) and stops at the first key past ``to``. The
first span is ``limit`` hours and a little (the monitor's default window is an hour: one listing then); while
it holds fewer than ``limit`` windows it grows by what the windows found suggest (2-8x), until it reaches back
past the oldest window (or ``from``). Only the windows answered are read (GetObject), in parallel.

A window that is not a MonitoringWindow (truncated, written by hand, another endpoint's) is a ``problems``
entry naming its key, never a 5xx: one bad object must not hide the others.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from d2ops_core import s3_layout
from d2ops_core.documents.monitoring import MonitoringWindow
from d2ops_core.failures import one_line
from status_api import response_budget
from status_api.models import MonitoringView, WindowProblem
from status_api.service import BadRequest, is_throttling
from status_api.views import ReportUnreadable, _access_denied

DEFAULT_LIMIT = 48  # two days of hourly windows
MAX_LIMIT = 500
WINDOW_GUESS = timedelta(hours=1)  # the monitor's default window: the first listing reaches back limit + 2 of them
SPAN_GROWTH = 8  # at most, a round (no window found in the span: the monitor ran rarely, or stopped a while)
MAX_SPAN = timedelta(days=100 * 366)  # a key that sorts before every time (not the monitor's) ends the search
# A window is a few kilobytes (one verdict per statistic, at most 20 problem lines); an object far larger is
# not one, and is not read whole into the function's memory.
MAX_WINDOW_BYTES = 1024 * 1024
READERS = 16  # parallel GetObjects: 500 windows one after another would take most of the 29 s timeout


def windows_prefix(endpoint: str) -> str:
    """``monitoring/<endpoint>/windows/``: the keys of s3_layout.monitoring_window_key, less the start."""
    return s3_layout.monitoring_window_key(endpoint, "").removesuffix(".json")


def stem(moment: datetime) -> str:
    """A time as a window key's start (to the minute, UTC; a naive time is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:  # an offset past either end of the calendar: that end
        moment = datetime.min if moment.year == 1 else datetime.max
    # written out, not strftime: %Y is not zero-padded below year 1000 on every platform, and keys sort as text
    return f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:{moment.minute:02d}Z"


def _list(s3: Any, bucket: str, prefix: str, start_after: str | None, upper: str | None,
          max_keys: int | None = None) -> list[str]:
    """Keys under ``prefix`` after ``start_after`` whose start is at most ``upper``, oldest first."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    if start_after:
        kwargs["StartAfter"] = start_after
    if max_keys:
        kwargs["PaginationConfig"] = {"MaxItems": max_keys, "PageSize": max_keys}
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(**kwargs):
        for item in page.get("Contents", []):
            key = item["Key"]
            if upper is not None and key[len(prefix):].removesuffix(".json") > upper:
                return keys  # keys sort by time: every later key is later still
            keys.append(key)
    return keys


def window_keys(s3: Any, bucket: str, endpoint: str, limit: int, start: datetime | None = None,
                end: datetime | None = None, now: datetime | None = None) -> tuple[list[str], bool]:
    """The keys of the newest ``limit`` windows starting in [start, end], newest first, and whether older ones
    (in the range) exist."""
    prefix = windows_prefix(endpoint)
    lower = prefix + stem(start) if start else None  # StartAfter of "<stem>" keeps "<stem>.json"
    upper = stem(end) if end else None
    oldest = _list(s3, bucket, prefix, lower, None, max_keys=1)
    if not oldest or (upper is not None and oldest[0][len(prefix):].removesuffix(".json") > upper):
        return [], False
    anchor = end or now or datetime.now(UTC)
    span = WINDOW_GUESS * (limit + 2)
    while True:
        try:
            after = prefix + stem(anchor - span)
        except OverflowError:  # before year 1: before any window
            after = prefix
        final = after < oldest[0] or (lower is not None and after <= lower) or span >= MAX_SPAN
        keys = _list(s3, bucket, prefix, lower if final else after, upper)
        if len(keys) > limit or final:
            return keys[-limit:][::-1], len(keys) > limit
        # as far again as the windows found suggest the rest lie, and half that again
        span *= min(SPAN_GROWTH, max(2.0, 1.5 * (limit + 1) / len(keys))) if keys else SPAN_GROWTH


def _read(s3: Any, bucket: str, endpoint: str, key: str) -> MonitoringWindow | WindowProblem:
    where = f"s3://{bucket}/{key}"
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_WINDOW_BYTES + 1)
    except s3.exceptions.NoSuchKey:
        return WindowProblem(key=where, message="gone between the listing and the read (deleted by a lifecycle rule?)")
    if len(body) > MAX_WINDOW_BYTES:
        return WindowProblem(key=where, message=f"larger than {MAX_WINDOW_BYTES} bytes: not a monitoring window")
    try:
        window = MonitoringWindow.model_validate_json(body)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in problem["loc"]) or "document"
        return WindowProblem(key=where, message=one_line(f"not a monitoring window ({field}: {problem['msg']})"))
    if window.endpoint != endpoint:
        return WindowProblem(key=where, message=f"a window of endpoint {window.endpoint!r}, not {endpoint!r}")
    return window


def monitoring_view(s3: Any, bucket: str, endpoint: str, limit: int = DEFAULT_LIMIT, start: datetime | None = None,
                    end: datetime | None = None, now: datetime | None = None,
                    budget: int = response_budget.RESPONSE_BUDGET) -> MonitoringView:
    """The answer: windows newest first, a problem per unreadable one; windows left out (oldest first) when the
    answer would pass Lambda's response limit (``truncated``)."""
    if start and end and stem(start) > stem(end):
        raise BadRequest(f"from ({start.isoformat()}) is after to ({end.isoformat()})")
    try:
        keys, older = window_keys(s3, bucket, endpoint, limit, start, end, now)
        with ThreadPoolExecutor(max_workers=min(READERS, max(1, len(keys)))) as pool:
            found = list(pool.map(lambda key: _read(s3, bucket, endpoint, key), keys))
    except s3.exceptions.ClientError as exc:
        if _access_denied(exc) and not is_throttling(exc):
            raise ReportUnreadable(f"endpoint {endpoint!r}'s monitoring windows cannot be read: S3 refused the "
                                   "status API access (AccessDenied)") from exc
        raise
    view = MonitoringView(endpoint=endpoint, windows=[], problems=[w for w in found if isinstance(w, WindowProblem)],
                          older_windows=older)
    size = response_budget.encoded_size(view.model_dump(mode="json"))
    for window in (w for w in found if isinstance(w, MonitoringWindow)):
        size += response_budget.encoded_size(window.model_dump(mode="json")) + 1  # and its comma
        if size > budget:
            view.truncated = view.older_windows = True
            break
        view.windows.append(window)
    return view
