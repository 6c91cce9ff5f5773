"""COCO in and out, for labelling tools without a d2ops command (CVAT's *COCO 1.0* format, and any other).

- :func:`export_coco` writes a selection as ``annotations.json`` (COCO instances: the model's detections as
  boxes, with their ``score``) and ``images/<sha256>.<ext>``: create a CVAT task from ``images/`` and upload
  ``annotations.json`` as *COCO 1.0* annotations, and the labellers correct the model's boxes.
- :func:`read_coco_labels` reads a tool's COCO export back as labelled images, which
  :mod:`d2ops.labelling.new_version` turns into a new dataset version exactly as a Label Studio import.

Categories are matched by **name** to the dataset's classes (tools renumber ids); a category that is not a
class is refused. Each annotation's ``bbox`` is taken (a polygon's ``segmentation`` is not: the detectors
train on boxes). An image without annotations is left out and counted: a COCO export cannot tell an
unlabelled image from a labelled empty one (Label Studio can: a completed task without boxes is imported).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d2ops.labelling.documents import SelectionError, read_selection
from d2ops.labelling.labelstudio import Box, LabelledImage, LabellingError, check_selection
from d2ops_core.images import ImageRejected, load_rgb
from d2ops_core.validation.manifest import unsafe_relative_path

ANNOTATIONS_FILE = "annotations.json"


def export_coco(selection_dir: str | Path, out: Path) -> int:
    """Write the selection to ``out`` (which must not exist) as COCO + images; the number of images."""
    try:
        selection = read_selection(selection_dir)
    except SelectionError as exc:
        raise LabellingError(str(exc)) from None
    images = check_selection(str(selection_dir), selection)
    if out.exists():
        raise LabellingError(f"{out} already exists; choose another directory")
    category = {name: i + 1 for i, name in enumerate(selection.class_names)}
    document: dict[str, Any] = {"images": [], "annotations": [],
                                "categories": [{"id": i, "name": n} for n, i in category.items()]}
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        (tmp / "images").mkdir(parents=True)
        for image_id, image in enumerate(selection.images, start=1):
            name = image.file.rsplit("/", 1)[-1]
            (tmp / "images" / name).write_bytes(images[image.sha256])
            document["images"].append({"id": image_id, "file_name": name, "width": image.width,
                                       "height": image.height})
            for det in image.detections:
                x1, y1, x2, y2 = det.box
                document["annotations"].append({
                    "id": len(document["annotations"]) + 1, "image_id": image_id,
                    "category_id": category[det.class_name], "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1), "iscrowd": 0, "score": det.score})
        (tmp / ANNOTATIONS_FILE).write_text(json.dumps(document))
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return len(selection.images)


@dataclass
class CocoRead:
    labelled: list[LabelledImage]
    without_boxes: int


def read_coco_labels(coco_file: Path, images_dir: Path, classes: list[str]) -> CocoRead:
    """The labelled images of a COCO instances file whose ``file_name`` values are relative to ``images_dir``."""
    try:
        document = json.loads(coco_file.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep for json.loads
        raise LabellingError(f"{coco_file}: not readable COCO JSON: {exc}") from None
    if not isinstance(document, dict) or not all(isinstance(document.get(k), list)
                                                  for k in ("images", "annotations", "categories")):
        raise LabellingError(f"{coco_file}: not a COCO instances file (needs images, annotations, categories lists)")
    names: dict[Any, str] = {}
    for i, cat in enumerate(document["categories"]):
        name = str(cat.get("name")) if isinstance(cat, dict) else None
        if name not in classes:
            raise LabellingError(f"{coco_file}: categories[{i}] {name!r} is not one of the dataset's classes "
                                 f"{classes}")
        names[cat.get("id")] = name
    boxes: dict[Any, list[Box]] = {}
    for i, ann in enumerate(document["annotations"]):
        where = f"{coco_file}: annotations[{i}]"
        if not isinstance(ann, dict) or ann.get("category_id") not in names:
            raise LabellingError(f"{where}: category_id {ann.get('category_id') if isinstance(ann, dict) else ann!r} "
                                 "is not a category of the file")
        bbox = ann.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, int | float) for v in bbox)
                and all(math.isfinite(v) for v in bbox) and bbox[2] > 0 and bbox[3] > 0):
            raise LabellingError(f"{where}: bbox {bbox!r} is not [x, y, width, height] with a positive size")
        boxes.setdefault(ann.get("image_id"), []).append(
            Box(names[ann["category_id"]], (round(bbox[0], 2), round(bbox[1], 2), round(bbox[2], 2),
                                            round(bbox[3], 2))))
    out: list[LabelledImage] = []
    without = 0
    for i, im in enumerate(document["images"]):
        if not isinstance(im, dict) or im.get("id") not in boxes:
            without += 1
            continue
        name = str(im.get("file_name", ""))
        path = images_dir / name
        where = f"{coco_file}: images[{i}] ({path})"
        # Only files under --images go into the version (and, with --upload, to the data bucket): a file_name
        # such as ../../home/me/id.jpg, or a link out of the directory, is refused rather than copied.
        unsafe = unsafe_relative_path(name)
        if unsafe is None and not path.resolve().is_relative_to(images_dir.resolve()):
            unsafe = "leads outside the images directory (a symbolic link)"
        if unsafe is not None:
            raise LabellingError(f"{coco_file}: images[{i}] file_name {name!r} {unsafe}")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise LabellingError(f"{where}: cannot read the image: {exc.strerror or exc}") from None
        try:
            width, height = load_rgb(io.BytesIO(data), where, verify=True).size
        except ImageRejected as exc:
            raise LabellingError(f"{where} does not decode: {exc.message}") from None
        out.append(LabelledImage(task_id=int(im["id"]) if isinstance(im.get("id"), int) else i,
                                 sha256=hashlib.sha256(data).hexdigest(), data=data,
                                 extension="png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "jpg", width=width,
                                 height=height, boxes=tuple(boxes[im["id"]]), annotation_id=0))
    return CocoRead(labelled=out, without_boxes=without)
