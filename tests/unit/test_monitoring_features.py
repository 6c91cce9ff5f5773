"""d2ops_core.monitoring_features: what the monitor measures on one image and its answer, and the baseline."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from PIL import Image

from d2ops_core import images as rule
from d2ops_core.documents.detections import Detection, InvocationResponse
from d2ops_core.documents.monitoring import DISTRIBUTIONS
from d2ops_core.monitoring_features import (
    LOW_CONFIDENCE_MARGIN,
    answer_features,
    build_baseline,
    image_features,
    image_size_and_brightness,
    quantile_subsample,
)
from tests.fixtures.monitoring_synthetic import CLASSES, THRESHOLDS, stream


def jpeg(width: int, height: int, grey: int, orientation: int | None = None) -> bytes:
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation:
        exif[rule.EXIF_ORIENTATION] = orientation
    Image.new("RGB", (width, height), (grey, grey, grey)).save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    return buffer.getvalue()


def test_brightness_halves_when_the_image_is_half_as_bright_and_size_is_upright() -> None:
    # Mutation caught: brightness read from another band/scale than 0-1, or the EXIF rotation ignored.
    w, h, bright = image_size_and_brightness(jpeg(320, 200, 200))
    _, _, dark = image_size_and_brightness(jpeg(320, 200, 100))
    assert (w, h) == (320, 200)
    assert bright == pytest.approx(200 / 255, abs=0.01) and dark == pytest.approx(bright / 2, abs=0.01)
    assert image_size_and_brightness(jpeg(320, 200, 100, orientation=6))[:2] == (200, 320)


def test_an_image_that_does_not_decode_is_refused_naming_it() -> None:
    with pytest.raises(rule.ImageRejected, match="event e-1"):
        image_size_and_brightness(jpeg(64, 64, 10)[:300], "event e-1")


def test_detections_become_box_fractions_and_low_confidence_by_the_applied_threshold() -> None:
    # Mutation caught: the low-confidence margin not applied, or the model's threshold preferred to the
    # one the answer says it applied.
    answer = InvocationResponse.model_validate({
        "detections": [{"box": [0, 0, 32, 16], "score": 0.55, "class_id": 1, "class_name": "car"},
                       {"box": [10, 10, 20, 20], "score": 0.95, "class_id": 2, "class_name": "person"},
                       {"box": [0, 0, 64, 64], "score": 0.35, "class_id": 2, "class_name": "person"}],
        "image": {"width": 64, "height": 64},
        "score_thresholds": {"source": "request", "by_class": {"car": 0.3, "person": 0.3}}})
    features = answer_features(jpeg(64, 64, 128), answer, {"car": 0.5, "person": 0.9})
    assert features.classes == ("car", "person", "person")
    assert features.box_area_fractions == pytest.approx((32 * 16 / 4096, 100 / 4096, 1.0))
    assert features.low_confidence == 1  # 0.35 < 0.3 + 0.1 only; 0.55 is not (the request's 0.3 applied)
    assert features.low_confidence_fraction == pytest.approx(1 / 3)
    plain = image_features(64, 64, 0.5, [Detection(box=[0, 0, 1, 1], score=0.5 + LOW_CONFIDENCE_MARGIN / 2,
                                                   class_id=1, class_name="car")], {"car": 0.5})
    assert plain.low_confidence == 1 and image_features(64, 64, 0.5, [], {}).low_confidence_fraction == 0.0


def test_the_baseline_is_deterministic_subsampled_and_keeps_images_aligned() -> None:
    # Mutation caught: an unseeded subsample (two jobs, two baselines) or classes subsampled independently.
    features = stream(300, seed=3)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    one = build_baseline(features, run_id="r1", class_names=CLASSES, score_thresholds=THRESHOLDS, created_at=when,
                         limit=100)
    two = build_baseline(features, run_id="r1", class_names=CLASSES, score_thresholds=THRESHOLDS, created_at=when,
                         limit=100)
    assert one == two and one.images == 300 and one.detections == sum(f.boxes for f in features)
    assert set(one.distributions) == set(DISTRIBUTIONS)
    assert all(len(v) == 100 and v == sorted(v) for v in one.distributions.values())
    assert {len(v) for v in one.class_rates.values()} == {100} and len(one.low_confidence) == 100
    full = build_baseline(features, run_id="r1", class_names=CLASSES, created_at=when)
    # aligned: each kept image's class counts add up to its boxes, as in the full set
    totals = sorted(sum(full.class_rates[c][i] for c in CLASSES) for i in range(300))
    assert totals == full.distributions["boxes_per_image"]


def test_quantile_subsample_keeps_the_extremes_and_the_median() -> None:
    values = [float(v) for v in range(1001)]
    kept = quantile_subsample(values[::-1], limit=11)
    assert kept == [float(v) for v in range(0, 1001, 100)]
