"""d2ops_core.capture_files: the one reader of data capture (the monitor and `d2ops label select` use it), on S3
(moto) objects in SageMaker's layout, good and bad."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops_core import s3_layout
from d2ops_core.capture_files import SkippedLine, capture_keys, parse_capture_lines, read_capture_window
from d2ops_core.documents.capture import (
    SMOKE_TEST_INFERENCE_ID,
    CaptureData,
    CaptureRecord,
    EventMetadata,
    encode_payload,
)
from tests.fixtures.pipeline import support

BUCKET = "d2ops-capture-reader"
ENDPOINT = "reader-detector"
T0 = datetime(2026, 5, 6, 10, 0, tzinfo=UTC)


def line(event_id: str, when: datetime) -> str:
    return CaptureRecord(captureData=CaptureData(endpointInput=encode_payload(b"\xffimage", "image/png", "INPUT")),
                         eventMetadata=EventMetadata(eventId=event_id, inferenceTime=when)).model_dump_json()


def put(s3: Any, hour: datetime, lines: list[str], name: str = "00-00-000-f.jsonl", variant: str = "AllTraffic",
        end: str = "\n") -> str:
    key = s3_layout.capture_hour_prefix(ENDPOINT, variant, hour.year, hour.month, hour.day, hour.hour) + name
    s3.put_object(Bucket=BUCKET, Key=key, Body=("\n".join(lines) + end).encode())
    return key


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client


def test_bad_lines_are_skipped_and_reported_by_file_and_line_and_the_rest_is_read(s3: Any) -> None:
    """A truncated last line (a write cut short), a line that is not JSON, JSON of another shape and a record
    with an empty eventId. Mutations caught: the read stopping at the first bad line (or raising), a bad line
    reported without its file or line number, a wrong-shape line yielded as a record."""
    good = [line(f"e{i}", T0 + timedelta(minutes=i)) for i in range(3)]
    truncated = line("cut", T0)[:40]
    wrong_shape = json.dumps({"captureData": {}, "eventMetadata": {"eventId": "x"}})  # no inferenceTime
    empty_id = json.dumps({"captureData": {},
                           "eventMetadata": {"eventId": "", "inferenceTime": "2026-05-06T10:00:00Z"}})
    key = put(s3, T0, [good[0], "not json at all", good[1], "", wrong_shape, empty_id, "[1, 2]", good[2], truncated],
              end="")
    skipped: list[SkippedLine] = []
    records = list(read_capture_window(s3, BUCKET, ENDPOINT, T0, T0 + timedelta(hours=1), skipped=skipped))
    assert [r.eventMetadata.eventId for r in records] == ["e0", "e1", "e2"]
    uri = f"s3://{BUCKET}/{key}"
    assert [(s.file, s.line) for s in skipped] == [(uri, 2), (uri, 5), (uri, 6), (uri, 7), (uri, 9)]
    assert "not JSON" in skipped[0].reason and "not JSON" in skipped[4].reason
    assert "inferenceTime" in skipped[1].reason and "eventId" in skipped[2].reason
    assert str(skipped[0]).startswith(f"{uri}:2: ") and "\n" not in str(skipped[4])


def test_hostile_lines_are_skipped_lines_not_a_crash(s3: Any) -> None:
    """Mutation caught: the lines parsed with json.loads, which recurses once per nesting level (a RecursionError
    out of the reader would end every monitor run over this window), or bytes that are not UTF-8 raising."""
    hostile = ["[" * 100_000 + "]" * 100_000, '{"captureData": ' * 50_000 + "1" + "}" * 50_000]
    key = put(s3, T0 + timedelta(hours=3), [*hostile, line("after", T0 + timedelta(hours=3))])
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"captureData": "\xff\xfe"}\n' + body)  # not UTF-8, first
    skipped: list[SkippedLine] = []
    window = (T0 + timedelta(hours=3), T0 + timedelta(hours=4))
    records = list(read_capture_window(s3, BUCKET, ENDPOINT, *window, skipped=skipped))
    assert [r.eventMetadata.eventId for r in records] == ["after"]
    assert [s.line for s in skipped] == [1, 2, 3] and all("not JSON" in s.reason for s in skipped)
    assert "recursion limit" in skipped[1].reason and len(str(skipped[1])) < 300


def test_a_bad_file_does_not_hide_the_next_one(s3: Any) -> None:
    put(s3, T0, ["\x00\x01 garbage"], name="00-00-000-a.jsonl")
    put(s3, T0, [line("ok", T0)], name="00-00-001-b.jsonl")
    skipped: list[SkippedLine] = []
    records = list(read_capture_window(s3, BUCKET, ENDPOINT, T0, T0 + timedelta(hours=1), skipped=skipped))
    assert [r.eventMetadata.eventId for r in records] == ["ok"] and len(skipped) == 1


def test_the_window_is_inference_time_in_start_inclusive_end_exclusive_wherever_the_file_is_filed(s3: Any) -> None:
    """A record of 10:59 buffered into an 11:00 file, one of 10:00 in a 09:00 file (a buffer that began
    before the hour) and one of 11:00 filed under 10:00 still belong to their own windows. Mutations caught:
    only the window's own hour folders listed, the end included, records outside the window yielded because
    their file is listed."""
    put(s3, T0, [line("start", T0), line("late-10", T0 + timedelta(minutes=59)),
                 line("at-11", T0 + timedelta(hours=1))])
    put(s3, T0 + timedelta(hours=1), [line("early", T0 + timedelta(minutes=59, seconds=30))])
    put(s3, T0 - timedelta(hours=1), [line("before", T0 - timedelta(seconds=1)), line("filed-early", T0)])
    ids = [r.eventMetadata.eventId for r in read_capture_window(s3, BUCKET, ENDPOINT, T0, T0 + timedelta(hours=1))]
    assert sorted(ids) == ["early", "filed-early", "late-10", "start"]
    naive = [r.eventMetadata.eventId for r in read_capture_window(s3, BUCKET, ENDPOINT, T0.replace(tzinfo=None),
                                                                  T0.replace(tzinfo=None) + timedelta(hours=1))]
    assert sorted(naive) == sorted(ids)  # naive datetimes are UTC


def test_every_variant_is_read_unless_one_is_named_and_only_jsonl_files(s3: Any) -> None:
    put(s3, T0, [line("a", T0)], variant="AllTraffic")
    put(s3, T0, [line("b", T0)], variant="Shadow")
    s3.put_object(Bucket=BUCKET, Key=s3_layout.capture_hour_prefix(ENDPOINT, "AllTraffic", 2026, 5, 6, 10) + "x.tmp",
                  Body=b"{}")
    end = T0 + timedelta(hours=1)
    keys = capture_keys(s3, BUCKET, ENDPOINT, T0, end)
    assert len(keys) == 2 and all(k.endswith(".jsonl") for k in keys)
    assert sorted(r.eventMetadata.eventId for r in read_capture_window(s3, BUCKET, ENDPOINT, T0, end)) == ["a", "b"]
    assert [r.eventMetadata.eventId for r in read_capture_window(s3, BUCKET, ENDPOINT, T0, end,
                                                                 variant="Shadow")] == ["b"]
    assert list(read_capture_window(s3, BUCKET, "another-endpoint", T0, end)) == []


def test_lines_parse_without_s3_too() -> None:
    skipped: list[SkippedLine] = []
    records = list(parse_capture_lines([line("x", T0).encode(), b"{", b"  "], "local.jsonl", skipped))
    assert [r.eventMetadata.eventId for r in records] == ["x"] and [str(s).split(": ")[0] for s in skipped] == [
        "local.jsonl:2"]


def test_the_smoke_tests_requests_are_left_out_unless_asked_for(s3: Any) -> None:
    """The pipeline's smoke test sends one val image many times (InferenceId SMOKE_TEST_INFERENCE_ID): not
    traffic. Mutation caught: the filter dropped (every deployment would add a burst of one image to the
    monitor's window and the labelling queue) or applied to every InferenceId."""
    smoke = CaptureRecord(captureData=CaptureData(), eventMetadata=EventMetadata(
        eventId="s", inferenceId=SMOKE_TEST_INFERENCE_ID, inferenceTime=T0)).model_dump_json()
    tagged = CaptureRecord(captureData=CaptureData(), eventMetadata=EventMetadata(
        eventId="t", inferenceId="client-42", inferenceTime=T0)).model_dump_json()
    put(s3, T0, [smoke, tagged, line("u", T0)])
    end = T0 + timedelta(hours=1)
    assert sorted(r.eventMetadata.eventId for r in read_capture_window(s3, BUCKET, ENDPOINT, T0, end)) == ["t", "u"]
    assert sorted(r.eventMetadata.eventId for r in read_capture_window(s3, BUCKET, ENDPOINT, T0, end,
                                                                       include_smoke_test=True)) == ["s", "t", "u"]
