"""The offline stack's names and settings, resolved from ``template.yaml``.

Every bucket, function, topic and state machine the offline runtime serves gets the name
CloudFormation would hand to the deployed stack's code (through ``Ref``/``Fn::GetAtt`` in
environment variables and DefinitionSubstitutions), computed here from the template
itself, so the offline and the deployed stack cannot drift apart. Only values that have
no local meaning (ECR image URIs) or that must differ on a CPU laptop (the trainer) are
overridden, and those overrides are listed in one place: ``OFFLINE_PARAMETERS`` and
``OFFLINE_FUNCTION_ENV``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d2ops import template as sam
from d2ops_core.cpu_profile import torchvision_job_defaults

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"
STACK_NAME = "d2ops"

# Stack parameters without a meaningful local value. The image URIs are recorded in job and
# model records only; offline, local processes stand in for the containers.
OFFLINE_PARAMETERS: dict[str, str] = {
    "TrainingImageUri": f"{ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/d2ops-training:offline",
    "ServingImageUri": f"{ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/d2ops-serving:offline",
    "UseSpotTraining": "false",
}

# Function settings that must differ on a CPU-only laptop: detectron2 has no PyPI build, so the
# torchvision trainer runs offline; endpoints come up in seconds, so they are polled often. The offline
# stack is addressed by --work-dir, not by a stack name: no STACK_NAME, so a missing-weights failure names
# `d2ops weights upload FILE` and a review request `d2ops approve RUN_ID` without --stack.
OFFLINE_FUNCTION_ENV: dict[str, dict[str, str]] = {
    "PrepareTrainingFunction": {"FRAMEWORK": "torchvision", "ENDPOINT_POLL_SECONDS": "2",
                                "ENDPOINT_MAX_WAIT_ATTEMPTS": "150", "STACK_NAME": ""},
    "RequestReviewFunction": {"STACK_NAME": ""},
}

# Training hyperparameters for CPU runs on small images (the synthetic demo data, the tests): the
# torchvision CPU profile (d2ops/cpu_profile.py, calibrated in docs/training.md) at the
# data's resolution, less the choices that belong to the run (model, iterations). The pipeline's own
# hyperparameters (the manifest's `training` keys) always win over these.
def cpu_training_profile(image_size: int) -> dict[str, str]:
    return torchvision_job_defaults(image_size)


# What Lambda itself puts in every function's environment (the parts handlers may read).
LAMBDA_RUNTIME_ENV: dict[str, str] = {
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
    # No X-Ray daemon offline: Powertools Tracer then records nothing instead of failing.
    "POWERTOOLS_TRACE_DISABLED": "true",
}


INSTANCE_TYPE_PARAMETERS = ("TrainingInstanceType", "EvaluationInstanceType", "EndpointInstanceType")
IMAGE_PARAMETERS = ("TrainingImageUri", "ServingImageUri")


def _notification_configuration(cfn: dict[str, Any]) -> dict[str, Any]:
    """CloudFormation's bucket NotificationConfiguration -> S3's. Only EventBridge is translated: the
    template sends its buckets' events nowhere else (a Topic/Queue/Lambda entry would need ARNs here)."""
    bridge = cfn.get("EventBridgeConfiguration") or {}
    return {"EventBridgeConfiguration": {}} if bridge.get("EventBridgeEnabled") in (True, "true") else {}


class StackError(Exception):
    """The template cannot be resolved into an offline stack."""


def _check_number(name: str, value: str, low: float | None, high: float | None) -> None:
    """A Number parameter's value as CloudFormation checks it: a number within MinValue..MaxValue."""
    try:
        number = float(value)
    except ValueError:
        raise StackError(f"stack parameter {name}={value!r} is not a number") from None
    def shown(bound: float | None, none: str) -> str:
        return none if bound is None else f"{int(bound):,}" if bound.is_integer() else str(bound)

    if (low is not None and number < low) or (high is not None and number > high):
        raise StackError(f"stack parameter {name}={value} is outside its range {shown(low, 'any')}.."
                         f"{shown(high, 'any')} (MinValue..MaxValue in the template)")


@dataclass(frozen=True)
class LocalFunction:
    logical_id: str
    name: str
    arn: str
    code_dir: Path
    handler_module: str
    handler_name: str
    timeout: int
    memory_size: int
    environment: dict[str, str]


@dataclass(frozen=True)
class HttpRoute:
    method: str
    path: str  # /runs/{runId}
    function: str  # logical id


@dataclass(frozen=True)
class EventRule:
    """An ``EventBridgeRule`` event of a function: the rule's pattern and the function it invokes."""

    function: str  # logical id
    pattern: dict[str, Any]


@dataclass
class OfflineStack:
    """Resolved names: buckets, functions, the state machine and its substitutions."""

    parameters: dict[str, str]
    data_bucket: str
    artifacts_bucket: str
    topic_arn: str
    topic_name: str
    state_machine_name: str
    state_machine_arn: str
    definition_path: Path
    substitutions: dict[str, Any]
    functions: dict[str, LocalFunction]
    routes: list[HttpRoute]
    trigger_function: str  # logical id of the function the S3 EventBridge rule invokes
    trigger_pattern: dict[str, Any]
    model_package_group: str
    endpoint_name: str
    buckets: list[str] = field(default_factory=list)
    # AWS::DynamoDB::Table resources: table name -> resolved Properties (the runtime creates them in moto).
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Every function's EventBridge rules (the S3 trigger's among them): the runtime delivers events to them.
    rules: list[EventRule] = field(default_factory=list)
    # AWS::CloudWatch::Alarm resources: alarm name -> resolved Properties (the runtime creates
    # them in moto, where the canary's auto-rollback reads and the state machine trips them).
    alarms: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Bucket name -> its S3 NotificationConfiguration (PutBucketNotificationConfiguration's shape).
    bucket_notifications: dict[str, dict[str, Any]] = field(default_factory=dict)

    def instance_types(self) -> list[str]:
        """The SageMaker instance types the stack's jobs and endpoint ask for (its parameters)."""
        return sorted({self.parameters[p] for p in INSTANCE_TYPE_PARAMETERS if p in self.parameters})

    def images(self) -> list[tuple[str, str]]:
        """(repository, tag) of the ECR images the stack parameters name by tag (a digest names no tag to push)."""
        found = []
        for parameter in IMAGE_PARAMETERS:
            path = self.parameters[parameter].partition("/")[2]
            if "@" not in path:
                repository, _, tag = path.partition(":")
                found.append((repository, tag))
        return found

    def lambda_environment(self) -> dict[str, str]:
        """The union of every function's environment; refuses two functions disagreeing on a value.

        Handlers run in one process offline, so they share ``os.environ``; that is only faithful
        when no two functions give the same variable different values (true of this template,
        where a name always means the same resource).
        """
        merged: dict[str, str] = dict(LAMBDA_RUNTIME_ENV)
        owner: dict[str, str] = {}
        for fn in self.functions.values():
            for key, value in fn.environment.items():
                if key in merged and key in owner and merged[key] != value:
                    raise StackError(f"functions {owner[key]} and {fn.logical_id} set {key} to different values "
                                     f"({merged[key]!r} vs {value!r}); they cannot share one offline process")
                merged[key] = value
                owner[key] = fn.logical_id
        return merged


def _ref_value(logical_id: str, resource: dict[str, Any], stack: str) -> str:
    kind = resource.get("Type", "")
    props = resource.get("Properties") or {}
    if kind == "AWS::S3::Bucket":
        return f"{stack}-{logical_id.lower()}"
    if kind == "AWS::SNS::Topic":
        return f"arn:aws:sns:{REGION}:{ACCOUNT_ID}:{stack}-{logical_id}"
    if kind == "AWS::SQS::Queue":
        return f"http://sqs.{REGION}.localhost/{ACCOUNT_ID}/{stack}-{logical_id}"
    if kind in (sam.STATE_MACHINE_TYPE, "AWS::StepFunctions::StateMachine"):
        return f"arn:aws:states:{REGION}:{ACCOUNT_ID}:stateMachine:{stack}-{logical_id}"
    if kind == "AWS::SageMaker::ModelPackageGroup" and isinstance(props.get("ModelPackageGroupName"), str):
        return str(props["ModelPackageGroupName"])
    return f"{stack}-{logical_id}"


def _getatt_value(logical_id: str, attribute: str, resource: dict[str, Any], stack: str) -> str:
    kind = resource.get("Type", "")
    ref = _ref_value(logical_id, resource, stack)
    if kind == "AWS::S3::Bucket" and attribute == "Arn":
        return f"arn:aws:s3:::{ref}"
    if kind == sam.FUNCTION_TYPE and attribute == "Arn":
        return f"arn:aws:lambda:{REGION}:{ACCOUNT_ID}:function:{ref}"
    if kind == "AWS::IAM::Role" and attribute == "Arn":
        return f"arn:aws:iam::{ACCOUNT_ID}:role/{ref}"
    if kind == "AWS::SQS::Queue" and attribute == "Arn":
        return f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{stack}-{logical_id}"
    if kind == sam.STATE_MACHINE_TYPE and attribute == "Name":
        return ref.rpartition(":")[2]
    if kind == "AWS::SNS::Topic" and attribute == "TopicName":
        return ref.rpartition(":")[2]
    if kind == "AWS::Logs::LogGroup" and attribute == "Arn":
        return f"arn:aws:logs:{REGION}:{ACCOUNT_ID}:log-group:{ref}"
    raise StackError(f"Fn::GetAtt {logical_id}.{attribute} ({kind}) has no offline value")


def load_stack(template_path: str | Path | None = None, parameters: Mapping[str, str] | None = None,
               stack_name: str = STACK_NAME, function_env: Mapping[str, Mapping[str, str]] | None = None
               ) -> OfflineStack:
    """Resolve the template's names for an offline stack; ``parameters`` override stack parameters.

    ``function_env`` overrides function environment variables over ``OFFLINE_FUNCTION_ENV``, by
    logical id (``make demo`` picks the trainer with ``{"PrepareTrainingFunction": {"FRAMEWORK": ...}}``).
    """
    try:
        tpl = sam.load_template(template_path)
    except sam.TemplateError as exc:
        raise StackError(str(exc)) from exc
    known = tpl.parameters()
    params = {**tpl.parameter_defaults(), **OFFLINE_PARAMETERS, **(parameters or {})}
    unknown = sorted(set(parameters or {}) - set(known))
    if unknown:
        raise StackError(f"unknown stack parameter(s) {unknown}; the template defines {sorted(known)}")
    for name, spec in known.items():
        if name not in params:
            raise StackError(f"stack parameter {name} has no default and no offline value")
        if spec.allowed_values is not None and params[name] not in spec.allowed_values:
            raise StackError(f"stack parameter {name}={params[name]!r} is not one of {spec.allowed_values}")
        if spec.type == "Number":
            _check_number(name, params[name], spec.min_value, spec.max_value)
    resources = tpl.resources
    refs: dict[str, Any] = {"AWS::StackName": stack_name, "AWS::Region": REGION, "AWS::AccountId": ACCOUNT_ID,
                            **params}
    for logical_id, res in resources.items():
        refs.setdefault(logical_id, _ref_value(logical_id, res, stack_name))

    def getatt(logical_id: str, attribute: str) -> str:
        if logical_id not in resources:
            raise StackError(f"Fn::GetAtt refers to unknown resource {logical_id}")
        return _getatt_value(logical_id, attribute, resources[logical_id], stack_name)

    def resolve(value: Any) -> Any:
        try:
            return tpl.resolve(value, refs, getatt=getatt, conditions=lambda n: tpl.condition(n, refs))
        except sam.TemplateError as exc:
            raise StackError(str(exc)) from exc

    functions: dict[str, LocalFunction] = {}
    routes: list[HttpRoute] = []
    rules: list[EventRule] = []
    for logical_id, spec in tpl.functions().items():
        env = {k: str(resolve(v)) for k, v in spec.environment.items()}
        env.update(OFFLINE_FUNCTION_ENV.get(logical_id, {}))
        env.update((function_env or {}).get(logical_id, {}))
        name = str(refs[logical_id])
        functions[logical_id] = LocalFunction(
            logical_id=logical_id, name=name, arn=getatt(logical_id, "Arn"), code_dir=spec.code_dir,
            handler_module=spec.handler_module, handler_name=spec.handler_name, timeout=int(spec.timeout or 3),
            memory_size=int(spec.memory_size or 128), environment=env)
        for event in (spec.properties.get("Events") or {}).values():
            props = event.get("Properties") or {}
            if event.get("Type") == "HttpApi":
                routes.append(HttpRoute(method=str(props["Method"]).upper(), path=str(props["Path"]),
                                        function=logical_id))
            elif event.get("Type") == "EventBridgeRule":
                rules.append(EventRule(function=logical_id, pattern=resolve(props.get("Pattern") or {})))
    # The trigger is the rule on S3 events; other rules (the lease release on execution status) follow runs.
    s3_rules = [r for r in rules if "aws.s3" in (r.pattern.get("source") or [])]
    if len(s3_rules) != 1:
        raise StackError(f"expected one function with an EventBridgeRule on aws.s3 events (what starts runs on "
                         f"upload), found {[r.function for r in s3_rules]}")
    trigger = (s3_rules[0].function, s3_rules[0].pattern)
    tables = {str(refs[k]): resolve(v.get("Properties") or {}) for k, v in resources.items()
              if v.get("Type") == "AWS::DynamoDB::Table"}
    machine = tpl.state_machine()
    substitutions = {k: resolve(v) for k, v in machine.definition_substitutions.items()}
    sm_arn = str(refs[machine.logical_id])
    buckets = sorted(str(refs[k]) for k, v in resources.items() if v.get("Type") == "AWS::S3::Bucket")
    groups = [k for k, v in resources.items() if v.get("Type") == "AWS::SageMaker::ModelPackageGroup"]
    topics = [k for k, v in resources.items() if v.get("Type") == "AWS::SNS::Topic"]
    if len(groups) != 1 or len(topics) != 1:
        raise StackError(f"expected one model package group and one topic, found {groups} and {topics}")
    group_name = resolve((resources[groups[0]].get("Properties") or {}).get("ModelPackageGroupName"))
    topic_arn = str(refs[topics[0]])
    # The alarms the state machine names (its endpoint's auto-rollback alarms); others watch
    # resources (queues, functions) that have no offline counterpart.
    referenced = {str(v["Ref"]) for v in machine.definition_substitutions.values()
                  if isinstance(v, dict) and "Ref" in v}
    alarms = {str(refs[k]): resolve(v.get("Properties") or {}) for k, v in resources.items()
              if v.get("Type") == "AWS::CloudWatch::Alarm" and k in referenced}
    notifications = {str(refs[k]): _notification_configuration(resolve(props["NotificationConfiguration"]))
                     for k, v in resources.items() if v.get("Type") == "AWS::S3::Bucket"
                     and "NotificationConfiguration" in (props := v.get("Properties") or {})}
    endpoint = substitutions.get("EndpointName")
    if not isinstance(endpoint, str):
        raise StackError("DefinitionSubstitutions has no EndpointName")
    return OfflineStack(
        parameters=params, data_bucket=str(refs["DataBucket"]), artifacts_bucket=str(refs["ArtifactsBucket"]),
        topic_arn=topic_arn, topic_name=topic_arn.rpartition(":")[2], state_machine_name=sm_arn.rpartition(":")[2],
        state_machine_arn=sm_arn, definition_path=machine.definition_path, substitutions=substitutions,
        functions=functions, routes=routes, trigger_function=trigger[0], trigger_pattern=trigger[1],
        model_package_group=str(group_name), endpoint_name=endpoint, buckets=buckets,
        tables=tables, rules=rules, alarms=alarms,
        bucket_notifications={k: v for k, v in notifications.items() if v})
