"""``d2ops demo``'s reviews, the quick parts. ``--review``'s second version: its val file reuses images the champion
trained on (the same bytes), so the evaluation job's held-out filter leaves fewer than MinComparedImages to compare,
whatever the models. And what the demo does when a run waits for a person it did not expect.

The whole demo (training, the review wait, ``d2ops approve``) is tests/e2e/test_demo_review.py (slow); these check
the dataset it builds against the product's own validator and held-out filter, and the watch on fakes."""

from __future__ import annotations

import io
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from d2ops import synth
from d2ops.commands import demo
from d2ops.commands.demo import ReviewWatch, borrow_champion_images
from d2ops_core.documents.review import ReviewRequest
from d2ops_core.s3_layout import review_request_key
from d2ops_core.validation.dataset import validate_local
from model_code.dataset_version import image_sha256
from model_code.evaluation.held_out import held_out


def training_hashes(dataset: Path) -> frozenset[str]:
    """What a model trained on ``dataset`` lists in its training_images.txt: its train images' SHA-256."""
    train = json.loads((dataset / "annotations" / "train.json").read_text())
    return frozenset(image_sha256(dataset / "images", [i["file_name"] for i in train["images"]]).values())


@pytest.fixture()
def versions(tmp_path: Path) -> tuple[Path, Path]:
    synth.generate(tmp_path / "v1", images=40, seed=1, size=64, version="v1")
    synth.generate(tmp_path / "v2", images=40, seed=2, size=64, version="v2")
    return tmp_path / "v1", tmp_path / "v2"


def test_the_val_file_keeps_its_size_and_only_its_own_images_stay_held_out(versions: tuple[Path, Path]) -> None:
    """Mutations caught: borrowed images re-encoded or drawn anew (other bytes: the filter would keep them and the
    gate could approve), the dropped own images left in val (more compared than ``keep``), or annotations not
    moved with their images (the filtered ground truth would lose or keep the wrong objects)."""
    champion, dataset = versions
    before = json.loads((dataset / "annotations" / "val.json").read_text())
    assert borrow_champion_images(dataset, champion, keep=4) == {"own": 4, "borrowed": 6}
    val = json.loads((dataset / "annotations" / "val.json").read_text())
    assert len(val["images"]) == len(before["images"]) == 10
    assert len({i["id"] for i in val["images"]}) == 10 and len({a["id"] for a in val["annotations"]}) == len(
        val["annotations"])
    # the borrowed images are the champion's train images, byte for byte, with their objects
    train = json.loads((champion / "annotations" / "train.json").read_text())
    for image in val["images"][4:]:
        name = image["file_name"].removeprefix("val/champion-")
        original = next(i for i in train["images"] if i["file_name"] == f"train/{name}")
        assert (dataset / "images" / image["file_name"]).read_bytes() == (champion / "images" /
                                                                          original["file_name"]).read_bytes()
        boxes = sorted(a["bbox"] for a in val["annotations"] if a["image_id"] == image["id"])
        assert boxes and boxes == sorted(a["bbox"] for a in train["annotations"] if a["image_id"] == original["id"])
    # the dropped own val images are gone from the dataset, files too
    dropped = {i["file_name"] for i in before["images"][4:]}
    assert not any((dataset / "images" / name).exists() for name in dropped)

    result = held_out(val, dataset / "images", {"challenger": training_hashes(dataset),
                                                "champion": training_hashes(champion)})
    assert result.compared == 4
    assert [(e.reason, e.images) for e in result.excluded] == [("champion_trained_on", 6)]
    assert {i["id"] for i in result.gt["images"]} == {i["id"] for i in before["images"][:4]}


def test_the_dataset_it_builds_is_still_a_valid_version(versions: tuple[Path, Path]) -> None:
    """The pipeline validates every upload first: a dataset the validator refuses would never reach the gate."""
    champion, dataset = versions
    borrow_champion_images(dataset, champion, keep=4)
    report = validate_local(dataset)
    assert report.valid and report.error_count == 0, report.issue_counts


RUN = "shapes_v2_0123456789abcdef"
EXECUTION = f"arn:aws:states:us-east-1:123456789012:execution:d2ops-pipeline:{RUN}"


class FakeRuntime:
    """What ReviewWatch reads of a runtime: the artifacts bucket (S3) and Step Functions, recorded."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.stopped: list[dict[str, Any]] = []
        self.stack = SimpleNamespace(artifacts_bucket="artifacts")
        self.work_dir = Path("/work-dir")

    def client(self, service: str) -> Any:
        if service == "s3":
            return SimpleNamespace(
                list_objects_v2=lambda Bucket, Prefix: {"KeyCount": sum(k.startswith(Prefix) for k in self.objects)},
                get_object=lambda Bucket, Key: {"Body": io.BytesIO(self.objects[Key])})
        assert service == "stepfunctions"
        return SimpleNamespace(stop_execution=lambda **kwargs: self.stopped.append(kwargs))

    def request_review(self) -> None:
        now = datetime(2026, 11, 29, tzinfo=UTC)
        request = ReviewRequest(run_id=RUN, execution_arn=EXECUTION, task_token="token", requested_at=now,
                                expires_at=now + timedelta(days=7), model_package_arn="arn:package",
                                gate_reason="needs a person's review: the interval reaches below -0.03",
                                review_because=["uncertain"])
        self.objects[review_request_key(RUN)] = request.model_dump_json().encode()


@pytest.fixture()
def printed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(demo, "say", lines.append)
    monkeypatch.setattr(ReviewWatch, "evaluation", lambda self, run_id: {
        "images_compared": 80, "val_images": 80, "min_compared_images": 50, "excluded": []})
    return lines


def test_an_unattended_demo_stops_a_run_that_waits_for_a_review_it_did_not_expect(printed: list[str]) -> None:
    """Mutation caught: the watch only printing (an unattended `--twice` would then wait the review's 7 days, or
    the demo's 30-minute timeout), or acting before the request exists."""
    rt = FakeRuntime()
    watch = ReviewWatch(rt, approve=False, attended=False)
    watch(RUN)
    assert (watch.request, rt.stopped, printed) == (None, [], [])  # nothing waits yet
    rt.request_review()
    watch(RUN)
    watch(RUN)  # once only
    assert rt.stopped == [{"executionArn": EXECUTION, "error": "DemoUnexpectedReview",
                           "cause": "the gate asked for a review (uncertain), which this demo does not expect"}]
    assert any("uncertain: needs a person's review" in line for line in printed)


def test_with_kept_state_the_demo_says_how_to_decide_and_waits(printed: list[str]) -> None:
    rt = FakeRuntime()
    rt.request_review()
    ReviewWatch(rt, approve=False, attended=True)(RUN)
    assert rt.stopped == []
    assert any(f"d2ops approve {RUN} --work-dir /work-dir" in line for line in printed)


def test_a_failed_approval_stops_the_run_instead_of_leaving_it_waiting(printed: list[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rt = FakeRuntime()
    rt.request_review()
    monkeypatch.setattr(ReviewWatch, "decide", lambda self, run_id: {"command": f"d2ops approve {run_id}",
                                                                     "exit_code": 1, "output": "refused"})
    watch = ReviewWatch(rt, approve=True, attended=False)
    watch(RUN)
    assert watch.approval is not None and watch.approval["exit_code"] == 1
    assert [s["error"] for s in rt.stopped] == ["DemoReviewNotDecided"]


def test_while_the_output_is_held_other_threads_lines_come_after_the_holder_s(capsys: pytest.CaptureFixture[str]
                                                                              ) -> None:
    """The run's progress (other threads) moves on the moment `d2ops approve` lands its decision; its lines wait
    until the command's own answer is printed, kept rather than blocked (mutation: printed at once)."""
    with demo.others_held():
        demo.say("$ d2ops approve")
        thread = threading.Thread(target=demo.say, args=("ok Wait for review",))
        thread.start()
        thread.join(timeout=5)
        assert not thread.is_alive()  # kept, not blocked
        demo.say("run approved")
    demo.say("after")
    assert capsys.readouterr().out.splitlines() == ["$ d2ops approve", "run approved", "ok Wait for review", "after"]
