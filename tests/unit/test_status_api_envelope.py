"""Hostile events at the status API's door: each was a 500 (an exception out of the resolver) and is
now a 400 naming the problem. No AWS call is made for any of them, so no moto is needed."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from tests.fixtures.pipeline import support

support.function_path("status_api")
from status_api import handler as api  # noqa: E402
from status_api.envelope import BadEnvelope, check_event  # noqa: E402

POST = support.load_event("status_api", "start_run")
GET = support.load_event("status_api", "list_runs")
REST_V1 = {"resource": "/runs", "path": "/runs", "httpMethod": "GET", "headers": {}, "queryStringParameters": None,
           "requestContext": {"httpMethod": "GET", "path": "/runs", "stage": "prod"}, "body": None}


def post(body: str, *, b64: bool = False) -> dict[str, Any]:
    event = copy.deepcopy(POST)
    event["body"], event["isBase64Encoded"] = body, b64
    return event


@pytest.mark.parametrize(("event", "message"), [
    (post("[" * 20_000 + "]" * 20_000), "nest too deeply"),  # RecursionError in json.loads (within MAX_BODY_CHARS)
    (post('{"dataset_uri": ' + "9" * 5000 + "}"), "more digits"),  # ValueError: int digit limit
    (post(base64.b64encode(b'{"dataset_uri": "\xff"}').decode(), b64=True), "not UTF-8 text: byte 17 is 0xff"),
    (post("!!not base64!!", b64=True), "not valid base64"),
    (post('{"dataset_uri": "s3://x/datasets/a/b/",}'), "line 1, column 40"),
    (REST_V1, "REST API (payload format 1.0)"),
    ({}, "not an API Gateway event"),
    ({"requestContext": {"http": {}}, "rawPath": "/runs"}, "payload format 2.0"),
], ids=["deep", "huge-int", "b64-not-utf8", "bad-b64", "trailing-comma", "rest-v1", "empty", "no-method"])
def test_an_event_the_resolver_would_raise_on_is_a_400_naming_the_problem(event: Any, message: str) -> None:
    response = api.handler(event, support.FakeLambdaContext())
    assert response["statusCode"] == 400
    assert response["headers"]["Content-Type"] == "application/json"
    body = json.loads(response["body"])
    assert message in body["message"] and "\n" not in body["message"]


def test_the_body_is_parsed_once_by_the_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    # The door decodes the text but builds no object; the route's parse goes through envelope.json_body.
    body = json.dumps({"dataset_uri": "not an s3 uri"})
    parses: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: (parses.append(text) if text == body else None,
                                                              loads(text, *a, **k))[1])
    check_event(post("[" * 20_000))  # the door never parses: a deep body passes it
    response = api.handler(post(body), support.FakeLambdaContext())
    assert response["statusCode"] == 400 and "dataset_uri" in json.loads(response["body"])["message"]
    assert parses == [body]


def test_well_formed_events_pass_the_door() -> None:
    check_event(GET)
    check_event(POST)
    check_event(post(base64.b64encode(json.dumps({"dataset_uri": "s3://b/datasets/é/v1/"}).encode()).decode(),
                     b64=True))
    # a GET route never reads a body, so a garbage one is not refused here
    check_event({**copy.deepcopy(GET), "body": "[" * 5000})
    with pytest.raises(BadEnvelope):
        check_event(["not", "an", "object"])
