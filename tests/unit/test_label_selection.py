"""``d2ops label select``: the ranking rule on constructed cases with a known answer, and the command against a
real moto S3 holding capture files in SageMaker's layout (written with the shared capture documents)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from PIL import Image, ImageEnhance

from d2ops import synth
from d2ops.cli import main
from d2ops.commands import artifacts_bucket
from d2ops.labelling.documents import SELECTION_FILE, SelectionError, read_selection
from d2ops.labelling.selection import (
    DEFAULT_EXPECTED_BOXES,
    Candidate,
    box_expectation,
    disagreement,
    rank,
    thumbnail,
    uncertainty,
)
from d2ops_core import s3_layout
from d2ops_core.documents.capture import (
    SMOKE_TEST_INFERENCE_ID,
    CaptureData,
    CaptureRecord,
    EventMetadata,
    encode_payload,
)
from d2ops_core.documents.detections import Detection
from d2ops_core.documents.evaluation import EvaluationReport
from d2ops_core.documents.monitoring import MonitoringBaseline
from tests.fixtures.moto_server import moto_server

ENDPOINT, VARIANT, BUCKET = "d2ops-detector", "AllTraffic", "artifacts"


def shapes(n: int, seed: int = 0) -> list[Image.Image]:
    rng = random.Random(seed)
    return [synth._make_image(i, 96, rng)[0] for i in range(n)]


def jpeg(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def det(name: str, score: float, box: tuple[float, ...] = (10, 10, 40, 40)) -> Detection:
    return Detection(box=list(box), score=score, class_id=0, class_name=name)


def candidate(image: Image.Image, detections: list[Detection], tag: str, **kw: Any) -> Candidate:
    return Candidate(sha256=hashlib.sha256(tag.encode()).hexdigest(), thumb=thumbnail(image), detections=detections,
                     thresholds={"square": 0.5, "disc": 0.5, "triangle": 0.5}, **kw)


def test_ranking_follows_the_rule_mix_on_a_constructed_case() -> None:
    a, b, c, d = shapes(4)
    # uncertainty: 1 - |score - 0.5| / 0.25 -> a 0.96, b 0.2, c 0 (beyond the margin); d: weak class 0.5 x 1
    cands = [candidate(c, [det("square", 0.9)], "c"), candidate(b, [det("square", 0.7)], "b"),
             candidate(d, [det("triangle", 0.9)], "d"), candidate(a, [det("disc", 0.51), det("square", 0.95)], "a")]
    outcome = rank(cands, max_images=4, weak=["triangle"], weights={"diversity": 0.0})
    # catches: the nearness inverted (confident first), the weak-class term ignored, the max over detections
    # replaced by the first detection's value
    assert [r.candidate.sha256 for r in outcome.ranked] == [hashlib.sha256(t.encode()).hexdigest() for t in "adbc"]
    assert [r.score for r in outcome.ranked] == pytest.approx([0.96, 0.5, 0.2, 0.0])
    first = outcome.ranked[0].reasons
    assert [(r.term, r.detail) for r in first] == [("uncertainty", "disc 0.51 near threshold 0.50")]
    assert [r.term for r in outcome.ranked[1].reasons] == ["weak_class"] and outcome.ranked[3].reasons == []
    # the budget: only the best two (catches an ignored --max-images)
    assert [r.rank for r in rank(cands, max_images=2, weak=["triangle"]).ranked] == [1, 2]


def test_near_duplicates_collapse_to_one_image_each() -> None:
    originals = shapes(5, seed=3)
    cands = []
    for g, image in enumerate(originals):
        shifted = image.copy()
        shifted.paste(image.crop((0, 0, 94, 94)), (2, 2))  # the camera moved 2 pixels
        variants = [image, ImageEnhance.Brightness(image).enhance(1.1),
                    Image.open(io.BytesIO(jpeg(image, quality=50))), shifted]
        for v, variant in enumerate(variants):
            # the copies are the most uncertain ones, so without the diversity rule they would fill the batch
            cands.append(candidate(variant, [det("square", 0.5 + 0.01 * v + 0.05 * g)], f"{g}-{v}"))
    outcome = rank(cands, max_images=20)
    groups = [r.candidate.sha256 for r in outcome.ranked]
    by_tag = {hashlib.sha256(f"{g}-{v}".encode()).hexdigest(): g for g in range(5) for v in range(4)}
    # catches: no near-duplicate check (20 picked), a threshold that also merges distinct images (< 5 picked)
    assert sorted(by_tag[s] for s in groups) == [0, 1, 2, 3, 4]
    assert outcome.near_duplicates == 15
    # each group is represented by its most uncertain copy (variant 0: score nearest 0.5)
    assert all(s == hashlib.sha256(f"{by_tag[s]}-0".encode()).hexdigest() for s in groups)


def test_the_order_does_not_depend_on_the_input_order() -> None:
    images = shapes(12, seed=5)
    cands = [candidate(im, [det("square", 0.5 + (i % 3) * 0.05)], f"x{i}") for i, im in enumerate(images)]
    first = [r.candidate.sha256 for r in rank(cands, max_images=8).ranked]
    shuffled = list(cands)
    random.Random(1).shuffle(shuffled)
    assert [r.candidate.sha256 for r in rank(shuffled, max_images=8).ranked] == first  # catches input-order ties


def test_disagreement_is_one_minus_f1_of_same_class_matches() -> None:
    ours = [det("square", 0.9, (0, 0, 10, 10)), det("disc", 0.8, (20, 20, 30, 30))]
    same = [det("square", 0.7, (1, 1, 10, 10)), det("disc", 0.9, (20, 20, 30, 31))]
    assert disagreement(ours, same)[0] == pytest.approx(0.0)
    # the disc is called a square by the other model: one match of 2 + 2 -> F1 0.5 (catches class-blind matching)
    other = [det("square", 0.7, (1, 1, 10, 10)), det("square", 0.9, (20, 20, 30, 31))]
    assert disagreement(ours, other)[0] == pytest.approx(0.5)
    assert disagreement(ours, [])[0] == pytest.approx(1.0) and disagreement([], [])[0] == 0.0
    assert uncertainty([], {}, 0.25) == (0.0, "")


# ---- the command, against a real moto S3 -----------------------------------------------------------


def answer(detections: list[Detection], size: int = 96) -> bytes:
    return json.dumps({"detections": [d.model_dump(exclude_none=True) for d in detections],
                       "image": {"width": size, "height": size},
                       "score_thresholds": {"source": "model", "by_class": {"square": 0.5, "disc": 0.5}}}).encode()


def record(body: bytes, response: bytes, when: datetime, event: str) -> str:
    return CaptureRecord(
        captureData=CaptureData(endpointInput=encode_payload(body, "image/jpeg", "INPUT"),
                                endpointOutput=encode_payload(response, "application/json", "OUTPUT")),
        eventMetadata=EventMetadata(eventId=event, inferenceTime=when)).model_dump_json()


@contextlib.contextmanager
def s3_with_capture() -> Iterator[tuple[Any, dict[str, Any]]]:
    with moto_server() as url:
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
        s3.create_bucket(Bucket=BUCKET)
        hour = datetime(2026, 5, 1, 10, tzinfo=UTC)
        bodies = [jpeg(im) for im in shapes(6, seed=9)]
        lines = [record(b, answer([det("square", 0.52 + 0.04 * i)]), hour + timedelta(minutes=i), f"e{i}")
                 for i, b in enumerate(bodies)]
        lines.insert(2, record(bodies[0], answer([det("square", 0.52)]), hour + timedelta(minutes=30), "again"))
        lines.insert(3, '{"captureData": {"endpointInput": ')  # a file cut short
        lines.append(record(b"not an image at all", answer([]), hour + timedelta(minutes=40), "broken"))
        smoke = CaptureRecord.model_validate_json(record(jpeg(shapes(1, seed=77)[0]), answer([det("square", 0.5)]),
                                                         hour + timedelta(minutes=41), "smoke"))
        smoke.eventMetadata.inferenceId = SMOKE_TEST_INFERENCE_ID  # the pipeline's smoke test: not traffic
        lines.append(smoke.model_dump_json())
        key = s3_layout.capture_hour_prefix(ENDPOINT, VARIANT, 2026, 5, 1, 10) + "00-00-000-abc.jsonl"
        s3.put_object(Bucket=BUCKET, Key=key, Body="\n".join(lines).encode())
        # a run's inventory lists images 1 and 2: they are in a dataset version already
        inventory = "\n".join(json.dumps({"key": f"images/val/{i}.jpg", "version_id": None, "size": len(bodies[i]),
                                          "sha256": hashlib.sha256(bodies[i]).hexdigest()}) for i in (1, 2))
        s3.put_object(Bucket=BUCKET, Key=s3_layout.inventory_key("shapes_v1_0123456789abcdef"), Body=inventory)
        yield s3, {"bodies": bodies, "key": key}


def test_select_writes_the_ranked_images_and_never_an_excluded_one(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with s3_with_capture() as (s3, facts):
        @contextlib.contextmanager
        def offline(work_dir: Path) -> Iterator[tuple[Any, str, str]]:
            yield s3, BUCKET, ENDPOINT

        monkeypatch.setattr(artifacts_bucket, "offline", offline)
        out = tmp_path / "batch"
        assert main(["label", "select", "--max-images", "10", "--out", str(out), "--weak-class", "disc"]) == 0
    selection = read_selection(out)
    bodies: list[bytes] = facts["bodies"]
    hashes = [hashlib.sha256(b).hexdigest() for b in bodies]
    chosen = [i.sha256 for i in selection.images]
    # excluded by the inventory (catches the exclusion not applied); the repeat of image 0 counted once; the
    # smoke test's request (the most uncertain answer, 0.5 at threshold 0.5) is not traffic (catches it read)
    assert not {hashes[1], hashes[2]} & set(chosen)
    assert sorted(chosen) == sorted(hashes[i] for i in (0, 3, 4, 5))
    # most uncertain first: scores 0.52, 0.64, 0.68, 0.72 around the threshold 0.5
    assert chosen == [hashes[i] for i in (0, 3, 4, 5)]
    c = selection.counts
    assert (c.records, c.duplicates, c.excluded, c.candidates, c.unreadable) == (8, 1, 2, 4, 2)
    first = selection.images[0]
    assert (first.source.key, first.source.line, first.source.event_id) == (facts["key"], 1, "e0")
    assert (out / first.file).read_bytes() == bodies[0] and first.file == f"images/{hashes[0]}.jpg"
    assert (first.width, first.height, first.detections[0].class_name) == (96, 96, "square")
    assert selection.parameters.weak_classes == ["disc"] and selection.parameters.weights["disagreement"] == 0
    # each skipped record named by file and line
    uri = f"s3://{BUCKET}/{facts['key']}"
    assert [p.split(": ")[0] for p in selection.problems] == [f"{uri}:4", f"{uri}:9"]
    printed = capsys.readouterr()
    assert printed.out.startswith("selected 4 of 4 candidate images from 8 captured records")


def test_select_refuses_an_existing_out_dir_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    with pytest.raises(SystemExit) as stopped:
        main(["label", "select", "--max-images", "3", "--out", str(out)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"d2ops label select: error: --out {out}: already exists (a selection is written once; choose a "
                   "new directory)"]
    assert list(out.iterdir()) == []


def test_read_selection_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(SelectionError, match=r"selection\.json: missing"):
        read_selection(tmp_path)
    (tmp_path / SELECTION_FILE).write_text("{", encoding="utf-8")
    with pytest.raises(SelectionError, match="not JSON"):
        read_selection(tmp_path)
    (tmp_path / SELECTION_FILE).write_text(json.dumps({"created_at": "2026-05-01T10:00:00Z"}), encoding="utf-8")
    with pytest.raises(SelectionError, match="not a selection"):
        read_selection(tmp_path)


def test_a_selection_naming_a_file_other_than_the_images_own_is_refused(tmp_path: Path) -> None:
    # catches: `label export` uploading whatever file an edited selection.json names (../../id.jpg with its
    # sha256 set to match) to a labelling server
    from tests.fixtures.labelling import captured_images, write_selection

    write_selection(tmp_path / "batch", captured_images(tmp_path / "capture", 4, seed=3))
    document = json.loads((tmp_path / "batch" / SELECTION_FILE).read_text())
    outside = tmp_path / "id.jpg"
    outside.write_bytes((tmp_path / "batch" / document["images"][0]["file"]).read_bytes())
    document["images"][0]["file"] = "../id.jpg"
    (tmp_path / "batch" / SELECTION_FILE).write_text(json.dumps(document))
    with pytest.raises(SelectionError, match=r"images\.0: Value error, file '\.\./id\.jpg' is not 'images/[0-9a-f]{64}"
                                             r"\.jpg', the image's own name in the selection"):
        read_selection(tmp_path / "batch")


def test_weak_classes_are_below_their_share_of_the_models_ap() -> None:
    from d2ops.labelling.capture_source import weak_classes
    from d2ops_core.documents.evaluation import EvaluationReport

    report = EvaluationReport.model_validate({
        "primary_metric": "bbox_AP", "val_images": 80, "class_instances": {"square": 40, "disc": 40, "triangle": 40},
        "challenger": {"metrics": {"bbox_AP": 0.7},
                       "per_class": {"square": {"bbox_AP": 0.8}, "disc": {"bbox_AP": 0.57},
                                     "triangle": {"bbox_AP": 0.55}}}})
    # 0.8 x 0.7 = 0.56: disc (0.57) is not weak, triangle (0.55) is (catches the share or the comparison inverted)
    assert weak_classes(report) == ["triangle"]


def baseline(images: int, detections: int) -> MonitoringBaseline:
    return MonitoringBaseline(run_id="shapes_v1_0123456789abcdef", class_names=["square", "disc", "triangle"],
                              images=images, detections=detections, created_at=datetime(2026, 5, 1, tzinfo=UTC),
                              distributions={}, class_rates={}, low_confidence=[])


def drifted_stream() -> tuple[list[Candidate], set[str]]:
    """Ten images: seven with one barely-kept or middling detection (uncertainty 0.4-0.8), three where the model
    found nothing (a stream twice as dark); returns them and the empty ones' hashes."""
    images = shapes(10, seed=3)
    cands = [candidate(images[i], [det("square", 0.55 + 0.01 * i)], f"seen{i}") for i in range(7)]
    cands += [candidate(images[7 + i], [], f"empty{i}") for i in range(3)]
    return cands, {c.sha256 for c in cands[7:]}


def test_images_without_detections_are_picked_when_the_baseline_expects_boxes() -> None:
    cands, empty = drifted_stream()
    outcome = rank(cands, max_images=3, weights={"diversity": 0.0}, expectation=box_expectation(baseline(50, 100)))
    # catches: the empty term missing or 0 (every term scores an image without detections 0, so these three would
    # rank last), or its value taken from the detections instead of the baseline's expectation
    assert {r.candidate.sha256 for r in outcome.ranked} == empty
    reason = outcome.ranked[0].reasons[0]
    assert (reason.term, reason.value, reason.weight) == ("empty", 1.0, 1.0)
    assert "2.00 boxes per image expected (monitoring baseline of run shapes_v1_0123456789abcdef)" in reason.detail
    # catches --weight empty=0 ignored: the term is a weight like the others
    unweighted = rank(cands, max_images=3, weights={"diversity": 0.0, "empty": 0.0},
                      expectation=box_expectation(baseline(50, 100)))
    assert not {r.candidate.sha256 for r in unweighted.ranked} & empty


def test_images_without_detections_are_not_favoured_when_the_baseline_expects_none() -> None:
    cands, empty = drifted_stream()
    outcome = rank(cands, max_images=3, weights={"diversity": 0.0}, expectation=box_expectation(baseline(50, 1)))
    # catches: the empty term scored 1 whatever the model usually answers (a model that rarely finds anything
    # would send labellers blank images); 1 box in 50 images: each empty image scores 0.02, below the seven
    assert not {r.candidate.sha256 for r in outcome.ranked} & empty
    assert [r.score for r in rank(cands, max_images=10, weights={"diversity": 0.0},
                                  expectation=box_expectation(baseline(50, 1))).ranked][-3:] == [0.02] * 3


def test_the_box_expectation_comes_from_the_baseline_then_the_report_then_a_default() -> None:
    report = EvaluationReport.model_validate({
        "primary_metric": "bbox_AP", "val_images": 40, "class_instances": {"square": 30, "disc": 30},
        "challenger": {"metrics": {"bbox_AP": 0.7}, "per_class": {}}})
    # catches the sources taken in the wrong order, or the report's instances not divided by its images
    assert box_expectation(baseline(50, 100), report).boxes_per_image == 2.0
    assert (box_expectation(None, report).boxes_per_image, box_expectation(None, report).source) == (
        1.5, "evaluation report")
    assert box_expectation().boxes_per_image == DEFAULT_EXPECTED_BOXES


def test_a_corrupt_evaluation_report_is_one_line_naming_the_object() -> None:
    # catches: a ValidationError / JSON error from the serving run's report reaching the user as a traceback
    from d2ops.labelling.capture_source import read_evaluation_report

    with s3_with_capture() as (s3, _):
        s3.put_object(Bucket=BUCKET, Key="runs/x/evaluation.json", Body=b'{"challenger": 3}')
        with pytest.raises(SelectionError, match=r"evaluation.json: not an evaluation report \(") as info:
            read_evaluation_report(s3, f"s3://{BUCKET}/runs/x/evaluation.json")
        assert "\n" not in str(info.value)


def test_select_stops_in_one_line_on_the_serving_runs_corrupt_baseline(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # catches: the shared reader's BaselineError escaping the command as a traceback, or the baseline skipped
    # silently (the `empty` term would then judge boxes against the report's number without saying so)
    from d2ops_core.champion import CHAMPION_KEY

    run = "shapes_v1_0123456789abcdef"
    key = s3_layout.monitoring_baseline_key(run)
    with s3_with_capture() as (s3, _):
        report = {"primary_metric": "bbox_AP", "val_images": 8, "class_instances": {"square": 8},
                  "challenger": {"metrics": {"bbox_AP": 0.7}, "per_class": {"square": {"bbox_AP": 0.7}}}}
        s3.put_object(Bucket=BUCKET, Key=f"runs/{run}/evaluation.json", Body=json.dumps(report).encode())
        champion = {"run_id": run, "endpoint_name": ENDPOINT, "model_package_arn": "arn:mp", "model_name": "m",
                    "dataset": {"bucket": BUCKET, "prefix": "datasets/shapes/v1/", "name": "shapes", "version": "v1",
                                "manifest_key": "datasets/shapes/v1/manifest.json", "manifest_version": "1"},
                    "model_data": "s3://b/model.tar.gz", "endpoint_config_name": "c", "primary_metric": "bbox_AP",
                    "primary_value": 0.7, "evaluation_uri": f"s3://{BUCKET}/runs/{run}/evaluation.json",
                    "gate": {"decision": "approved", "approval_status": "Approved", "reason": "better"},
                    "promoted_at": "2026-05-01T00:00:00Z"}
        s3.put_object(Bucket=BUCKET, Key=CHAMPION_KEY, Body=json.dumps(champion).encode())
        s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"schema_version": 1, "run_id": 7')

        @contextlib.contextmanager
        def offline(work_dir: Path) -> Iterator[tuple[Any, str, str]]:
            yield s3, BUCKET, ENDPOINT

        monkeypatch.setattr(artifacts_bucket, "offline", offline)
        out = tmp_path / "batch"
        assert main(["label", "select", "--max-images", "10", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"d2ops label select: error: s3://{BUCKET}/{key}: not a monitoring baseline (document: Invalid JSON")
    assert not out.exists()  # nothing half-written
