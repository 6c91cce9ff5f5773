"""The Model Registry description: bounded and cleaned where it is made, so registration never fails on it.

The constraint is read from botocore's model of CreateModelPackage (ModelPackageDescription, shape
EntityDescription), not restated: a length maximum and a pattern of Unicode categories. A description
outside it is refused by SageMaker, and the run would end RegistrationFailed instead of with the gate's
verdict. The reason people read (notification, status API, the run's cause) stays whole.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import unicodedata
from typing import Any
from unittest import mock

import boto3
import botocore.session
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from d2ops import aws_contract as contract
from d2ops.asl.errors import TaskFailed
from d2ops.asl.mock import MockConfig, MockTestCase
from d2ops_core import platform
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

support.function_path("summarize_evaluation")
from summarize_evaluation import service  # noqa: E402
from summarize_evaluation.models import SummarizeEvent  # noqa: E402

_INPUT = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateModelPackage").input_shape
assert _INPUT is not None
SHAPE = _INPUT.members["ModelPackageDescription"]
MAX = SHAPE.metadata["max"]
# botocore writes it in Java's syntax, [\p{L}\p{M}...]*, which Python's re cannot compile: read the categories.
_PATTERN = re.fullmatch(r"\[((?:\\p\{[A-Z]\})+)\]\*", SHAPE.metadata["pattern"])
assert _PATTERN, f"EntityDescription's pattern changed shape: {SHAPE.metadata['pattern']!r}"
CATEGORIES = frozenset(re.findall(r"\\p\{([A-Z])\}", _PATTERN[1]))
DEFINITION = json.loads(support.DEFINITION.read_text())


def problems(description: str) -> list[str]:
    """What SageMaker would refuse in ``description`` (both its length counts, each character's category)."""
    found = []
    units = len(description.encode("utf-16-le", "surrogatepass")) // 2
    if max(len(description), units) > MAX:
        found.append(f"{len(description)} characters ({units} UTF-16 units), more than {MAX}")
    bad = sorted({c for c in description if unicodedata.category(c)[0] not in CATEGORIES})
    if bad:
        found.append(f"characters outside {sorted(CATEGORIES)}: {[hex(ord(c)) for c in bad][:5]}")
    return found


def test_the_platform_table_states_botocore_s_constraint() -> None:
    assert platform.MODEL_PACKAGE_DESCRIPTION_MAX == MAX == 1024
    assert platform.MODEL_PACKAGE_DESCRIPTION_CATEGORIES == CATEGORIES == set("LMZSNP")
    assert problems("shapes v1: challenger bbox_AP 0.5") == []
    assert problems("a\x00b") and problems("x" * (MAX + 1)) and problems("\U0001f600" * (MAX // 2 + 1))


HOSTILE = st.sampled_from(["\x00", "\x1b[31m", "\n", "\r\n", "\t", "\u202e", "\u200b", "\ud800", "\udfff",
                           "\U0001f600", "e\u0301", "\ufeff", "\x85", "\u2028", "{}", "'", "\\", "\U000e0001"])
# Any code point (surrogates too: JSON can carry a lone one), long runs, and the hostile pieces above.
NAME = st.lists(st.text(st.characters(codec=None), max_size=40) | HOSTILE | st.builds(lambda c, n: c * n, HOSTILE,
                st.integers(1, 600)), max_size=8).map("".join)


def report(names: list[str]) -> dict[str, Any]:
    """Every class regressed (challenger 0.1, champion 0.9, plenty of val instances)."""
    def side(ap: float) -> dict[str, Any]:
        return {"metrics": {"bbox_AP": 0.6}, "per_class": {n: {"bbox_AP": ap} for n in names}}
    document = {"primary_metric": "bbox_AP", "val_images": 40, "class_instances": dict.fromkeys(names, 100),
                "challenger": side(0.1), "champion": side(0.9)}
    return {**document, "comparison": support.point_comparison(document), "held_out": support.held_out(document)}


def summarize(names: list[str], dataset: str, version: str) -> dict[str, Any]:
    from d2ops_core.documents.evaluation import EvaluationReport

    event = SummarizeEvent.model_validate({
        "report_uri": "s3://b/evaluation.json", "dataset": {"name": dataset, "version": version},
        "gate": {"primary_metric": "bbox_AP", "min_map": 0.0, "max_regression": 1.0, "max_class_regression": 0.1,
                 "min_class_instances": 30}})
    return service.summarize(EvaluationReport.model_validate(report(names)), event).model_dump(mode="json")


@settings(max_examples=150, deadline=None)
@given(names=st.lists(NAME, min_size=1, max_size=14, unique=True), dataset=NAME, version=NAME)
def test_hostile_class_and_dataset_names_give_a_description_sagemaker_accepts(names: list[str], dataset: str,
                                                                             version: str) -> None:
    summary = summarize(names, dataset, version)
    for description in (summary["description_head"] + summary["class_gate_description"],
                        summary["description_head"] + summary["gate_description"]):  # what the ASL registers
        assert problems(description) == [], (description[:200], problems(description))
    head = summary["description_head"]
    assert head.endswith(": ") and len(head) <= service.DESCRIPTION_HEAD_MAX
    # What it keeps is the cleaned text itself, and a cut says how much it left out.
    for whole, kept in ((f"{dataset} {version}", head[:-2]),
                        (summary["class_gate_reason"], summary["class_gate_description"])):
        cleaned = service.registry_text(whole)
        assert len(cleaned) == len(whole)
        cut = re.fullmatch(r"(?s)(.*)\u2026 \((\d+) more characters\)", kept)
        if kept != cleaned:
            assert cut is not None and cleaned.startswith(cut[1]), (whole[:80], kept[-80:])
            assert int(cut[2]) == len(cleaned) - len(cut[1]) > 0
    # The reason people read keeps every listed class name, whatever its characters or length.
    listed = [r["class_name"] for r in summary["class_regressions"]]
    assert all(n in summary["class_gate_reason"] for n in listed)


def test_bounded_cuts_to_the_limit_and_counts_what_it_left_out() -> None:
    assert service.bounded("abc", 3) == "abc"
    text = "x" * 2000
    cut = service.bounded(text, 100)
    assert cut == "x" * 76 + "\u2026 (1924 more characters)" and len(cut) == 100
    # Astral characters are two UTF-16 units: the limit holds in both counts, and no pair is split.
    emoji = service.bounded("\U0001f600" * 600, MAX)
    assert problems(emoji) == [] and set(emoji.split("\u2026")[0]) == {"\U0001f600"}
    # With 9 kept, 22 would be left out: a two-digit count, one character longer than the one-digit
    # suffix the room was first measured with, so the cut gives back one more character for it.
    assert service.bounded("y" * 31, 30) == "y" * 8 + "\u2026 (23 more characters)"
    assert service.registry_text("a\x00b\nc\u202ed\ud800") == "a\ufffdb c\ufffdd\ufffd"


def _gate_state(name: str) -> dict[str, Any]:
    return all_states(DEFINITION)[name]["Parameters"]


def test_every_gate_verdict_describes_the_model_version_within_the_limit() -> None:
    """The numeric verdicts' descriptions are their reasons after the bounded head, the class verdict's
    its bounded reason, and the Register state sends that description, never the unbounded reason."""
    register = all_states(DEFINITION)["Register model version"]["Parameters"]
    assert register["ModelPackageDescription.$"] == "$.gate.description"
    verdicts = [s for s, d in all_states(DEFINITION).items()
                if d.get("Type") == "Pass" and d.get("Next") == "Register model version"]
    assert len(verdicts) == 5  # approved, the three refusals, and review (PendingManualApproval)
    for verdict in verdicts:  # the Lambda decided and worded each verdict; its description is bounded there
        params = _gate_state(verdict)
        assert params["reason.$"] == "$.evaluation.gate_reason", verdict
        assert params["description.$"] == ("States.Format('{}{}', $.evaluation.description_head, "
                                           "$.evaluation.gate_description)"), verdict
    assert service.CLASS_GATE_DESCRIPTION_MAX + service.DESCRIPTION_HEAD_MAX == MAX


# ----- a run: a class with a 700-character name, through the real definition and the real Lambda

def _run(names: list[str], dataset_name: str) -> tuple[Any, list[dict[str, Any]]]:
    """The GateFailedClassRegression path with the real summarize Lambda reading a report of ``names``
    and a "Register model version" that refuses what SageMaker refuses (botocore's model)."""
    sm = support.machine()
    case = MockConfig.from_file(support.MOCK_CONFIG).test_case(sm.name, "GateFailedClassRegression")
    responses = {s: r for s, r in case.responses.items()
                 if s not in {"Read evaluation report", "Register model version"}}
    mocks = MockTestCase(case.state_machine, case.name, responses)
    registered: list[dict[str, Any]] = []

    def lambdas(resource: str, parameters: Any, context: Any) -> Any:
        if parameters.get("FunctionName") != support.substitutions()["SummarizeEvaluationFunctionArn"]:
            return support._describe_failure(resource, parameters, context)
        bucket, key = parameters["Payload"]["report_uri"].removeprefix("s3://").split("/", 1)
        handler = importlib.import_module("summarize_evaluation.handler").handler
        with mock_aws(), mock.patch.dict(os.environ, {"AWS_DEFAULT_REGION": support.REGION}):
            s3 = boto3.client("s3")
            s3.create_bucket(Bucket=bucket)
            s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(report(names)).encode())
            payload = handler(parameters["Payload"], support.FakeLambdaContext())
        return {"StatusCode": 200, "Payload": payload}

    def create_model_package(resource: str, parameters: Any, context: Any) -> Any:
        registered.append(parameters)
        integration = contract.parse_resource(resource)
        refused = contract.request_problems("sagemaker", "CreateModelPackage",
                                            contract.as_sdk_request(integration, parameters))
        refused += problems(parameters.get("ModelPackageDescription", ""))
        if refused:  # an unmodelled ValidationException, as the aws-sdk integration names it
            raise TaskFailed("SageMaker.SageMakerException", f"ValidationException: {refused}")
        return {"ModelPackageArn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/d2ops-models/2"}

    run_input = {**support.INPUT, "dataset": {**support.INPUT["dataset"], "name": dataset_name}}
    execution = sm.run(run_input, mock=mocks, execution_name=support.RUN_ID, executors={
        "arn:aws:states:::lambda:invoke": lambdas,
        "arn:aws:states:::aws-sdk:sagemaker:createModelPackage": create_model_package,
        "arn:aws:*": support._unexpected})
    return execution, registered


def test_a_run_with_a_long_class_name_ends_with_the_gate_s_verdict_not_a_registration_failure() -> None:
    long_name = "a-long-class-" + "\u00e9\x07" * 350  # 713 characters, a control character in every other
    names = [long_name, *(f"class-{i}-" + "z" * 90 for i in range(12))]
    execution, registered = _run(names, dataset_name="shapes\x1b[2J" + "n" * 300)
    assert execution.status == "FAILED" and execution.error == "QualityGateFailed", (execution.error,
                                                                                     execution.cause)
    states = support.entered_states(execution)
    assert "Worse than champion on a class" in states and "Record registration failure" not in states
    (request,) = registered
    assert problems(request["ModelPackageDescription"]) == []
    assert request["ModelPackageDescription"].startswith("shapes\ufffd[2J" + "n" * 100)
    assert "more characters)" in request["ModelPackageDescription"]
    # The run's cause (what the notification and the status API show) is the whole reason.
    assert long_name in execution.cause and "and 3 more; overall vs champion 0.600" in execution.cause
