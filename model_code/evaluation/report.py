"""The human-readable evaluation report: per-class PR curves and val images with predictions drawn.

``report/index.html`` links ``pr_curves.png`` and ``samples/*.png``; everything is static
so it can be opened from S3 or a laptop.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from d2ops_core import images as rule
from d2ops_core.evaluation_curves import PR_CURVES_NAME, from_precisions
from model_code.evaluation.coco import Evaluation
from model_code.evaluation.error_report import write_errors

SAMPLE_SCORE_THRESHOLD = 0.5
COLOURS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45")


def write_pr_curves(path: Path, evaluations: dict[str, Evaluation], iou_type: str = "bbox") -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display in a training or processing container
    import matplotlib.pyplot as plt

    classes = sorted({c for ev in evaluations.values() for c in ev.pr_curves.get(iou_type, {})})
    cols = min(4, max(1, len(classes)))
    rows = max(1, -(-len(classes) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    recall = [i / 100 for i in range(101)]
    for ax, name in zip(axes.flat, classes, strict=False):
        for colour, (who, ev) in zip(COLOURS, evaluations.items(), strict=False):
            curve = ev.pr_curves.get(iou_type, {}).get(name)
            if not curve:
                continue
            for key, style in (("iou50", "-"), ("iou50_95", "--")):
                points = [(r, p) for r, p in zip(recall, curve[key], strict=True) if p >= 0]
                if points:
                    ax.plot(*zip(*points, strict=True), style, color=colour, label=f"{who} {key}")
        ap = {who: ev.per_class.get(name, {}).get(f"{iou_type}_AP") for who, ev in evaluations.items()}
        ax.set_title(f"{name}  " + " ".join(f"{w}={v:.3f}" for w, v in ap.items() if v is not None), fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("recall", fontsize=8)
        ax.set_ylabel("precision", fontsize=8)
    for ax in list(axes.flat)[len(classes):]:
        ax.axis("off")
    if classes:
        axes.flat[0].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"{iou_type} precision-recall per class (solid IoU 0.5, dashed IoU 0.5:0.95)", fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(path)


def draw_sample(image: Image.Image, gt: list[dict[str, Any]], predictions: list[dict[str, Any]],
                names: dict[int, str]) -> Image.Image:
    canvas = image.convert("RGB").copy()
    draw = ImageDraw.Draw(canvas)
    for ann in gt:
        x, y, w, h = ann["bbox"]
        draw.rectangle([x, y, x + w, y + h], outline="#00ff00", width=1)
    for det in predictions:
        if det["score"] < SAMPLE_SCORE_THRESHOLD:
            continue
        x, y, w, h = det["bbox"]
        colour = COLOURS[int(det["category_id"]) % len(COLOURS)]
        draw.rectangle([x, y, x + w, y + h], outline=colour, width=2)
        draw.text((x + 2, y + 1), f"{names.get(int(det['category_id']), det['category_id'])} {det['score']:.2f}",
                  fill=colour)
    return canvas


def write_report(directory: Path, evaluations: dict[str, Evaluation], gt: dict[str, Any], images_dir: Path, *,
                 sample_images: int = 6, score_thresholds: Mapping[str, Mapping[str, float] | None] | None = None,
                 comparison_section: str = "") -> Path:
    """Write index.html, pr_curves.png (and segm_pr_curves.png), sample images and the error analysis
    (errors.json, errors/*.jpg; ``score_thresholds``: model -> its artifact's, None where it has none),
    with the gate's comparison (``comparison_section``, model_code.evaluation.comparison.comparison_html)
    under the metrics; returns index.html."""
    directory.mkdir(parents=True, exist_ok=True)
    _, errors_html = write_errors(directory, evaluations, gt, images_dir, score_thresholds or {})
    # The same curves as numbers, for readers that draw their own (the console).
    curves = from_precisions({who: ev.pr_curves for who, ev in evaluations.items()})
    (directory / PR_CURVES_NAME).write_text(curves.model_dump_json(), encoding="utf-8")
    write_pr_curves(directory / "pr_curves.png", evaluations, "bbox")
    pictures = ["pr_curves.png"]
    if any("segm" in ev.pr_curves for ev in evaluations.values()):
        write_pr_curves(directory / "segm_pr_curves.png", evaluations, "segm")
        pictures.append("segm_pr_curves.png")
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    gt_by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in gt["annotations"]:
        gt_by_image.setdefault(int(ann["image_id"]), []).append(ann)
    samples_dir = directory / "samples"
    samples_dir.mkdir(exist_ok=True)
    rows = []
    for info in gt["images"][:sample_images]:
        image_id = int(info["id"])
        cells = []
        with rule.load_rgb(images_dir / info["file_name"], str(info["file_name"])) as image:  # upright, as evaluated
            for who, ev in evaluations.items():
                preds = [r for r in ev.results if r["image_id"] == image_id]
                name = f"{who}_{image_id}.png"
                draw_sample(image, gt_by_image.get(image_id, []), preds, names).save(samples_dir / name)
                cells.append(f'<td><img src="samples/{name}"><br>{html.escape(who)}</td>')
        rows.append(f"<tr><td>{html.escape(str(info['file_name']))}</td>{''.join(cells)}</tr>")
    metric_names = sorted({m for ev in evaluations.values() for m in ev.metrics})
    table = "".join(
        f"<tr><th>{html.escape(m)}</th>"
        + "".join(f"<td>{ev.metrics[m]:.4f}</td>" if m in ev.metrics else "<td>-</td>" for ev in evaluations.values())
        + "</tr>" for m in metric_names)
    header = "".join(f"<th>{html.escape(w)}</th>" for w in evaluations)
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>d2ops evaluation</title></head><body>"
           f"<h1>Evaluation on {len(gt['images'])} val images</h1>"
           f"<table border=1><tr><th>metric</th>{header}</tr>{table}</table>{comparison_section}"
           + "".join(f'<p><img src="{p}"></p>' for p in pictures)
           + "<h2>Sample val images (green: ground truth; coloured: predictions with score "
           f"&ge; {SAMPLE_SCORE_THRESHOLD})</h2><table>{''.join(rows)}</table>{errors_html}</body></html>")
    index = directory / "index.html"
    index.write_text(doc)
    return index
