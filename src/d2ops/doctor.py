"""``d2ops doctor``: a read-only preflight of a deployed stack, run after ``sam deploy`` and
before the first upload.

Each check is a function over the boto3 clients it needs and the stack's facts (its parameters
and outputs, read once from CloudFormation or, offline, from the template), and answers one
:class:`Check`: ``ok``, ``warn`` or ``FAIL``, what it found, and the fix. Nothing here writes.

A check never raises: an AWS error is that check's line (an access denial names the IAM action
the caller lacks), so one missing permission does not hide the other answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from d2ops_core import platform, pretrained, s3_layout

Status = Literal["ok", "warn", "FAIL"]

# The IAM action behind each API operation the checks call: an access denial names it, so the line
# says which permission to grant (S3's actions are not named after its operations).
IAM_ACTIONS: dict[str, str] = {
    "DescribeStacks": "cloudformation:DescribeStacks",
    "DescribeStackResources": "cloudformation:DescribeStackResources",
    "DescribeImages": "ecr:DescribeImages",
    "ListServiceQuotas": "servicequotas:ListServiceQuotas",
    "ListAWSDefaultServiceQuotas": "servicequotas:ListAWSDefaultServiceQuotas",
    "HeadObject": "s3:GetObject",
    "GetBucketNotificationConfiguration": "s3:GetBucketNotification",
    "ListSubscriptionsByTopic": "sns:ListSubscriptionsByTopic",
    "DescribeEndpoint": "sagemaker:DescribeEndpoint",
    "ListTags": "sagemaker:ListTags",
    "DescribeExecution": "states:DescribeExecution",
    "ListObjectsV2": "s3:ListBucket",
}
_ACCESS_DENIED = frozenset({"AccessDenied", "AccessDeniedException", "AuthorizationError", "UnauthorizedOperation",
                            "403"})

RUN_ID_TAG = "d2ops:run-id"  # what the state machine tags the endpoint with (training_pipeline.asl.json)
IMAGES_FIX = "run `make images` (builds and pushes both images) and deploy with the URIs it prints"


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    found: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4} {self.name}: {self.found}"
        return f"{text} -> {self.fix}" if self.fix and self.status != "ok" else text


@dataclass(frozen=True)
class StackFacts:
    """What the checks need to know about the stack: its parameters and outputs."""

    name: str
    region: str
    parameters: dict[str, str]
    outputs: dict[str, str]
    stack_id: str | None = None
    status: str | None = None
    deployed: bool = True  # False: the offline stack (its commands take no --stack)

    @property
    def endpoint_name(self) -> str:
        # The template's EndpointName output; an older stack without it names the endpoint the same way.
        return self.outputs.get("EndpointName") or f"{self.parameters.get('SageMakerNamePrefix', 'd2ops')}-detector"


@dataclass
class Clients:
    """The boto3 clients the checks read through (nothing here writes)."""

    cloudformation: Any
    ecr: Any
    servicequotas: Any
    s3: Any
    sns: Any
    sagemaker: Any
    stepfunctions: Any

    @classmethod
    def from_session(cls, session: Any, region: str | None = None, **options: Any) -> Clients:
        def client(name: str) -> Any:
            return session.client(name, region_name=region, **options)

        return cls(cloudformation=client("cloudformation"), ecr=client("ecr"),
                   servicequotas=client("service-quotas"), s3=client("s3"), sns=client("sns"),
                   sagemaker=client("sagemaker"), stepfunctions=client("stepfunctions"))


class StackNotFound(Exception):
    """The stack cannot be read (no such stack, or no permission to describe it)."""


def _error(exc: ClientError) -> tuple[str, str]:
    error = exc.response.get("Error") or {}
    return str(error.get("Code") or ""), str(error.get("Message") or exc)


def read_stack(cloudformation: Any, stack_name: str, region: str) -> StackFacts:
    """The stack's parameters and outputs (DescribeStacks)."""
    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        code, message = _error(exc)
        if code in _ACCESS_DENIED:
            raise StackNotFound(f"stack {stack_name!r}: access denied (grant cloudformation:DescribeStacks): "
                                f"{message}") from exc
        raise StackNotFound(f"stack {stack_name!r} in {region}: {message}") from exc
    if not stacks:
        raise StackNotFound(f"stack {stack_name!r} not found in {region}")
    stack = stacks[0]
    return StackFacts(name=stack_name, region=region,
                      parameters={p["ParameterKey"]: str(p.get("ParameterValue", ""))
                                  for p in stack.get("Parameters") or []},
                      outputs={o["OutputKey"]: str(o.get("OutputValue", "")) for o in stack.get("Outputs") or []},
                      stack_id=stack.get("StackId"), status=stack.get("StackStatus"))


# ----------------------------------------------------------------------------------------- stack
def check_stack_status(stack: StackFacts) -> Check:
    status = stack.status or ""
    if status.endswith("_COMPLETE") and "ROLLBACK" not in status and "DELETE" not in status:
        return Check("stack", "ok", f"{stack.name} is {status}")
    if status.endswith("_IN_PROGRESS"):
        return Check("stack", "warn", f"{stack.name} is {status}", "wait for the deployment to finish, then rerun")
    if status == "UPDATE_ROLLBACK_COMPLETE":  # a refused update: the stack runs its previous template, intact
        return Check("stack", "warn", f"{stack.name} is {status}: its last update was rolled back and it runs the "
                                      "template deployed before",
                     "read the stack's events, fix the update and deploy again")
    return Check("stack", "FAIL", f"{stack.name} is {status}",
                 "read the stack's events in the CloudFormation console and deploy again")


# ---------------------------------------------------------------------------------------- images
_IMAGE_URI = re.compile(r"^(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?/"
                        r"(?P<repo>[a-z0-9._/-]+)(:(?P<tag>[A-Za-z0-9._-]+)|@(?P<digest>sha256:[a-f0-9]{64}))$")


def check_image(ecr: Any, what: str, parameter: str, stack: StackFacts) -> Check:
    """The image the stack parameter names is in ECR, with that tag or digest (DescribeImages)."""
    name = f"{what} image"
    uri = stack.parameters.get(parameter, "")
    match = _IMAGE_URI.match(uri)
    if match is None:
        return Check(name, "FAIL", f"{parameter}={uri!r} is not an ECR image URI", IMAGES_FIX)
    if match["region"] != stack.region:
        return Check(name, "FAIL", f"{uri} is in {match['region']}, the stack in {stack.region}",
                     f"push the image to ECR in {stack.region} (`make images AWS_REGION={stack.region}`) and "
                     f"deploy with that URI")
    image_id = {"imageTag": match["tag"]} if match["tag"] else {"imageDigest": match["digest"]}
    try:
        ecr.describe_images(registryId=match["account"], repositoryName=match["repo"], imageIds=[image_id])
    except ClientError as exc:
        code, _ = _error(exc)
        if code == "RepositoryNotFoundException":
            return Check(name, "FAIL", f"no ECR repository {match['repo']} in account {match['account']} "
                                       f"({stack.region})", IMAGES_FIX)
        if code == "ImageNotFoundException":
            return Check(name, "FAIL", f"{match['repo']} has no image {match['tag'] or match['digest']}",
                         IMAGES_FIX)
        raise
    return Check(name, "ok", f"{uri} is in ECR")


# ------------------------------------------------------------------------------- serving backend
def _switch_fix(stack: StackFacts, to: str) -> str:
    parameter = f"{platform.SERVING_BACKEND_PARAMETER}={to}"
    if not stack.deployed:
        return (f"switch with one stack parameter: `d2ops run --parameter {parameter}` (or `d2ops demo "
                f"--serving-backend {to}`)")
    return (f"switch with one stack parameter: `sam deploy --parameter-overrides {parameter}` (repeat the "
            f"environment's other overrides) or add it to samconfig.toml's parameter_overrides; the next run's "
            f"model is served by {to}")


def check_serving_backend(stack: StackFacts) -> Check:
    """The server the stack's endpoint runs (ServingBackend) is maintained upstream: an archived one gets no
    security fixes, so the line warns, names the fact's source (d2ops_core.platform) and the one-parameter switch."""
    name = "serving backend"
    parameter = platform.SERVING_BACKEND_PARAMETER
    maintained = platform.maintained_servers()
    # A stack deployed before the parameter existed serves with the image's only server then, TorchServe.
    chosen = stack.parameters.get(parameter)
    server = platform.SERVING_SERVERS.get(chosen or "torchserve")
    if server is None:
        return Check(name, "FAIL", f"{parameter}={chosen!r} is not a server d2ops_core.platform knows "
                                   f"({', '.join(platform.SERVING_SERVERS)})", _switch_fix(stack, maintained[0]))
    said = f"{parameter}={server.name}" if chosen else f"no {parameter} parameter (deployed before it existed): " \
                                                     f"{server.name}"
    if not server.archived:
        return Check(name, "ok", f"{said}: {server.status}")
    return Check(name, "warn", f"{said}: {server.status} ({', '.join(s.url for s in server.sources)}, read "
                               f"{server.sources[0].checked})", _switch_fix(stack, maintained[0]))


# ---------------------------------------------------------------------------------------- quotas
@dataclass(frozen=True)
class QuotaNeed:
    """What the stack will ask of one SageMaker quota."""

    check: str  # the report's name for it
    quota: str  # Service Quotas' name (d2ops_core.platform.quota_name)
    needed: int
    why: str  # where the number comes from
    # An endpoint update is blue/green (prepare_training.traffic_routing, docs/pipeline.md): the new fleet
    # comes up beside the old one, which stays until the bake ends (platform.BLUE_GREEN_FLEETS), so an
    # update needs more instances than the first deployment.
    first_deployment: int | None = None


def quota_needs(parameters: dict[str, str]) -> list[QuotaNeed]:
    """The quotas the stack's training, evaluation and endpoint settings count against."""
    spot = parameters.get("UseSpotTraining", "true") == "true"
    training_type = parameters.get("TrainingInstanceType", "")
    training_count = int(parameters.get("TrainingInstanceCount") or 1)
    evaluation_type = parameters.get("EvaluationInstanceType", "")
    endpoint_type = parameters.get("EndpointInstanceType", "")
    endpoint_count = int(parameters.get("EndpointInstanceCount") or 1)
    return [
        QuotaNeed("training quota", platform.quota_name(training_type, "spot training" if spot else "training"),
                  training_count, f"TrainingInstanceCount={training_count}, UseSpotTraining={str(spot).lower()}"),
        QuotaNeed("evaluation quota", platform.quota_name(evaluation_type, "processing"), 1,
                  "one evaluation processing job per run"),
        QuotaNeed("endpoint quota", platform.quota_name(endpoint_type, "endpoint"),
                  platform.BLUE_GREEN_FLEETS * endpoint_count,
                  f"EndpointInstanceCount={endpoint_count}, twice that while a blue/green update bakes",
                  first_deployment=endpoint_count),
    ]


@dataclass(frozen=True)
class Quota:
    name: str
    code: str
    value: float
    default: bool  # found only among AWS's defaults (never raised for this account)


def _list_quotas(paginator: Any, wanted: set[str], default: bool) -> dict[str, Quota]:
    found: dict[str, Quota] = {}
    for page in paginator.paginate(ServiceCode=platform.QUOTA_SERVICE_CODE):
        for item in page.get("Quotas") or []:
            name = item.get("QuotaName")
            if name in wanted and "Value" in item:
                found[name] = Quota(name=name, code=str(item.get("QuotaCode", "")), value=float(item["Value"]),
                                    default=default)
    return found


def find_quotas(servicequotas: Any, names: Iterable[str]) -> dict[str, Quota]:
    """The quotas of these names: the account's applied values (ListServiceQuotas), else AWS's defaults.

    Quota codes differ per instance type and cannot be derived, so quotas are found by name. A quota
    never raised for this account is not always among the applied ones; its default value then is.
    """
    wanted = set(names)
    found = _list_quotas(servicequotas.get_paginator("list_service_quotas"), wanted, default=False)
    missing = wanted - set(found)
    if missing:
        found.update(_list_quotas(servicequotas.get_paginator("list_aws_default_service_quotas"), missing,
                                  default=True))
    return found


def _count(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def judge_quota(need: QuotaNeed, quota: Quota | None, region: str) -> Check:
    if quota is None:
        return Check(need.check, "FAIL", f"Service Quotas has no quota {need.quota!r} in {region}",
                     "pick an instance type SageMaker offers in this region (the stack's *InstanceType parameters)")
    # The quota's code is known here (it was listed), so the command names it instead of platform's CODE.
    command = platform.QUOTA_REQUEST_INCREASE.format(desired=need.needed).replace("--quota-code CODE",
                                                                                  f"--quota-code {quota.code}")
    request = (f"request an increase to {need.needed} in Service Quotas (console: {platform.QUOTA_CONSOLE_SERVICE}, "
               f"'{quota.name}'), or `{command} --region {region}`")
    found = f"'{quota.name}' is {_count(quota.value)}{' (the default)' if quota.default else ''}"
    if quota.value >= need.needed:
        return Check(need.check, "ok", f"{found}, the stack needs {need.needed} ({need.why})")
    if need.first_deployment is not None and quota.value >= need.first_deployment:
        return Check(need.check, "FAIL", f"{found}: the first deployment fits ({need.first_deployment}), but every "
                                         f"update needs {need.needed} ({need.why})", request)
    return Check(need.check, "FAIL", f"{found}, the stack needs {need.needed} ({need.why})", request)


def check_quotas(servicequotas: Any, stack: StackFacts) -> list[Check]:
    try:
        needs = quota_needs(stack.parameters)
    except ValueError as exc:  # a malformed instance type names no quota
        return [Check("quotas", "FAIL", str(exc), "set the stack's *InstanceType parameters to ml.<family>.<size>")]
    quotas = find_quotas(servicequotas, {need.quota for need in needs})
    return [judge_quota(need, quotas.get(need.quota), stack.region) for need in needs]


# --------------------------------------------------------------------------------------- weights
WEIGHTS_PARAMETER = "PretrainedWeightsKey"


def check_weights(s3: Any, stack: StackFacts) -> Check:
    """The pretrained weights the stack names are in the data bucket (HeadObject)."""
    name = "pretrained weights"
    bucket = stack.outputs.get("DataBucketName", "")
    key = stack.parameters.get(WEIGHTS_PARAMETER)
    if key is None:
        return Check(name, "warn", f"the stack has no {WEIGHTS_PARAMETER} parameter: its runs train from the "
                                   f"weights detectron2 starts with",
                     "deploy the current template, which fine-tunes from pretrained weights")
    if key == pretrained.SCRATCH:
        return Check(name, "ok", f"{WEIGHTS_PARAMETER}={key}: runs train from scratch, no weights needed")
    upload = f"`{pretrained.upload_command(stack.name if stack.deployed else None)}`{pretrained.download_hint(key)}"
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        code, _ = _error(exc)
        if code in ("404", "NoSuchKey", "NotFound"):
            return Check(name, "FAIL", f"s3://{bucket}/{key} is missing", upload)
        if code == "403":
            # S3 answers 403, not 404, for a missing key to a caller who may not list the bucket.
            return Check(name, "FAIL", f"s3://{bucket}/{key}: access denied (missing s3:GetObject, or the key is "
                                       f"missing and s3:ListBucket is not granted)",
                         f"grant s3:GetObject and s3:ListBucket on {bucket}, or upload it with {upload}")
        raise
    # The run's prepare step lists the key as a prefix and refuses another object under it (the pretrained
    # channel is an S3 prefix: the job would download that object too): say so here, before a run.
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=2)
    others = [item["Key"] for item in listing.get("Contents") or [] if item["Key"] != key]
    if others:
        return Check(name, "FAIL", f"s3://{bucket}/{others[0]} starts with {WEIGHTS_PARAMETER} {key}: runs are refused "
                                   "(the pretrained channel is an S3 prefix)", f"rename or delete s3://{bucket}/{others[0]}")
    return Check(name, "ok", f"s3://{bucket}/{key} is there")


# --------------------------------------------------------------------------------- bucket events
def check_bucket_events(s3: Any, stack: StackFacts) -> Check:
    """Uploads start runs through EventBridge: the data bucket must send its events there."""
    name = "upload events"
    bucket = stack.outputs.get("DataBucketName", "")
    config = s3.get_bucket_notification_configuration(Bucket=bucket)
    if "EventBridgeConfiguration" in config:
        return Check(name, "ok", f"s3://{bucket} sends its events to EventBridge")
    return Check(name, "FAIL", f"s3://{bucket} does not send events to EventBridge: an upload starts no run",
                 f"`aws s3api put-bucket-notification-configuration --bucket {bucket} --notification-configuration "
                 f"'{{\"EventBridgeConfiguration\": {{}}}}'`, or deploy the stack again (its DataBucket sets it)")


# ---------------------------------------------------------------------------------- notification
def check_subscription(sns: Any, stack: StackFacts) -> Check:
    """The NotificationEmail subscription exists and is confirmed (ListSubscriptionsByTopic)."""
    name = "notifications"
    email = stack.parameters.get("NotificationEmail", "")
    topic = stack.outputs.get("NotificationTopicArn", "")
    if not email:
        return Check(name, "warn", "no NotificationEmail: run results reach no one",
                     f"deploy with NotificationEmail=you@example.com, or subscribe to {topic}")
    subscriptions = [s for page in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic)
                     for s in page.get("Subscriptions") or []
                     if s.get("Protocol") == "email" and str(s.get("Endpoint", "")).lower() == email.lower()]
    if not subscriptions:
        return Check(name, "FAIL", f"{email} is not subscribed to {topic}",
                     f"`aws sns subscribe --topic-arn {topic} --protocol email --notification-endpoint {email}`, "
                     f"then confirm the e-mail")
    if all(s.get("SubscriptionArn") == "PendingConfirmation" for s in subscriptions):
        return Check(name, "FAIL", f"{email}'s subscription is not confirmed yet",
                     f"open the \"AWS Notification - Subscription Confirmation\" e-mail sent to {email} and follow "
                     f"its link (or subscribe again to get a new one)")
    return Check(name, "ok", f"{email} is subscribed and confirmed")


# ---------------------------------------------------------------------------------- endpoint name
def _is_missing_endpoint(exc: ClientError) -> bool:
    code, message = _error(exc)
    return code == "ValidationException" and "Could not find endpoint" in message


def _runs_here(stepfunctions: Any, s3: Any, stack: StackFacts, run_id: str) -> bool:
    """Whether ``run_id`` is one of this stack's runs: an execution of its state machine, or, once Step
    Functions has dropped the execution (90 days after it closed), a run with artifacts in its bucket."""
    machine = stack.outputs.get("PipelineStateMachineArn", "")
    try:
        stepfunctions.describe_execution(executionArn=f"{machine.replace(':stateMachine:', ':execution:')}:{run_id}")
        return True
    except ClientError as exc:
        if _error(exc)[0] != "ExecutionDoesNotExist":
            raise
    listed = s3.list_objects_v2(Bucket=stack.outputs.get("ArtifactsBucketName", ""),
                                Prefix=s3_layout.run_prefix(run_id), MaxKeys=1)
    return bool(listed.get("KeyCount"))


def check_endpoint_owner(cloudformation: Any, sagemaker: Any, stepfunctions: Any, s3: Any,
                         stack: StackFacts) -> Check:
    """No other stack manages the endpoint this stack deploys to.

    The endpoint is named from SageMakerNamePrefix, not from the stack: two stacks with one prefix
    in an account and region would update one endpoint, each with its own champion and lease.
    """
    name = "endpoint name"
    endpoint = stack.endpoint_name
    prefix = stack.parameters.get("SageMakerNamePrefix", "")
    others = sorted(
        s["StackName"] for page in cloudformation.get_paginator("describe_stacks").paginate()
        for s in page.get("Stacks") or []
        if s.get("StackId") != stack.stack_id and s.get("StackName") != stack.name
        and s.get("StackStatus") != "DELETE_COMPLETE"
        and any(p.get("ParameterKey") == "SageMakerNamePrefix" and p.get("ParameterValue") == prefix
                for p in s.get("Parameters") or []))
    if others:
        return Check(name, "FAIL", f"stack(s) {', '.join(others)} also use SageMakerNamePrefix={prefix}: both "
                                   f"manage the endpoint {endpoint}",
                     "deploy this stack with its own SageMakerNamePrefix (samconfig.toml's parameter_overrides)")
    try:
        described = sagemaker.describe_endpoint(EndpointName=endpoint)
    except ClientError as exc:
        if _is_missing_endpoint(exc):
            return Check(name, "ok", f"{endpoint} is this stack's alone; the first run creates it")
        raise
    tags = {t["Key"]: t.get("Value", "") for page in sagemaker.get_paginator("list_tags").paginate(
        ResourceArn=described["EndpointArn"]) for t in page.get("Tags") or []}
    run_id = tags.get(RUN_ID_TAG)
    clear = (f"delete it if it is no longer used (`aws sagemaker delete-endpoint --endpoint-name {endpoint}`), or "
             f"deploy this stack with another SageMakerNamePrefix")
    if not run_id:
        return Check(name, "FAIL", f"an endpoint {endpoint} exists that no d2ops run deployed (no {RUN_ID_TAG} tag)",
                     clear)
    if not _runs_here(stepfunctions, s3, stack, run_id):
        return Check(name, "FAIL", f"{endpoint} was deployed by run {run_id}, which is not one of this stack's",
                     clear)
    return Check(name, "ok", f"{endpoint} was deployed by this stack's run {run_id}")


# ------------------------------------------------------------------------------------------ run
@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)

    def lines(self) -> list[str]:
        return [c.line() for c in self.checks]


def guarded(name: str, check: Callable[[], Check | list[Check]]) -> list[Check]:
    """Run one check; an AWS error becomes its line (an access denial names the missing permission)."""
    try:
        result = check()
    except ClientError as exc:
        code, message = _error(exc)
        operation = exc.operation_name
        if code in _ACCESS_DENIED:
            action = IAM_ACTIONS.get(operation, operation)
            return [Check(name, "FAIL", f"access denied to {action}",
                          f"grant {action} to the identity running d2ops doctor")]
        return [Check(name, "FAIL", f"{operation} answered {code}: {message}", "rerun; if it persists, check the "
                                                                                "resource in the console")]
    except BotoCoreError as exc:  # no credentials, an unreachable endpoint
        return [Check(name, "FAIL", f"could not ask AWS: {exc}", "check your credentials, region and network")]
    return result if isinstance(result, list) else [result]


def run_checks(clients: Clients, stack: StackFacts) -> Report:
    """Every check, in the order a deployment needs them; read-only."""
    report = Report()
    if stack.status is not None:
        report.checks.append(check_stack_status(stack))
    report.checks += guarded("training image", lambda: check_image(clients.ecr, "training", "TrainingImageUri",
                                                                    stack))
    report.checks += guarded("serving image", lambda: check_image(clients.ecr, "serving", "ServingImageUri", stack))
    report.checks.append(check_serving_backend(stack))
    report.checks += guarded("quotas", lambda: check_quotas(clients.servicequotas, stack))
    report.checks += guarded("pretrained weights", lambda: check_weights(clients.s3, stack))
    report.checks += guarded("upload events", lambda: check_bucket_events(clients.s3, stack))
    report.checks += guarded("notifications", lambda: check_subscription(clients.sns, stack))
    report.checks += guarded("endpoint name", lambda: check_endpoint_owner(clients.cloudformation, clients.sagemaker,
                                                                           clients.stepfunctions, clients.s3, stack))
    return report
