"""The server's default is the model's own per-class thresholds; a request's score_threshold overrides them.

In-process on the real exported detector (tests/fixtures/serving/thresholds.py says how the thresholds
split its detections); tests/integration/test_serving_torchserve.py checks the same through TorchServe.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import torch

from model_code.artifact import ArtifactError, ArtifactMetadata, load_artifact, read_metadata, save_artifact
from model_code.inference import Detections
from model_code.serving.options import PredictOptions
from model_code.serving.service import DetectionService, RawRequest, narrow
from tests.fixtures.serving.support import CLASS_NAMES, cached_artifact, png_bytes
from tests.fixtures.serving.thresholds import (
    SPLIT_CLASS,
    artifact_with_thresholds,
    expected_by_default,
    split_thresholds,
)


@pytest.fixture(scope="module")
def thresholds() -> dict[str, float]:
    return split_thresholds()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, thresholds: dict[str, float]) -> DetectionService:
    return DetectionService(load_artifact(artifact_with_thresholds(tmp_path_factory.mktemp("thr"), thresholds)))


def answer(service: DetectionService, **query: str) -> dict:
    response = service.handle_batch([RawRequest(png_bytes(), "image/png", {k: v.encode() for k, v in query.items()})])
    assert response[0].status == 200, response[0].body
    return response[0].json()


def test_the_default_applies_each_class_s_threshold(service: DetectionService, thresholds: dict[str, float]) -> None:
    # Catches a server that ignores the metadata (0.5 for all: nothing), applies one threshold to every
    # class (square's 0.0: everything), or cuts the best max_detections before the per-class filter.
    everything = answer(service, score_threshold="0", max_detections="1000")["detections"]
    default = answer(service, max_detections="1000")
    expected = expected_by_default(everything, thresholds)
    assert 0 < len(expected) < len(everything)
    assert expected != [d for d in everything if d["score"] >= 0.5]  # what a server ignoring them answers
    assert default["detections"] == expected
    assert default["score_thresholds"] == {"source": "model", "by_class": {SPLIT_CLASS: thresholds[SPLIT_CLASS]}}


def test_a_request_threshold_wins_for_every_class(service: DetectionService, thresholds: dict[str, float]) -> None:
    # Catches the per-class default applied on top of (or instead of) the request's value.
    everything = answer(service, score_threshold="0", max_detections="1000")["detections"]
    assert answer(service, score_threshold="0", max_detections="1000")["score_thresholds"]["source"] == "request"
    low = min(d["score"] for d in everything)
    above = answer(service, score_threshold=f"{low + 1e-3:.4f}", max_detections="1000")["detections"]
    assert len(above) == sum(1 for d in everything if d["score"] >= low + 1e-3) > len(
        expected_by_default(everything, thresholds))


def test_one_batch_mixes_default_and_override_requests(service: DetectionService) -> None:
    # The model call runs once with the loosest options: each request still gets its own answer.
    alone = [answer(service, max_detections="1000"), answer(service, score_threshold="0", max_detections="3")]
    together = service.handle_batch([
        RawRequest(png_bytes(), "image/png", {"max_detections": b"1000"}),
        RawRequest(png_bytes(), "image/png", {"score_threshold": b"0", "max_detections": b"3"})])
    assert [r.json() for r in together] == alone


def test_a_json_null_threshold_means_the_model_s_own(service: DetectionService) -> None:
    body = json.dumps({"image": base64.b64encode(png_bytes()).decode(), "score_threshold": None,
                       "max_detections": 1000}).encode()
    (response,) = service.handle_batch([RawRequest(body, "application/json")])
    assert response.json() == answer(service, max_detections="1000")


def test_max_detections_counts_what_the_thresholds_keep(service: DetectionService) -> None:
    default = answer(service, max_detections="1000")["detections"]
    assert answer(service, max_detections="2")["detections"] == default[:2]


def test_narrow_looks_thresholds_up_by_label() -> None:
    # Pure: three classes in one answer. Catches a lookup by position or by a shifted label.
    det = Detections(boxes=torch.zeros(5, 4), scores=torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5]),
                     labels=torch.tensor([2, 0, 1, 2, 0]))
    per_label = torch.tensor([0.45, 0.65, 0.85])
    kept = narrow(det, PredictOptions(max_detections=10), per_label)
    assert kept.scores.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.5]) and kept.labels.tolist() == [2, 0, 1, 0]
    assert narrow(det, PredictOptions(max_detections=2), per_label).labels.tolist() == [2, 0]
    both = narrow(det, PredictOptions(score_threshold=0.65, max_detections=10), per_label)
    assert both.labels.tolist() == [2, 0, 1]


def test_an_artifact_without_thresholds_serves_the_old_default(tmp_path: Path) -> None:
    # Older artifacts load (their metadata.json has no score_thresholds key) and every class gets 0.5, as before.
    directory = artifact_with_thresholds(tmp_path, {})
    document = json.loads((directory / "metadata.json").read_text())
    del document["score_thresholds"]
    (directory / "metadata.json").write_text(json.dumps(document))
    detector = load_artifact(directory)
    assert detector.metadata.score_thresholds == {}
    service = DetectionService(detector)
    assert service.class_thresholds.tolist() == [0.5] * len(CLASS_NAMES)
    assert answer(service)["score_thresholds"]["source"] == "model"


def test_metadata_round_trip_and_refusals(tmp_path: Path) -> None:
    module = load_artifact(cached_artifact()).module
    meta = ArtifactMetadata(framework="torchvision", task="detection", model="m", class_names=CLASS_NAMES,
                            category_ids=[1, 2, 7], score_thresholds={"disc": 0.4125, "square": 0.0})
    save_artifact(tmp_path / "ok", module, meta)
    back = read_metadata(tmp_path / "ok")
    assert back.score_thresholds == {"disc": 0.4125, "square": 0.0}
    assert [back.score_threshold(i) for i in range(3)] == [0.0, 0.4125, 0.5]  # triangle: none -> the default
    for bad, message in (({"circle": 0.3}, "score_thresholds names classes the model does not have: ['circle']"),
                         ({"disc": 1.5}, "score_thresholds must be scores in [0, 1]"),
                         ({"disc": float("nan")}, "score_thresholds must be scores in [0, 1]")):
        directory = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        save_artifact(directory, module, meta.model_construct(**{**meta.__dict__, "score_thresholds": bad}))
        with pytest.raises(ArtifactError, match=r"metadata.json: invalid metadata: .*" + message.replace("[", r"\[")
                           .replace("]", r"\]")):
            read_metadata(directory)
