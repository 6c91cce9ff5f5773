"""The serving logic in-process on a real exported detector: batching, per-request errors, JSON, masks."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from model_code.artifact import load_artifact
from model_code.inference import image_to_tensor, predict
from model_code.serving.service import BATCH_SIZE_HEADER, DetectionService, RawRequest
from tests.fixtures.serving.support import (
    CATEGORY_IDS,
    CLASS_NAMES,
    cached_artifact,
    jpeg_bytes,
    png_bytes,
    shapes_image,
)

LOOSE = {"score_threshold": b"0"}


@pytest.fixture(scope="module")
def service() -> DetectionService:
    svc = DetectionService(load_artifact(cached_artifact()))
    assert svc.ready is False
    assert svc.warm_up() > 0 and svc.ready
    return svc


@pytest.fixture(scope="module")
def mask_service() -> DetectionService:
    svc = DetectionService(load_artifact(cached_artifact(has_masks=True)))
    svc.warm_up()
    return svc


def test_answer_matches_the_shared_predict_and_maps_dataset_ids(service):
    response = service.handle_batch([RawRequest(png_bytes(seed=1), "image/png", {"score_threshold": b"0",
                                                                                 "max_detections": b"5"})])[0]
    assert response.status == 200 and response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert body["image"] == {"width": 160, "height": 120}
    expected = predict(service.detector, [image_to_tensor(shapes_image(seed=1))], score_threshold=0.0,
                       max_detections=5)[0]
    assert len(body["detections"]) == len(expected) == 5
    for det, box, score, label in zip(body["detections"], expected.boxes.tolist(), expected.scores.tolist(),
                                      expected.labels.tolist(), strict=True):
        assert det["box"] == pytest.approx(box, abs=0.01) and det["score"] == pytest.approx(score, abs=1e-4)
        assert det["class_id"] == CATEGORY_IDS[label] and det["class_name"] == CLASS_NAMES[label]
        assert 0 <= det["box"][0] <= det["box"][2] <= 160 and 0 <= det["box"][1] <= det["box"][3] <= 120


def test_one_batch_mixes_options_and_errors_without_affecting_each_other(service):
    alone = {k: service.handle_batch([RawRequest(jpeg_bytes(seed=2), "image/jpeg", q)])[0].json()
             for k, q in {"loose": LOOSE, "top2": {"score_threshold": b"0", "max_detections": b"2"},
                          "strict": {"score_threshold": b"0.999"}}.items()}
    batch = [RawRequest(jpeg_bytes(seed=2), "image/jpeg", LOOSE), RawRequest(b"garbage", "image/jpeg"),
             RawRequest(jpeg_bytes(seed=2), "image/jpeg", {"score_threshold": b"0", "max_detections": b"2"}),
             RawRequest(json.dumps({"image": base64.b64encode(jpeg_bytes(seed=2)).decode(),
                                    "score_threshold": 0.999}).encode(), "application/json"),
             RawRequest(jpeg_bytes(), "image/jpeg", {"masks": b"true"})]
    responses = service.handle_batch(batch)
    assert [r.status for r in responses] == [200, 415, 200, 200, 400]
    assert all(r.headers[BATCH_SIZE_HEADER] == "5" for r in responses)
    for got, key in zip([responses[0], responses[2], responses[3]], ["loose", "top2", "strict"], strict=True):
        assert [d["class_id"] for d in got.json()["detections"]] == [d["class_id"] for d in alone[key]["detections"]]
        assert [d["score"] for d in got.json()["detections"]] == pytest.approx(
            [d["score"] for d in alone[key]["detections"]], abs=1e-3)
    assert len(alone["top2"]["detections"]) == 2 and alone["strict"]["detections"] == []
    assert responses[1].json()["error"]["code"] == "unsupported_content_type"
    assert "detects boxes only" in responses[4].json()["error"]["message"]


def test_images_of_different_sizes_share_a_batch(service):
    sizes = [(160, 120), (64, 200), (300, 90)]
    responses = service.handle_batch([RawRequest(png_bytes(w, h), "image/png", LOOSE) for w, h in sizes])
    for response, (w, h) in zip(responses, sizes, strict=True):
        body = response.json()
        assert body["image"] == {"width": w, "height": h}
        assert all(d["box"][2] <= w + 0.01 and d["box"][3] <= h + 0.01 for d in body["detections"])


def test_masks_are_coco_rle_of_the_image_size_when_asked(mask_service):
    plain, with_masks = mask_service.handle_batch([
        RawRequest(png_bytes(), "image/png", {"score_threshold": b"0", "max_detections": b"3"}),
        RawRequest(png_bytes(), "image/png", {"score_threshold": b"0", "max_detections": b"3", "masks": b"1"})])
    assert all("mask" not in d for d in plain.json()["detections"])
    dets = with_masks.json()["detections"]
    assert len(dets) == 3
    expected = predict(mask_service.detector, [image_to_tensor(shapes_image())], score_threshold=0.0,
                       max_detections=3)[0]
    assert expected.masks is not None
    for det, mask in zip(dets, expected.masks.numpy(), strict=True):
        assert det["mask"]["size"] == [120, 160] and isinstance(det["mask"]["counts"], str)
        decoded = mask_utils.decode({"size": det["mask"]["size"], "counts": det["mask"]["counts"].encode()})
        assert np.array_equal(decoded.astype(bool), mask)


def test_an_empty_batch_and_all_bad_batch_never_call_the_model(service):
    assert service.handle_batch([]) == []
    responses = service.handle_batch([RawRequest(b"", "image/png"), RawRequest(b"x", "text/csv")])
    assert [r.status for r in responses] == [400, 415]
    assert all(r.body and r.json()["error"]["message"] for r in responses)


def test_non_finite_detections_are_dropped_and_an_unwritable_answer_fails_alone(service, monkeypatch):
    """A NaN box once went out as the JSON token NaN (no client parses it); a label outside the artifact's
    classes raised while the batch's answers were written, failing every request of the batch."""
    import torch

    from model_code.inference import Detections

    def fake_predict(images, options):
        nan_box = Detections(boxes=torch.tensor([[1.0, 2.0, 3.0, 4.0], [float("nan"), 0.0, 1.0, 1.0]]),
                             scores=torch.tensor([0.9, 0.8]), labels=torch.tensor([0, 0]))
        bad_label = Detections(boxes=torch.tensor([[1.0, 2.0, 3.0, 4.0]]), scores=torch.tensor([0.9]),
                               labels=torch.tensor([len(CLASS_NAMES)]))
        return [nan_box, bad_label][: len(images)]

    monkeypatch.setattr(service, "_predict", fake_predict)
    first, second = service.handle_batch([RawRequest(png_bytes(seed=1), "image/png"),
                                          RawRequest(png_bytes(seed=2), "image/png")])
    assert first.status == 200 and [d["box"] for d in first.json()["detections"]] == [[1.0, 2.0, 3.0, 4.0]]
    assert second.status == 500 and second.json()["error"]["code"] == "inference_failed"
    assert b"NaN" not in first.body + second.body
