"""The AWS contract: what a Task state or a boto3 call may send, and which errors it can get back.

Three sources, in this order of authority:

- botocore's service models (the same JSON the SDKs are generated from): members, required
  members, types, enums, lengths, ranges, patterns and the modelled error shapes of every
  operation. botocore's own ``ParamValidator`` checks members, required members, types and
  minimums; `request_problems` adds what it leaves to the service (enums, patterns, maximums),
  so a request that passes here is one the service's front end accepts.
- The Step Functions developer guide for the *optimised* integrations
  (``arn:aws:states:::sagemaker:createModel``, ``:::lambda:invoke``, ``:::sns:publish``...):
  Step Functions checks their Parameters against its own list, at ``CreateStateMachine``
  (``SCHEMA_VALIDATION_FAILED: The field "X" is not supported by Step Functions``) or, for
  fields that arrive through ``InputPath``/``.$`` paths, at run time as an uncatchable
  ``States.Runtime``. Anything not listed belongs on ``arn:aws:states:::aws-sdk:...``.
- Step Functions' error naming: ``aws-sdk`` integrations report ``<Service>.<Name>Exception``
  for a modelled error and ``<Service>.<Service>Exception`` for anything else (a missing
  SageMaker endpoint is an unmodelled ``ValidationException``, so it arrives as
  ``SageMaker.SageMakerException``); the optimised integrations keep the modelled names too
  (``SageMaker.ResourceInUseException``, ``DynamoDB.ConditionalCheckFailedException``) and report
  anything else as ``<Service>.Amazon<Service>Exception`` with the error code only in the Cause
  (a throttled or invalid SageMaker call: ``SageMaker.AmazonSageMakerException``). A call whose
  answer never came is the SDK's client error, ``<Service>.SdkClientException`` ("Unable to execute
  HTTP request: ..."): a service exception needs the service's answer.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from d2ops.asl.service_arn import parse_service_arn

SDK_INTEGRATIONS_DOC = "https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html"
SAGEMAKER_DOC = "https://docs.aws.amazon.com/step-functions/latest/dg/connect-sagemaker.html"
LAMBDA_DOC = "https://docs.aws.amazon.com/step-functions/latest/dg/connect-lambda.html"
SNS_DOC = "https://docs.aws.amazon.com/step-functions/latest/dg/connect-sns.html"
DYNAMODB_DOC = "https://docs.aws.amazon.com/step-functions/latest/dg/connect-ddb.html"
ERROR_HANDLING_DOC = "https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html"

# The parameters each optimised integration accepts, as the pages above list them. The
# optimised updateEndpoint predates deployment guardrails: DeploymentConfig (blue/green,
# canary, auto-rollback) is not on its list, so guarded updates use aws-sdk:sagemaker:updateEndpoint.
# EnableManagedSpotTraining and CheckpointConfig joined createTrainingJob's list in 2021
# (https://github.com/aws/aws-step-functions-data-science-sdk-python/issues/42).
OPTIMISED_PARAMETERS: dict[str, frozenset[str]] = {
    "sagemaker:createTrainingJob": frozenset({
        "AlgorithmSpecification", "CheckpointConfig", "DebugHookConfig", "DebugRuleConfigurations",
        "EnableInterContainerTrafficEncryption", "EnableManagedSpotTraining", "EnableNetworkIsolation",
        "Environment", "ExperimentConfig", "HyperParameters", "InputDataConfig", "OutputDataConfig",
        "ProfilerConfig", "ProfilerRuleConfigurations", "ResourceConfig", "RetryStrategy", "RoleArn",
        "StoppingCondition", "Tags", "TensorBoardOutputConfig", "TrainingJobName", "VpcConfig"}),
    "sagemaker:createProcessingJob": frozenset({
        "AppSpecification", "Environment", "ExperimentConfig", "NetworkConfig", "ProcessingInputs",
        "ProcessingJobName", "ProcessingOutputConfig", "ProcessingResources", "RoleArn", "StoppingCondition",
        "Tags"}),
    "sagemaker:createTransformJob": frozenset({
        "BatchStrategy", "DataProcessing", "Environment", "ExperimentConfig", "MaxConcurrentTransforms",
        "MaxPayloadInMB", "ModelClientConfig", "ModelName", "Tags", "TransformInput", "TransformJobName",
        "TransformOutput", "TransformResources"}),
    "sagemaker:createModel": frozenset({
        "Containers", "EnableNetworkIsolation", "ExecutionRoleArn", "ModelName", "PrimaryContainer", "Tags",
        "VpcConfig"}),
    "sagemaker:createEndpointConfig": frozenset({
        "DataCaptureConfig", "EndpointConfigName", "KmsKeyId", "ProductionVariants", "Tags"}),
    "sagemaker:createEndpoint": frozenset({"EndpointConfigName", "EndpointName", "Tags"}),
    "sagemaker:updateEndpoint": frozenset({"EndpointConfigName", "EndpointName"}),
    "lambda:invoke": frozenset({"ClientContext", "FunctionName", "InvocationType", "LogType", "Payload",
                                "Qualifier"}),
    "sns:publish": frozenset({"Message", "MessageAttributes", "MessageDeduplicationId", "MessageGroupId",
                              "MessageStructure", "PhoneNumber", "Subject", "TargetArn", "TopicArn"}),
    "dynamodb:getItem": frozenset({"AttributesToGet", "ConsistentRead", "ExpressionAttributeNames", "Key",
                                   "ProjectionExpression", "ReturnConsumedCapacity", "TableName"}),
    "dynamodb:putItem": frozenset({"ConditionExpression", "ConditionalOperator", "Expected",
                                   "ExpressionAttributeNames", "ExpressionAttributeValues", "Item",
                                   "ReturnConsumedCapacity", "ReturnItemCollectionMetrics", "ReturnValues",
                                   "ReturnValuesOnConditionCheckFailure", "TableName"}),
    "dynamodb:updateItem": frozenset({"AttributeUpdates", "ConditionExpression", "ConditionalOperator",
                                      "Expected", "ExpressionAttributeNames", "ExpressionAttributeValues", "Key",
                                      "ReturnConsumedCapacity", "ReturnItemCollectionMetrics", "ReturnValues",
                                      "ReturnValuesOnConditionCheckFailure", "TableName", "UpdateExpression"}),
    "dynamodb:deleteItem": frozenset({"ConditionExpression", "ConditionalOperator", "Expected",
                                      "ExpressionAttributeNames", "ExpressionAttributeValues", "Key",
                                      "ReturnConsumedCapacity", "ReturnItemCollectionMetrics", "ReturnValues",
                                      "ReturnValuesOnConditionCheckFailure", "TableName"}),
}
OPTIMISED_DOCS = {"sagemaker": SAGEMAKER_DOC, "lambda": LAMBDA_DOC, "sns": SNS_DOC, "dynamodb": DYNAMODB_DOC}
# Only these take ``.sync`` among the optimised actions we may use.
SYNC_ACTIONS = frozenset({"sagemaker:createTrainingJob", "sagemaker:createProcessingJob",
                          "sagemaker:createTransformJob"})

# Error names an optimised integration reports besides the modelled ones (the integration's SDK
# client exception and the service's catch-all). Lambda's list is the one the Lambda page tells
# every Retry to handle. The SDK client exception is a call whose answer never came (the Java SDK's
# SdkClientException, "Unable to execute HTTP request: ..."): it carries no error code, so it cannot
# be the service's Amazon<Service>Exception.
OPTIMISED_ERRORS: dict[str, frozenset[str]] = {
    "sagemaker": frozenset({"SageMaker.AmazonSageMakerException", "SageMaker.SdkClientException"}),
    "lambda": frozenset({"Lambda.AWSLambdaException", "Lambda.SdkClientException",
                         "Lambda.ClientExecutionTimeoutException"}),
    "sns": frozenset({"SNS.AmazonSNSException", "SNS.SdkClientException"}),
    "dynamodb": frozenset({"DynamoDB.AmazonDynamoDBException", "DynamoDB.SdkClientException"}),
}
# The optimised integrations' prefix: their modelled errors keep their own name
# (``Lambda.TooManyRequestsException``, ``DynamoDB.ConditionalCheckFailedException``, and SageMaker's
# ``SageMaker.ResourceInUseException`` / ``ResourceLimitExceededException`` / ``ResourceNotFoundException``,
# .sync creates included: Step Functions developer guide, SageMaker integration); only what botocore's
# model does not list for the service becomes ``<Prefix>.Amazon<Prefix>Exception``.
OPTIMISED_ERROR_PREFIX = {"lambda": "Lambda", "sns": "SNS", "dynamodb": "DynamoDB", "sagemaker": "SageMaker"}
# The ``<Service>`` part of aws-sdk error names (Step Functions' PascalCase service names).
SDK_ERROR_PREFIX = {"sagemaker": "SageMaker", "s3": "S3", "dynamodb": "DynamoDb", "sns": "Sns", "sqs": "Sqs",
                    "lambda": "Lambda", "sfn": "Sfn", "cloudwatch": "CloudWatch", "events": "EventBridge"}
# Step Functions' own error names (the ASL specification and the error handling page).
STATES_ERRORS = frozenset({
    "States.ALL", "States.DataLimitExceeded", "States.ExceedToleratedFailureThreshold", "States.HeartbeatTimeout",
    "States.Http.Socket", "States.IntrinsicFailure", "States.ItemReaderFailed", "States.NoChoiceMatched",
    "States.ParameterPathFailure", "States.Permissions", "States.QueryEvaluationError",
    "States.ResultPathMatchFailure", "States.ResultWriterFailed", "States.Runtime", "States.TaskFailed",
    "States.Timeout", "States.BranchFailed"})
# botocore (and boto3 client) service names where Step Functions' differ.
_BOTOCORE_SERVICE = {"sfn": "stepfunctions", "states": "stepfunctions"}


def client_name(service: str) -> str:
    """The boto3 client (botocore model) for a Task resource's ``<service>`` (``sfn`` -> ``stepfunctions``)."""
    return _BOTOCORE_SERVICE.get(service, service)


def sdk_error_prefix(service: str) -> str:
    """The ``<Service>`` of an aws-sdk integration's error names: Step Functions' PascalCase service
    name (``aws-sdk:cloudwatch`` -> ``CloudWatch``, ``aws-sdk:acmpca`` -> ``AcmPca``)."""
    return SDK_ERROR_PREFIX.get(service, service.capitalize())

class ContractError(ValueError):
    """A Task resource or request the contract cannot place."""


@dataclass(frozen=True)
class Integration:
    """One Task ``Resource``: ``arn:aws:states:::[aws-sdk:]<service>:<action>[.sync]``."""

    service: str
    action: str
    sdk: bool
    pattern: str

    @property
    def key(self) -> str:
        return f"{self.service}:{self.action}"

    @property
    def operation(self) -> str:
        return self.action[0].upper() + self.action[1:]


def parse_resource(resource: str) -> Integration:
    arn = parse_service_arn(resource)
    if arn is None:
        raise ContractError(f"{resource!r} is not a Step Functions service integration ARN")
    integration = Integration(arn.service, arn.action, arn.sdk, arn.pattern)
    if not integration.sdk:
        if integration.key not in OPTIMISED_PARAMETERS:
            raise ContractError(f"{resource}: {integration.key} is not an optimised integration we know the "
                                f"parameter list of; use arn:aws:states:::aws-sdk:{integration.key} "
                                f"({SDK_INTEGRATIONS_DOC})")
        if integration.pattern.startswith(".sync") and integration.key not in SYNC_ACTIONS:
            raise ContractError(f"{resource}: {integration.key} has no .sync pattern")
    elif integration.pattern.startswith(".sync"):
        raise ContractError(f"{resource}: aws-sdk integrations do not support .sync ({SDK_INTEGRATIONS_DOC})")
    return integration


@functools.cache
def _service_model(service: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(client_name(service))


def operation_model(service: str, operation: str) -> Any:
    """botocore's model of ``operation`` (PascalCase, as in the API reference)."""
    model = _service_model(service)
    if operation not in model.operation_names:
        raise ContractError(f"{service} has no operation {operation}")
    return model.operation_model(operation)


def unsupported_fields(integration: Integration, parameters: Mapping[str, Any]) -> list[str]:
    """Top-level fields an optimised integration refuses (none for aws-sdk integrations)."""
    if integration.sdk:
        return []
    allowed = OPTIMISED_PARAMETERS[integration.key]
    return sorted(key.removesuffix(".$") for key in parameters if key.removesuffix(".$") not in allowed)


def unsupported_field_cause(field: str) -> str:
    """Step Functions' words for a field the optimised integration does not take."""
    return f'The field "{field}" is not supported by Step Functions'


def sdk_member_names(value: Any, shape: Any) -> Any:
    """aws-sdk integrations take PascalCase member names even where the API's are camelCase
    (``ExecutionArn`` for Step Functions' ``executionArn``, per SDK_INTEGRATIONS_DOC): the
    request with the model's names."""
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, Mapping):
        members = shape.members
        by_lower = {name.lower(): name for name in members}
        renamed = {(key if key in members else by_lower.get(key.lower(), key)): item for key, item in value.items()}
        return {key: sdk_member_names(item, members.get(key)) for key, item in renamed.items()}
    if shape.type_name == "list" and isinstance(value, list):
        return [sdk_member_names(item, shape.member) for item in value]
    if shape.type_name == "map" and isinstance(value, Mapping):
        return {key: sdk_member_names(item, shape.value) for key, item in value.items()}
    return value


def as_sdk_request(integration: Integration, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The request Step Functions sends for ``parameters``: lambda:invoke serialises a JSON Payload;
    aws-sdk member names are the model's."""
    request = dict(parameters)
    if integration.sdk:
        request = sdk_member_names(request, operation_model(integration.service, integration.operation).input_shape)
    if integration.key == "lambda:invoke" and not isinstance(request.get("Payload", b""), str | bytes):
        request["Payload"] = json.dumps(request["Payload"]).encode()
    return request


def request_problems(service: str, operation: str, request: Mapping[str, Any]) -> list[str]:
    """Everything wrong with ``request`` for ``service.operation`` per botocore's model; empty if none."""
    from botocore.validate import ParamValidator

    shape = operation_model(service, operation).input_shape
    problems: list[str] = []
    report = ParamValidator().validate(dict(request), shape)
    if report.has_errors():
        problems += [line.strip() for line in report.generate_report().splitlines() if line.strip()]
    problems += list(_constraint_problems(request, shape, "params"))
    return problems


def constraint_problems(request: Any, shape: Any) -> list[str]:
    """Enums, patterns and maximums of ``request`` for botocore input ``shape`` (what ParamValidator skips)."""
    return list(_constraint_problems(request, shape, "params"))


@functools.cache
def _pattern(pattern: str) -> re.Pattern[str] | None:
    try:
        # DOTALL: whether a service's `.` refuses line breaks (Java's default) is not something the
        # models say; a free-text member (NextToken: `.*`) is not flagged for holding one.
        return re.compile(pattern, re.DOTALL)
    except re.error:  # a Java-only construct (\p{...} classes): left to the service
        return None


def _constraint_problems(value: Any, shape: Any, where: str) -> Iterator[str]:
    """Enums, patterns and maximums: what botocore's ParamValidator does not check."""
    if shape is None or value is None:
        return
    kind = shape.type_name
    meta = shape.metadata
    if kind == "structure" and isinstance(value, Mapping):
        for name, member in shape.members.items():
            if name in value:
                yield from _constraint_problems(value[name], member, f"{where}.{name}")
    elif kind == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            yield f"{where}: {len(value)} items, more than the maximum {meta['max']}"
        for i, item in enumerate(value):
            yield from _constraint_problems(item, shape.member, f"{where}[{i}]")
    elif kind == "map" and isinstance(value, Mapping):
        if "max" in meta and len(value) > meta["max"]:
            yield f"{where}: {len(value)} entries, more than the maximum {meta['max']}"
        for key, item in value.items():
            yield from _constraint_problems(key, shape.key, f"{where} key {key!r}")
            yield from _constraint_problems(item, shape.value, f"{where}[{key!r}]")
    elif kind == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            yield f"{where}: length {len(value)} is more than the maximum {meta['max']}"
        if shape.enum and value not in shape.enum:
            yield f"{where}: {value!r} is not one of {sorted(shape.enum)}"
        compiled = _pattern(meta["pattern"]) if "pattern" in meta else None
        if compiled is not None and compiled.fullmatch(value) is None:
            yield f"{where}: {value!r} does not match the pattern {meta['pattern']}"
    elif kind in ("integer", "long", "float", "double") and isinstance(value, int | float) \
            and "max" in meta and value > meta["max"]:
        yield f"{where}: {value} is more than the maximum {meta['max']}"


def modelled_errors(service: str, operation: str) -> frozenset[str]:
    return frozenset(shape.name for shape in operation_model(service, operation).error_shapes)


def _with_exception_suffix(name: str) -> str:
    # Step Functions always names errors with the Exception suffix, even where the API
    # reference does not (S3's BucketAlreadyExists is S3.BucketAlreadyExistsException).
    return name if name.endswith("Exception") else f"{name}Exception"


def possible_errors(integration: Integration) -> frozenset[str]:
    """The service error names a Task on ``integration`` can report (without ``States.*``)."""
    modelled = modelled_errors(integration.service, integration.operation)
    if integration.sdk:
        prefix = sdk_error_prefix(integration.service)
        return frozenset({f"{prefix}.{_with_exception_suffix(n)}" for n in modelled}
                         | {f"{prefix}.{prefix}Exception", f"{prefix}.SdkClientException"})
    names = set(OPTIMISED_ERRORS.get(integration.service, frozenset()))
    optimised_prefix = OPTIMISED_ERROR_PREFIX.get(integration.service)
    if optimised_prefix:
        names |= {f"{optimised_prefix}.{_with_exception_suffix(n)}" for n in modelled}
    return frozenset(names)


def tasks(definition: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every Task state, including those inside Parallel branches and Map iterators."""
    for name, state in definition.get("States", {}).items():
        if state.get("Type") == "Task":
            yield name, state
        for branch in state.get("Branches", []):
            yield from tasks(branch)
        for key in ("Iterator", "ItemProcessor"):
            if key in state:
                yield from tasks(state[key])


def error_names(state: Mapping[str, Any]) -> Iterable[str]:
    for handler in [*state.get("Retry", []), *state.get("Catch", [])]:
        yield from handler.get("ErrorEquals", [])
