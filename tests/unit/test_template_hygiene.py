"""Template hygiene, read from template.yaml itself (cfn-lint's loader via d2ops.template).

These are the conventions the template's header promises: no hard-coded names,
partition-aware ARNs, hygienic buckets, least-privilege IAM, encrypted messaging, logged and
traced state machines, authenticated APIs, and a written reason for every checkov skip.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from d2ops.template import REPO_ROOT, SamTemplate, load_template
from d2ops_core import s3_layout
from d2ops_core.pipeline_stages import all_states

T: SamTemplate = load_template()
RESOURCES = T.resources


def resources_of(*types: str) -> list[str]:
    return sorted(k for k, v in RESOURCES.items() if v["Type"] in types)


def props(logical_id: str) -> dict[str, Any]:
    return dict(RESOURCES[logical_id].get("Properties") or {})


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")


def is_ref(value: Any, logical_id: str) -> bool:
    return value == {"Ref": logical_id}


def references(name: str) -> bool:
    """Whether anything outside Parameters refers to ``name`` (Ref, Sub or GetAtt)."""
    sub = re.compile(r"\$\{" + re.escape(name) + r"(\.[A-Za-z.]+)?\}")
    for section in ("Resources", "Outputs", "Conditions", "Globals"):
        for _, node in walk(T.document.get(section) or {}):
            if node == {"Ref": name}:
                return True
            if isinstance(node, dict) and "Fn::Sub" in node:
                text = node["Fn::Sub"] if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"][0]
                if sub.search(text):
                    return True
    return False


# ---------------------------------------------------------------- identity policies

def identity_statements() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every statement of every identity policy (roles, managed/inline policies, SAM Policies)."""
    for rid, res in RESOURCES.items():
        p = res.get("Properties") or {}
        docs: list[Any] = []
        if res["Type"] == "AWS::IAM::Role":
            docs += [pol["PolicyDocument"] for pol in p.get("Policies") or []]
        elif res["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            docs.append(p["PolicyDocument"])
        elif res["Type"] in ("AWS::Serverless::Function", "AWS::Serverless::StateMachine"):
            policies = p.get("Policies") or []
            docs += [pol for pol in (policies if isinstance(policies, list) else [policies])
                     if isinstance(pol, dict) and "Statement" in pol]
        for doc in docs:
            statements = doc["Statement"]
            for st in statements if isinstance(statements, list) else [statements]:
                yield rid, st


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# Actions AWS only authorises on Resource "*" (no resource-level permissions).
RESOURCE_STAR_ALLOWED = {
    "ecr:GetAuthorizationToken",
    "cloudwatch:PutMetricData",
    "cloudwatch:GetMetricData",  # no resource types (the status API reads training progress)
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "logs:CreateLogDelivery",
    "logs:GetLogDelivery",
    "logs:UpdateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:DescribeResourcePolicies",
    "logs:DescribeLogGroups",
    "sagemaker:ListModelPackages",
    "sagemaker:ListModelPackageGroups",
    "sagemaker:ListTrainingJobs",
    "sagemaker:ListEndpoints",
    "sagemaker:ListEndpointConfigs",
    "sagemaker:ListProcessingJobs",
    "sagemaker:ListModels",
    "sagemaker:Search",
    "states:ListStateMachines",
    "states:SendTaskSuccess",  # no resource types: the task token is the scope (the status API's decisions)
}


def test_identity_policies_name_actions_and_resources_precisely() -> None:
    statements = list(identity_statements())
    assert statements, "the template grants nothing at all?"
    for rid, st in statements:
        where = f"{rid} statement {st.get('Sid', st)}"
        assert "NotAction" not in st and "NotResource" not in st, f"{where}: NotAction/NotResource grants too much"
        if st.get("Effect") != "Allow":
            continue
        actions = as_list(st["Action"])
        for action in actions:
            assert action != "*" and not action.endswith(":*"), f"{where}: wildcard action {action}"
        if "*" in as_list(st["Resource"]):
            broad = sorted(set(actions) - RESOURCE_STAR_ALLOWED)
            assert not broad, f"{where}: Resource '*' for actions that support resource-level permissions: {broad}"


def test_sam_policies_are_not_broad_managed_policies() -> None:
    for rid in resources_of("AWS::Serverless::Function", "AWS::Serverless::StateMachine", "AWS::IAM::Role"):
        p = props(rid)
        named = [x for x in as_list(p.get("Policies") or []) if isinstance(x, str)]
        named += [x for x in p.get("ManagedPolicyArns") or [] if isinstance(x, str)]
        for name in named:
            assert "FullAccess" not in name and "Administrator" not in name and "PowerUser" not in name, (
                f"{rid}: broad managed policy {name}"
            )


def test_pass_role_is_scoped_to_a_role_and_a_service() -> None:
    for rid, st in identity_statements():
        if "iam:PassRole" not in as_list(st.get("Action", [])):
            continue
        assert "*" not in as_list(st["Resource"]), f"{rid}: iam:PassRole on '*'"
        assert "iam:PassedToService" in (st.get("Condition") or {}).get("StringEquals", {}), (
            f"{rid}: iam:PassRole without an iam:PassedToService condition"
        )


# The one role people assume: the reviewer's, trusting the principals the operator names or the account.
PEOPLE_ROLES = {"ReviewerRole": {"Fn::If": ["HasReviewerPrincipals", {"Ref": "ReviewerPrincipals"},
                                            {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}]}}


def test_roles_trust_one_service_principal_in_our_account() -> None:
    for rid in resources_of("AWS::IAM::Role"):
        for st in props(rid)["AssumeRolePolicyDocument"]["Statement"]:
            principal = st["Principal"]
            if rid in PEOPLE_ROLES:  # never '*' nor another account by default
                assert principal == {"AWS": PEOPLE_ROLES[rid]}, f"{rid}: trusts {principal}"
                continue
            assert principal != "*" and "AWS" not in principal, f"{rid}: trusts {principal}"


# ---------------------------------------------------------------- names and ARNs

NAME_PROPERTIES = {
    "BucketName", "FunctionName", "RoleName", "TopicName", "QueueName", "StateMachineName",
    "LogGroupName", "TableName", "LayerName", "AliasName", "ModelPackageGroupName", "RuleName",
    "ManagedPolicyName", "RepositoryName", "AlarmName",
}


def test_no_hard_coded_resource_names() -> None:
    for rid, res in RESOURCES.items():
        for key in NAME_PROPERTIES & set(res.get("Properties") or {}):
            value = res["Properties"][key]
            sub = value.get("Fn::Sub") if isinstance(value, dict) else None
            text = sub if isinstance(sub, str) else (sub[0] if isinstance(sub, list) else "")
            hint = ("let CloudFormation name it or use !Sub ${AWS::StackName}-... "
                    "(SageMaker resources: ${SageMakerNamePrefix}-...)")
            named = "${AWS::StackName}" in text or "${SageMakerNamePrefix}" in text
            assert named, f"{rid}.{key} = {value!r}: {hint}"


def test_arns_are_partition_aware() -> None:
    literal_arn = re.compile(r"arn:aws(-[a-z-]+)?:")
    for section in ("Resources", "Outputs", "Globals"):
        for path, node in walk(T.document.get(section) or {}):
            if ".Metadata" in path or path.endswith(".Description"):
                continue
            if isinstance(node, str):
                assert not literal_arn.search(node), f"{section}{path}: literal partition in {node!r}"
            if isinstance(node, dict) and "Fn::Sub" in node:
                text = node["Fn::Sub"] if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"][0]
                for m in re.finditer(r"arn:", text):
                    assert text[m.end():].startswith("${AWS::Partition}"), f"{section}{path}: {text!r}"


# ---------------------------------------------------------------- globals, layer, functions

def test_transform_and_function_globals() -> None:
    assert T.document["Transform"] == "AWS::Serverless-2016-10-31"
    glob = T.document["Globals"]["Function"]
    assert glob["Runtime"] == "python3.11"
    assert glob["Architectures"] == ["x86_64"]
    assert glob["Tracing"] == "Active"
    assert {"Ref": "CoreLayer"} in glob["Layers"]
    log_group = glob["LoggingConfig"]["LogGroup"]["Ref"]
    assert RESOURCES[log_group]["Type"] == "AWS::Logs::LogGroup" and "RetentionInDays" in props(log_group)
    assert {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL"} <= set(
        glob["Environment"]["Variables"]
    )


def test_core_layer_is_built_by_sam_from_src() -> None:
    layer = RESOURCES["CoreLayer"]
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"] == "src/"
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.11"]
    # Only the core modules ship (d2ops.layer_build, run by tools/layer/Makefile).
    assert layer["Metadata"]["BuildMethod"] == "makefile"
    assert "build-CoreLayer:" in (REPO_ROOT / layer["Metadata"]["ContextPath"] / "Makefile").read_text()
    assert (REPO_ROOT / "src" / "requirements.txt").is_file()
    assert (REPO_ROOT / "src" / "d2ops" / "__init__.py").is_file()


FUNCTIONS = T.functions()


@pytest.mark.parametrize("logical_id", sorted(FUNCTIONS))
def test_function_follows_the_layout(logical_id: str) -> None:
    fn = FUNCTIONS[logical_id]
    m = re.fullmatch(r"functions/([a-z_]+)/", fn.code_uri)
    assert m, f"{logical_id}: CodeUri {fn.code_uri!r} is not functions/<fn>/"
    name = m.group(1)
    module = fn.handler.removesuffix(".handler")
    # One handler per package, or a second task of the same code in its own module (Summarize image checks).
    assert fn.handler == f"{name}.handler.handler" or (
        module.startswith(f"{name}.") and (fn.code_dir / (module.replace(".", "/") + ".py")).is_file()
    ), f"{logical_id}: Handler {fn.handler!r}"
    assert fn.runtime == "python3.11"
    assert (fn.code_dir / name / "handler.py").is_file(), f"{logical_id}: {fn.code_uri}{name}/handler.py missing"
    assert (fn.code_dir / "requirements.txt").is_file(), f"{logical_id}: {fn.code_uri}requirements.txt missing"
    assert {"Ref": "CoreLayer"} in fn.layers


def test_every_function_has_a_sample_event() -> None:
    for fn in FUNCTIONS.values():
        name = fn.code_uri.rstrip("/").rpartition("/")[2]
        events = list((REPO_ROOT / "events" / name).glob("*.json"))
        assert events, f"events/{name}/ holds no sample event for {fn.logical_id}"


def test_validate_dataset_function() -> None:
    fn = T.function_for_code_dir("validate_dataset")
    assert fn.handler == "validate_dataset.handler.handler"
    assert fn.environment["ARTIFACTS_BUCKET"] == {"Ref": "ArtifactsBucket"}
    assert "IMAGE_SAMPLE_SIZE" not in fn.environment
    assert fn.environment["INLINE_IMAGE_LIMIT"] == {"Ref": "InlineImageLimit"}
    assert fn.environment["IMAGE_CHECK_CONCURRENCY"] == {"Ref": "ImageCheckConcurrency"}
    # ~450 MB annotation files: the validator peaks under 2 GiB; leave headroom.
    assert fn.memory_size is not None and fn.memory_size >= 4096
    assert fn.timeout == 900
    assert fn.properties["EphemeralStorage"]["Size"] >= 1024

    statements = [st for rid, st in identity_statements() if rid == fn.logical_id]
    grants = {(a, str(r)) for st in statements for a in as_list(st["Action"]) for r in as_list(st["Resource"])}
    assert grants == {
        ("s3:ListBucket", str({"Fn::GetAtt": ["DataBucket", "Arn"]})),
        ("s3:ListBucketVersions", str({"Fn::GetAtt": ["DataBucket", "Arn"]})),
        ("s3:GetObject", str({"Fn::Sub": "${DataBucket.Arn}/datasets/*"})),
        ("s3:GetObjectVersion", str({"Fn::Sub": "${DataBucket.Arn}/datasets/*"})),
        ("s3:PutObject", str({"Fn::Sub": "${ArtifactsBucket.Arn}/runs/*/validation/*"})),
        ("s3:PutObject", str({"Fn::Sub": "${ArtifactsBucket.Arn}/runs/*/inventory.jsonl"})),
        ("s3:PutObject", str({"Fn::Sub": "${ArtifactsBucket.Arn}/runs/*/dataset/*"})),
        ("s3:PutObjectTagging", str({"Fn::Sub": "${ArtifactsBucket.Arn}/runs/*/dataset/*"})),
    }
    for action in ("s3:ListBucket", "s3:ListBucketVersions"):
        (listing,) = [st for st in statements if st["Action"] == action]
        assert listing["Condition"] == {"StringLike": {"s3:prefix": "datasets/*"}}


# ---------------------------------------------------------------- storage

BUCKETS = resources_of("AWS::S3::Bucket")


def test_the_expected_buckets_exist() -> None:
    assert {"DataBucket", "ArtifactsBucket"} <= set(BUCKETS)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_bucket_is_versioned_encrypted_private_and_retained(bucket: str) -> None:
    p = props(bucket)
    assert p["VersioningConfiguration"] == {"Status": "Enabled"}
    (rule,) = p["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    assert p["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
    }
    assert p["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    rules = p["LifecycleConfiguration"]["Rules"]
    assert any("NoncurrentVersionExpiration" in r for r in rules), "noncurrent versions would pile up forever"
    assert any("AbortIncompleteMultipartUpload" in r for r in rules)
    assert RESOURCES[bucket]["DeletionPolicy"] == "Retain"
    assert RESOURCES[bucket]["UpdateReplacePolicy"] == "Retain"
    logging = p.get("LoggingConfiguration")
    if logging is None:
        skips = {s["id"] for s in RESOURCES[bucket].get("Metadata", {}).get("checkov", {}).get("skip", [])}
        assert "CKV_AWS_18" in skips, f"{bucket}: no access logging and no justified skip"
    else:
        assert is_ref(logging["DestinationBucketName"], "LogsBucket")


@pytest.mark.parametrize("bucket", BUCKETS)
def test_bucket_policy_denies_plain_http(bucket: str) -> None:
    policies = [props(r) for r in resources_of("AWS::S3::BucketPolicy") if is_ref(props(r)["Bucket"], bucket)]
    assert len(policies) == 1, f"{bucket}: expected one bucket policy, found {len(policies)}"
    denies = [
        st for st in policies[0]["PolicyDocument"]["Statement"]
        if st["Effect"] == "Deny" and st["Principal"] == "*" and st["Action"] == "s3:*"
        and st.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
    ]
    assert len(denies) == 1, f"{bucket}: no TLS-only statement"
    assert denies[0]["Resource"] == [{"Fn::GetAtt": [bucket, "Arn"]}, {"Fn::Sub": f"${{{bucket}.Arn}}/*"}]
    for st in policies[0]["PolicyDocument"]["Statement"]:
        if st["Effect"] == "Allow":
            assert st["Principal"] != "*" and "Service" in st["Principal"], f"{bucket}: Allow to {st['Principal']}"
            assert "aws:SourceAccount" in st["Condition"]["StringEquals"]


def test_data_bucket_sends_events_to_eventbridge() -> None:
    notifications = props("DataBucket")["NotificationConfiguration"]
    assert notifications == {"EventBridgeConfiguration": {"EventBridgeEnabled": True}}


# ---------------------------------------------------------------- messaging, logs, keys

def test_topics_queues_and_keys_are_encrypted() -> None:
    for rid in resources_of("AWS::SNS::Topic"):
        assert "KmsMasterKeyId" in props(rid), f"{rid}: unencrypted topic"
    for rid in resources_of("AWS::SQS::Queue"):
        p = props(rid)
        assert "KmsMasterKeyId" in p or p.get("SqsManagedSseEnabled") is True, f"{rid}: unencrypted queue"
        assert p.get("MessageRetentionPeriod", 0) >= 7 * 86400, f"{rid}: dead letters must survive a week"
    for rid in resources_of("AWS::KMS::Key"):
        assert props(rid)["EnableKeyRotation"] is True


def test_log_groups_expire() -> None:
    for rid in resources_of("AWS::Logs::LogGroup"):
        assert "RetentionInDays" in props(rid), f"{rid}: logs kept forever"


def test_notification_email_is_optional() -> None:
    assert T.parameters()["NotificationEmail"].default == ""
    subs = [r for r in resources_of("AWS::SNS::Subscription") if props(r)["Protocol"] == "email"]
    assert subs and all(RESOURCES[r]["Condition"] == "HasNotificationEmail" for r in subs)
    assert T.condition("HasNotificationEmail", {"NotificationEmail": ""}) is False
    assert T.condition("HasNotificationEmail", {"NotificationEmail": "ml@example.com"}) is True


# ---------------------------------------------------------------- parameters

EXPECTED_PARAMETERS = {
    "TrainingImageUri", "ServingImageUri", "TrainingInstanceType", "TrainingInstanceCount", "UseSpotTraining",
    "MaxTrainingSeconds", "EvaluationInstanceType", "EndpointInstanceType", "EndpointInstanceCount", "MinMap",
    "MaxRegression", "NotificationEmail", "InlineImageLimit", "ImageCheckConcurrency", "SnapshotRetentionDays",
}


def test_expected_parameters_exist() -> None:
    assert set(T.parameters()) >= EXPECTED_PARAMETERS
    assert "ImageSampleSize" not in T.parameters()  # every image is checked now, none sampled


def test_image_check_parameters_are_bounded() -> None:
    params = T.document["Parameters"]
    concurrency = params["ImageCheckConcurrency"]
    assert concurrency["Default"] == 100 and concurrency["MinValue"] == 1 and concurrency["MaxValue"] <= 1000
    assert params["InlineImageLimit"]["Default"] == 2000
    assert params["SnapshotRetentionDays"]["Default"] == 30 and params["SnapshotRetentionDays"]["MinValue"] >= 1


@pytest.mark.parametrize("name", sorted(T.parameters()))
def test_parameter_is_used(name: str) -> None:
    assert references(name), f"parameter {name} is declared but nothing uses it"


def test_image_uris_have_no_default_and_are_validated() -> None:
    for name in ("TrainingImageUri", "ServingImageUri"):
        spec = T.parameters()[name]
        assert spec.default is None, f"{name}: a default image would deploy someone else's code"
        pattern = re.compile(T.document["Parameters"][name]["AllowedPattern"])
        assert pattern.fullmatch("123456789012.dkr.ecr.eu-west-1.amazonaws.com/d2ops-training:abc123")
        assert not pattern.fullmatch("docker.io/library/python:3.11")


# ---------------------------------------------------------------- checkov skips

def test_every_checkov_skip_has_a_reason() -> None:
    skips = 0
    for rid, res in RESOURCES.items():
        for skip in (res.get("Metadata") or {}).get("checkov", {}).get("skip", []):
            skips += 1
            assert re.fullmatch(r"CKV2?_AWS_\d+", skip["id"]), f"{rid}: odd checkov id {skip!r}"
            assert len(skip.get("comment", "").split()) >= 5, f"{rid}: skip {skip['id']} needs a written reason"
    assert skips, "no skips at all: either checkov got stricter or this test reads the wrong place"


# ---------------------------------------------------------------- pipeline resources

def test_state_machine_is_standard_logged_and_traced() -> None:
    (sm_id,) = resources_of("AWS::Serverless::StateMachine")
    p = props(sm_id)
    assert p["Type"] == "STANDARD"
    assert (REPO_ROOT / p["DefinitionUri"]).is_file()
    assert p["Tracing"] == {"Enabled": True}
    assert p["Logging"]["Level"] in ("ALL", "ERROR")
    assert p["Logging"]["IncludeExecutionData"] is True
    (dest,) = p["Logging"]["Destinations"]
    log_group = dest["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert RESOURCES[log_group]["Type"] == "AWS::Logs::LogGroup"
    # Vended-log group names avoid the 5 KB resource-policy limit on /aws/states/...
    assert props(log_group)["LogGroupName"]["Fn::Sub"].startswith("/aws/vendedlogs/states/")


def test_state_machine_substitutes_every_placeholder_of_its_definition() -> None:
    sm = T.state_machine()
    placeholders = set(re.findall(r"\$\{([A-Za-z0-9_]+)\}", sm.definition_path.read_text()))
    assert placeholders == set(sm.definition_substitutions), (
        f"missing: {sorted(placeholders - set(sm.definition_substitutions))}, "
        f"unused: {sorted(set(sm.definition_substitutions) - placeholders)}"
    )


def test_sync_integrations_can_manage_their_eventbridge_rules() -> None:
    definition = T.state_machine().definition_path.read_text()
    granted = {
        str(r) for rid, st in identity_statements() if RESOURCES[rid]["Type"] == "AWS::Serverless::StateMachine"
        for r in as_list(st["Resource"]) if "events:PutRule" in as_list(st["Action"])
    }
    for job, rule in (("createTrainingJob.sync", "StepFunctionsGetEventsForSageMakerTrainingJobsRule"),
                      ("createProcessingJob.sync", "StepFunctionsGetEventsForSageMakerProcessingJobsRule")):
        if job in definition:
            assert any(rule in g for g in granted), f"{job} needs events:PutRule/PutTargets/DescribeRule on {rule}"


def test_manifest_upload_triggers_the_start_function_with_retries_and_a_dead_letter_queue() -> None:
    fn = T.function_for_code_dir("start_pipeline")
    (event,) = fn.properties["Events"].values()
    assert event["Type"] == "EventBridgeRule"
    pattern = event["Properties"]["Pattern"]
    assert pattern["source"] == ["aws.s3"] and pattern["detail-type"] == ["Object Created"]
    assert pattern["detail"]["bucket"]["name"] == [{"Ref": "DataBucket"}]
    (key_rule,) = pattern["detail"]["object"]["key"]
    assert key_rule in ({"wildcard": "datasets/*/manifest.json"}, {"suffix": "/manifest.json"})
    assert event["Properties"]["RetryPolicy"]["MaximumRetryAttempts"] >= 3
    dlq = event["Properties"]["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]
    assert RESOURCES[dlq]["Type"] == "AWS::SQS::Queue"
    assert fn.properties["DeadLetterQueue"]["TargetArn"] == {"Fn::GetAtt": [dlq, "Arn"]}
    assert fn.environment["STATE_MACHINE_ARN"] == {"Ref": T.state_machine().logical_id}
    queue_policies = [props(r) for r in resources_of("AWS::SQS::QueuePolicy") if {"Ref": dlq} in props(r)["Queues"]]
    (policy,) = queue_policies
    senders = [st for st in policy["PolicyDocument"]["Statement"] if st["Effect"] == "Allow"]
    assert [st["Principal"] for st in senders] == [{"Service": "events.amazonaws.com"}]
    assert "aws:SourceArn" in senders[0]["Condition"].get("ArnEquals", senders[0]["Condition"].get("ArnLike", {}))


@pytest.mark.parametrize("function", sorted(
    fid for fid, fn in T.functions().items()
    if any(e["Type"] == "EventBridgeRule" for e in (fn.properties.get("Events") or {}).values())))
def test_every_eventbridge_invoked_function_keeps_its_failed_events_and_alarms(function: str) -> None:
    # EventBridge invokes asynchronously: its RetryPolicy covers delivery only; Lambda retries a
    # failing invocation twice and then drops it unless the function has a DeadLetterQueue.
    fn = T.functions()[function]
    dlq = fn.properties["DeadLetterQueue"]["TargetArn"]["Fn::GetAtt"][0]
    assert fn.properties["DeadLetterQueue"]["Type"] == "SQS" and RESOURCES[dlq]["Type"] == "AWS::SQS::Queue"
    for name, event in fn.properties["Events"].items():
        if event["Type"] == "EventBridgeRule":
            assert event["Properties"]["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": [dlq, "Arn"]}, name
    (policy,) = [props(r) for r in resources_of("AWS::SQS::QueuePolicy") if {"Ref": dlq} in props(r)["Queues"]]
    senders = [st for st in policy["PolicyDocument"]["Statement"] if st["Effect"] == "Allow"]
    assert [st["Principal"] for st in senders] == [{"Service": "events.amazonaws.com"}]
    watched = {"Fn::GetAtt": [dlq, "QueueName"]}
    alarms = [a for a in resources_of("AWS::CloudWatch::Alarm")
              if props(a)["Namespace"] == "AWS/SQS" and props(a)["Dimensions"][0]["Value"] == watched]
    assert alarms, f"nothing alarms when {dlq} holds {function}'s failed events"
    assert props(alarms[0])["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert props(alarms[0])["Threshold"] == 0 and props(alarms[0])["ComparisonOperator"] == "GreaterThanThreshold"
    skips = {s["id"] for s in (RESOURCES[function].get("Metadata") or {}).get("checkov", {}).get("skip", [])}
    assert "CKV_AWS_116" not in skips, f"{function} has a dead-letter queue: CKV_AWS_116 needs no skip"


def test_status_api_requires_iam_auth_throttles_and_logs() -> None:
    (api_id,) = resources_of("AWS::Serverless::HttpApi")
    p = props(api_id)
    assert p["Auth"]["DefaultAuthorizer"] == "AWS_IAM" and p["Auth"]["EnableIamAuthorizer"] is True
    assert p["DefaultRouteSettings"]["ThrottlingBurstLimit"] > 0
    assert p["DefaultRouteSettings"]["ThrottlingRateLimit"] > 0
    log_group = p["AccessLogSettings"]["DestinationArn"]["Fn::GetAtt"][0]
    assert RESOURCES[log_group]["Type"] == "AWS::Logs::LogGroup"
    routes = {
        (e["Properties"]["Method"], e["Properties"]["Path"])
        for fn in FUNCTIONS.values() for e in (fn.properties.get("Events") or {}).values() if e["Type"] == "HttpApi"
    }
    assert {("GET", "/runs"), ("GET", "/runs/{runId}"), ("POST", "/runs"), ("GET", "/models")} <= routes
    for fn in FUNCTIONS.values():
        for e in (fn.properties.get("Events") or {}).values():
            if e["Type"] == "HttpApi":
                assert e["Properties"]["ApiId"] == {"Ref": api_id}
                assert e["Properties"].get("Auth", {}).get("Authorizer", "AWS_IAM") == "AWS_IAM"


def test_alarms_notify() -> None:
    alarms = resources_of("AWS::CloudWatch::Alarm")
    metrics = {(props(a)["Namespace"], props(a)["MetricName"]) for a in alarms}
    assert ("AWS/States", "ExecutionsFailed") in metrics
    assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible") in metrics
    assert ("AWS/Lambda", "Errors") in metrics
    # The drift alarm is silent by design: the monitor publishes the drifted window's one message itself.
    assert "AlarmActions" not in props("MonitorDriftAlarm")
    for a in alarms:
        if a != "MonitorDriftAlarm":
            assert props(a)["AlarmActions"] == [{"Ref": "NotificationTopic"}], f"{a} notifies nobody"


# ---------------------------------------------------------------- SageMaker roles (issue 10)
# Each job kind has its own role; the S3 keys, repositories and roles the pipeline really uses
# (the prepare Lambda's plan, the ASL's CreateModel) are checked against what each role allows.

JOB_ROLES = {"training": "TrainingJobRole", "evaluation": "EvaluationJobRole", "endpoint": "EndpointRole"}
IMAGES = {"TrainingImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/d2ops-training:7",
          "ServingImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/d2ops-serving@sha256:" + "a" * 64}


def _resolved_statements(role: str) -> list[dict[str, Any]]:
    from d2ops.template import resolve
    from tests.fixtures.pipeline import support

    def getatt(logical_id: str, attribute: str) -> str:
        kind = RESOURCES[logical_id]["Type"]
        if kind == "AWS::S3::Bucket":
            return "arn:aws:s3:::" + {"DataBucket": support.DATA_BUCKET, "ArtifactsBucket": support.ARTIFACTS_BUCKET,
                                      }.get(logical_id, logical_id)
        return f"arn:aws:{kind.split('::')[1].lower()}:us-east-1:123456789012:{logical_id}"

    tpl = load_template()
    refs = {**tpl.parameter_defaults(), **IMAGES, "DataBucket": support.DATA_BUCKET,
            "ArtifactsBucket": support.ARTIFACTS_BUCKET}

    def conditions(name: str) -> bool:
        return tpl.condition(name, refs)

    statements: list[dict[str, Any]] = []
    if RESOURCES[role]["Type"] in ("AWS::Serverless::Function", "AWS::Serverless::StateMachine"):
        # SAM's Policies: the inline documents (policy templates such as LambdaInvokePolicy aside).
        own = [st for rid, st in identity_statements() if rid == role]
        others = {rid: f"ref-{rid}" for rid in RESOURCES}  # topics, tables...: names stand in for their Refs
        return [st for st in resolve(own, {**others, **refs}, getatt, conditions=conditions) if st]
    for policy in props(role).get("Policies", []):
        statements += resolve(policy["PolicyDocument"]["Statement"], refs, getatt, conditions=conditions)
    for managed in props(role).get("ManagedPolicyArns", []):
        assert is_ref(managed, "SageMakerJobBasics"), f"{role}: unexpected managed policy {managed}"
        statements += resolve(props("SageMakerJobBasics")["PolicyDocument"]["Statement"], refs, getatt,
                              conditions=conditions)
    return [st for st in statements if st]  # an Fn::If's AWS::NoValue branch


def allows(role: str, action: str, arn: str, prefix: str | None = None) -> bool:
    """Whether an Allow statement of ``role`` grants ``action`` on ``arn`` (``prefix``: s3:prefix of a list)."""
    import fnmatch

    for st in _resolved_statements(role):
        if st["Effect"] != "Allow" or action not in as_list(st["Action"]):
            continue
        if not any(fnmatch.fnmatchcase(arn, pattern) for pattern in as_list(st["Resource"])):
            continue
        condition = st.get("Condition") or {}
        exact = condition.get("StringEquals", {}).get("s3:prefix")
        if exact is not None:
            if prefix is not None and prefix in as_list(exact):
                return True
            continue
        wanted = condition.get("StringLike", {}).get("s3:prefix")
        if wanted is None or (prefix is not None and any(fnmatch.fnmatchcase(prefix, p) for p in as_list(wanted))):
            return True
    return False


def _s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return f"arn:aws:s3:::{bucket}", key


def _plan() -> dict[str, Any]:
    from tests.fixtures.pipeline import support

    support.function_path("prepare_training")
    from prepare_training.models import ChampionRef, PrepareEvent, PrepareSettings
    from prepare_training.service import build_plan

    settings = PrepareSettings.from_env(support.PREPARE_ENV)
    champion = ChampionRef(run_id="older", primary_metric="bbox_AP", primary_value=0.5,
                           model_data=f"s3://{support.ARTIFACTS_BUCKET}/runs/older/training/older-train/output/"
                                      "model.tar.gz", model_package_arn="arn:aws:sagemaker:::model-package/x/1")
    event = PrepareEvent.model_validate(support.load_event("prepare_training", "defaults"))
    return build_plan(settings, event, champion).model_dump()


def test_each_job_role_reaches_the_keys_its_job_uses_and_the_endpoint_nothing_but_models() -> None:
    from tests.fixtures.pipeline import support

    plan = _plan()
    train, evaluation = plan["training_job"], plan["evaluation_job"]
    assert train["RoleArn"].endswith("/d2ops-TrainingJobRole")
    assert evaluation["RoleArn"].endswith("/d2ops-EvaluationJobRole")
    dataset_uri = train["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
    snapshot_bucket, dataset_prefix = _s3(dataset_uri)
    artifacts = f"arn:aws:s3:::{support.ARTIFACTS_BUCKET}"
    model_bucket, model_key = _s3(f"{train['OutputDataConfig']['S3OutputPath']}{train['TrainingJobName']}/output/"
                                  "model.tar.gz")
    _, checkpoint_prefix = _s3(train["CheckpointConfig"]["S3Uri"])
    _, evaluation_prefix = _s3(evaluation["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"])
    champion_model = _s3(plan["champion"]["model_data"])[1]

    # training: lists and reads its run's snapshot (never the mutable data prefix), writes its output,
    # syncs its checkpoints
    assert (snapshot_bucket, dataset_prefix) == (artifacts, f"runs/{support.RUN_ID}/dataset/")
    data_bucket = f"arn:aws:s3:::{support.DATA_BUCKET}"
    assert allows("TrainingJobRole", "s3:ListBucket", snapshot_bucket, prefix=dataset_prefix)
    assert allows("TrainingJobRole", "s3:GetObject", f"{snapshot_bucket}/{dataset_prefix}annotations/train.json")
    # Evaluation judges the gate: it reads the snapshot only. (The training role also reads datasets/*
    # for d2ops.sdk experiments; a pipeline run's channels are the snapshot, test_pipeline_prepare.)
    assert not allows("EvaluationJobRole", "s3:GetObject", f"{data_bucket}/datasets/shapes/v1/annotations/val.json")
    assert not allows("EvaluationJobRole", "s3:ListBucket", data_bucket, prefix="datasets/shapes/v1/")
    weights_bucket, weights_key = _s3(next(c["DataSource"]["S3DataSource"]["S3Uri"] for c in train["InputDataConfig"]
                                           if c["ChannelName"] == "pretrained"))
    assert allows("TrainingJobRole", "s3:ListBucket", weights_bucket, prefix=weights_key)
    assert allows("TrainingJobRole", "s3:GetObject", f"{weights_bucket}/{weights_key}")
    assert not allows("TrainingJobRole", "s3:GetObject", f"{data_bucket}/pretrained/R-50.pkl")  # that key only
    assert not allows("TrainingJobRole", "s3:ListBucket", data_bucket, prefix="pretrained/")
    assert allows("TrainingJobRole", "s3:PutObject", f"{model_bucket}/{model_key}")
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        assert allows("TrainingJobRole", action, f"{artifacts}/{checkpoint_prefix}model_0000099.pth")
    assert allows("TrainingJobRole", "s3:ListBucket", artifacts, prefix=checkpoint_prefix)
    assert not allows("TrainingJobRole", "s3:PutObject", f"{artifacts}/champion.json")
    assert not allows("TrainingJobRole", "s3:PutObject", f"{artifacts}/{evaluation_prefix}evaluation.json")
    assert not allows("TrainingJobRole", "s3:PutObject", f"{snapshot_bucket}/{dataset_prefix}images/a.jpg")

    # evaluation: reads both models and the val split, writes its report, nothing else
    for key in (model_key, champion_model):
        assert allows("EvaluationJobRole", "s3:GetObject", f"{artifacts}/{key}")
        assert allows("EvaluationJobRole", "s3:ListBucket", artifacts, prefix=key)
    assert allows("EvaluationJobRole", "s3:GetObject", f"{snapshot_bucket}/{dataset_prefix}annotations/val.json")
    assert allows("EvaluationJobRole", "s3:PutObject", f"{artifacts}/{evaluation_prefix}evaluation.json")
    assert not allows("EvaluationJobRole", "s3:PutObject", f"{artifacts}/{model_key}")
    assert not allows("EvaluationJobRole", "s3:GetObject", f"{artifacts}/{checkpoint_prefix}model_final.pth")

    # the endpoint (untrusted images): reads model artifacts, writes nothing, reads no dataset
    assert allows("EndpointRole", "s3:GetObject", f"{artifacts}/{model_key}")
    for action, arn in [("s3:PutObject", f"{artifacts}/{model_key}"), ("s3:DeleteObject", f"{artifacts}/{model_key}"),
                        ("s3:PutObject", f"{artifacts}/{champion_model}"),
                        ("s3:GetObject", f"{snapshot_bucket}/{dataset_prefix}annotations/train.json"),
                        ("s3:GetObject", f"{artifacts}/{evaluation_prefix}evaluation.json"),
                        ("s3:GetObject", f"{artifacts}/{checkpoint_prefix}model_final.pth"),
                        ("s3:GetObject", f"{artifacts}/champion.json"), ("s3:ListBucket", data_bucket)]:
        assert not allows("EndpointRole", action, arn), f"EndpointRole may {action} {arn}"
    s3_actions = {a for st in _resolved_statements("EndpointRole") for a in as_list(st["Action"])
                  if a.startswith("s3:")}
    assert s3_actions == {"s3:GetObject", "s3:PutObject"}
    # ... and writes only data capture, where SageMaker puts it as this role (prepare_training's destination).
    # Mutations caught: the statement dropped (SageMaker could not write capture) or widened past capture/.
    capture = f"{artifacts}/{s3_layout.capture_hour_prefix('prefix-detector', 'AllTraffic', 2026, 1, 2, 3)}x.jsonl"
    assert allows("EndpointRole", "s3:PutObject", capture)
    assert not allows("EndpointRole", "s3:PutObject", f"{artifacts}/monitoring/prefix-detector/windows/x.json")


def test_each_role_pulls_only_its_own_image_repository() -> None:
    repo = "arn:aws:ecr:us-east-1:123456789012:repository/"
    for role, image in [("TrainingJobRole", "d2ops-training"), ("EvaluationJobRole", "d2ops-training"),
                        ("EndpointRole", "d2ops-serving")]:
        other = "d2ops-serving" if image == "d2ops-training" else "d2ops-training"
        assert allows(role, "ecr:BatchGetImage", repo + image) and allows(role, "ecr:GetDownloadUrlForLayer",
                                                                           repo + image)
        assert not allows(role, "ecr:BatchGetImage", repo + other), f"{role} may pull {other}"
        assert not allows(role, "ecr:BatchGetImage", repo + "someone-elses-image")


def test_the_state_machine_passes_exactly_the_three_job_roles() -> None:
    passes = [st for rid, st in identity_statements() if "iam:PassRole" in as_list(st.get("Action", []))]
    assert len(passes) == 1
    assert sorted(r["Fn::GetAtt"][0] if isinstance(r["Fn::GetAtt"], list) else r["Fn::GetAtt"].split(".")[0]
                  for r in as_list(passes[0]["Resource"])) == sorted(JOB_ROLES.values())
    # no shared SageMaker role left (the reviewer's role is for people, passed to no service)
    sagemaker_roles = {rid for rid in resources_of("AWS::IAM::Role") if rid not in PEOPLE_ROLES and any(
        st["Principal"].get("Service") == "sagemaker.amazonaws.com"
        for st in props(rid)["AssumeRolePolicyDocument"]["Statement"])}
    assert sorted(sagemaker_roles) == sorted(JOB_ROLES.values())


def test_the_monitor_schedule_role_may_invoke_the_monitor_only() -> None:
    # Mutation caught: the scheduler's role widened to every function, or trusting another account.
    role = props("MonitorScheduleRole")
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    statements = [st for policy in role["Policies"] for st in policy["PolicyDocument"]["Statement"]]
    assert statements == [{"Effect": "Allow", "Action": "lambda:InvokeFunction",
                           "Resource": {"Fn::GetAtt": ["MonitorEndpointFunction", "Arn"]}}]
    target = props("MonitorSchedule")["Target"]
    assert target["Arn"] == {"Fn::GetAtt": ["MonitorEndpointFunction", "Arn"]}
    assert target["RoleArn"] == {"Fn::GetAtt": ["MonitorScheduleRole", "Arn"]}


def test_jobs_and_the_endpoint_run_without_network_and_multi_host_traffic_is_encrypted() -> None:
    import json

    plan = _plan()
    train, evaluation = plan["training_job"], plan["evaluation_job"]
    assert train["EnableNetworkIsolation"] is True and train["EnableInterContainerTrafficEncryption"] is True
    assert evaluation["NetworkConfig"] == {"EnableNetworkIsolation": True,
                                           "EnableInterContainerTrafficEncryption": True}
    definition = json.loads((REPO_ROOT / "statemachine" / "training_pipeline.asl.json").read_text())
    create_model = all_states(definition)["Create model"]["Parameters"]
    assert create_model["EnableNetworkIsolation"] is True and create_model["ExecutionRoleArn"] == "${EndpointRoleArn}"
    substitution = props("PipelineStateMachine")["DefinitionSubstitutions"]["EndpointRoleArn"]
    assert substitution == {"Fn::GetAtt": ["EndpointRole", "Arn"]} or substitution == {"Fn::GetAtt": "EndpointRole.Arn"}


# ---------------------------------------------------------------- the Distributed Map (Check images)

STATES_ARN = "arn:aws:states:us-east-1:123456789012"
DATA, ARTIFACTS = "d2ops-data-example", "d2ops-artifacts-example"  # tests.fixtures.pipeline.support's names
# CloudFormation names the state machine <logical id>-<suffix>; its ARN is unknown to its own role.
MACHINE = "PipelineStateMachine-Ab12Cd34Ef56"


def test_the_state_machine_may_run_and_track_its_own_map_children_and_nothing_else() -> None:
    sm = "PipelineStateMachine"
    assert allows(sm, "states:StartExecution", f"{STATES_ARN}:stateMachine:{MACHINE}")
    assert not allows(sm, "states:StartExecution", f"{STATES_ARN}:stateMachine:SomeoneElses")
    assert not allows(sm, "states:StartExecution", f"arn:aws:states:eu-west-1:123456789012:stateMachine:{MACHINE}")
    for action in ("states:DescribeExecution", "states:StopExecution"):
        for kind in ("execution", "express"):  # Standard and Express children of the ImageChecks Map Run
            assert allows(sm, action, f"{STATES_ARN}:{kind}:{MACHINE}/ImageChecks:0b8e2f3c-1d2e:child-1")
    assert not allows(sm, "states:StopExecution", f"{STATES_ARN}:execution:SomeoneElses:run-1")
    assert not allows(sm, "states:StopExecution", f"{STATES_ARN}:execution:{MACHINE}:another-run")
    assert not allows(sm, "states:StopExecution", f"{STATES_ARN}:execution:SomeoneElses/ImageChecks:x:child-1")


def test_a_snapshot_outlives_the_longest_run() -> None:
    """SnapshotRetentionDays cannot expire a snapshot before the run that made it can reach its jobs."""
    import json

    definition = json.loads((REPO_ROOT / "statemachine" / "training_pipeline.asl.json").read_text())
    days = T.document["Parameters"]["SnapshotRetentionDays"]
    assert int(days["MinValue"]) * 86400 >= definition["TimeoutSeconds"]
    assert int(days["Default"]) >= int(days["MinValue"])


def test_the_state_machine_reads_the_map_items_and_writes_its_results_under_the_run_only() -> None:
    sm, artifacts, run = "PipelineStateMachine", f"arn:aws:s3:::{ARTIFACTS}", "shapes_v1_0123456789abcdef"
    assert allows(sm, "s3:GetObject", f"{artifacts}/runs/{run}/validation/image-items.jsonl")
    for action in ("s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"):
        assert allows(sm, action, f"{artifacts}/runs/{run}/validation/image-results/0b8e2f3c/SUCCEEDED_0.json")
    assert not allows(sm, "s3:GetObject", f"{artifacts}/runs/{run}/dataset/images/a.jpg")
    assert not allows(sm, "s3:PutObject", f"{artifacts}/runs/{run}/validation/report.json")
    assert not allows(sm, "s3:PutObject", f"{artifacts}/runs/{run}/inventory.jsonl")
    policies = props(sm)["Policies"]
    for fn in ("CheckImagesFunction", "SummarizeImagesFunction"):
        assert {"LambdaInvokePolicy": {"FunctionName": {"Ref": fn}}} in policies
    subs = props(sm)["DefinitionSubstitutions"]
    assert subs["CheckImagesFunctionArn"] == {"Fn::GetAtt": ["CheckImagesFunction", "Arn"]}
    assert subs["SummarizeImagesFunctionArn"] == {"Fn::GetAtt": ["SummarizeImagesFunction", "Arn"]}


def _grants(logical_id: str) -> set[tuple[str, str]]:
    return {(a, r) for st in _resolved_statements(logical_id) for a in as_list(st["Action"])
            for r in as_list(st["Resource"])}


def test_the_image_check_lambdas_have_exactly_what_their_steps_need() -> None:
    data, artifacts = f"arn:aws:s3:::{DATA}", f"arn:aws:s3:::{ARTIFACTS}"
    # A batch reads its images by VersionId and copies them (tagged) into the run's snapshot.
    assert _grants("CheckImagesFunction") == {
        ("s3:GetObject", f"{data}/datasets/*"), ("s3:GetObjectVersion", f"{data}/datasets/*"),
        ("s3:PutObject", f"{artifacts}/runs/*/dataset/*"), ("s3:PutObjectTagging", f"{artifacts}/runs/*/dataset/*"),
    }
    # The merge reads the items, the pending inventory and the ResultWriter's files, and the snapshot's train
    # annotations (a derived val split is keyed on the batches' SHA-256s); writes report and inventory.
    assert _grants("SummarizeImagesFunction") == {
        ("s3:GetObject", f"{artifacts}/runs/*/validation/*"), ("s3:GetObject", f"{artifacts}/runs/*/dataset/*"),
        ("s3:PutObject", f"{artifacts}/runs/*/validation/report.json"),
        ("s3:PutObject", f"{artifacts}/runs/*/inventory.jsonl"),
        ("s3:ListBucket", artifacts),  # a failed Map's manifest, found by listing its results prefix
    }
    assert allows("SummarizeImagesFunction", "s3:ListBucket", artifacts, prefix="runs/r1/validation/image-results/")
    assert not allows("SummarizeImagesFunction", "s3:ListBucket", artifacts, prefix="runs/r1/dataset/")
    check = FUNCTIONS["CheckImagesFunction"]
    assert check.code_uri == "functions/check_images/" and check.handler == "check_images.handler.handler"
    assert check.environment["ARTIFACTS_BUCKET"] == {"Ref": "ArtifactsBucket"}  # the snapshot's bucket
    summarize = FUNCTIONS["SummarizeImagesFunction"]
    assert summarize.handler == "validate_dataset.summarize_images.handler"
    assert summarize.environment["IMAGE_CHECK_CONCURRENCY"] == {"Ref": "ImageCheckConcurrency"}


def test_snapshot_objects_expire_by_their_tag_after_the_retention() -> None:
    from d2ops_core.validation.inventory import SNAPSHOT_TAGGING

    rules = {r["Id"]: r for r in props("ArtifactsBucket")["LifecycleConfiguration"]["Rules"]}
    rule = rules["expire-dataset-snapshots"]
    assert rule["Status"] == "Enabled"
    # The tag the copies carry (CopyObject's Tagging) is the one the rule filters on.
    assert [f"{f['Key']}={f['Value']}" for f in rule["TagFilters"]] == [SNAPSHOT_TAGGING]
    assert rule["ExpirationInDays"] == {"Ref": "SnapshotRetentionDays"}
    assert "Prefix" not in rule  # the tag alone: inventories and reports under runs/ stay
