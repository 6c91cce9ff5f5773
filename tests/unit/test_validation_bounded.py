"""check_split's bounded reader against the whole-file decoder it stands in for.

A well-formed COCO file is read a window at a time (``coco._check_bounded``: the top-level object
key by key, the arrays cut after a '}' and verified by msgspec); anything unusual goes to the
whole-file decoder (``coco._decode``), whose findings are the reference. Here the window shrinks to
a few hundred bytes, so every document spans many windows: cuts after nested objects, '}' inside
strings, an array that ends inside a window, an element larger than the window. Each document's
findings (codes, messages, locations, counts) and statistics must be identical both ways, and the
well-formed ones must not have fallen back (else the comparison would prove nothing).
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path
from typing import Any

import pytest

from d2ops.bench.cocogen import write_coco_like
from d2ops_core.validation import coco
from d2ops_core.validation.codes import Code
from d2ops_core.validation.report import IssueLog

SMALL_WINDOW = 256


def _outcome(log: IssueLog, result: coco.SplitResult | None) -> Any:
    summary = None if result is None else (
        [(i.index, i.file_name, i.width, i.height) for i in result.images], result.categories,
        result.category_index, dict(result.instances), result.stats and result.stats.model_dump())
    return dict(log.counts), [i.model_dump() for i in log.kept], summary


def _check(data: Any, *, bounded: bool, task: str = "detection") -> Any:
    log = IssueLog()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coco, "WINDOW", SMALL_WINDOW)
        if bounded:
            def no_fallback(*_: Any, **__: Any) -> None:
                raise AssertionError("the bounded reader fell back to the whole-file decoder")
            mp.setattr(coco, "_decode", no_fallback)
        else:
            def refuse(*_: Any, **__: Any) -> None:
                raise coco._Fallback
            mp.setattr(coco, "_check_bounded", refuse)
        result = coco.check_split(data, "train", "annotations/train.json", log, task=task)
    return _outcome(log, result)


def _generated(tmp_path: Path) -> dict[str, Any]:
    path = write_coco_like(tmp_path / "train.json", images=30, instances=400, categories=6, seed=5)
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _messy(doc: dict[str, Any]) -> dict[str, Any]:
    """Findings of most kinds, and the shapes that make a window's cut land in the wrong place."""
    anns, images = doc["annotations"], doc["images"]
    anns[1]["id"] = anns[0]["id"]  # dense duplicate id
    anns[2]["id"] = anns[3]["id"] = 900100000001  # sparse duplicates (train2017's crowd ids look so)
    anns[4]["id"] = anns[5]["id"] = -7  # negative duplicates
    anns[6]["image_id"] = 10**9  # unknown image
    anns[7]["category_id"] = 999  # unknown category
    anns[8]["bbox"] = [600.0, 400.0, 300.0, 300.0]  # outside its image
    anns[9]["bbox"] = "wide"
    anns[10]["iscrowd"] = 3
    anns[11]["area"] = -1
    del anns[12]["segmentation"]
    anns[13]["segmentation"] = [[1.0, 2.0, 3.0]]  # a malformed polygon
    anns[14]["segmentation"] = {"size": [1, 2], "counts": [2]}  # an RLE of the wrong size
    for ann in anns[20:60]:  # nested objects: '}, {' inside an element, '},' before a key
        ann["attributes"] = [{"occluded": False}, {"note": "}, {\"id\": 1}]"}]
    anns[61]["segmentation"] = [[float(k % 50) for k in range(4000)]]  # longer than a window
    images[0]["file_name"] = "a}, {b].jpg"  # '}, {' and ']' inside a string
    images[1]["width"] = "640"
    images.append(dict(images[2], id=images[2]["id"] + 10**6))  # an image without annotations
    doc["categories"][1]["name"] = {"nested": [{"x": 1}, {"y": 2}]}  # a wrong type with nested objects
    return doc


def _reordered(doc: dict[str, Any]) -> dict[str, Any]:
    """Keys in another order (categories last is COCO's own), unknown keys around the arrays."""
    return {"categories": doc["categories"], "info": {"a": [{"b": "}, {"}, {"c": [[], {}]}]},
            "annotations": doc["annotations"], "licenses": [{"id": 1}, {"id": 2, "url": "x"}],
            "images": doc["images"], "extra": 12.5}


@pytest.mark.parametrize("shape", ["as written", "indented, reordered", "messy", "messy, indented, reordered"])
def test_the_bounded_reader_finds_what_the_whole_file_decoder_finds(tmp_path: Path, shape: str) -> None:
    doc = _generated(tmp_path)
    if "messy" in shape:
        doc = _messy(doc)
    if "reordered" in shape:
        doc = _reordered(doc)
    text = json.dumps(doc, indent=2 if "indented" in shape else None)
    if shape == "as written":
        text = (tmp_path / "train.json").read_text()
    data = text.encode()
    for task in ("detection", "instance_segmentation"):
        bounded = _check(data, bounded=True, task=task)
        assert bounded == _check(data, bounded=False, task=task), (shape, task)
    assert bounded[2] is not None and bounded[2][4]["instances"] > 300
    if "messy" in shape:
        for code in (Code.DUPLICATE_ANNOTATION_ID, Code.ANNOTATION_IMAGE_UNKNOWN, Code.BBOX_OUTSIDE_IMAGE,
                     Code.POLYGON_MALFORMED, Code.RLE_SIZE_MISMATCH, Code.IMAGE_WITHOUT_ANNOTATIONS):
            assert bounded[0].get(code), (code, bounded[0])
        assert bounded[0][Code.DUPLICATE_ANNOTATION_ID] == 3


def test_an_mmap_is_read_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "train.json"
    path.write_text(json.dumps(_reordered(_messy(_generated(tmp_path)))))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert _check(mm, bounded=True) == _check(path.read_bytes(), bounded=False)


@pytest.mark.parametrize("document", [
    b'{"images": [], "annotations": [], "categories": []}',
    b'{}',
    b'  {"categories": [{"id": 1, "name": "a"}]}  \n',
    b'{"images": [{"id": 1, "file_name": "a.jpg", "width": 4, "height": 4}], "annotations": [{"id": 1, '
    b'"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "area": 1}], "categories": [{"id": 1, "name": "a"}]}',
])
def test_small_and_empty_documents(document: bytes) -> None:
    assert _check(document, bounded=True) == _check(document, bounded=False)


@pytest.mark.parametrize("document", [
    b'{"images": [], "annotations": [{"id": 1, "bbox": [NaN, 0, 1, 1]}], "categories": []}',
    b'{"images": [], "annotations": [{"id": 1, "area": 1e999}], "categories": []}',
    b'{"images": [], "annotations": [1, 2], "categories": []}',
    b'{"images": null, "annotations": [], "categories": []}',
    b'{"images": [], "images": [], "annotations": [], "categories": []}',
    b'{"images": [], "ann\\u006ftations": [], "categories": []}',
    b'{"images": [], "annotations": [], "categories": []} []',
    b'{"images": [], "annotations": [{"id": 1}',
    b'{"images": [], "annotations": [], "categories": [], "info": ' + b"[" * 600 + b"]" * 600 + b"}",
    b'[]',
    b'\xef\xbb\xbf{}',
])
def test_what_the_bounded_reader_leaves_to_the_whole_file_decoder(document: bytes) -> None:
    """Each of these falls back before any finding is kept, so its findings are the reference's own."""
    log = IssueLog()
    with pytest.raises(coco._Fallback):
        coco._check_bounded(document, "train", "train.json", log, "detection", coco.Thresholds())
    assert not log.kept and not log.counts
    assert _check(document, bounded=False) == _outcome(*_checked(document))


def _checked(document: bytes) -> tuple[IssueLog, coco.SplitResult | None]:
    log = IssueLog()
    return log, coco.check_split(document, "train", "annotations/train.json", log)


def test_the_id_set_tells_repeats_apart_whatever_the_id() -> None:
    ids = coco._IdSet()
    late = coco._IdSet.MIN_DENSE + 5  # sparse now; inside the dense range once 200k ids are in
    values = [0, 1, 7, 8, 1 << 20, late, 900100000001, -1, -(2**63), 2**63 - 1]
    assert all(ids.add(v) for v in values)
    assert not any(ids.add(v) for v in values)
    assert all(ids.add(v) for v in range(2 << 20, (2 << 20) + 200_000))
    assert not ids.add(late) and not ids.add(2 << 20) and ids.add(2)
    # a bit per id numbered densely; the sparse ones in the set
    assert len(ids.bits) <= 2 * coco._IdSet.MIN_DENSE // 8
    assert ids.sparse == {late, 900100000001, -1, -(2**63), 2**63 - 1}


def _check_either(data: bytes, window: int) -> Any:
    """check_split as it runs (bounded, falling back when it must) at a given window."""
    log = IssueLog()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coco, "WINDOW", window)
        result = coco.check_split(data, "train", "annotations/train.json", log)
    return _outcome(log, result)


def test_mutated_and_damaged_documents_read_the_same_both_ways(tmp_path: Path) -> None:
    """Hypothesis' hostile documents (test_validation_properties' strategy): whether the bounded
    reader reads them or gives up, the findings are the whole-file decoder's."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from d2ops import synth
    from tests.unit.test_validation_properties import FAST, mutated_document

    synth.generate(tmp_path / "ds", images=6, seed=3, size=32)
    base = json.loads((tmp_path / "ds/annotations/train.json").read_text())

    @settings(FAST, max_examples=120)
    @given(data=st.booleans().flatmap(lambda damage: mutated_document(base, damage=damage)),
           window=st.sampled_from([48, 256, 1 << 20]))
    def check(data: bytes, window: int) -> None:
        assert _check_either(data, window) == _check(data, bounded=False)

    check()
