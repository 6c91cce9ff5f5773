"""`d2ops doctor`'s checks against moto: a healthy account, then each thing a new account gets wrong.

The stack is a tiny CloudFormation template in moto with the real template's parameter names and
outputs; its resources are made through the services themselves. SageMaker's quotas come from the
offline Service Quotas API (moto's serves only ``vpc``) on a loopback gateway, in botocore's shapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from d2ops import cli, doctor
from d2ops import template as sam
from d2ops.doctor import Check, Clients, Report, StackFacts
from d2ops.offline import moto_fidelity
from d2ops.offline.aws_endpoint import AwsEndpoint
from d2ops.offline.quotas import AccountQuotas, default_value
from d2ops.offline.services.service_quotas import OfflineServiceQuotas
from d2ops_core.platform import quota_name
from tests.fixtures.pipeline import support

REGION = "us-east-1"
ACCOUNT = "123456789012"
STACK = "d2ops-dev"
GPU = "ml.g4dn.xlarge"
EMAIL = "ops@example.com"
WEIGHTS = "pretrained/R-50.pkl"
REGISTRY = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"
PARAMETERS = {
    "SageMakerNamePrefix": "d2ops-dev", "TrainingImageUri": f"{REGISTRY}/d2ops-training:v1",
    "ServingImageUri": f"{REGISTRY}/d2ops-serving:v1", "TrainingInstanceType": GPU, "TrainingInstanceCount": "2",
    "UseSpotTraining": "true", "EvaluationInstanceType": GPU, "EndpointInstanceType": GPU,
    "EndpointInstanceCount": "1", "NotificationEmail": EMAIL, doctor.WEIGHTS_PARAMETER: WEIGHTS,
    "ServingBackend": "ray-serve",  # the maintained server: TorchServe (the default) warns, see below
}
# A new account's spot GPU training quota is 0 (d2ops.offline.quotas); this healthy one has raised it.
RAISED = {quota_name(GPU, "spot training"): 2}


def tiny_template(parameters: dict[str, str]) -> str:
    return json.dumps({
        "Parameters": {name: {"Type": "String", "Default": value} for name, value in parameters.items()},
        "Resources": {"DataBucket": {"Type": "AWS::S3::Bucket"}, "ArtifactsBucket": {"Type": "AWS::S3::Bucket"},
                      "NotificationTopic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {
            "DataBucketName": {"Value": {"Ref": "DataBucket"}},
            "ArtifactsBucketName": {"Value": {"Ref": "ArtifactsBucket"}},
            "NotificationTopicArn": {"Value": {"Ref": "NotificationTopic"}},
            "EndpointName": {"Value": {"Fn::Sub": "${SageMakerNamePrefix}-detector"}},
            "PipelineStateMachineArn": {"Value": {"Fn::Sub": "arn:aws:states:${AWS::Region}:${AWS::AccountId}:"
                                                             "stateMachine:${AWS::StackName}-pipeline"}},
        }})


@dataclass
class Account:
    clients: Clients
    quotas: OfflineServiceQuotas
    quotas_url: str  # the offline Service Quotas endpoint
    stack: StackFacts

    def check(self, **parameters: str) -> dict[str, Check]:
        """Every check of the stack (with ``parameters`` changed), by name."""
        stack = replace(self.stack, parameters={**self.stack.parameters, **parameters})
        return {c.name: c for c in doctor.run_checks(self.clients, stack).checks}


def _image(ecr: Any, repository: str, tag: str) -> None:
    ecr.put_image(repositoryName=repository, imageTag=tag, imageManifest=json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json", "config": {},
         "layers": []}))


@pytest.fixture
def account(monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    """A healthy account: `sam deploy` done, images pushed, weights uploaded, e-mail confirmed, quotas raised."""
    support.aws_env(monkeypatch)
    moto_fidelity.apply()
    gateway = AwsEndpoint("http://127.0.0.1:9")  # nothing of this test is forwarded to moto through it
    quotas = OfflineServiceQuotas(AccountQuotas(RAISED), [GPU], REGION, ACCOUNT)
    gateway.add(quotas)
    gateway.start()
    try:
        with mock_aws():
            clients = Clients.from_session(boto3.session.Session(), REGION)
            clients.servicequotas = boto3.client("service-quotas", region_name=REGION, endpoint_url=gateway.url)
            clients.cloudformation.create_stack(StackName=STACK, TemplateBody=tiny_template(PARAMETERS))
            stack = doctor.read_stack(clients.cloudformation, STACK, REGION)
            bucket = stack.outputs["DataBucketName"]
            clients.s3.put_bucket_notification_configuration(
                Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}})
            clients.s3.put_object(Bucket=bucket, Key=WEIGHTS, Body=b"weights")
            for name in ("d2ops-training", "d2ops-serving"):
                clients.ecr.create_repository(repositoryName=name)
                _image(clients.ecr, name, "v1")
            clients.sns.subscribe(TopicArn=stack.outputs["NotificationTopicArn"], Protocol="email", Endpoint=EMAIL)
            clients.stepfunctions.create_state_machine(
                name=f"{STACK}-pipeline", roleArn=f"arn:aws:iam::{ACCOUNT}:role/sfn",
                definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}))
            yield Account(clients, quotas, gateway.url, stack)
    finally:
        gateway.stop()


def test_a_healthy_account_passes_every_check_one_line_each(account: Account) -> None:
    report = doctor.run_checks(account.clients, account.stack)
    assert [c.name for c in report.checks] == [
        "stack", "training image", "serving image", "serving backend", "training quota", "evaluation quota",
        "endpoint quota", "pretrained weights", "upload events", "notifications", "endpoint name"]
    assert {c.status for c in report.checks} == {"ok"}, report.lines()
    assert not report.failed
    lines = report.lines()
    assert len(lines) == len(report.checks) and all("\n" not in line for line in lines)
    assert lines[4] == (f"ok   training quota: '{GPU} for spot training job usage' is 2, the stack needs 2 "
                        f"(TrainingInstanceCount=2, UseSpotTraining=true)")


def test_the_parameters_and_outputs_the_doctor_reads_are_the_templates() -> None:
    template = sam.load_template()
    assert set(PARAMETERS) <= set(template.parameters())
    assert {"DataBucketName", "ArtifactsBucketName", "NotificationTopicArn", "EndpointName",
            "PipelineStateMachineArn"} <= set(
        template.document["Outputs"])


# ---------------------------------------------------------------------------------------- images
def test_an_image_tag_that_was_never_pushed_fails_with_make_images(account: Account) -> None:
    checks = account.check(ServingImageUri=f"{REGISTRY}/d2ops-serving:v2")
    assert checks["training image"].status == "ok"
    serving = checks["serving image"]
    assert serving.status == "FAIL" and "d2ops-serving has no image v2" in serving.found
    assert "make images" in serving.fix


def test_a_missing_repository_and_a_digest_are_told_apart(account: Account) -> None:
    checks = account.check(TrainingImageUri=f"{REGISTRY}/d2ops-train:v1")
    assert checks["training image"].status == "FAIL"
    assert "no ECR repository d2ops-train" in checks["training image"].found
    digest = account.clients.ecr.describe_images(repositoryName="d2ops-serving")["imageDetails"][0]["imageDigest"]
    assert account.check(ServingImageUri=f"{REGISTRY}/d2ops-serving@{digest}")["serving image"].status == "ok"
    other = "sha256:" + "0" * 64
    assert account.check(ServingImageUri=f"{REGISTRY}/d2ops-serving@{other}")["serving image"].status == "FAIL"


def test_an_image_in_another_region_fails(account: Account) -> None:
    check = account.check(TrainingImageUri=f"{ACCOUNT}.dkr.ecr.eu-west-1.amazonaws.com/d2ops-training:v1")
    assert check["training image"].status == "FAIL" and "eu-west-1" in check["training image"].found


# ------------------------------------------------------------------------------- serving backend
def test_a_stack_serving_with_the_archived_torchserve_warns_naming_the_source_and_the_switch(
        account: Account, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutation caught: the check reading the template's default instead of the stack's own parameter, or
    failing (exit 1) where the issue asks for a warning: TorchServe is the user's choice and still works."""
    from d2ops_core import platform

    account.clients.cloudformation.create_stack(
        StackName="d2ops-legacy", TemplateBody=tiny_template({**PARAMETERS, "SageMakerNamePrefix": "d2ops-legacy",
                                                              "ServingBackend": "torchserve"}))
    stack = doctor.read_stack(account.clients.cloudformation, "d2ops-legacy", REGION)  # DescribeStacks
    check = doctor.check_serving_backend(stack)
    torchserve = platform.SERVING_SERVERS["torchserve"]
    assert check.status == "warn" and check.found.startswith("ServingBackend=torchserve: TorchServe is archived")
    assert all(source.url in check.found for source in torchserve.sources)
    assert "`sam deploy --parameter-overrides ServingBackend=ray-serve`" in check.fix
    assert account.check()["serving backend"].status == "ok"  # the healthy account's ray-serve

    monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", account.quotas_url)
    assert cli.main(["doctor", "--stack", STACK, "--region", REGION]) == 0
    capsys.readouterr()
    account.clients.cloudformation.update_stack(
        StackName=STACK, TemplateBody=tiny_template({**PARAMETERS, "ServingBackend": "torchserve"}))
    topic = doctor.read_stack(account.clients.cloudformation, STACK, REGION).outputs["NotificationTopicArn"]
    account.clients.sns.subscribe(TopicArn=topic, Protocol="email", Endpoint=EMAIL)  # moto's update made a new one
    assert cli.main(["doctor", "--stack", STACK, "--region", REGION]) == 0  # a warning is no failure
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if not line.startswith("ok   ")][1:] == [
        next(line for line in out if line.startswith("warn serving backend: ServingBackend=torchserve")),
        "no check failed (1 warning(s))"]


def test_a_stack_deployed_before_the_parameter_serves_torchserve_and_warns(account: Account) -> None:
    old = {k: v for k, v in PARAMETERS.items() if k != "ServingBackend"}
    account.clients.cloudformation.create_stack(StackName="d2ops-old", TemplateBody=tiny_template(
        {**old, "SageMakerNamePrefix": "d2ops-old"}))
    check = doctor.check_serving_backend(doctor.read_stack(account.clients.cloudformation, "d2ops-old", REGION))
    assert check.status == "warn" and "no ServingBackend parameter" in check.found and "archived" in check.found


def test_an_unknown_serving_backend_fails_and_the_offline_fix_names_the_offline_switch(account: Account) -> None:
    checks = account.check(ServingBackend="triton")
    assert checks["serving backend"].status == "FAIL" and "'triton'" in checks["serving backend"].found
    offline = doctor.check_serving_backend(replace(account.stack, deployed=False, parameters={
        **account.stack.parameters, "ServingBackend": "torchserve"}))
    assert offline.status == "warn" and "`d2ops run --parameter ServingBackend=ray-serve`" in offline.fix
    assert "sam deploy" not in offline.fix


# ---------------------------------------------------------------------------------------- quotas
def test_a_new_accounts_zero_spot_gpu_quota_fails_training_naming_quota_value_and_request(account: Account) -> None:
    account.quotas.quotas.overrides.clear()  # the account as created: every quota at its default
    checks = account.check()
    training = checks["training quota"]
    name = quota_name(GPU, "spot training")
    assert training.status == "FAIL"
    assert training.found.startswith(f"'{name}' is 0 (the default), the stack needs 2")
    code = account.clients.servicequotas.list_aws_default_service_quotas(ServiceCode="sagemaker")
    codes = {q["QuotaName"]: q["QuotaCode"] for q in code["Quotas"]}
    assert f"--quota-code {codes[name]} --desired-value 2" in training.fix
    # Found among the defaults only: ListServiceQuotas lists nothing for an account that raised nothing.
    assert account.clients.servicequotas.list_service_quotas(ServiceCode="sagemaker")["Quotas"] == []
    assert checks["evaluation quota"].status == "ok"
    # On-demand training counts against another quota, which a new account has.
    assert account.check(UseSpotTraining="false")["training quota"].status == "ok"


def test_an_applied_value_wins_over_the_default(account: Account) -> None:
    name = quota_name(GPU, "processing")
    account.quotas.quotas.set(name, 0)
    evaluation = account.check()["evaluation quota"]
    assert default_value(GPU, "processing") > 0
    assert evaluation.status == "FAIL" and evaluation.found.startswith(f"'{name}' is 0, the stack needs 1")


def test_an_endpoint_quota_that_fits_only_the_first_deployment_fails(account: Account) -> None:
    account.quotas.quotas.set(quota_name(GPU, "endpoint"), 3)
    assert account.check(EndpointInstanceCount="1")["endpoint quota"].status == "ok"  # 2 during an update
    endpoint = account.check(EndpointInstanceCount="2")["endpoint quota"]
    assert endpoint.status == "FAIL"
    assert "the first deployment fits (2), but every update needs 4" in endpoint.found
    account.quotas.quotas.set(quota_name(GPU, "endpoint"), 1)
    endpoint = account.check(EndpointInstanceCount="2")["endpoint quota"]
    assert endpoint.status == "FAIL" and "first deployment" not in endpoint.found


def test_quotas_are_found_across_pages(account: Account, monkeypatch: pytest.MonkeyPatch) -> None:
    # Several instance types, listed one quota a page: the wanted one is on a later page.
    for instance_type in ("ml.c5.xlarge", "ml.m5.large", "ml.p3.2xlarge"):
        account.quotas.quotas.set(quota_name(instance_type, "training"), 1)
    real_paginate = account.clients.servicequotas.get_paginator

    def one_a_page(name: str) -> Any:
        paginator = real_paginate(name)
        original = paginator.paginate
        paginator.paginate = lambda **kw: original(**kw, PaginationConfig={"PageSize": 1})
        return paginator

    monkeypatch.setattr(account.clients.servicequotas, "get_paginator", one_a_page)
    assert account.check()["training quota"].status == "ok"
    assert account.check(EndpointInstanceType="ml.zz9.huge")["endpoint quota"].status == "FAIL"


# --------------------------------------------------------------------------------------- weights
def test_missing_weights_fail_naming_the_key_and_the_upload_command(account: Account) -> None:
    weights = account.check(**{doctor.WEIGHTS_PARAMETER: "pretrained/other.pkl"})["pretrained weights"]
    assert weights.status == "FAIL"
    assert weights.found == f"s3://{account.stack.outputs['DataBucketName']}/pretrained/other.pkl is missing"
    assert f"d2ops weights upload FILE --stack {STACK}" in weights.fix


def test_an_object_under_the_weights_key_fails_as_the_prepare_step_would(account: Account) -> None:
    """Mutation caught: doctor only HeadObject-ing the key (ok, then every run refused PretrainedWeightsAmbiguous)."""
    bucket = account.stack.outputs["DataBucketName"]
    account.clients.s3.put_object(Bucket=bucket, Key=WEIGHTS + ".old", Body=b"x")
    weights = account.check()["pretrained weights"]
    assert weights.status == "FAIL" and f"s3://{bucket}/{WEIGHTS}.old" in weights.found


def test_training_from_scratch_needs_no_weights(account: Account) -> None:
    weights = account.check(**{doctor.WEIGHTS_PARAMETER: "none"})["pretrained weights"]
    assert weights.status == "ok" and "from scratch" in weights.found


def test_the_default_key_names_the_model_zoo_checkpoint_to_upload(account: Account) -> None:
    from d2ops_core import pretrained

    weights = account.check(**{doctor.WEIGHTS_PARAMETER: pretrained.DEFAULT_KEY})["pretrained weights"]
    assert weights.status == "FAIL"
    config = pretrained.DEFAULT_CONFIGS["detection"]
    assert pretrained.MODEL_ZOO_CHECKPOINTS[config] in weights.fix


# ---------------------------------------------------------------------------------- bucket events
def test_a_data_bucket_without_eventbridge_notifications_fails(account: Account) -> None:
    account.clients.s3.put_bucket_notification_configuration(Bucket=account.stack.outputs["DataBucketName"],
                                                             NotificationConfiguration={})
    events = account.check()["upload events"]
    assert events.status == "FAIL" and "an upload starts no run" in events.found
    assert "EventBridgeConfiguration" in events.fix


# ---------------------------------------------------------------------------------- notifications
def _pending(account: Account) -> None:
    """moto confirms e-mail subscriptions at once; SNS lists one not yet confirmed with the SubscriptionArn
    "PendingConfirmation". moto renders the subscription's ``arn``, so that is where the state goes."""
    from moto.sns.models import sns_backends

    backend = sns_backends[ACCOUNT][REGION]
    for subscription in backend.subscriptions.values():
        subscription.arn = "PendingConfirmation"


def test_an_unconfirmed_subscription_fails(account: Account) -> None:
    _pending(account)
    notifications = account.check()["notifications"]
    assert notifications.status == "FAIL" and "not confirmed" in notifications.found
    assert EMAIL in notifications.fix


def test_an_address_never_subscribed_fails_and_no_address_warns(account: Account) -> None:
    other = account.check(NotificationEmail="someone@example.com")["notifications"]
    assert other.status == "FAIL" and "aws sns subscribe" in other.fix
    none = account.check(NotificationEmail="")["notifications"]
    assert none.status == "warn"


# ---------------------------------------------------------------------------------- endpoint name
def test_another_stack_with_the_same_prefix_fails_naming_it(account: Account) -> None:
    account.clients.cloudformation.create_stack(StackName="d2ops-prod", TemplateBody=tiny_template(PARAMETERS))
    endpoint = account.check()["endpoint name"]
    assert endpoint.status == "FAIL" and "d2ops-prod" in endpoint.found and "SageMakerNamePrefix" in endpoint.fix
    assert account.check(SageMakerNamePrefix="d2ops-own")["endpoint name"].status == "ok"


def _endpoint(account: Account, tags: list[dict[str, str]]) -> None:
    sagemaker = account.clients.sagemaker
    sagemaker.create_model(ModelName="m", ExecutionRoleArn=f"arn:aws:iam::{ACCOUNT}:role/sm",
                           PrimaryContainer={"Image": PARAMETERS["ServingImageUri"]})
    sagemaker.create_endpoint_config(EndpointConfigName="c", ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "m", "InitialInstanceCount": 1, "InstanceType": GPU}])
    sagemaker.create_endpoint(EndpointName=account.stack.endpoint_name, EndpointConfigName="c", Tags=tags)


def test_an_endpoint_deployed_by_another_stacks_run_fails(account: Account) -> None:
    _endpoint(account, [{"Key": doctor.RUN_ID_TAG, "Value": "shapes-v1-0123456789ab"}])
    endpoint = account.check()["endpoint name"]
    assert endpoint.status == "FAIL" and "run shapes-v1-0123456789ab" in endpoint.found


def test_an_endpoint_this_stacks_run_deployed_passes(account: Account) -> None:
    machine = account.stack.outputs["PipelineStateMachineArn"]
    account.clients.stepfunctions.start_execution(stateMachineArn=machine, name="shapes-v1-0123456789ab")
    _endpoint(account, [{"Key": doctor.RUN_ID_TAG, "Value": "shapes-v1-0123456789ab"}])
    assert account.check()["endpoint name"].status == "ok"


def test_an_endpoint_of_a_run_whose_execution_expired_passes_by_its_artifacts(account: Account) -> None:
    # Step Functions drops a closed execution after 90 days; the run's artifacts stay in the stack's bucket.
    run_id = "shapes-v1-0123456789ab"
    _endpoint(account, [{"Key": doctor.RUN_ID_TAG, "Value": run_id}])
    artifacts = account.stack.outputs["ArtifactsBucketName"]
    # Another run whose id merely starts the same does not count.
    account.clients.s3.put_object(Bucket=artifacts, Key=f"runs/{run_id}0/evaluation/evaluation.json", Body=b"{}")
    assert account.check()["endpoint name"].status == "FAIL"
    account.clients.s3.put_object(Bucket=artifacts, Key=f"runs/{run_id}/evaluation/evaluation.json", Body=b"{}")
    endpoint = account.check()["endpoint name"]
    assert endpoint.status == "ok" and endpoint.found.endswith(f"this stack's run {run_id}")


def test_an_endpoint_no_d2ops_run_made_fails(account: Account) -> None:
    _endpoint(account, [])
    assert "no d2ops run deployed" in account.check()["endpoint name"].found


# --------------------------------------------------------------------------------- access, output
def test_an_access_denial_is_that_checks_line_naming_the_permission(account: Account) -> None:
    with Stubber(account.clients.ecr) as ecr:
        for _ in range(2):
            ecr.add_client_error("describe_images", service_error_code="AccessDeniedException",
                                 service_message="not authorized", http_status_code=400)
        checks = account.check()
    for name in ("training image", "serving image"):
        assert checks[name].status == "FAIL" and checks[name].found == "access denied to ecr:DescribeImages"
        assert "grant ecr:DescribeImages" in checks[name].fix
    assert checks["upload events"].status == "ok"  # the other checks still answer


def test_a_stack_that_is_not_there_is_one_error() -> None:
    with mock_aws():
        cloudformation = boto3.client("cloudformation", region_name=REGION, aws_access_key_id="x",
                                      aws_secret_access_key="x")
        with pytest.raises(doctor.StackNotFound, match="stack 'nope'"):
            doctor.read_stack(cloudformation, "nope", REGION)


def test_lines_carry_the_fix_only_when_something_is_wrong() -> None:
    report = Report([Check("a", "ok", "fine", "never shown"), Check("b", "FAIL", "broken", "mend it"),
                     Check("c", "warn", "odd", "look")])
    assert report.lines() == ["ok   a: fine", "FAIL b: broken -> mend it", "warn c: odd -> look"]
    assert report.failed
    assert not Report([Check("c", "warn", "odd", "look")]).failed


def test_the_command_exits_0_when_healthy_1_on_a_failure_and_2_without_a_stack(
        account: Account, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", account.quotas_url)  # the rest is moto's
    command = ["doctor", "--stack", STACK, "--region", REGION]
    assert cli.main(command) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"d2ops doctor: stack {STACK} ({REGION})" and out[-1] == "all checks passed"
    assert len(out) == 13 and all(line.startswith("ok   ") for line in out[1:-1])

    account.clients.s3.put_bucket_notification_configuration(Bucket=account.stack.outputs["DataBucketName"],
                                                             NotificationConfiguration={})
    assert cli.main(command) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("FAIL")] == [next(
        line for line in out if line.startswith("FAIL upload events: ") and " -> " in line)]
    assert out[-1] == "1 check(s) failed"

    with pytest.raises(SystemExit) as exited:
        cli.main(["doctor", "--stack", "nope", "--region", REGION])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stack 'nope'" in err and "Traceback" not in err


@pytest.mark.parametrize(("status", "verdict"), [("CREATE_COMPLETE", "ok"), ("UPDATE_COMPLETE", "ok"),
                                                 ("UPDATE_IN_PROGRESS", "warn"), ("ROLLBACK_COMPLETE", "FAIL"),
                                                 ("UPDATE_ROLLBACK_COMPLETE", "warn"), ("CREATE_FAILED", "FAIL")])
def test_a_stack_that_did_not_deploy_fails_the_stack_check(status: str, verdict: str) -> None:
    stack = StackFacts(name=STACK, region=REGION, parameters={}, outputs={}, status=status)
    assert doctor.check_stack_status(stack).status == verdict


def test_the_offline_stacks_weights_fix_names_the_command_without_stack(account: Account) -> None:
    stack = replace(account.stack, deployed=False, parameters={**account.stack.parameters,
                                                               doctor.WEIGHTS_PARAMETER: "pretrained/x.pkl"})
    weights = doctor.check_weights(account.clients.s3, stack)
    assert weights.status == "FAIL" and "`d2ops weights upload FILE`" in weights.fix


def test_every_call_the_checks_make_has_the_iam_action_a_denial_names(account: Account) -> None:
    called: set[str] = set()
    for client in vars(account.clients).values():
        client.meta.events.register("before-call.*.*", lambda model, **_: called.add(model.name))
    _endpoint(account, [{"Key": doctor.RUN_ID_TAG, "Value": "shapes-v1-0123456789ab"}])  # the tag path too
    called.clear()
    account.quotas.quotas.overrides.clear()  # the defaults path too
    doctor.run_checks(account.clients, account.stack)
    assert called and called <= set(doctor.IAM_ACTIONS), called - set(doctor.IAM_ACTIONS)
    assert {"ListAWSDefaultServiceQuotas", "ListTags", "DescribeExecution", "HeadObject"} <= called
