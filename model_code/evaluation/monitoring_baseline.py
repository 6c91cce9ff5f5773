"""The monitor's baseline: the challenger's own answers on the val split, summarised as the monitor summarises
captured traffic (d2ops_core.monitoring_features; docs/monitoring.md).

Written by the evaluation job beside its report (``monitoring-baseline.json``, so it lands at
``runs/<run>/evaluation/monitoring-baseline.json``) from the predictions it already made: each val image's
detections at the class thresholds the endpoint applies (the artifact's ``score_thresholds``), each image's
size and brightness read by the same function the monitor uses on captured requests.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from d2ops_core import images as rule
from d2ops_core.documents.detections import Detection
from d2ops_core.documents.monitoring import MonitoringBaseline
from d2ops_core.monitoring_features import (
    ImageFeatures,
    build_baseline,
    image_features,
    image_size_and_brightness,
)
from d2ops_core.run_ids import RUN_ID_ENV
from d2ops_core.s3_layout import MONITORING_BASELINE_NAME
from model_code.artifact import ArtifactMetadata, write_json
from model_code.dataset_version import DatasetError


def served_detections(results: list[dict[str, Any]], metadata: ArtifactMetadata) -> dict[int, list[Detection]]:
    """COCO results (xywh, every score) -> per image id, the detections the endpoint would answer (score at or
    above the class's threshold), as the endpoint's Detection."""
    label_of = {category: label for label, category in enumerate(metadata.category_ids)}
    kept: dict[int, list[Detection]] = defaultdict(list)
    for r in results:
        label = label_of.get(int(r["category_id"]))
        if label is None or float(r["score"]) < metadata.score_threshold(label):
            continue
        x, y, w, h = (float(v) for v in r["bbox"])
        kept[int(r["image_id"])].append(Detection(box=[x, y, x + w, y + h], score=min(1.0, float(r["score"])),
                                                  class_id=int(r["category_id"]),
                                                  class_name=metadata.class_names[label]))
    return kept


def val_features(gt: dict[str, Any], images_dir: Path, results: list[dict[str, Any]],
                 metadata: ArtifactMetadata) -> Iterator[ImageFeatures]:
    detections = served_detections(results, metadata)
    thresholds = {name: metadata.score_threshold(label) for label, name in enumerate(metadata.class_names)}
    for info in gt["images"]:
        path = images_dir / info["file_name"]
        try:
            width, height, brightness = image_size_and_brightness(path, str(path))
        except (rule.ImageRejected, OSError) as exc:
            raise DatasetError(f"{path}: unreadable image (image id {info['id']}): {exc}") from exc
        yield image_features(width, height, brightness, detections.get(int(info["id"]), []), thresholds)


def write_monitoring_baseline(output: Path, gt: dict[str, Any], images_dir: Path, results: list[dict[str, Any]],
                              metadata: ArtifactMetadata, run_id: str | None = None) -> MonitoringBaseline:
    """``output/monitoring-baseline.json``; ``run_id`` defaults to the job's ``D2OPS_RUN_ID`` (the pipeline sets
    it), else the training job's name (a local evaluation)."""
    run = run_id or os.environ.get(RUN_ID_ENV) or metadata.training_job or "local"
    thresholds = {name: metadata.score_threshold(label) for label, name in enumerate(metadata.class_names)}
    baseline = build_baseline(val_features(gt, images_dir, results, metadata), run_id=run,
                              class_names=metadata.class_names, score_thresholds=thresholds)
    write_json(output / MONITORING_BASELINE_NAME, baseline.model_dump(mode="json"))
    return baseline
