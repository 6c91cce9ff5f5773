"""GET /runs/{runId}/evaluation stays under Lambda's 6 MB response limit (status_api.response_budget).

A report over the budget answers its summary, says it is truncated and which parts it left out, and links
each S3 document of the report whole (presigned); a report within the budget answers whole, as before.
Through the real handler against moto, with the real definition's run in the ASL interpreter."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import requests

from d2ops_core.documents.error_analysis import ErrorAnalysis
from d2ops_core.evaluation_curves import PrCurve, PrCurves
from tests.fixtures.pipeline import support
from tests.unit import test_status_api_s3_access as s3_access
from tests.unit.test_status_api_s3_access import ARTIFACTS, key_of, report_uris, use_clients

support.function_path("status_api")
from status_api import handler as api  # noqa: E402
from status_api import response_budget  # noqa: E402
from status_api.models import EvaluationView  # noqa: E402

aws = s3_access.aws  # the fixture: moto's S3 and a finished run of the real definition
THUMBNAIL = "data:image/jpeg;base64," + "A" * 149_000  # about the largest a gallery picture may be


def report(classes: int) -> dict[str, Any]:
    names = [f"class-{i:04d}" for i in range(classes)]
    scores = {"metrics": {"bbox_AP": 0.5, "bbox_AP50": 0.7},
              "per_class": {n: {"bbox_AP": 0.5123, "bbox_AP50": 0.7123} for n in names}}
    return {"primary_metric": "bbox_AP", "val_images": 100, "class_instances": {n: 10 for n in names},
            "challenger": scores, "champion": copy.deepcopy(scores)}


def curves(classes: int) -> PrCurves:
    curve = PrCurve(iou50=[0.1234] * 101, iou50_95=[0.0567] * 101)
    return PrCurves(curves={who: {iou: {f"class-{i:04d}": curve for i in range(classes)} for iou in ("bbox", "segm")}
                            for who in ("challenger", "champion")})


def errors(pictures: int) -> ErrorAnalysis:
    totals = {"objects": 1, "detections": 1, "correct": 1, "confused": 0, "missed": 0, "false_positives": 0}
    model = {"score_thresholds": {}, "thresholds_from": "default", "ap_by_size": {"bbox": {"small": 0.1}},
             "confusion": {"labels": ["background"], "counts": [[0]]}, "totals": totals, "worst_images": []}
    image = {"image_id": 1, "file_name": "a.jpg", "objects": 1, "correct": 0, "confused": 0, "missed": 1,
             "false_positives": 0, "error_score": 1, "wrong_score_sum": 0.0}
    gallery = [{"image_id": i, "file_name": f"{i}.jpg", "errors": {"challenger": image},
                "pictures": {"challenger": f"errors/{i}.jpg"},
                "thumbnails": {"challenger": THUMBNAIL, "champion": THUMBNAIL}} for i in range(pictures)]
    return ErrorAnalysis.model_validate({"models": {"challenger": model}, "gallery": gallery})


def put_report(s3: Any, execution: Any, evaluation: dict[str, Any], pr: PrCurves, err: ErrorAnalysis) -> str:
    key = key_of(report_uris(execution)["evaluation"])
    folder = key.rsplit("/", 1)[0] + "/report/"
    s3.put_object(Bucket=ARTIFACTS, Key=key, Body=json.dumps(evaluation).encode())
    s3.put_object(Bucket=ARTIFACTS, Key=folder + "pr_curves.json", Body=pr.model_dump_json().encode())
    s3.put_object(Bucket=ARTIFACTS, Key=folder + "errors.json", Body=err.model_dump_json().encode())
    return key


def get_evaluation() -> tuple[dict[str, Any], int]:
    """The answer's body and the size of the whole response the function returns (what Lambda limits)."""
    event = copy.deepcopy(support.load_event("status_api", "list_runs"))
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/runs/{support.RUN_ID}/evaluation"
    response = api.handler(event, support.FakeLambdaContext())
    assert response["statusCode"] == 200, response["body"][:500]
    return json.loads(response["body"]), len(json.dumps(response).encode())


def test_a_report_over_the_budget_is_answered_truncated_with_links_to_the_whole(
        monkeypatch: pytest.MonkeyPatch, aws: dict[str, Any]) -> None:
    """1,000 classes with masks and a full gallery: about 9 MB whole. Catches: an answer over Lambda's 6 MB
    (API Gateway's 502), a cut not said (truncated, left_out), no way to the rest (links), more left out than
    needed (the per-class tables are kept)."""
    evaluation, pr, err = report(1000), curves(1000), errors(8)
    put_report(aws["s3"], aws["execution"], evaluation, pr, err)
    whole = response_budget.encoded_size({**evaluation, "pr_curves": pr.model_dump(mode="json"),
                                          "errors": err.model_dump(mode="json")})
    assert whole > response_budget.LAMBDA_RESPONSE_LIMIT  # the case this test is about
    use_clients(monkeypatch, aws, aws["s3"])
    body, size = get_evaluation()
    assert size < response_budget.LAMBDA_RESPONSE_LIMIT, f"{size} bytes: Lambda would refuse the answer"
    assert body["truncated"] is True
    assert body["left_out"] == ["errors.gallery.thumbnails", "pr_curves"]
    assert body["pr_curves"] is None and all(g["thumbnails"] == {} for g in body["errors"]["gallery"])
    assert len(body["challenger"]["per_class"]) == 1000 and body["champion"]["per_class"] == evaluation["champion"][
        "per_class"]
    links = {link["name"]: link for link in body["full_report"]}
    assert set(links) == {"evaluation", "pr_curves", "errors"}
    assert links["evaluation"]["uri"] == report_uris(aws["execution"])["evaluation"]
    fetched = requests.get(links["pr_curves"]["url"], timeout=30)  # moto answers the presigned GET
    assert fetched.status_code == 200 and PrCurves.model_validate_json(fetched.content) == pr
    EvaluationView.model_validate(body)


def test_a_report_within_the_budget_is_answered_whole_as_before(monkeypatch: pytest.MonkeyPatch,
                                                                  aws: dict[str, Any]) -> None:
    """Catches: a normal report cut or linked (the budget applied to every answer, or measured wrongly)."""
    evaluation, pr, err = report(80), curves(80), errors(8)
    put_report(aws["s3"], aws["execution"], evaluation, pr, err)
    use_clients(monkeypatch, aws, aws["s3"])
    body, _ = get_evaluation()
    assert (body["truncated"], body["left_out"], body["full_report"]) == (False, [], [])
    assert PrCurves.model_validate(body["pr_curves"]) == pr and ErrorAnalysis.model_validate(body["errors"]) == err
    assert body["challenger"] == evaluation["challenger"] and body["champion"] == evaluation["champion"]


def test_parts_are_given_up_in_order_and_only_as_many_as_needed() -> None:
    """Catches: a part dropped although the answer already fit, the order not the documented one, a drop
    that leaves its part in place, a document within the budget changed."""
    document = {"pr_curves": {"curves": "x" * 1000}, "challenger": {"metrics": {"a": 1.0}, "per_class": {"c": {}}},
                "comparison": {"classes": {"c": "y" * 1000}, "per_class": {"c": "z" * 10}},
                "errors": {"gallery": [{"thumbnails": {"challenger": "t" * 3000}}], "models": {}}}
    small = copy.deepcopy(document)
    assert response_budget.fit(small, budget=10**6) == [] and small == document
    left = response_budget.fit(document, budget=1500)
    assert left == ["errors.gallery.thumbnails", "pr_curves"]
    assert response_budget.encoded_size(document) <= 1500
    assert document["pr_curves"] is None and document["errors"]["gallery"][0]["thumbnails"] == {}
    assert document["comparison"]["classes"] != {}  # it fitted before comparison.classes' turn


def test_the_measure_counts_what_the_response_escapes() -> None:
    """Quotes and non-ASCII cost more in the response than in the body: the measure counts the response's."""
    document = {"q": '"' * 1000, "u": "é" * 1000, "s": "😀" * 1000}
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    for ascii_only in (True, False):  # however the runtime encodes the response
        in_response = json.dumps(body, ensure_ascii=ascii_only).encode()
        assert response_budget.encoded_size(document) >= len(in_response)
    assert response_budget.encoded_size(document) > 2 * len(body.encode())


def test_every_drop_names_a_field_of_the_answer() -> None:
    """A drop's name is a path of EvaluationView (a renamed field would otherwise never be dropped)."""
    schema = EvaluationView.model_json_schema()
    for name, _ in response_budget.DROPS:
        assert name.split(".")[0] in schema["properties"], name
