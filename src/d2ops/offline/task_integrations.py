"""Step Functions' service integrations offline: how the runtime performs each Task state's ``Resource``
(the executors it hands the ASL interpreter, `d2ops.asl.executors`).

- ``arn:aws:states:::lambda:invoke``: the handler in-process (`lambdas.LocalLambdas`), result
  shaped like the Lambda Invoke response (``Payload``, ``StatusCode``...).
- ``arn:aws:states:::aws-sdk:<service>:<action>`` and the optimised integrations
  (``arn:aws:states:::<service>:<action>``): the same call through boto3 against the offline
  endpoints (moto, or the local gateway for SageMaker), so the call meets the same
  validation a real one would.
- ``...:createTrainingJob.sync`` / ``createProcessingJob.sync``: create the job, report it
  submitted, then poll Describe* until it ends, as the service's ``.sync`` pattern does; a
  failed or stopped job fails the task with ``States.TaskFailed`` and the job description as
  cause, and an aborted execution stops the job.
- ``.waitForTaskToken`` (the callback pattern) on ``lambda:invoke``, ``sns:publish``,
  ``sqs:sendMessage`` and any ``aws-sdk`` action (the integrations of this runtime the service
  lists as supporting it): the same call; the interpreter records its answer as ``TaskSubmitted``
  and waits for the task token (`d2ops.asl.callbacks`), which the local Step Functions API's
  SendTaskSuccess/SendTaskFailure/SendTaskHeartbeat reach.

Error names follow Step Functions' conventions (d2ops.aws_contract): a Lambda's exception class name; for
``aws-sdk`` integrations ``<Service>.<ErrorCode>Exception`` when the service models the error
and ``<Service>.<Service>Exception`` otherwise; for optimised integrations (SageMaker's ``.sync``
creates included) the modelled name too (``SageMaker.ResourceInUseException``) and
``<Service>.Amazon<Service>Exception`` otherwise; a lost answer is ``<Service>.SdkClientException``.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

from botocore import xform_name
from botocore.exceptions import ClientError

from d2ops.asl import ExecutorRegistry, TaskContext, TaskFailed
from d2ops.asl.service_arn import parse_service_arn
from d2ops.aws_contract import OPTIMISED_ERROR_PREFIX, client_name, sdk_error_prefix, sdk_member_names
from d2ops.offline.lambdas import FunctionError, LocalLambdas

SYNC_POLL_SECONDS = 2.0
# The optimised integrations served here that support .waitForTaskToken ("Optimized integrations for Step
# Functions": SNS and SQS do; DynamoDB and SageMaker do not). Every aws-sdk integration supports it (Standard
# workflows), and lambda:invoke.waitForTaskToken has its own executor.
CALLBACK_SERVICES = frozenset({"sns", "sqs"})
# Optimised integrations whose message member may be a JSON object: Step Functions sends it as JSON text
# (the service guide's examples put the task token in such an object).
JSON_MESSAGE_MEMBERS = {("sns", "publish"): "Message", ("sqs", "sendMessage"): "MessageBody"}

ClientFactory = Callable[[str], Any]


def json_safe(value: Any) -> Any:
    """A boto3 response as Step Functions passes it on: JSON only, no ResponseMetadata."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items() if k != "ResponseMetadata"}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "read"):  # StreamingBody
        return value.read().decode("utf-8", "replace")
    return value


def modelled_error(client: Any, code: str) -> str | None:
    """The error shape a wire error code stands for (the SDK's exception class is named after the
    shape): query services send codes that differ from it (SNS ``NotFound`` is ``NotFoundException``,
    CloudWatch ``ValidationError`` is ``ValidationException``); None when the service does not model it."""
    shapes = list(client.meta.service_model.error_shapes)
    names = {shape.name for shape in shapes}
    for candidate in (code, code + "Exception", code.removesuffix("Exception")):
        if candidate in names:
            return candidate
    by_code = [shape.name for shape in shapes if (shape.metadata.get("error") or {}).get("code") == code]
    return min(by_code, key=lambda name: (not name.startswith(code), name)) if by_code else None


def error_name(client: Any, service: str, code: str, sdk: bool) -> str:
    """The error a Task reports for a service error ``code``; ``service`` as in the resource ARN (``sfn``)."""
    shape = modelled_error(client, code)
    is_modelled = shape is not None
    name = shape or code
    suffixed = name if name.endswith("Exception") else name + "Exception"
    if sdk:
        prefix = sdk_error_prefix(service)
        return f"{prefix}.{suffixed}" if is_modelled else f"{prefix}.{prefix}Exception"
    # Optimised integrations keep modelled names (DynamoDB.ConditionalCheckFailedException,
    # SageMaker.ResourceInUseException); their unmodelled errors are <Service>.Amazon<Service>Exception.
    optimised = OPTIMISED_ERROR_PREFIX.get(service)
    if optimised is not None and is_modelled:
        return f"{optimised}.{suffixed}"
    prefix = optimised or sdk_error_prefix(service)
    return f"{prefix}.Amazon{prefix}Exception"


def sync_create_cause(exc: ClientError) -> str:
    """The Cause the optimised SageMaker ``.sync`` integration gives a refused create call, in the
    AWS SDK for Java v1 words Step Functions writes there, e.g. ``Training job names must be unique
    ... (Service: AmazonSageMaker; Status Code: 400; Error Code: ResourceInUse; Request ID: <uuid>;
    Proxy: null)``; the error's name is :func:`error_name`'s (``SageMaker.ResourceInUseException`` for a name
    in use), the code is in the Cause whatever the name."""
    error = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    code, message = error.get("Code", "Unknown"), error.get("Message", str(exc))
    request_id = meta.get("RequestId") or str(uuid.uuid4())  # the service always names one
    return (f"{message} (Service: AmazonSageMaker; Status Code: {meta.get('HTTPStatusCode', 400)}; "
            f"Error Code: {code}; Request ID: {request_id}; Proxy: null)")


def pascal_names(value: Any, shape: Any) -> Any:
    """An aws-sdk integration's result as Step Functions returns it: structure members in PascalCase
    (map keys untouched)."""
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, dict):
        return {key[:1].upper() + key[1:]: pascal_names(item, shape.members.get(key)) for key, item in value.items()}
    if shape.type_name == "list" and isinstance(value, list | tuple):
        return [pascal_names(item, shape.member) for item in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {key: pascal_names(item, shape.value) for key, item in value.items()}
    return value


class ResponseLost(Exception):
    """The service did the call, but its answer never arrived (the injected fault of ``lost_responses``)."""


# The throttling answer the injected fault of ``throttles`` gives: SageMaker's words for its API rate limit.
THROTTLED = ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
                         "ResponseMetadata": {"HTTPStatusCode": 400}}, "Throttled")  # type: ignore[typeddict-item]
# The answer the injected fault of ``failed_answers`` gives: an internal error (HTTP 500), which does not say the
# call did nothing.
INTERNAL_FAILURE = ClientError({"Error": {"Code": "InternalFailure", "Message": "We encountered an internal error. "
                                                                              "Please try again."},
                                "ResponseMetadata": {"HTTPStatusCode": 500}},  # type: ignore[typeddict-item]
                               "InternalFailure")


class ServiceExecutors:
    """Builds the executor registry for the interpreter.

    ``lost_responses`` injects the fault a retried ``Create*`` must survive: ``{"sagemaker:createModelPackage":
    1}`` lets the first such call reach the service and succeed there, then reports it failed as a lost
    response does (``<Service>.SdkClientException``: the SDK's read timed out; the optimised integrations'
    ``<Service>.SdkClientException`` too: the answer carried no error code), so the state's Retry sends it
    again. ``sagemaker:createTrainingJob``
    and ``sagemaker:createProcessingJob`` cover the ``.sync`` jobs: the job starts and runs on.

    ``throttles`` injects the fault a bounded retry must outlast: ``{"sagemaker:createTrainingJob": 2}`` refuses
    the next two such calls with ``ThrottlingException`` ("Rate exceeded") before they reach the service, as the
    integration reports a call its SDK retries could not get through (the ``.sync`` create's Cause names the
    code; an aws-sdk call is ``<Service>.<Service>Exception``, throttling being unmodelled).

    ``failed_answers`` injects a 5xx that did the work: ``{"sagemaker:createTrainingJob": 1}`` lets the next such
    call create its job, then answers it with SageMaker's ``InternalFailure`` (HTTP 500; unmodelled, so
    ``SageMaker.AmazonSageMakerException`` with the code in the Cause): the retry it earns finds the name taken.
    """

    def __init__(self, lambdas: LocalLambdas, clients: ClientFactory,
                 lost_responses: dict[str, int] | None = None, throttles: dict[str, int] | None = None,
                 failed_answers: dict[str, int] | None = None) -> None:
        self.lambdas = lambdas
        self.clients = clients
        # Shared, not copied: a test may inject the fault again between executions.
        self.lost_responses = lost_responses if lost_responses is not None else {}
        self.throttles = throttles if throttles is not None else {}
        self.failed_answers = failed_answers if failed_answers is not None else {}
        self._lost_lock = threading.Lock()

    def _take_fault(self, faults: dict[str, int], service: str, action: str) -> bool:
        with self._lost_lock:
            left = faults.get(f"{service}:{action}", 0)
            if left > 0:
                faults[f"{service}:{action}"] = left - 1
            return left > 0

    @staticmethod
    def lost_response_error(service: str, sdk: bool) -> str:
        """The error a call whose answer never came reports: the SDK's client exception (no service answer, so
        no error code to name it by), ``<Service>.SdkClientException`` with the integration's prefix."""
        prefix = sdk_error_prefix(service) if sdk else OPTIMISED_ERROR_PREFIX.get(service, sdk_error_prefix(service))
        return f"{prefix}.SdkClientException"

    def _lose_response(self, service: str, action: str) -> bool:
        return self._take_fault(self.lost_responses, service, action)

    def _throttle(self, service: str, action: str) -> None:
        if self._take_fault(self.throttles, service, action):
            raise THROTTLED

    def registry(self) -> ExecutorRegistry:
        return ExecutorRegistry([
            ("arn:aws:states:::lambda:invoke", self.invoke_lambda),
            ("arn:aws:states:::lambda:invoke.waitForTaskToken", self.invoke_lambda),
            ("arn:aws:states:::sagemaker:createTrainingJob.sync", self.training_job_sync),
            ("arn:aws:states:::sagemaker:createProcessingJob.sync", self.processing_job_sync),
            ("arn:aws:states:::aws-sdk:*", self.sdk_call),
            ("arn:aws:states:::sagemaker:*", self.sdk_call),
            ("arn:aws:states:::sns:*", self.sdk_call),
            ("arn:aws:states:::sqs:*", self.sdk_call),
            ("arn:aws:states:::dynamodb:*", self.sdk_call),
        ])

    # ----- Lambda ----------------------------------------------------------------------------
    def invoke_lambda(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        if not isinstance(parameters, dict) or "FunctionName" not in parameters:
            raise TaskFailed("States.Runtime", "lambda:invoke needs Parameters.FunctionName")
        try:
            payload = self.lambdas.invoke(str(parameters["FunctionName"]), parameters.get("Payload"))
        except KeyError as exc:
            raise TaskFailed("Lambda.ResourceNotFoundException", str(exc)) from exc
        except FunctionError as exc:
            raise TaskFailed(exc.error, exc.cause) from exc
        return {"ExecutedVersion": "$LATEST", "Payload": payload, "StatusCode": 200,
                "SdkHttpMetadata": {"HttpStatusCode": 200}}

    # ----- aws-sdk and optimised integrations -----------------------------------------------
    def sdk_call(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        arn = parse_service_arn(resource)
        callback = arn is not None and arn.pattern == ".waitForTaskToken" and (arn.sdk or arn.service in
                                                                                CALLBACK_SERVICES)
        if arn is None or (arn.pattern and not callback):
            raise TaskFailed("States.Runtime", f"the offline runtime has no integration for {resource}")
        service = client_name(arn.service)
        client = self.clients(service)
        method = getattr(client, xform_name(arn.action), None)
        if method is None:
            raise TaskFailed("States.Runtime", f"{service} has no action {arn.action}")
        operation = client.meta.service_model.operation_model(arn.operation)
        if arn.sdk:
            parameters = sdk_member_names(parameters or {}, operation.input_shape)
        member = JSON_MESSAGE_MEMBERS.get((arn.service, arn.action)) if not arn.sdk else None
        if member is not None and isinstance(parameters, dict) and isinstance(parameters.get(member), dict | list):
            parameters = dict(parameters, **{member: json.dumps(parameters[member], separators=(",", ":"))})
        try:
            self._throttle(arn.service, arn.action)
            result = method(**(parameters or {}))
            if self._lose_response(arn.service, arn.action):
                raise ResponseLost(f"Unable to execute HTTP request: Read timed out ({service} {arn.action} "
                                   "reached the service; its response was lost)")
            if self._take_fault(self.failed_answers, arn.service, arn.action):
                raise INTERNAL_FAILURE
            return json_safe(pascal_names(result, operation.output_shape) if arn.sdk else result)
        except ResponseLost as exc:
            raise TaskFailed(self.lost_response_error(arn.service, arn.sdk), str(exc)) from exc
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "Unknown")
            message = exc.response.get("Error", {}).get("Message", str(exc))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400)
            cause = f"{message} (Service: {service}, Status Code: {status}, Error Code: {code})"
            raise TaskFailed(error_name(client, arn.service, code, arn.sdk), cause) from exc
        except Exception as exc:  # botocore's parameter validation, before any request
            raise TaskFailed(error_name(client, arn.service, "ValidationException", arn.sdk),
                             str(exc)) from exc

    # ----- .sync jobs -------------------------------------------------------------------------
    def _sync(self, context: TaskContext, kind: str, parameters: Any) -> Any:
        """Run a SageMaker ``kind`` ("Training", "Processing") job to its end, as ``create<kind>Job.sync`` does."""
        sm = self.clients("sagemaker")
        snake, job = kind.lower(), {f"{kind}JobName": parameters.get(f"{kind}JobName")}
        action, status_key = f"create{kind}Job", f"{kind}JobStatus"
        create = functools.partial(getattr(sm, f"create_{snake}_job"), **parameters)
        describe = functools.partial(getattr(sm, f"describe_{snake}_job"), **job)
        stop = functools.partial(getattr(sm, f"stop_{snake}_job"), **job)
        # The optimised integration: a modelled error of the create keeps its name (a name already in use is
        # SageMaker.ResourceInUseException), anything else is SageMaker.AmazonSageMakerException; the code is
        # in the Cause either way.
        try:
            self._throttle("sagemaker", action)
            submitted = create()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "Unknown")
            raise TaskFailed(error_name(sm, "sagemaker", code, False), sync_create_cause(exc)) from exc
        if self._lose_response("sagemaker", action):  # the job runs; the state only hears of a failure
            raise TaskFailed(self.lost_response_error("sagemaker", False),
                             f"Unable to execute HTTP request: Read timed out (sagemaker {action} reached the service; "
                             "its response was lost)")
        if self._take_fault(self.failed_answers, "sagemaker", action):  # the job runs; the answer says 500
            raise TaskFailed(error_name(sm, "sagemaker", "InternalFailure", False), sync_create_cause(INTERNAL_FAILURE))
        context.submitted(json_safe(submitted))
        while True:
            if context.cancelled:
                stop()  # the execution was aborted or timed out: the job must not run on
                return None
            job = describe()
            status = job.get(status_key)
            if status == "Completed":
                return json_safe(job)
            if status in ("Failed", "Stopped"):
                raise TaskFailed("States.TaskFailed", json.dumps(json_safe(job)))
            context.sleep(SYNC_POLL_SECONDS)

    def training_job_sync(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        return self._sync(context, "Training", parameters)

    def processing_job_sync(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        return self._sync(context, "Processing", parameters)
