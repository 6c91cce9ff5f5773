"""The pipeline's resources in template.yaml agree with each other and with the Lambda code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from d2ops import template as sam
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

TEMPLATE = sam.load_template()
OUR_FUNCTIONS = {"StartPipelineFunction": "start_pipeline", "PrepareTrainingFunction": "prepare_training",
                 "SummarizeEvaluationFunction": "summarize_evaluation",
                 "SmokeTestEndpointFunction": "smoke_test_endpoint", "StatusApiFunction": "status_api",
                 "DescribeFailureFunction": "describe_failure"}
REFS = {"AWS::StackName": "stack", "SageMakerNamePrefix": "prefix"}


def resolved(value: Any) -> Any:
    return TEMPLATE.resolve(value, REFS, getatt=lambda logical_id, attribute: f"{logical_id}.{attribute}")


def statements(logical_id: str) -> list[dict[str, Any]]:
    policies = TEMPLATE.resource(logical_id)["Properties"]["Policies"]
    return [s for p in policies if isinstance(p, dict) and "Statement" in p for s in p["Statement"]]


def test_the_endpoint_name_is_the_same_everywhere() -> None:
    name = resolved(TEMPLATE.state_machine("PipelineStateMachine").definition_substitutions["EndpointName"])
    assert name == "prefix-detector"
    for alarm in ("EndpointErrorAlarm", "EndpointLatencyAlarm"):
        dims = {d["Name"]: resolved(d["Value"]) for d in TEMPLATE.resource(alarm)["Properties"]["Dimensions"]}
        assert dims == {"EndpointName": name, "VariantName": "AllTraffic"}  # the ASL's only variant
    for logical_id, sid in (("SmokeTestEndpointFunction", "InvokeTheEndpoint"),
                            ("PipelineStateMachine", "ManageTheEndpoint")):
        (statement,) = [s for s in statements(logical_id) if s["Sid"] == sid]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        assert any(str(resolved(r)).endswith(f":endpoint/{name}") for r in resources)
    assert resolved(TEMPLATE.document["Outputs"]["EndpointName"]["Value"]) == name
    create = all_states(json.loads(support.DEFINITION.read_text()))["Create endpoint config"]["Parameters"]
    assert create["ProductionVariants.$"] == "$.plan.endpoint.production_variants"  # prepare_training's, whole
    support.function_path("prepare_training")
    from prepare_training.service import VARIANT_NAME
    assert VARIANT_NAME == "AllTraffic"


def test_the_model_package_group_is_the_same_everywhere() -> None:
    group = resolved(TEMPLATE.resource("ModelPackageGroup")["Properties"]["ModelPackageGroupName"])
    subs = TEMPLATE.state_machine("PipelineStateMachine").definition_substitutions
    assert resolved(subs["ModelPackageGroupName"]) == group
    env = TEMPLATE.function("StatusApiFunction").environment
    assert resolved(env["MODEL_PACKAGE_GROUP_NAME"]) == group


@pytest.mark.parametrize(("logical_id", "directory"), sorted(OUR_FUNCTIONS.items()))
def test_functions_follow_the_layout(logical_id: str, directory: str) -> None:
    spec = TEMPLATE.function(logical_id)
    assert spec.code_uri.rstrip("/") == f"functions/{directory}"
    assert spec.handler == f"{directory}.handler.handler"
    # The functions' lock (tests/unit/test_pins_agree.py): Powertools with its parser and tracer extras.
    assert re.search(r"^aws-lambda-powertools==", (spec.code_dir / "requirements.txt").read_text(), re.M)
    for part in ("handler", "models", "service"):
        assert (spec.code_dir / directory / f"{part}.py").is_file()


def test_handlers_import_no_training_framework() -> None:
    """One fresh interpreter imports every handler in turn and reports what each one added."""
    specs = [TEMPLATE.function(logical_id) for logical_id in sorted(OUR_FUNCTIONS)]
    probe = ("import json, sys\n"
             "banned = {'torch', 'torchvision', 'model_code', 'moto', 'cfnlint'}\n"
             "found = {}\n"
             f"for code_dir, module in {[(str(s.code_dir), s.handler_module) for s in specs]!r}:\n"
             "    sys.path.insert(0, code_dir)\n"
             "    __import__(module)\n"
             "    found[module] = sorted(m for m in sys.modules if m.split('.')[0] in banned)\n"
             "print(json.dumps(found))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "AWS_DEFAULT_REGION": "us-east-1",
                                 "PYTHONPATH": str(support.REPO / "src")})
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert set(found) == {s.handler_module for s in specs}
    assert all(modules == [] for modules in found.values()), found


def test_the_trigger_rule_matches_manifests_of_the_data_bucket_and_has_a_dead_letter_queue() -> None:
    event = TEMPLATE.function("StartPipelineFunction").properties["Events"]["ManifestUploaded"]
    pattern = event["Properties"]["Pattern"]
    assert pattern["detail-type"] == ["Object Created"]
    assert pattern["detail"]["object"]["key"] == [{"wildcard": "datasets/*/manifest.json"}]
    assert pattern["detail"]["bucket"]["name"] == [{"Ref": "DataBucket"}]
    assert event["Properties"]["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": ["TriggerDeadLetterQueue", "Arn"]}
    sample = support.load_event("start_pipeline", "manifest_uploaded")
    assert sample["detail-type"] == "Object Created" and sample["source"] == pattern["source"][0]


def test_the_status_api_routes_are_iam_authorized_and_match_the_code() -> None:
    api = TEMPLATE.resource("StatusHttpApi")["Properties"]
    assert api["Auth"]["DefaultAuthorizer"] == "AWS_IAM"
    assert api["DefaultRouteSettings"]["ThrottlingRateLimit"] > 0
    events = TEMPLATE.function("StatusApiFunction").properties["Events"].values()
    routes = {(e["Properties"]["Method"].lower(), e["Properties"]["Path"]) for e in events}
    document = json.loads((support.REPO / "docs" / "status-api.openapi.json").read_text())
    assert routes == {(method, path) for path, ops in document["paths"].items() for method in ops}
