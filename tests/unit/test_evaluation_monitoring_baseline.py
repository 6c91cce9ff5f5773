"""The evaluation job's monitoring baseline (model_code.evaluation.monitoring_baseline): the challenger's val
answers at the thresholds the endpoint applies, each image measured by the monitor's own rule. The whole job
writing it is checked in tests/integration/test_training_jobs.py (a trained model); this is the fast check."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from d2ops_core.documents.monitoring import MonitoringBaseline
from d2ops_core.run_ids import RUN_ID_ENV
from model_code.artifact import ArtifactMetadata
from model_code.dataset_version import DatasetError
from model_code.evaluation.monitoring_baseline import write_monitoring_baseline

METADATA = ArtifactMetadata(framework="torchvision", task="detection", model="fasterrcnn_resnet18_fpn",
                            class_names=["square", "circle"], category_ids=[3, 7], score_thresholds={"square": 0.6})


def val_split(tmp_path: Path) -> tuple[dict, Path]:
    images = tmp_path / "images"
    images.mkdir()
    for i, grey in enumerate((40, 200)):
        Image.new("RGB", (100, 50), (grey, grey, grey)).save(images / f"{i}.jpg", quality=95)
    gt = {"images": [{"id": 10 + i, "file_name": f"{i}.jpg", "width": 100, "height": 50} for i in range(2)],
          "categories": [{"id": 3, "name": "square"}, {"id": 7, "name": "circle"}], "annotations": []}
    return gt, images


def test_the_baseline_keeps_what_the_endpoint_would_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Mutations caught: every score-0 prediction kept (the job predicts at threshold 0, the endpoint does not);
    # the xywh box read as xyxy; the run id not taken from the job's environment.
    gt, images = val_split(tmp_path)
    results = [{"image_id": 10, "category_id": 3, "bbox": [0, 0, 50, 25], "score": 0.65},  # kept, low-confidence
               {"image_id": 10, "category_id": 3, "bbox": [0, 0, 10, 10], "score": 0.55},  # under square's 0.6
               {"image_id": 11, "category_id": 7, "bbox": [10, 10, 20, 10], "score": 0.9},  # circle: default 0.5
               {"image_id": 11, "category_id": 7, "bbox": [10, 10, 20, 10], "score": 0.2}]
    monkeypatch.setenv(RUN_ID_ENV, "shapes_v1_abc")
    written = write_monitoring_baseline(tmp_path, gt, images, results, METADATA)
    baseline = MonitoringBaseline.model_validate_json((tmp_path / "monitoring-baseline.json").read_text())
    assert baseline == written and baseline.run_id == "shapes_v1_abc" and baseline.detections == 2
    assert baseline.class_rates == {"square": [1.0, 0.0], "circle": [0.0, 1.0]}
    assert baseline.low_confidence == [1.0, 0.0]
    assert baseline.distributions["box_area_fraction"] == pytest.approx([0.04, 0.25])
    assert baseline.distributions["brightness"] == pytest.approx([40 / 255, 200 / 255], abs=0.01)
    assert baseline.score_thresholds == {"square": 0.6, "circle": 0.5}


def test_an_unreadable_val_image_fails_naming_it(tmp_path: Path) -> None:
    gt, images = val_split(tmp_path)
    (images / "1.jpg").write_bytes(b"\xff\xd8\xff not really")
    with pytest.raises(DatasetError, match=r"1\.jpg"):
        write_monitoring_baseline(tmp_path, gt, images, [], METADATA, run_id="r")
    assert not (tmp_path / "monitoring-baseline.json").exists()
