"""The labelling round trip against a REAL Label Studio server (one per session, tests/fixtures/label_studio.py).

A selection of synthetic "captured" images (with the model's detections: the ground truth shifted by a pixel)
is exported with ``d2ops label export``; the tasks are completed through Label Studio's own API as labellers
would (one skipped, one left open, two annotators agreeing on one task and disagreeing on two, one of those
settled by a ground-truth mark); ``d2ops
label import`` writes the next dataset version, which the pipeline's validator and the trainer's loader accept.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from label_studio_sdk import LabelStudio

from d2ops import synth
from d2ops.cli import main
from d2ops.labelling.labelstudio import label_config
from d2ops.offline.pipeline import wait_for_run
from d2ops.offline.runtime import OfflineRuntime
from d2ops_core.validation import validate_local
from d2ops_core.validation.split import draws_val
from model_code.dataset_version import open_dataset_version
from tests.fixtures.label_studio import LabelStudioServer, label_studio  # noqa: F401 (the session fixture)
from tests.fixtures.labelling import CLASSES, SIZE, captured_images, write_selection

pytestmark = pytest.mark.integration
TIMINGS: dict[str, float] = {}


def region(name: str, bbox: list[float], kind: str = "rectanglelabels") -> dict[str, Any]:
    x, y, w, h = bbox
    if kind == "polygonlabels":
        value: dict[str, Any] = {"points": [[100 * x / SIZE, 100 * y / SIZE], [100 * (x + w) / SIZE, 100 * y / SIZE],
                                            [100 * x / SIZE, 100 * (y + h) / SIZE]], "polygonlabels": [name]}
    else:
        value = {"x": 100 * x / SIZE, "y": 100 * y / SIZE, "width": 100 * w / SIZE, "height": 100 * h / SIZE,
                 "rotation": 0, "rectanglelabels": [name]}
    return {"from_name": "poly" if kind == "polygonlabels" else "label", "to_name": "image", "type": kind,
            "original_width": SIZE, "original_height": SIZE, "value": value}


def projects(client: LabelStudio, title: str) -> list[Any]:
    found: list[Any] = list(client.projects.list(title=title))
    return [p for p in found if p.title == title]


def tasks_by_sha(client: LabelStudio, title: str) -> dict[str, Any]:
    tasks: list[Any] = list(client.tasks.list(project=projects(client, title)[0].id))
    return {t.data["d2ops_sha256"]: t for t in tasks}


def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, token: str, *argv: str) -> tuple[int, str,
                                                                                                               str]:
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", token)
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_export_label_import_round_trip(label_studio: LabelStudioServer,  # noqa: F811
                                        tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    began = time.monotonic()
    ls = label_studio
    base = tmp_path / "v1"
    synth.generate(base, images=12, seed=0, size=SIZE, name="shapes", version="v1")
    captured = captured_images(tmp_path / "capture", 8, seed=16)  # seed 16: new images draw both sides
    shas = write_selection(tmp_path / "selection", captured)
    export = ("label", "export", "--to", "label-studio", ls.url, "--project", "round trip", "--selection",
              str(tmp_path / "selection"))

    code, out, err = cli(capsys, monkeypatch, ls.token, *export)
    assert code == 0, err
    client = LabelStudio(base_url=ls.url, api_key=ls.token)
    tasks = tasks_by_sha(client, "round trip")
    assert sorted(tasks) == sorted(shas)  # catches: images not uploaded, or the sha256 not recorded per task
    [project] = projects(client, "round trip")
    assert sorted(project.parsed_label_config["label"]["labels"]) == sorted(CLASSES)  # catches: classes not exact
    first = client.predictions.list(task=tasks[shas[0]].id)
    assert len(first) == 1 and first[0].model_version == "run-champion"  # catches: no pre-annotations
    assert len(first[0].result) == len(captured[0][1])
    box = first[0].result[0]["value"]
    assert box["x"] == pytest.approx(100 * (captured[0][1][0][1][0] + 1) / SIZE)  # pixels -> percent of the image

    code, out, err = cli(capsys, monkeypatch, ls.token, *export)  # catches: a re-run uploading images twice
    assert code == 0, err
    assert len(tasks_by_sha(client, "round trip")) == len(shas)
    assert "0 images uploaded, 8 already in the project, 0 pre-annotated" in err

    # Labellers at work, through Label Studio's own API: tasks 0-2 labelled, 3 by two annotators who agree,
    # 4 by two who disagree (a box relabelled), 5 skipped, 6 left open, 7 by two who disagree, one of them
    # marked ground truth (its boxes win).
    def label(i: int, boxes: list[tuple[str, list[float]]], **kw: Any) -> None:
        client.annotations.create(tasks[shas[i]].id, result=[region(n, b) for n, b in boxes], **kw)

    for i in range(3):
        label(i, captured[i][1])
    label(3, captured[3][1])
    label(3, [(n, [x + 0.5, y, w, h]) for n, (x, y, w, h) in captured[3][1]])
    label(4, captured[4][1])
    label(4, [*captured[4][1][1:], ("square" if captured[4][1][0][0] != "square" else "disc", captured[4][1][0][1])])
    client.annotations.create(tasks[shas[5]].id, result=[], was_cancelled=True)
    truth7 = [(n, [x + 2, y + 2, w - 2, h - 2]) for n, (x, y, w, h) in captured[7][1][:1]]
    label(7, captured[7][1])
    label(7, truth7, ground_truth=True)

    # Imported with --upload into the offline stack's data bucket (the CLI's boto3 reaches the runtime through
    # the environment it sets), manifest last; that upload's S3 event then starts a run, which validates and
    # prepares the new version; spot training over the offline account's quota of 0 ends it at once, so no job
    # runs (as in test_offline_fail_fast).
    with OfflineRuntime(tmp_path / "work", parameters={"UseSpotTraining": "true"}) as rt:
        bucket = rt.stack.data_bucket
        code, out, err = cli(capsys, monkeypatch, ls.token, "label", "import", "--from", "label-studio", ls.url,
                             "--project", "round trip", "--dataset", str(base), "--out", str(tmp_path / "v2"),
                             "--upload", f"s3://{bucket}")
        assert code == 0, err
        assert "uploaded to s3://" in err
        started = rt.deliver_event(rt.upload_event(bucket, "datasets/shapes/v2/manifest.json"))
        assert started is not None and started["action"] == "started", started  # catches: a layout the trigger ignores
        run = wait_for_run(rt, started["execution_arn"], timeout=120)
        entered = [e["stateEnteredEventDetails"]["name"] for e in rt.client("stepfunctions").get_execution_history(
            executionArn=started["execution_arn"], maxResults=1000)["events"] if e["type"].endswith("StateEntered")]
    # catches: a version the pipeline rejects (DatasetRejected) or never gets to train
    assert (run["status"], run.get("error")) == ("FAILED", "TrainingFailed"), run
    assert any("train" in name.lower() for name in entered), entered
    assert "VALID shapes/v2" in out  # the validation report is printed
    assert f"conflict: task {tasks[shas[4]].id}" in err  # catches: disagreeing annotators silently merged
    assert "5 completed, 1 skipped, 1 not completed, 1 conflicts" in err

    v2 = tmp_path / "v2"
    manifest = json.loads((v2 / "manifest.json").read_text())
    assert (manifest["name"], manifest["version"]) == ("shapes", "v2")
    docs = {s: json.loads((v2 / "annotations" / f"{s}.json").read_text()) for s in ("train", "val")}
    old = {s: json.loads((base / "annotations" / f"{s}.json").read_text()) for s in ("train", "val")}
    for split in ("train", "val"):  # catches: a base image moved to the other split, or dropped
        assert {im["file_name"] for im in old[split]["images"]} <= {im["file_name"] for im in docs[split]["images"]}
    new = {im["file_name"]: (split, im) for split, d in docs.items() for im in d["images"]
           if im["file_name"].startswith("labelled/")}
    # completed, agreed or ground truth; no conflict, skip or open task
    assert sorted(new) == sorted(f"labelled/{shas[i]}.jpg" for i in (0, 1, 2, 3, 7))
    for i in (0, 1, 2, 3, 7):
        split, im = new[f"labelled/{shas[i]}.jpg"]
        # catches: new images split by any other rule than the pipeline's content-keyed draw
        assert split == ("val" if draws_val("shapes", shas[i]) else "train")
        assert hashlib.sha256((v2 / "images" / im["file_name"]).read_bytes()).hexdigest() == shas[i]
        got = sorted((a["category_id"], a["bbox"]) for a in docs[split]["annotations"] if a["image_id"] == im["id"])
        want = sorted((CLASSES.index(n) + 1, b) for n, b in (truth7 if i == 7 else captured[i][1]))
        assert [c for c, _ in got] == [c for c, _ in want]  # catches: class names mapped to the wrong ids
        for (_, g), (_, w) in zip(got, want, strict=True):  # catches: percent <-> pixel conversion errors
            tolerance = 0.51 if i == 3 else 0.02  # task 3: the later annotation (shifted 0.5 px) may be the one taken
            assert g == pytest.approx(w, abs=tolerance)
    assert {split for split, _ in new.values()} == {"train", "val"}  # both sides exercised, not vacuous
    report = validate_local(v2)  # the pipeline's own validation
    assert report.valid, report.describe()
    assert report.splits["train"].images + report.splits["val"].images == 12 + 5
    opened = open_dataset_version(v2)  # what the trainer and the evaluation job open
    assert (opened.name, opened.version) == ("shapes", "v2")
    TIMINGS["round trip"] = time.monotonic() - began
    print(f"label studio: template migrated in {ls.migrate_seconds:.1f} s, started in {ls.start_seconds:.1f} s; "
          f"round trip {TIMINGS['round trip']:.1f} s")


def test_bad_input_each_one_line_naming_the_item(label_studio: LabelStudioServer,  # noqa: F811
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ls = label_studio
    client = LabelStudio(base_url=ls.url, api_key=ls.token)
    base = tmp_path / "v1"
    synth.generate(base, images=8, seed=3, size=SIZE, name="shapes", version="v1")
    captured = captured_images(tmp_path / "capture", 4, seed=21)
    shas = write_selection(tmp_path / "selection", captured[:2])

    def one_line(code: int, err: str, *needles: str) -> None:
        errors = [line for line in err.splitlines() if "error:" in line]
        assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
        for needle in needles:
            assert needle in errors[0], errors[0]

    # A project whose labels are not the dataset's classes (catches: exporting into someone else's project).
    client.projects.create(title="two classes", label_config=label_config(CLASSES[:2]))
    code, _, err = cli(capsys, monkeypatch, ls.token, "label", "export", "--to", "label-studio", ls.url, "--project",
                       "two classes", "--selection", str(tmp_path / "selection"))
    one_line(code, err, "'two classes'", "missing ['triangle']")
    code, _, err = cli(capsys, monkeypatch, ls.token, "label", "import", "--from", "label-studio", ls.url,
                       "--project", "two classes", "--dataset", str(base), "--out", str(tmp_path / "no"))
    one_line(code, err, "missing ['triangle']")

    # A task with a polygon where a box is expected (a project that also offers PolygonLabels).
    poly_config = label_config(CLASSES).replace(
        "</View>", '  <PolygonLabels name="poly" toName="image"><Label value="disc"/></PolygonLabels>\n</View>')
    client.projects.create(title="polygons", label_config=poly_config)
    code, _, err = cli(capsys, monkeypatch, ls.token, "label", "export", "--to", "label-studio", ls.url, "--project",
                       "polygons", "--selection", str(tmp_path / "selection"))
    assert code == 0, err
    tasks = tasks_by_sha(client, "polygons")
    client.annotations.create(tasks[shas[0]].id, result=[region(n, b) for n, b in captured[0][1]])
    poly = client.annotations.create(tasks[shas[1]].id, result=[region("disc", [10, 10, 30, 30], "polygonlabels")])
    out_dir = tmp_path / "v2"
    code, _, err = cli(capsys, monkeypatch, ls.token, "label", "import", "--from", "label-studio", ls.url,
                       "--project", "polygons", "--dataset", str(base), "--out", str(out_dir))
    one_line(code, err, f"task {tasks[shas[1]].id} annotation {poly.id}", "polygonlabels", "box")
    assert not out_dir.exists() and not list(tmp_path.glob(".v2.tmp-*"))  # never a half-written version

    # An invalid token, an expired one, an unreachable server.
    code, _, err = cli(capsys, monkeypatch, "not-the-token-0123", "label", "export", "--to", "label-studio", ls.url,
                       "--project", "x", "--selection", str(tmp_path / "selection"))
    one_line(code, err, "refused the token in LABEL_STUDIO_API_KEY", "401")
    import jwt  # label-studio-sdk requires PyJWT: the SDK refuses an expired refresh token itself
    expired = jwt.encode({"exp": int((datetime.now(UTC) - timedelta(days=1)).timestamp()), "token_type": "refresh"},
                         "k" * 32, algorithm="HS256")
    code, _, err = cli(capsys, monkeypatch, expired, "label", "export", "--to", "label-studio", ls.url, "--project",
                       "x", "--selection", str(tmp_path / "selection"))
    one_line(code, err, "401", "expired")
    closed = ls.url.rsplit(":", 1)[0] + ":9"  # discard port: nothing listens
    code, _, err = cli(capsys, monkeypatch, ls.token, "label", "export", "--to", "label-studio", closed, "--project",
                       "x", "--selection", str(tmp_path / "selection"))
    one_line(code, err, "cannot be reached", closed)

    # A selected image that no longer decodes (cut short): refused before any project is touched.
    broken = tmp_path / "broken"
    cut = captured[2][0][: len(captured[2][0]) // 2]
    [sha] = write_selection(broken, [(cut, captured[2][1])])
    code, _, err = cli(capsys, monkeypatch, ls.token, "label", "export", "--to", "label-studio", ls.url, "--project",
                       "never made", "--selection", str(broken))
    one_line(code, err, "rank 1", sha, "no longer decodes")
    assert not projects(client, "never made")
