"""d2ops_core.monitoring_baseline: the one reader of a run's monitoring baseline (the monitor's, `label select`'s)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from d2ops_core import s3_layout
from d2ops_core.documents.monitoring import MonitoringBaseline
from d2ops_core.monitoring_baseline import BaselineError, read_monitoring_baseline
from tests.fixtures.moto_server import moto_server

BUCKET = "artifacts"
RUN = "shapes_v1_0123456789abcdef"
KEY = s3_layout.monitoring_baseline_key(RUN)


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    with moto_server() as url:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                              aws_secret_access_key="test")
        client.create_bucket(Bucket=BUCKET)
        yield client


def baseline(images: int) -> bytes:
    return MonitoringBaseline(run_id=RUN, images=images, detections=2 * images, class_names=["square"],
                              created_at=datetime(2026, 5, 1, tzinfo=UTC), distributions={}, class_rates={},
                              low_confidence=[]).model_dump_json().encode()


def test_a_run_without_a_baseline_has_none_and_its_own_is_read_from_its_evaluation_prefix(s3: Any) -> None:
    # catches the baseline looked for under another key, and a missing one raised instead of None
    s3.delete_object(Bucket=BUCKET, Key=KEY)
    assert read_monitoring_baseline(s3, BUCKET, RUN) is None
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=baseline(50))
    got = read_monitoring_baseline(s3, BUCKET, RUN)
    assert got is not None and (got.run_id, got.images, got.detections) == (RUN, 50, 100)
    assert read_monitoring_baseline(s3, BUCKET, RUN + "0") is None  # a key it prefixes is not its baseline


@pytest.mark.parametrize(("body", "detail"), [
    (b'{"run_id": "cut short', "(document: Invalid JSON"),
    (b'{"run_id": 7}', "(run_id: Input should be a valid string"),
    (b"[]", "(document: Input should be an object"),
    (b"", "(document: Invalid JSON"),
], ids=["truncated", "wrong-type", "not-an-object", "empty"])
def test_a_corrupt_baseline_is_one_line_naming_the_object_and_where(s3: Any, body: bytes, detail: str) -> None:
    # catches a ValidationError or JSON error escaping as a traceback, or a message without the object's address
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=body)
    with pytest.raises(BaselineError) as info:
        read_monitoring_baseline(s3, BUCKET, RUN)
    message = str(info.value)
    assert message.startswith(f"s3://{BUCKET}/{KEY}: not a monitoring baseline {detail}") and "\n" not in message
    assert isinstance(info.value, ValueError)
