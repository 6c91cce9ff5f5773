"""``GET /endpoints/{endpointName}/monitoring`` through the real Powertools resolver against a moto server
(real HTTP, so the parallel reads are real requests): newest first within limit and from/to, corrupt windows
as problems (never a 5xx), the listing reaching back only as far as it must, an answer kept under Lambda's
limit. Signing (API Gateway's IAM auth) is checked against the offline status API server in
tests/integration/test_monitoring_views.py."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.monitoring_windows import hour, key, put, window
from tests.fixtures.moto_server import moto_server
from tests.fixtures.pipeline import support

support.function_path("status_api")
from status_api import handler as api  # noqa: E402
from status_api import monitoring  # noqa: E402
from status_api.models import MonitoringView  # noqa: E402

ENDPOINT = support.ENDPOINT_NAME


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3(server: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    """A bucket of its own for the test, in the moto server the handler's clients reach."""
    support.aws_env(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server)
    bucket = f"artifacts-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("ARTIFACTS_BUCKET", bucket)
    client = boto3.client("s3", endpoint_url=server)
    client.create_bucket(Bucket=bucket)
    return client, bucket


def get(query: dict[str, str] | None = None, endpoint: str = ENDPOINT) -> tuple[int, Any]:
    event = copy.deepcopy(support.load_event("status_api", "get_endpoint_monitoring"))
    path = f"/endpoints/{endpoint}/monitoring"
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["pathParameters"] = {"endpointName": endpoint}
    event["queryStringParameters"] = query or None
    event["rawQueryString"] = "&".join(f"{k}={quote(v, safe='')}" for k, v in (query or {}).items())
    response = api.handler(event, support.FakeLambdaContext())
    return response["statusCode"], json.loads(response["body"])


def test_an_endpoint_without_windows_answers_an_empty_list(s3: tuple[Any, str]) -> None:
    # catches: a missing prefix answered as a 404 or 5xx (the monitor has not run yet is no error)
    assert get() == (200, {"endpoint": ENDPOINT, "windows": [], "problems": [], "older_windows": False,
                           "truncated": False})


def test_the_stack_s_own_endpoint_answers_without_a_name(s3: tuple[Any, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # catches: GET /endpoint/monitoring reading another endpoint's windows than ENDPOINT_NAME's, or not routed
    client, bucket = s3
    start = hour(0)
    put(client, bucket, window(ENDPOINT, start))
    put(client, bucket, window("another-endpoint", start))
    monkeypatch.setenv("ENDPOINT_NAME", ENDPOINT)
    event = copy.deepcopy(support.load_event("status_api", "get_endpoint_monitoring"))
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/endpoint/monitoring"
    event["pathParameters"] = None
    event["queryStringParameters"] = {"limit": "5"}
    event["rawQueryString"] = "limit=5"
    response = api.handler(event, support.FakeLambdaContext())
    body = json.loads(response["body"])
    assert response["statusCode"] == 200 and body["endpoint"] == ENDPOINT
    assert [w["endpoint"] for w in body["windows"]] == [ENDPOINT]


def test_windows_come_newest_first_within_limit_and_range(s3: tuple[Any, str]) -> None:
    client, bucket = s3
    starts = [hour(-h) for h in range(1, 8)]
    for i, start in enumerate(starts):
        put(client, bucket, window(ENDPOINT, start, drifted=("brightness",) if i == 0 else ()))
    put(client, bucket, window("another-endpoint", starts[0]))  # another endpoint's prefix: never listed
    status, body = get({"limit": "3"})
    assert status == 200, body
    MonitoringView.model_validate(body)
    # catches: oldest-first order (S3's own), a limit not applied, another endpoint's windows mixed in
    assert [datetime.fromisoformat(w["window_start"]) for w in body["windows"]] == starts[:3]
    assert body["older_windows"] is True and body["problems"] == []
    assert body["windows"][0]["verdict"] == "drifted" and body["windows"][0]["statistics"][0]["drifted"] is True
    # from/to bound the start times, both ends inclusive (catches an off-by-one at either end)
    status, body = get({"from": starts[5].isoformat(), "to": starts[2].strftime("%Y-%m-%dT%H:%M:%S")})
    assert status == 200, body
    assert [datetime.fromisoformat(w["window_start"]) for w in body["windows"]] == starts[2:6]
    assert body["older_windows"] is False
    status, body = get({"limit": "500"})
    assert (status, len(body["windows"]), body["older_windows"]) == (200, 7, False)


@pytest.mark.parametrize("query", [{"limit": "0"}, {"limit": "501"}, {"limit": "x"}, {"from": "yesterday"},
                                   {"from": "2026-11-02T00:00:00Z", "to": "2026-11-01T00:00:00Z"}])
def test_a_bad_limit_or_range_is_a_400_naming_it(s3: tuple[Any, str], query: dict[str, str]) -> None:
    # catches: limits unbounded (a 10,000-window answer), Powertools' 422, a reversed range answered empty
    status, body = get(query)
    assert status == 400 and set(body) == {"statusCode", "message"}, body
    assert ("limit" in body["message"] if "limit" in query else ("from" in body["message"])), body


def test_an_endpoint_name_sagemaker_refuses_is_a_404(s3: tuple[Any, str]) -> None:
    status, body = get(endpoint="-not-a-name-")
    assert status == 404 and "endpoint" in body["message"], body


def test_corrupt_windows_are_problems_naming_their_key_and_the_rest_still_answers(s3: tuple[Any, str]) -> None:
    client, bucket = s3
    good = window(ENDPOINT, hour(-1))
    put(client, bucket, good)
    bad = {"not json": (hour(-2), b"{\"endpoint\": \"" + ENDPOINT.encode() + b"\", \"records\": 4"),
           "wrong field": (hour(-3), json.dumps({**json.loads(window(ENDPOINT, hour(-3)).model_dump_json()),
                                                 "verdict": "fine"}).encode()),
           "another endpoint's": (hour(-4), window("elsewhere", hour(-4)).model_dump_json().encode())}
    keys = {}
    for name, (start, body) in bad.items():
        keys[name] = key(window(ENDPOINT, start))
        client.put_object(Bucket=bucket, Key=keys[name], Body=body)
    status, answer = get()
    # catches: a ValidationError escaping as a 500, one bad object hiding the good one
    assert status == 200, answer
    assert [w["window_start"] for w in answer["windows"]] == [good.model_dump(mode="json")["window_start"]]
    problems = {p["key"]: p["message"] for p in answer["problems"]}
    assert set(problems) == {f"s3://{bucket}/{k}" for k in keys.values()}
    assert "verdict" in problems[f"s3://{bucket}/{keys['wrong field']}"]
    assert "'elsewhere'" in problems[f"s3://{bucket}/{keys['another endpoint' + chr(39) + 's']}"]
    assert all("\n" not in m for m in problems.values())


def record_s3_calls(client: Any) -> dict[str, int]:
    """Counts of the S3 requests ``client`` makes and the keys its listings return."""
    counts = {"ListObjectsV2": 0, "GetObject": 0, "listed": 0}

    def after(http_response: Any, parsed: dict[str, Any], model: Any, **kwargs: Any) -> None:
        counts[model.name] = counts.get(model.name, 0) + 1
        counts["listed"] += len(parsed.get("Contents", [])) if model.name == "ListObjectsV2" else 0

    client.meta.events.register("after-call.s3.*", after)
    return counts


def test_the_newest_windows_are_found_without_listing_or_reading_the_years_before(s3: tuple[Any, str]) -> None:
    """200 hourly windows, and one from 400 days ago: the newest 5 list a few keys more than 5 and read 5
    objects; asking for all of them reaches back to the old one (the span grows until it passes the oldest)."""
    client, bucket = s3
    now = datetime.now(UTC)
    starts = [hour(-h, now) for h in range(1, 201)] + [hour(-400 * 24, now)]
    for start in starts:
        client.put_object(Bucket=bucket, Key=key(window(ENDPOINT, start)),
                          Body=window(ENDPOINT, start).model_dump_json().encode())
    reader = boto3.client("s3", endpoint_url=client.meta.endpoint_url)
    counts = record_s3_calls(reader)
    view = monitoring.monitoring_view(reader, bucket, ENDPOINT, limit=5, now=now)
    assert [w.window_start for w in view.windows] == starts[:5] and view.older_windows
    # catches: listing the whole prefix (201 keys) or reading every window before cutting to the limit
    assert counts["GetObject"] == 5 and counts["listed"] <= 1 + 5 + 3, counts
    counts.update(ListObjectsV2=0, GetObject=0, listed=0)
    view = monitoring.monitoring_view(reader, bucket, ENDPOINT, limit=500, now=now)
    assert [w.window_start for w in view.windows] == starts and not view.older_windows
    assert counts["GetObject"] == 201
    # windows every 6 hours (a rarer schedule): the span grows with what it finds, a few rounds, not a full listing
    sparse = [hour(-6 * i, now) - timedelta(days=500) for i in range(1, 41)]
    for start in sparse:
        put(client, bucket, window("sparse", start))
    counts.update(ListObjectsV2=0, GetObject=0, listed=0)
    view = monitoring.monitoring_view(reader, bucket, "sparse", limit=30, now=now)
    assert [w.window_start for w in view.windows] == sparse[:30] and view.older_windows
    assert counts["ListObjectsV2"] <= 12 and counts["listed"] <= 1 + 3 * 41, counts


def test_an_answer_that_would_pass_lambda_s_limit_leaves_out_the_oldest_windows(s3: tuple[Any, str]) -> None:
    client, bucket = s3
    starts = [hour(-h) for h in range(1, 6)]
    for start in starts:
        put(client, bucket, window(ENDPOINT, start))
    one = len(json.dumps(json.dumps(window(ENDPOINT, starts[0]).model_dump(mode="json"))))
    view = monitoring.monitoring_view(client, bucket, ENDPOINT, limit=5, budget=one * 3 + 400)
    # catches: a 6 MB+ answer API Gateway turns into a 502 (500 windows of a model with many classes)
    assert view.truncated and view.older_windows
    assert [w.window_start for w in view.windows] == starts[:len(view.windows)] and 1 <= len(view.windows) < 5


def test_a_window_s_start_is_its_key_so_the_keys_sort_by_time() -> None:
    # the listing's upper bound compares key stems as text: they must be the fixed-width UTC minute
    start = datetime(2026, 3, 4, 5, 6, tzinfo=UTC)
    assert key(window(ENDPOINT, start)).endswith("/windows/" + monitoring.stem(start) + ".json")
    assert monitoring.stem(start.astimezone(UTC).replace(tzinfo=None)) == monitoring.stem(start)
    assert monitoring.stem(start + timedelta(hours=2)) > monitoring.stem(start + timedelta(minutes=59))
    assert monitoring.stem(datetime(999, 1, 1, tzinfo=UTC)) == "0999-01-01T00:00Z" < monitoring.stem(start)


TIMES = st.one_of(st.datetimes(timezones=st.just(UTC)).map(lambda t: t.isoformat()),
                  st.sampled_from(["0001-01-01T00:00:00", "9999-12-31T23:59:59Z", "9999-12-31T23:00:00-05:00",
                                   "0001-01-01T00:00:00+05:00", "2026-11-29", "", "now"]),
                  st.text(max_size=40))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.fixed_dictionaries({}, optional={"limit": st.one_of(st.integers(-5, 600).map(str), st.text(max_size=5)),
                                                 "from": TIMES, "to": TIMES}))
def test_no_query_makes_a_5xx(s3: tuple[Any, str], query: dict[str, str]) -> None:
    """Times at the ends of the calendar (the listing's span reaching before year 1), empty and malformed values:
    a 200 or a one-line 400, never a 5xx. catches: an OverflowError of the span arithmetic escaping as a 500."""
    client, bucket = s3
    if not client.list_objects_v2(Bucket=bucket).get("KeyCount"):
        put(client, bucket, window(ENDPOINT, hour(-1)))
    status, body = get(query)  # API Gateway hands the handler decoded values
    assert status in (200, 400), body
    if status == 200:
        MonitoringView.model_validate(body)
    else:
        assert set(body) == {"statusCode", "message"} and "\n" not in body["message"]
