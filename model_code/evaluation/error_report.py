"""``report/errors.json``, the worst images drawn and the report's error section.

The worst images are the challenger's (the model being decided on), each drawn for every model side
by side: full pictures in ``report/errors/`` for ``index.html``, and smaller copies inside
errors.json as data URIs, so the console shows them through the status API without another route
or S3 permission (the status API reads errors.json only).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from d2ops_core import images as rule
from d2ops_core.documents.error_analysis import (
    BACKGROUND,
    ERRORS_NAME,
    LEGEND,
    MAX_THUMBNAIL_CHARS,
    ErrorAnalysis,
    GalleryImage,
    ModelErrors,
    SizeAP,
)
from model_code.evaluation.coco import Evaluation
from model_code.evaluation.errors import (
    CONFUSED,
    CORRECT,
    FALSE_POSITIVE,
    ImageOutcome,
    ModelAnalysis,
    model_errors,
    score_thresholds,
    worst_images,
)

PICTURE_SIDE = 800  # the report's pictures: longest side in pixels at most
THUMBNAIL_SIDE = 360  # errors.json's copies
MAX_UPSCALE = 4  # small images (a 64-px val set) are enlarged up to this so their boxes and labels read
MAX_REPORT_CLASSES = 40  # rows of the per-class AP-by-size table in index.html
_COLOUR = {v: k for k, v in LEGEND.items()}
FOUND, MISSED = _COLOUR["true object found"], _COLOUR["true object missed"]
DETECTION_COLOUR = {CORRECT: _COLOUR["correct detection"], CONFUSED: _COLOUR["detection of the wrong class"],
                    FALSE_POSITIVE: _COLOUR["false positive"]}


def draw_errors(image: Image.Image, outcome: ImageOutcome, names: Mapping[int, str], side: int) -> Image.Image:
    """The image scaled to fit ``side`` (enlarged MAX_UPSCALE times at most), true boxes (found, missed)
    and detections by outcome."""
    scale = min(float(MAX_UPSCALE), side / max(image.size))
    canvas = image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    draw = ImageDraw.Draw(canvas)

    def box(bbox: list[float]) -> list[float]:
        x, y, w, h = (float(v) * scale for v in bbox)
        return [x, y, x + max(w, 1.0), y + max(h, 1.0)]

    for ann, found in outcome.objects:
        draw.rectangle(box(ann["bbox"]), outline=FOUND if found else MISSED, width=1 if found else 3)
        if not found:
            x0, y0, _, y1 = box(ann["bbox"])
            draw.text((x0 + 2, y1 - 11), f"missed {names.get(int(ann['category_id']), '?')}", fill=MISSED)
    for det in outcome.detections:
        colour = DETECTION_COLOUR.get(det.kind)
        if colour is None:  # ignored: on a crowd region of its class
            continue
        x0, y0, _, _ = coords = box(det.bbox)
        draw.rectangle(coords, outline=colour, width=2)
        label = f"{names.get(det.category_id, '?')} {det.score:.2f}"
        if det.kind == CONFUSED and det.true_category_id is not None:
            label += f" (is {names.get(det.true_category_id, '?')})"
        draw.text((x0 + 2, y0 + 1), label, fill=colour)
    return canvas


def data_uri(picture: Image.Image) -> str:
    """A JPEG data URI under MAX_THUMBNAIL_CHARS (quality, then size, lowered until it fits)."""
    for quality, side in ((80, THUMBNAIL_SIDE), (60, THUMBNAIL_SIDE), (60, 240), (50, 160)):
        small = picture.copy()
        small.thumbnail((side, side))
        buffer = io.BytesIO()
        small.save(buffer, format="JPEG", quality=quality)
        uri = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
        if len(uri) <= MAX_THUMBNAIL_CHARS:
            return uri
    raise ValueError("a 160-pixel JPEG over the thumbnail bound")  # cannot happen: 160x160x3 bytes fit


def analyse_models(gt: dict[str, Any], evaluations: Mapping[str, Evaluation],
                   thresholds: Mapping[str, Mapping[str, float] | None]
                   ) -> tuple[dict[str, ModelErrors], dict[str, ModelAnalysis]]:
    names = [str(c["name"]) for c in gt["categories"]]
    docs: dict[str, ModelErrors] = {}
    analyses: dict[str, ModelAnalysis] = {}
    for who, ev in evaluations.items():
        per_class, source = score_thresholds(names, thresholds.get(who))
        docs[who], analyses[who] = model_errors(gt, ev, per_class, source)
    return docs, analyses


def write_errors(directory: Path, evaluations: Mapping[str, Evaluation], gt: dict[str, Any], images_dir: Path,
                 thresholds: Mapping[str, Mapping[str, float] | None]) -> tuple[ErrorAnalysis, str]:
    """Write errors.json and the drawn worst images under ``directory``; returns the document and the
    HTML section for index.html."""
    models, analyses = analyse_models(gt, evaluations, thresholds)
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    info = {int(i["id"]): i for i in gt["images"]}
    pictures_dir = directory / "errors"
    pictures_dir.mkdir(parents=True, exist_ok=True)
    gallery: list[GalleryImage] = []
    for worst in worst_images(analyses["challenger"].images):
        entry = GalleryImage(image_id=worst.image_id, file_name=worst.file_name, errors={}, pictures={})
        path = images_dir / str(info[worst.image_id]["file_name"])
        with rule.load_rgb(path, str(info[worst.image_id]["file_name"])) as image:  # upright, as evaluated
            for who, analysis in analyses.items():
                outcome = analysis.outcomes[worst.image_id]
                name = f"errors/{who}_{worst.image_id}.jpg"
                draw_errors(image, outcome, names, PICTURE_SIDE).save(directory / name, format="JPEG", quality=90)
                entry.pictures[who] = name
                entry.thumbnails[who] = data_uri(draw_errors(image, outcome, names, THUMBNAIL_SIDE))
                entry.errors[who] = next(e for e in analysis.images if e.image_id == worst.image_id)
        gallery.append(entry)
    doc = ErrorAnalysis(models=models, gallery=gallery)
    tmp = directory / (ERRORS_NAME + ".tmp")
    tmp.write_text(doc.model_dump_json(), encoding="utf-8")
    tmp.replace(directory / ERRORS_NAME)
    return doc, errors_section(doc)


def _ap(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _size_row(label: str, sizes: Mapping[str, SizeAP]) -> str:
    cells = "".join(f"<td>{_ap(s.small)}</td><td>{_ap(s.medium)}</td><td>{_ap(s.large)}</td>" for s in sizes.values())
    return f"<tr><th>{html.escape(label)}</th>{cells}</tr>"


def errors_section(doc: ErrorAnalysis) -> str:
    """The report's error section: AP by size, each model's confusion matrix as a heat table, the gallery."""
    who = list(doc.models)
    header = "".join(f"<th colspan=3>{html.escape(w)}</th>" for w in who)
    sizes = "<th>small</th><th>medium</th><th>large</th>" * len(who)
    parts = [f"<h2 id='errors'>Errors (IoU {doc.iou_threshold}, detections at or above their class's score "
             "threshold)</h2>"]
    for iou in doc.models["challenger"].ap_by_size:  # bbox, and segm for instance segmentation
        classes = sorted({c for m in doc.models.values() for c in m.per_class_ap_by_size.get(iou, {})})
        rows = [_size_row("all classes", {w: m.ap_by_size.get(iou, SizeAP()) for w, m in doc.models.items()})]
        rows += [_size_row(c, {w: m.per_class_ap_by_size.get(iou, {}).get(c, SizeAP())
                               for w, m in doc.models.items()}) for c in classes[:MAX_REPORT_CLASSES]]
        more = (f"<p>{len(classes) - MAX_REPORT_CLASSES} more classes in {ERRORS_NAME}</p>"
                if len(classes) > MAX_REPORT_CLASSES else "")
        parts.append(f"<h3>{iou} AP by object size</h3><table border=1 class='ap-by-size' data-iou='{iou}'>"
                     f"<tr><th></th>{header}</tr><tr><th>class</th>{sizes}</tr>{''.join(rows)}</table>{more}")
    for w, m in doc.models.items():
        parts.append(f"<h3>{html.escape(w)}: confusion matrix (rows: true class, columns: predicted; "
                     f"thresholds: {m.thresholds_from})</h3>" + matrix_table(m, w))
    legend = " ".join(f"<span style='color:{c}'>&#9632; {html.escape(t)}</span>" for c, t in doc.legend.items())
    gallery_rows = []
    for g in doc.gallery:
        cells = "".join(
            f"<td><img src='{html.escape(g.pictures[w])}'><br>{html.escape(w)}: {g.errors[w].missed} missed, "
            f"{g.errors[w].false_positives} false positives, {g.errors[w].confused} confused</td>"
            for w in who if w in g.pictures)
        gallery_rows.append(f"<tr><td>{html.escape(g.file_name)}</td>{cells}</tr>")
    parts.append(f"<h3>The challenger's worst val images</h3><p>{html.escape(doc.error_score)}</p><p>{legend}</p>"
                 f"<table id='worst-images'>{''.join(gallery_rows)}</table>" if gallery_rows
                 else "<h3>The challenger's worst val images</h3><p>no errors at these thresholds</p>")
    return "".join(parts)


def matrix_table(model: ModelErrors, who: str) -> str:
    """The matrix as a table whose cells are shaded by their share of the row (a heat map in HTML)."""
    m = model.confusion
    head = "".join(f"<th>{html.escape(label)}</th>" for label in m.labels)
    body = []
    for label, row in zip(m.labels, m.counts, strict=True):
        total = sum(row) or 1
        cells = []
        for j, n in enumerate(row):
            share = n / total
            diagonal = m.labels[j] == label and label != BACKGROUND
            colour = f"rgba(30,144,255,{share:.2f})" if diagonal else f"rgba(255,0,0,{share:.2f})"
            cells.append(f"<td style='background:{colour}'>{n}</td>")
        body.append(f"<tr><th>{html.escape(label)}</th>{''.join(cells)}</tr>")
    folded = f"<p>{len(m.folded)} classes folded into one row and column</p>" if m.folded else ""
    return (f"<table border=1 class='confusion' data-model='{html.escape(who)}'><tr><th>true \\ predicted</th>"
            f"{head}</tr>{''.join(body)}</table>{folded}")
