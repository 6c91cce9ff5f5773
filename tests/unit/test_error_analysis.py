"""Error analysis (report/errors.json) with known answers: the matrix's cells, thresholds, the worst
images, folding many classes, AP by size against pycocotools, and the drawn pictures."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO as RefCOCO
from pycocotools.cocoeval import COCOeval as RefCOCOeval
from pydantic import ValidationError

from d2ops_core.documents.error_analysis import (
    BACKGROUND,
    ERRORS_NAME,
    LEGEND,
    OTHER_CLASSES,
    ConfusionMatrix,
    ErrorAnalysis,
)
from model_code.evaluation.coco import score_results
from model_code.evaluation.errors import (
    CONFUSED,
    CORRECT,
    FALSE_POSITIVE,
    IGNORED,
    analyse,
    confusion_matrix,
    match_image,
    model_errors,
    score_thresholds,
    worst_images,
)
from model_code.evaluation.report import write_report

A, B = 3, 7  # non-contiguous category ids, as real datasets have
CATEGORIES = [{"id": A, "name": "cat"}, {"id": B, "name": "dog"}]


def ann(aid: int, image_id: int, cat: int, bbox: list[float], crowd: bool = False) -> dict[str, Any]:
    return {"id": aid, "image_id": image_id, "category_id": cat, "bbox": bbox, "area": bbox[2] * bbox[3],
            "iscrowd": int(crowd)}


def det(image_id: int, cat: int, bbox: list[float], score: float) -> dict[str, Any]:
    return {"image_id": image_id, "category_id": cat, "bbox": bbox, "score": score}


# image 1: a cat found (and found twice), a dog taken for a cat, a cat missed, a crowd of cats,
# a dog on nothing, a cat under the threshold
GT = {"images": [{"id": 1, "file_name": "one.png", "width": 200, "height": 120},
                 {"id": 2, "file_name": "two.png", "width": 200, "height": 120}],
      "categories": CATEGORIES,
      "annotations": [ann(1, 1, A, [10, 10, 40, 40]), ann(2, 1, B, [60, 10, 40, 40]),
                      ann(3, 1, A, [110, 10, 40, 40]), ann(4, 1, A, [10, 60, 60, 50], crowd=True),
                      ann(5, 2, B, [20, 20, 50, 50])]}
RESULTS = [det(1, A, [11, 11, 40, 40], 0.9),      # correct
           det(1, A, [10, 12, 40, 40], 0.8),      # duplicate of the found cat: a false positive
           det(1, A, [61, 10, 40, 40], 0.7),      # on the dog: confused (true dog, predicted cat)
           det(1, B, [150, 70, 30, 30], 0.6),     # nothing there: a false positive
           det(1, A, [15, 65, 40, 40], 0.95),     # inside the crowd of cats: ignored
           det(1, A, [110, 10, 40, 40], 0.3),     # the missed cat, under the threshold: not counted
           det(2, B, [20, 20, 50, 50], 0.99)]     # correct
DEFAULT = {"cat": 0.5, "dog": 0.5}


def test_each_cell_of_the_matrix_has_its_known_count() -> None:
    analysis = analyse(GT, RESULTS, DEFAULT)
    # rows: true cat, dog, background; columns: predicted cat, dog, background
    assert analysis.counts.tolist() == [[1, 0, 1],   # one cat found, one missed
                                        [1, 1, 0],   # a dog taken for a cat (row dog, column cat), one found
                                        [1, 1, 0]]   # false positives: the duplicate cat, the dog on nothing
    one, two = analysis.images
    assert (one.objects, one.correct, one.confused, one.missed, one.false_positives) == (3, 1, 1, 1, 2)
    assert one.error_score == 4 and one.wrong_score_sum == pytest.approx(0.7 + 0.8 + 0.6)
    assert (two.error_score, two.correct) == (0, 1)


def test_the_document_has_a_background_row_and_column_and_rows_sum_to_objects() -> None:
    doc, _ = model_errors(GT, score_results(GT, RESULTS, ["bbox"]), DEFAULT, "default")
    m = doc.confusion
    assert m.labels == ["cat", "dog", BACKGROUND]
    objects = {"cat": 2, "dog": 2}  # non-crowd
    assert {label: sum(row) for label, row in zip(m.labels[:-1], m.counts[:-1], strict=True)} == objects
    t = doc.totals
    assert (t.objects, t.detections, t.correct, t.confused, t.missed, t.false_positives) == (4, 5, 2, 1, 1, 2)
    assert [w.image_id for w in doc.worst_images] == [1]  # image 2 has no error: not listed
    with pytest.raises(ValidationError, match="background"):
        ConfusionMatrix(labels=["cat", "dog"], counts=[[1, 0], [0, 1]])


def test_a_class_named_background_is_a_class_of_its_own() -> None:
    """Mutation: the background row found by its name (a dataset's class 'background' then fails the
    evaluation job, or its objects are read as false positives)."""
    named = {**GT, "categories": [{"id": A, "name": "background"}, {"id": B, "name": "dog"}]}
    doc, _ = model_errors(named, score_results(named, RESULTS, ["bbox"]), {"background": 0.5, "dog": 0.5}, "default")
    assert doc.confusion.labels == ["background", "dog", BACKGROUND]
    assert doc.confusion.counts == [[1, 0, 1], [1, 1, 0], [1, 1, 0]]  # the cat matrix, under the other name


def test_each_box_gets_its_outcome() -> None:
    outcome = match_image(GT["annotations"][:4], [r for r in RESULTS if r["image_id"] == 1 and r["score"] >= 0.5])
    kinds = [(d.score, d.kind, d.true_category_id) for d in outcome.detections]
    assert kinds == [(0.95, IGNORED, None), (0.9, CORRECT, A), (0.8, FALSE_POSITIVE, None), (0.7, CONFUSED, B),
                     (0.6, FALSE_POSITIVE, None)]
    assert [(a["id"], found) for a, found in outcome.objects] == [(1, True), (2, True), (3, False)]  # crowd left out


def test_a_detection_prefers_its_own_class_over_a_better_overlap_of_another() -> None:
    """Pass 1 is per class: a cat box overlapping a dog better than the cat still takes the cat."""
    gts = [ann(1, 1, A, [0, 0, 40, 40]), ann(2, 1, B, [4, 0, 40, 40])]
    outcome = match_image(gts, [det(1, A, [3, 0, 40, 40], 0.9)])
    assert [(d.kind, d.true_category_id) for d in outcome.detections] == [(CORRECT, A)]
    assert [found for _, found in outcome.objects] == [True, False]


def test_the_class_thresholds_decide_what_counts() -> None:
    thresholds, source = score_thresholds(["cat", "dog"], {"cat": 0.85})
    assert (thresholds, source) == ({"cat": 0.85, "dog": 0.5}, "artifact")
    assert score_thresholds(["cat", "dog"], None) == (DEFAULT, "default")
    counts = analyse(GT, RESULTS, thresholds).counts
    # the duplicate (0.8) and the confused cat (0.7) no longer count: the dog is now missed
    assert counts.tolist() == [[1, 0, 1], [0, 1, 1], [0, 1, 0]]
    low = analyse(GT, RESULTS, {"cat": 0.25, "dog": 0.5}).counts  # the 0.3 cat now finds the missed one
    assert low[0].tolist() == [2, 0, 0]


def test_the_worst_images_come_first_by_the_documented_score() -> None:
    gt = {"images": [{"id": i, "file_name": f"{i}.png"} for i in range(1, 6)], "categories": CATEGORIES,
          "annotations": [ann(1, 1, A, [0, 0, 10, 10]), ann(2, 2, A, [0, 0, 10, 10]), ann(3, 2, A, [20, 0, 10, 10]),
                          ann(4, 4, A, [0, 0, 10, 10])]}
    results = [det(3, B, [50, 50, 10, 10], 0.6),   # image 3: one false positive at 0.6
               det(4, B, [50, 50, 10, 10], 0.9),   # image 4: one false positive at 0.9 and one missed cat
               det(5, A, [0, 0, 10, 10], 0.95)]    # image 5: one false positive at 0.95
    images = analyse(gt, results, DEFAULT).images
    ranked = [(w.image_id, w.error_score) for w in worst_images(images)]
    # 2 (two missed) and 4 (missed + fp) tie at 2: 4's wrong detection scores higher; then 5 (0.95) before
    # 1 (missed, no score) and 3 (0.6)
    assert ranked == [(4, 2), (2, 2), (5, 1), (3, 1), (1, 1)]
    assert len(worst_images(images, limit=2)) == 2


def test_many_classes_fold_into_one_row_keeping_totals() -> None:
    k = 35
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, size=(k + 1, k + 1))
    counts[k, k] = 0
    counts[7, :k] += 40  # class 7 is confused a lot
    labels = [f"c{i}" for i in range(k)]
    m = confusion_matrix(labels, counts, max_classes=10)
    assert len(m.labels) == 11 and m.labels[-2:] == [OTHER_CLASSES, BACKGROUND]
    assert "c7" in m.labels and len(m.folded) == k - 9 and "c7" not in m.folded
    folded = np.asarray(m.counts)
    assert folded.sum() == counts.sum()
    assert folded[-1].sum() == counts[k].sum() and folded[:, -1].sum() == counts[:, k].sum()  # background kept
    i = m.labels.index("c7")
    assert folded[i].tolist() == [counts[7, labels.index(c)] if c in labels else None
                                  for c in m.labels[:-2]] + [counts[7, [labels.index(c) for c in m.folded]].sum(),
                                                             counts[7, k]]


def test_ap_by_size_per_class_agrees_with_pycocotools(tmp_path: Path) -> None:
    from d2ops import synth
    from model_code.dataset_version import read_coco
    from tests.unit.test_training_coco_eval import noisy_detections

    synth.generate(tmp_path, images=30, size=160, seed=5, val_fraction=0.5)
    gt = read_coco(tmp_path / "annotations" / "val.json")
    with_masks = noisy_detections(gt, seed=2)
    results = [{k: v for k, v in r.items() if k != "segmentation"} for r in with_masks]
    ev = score_results(gt, with_masks, ["bbox", "segm"])
    doc, _ = model_errors(gt, ev, score_thresholds([c["name"] for c in gt["categories"]], None)[0], "default")
    assert set(doc.ap_by_size) == set(doc.per_class_ap_by_size) == {"bbox", "segm"}  # masks: both IoU types
    ref_gt = RefCOCO()
    ref_gt.dataset = gt
    ref_gt.createIndex()
    ref = RefCOCOeval(ref_gt, ref_gt.loadRes(results), "bbox")
    ref.evaluate()
    ref.accumulate()
    ref.summarize()
    overall = doc.ap_by_size["bbox"]
    for value, stat in ((overall.small, ref.stats[3]), (overall.medium, ref.stats[4]), (overall.large, ref.stats[5])):
        assert value == (None if stat < 0 else pytest.approx(stat, abs=1e-9))
    checked = 0
    for k, cat in enumerate(ref.params.catIds):
        name = next(c["name"] for c in gt["categories"] if c["id"] == cat)
        for a, size in enumerate(("small", "medium", "large"), start=1):
            p = ref.eval["precision"][:, :, k, a, -1]
            sizes = doc.per_class_ap_by_size["bbox"].get(name)
            ours = getattr(sizes, size) if sizes else None
            if (p > -1).any():
                assert ours == pytest.approx(float(p[p > -1].mean()), abs=1e-9), (name, size)
                checked += 1
            else:
                assert ours is None
    assert checked >= 3


def _pictures(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    images.mkdir()
    for info in GT["images"]:
        Image.new("RGB", (info["width"], info["height"]), (128, 128, 128)).save(images / info["file_name"])
    return images


def sample_report(tmp_path: Path) -> Path:
    """A real report of two models on GT (the champion keeps only its detections over 0.85); its index.html."""
    images = _pictures(tmp_path)
    challenger = score_results(GT, RESULTS, ["bbox"])
    champion = score_results(GT, [r for r in RESULTS if r["score"] > 0.85], ["bbox"])
    return write_report(tmp_path / "report", {"challenger": challenger, "champion": champion}, GT, images,
                        sample_images=1, score_thresholds={"challenger": {"cat": 0.5, "dog": 0.5}, "champion": None})


def test_the_report_writes_errors_json_and_draws_the_worst_images(tmp_path: Path) -> None:
    index = sample_report(tmp_path)
    out = index.parent
    doc = ErrorAnalysis.model_validate_json((out / ERRORS_NAME).read_text())
    assert set(doc.models) == {"challenger", "champion"}
    assert [m.thresholds_from for m in doc.models.values()] == ["artifact", "default"]
    assert doc.models["champion"].confusion.counts == [[1, 0, 1], [0, 1, 1], [0, 0, 0]]  # misses, no wrong box
    [worst] = doc.gallery  # image 2 has no challenger error
    assert worst.image_id == 1 and set(worst.pictures) == set(worst.thumbnails) == {"challenger", "champion"}
    assert (worst.errors["challenger"].error_score, worst.errors["champion"].error_score) == (4, 2)
    colour = {text: tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c, text in LEGEND.items()}
    with Image.open(out / worst.pictures["challenger"]) as picture:
        assert picture.size == (800, 480)  # a 200x120 image, enlarged 4 times (MAX_UPSCALE) so it reads
        # edges drawn where the boxes are: the false-positive dog, the confused cat on the dog, the missed cat
        assert _near(picture.getpixel((4 * 165, 4 * 70)), colour["false positive"])
        assert _near(picture.getpixel((4 * 80, 4 * 10)), colour["detection of the wrong class"])
        assert _near(picture.getpixel((4 * 130, 4 * 50 - 1)), colour["true object missed"])
    with Image.open(out / worst.pictures["champion"]) as picture:  # the champion is drawn, not a copy
        assert not _near(picture.getpixel((4 * 165, 4 * 70)), colour["false positive"])
    uri = worst.thumbnails["champion"]
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as thumb:
        assert thumb.format == "JPEG" and max(thumb.size) <= 360
    page = index.read_text()
    assert "class='ap-by-size' data-iou='bbox'" in page and page.count("class='confusion'") == 2
    assert f"src='{worst.pictures['champion']}'" in page
    assert json.loads((out / ERRORS_NAME).read_text())["models"]["challenger"]["confusion"]["labels"][-1] == BACKGROUND


def _near(pixel: Any, rgb: tuple[int, ...], tolerance: int = 60) -> bool:
    return all(abs(int(p) - c) <= tolerance for p, c in zip(pixel, rgb, strict=False))
