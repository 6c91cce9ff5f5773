"""The smoke test Lambda: a dataset image to the endpoint, the answer checked.

S3 is moto. The SageMaker runtime is a small local HTTP endpoint speaking InvokeEndpoint's
wire format (moto's runtime cannot take binary bodies), reached through boto3's standard
AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME variable, so the Lambda's boto3 call runs unmodified.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from PIL import Image

from tests.fixtures.pipeline import support
from tests.fixtures.pipeline.support import FakeRuntime

support.function_path("smoke_test_endpoint")
from smoke_test_endpoint import handler as smoke_handler  # noqa: E402
from smoke_test_endpoint.service import NoSmokeTestImage, SmokeTestFailed, check_response  # noqa: E402

EVENT = support.load_event("smoke_test_endpoint", "endpoint")
GOOD = {"detections": [{"box": [1.0, 2.0, 30.5, 40.0], "score": 0.93, "class_id": 0, "class_name": "square"},
                       {"box": [5, 5, 9, 9], "score": 0.2, "class_id": 2, "class_name": "triangle", "mask": None}],
        "image": {"width": 32, "height": 24}}


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(buffer, format="JPEG")
    return buffer.getvalue()


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (30, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeRuntime]]:
    with support.fake_runtime() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", url)
        yield FakeRuntime


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, runtime: type[FakeRuntime]) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=EVENT["bucket"])
        for key, body in [("annotations/train.json", b"{}"), ("images/b.png", png()),
                          ("images/a.jpg", jpeg()), ("manifest.json", b"{}")]:
            client.put_object(Bucket=EVENT["bucket"], Key=EVENT["prefix"] + key, Body=body)
        yield client


def endpoint_answers(*bodies: Any, content_type: str = "application/json", status: int = 200) -> None:
    for b in bodies:
        FakeRuntime.answers.append((status, content_type, (b if isinstance(b, str) else json.dumps(b)).encode()))


def test_a_well_formed_answer_passes(s3: Any) -> None:
    endpoint_answers(GOOD)
    result = smoke_handler.handler(EVENT, support.FakeLambdaContext())
    assert result["image_key"] == "datasets/shapes/v1/images/a.jpg"  # the first image in key order
    assert result["detections"] == 2 and result["endpoint_name"] == EVENT["endpoint_name"]
    ((path, content_type, body),) = FakeRuntime.requests
    assert path == f"/endpoints/{EVENT['endpoint_name']}/invocations"
    assert content_type == "image/jpeg" and body == jpeg()
    # No options: the endpoint answers with the model's own per-class score thresholds, as for any client.
    assert FakeRuntime.custom_attributes == [None]


def test_a_container_error_fails_the_smoke_test(s3: Any) -> None:
    endpoint_answers({"message": "image could not be decoded"}, status=400)
    with pytest.raises(SmokeTestFailed, match="image could not be decoded"):
        smoke_handler.handler(EVENT, support.FakeLambdaContext())


@pytest.mark.parametrize(("body", "content_type", "reason"), [
    ({"predictions": []}, "application/json", "detections: Field required"),
    ({"detections": [{"box": [1, 2, 3], "score": 0.5, "class_id": 0, "class_name": "a"}]}, "application/json",
     "detections.0.box"),
    ({"detections": [{"box": [9, 2, 3, 4], "score": 0.5, "class_id": 0, "class_name": "a"}]}, "application/json",
     "not x1 <= x2"),
    ({"detections": [{"box": [1, 2, 3, 4], "score": 1.5, "class_id": 0, "class_name": "a"}]}, "application/json",
     "detections.0.score"),
    ({"detections": []}, "application/json", "image: Field required"),
    ("<html>oops</html>", "text/html", "Content-Type 'text/html'"),
    ("{truncated", "application/json", "invalid JSON"),
])
def test_bad_answers_fail_the_smoke_test_with_the_reason(s3: Any, body: Any, content_type: str, reason: str) -> None:
    endpoint_answers(body, content_type=content_type)
    with pytest.raises(SmokeTestFailed, match=reason.replace("(", r"\(").replace("[", r"\[")):
        smoke_handler.handler(EVENT, support.FakeLambdaContext())


def test_the_image_comes_from_the_val_split(s3: Any) -> None:
    manifest = {"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json",
                "val": "annotations/val.json", "images": "images/"}
    val = {"images": [{"id": 7, "file_name": "b.png", "width": 32, "height": 24}], "annotations": [], "categories": []}
    for key, body in (("manifest.json", manifest), ("annotations/val.json", val)):
        s3.put_object(Bucket=EVENT["bucket"], Key=EVENT["prefix"] + key, Body=json.dumps(body))
    endpoint_answers(GOOD)
    result = smoke_handler.handler(EVENT, support.FakeLambdaContext())
    assert result["image_key"] == "datasets/shapes/v1/images/b.png"
    assert FakeRuntime.requests[-1][1] == "image/png"


def test_missing_and_corrupt_val_images_are_skipped(s3: Any) -> None:
    manifest = {"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json"}
    val = {"images": [{"id": 1, "file_name": "gone.jpg"}, {"id": 2, "file_name": "broken.jpg"},
                      {"id": 3, "file_name": "b.png"}]}
    for key, body in (("manifest.json", json.dumps(manifest)), ("annotations/val.json", json.dumps(val)),
                      ("images/broken.jpg", jpeg()[:40])):
        s3.put_object(Bucket=EVENT["bucket"], Key=EVENT["prefix"] + key, Body=body)
    endpoint_answers(GOOD)
    assert smoke_handler.handler(EVENT, support.FakeLambdaContext())["image_key"].endswith("images/b.png")


def test_a_huge_val_split_falls_back_to_the_first_image(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoke_test_endpoint import service

    test_the_image_comes_from_the_val_split(s3)
    monkeypatch.setattr(service, "MAX_VAL_ANNOTATION_BYTES", 10)
    endpoint_answers(GOOD)
    assert smoke_handler.handler(EVENT, support.FakeLambdaContext())["image_key"].endswith("images/a.jpg")


def test_an_error_status_fails_the_smoke_test() -> None:
    with pytest.raises(SmokeTestFailed, match="HTTP 500"):
        check_response(500, "application/json", b'{"message": "model not loaded"}')
    with pytest.raises(SmokeTestFailed, match="invalid JSON"):  # a RecursionError escaped the Lambda
        check_response(200, "application/json", b"[" * 100_000 + b"]" * 100_000)


def test_a_dataset_without_images_cannot_be_smoke_tested(monkeypatch: pytest.MonkeyPatch) -> None:
    support.aws_env(monkeypatch)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=EVENT["bucket"])
        client.put_object(Bucket=EVENT["bucket"], Key=EVENT["prefix"] + "manifest.json", Body=b"{}")
        with pytest.raises(NoSmokeTestImage, match=r"no decodable JPEG or PNG image"):
            smoke_handler.handler(EVENT, support.FakeLambdaContext())


def test_images_are_picked_by_content_not_by_name(s3: Any) -> None:
    """A GIF named .jpg, an image too thin for the detector and a PNG named .dat: only content decides,
    by the endpoint's own rule (d2ops_core.images), and the Content-Type follows the content."""
    gif, thin = io.BytesIO(), io.BytesIO()
    Image.new("RGB", (16, 16)).save(gif, format="GIF")
    Image.new("RGB", (400, 10)).save(thin, format="PNG")
    manifest = {"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json"}
    val = {"images": [{"id": 1, "file_name": "0-fake.jpg"}, {"id": 2, "file_name": "1-thin.png"},
                      {"id": 3, "file_name": "2-photo.dat"}]}
    for key, body in (("manifest.json", json.dumps(manifest).encode()),
                      ("annotations/val.json", json.dumps(val).encode()), ("images/0-fake.jpg", gif.getvalue()),
                      ("images/1-thin.png", thin.getvalue()),
                      ("images/2-photo.dat", png())):
        s3.put_object(Bucket=EVENT["bucket"], Key=EVENT["prefix"] + key, Body=body)
    endpoint_answers(GOOD)
    assert smoke_handler.handler(EVENT, support.FakeLambdaContext())["image_key"].endswith("images/2-photo.dat")
    assert FakeRuntime.requests[-1][1:] == ("image/png", png())


def test_a_camera_jpeg_mpo_is_sent_as_image_jpeg(s3: Any) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (9, 9, 9)).save(buffer, format="MPO", save_all=True,
                                               append_images=[Image.new("RGB", (8, 6))])
    s3.put_object(Bucket=EVENT["bucket"], Key=EVENT["prefix"] + "images/0-camera.png", Body=buffer.getvalue())
    endpoint_answers(GOOD)
    assert smoke_handler.handler(EVENT, support.FakeLambdaContext())["image_key"].endswith("images/0-camera.png")
    assert FakeRuntime.requests[-1][1] == "image/jpeg"


def test_during_a_canary_bake_every_one_of_several_answers_must_be_good(s3: Any) -> None:
    """The bake splits requests between the fleets: one bad answer (the canary's) among good ones fails."""
    endpoint_answers(GOOD, GOOD)
    # SageMaker's answer when the container answers 500: ModelError (HTTP 424) carrying the original.
    endpoint_answers({"message": "Received server error (500) from primary: model raised on this image",
                      "OriginalStatusCode": 500}, status=424)
    endpoint_answers(GOOD)
    with pytest.raises(SmokeTestFailed, match=r"request 3 of 6: .* answered 500 .*model raised on this image"):
        smoke_handler.handler({**EVENT, "requests": 6}, support.FakeLambdaContext())
    assert len(FakeRuntime.requests) == 3  # it stops at the first bad answer

    FakeRuntime.requests.clear()
    FakeRuntime.answers[:] = []
    endpoint_answers(*[GOOD] * 6)
    result = smoke_handler.handler({**EVENT, "requests": 6}, support.FakeLambdaContext())
    assert result["requests"] == 6 and len(FakeRuntime.requests) == 6 and result["detections"] == 2
