"""What the monitor measures on one image and the model's answer to it: the one place for these facts.

The evaluation job computes them on the val split's images and the challenger's own detections (the
baseline, :func:`build_baseline`); the monitor (functions/monitor_endpoint) computes them on each
captured request and the endpoint's answer, and compares the two samples (docs/monitoring.md).

Per image (:class:`ImageFeatures`):

- ``image_width``, ``image_height``: the upright image's size in pixels (EXIF orientation applied, as
  training, evaluation and serving see it);
- ``brightness``: mean luma (ITU-R 601, Pillow's ``L`` mode) over the image, 0 (black) to 1 (white).
  A JPEG is decoded at 1/8 scale for it (``Image.draft``): the mean barely moves (the scaled decode keeps
  each block's DC term) and it costs an eighth of the pixels, on both sides alike;
- the detections the model answered: their classes (-> detections of each class per image), scores,
  box area as a fraction of the image, boxes per image;
- low-confidence detections: a detection is *low-confidence* when its score is below its class's
  threshold plus :data:`LOW_CONFIDENCE_MARGIN` (0.1): the endpoint answers only detections at or above
  the threshold, so these are the ones just over the line, the answers a shift makes the model unsure
  of first. The threshold is the one the answer says it applied (``score_thresholds.by_class``), else
  the model's own (the baseline's ``score_thresholds``), else the server's default.

Standard library, pydantic and Pillow only: this ships in the Lambda layer and runs in the evaluation job.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from PIL import ImageStat

from d2ops_core import images as rule
from d2ops_core.documents.detections import Detection, InvocationResponse
from d2ops_core.documents.monitoring import DISTRIBUTIONS, MonitoringBaseline
from d2ops_core.images import Source
from d2ops_core.score_thresholds import DEFAULT_SCORE_THRESHOLD

LOW_CONFIDENCE_MARGIN = 0.1
# JPEG brightness is read from a 1/8-scale decode (the smallest libjpeg offers).
_BRIGHTNESS_SCALE = 8
# A baseline keeps at most this many values of a distribution (a sorted, evenly spaced quantile subsample)
# and this many images' class rates: KS and PSI against a few thousand reference values are as sharp as
# against the whole val set, and the document stays small enough to read in every window.
BASELINE_SAMPLE = 5000
BASELINE_SEED = 0


@dataclass(frozen=True)
class ImageFeatures:
    """One image and the model's answer to it, as the statistics see them."""

    image_width: int
    image_height: int
    brightness: float  # 0-1
    classes: tuple[str, ...] = ()  # each detection's class name
    scores: tuple[float, ...] = ()
    box_area_fractions: tuple[float, ...] = ()
    low_confidence: int = 0  # detections below their class threshold + LOW_CONFIDENCE_MARGIN

    @property
    def boxes(self) -> int:
        return len(self.scores)

    @property
    def low_confidence_fraction(self) -> float:
        """Fraction of the image's detections that are low-confidence; an image without any counts 0."""
        return self.low_confidence / self.boxes if self.boxes else 0.0


def image_size_and_brightness(source: Source, where: str = "image") -> tuple[int, int, float]:
    """(upright width, upright height, brightness 0-1) of an image file, path or bytes; ``ImageRejected``
    (naming ``where``) for anything the image rule refuses or that does not decode."""
    with rule.open_image(source, where) as image:
        width, height = rule.oriented_size(image.size, rule.orientation(image))
        try:
            if image.format == "JPEG":
                image.draft("L", (max(1, image.size[0] // _BRIGHTNESS_SCALE),
                                  max(1, image.size[1] // _BRIGHTNESS_SCALE)))
            luma = image.convert("L")
            mean = float(ImageStat.Stat(luma).mean[0]) / 255.0
        except Exception as exc:  # truncated data, a broken zlib stream, a decoder error
            raise rule.ImageRejected("corrupt", f"{where} is a truncated or damaged {image.format} image "
                                                f"({image.size[0]}x{image.size[1]}): {exc}") from exc
    return width, height, mean


def low_confidence(score: float, threshold: float) -> bool:
    """The rule, in one place: just over the class's threshold (see the module docstring)."""
    return score < threshold + LOW_CONFIDENCE_MARGIN


def image_features(width: int, height: int, brightness: float, detections: Sequence[Detection],
                   thresholds: Mapping[str, float]) -> ImageFeatures:
    """The features of one image of ``width`` x ``height`` (upright) and the detections answered on it;
    ``thresholds``: class name -> the score threshold that decided it (a class absent gets the default)."""
    area = float(width * height)
    classes: list[str] = []
    scores: list[float] = []
    fractions: list[float] = []
    low = 0
    for d in detections:
        x0, y0, x1, y1 = d.box
        classes.append(d.class_name)
        scores.append(float(d.score))
        fractions.append(min(1.0, max(0.0, (x1 - x0) * (y1 - y0) / area)))
        low += low_confidence(d.score, thresholds.get(d.class_name, DEFAULT_SCORE_THRESHOLD))
    return ImageFeatures(width, height, brightness, tuple(classes), tuple(scores), tuple(fractions), low)


def answer_features(image: Source, answer: InvocationResponse, model_thresholds: Mapping[str, float],
                    where: str = "image") -> ImageFeatures:
    """A captured request's image and the endpoint's answer -> features. The thresholds are those the answer
    says it applied, else ``model_thresholds`` (the baseline's, the model's own)."""
    width, height, brightness = image_size_and_brightness(image, where)
    applied = dict(model_thresholds)
    if answer.score_thresholds is not None:
        applied.update(answer.score_thresholds.by_class)
    return image_features(width, height, brightness, answer.detections, applied)


@dataclass
class FeatureSample:
    """Many images' features as the statistics compare them: one list per statistic."""

    class_names: list[str]
    images: int = 0
    detections: int = 0
    distributions: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in DISTRIBUTIONS})
    class_rates: dict[str, list[float]] = field(default_factory=dict)
    low_confidence: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in self.class_names:
            self.class_rates.setdefault(name, [])

    def add(self, features: ImageFeatures) -> None:
        self.images += 1
        self.detections += features.boxes
        d = self.distributions
        d["score"].extend(features.scores)
        d["box_area_fraction"].extend(features.box_area_fractions)
        d["boxes_per_image"].append(float(features.boxes))
        d["image_width"].append(float(features.image_width))
        d["image_height"].append(float(features.image_height))
        d["brightness"].append(features.brightness)
        counts = dict.fromkeys(self.class_names, 0)
        for name in features.classes:
            if name in counts:  # a class the model does not have cannot be answered; ignored
                counts[name] += 1
        for name, count in counts.items():
            self.class_rates[name].append(float(count))
        self.low_confidence.append(features.low_confidence_fraction)


def sample_features(features: Iterable[ImageFeatures], class_names: Sequence[str]) -> FeatureSample:
    sample = FeatureSample(list(class_names))
    for item in features:
        sample.add(item)
    return sample


def quantile_subsample(values: Sequence[float], limit: int = BASELINE_SAMPLE) -> list[float]:
    """``values`` sorted; more than ``limit`` of them -> ``limit`` evenly spaced order statistics (keeps the
    distribution's shape, deterministic)."""
    ordered = sorted(values)
    if len(ordered) <= limit:
        return ordered
    step = (len(ordered) - 1) / (limit - 1)
    return [ordered[round(i * step)] for i in range(limit)]


def build_baseline(features: Iterable[ImageFeatures], *, run_id: str, class_names: Sequence[str],
                   score_thresholds: Mapping[str, float] | None = None, created_at: datetime | None = None,
                   limit: int = BASELINE_SAMPLE, seed: int = BASELINE_SEED) -> MonitoringBaseline:
    """The baseline document of the val images' features (the model's own answers on them).

    Distributions keep a sorted quantile subsample of at most ``limit`` values; the per-image lists (class
    rates, low-confidence fraction) at most ``limit`` images, the same images for each, drawn with a seeded
    generator: the same inputs give the same document."""
    sample = sample_features(features, class_names)
    picked = list(range(sample.images))
    if sample.images > limit:
        picked = sorted(random.Random(seed).sample(picked, limit))
    return MonitoringBaseline(
        run_id=run_id, class_names=list(class_names), images=sample.images, detections=sample.detections,
        created_at=created_at or datetime.now(UTC),
        distributions={name: quantile_subsample(values, limit) for name, values in sample.distributions.items()},
        class_rates={name: [values[i] for i in picked] for name, values in sample.class_rates.items()},
        low_confidence=[sample.low_confidence[i] for i in picked],
        score_thresholds=dict(score_thresholds or {}))


def baseline_sample(baseline: MonitoringBaseline) -> FeatureSample:
    """The baseline as a :class:`FeatureSample` (what the statistics compare a window with)."""
    return FeatureSample(class_names=list(baseline.class_names), images=baseline.images,
                         detections=baseline.detections,
                         distributions={name: list(baseline.distributions.get(name, [])) for name in DISTRIBUTIONS},
                         class_rates={name: list(v) for name, v in baseline.class_rates.items()},
                         low_confidence=list(baseline.low_confidence))


def mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None

