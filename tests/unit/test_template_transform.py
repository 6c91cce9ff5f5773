"""The template after the SAM transform, as CloudFormation will receive it.

cfn-lint 1.x validates SAM resources without running the transform, so a Ref or GetAtt to a
resource SAM generates (or to one that does not exist) passes it silently; so do SAM
policy templates that expand to broad grants. Here samtranslator runs offline, with local
code paths swapped for placeholder S3 URIs (what `sam package` does), and the result is
checked for dangling references and over-broad roles.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest

from d2ops.template import PSEUDO_PARAMETERS, load_template

LOCAL_URI_KEYS = ("CodeUri", "ContentUri", "DefinitionUri")


@pytest.fixture(scope="module")
def transformed() -> dict[str, Any]:
    from samtranslator.translator.transform import transform

    document = copy.deepcopy(load_template().document)
    for res in document["Resources"].values():
        for key in LOCAL_URI_KEYS:
            if isinstance((res.get("Properties") or {}).get(key), str):
                res["Properties"][key] = "s3://placeholder-bucket/placeholder-key"

    class NoManagedPolicies:
        def load(self) -> dict[str, str]:
            return {}

    params = {"TrainingImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
              "ServingImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/s:1"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        result: dict[str, Any] = transform(document, params, NoManagedPolicies())
    return result


def walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def test_every_reference_resolves_after_the_transform(transformed: dict[str, Any]) -> None:
    known = set(transformed["Resources"]) | set(transformed.get("Parameters", {})) | set(PSEUDO_PARAMETERS)
    dangling: set[str] = set()
    for node in walk(transformed):
        if not isinstance(node, dict) or len(node) != 1:
            continue
        (key, arg), = node.items()
        if key == "Ref" and isinstance(arg, str):
            dangling |= {arg} - known
        elif key == "Fn::GetAtt":
            target = arg.split(".")[0] if isinstance(arg, str) else arg[0]
            dangling |= {target} - known
        elif key == "Fn::Sub":
            text = arg if isinstance(arg, str) else arg[0]
            local = set() if isinstance(arg, str) else set(arg[1])
            names = {m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", text)}
            dangling |= names - known - local
    assert dangling == set(), f"references to resources that do not exist after the transform: {sorted(dangling)}"


def _statements(statements: list[Any]) -> list[dict[str, Any]]:
    """Each statement, with both branches of a conditional one (Fn::If: [condition, then, else]) checked."""
    found: list[dict[str, Any]] = []
    for st in statements:
        if isinstance(st, dict) and set(st) == {"Fn::If"}:
            found += _statements([branch for branch in st["Fn::If"][1:] if branch != {"Ref": "AWS::NoValue"}])
        else:
            found.append(st)
    return found


def test_generated_roles_have_no_wildcard_actions(transformed: dict[str, Any]) -> None:
    roles = {k: v for k, v in transformed["Resources"].items() if v["Type"] == "AWS::IAM::Role"}
    assert len(roles) >= 7, sorted(roles)  # one per function and state machine, plus SageMaker's
    for rid, role in roles.items():
        for policy in role["Properties"].get("Policies", []):
            for st in _statements(policy["PolicyDocument"]["Statement"]):
                actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
                for action in actions:
                    assert action != "*" and not action.endswith(":*"), f"{rid}/{policy['PolicyName']}: {action}"


def test_trigger_rule_is_generated_where_the_dead_letter_queue_policy_expects_it(transformed: dict[str, Any]) -> None:
    resources = transformed["Resources"]
    rules = {k: v for k, v in resources.items()
             if v["Type"] == "AWS::Events::Rule" and v["Properties"]["EventPattern"]["source"] == ["aws.s3"]}
    (rule_id,) = rules
    (target,) = rules[rule_id]["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["StartPipelineFunction", "Arn"]}
    queue_policy = resources["TriggerDeadLetterQueuePolicy"]["Properties"]["PolicyDocument"]
    conditions = [st["Condition"] for st in queue_policy["Statement"] if st["Effect"] == "Allow"]
    assert conditions[0]["ArnEquals"]["aws:SourceArn"] == {"Fn::GetAtt": [rule_id, "Arn"]}


def _integration_action(resource: str) -> str:
    """arn:${Partition}:states:::sagemaker:createTrainingJob.sync -> sagemaker:CreateTrainingJob."""
    tail = resource.split(":::", 1)[1].removeprefix("aws-sdk:")
    service, _, api = tail.partition(":")
    api = api.split(".")[0]
    if (service, api) == ("lambda", "invoke"):
        return "lambda:InvokeFunction"
    if service == "sfn":  # IAM's prefix for Step Functions
        service = "states"
    return f"{service}:{api[0].upper()}{api[1:]}"


def test_state_machine_role_grants_every_integration_the_definition_uses(transformed: dict[str, Any]) -> None:
    import json

    sm = load_template().state_machine()
    definition = json.loads(sm.definition_path.read_text())
    resources: set[str] = set()
    for node in walk(definition):
        if isinstance(node, dict) and node.get("Type") == "Task":
            resources.add(node["Resource"])
    needed = {_integration_action(r) for r in resources}
    assert "sagemaker:CreateTrainingJob" in needed  # the parser understood the definition

    role_ref = transformed["Resources"][sm.logical_id]["Properties"]["RoleArn"]
    role = transformed["Resources"][role_ref["Fn::GetAtt"][0]]
    granted = {
        action
        for policy in role["Properties"]["Policies"]
        for st in policy["PolicyDocument"]["Statement"] if st["Effect"] == "Allow"
        for action in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    }
    assert needed - granted == set(), f"the state machine role lacks {sorted(needed - granted)}"


def test_every_eventbridge_dead_letter_queue_admits_its_rule_and_function(transformed: dict[str, Any]) -> None:
    # The queue policies name the rules SAM generates (<Function><Event>); the function's role gets
    # sqs:SendMessage for its DeadLetterQueue from SAM, or Lambda cannot put failed events there.
    resources = transformed["Resources"]
    rules = {k: v for k, v in resources.items() if v["Type"] == "AWS::Events::Rule"}
    assert len(rules) >= 2, sorted(rules)
    for rule_id, rule in rules.items():
        (target,) = rule["Properties"]["Targets"]
        function = target["Arn"]["Fn::GetAtt"][0]
        queue = target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]
        assert resources[function]["Properties"]["DeadLetterConfig"]["TargetArn"] == {"Fn::GetAtt": [queue, "Arn"]}
        (policy,) = [v for v in resources.values()
                     if v["Type"] == "AWS::SQS::QueuePolicy" and {"Ref": queue} in v["Properties"]["Queues"]]
        allows = [st for st in policy["Properties"]["PolicyDocument"]["Statement"] if st["Effect"] == "Allow"]
        assert allows[0]["Condition"]["ArnEquals"]["aws:SourceArn"] == {"Fn::GetAtt": [rule_id, "Arn"]}, rule_id
        role = resources[function]["Properties"]["Role"]["Fn::GetAtt"][0]
        granted = [st for policy in resources[role]["Properties"].get("Policies", [])
                   for st in policy["PolicyDocument"]["Statement"]
                   if "sqs:SendMessage" in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])]
        assert any(st["Resource"] == {"Fn::GetAtt": [queue, "Arn"]} for st in granted), f"{role} cannot send to {queue}"
