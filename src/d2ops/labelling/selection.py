"""Which captured images to label next: an explicit rule mix, a budget, no near-duplicates (docs/labelling.md).

Every distinct captured image (by the SHA-256 of its bytes) not already in a dataset version gets a score,
the weighted sum of rule terms, each 0-1:

- ``uncertainty``: how near the model's least-sure detection is to its class's score threshold,
  ``max over detections of 1 - |score - threshold| / margin`` (0 beyond the margin, 0 without detections).
  The endpoint answers only detections at or above their threshold, so this finds the barely-kept ones.
- ``weak_class``: 1 when the image has a detection of a class the serving model is weak on (its evaluation
  report: see :func:`weak_classes`), else 0.
- ``empty``: the model answered no detection on an image where the serving model is expected to find boxes:
  ``min(1, boxes per image expected)`` for an image without detections, 0 otherwise. The expectation is the
  serving run's own answers on its val set (its monitoring baseline's detections per image), else the ground
  truth of its evaluation report (instances per val image), else ``DEFAULT_EXPECTED_BOXES``. Every other term
  is 0 without detections, so without this one the images a drifted stream defeats entirely would rank last.
- ``disagreement``: with a second model (``--compare-with``), ``1 - F1`` of matching its detections with the
  captured ones (same class, IoU >= 0.5); 0 without one.
- ``diversity`` (a penalty, <= 0): images are picked greedily, best score first; a candidate whose thumbnail
  (:func:`thumbnail`) is within ``DIVERSITY_RADIUS`` of an image already picked loses
  ``weight * (1 - distance / DIVERSITY_RADIUS)``, and one within ``duplicate_distance`` is dropped as a
  near-duplicate.

Ties go to the smaller SHA-256, so the same capture and parameters give the same selection.
The ranking here is pure (no S3); :mod:`d2ops.labelling.capture_source` reads the capture.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from d2ops.labelling.documents import RankReason, RankTerm
from d2ops_core.documents.detections import Detection
from d2ops_core.documents.evaluation import EvaluationReport
from d2ops_core.documents.monitoring import MonitoringBaseline

DEFAULT_WEIGHTS: dict[str, float] = {"uncertainty": 1.0, "weak_class": 0.5, "empty": 1.0, "disagreement": 1.0,
                                     "diversity": 1.0}
DEFAULT_EXPECTED_BOXES = 1.0  # neither a baseline nor a report: a detector's images usually hold an object
DEFAULT_MARGIN = 0.25
DEFAULT_THRESHOLD = 0.5  # a class the answer names no threshold for (the endpoint's own default)
DEFAULT_DUPLICATE_DISTANCE = 0.15
THUMB_SIDE = 8
DIVERSITY_RADIUS = 0.5  # thumbnail distance: closer than this to a picked image costs score
MATCH_IOU = 0.5
# A class is weak when its own AP on the val split is below this share of the model's overall AP.
WEAK_CLASS_SHARE = 0.8
# ... or when, against the champion it replaced, its AP dropped by more than this (the gate's class-drop view).
WEAK_CLASS_DROP = 0.05


def thumbnail(image: Image.Image) -> np.ndarray:
    """The image's THUMB_SIDE x THUMB_SIDE RGB thumbnail (box-averaged), z-scored over its own pixels.

    Z-scoring takes out a uniform change of brightness or contrast; the averaging, re-encoding and a shift of a
    few pixels. On the synthetic shapes (plain backgrounds, which defeat brightness-step hashes) re-encoded,
    brightened or shifted copies stay within 0.12 and distinct images are 0.18 or more apart (mean 1.0)."""
    pixels = np.frombuffer(image.convert("RGB").resize((THUMB_SIDE, THUMB_SIDE), Image.Resampling.BOX).tobytes(),
                           dtype=np.uint8).astype(np.float32)
    spread = float(pixels.std())
    return (pixels - float(pixels.mean())) / (spread if spread > 0 else 1.0)


def distances(thumbs: np.ndarray, one: np.ndarray) -> np.ndarray:
    """Mean absolute difference of each row of ``thumbs`` from ``one`` (0: the same picture)."""
    return np.abs(thumbs - one).mean(axis=1) if len(thumbs) else np.zeros(0, dtype=np.float32)


@dataclass
class Candidate:
    """A distinct captured image and the model's captured answer on it."""

    sha256: str
    thumb: np.ndarray  # thumbnail(image)
    detections: list[Detection]
    thresholds: Mapping[str, float] = field(default_factory=dict)
    other: list[Detection] | None = None  # the --compare-with model's answer; None: no second model
    payload: object = None  # what the caller needs to write it out (capture_source.CapturedImage)


@dataclass
class Ranked:
    candidate: Candidate
    rank: int
    score: float
    reasons: list[RankReason]


def uncertainty(detections: Sequence[Detection], thresholds: Mapping[str, float],
                margin: float) -> tuple[float, str]:
    best, detail = 0.0, ""
    for det in detections:
        threshold = thresholds.get(det.class_name, DEFAULT_THRESHOLD)
        value = max(0.0, 1.0 - abs(det.score - threshold) / margin)
        if value > best:
            best, detail = value, f"{det.class_name} {det.score:.2f} near threshold {threshold:.2f}"
    return best, detail


def weak_class(detections: Sequence[Detection], weak: Iterable[str]) -> tuple[float, str]:
    found = sorted({d.class_name for d in detections} & set(weak))
    return (1.0, f"detected weak class{'es' if len(found) > 1 else ''} {', '.join(found)}") if found else (0.0, "")


@dataclass(frozen=True)
class BoxExpectation:
    """How many boxes per image the serving model is expected to answer, and where that number came from."""

    boxes_per_image: float
    source: str


def box_expectation(baseline: MonitoringBaseline | None = None,
                    report: EvaluationReport | None = None) -> BoxExpectation:
    """The baseline's detections per val image, else the report's ground-truth instances per val image, else
    DEFAULT_EXPECTED_BOXES (module docstring, ``empty``)."""
    if baseline is not None and baseline.images > 0:
        return BoxExpectation(baseline.detections / baseline.images, f"monitoring baseline of run {baseline.run_id}")
    if report is not None:
        return BoxExpectation(sum(report.class_instances.values()) / report.val_images, "evaluation report")
    return BoxExpectation(DEFAULT_EXPECTED_BOXES, "default")


def empty(detections: Sequence[Detection], expectation: BoxExpectation) -> tuple[float, str]:
    if detections:
        return 0.0, ""
    return min(1.0, max(0.0, expectation.boxes_per_image)), (
        f"no detection; {expectation.boxes_per_image:.2f} boxes per image expected ({expectation.source})")


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def disagreement(ours: Sequence[Detection], theirs: Sequence[Detection]) -> tuple[float, str]:
    """``1 - F1`` of a greedy one-to-one match (highest IoU first, same class, IoU >= MATCH_IOU)."""
    if not ours and not theirs:
        return 0.0, ""
    pairs = sorted(((iou(a.box, b.box), i, j) for i, a in enumerate(ours) for j, b in enumerate(theirs)
                    if a.class_name == b.class_name), key=lambda p: (-p[0], p[1], p[2]))
    used_a: set[int] = set()
    used_b: set[int] = set()
    for overlap, i, j in pairs:
        if overlap < MATCH_IOU:
            break
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
    matched = len(used_a)
    value = 1.0 - 2 * matched / (len(ours) + len(theirs))
    return value, f"{matched} of {len(ours)} detections matched by the other model's {len(theirs)}"


def base_reasons(candidate: Candidate, weights: Mapping[str, float], margin: float,
                 weak: Iterable[str], expectation: BoxExpectation) -> list[RankReason]:
    terms: list[tuple[RankTerm, tuple[float, str]]] = [
        ("uncertainty", uncertainty(candidate.detections, candidate.thresholds, margin)),
        ("weak_class", weak_class(candidate.detections, weak)),
        ("empty", empty(candidate.detections, expectation)),
    ]
    if candidate.other is not None:
        terms.append(("disagreement", disagreement(candidate.detections, candidate.other)))
    return [RankReason(term=term, value=round(value, 6), weight=weights.get(term, 0.0), detail=detail)
            for term, (value, detail) in terms if value != 0 and weights.get(term, 0.0) != 0]


def _total(reasons: Iterable[RankReason]) -> float:
    return round(sum(r.weight * r.value for r in reasons), 6)


@dataclass
class RankOutcome:
    ranked: list[Ranked]
    near_duplicates: int


def rank(candidates: Sequence[Candidate], *, max_images: int, weights: Mapping[str, float] | None = None,
         margin: float = DEFAULT_MARGIN, weak: Iterable[str] = (),
         duplicate_distance: float = DEFAULT_DUPLICATE_DISTANCE,
         expectation: BoxExpectation | None = None) -> RankOutcome:
    """Pick up to ``max_images`` candidates greedily by score minus the diversity penalty (module docstring)."""
    weights = {**DEFAULT_WEIGHTS, **(weights or {})}
    weak = list(weak)
    expectation = expectation or box_expectation()
    scored = [(c, base_reasons(c, weights, margin, weak, expectation))
              for c in sorted(candidates, key=lambda c: c.sha256)]
    bases = [_total(reasons) for _, reasons in scored]
    thumbs = np.stack([c.thumb for c, _ in scored]) if scored else np.zeros((0, 3 * THUMB_SIDE ** 2))
    nearest = np.full(len(scored), np.inf)  # distance to the nearest image picked so far
    alive = np.ones(len(scored), dtype=bool)
    picked: list[Ranked] = []
    near_duplicates = 0
    diversity = weights.get("diversity", 0.0)
    while len(picked) < max_images and alive.any():
        penalties = np.clip(1.0 - nearest / DIVERSITY_RADIUS, 0.0, None) if diversity else np.zeros(len(scored))
        totals = np.where(alive, np.round(np.array(bases) - diversity * penalties, 6), -np.inf)
        index = int(np.argmax(totals))  # the first of equal scores: the smaller sha256
        candidate, reasons = scored[index]
        penalty = float(penalties[index])
        all_reasons = reasons if penalty == 0 else [*reasons, RankReason(
            term="diversity", value=-round(penalty, 6), weight=diversity,
            detail=f"thumbnail {float(nearest[index]):.2f} from an image ranked higher")]
        picked.append(Ranked(candidate=candidate, rank=len(picked) + 1, score=_total(all_reasons),
                             reasons=all_reasons))
        alive[index] = False
        # only the new pick can bring a candidate nearer; one within duplicate_distance leaves the race
        nearest = np.minimum(nearest, distances(thumbs, candidate.thumb))
        duplicates = alive & (nearest <= duplicate_distance)
        near_duplicates += int(duplicates.sum())
        alive &= ~duplicates
    return RankOutcome(ranked=picked, near_duplicates=near_duplicates)
