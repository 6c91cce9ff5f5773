"""The endpoint's answer is built through the response document and stays byte-compatible for clients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from d2ops_core.documents.detections import InvocationResponse
from model_code.artifact import ArtifactMetadata
from model_code.inference import Detections
from model_code.serving.options import PredictOptions
from model_code.serving.response import detections_to_json, encode_masks
from model_code.serving.service import json_response

META = ArtifactMetadata(framework="torchvision", task="instance_segmentation", model="m",
                        class_names=["square", "disc", "triangle"], category_ids=[1, 2, 7])


def detections(masks: bool = False) -> Detections:
    mask = np.zeros((3, 4, 6), dtype=bool)
    mask[0, 1:3, 2:5] = True
    return Detections(boxes=torch.tensor([[34.5, 20.25, 98.0, 87.75], [1.0, float("nan"), 2.0, 3.0], [0, 0, 5, 5]]),
                      scores=torch.tensor([0.97314, 0.9, 0.5]), labels=torch.tensor([2, 0, 0]),
                      masks=torch.from_numpy(mask) if masks else None)


def test_the_body_is_byte_for_byte_what_clients_parsed_before_the_model() -> None:
    # The exact bytes the hand-built dict gave (json.dumps' default separators, key order
    # detections/image and box/score/class_id/class_name, no "mask" key without masks=true), with one key
    # added at the end (issue 22): the thresholds applied, which a client that knows only the first two skips.
    body = json_response(200, detections_to_json(detections(), META, PredictOptions(), 6, 4), {}).body
    assert body == (b'{"detections": [{"box": [34.5, 20.25, 98.0, 87.75], "score": 0.9731, "class_id": 7, '
                    b'"class_name": "triangle"}, {"box": [0.0, 0.0, 5.0, 5.0], "score": 0.5, "class_id": 1, '
                    b'"class_name": "square"}], "image": {"width": 6, "height": 4}, '
                    b'"score_thresholds": {"source": "model", "by_class": {"triangle": 0.5, "square": 0.5}}}')
    assert InvocationResponse.model_validate_json(body).image.width == 6
    # A reader of an endpoint from before the key still reads its answers.
    before = body.split(b', "score_thresholds"')[0] + b"}"
    assert InvocationResponse.model_validate_json(before).score_thresholds is None


def test_the_answer_names_the_thresholds_it_applied() -> None:
    # Catches a response that claims the model's thresholds when the request overrode them, or the fallback
    # when the artifact has its own; classes not in the answer (disc, and square's NaN-only case) are not listed.
    meta = META.model_copy(update={"score_thresholds": {"triangle": 0.42, "disc": 0.9}})
    by_model = detections_to_json(detections(), meta, PredictOptions(), 6, 4)["score_thresholds"]
    assert by_model == {"source": "model", "by_class": {"triangle": 0.42, "square": 0.5}}
    by_request = detections_to_json(detections(), meta, PredictOptions(score_threshold=0.2), 6, 4)["score_thresholds"]
    assert by_request == {"source": "request", "by_class": {"triangle": 0.2, "square": 0.2}}


def test_masks_come_last_in_each_detection_as_the_encoded_rle() -> None:
    document = detections_to_json(detections(masks=True), META, PredictOptions(masks=True), 6, 4)
    expected = encode_masks(detections(masks=True).masks.numpy())  # type: ignore[union-attr]
    assert [list(d) for d in document["detections"]] == [["box", "score", "class_id", "class_name", "mask"]] * 2
    assert [d["mask"] for d in document["detections"]] == [expected[0], expected[2]]  # the NaN one is dropped


def test_the_writer_refuses_what_the_readers_would() -> None:
    backwards = Detections(boxes=torch.tensor([[9.0, 0.0, 3.0, 4.0]]), scores=torch.tensor([0.5]),
                           labels=torch.tensor([0]))
    with pytest.raises(ValidationError, match="not x1 <= x2"):
        detections_to_json(backwards, META, PredictOptions(), 6, 4)
    with pytest.raises(ValidationError, match=r"ImageSize\s+width"):
        detections_to_json(detections(), META, PredictOptions(), 0, 4)


def test_readers_require_the_image_size() -> None:
    with pytest.raises(ValidationError, match="image"):
        InvocationResponse.model_validate({"detections": []})
