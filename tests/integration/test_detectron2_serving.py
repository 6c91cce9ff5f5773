"""detectron2 -> export -> evaluation -> real TorchServe, compared with detectron2's own DefaultPredictor.

For a tiny R-18 FPN Faster R-CNN and Mask R-CNN built directly with detectron2
(tests/fixtures/d2export), the production export path (``export_and_evaluate``, what the
trainer calls after training) writes the artifact and evaluates it through the artifact on a
synthetic dataset; the Mask R-CNN artifact, packed as model.tar.gz, is served by a real
TorchServe (``LocalEndpoint``), and the JSON answers for non-square PNGs are compared with
``DefaultPredictor`` on the same pixels (its answers carry boxes, scores and classes as well as
masks; the box-only export is compared with ``DefaultPredictor`` in
tests/unit/test_detectron2_export.py, and TorchServe start-up costs about a minute, so one
server, not two):

- an image at the test size (no resize): boxes, scores, classes and masks as detectron2 gives
  them, up to the JSON's rounding (boxes to 0.01 px, scores to 1e-4), masks pixel-identical;
- sets of enlarged and of shrunk images: within ``support.RESIZED`` (boxes 2 px, scores 0.03,
  masks IoU 0.85 over all of an image's); tests/unit/test_detectron2_export.py shows that this
  tolerance is the resize alone (PIL vs torch), the rest being exact.

A reference detection may go unmatched only near the score threshold, and at least 90 % of them
must be matched, over each set of images together (``support.assert_enough_matched``): an export
or server dropping the low scorers fails, one or two borderline detections do not.
"""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import requests
from pycocotools import mask as mask_utils

from d2ops import synth
from d2ops.local.serving import LocalEndpoint
from d2ops_core.score_thresholds import DEFAULT_SCORE_THRESHOLD
from model_code import artifact
from model_code.dataset_version import categories_of, open_dataset_version, read_coco
from model_code.evaluation.coco import predict_split
from model_code.evaluation.thresholds import score_thresholds
from model_code.training.detectron2_export import export_and_evaluate
from model_code.training.detectron2_trainer import ConfigSource, dataset_registrations
from tests.fixtures.d2export import support
from tests.fixtures.frameworks import require_detectron2
from tests.fixtures.serving.support import png_bytes, shapes_image

require_detectron2()

pytestmark = pytest.mark.integration

# JSON answers round boxes to 2 decimals and scores to 4; otherwise exact.
SERVED_EXACT = dataclasses.replace(support.EXACT, box_px=0.006, score=6e-5)
AT_SIZE = (128, 160, 5)
IMAGE_SETS = [([AT_SIZE], SERVED_EXACT), (support.ENLARGED_SET, support.RESIZED),
              (support.SHRUNK_CAPPED_SET, support.RESIZED)]


def export_job(tmp: Path, masks: bool) -> dict:
    dataset = tmp / "dataset"
    synth.generate(dataset, images=8, size=128, seed=3)
    if masks:
        manifest = json.loads((dataset / "manifest.json").read_text())
        (dataset / "manifest.json").write_text(json.dumps({**manifest, "task": "instance_segmentation"}))
    version = open_dataset_version(dataset)
    categories = categories_of(read_coco(version.train_json))
    return {"task": version.task, "registrations": [asdict(r) for r in
                                                    dataset_registrations(version, version, categories)],
            "source": asdict(ConfigSource("file", "tiny-r18-fpn.yaml")), "job_name": "d2-export-test",
            "dataset_name": version.name, "dataset_version": version.version, "report_images": 2,
            "model_dir": str(tmp / "model"), "output_data_dir": str(tmp / "output")}


def export(tmp: Path, masks: bool):
    predictor = support.tiny_predictor(masks)
    job = export_job(tmp, masks)
    cfg = predictor.cfg.clone()
    cfg.OUTPUT_DIR = str(tmp / "d2-output")
    export_and_evaluate(cfg, predictor.model, job)
    return predictor, job


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("d2serve")
    predictor, job = export(tmp, masks=True)
    tarball = artifact.pack_artifact(job["model_dir"], tmp / "model.tar.gz")
    with LocalEndpoint(tarball, workdir=tmp / "serving", startup_timeout=300) as endpoint:
        yield predictor, job, endpoint


@pytest.fixture(params=[False, True], ids=["faster_rcnn", "mask_rcnn"])
def exported(request, tmp_path_factory, served):
    if request.param:
        return served[1]  # the served one
    return export(tmp_path_factory.mktemp("d2export"), masks=False)[1]


def test_export_writes_the_artifact_and_evaluates_through_it(exported):
    job = exported
    model_dir, out = Path(job["model_dir"]), Path(job["output_data_dir"])
    assert sorted(p.name for p in model_dir.iterdir()) == ["evaluation.json", "metadata.json", "model.pt",
                                                           "training_images.txt"]
    meta = artifact.read_metadata(model_dir)
    assert meta.framework == "detectron2" and meta.task == job["task"]
    # torch.export (model.pt2) was tried and stopped in detectron2's RPN: the metadata says so, TorchScript ships
    # (tests/unit/test_detectron2_export.py; catches an export step that skips the try or hides the reason).
    assert meta.forms == ["torchscript"] and "find_top_rpn_proposals" in meta.export_problems["exported"]
    mapping = job["registrations"][0]["thing_dataset_id_to_contiguous_id"]
    assert [mapping[c] for c in meta.category_ids] == list(range(len(meta.class_names)))
    assert meta.checkpoint is not None and "checkpoint/config.yaml" in meta.checkpoint.files
    assert (out / "checkpoint" / "config.yaml").is_file() and (out / "report" / "index.html").is_file()
    evaluation = json.loads((model_dir / "evaluation.json").read_text())
    primary = "segm_AP" if job["task"] == "instance_segmentation" else "bbox_AP"
    assert primary in meta.metrics and json.loads((out / "evaluation.json").read_text()) == evaluation
    assert 0.0 <= meta.metrics[primary] <= 1.0
    # The per-class thresholds: one for every class, what the rule gives on the shipped detector's val
    # detections, matched on masks for a segmentation model (catches an export that skips them, fits them
    # on boxes for Mask R-CNN, or writes them for the val split's names instead of the model's classes).
    val = job["registrations"][1]
    gt = read_coco(Path(val["json_file"]))
    results = predict_split(artifact.load_artifact(model_dir), gt, Path(val["image_root"]))
    fitted = score_thresholds(gt, results, primary.split("_")[0])
    assert meta.score_thresholds == {n: fitted.get(n, DEFAULT_SCORE_THRESHOLD) for n in meta.class_names}


def served_detections(endpoint: LocalEndpoint, image, masks: bool, category_ids: list[int]) -> list[support.Detection]:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    r = requests.post(endpoint.invocations_url, data=buf.getvalue(), timeout=120,
                      headers={"Content-Type": "image/png",
                               "X-Amzn-SageMaker-Custom-Attributes":
                                   f"score_threshold=0;max_detections=1000;masks={str(masks).lower()}"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["image"] == {"width": image.width, "height": image.height}
    return [support.Detection(
        box=np.array(d["box"], dtype=np.float32), score=d["score"], label=category_ids.index(d["class_id"]),
        mask=mask_utils.decode({"size": d["mask"]["size"], "counts": d["mask"]["counts"].encode()}).astype(bool)
        if masks else None) for d in body["detections"]]


@pytest.mark.parametrize(("specs", "tolerance"), IMAGE_SETS, ids=["at-size", "enlarged", "shrunk-capped"])
def test_served_detections_match_default_predictor(served, specs, tolerance):
    predictor, job, endpoint = served
    masks = job["task"] == "instance_segmentation"
    meta = artifact.read_metadata(job["model_dir"])
    matchings = []
    for spec in specs:
        image = shapes_image(*spec)
        reference = support.reference_detections(predictor, np.asarray(image))
        got = served_detections(endpoint, image, masks, meta.category_ids)
        matchings.append(support.match(got, reference, tolerance, support.SCORE_THRESH))
    support.assert_enough_matched(matchings)  # >= 90 % of the reference matched, over the set


def test_masks_false_answers_the_same_detections_without_masks(served):
    predictor, job, endpoint = served
    meta = artifact.read_metadata(job["model_dir"])
    image = shapes_image(*AT_SIZE)
    reference = support.reference_detections(predictor, np.asarray(image))
    for detection in reference:
        detection.mask = None
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    r = requests.post(endpoint.invocations_url, data=buf.getvalue(), timeout=120,
                      headers={"Content-Type": "image/png", "X-Amzn-SageMaker-Custom-Attributes":
                               "score_threshold=0;max_detections=1000;masks=false"})
    assert r.status_code == 200 and r.json()["detections"], r.text
    assert not any("mask" in d for d in r.json()["detections"])
    got = served_detections(endpoint, image, False, meta.category_ids)
    support.compare(got, reference, SERVED_EXACT, support.SCORE_THRESH)  # >= 90 % of the reference matched


def test_bad_input_is_a_4xx(served):
    _, _, endpoint = served
    r = requests.post(endpoint.invocations_url, data=png_bytes()[:40], headers={"Content-Type": "image/png"},
                      timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"]
