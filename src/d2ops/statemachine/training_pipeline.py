"""The training pipeline's state machine: the source of ``statemachine/training_pipeline.asl.json``.

``python -m d2ops.statemachine`` (``make asl``) writes the file; ``--check`` (``make lint``, and
tests/unit/test_statemachine_build.py) fails while the committed file differs. State names are what
people see in the Step Functions console and ``d2ops status``: change one only on purpose.
``${...}`` strings are template.yaml's DefinitionSubstitutions, resolved at deploy time.
"""

from __future__ import annotations

from typing import Literal

from d2ops.functions import (
    CHECK_IMAGES,
    COMPOSE_NOTIFICATION,
    DESCRIBE_FAILURE,
    PREPARE_TRAINING,
    READ_REVIEW_DECISION,
    REQUEST_REVIEW,
    SMOKE_TEST_ENDPOINT,
    SUMMARIZE_EVALUATION,
    SUMMARIZE_IMAGES,
    VALIDATE_DATASET,
)
from d2ops.statemachine.asl import (
    ABSENT,
    ENTERED_TIME,
    EXECUTION_ARN,
    RUN_ID,
    Catch,
    Choice,
    DistributedMap,
    Fail,
    Json,
    Machine,
    Named,
    Pass,
    RetryPolicy,
    Succeed,
    Task,
    Var,
    Wait,
    all_of,
    catch_all,
    fmt,
    not_,
    resource,
    sub,
    when,
)
from d2ops.statemachine.patterns import (
    CLOUDWATCH,
    CLOUDWATCH_ALARM,
    DYNAMODB,
    LAMBDA,
    LAMBDA_WITH_FALLBACK,
    S3,
    SAGEMAKER_CLIENT,
    SAGEMAKER_OPTIMISED,
    SAGEMAKER_READ,
    SAGEMAKER_SERVICE,
    SAGEMAKER_WRITE,
    SFN,
    SNS,
    ExpectedCatch,
    FailureKind,
    Lookup,
    LoopReading,
    StageParallel,
    SyncJob,
    count,
    create_or_find,
    fail_states,
    function_name,
    lambda_task,
    payload_fields,
    record_failure,
    route_failures,
    start_counter,
    sync_job_create_or_find,
    sync_job_loops,
)

# --- how a run fails ----------------------------------------------------------------------------

DATASET_REJECTED = FailureKind("DatasetRejected", "Dataset rejected")
VALIDATION_FAILED = FailureKind("ValidationFailed", "Validation failed")
PREPARATION_FAILED = FailureKind("PreparationFailed", "Preparation failed")
TRAINING_FAILED = FailureKind("TrainingFailed", "Training failed")
EVALUATION_FAILED = FailureKind("EvaluationFailed", "Evaluation failed")
QUALITY_GATE_FAILED = FailureKind("QualityGateFailed", "Quality gate failed")
REGISTRATION_FAILED = FailureKind("RegistrationFailed", "Registration failed")
DEPLOYMENT_FAILED = FailureKind("DeploymentFailed", "Deployment failed")
PROMOTION_FAILED = FailureKind("PromotionFailed", "Promotion failed")
ENDPOINT_BUSY = FailureKind("EndpointBusy", "Endpoint busy")
LEASE_FAILED = FailureKind("EndpointLeaseFailed", "Endpoint lease failed")
PIPELINE_FAILED = FailureKind("PipelineFailed", "Run failed")  # a recorded error no route names

# The Fail states, in the order written; the route tests the lease failures first.
FAILURE_KINDS = (DATASET_REJECTED, VALIDATION_FAILED, PREPARATION_FAILED, TRAINING_FAILED, EVALUATION_FAILED,
                 QUALITY_GATE_FAILED, REGISTRATION_FAILED, DEPLOYMENT_FAILED, PROMOTION_FAILED, ENDPOINT_BUSY,
                 LEASE_FAILED, PIPELINE_FAILED)
ROUTED = (ENDPOINT_BUSY, LEASE_FAILED,
          *(k for k in FAILURE_KINDS if k not in (ENDPOINT_BUSY, LEASE_FAILED, PIPELINE_FAILED)))

# Where the failure states go.
REPORT_FAILURE = "Report failure"
DESCRIBE = "Describe failure"
NOTIFY_FAILURE = "Compose failure notification"

# --- names the definition shares ------------------------------------------------------------------

ENDPOINT = sub("EndpointName")
DATASET = ("$.dataset.name", "$.dataset.version")
LEASE_KEY: Json = {"endpoint_name": {"S": ENDPOINT}}
HOLDER: Json = {"#holder": "holder"}
DATASET_PAYLOAD: Json = {"bucket.$": "$.dataset.bucket", "prefix.$": "$.dataset.prefix", "run_id.$": RUN_ID}
RUN_TAGS = [{"Key": "d2ops:run-id", "Value.$": RUN_ID}]
ROLLBACK_ALARMS = ("EndpointErrorAlarmName", "EndpointLatencyAlarmName", "SmokeTestAlarmName")
VALIDATION_CATCH = (Catch("Record unreadable dataset", ("DatasetNotFound", "DatasetUnreadable")),
                    *catch_all("Record validation error"))


def _release_lease(name: str, holder: str, *, next: str, comment: str | None,
                   on_conflict: Catch | None = None, failed: Catch) -> Named:
    """Delete the lease only if ``holder`` still holds it."""
    return name, Task(resource("dynamodb:deleteItem"), next, comment=comment,
                      parameters={"TableName": sub("LeaseTableName"), "Key": LEASE_KEY,
                                  "ConditionExpression": "#holder = :holder", "ExpressionAttributeNames": HOLDER,
                                  "ExpressionAttributeValues": {":holder": {"S.$": holder}}},
                      result_path=None, retry=(DYNAMODB,),
                      catch=(on_conflict, failed) if on_conflict else (failed,))


def _put_object(name: str, key: str | tuple[str, str], body: str, *, next: str | None, catch: Catch,
                comment: str | None = None) -> Named:
    """An S3 PutObject of a JSON document into the artifacts bucket (``key``: literal, or ``(template, arg)``)."""
    key_field = {"Key": key} if isinstance(key, str) else {"Key.$": fmt(*key)}
    return name, Task(resource("aws-sdk:s3:putObject"), next, comment=comment,
                      parameters={"Bucket": sub("ArtifactsBucketName"), **key_field,
                                  "ContentType": "application/json", "Body.$": f"States.JsonToString({body})"},
                      result_path=None, retry=(S3,), catch=(catch,))


def _describe_endpoint(name: str, next: str, *, result_path: str, result_selector: Json | None = None,
                       retry: RetryPolicy, catch: tuple[Catch, ...], comment: str | None = None,
                       comment_after: Literal["Type", "Resource"] = "Type") -> Named:
    return name, Task(resource("aws-sdk:sagemaker:describeEndpoint"), next, comment=comment,
                      parameters={"EndpointName": ENDPOINT},
                      result_selector=ABSENT if result_selector is None else result_selector,
                      result_path=result_path, retry=(retry,), catch=catch, comment_after=comment_after)


def validation() -> list[Named]:
    return [
        lambda_task(
            "Validate dataset", VALIDATE_DATASET, DATASET_PAYLOAD, next="Dataset valid?", retry=LAMBDA,
            comment="Check the COCO dataset version; the full report goes to runs/<run_id>/validation/.",
            result_selector={"summary.$": "$.Payload"}, result_path="$.validation", timeout=960,
            catch=VALIDATION_CATCH),
        ("Dataset valid?", Choice(
            (when(all_of(Var("$.validation.summary.images_pending").is_present(),
                         Var("$.validation.summary.images_pending").is_true()), "Check images"),
             when(Var("$.validation.summary.valid").is_true(), "Dataset accepted")),
            "Record dataset rejection",
            comment="A version with more images than InlineImageLimit comes back images_pending (annotations valid "
                    "so far, no snapshot yet): its images are checked and snapshotted by the Distributed Map, then "
                    "this Choice sees the final summary.")),
        ("Check images", DistributedMap(
            "Summarize image checks",
            comment="Every image of the version checked by the one image rule and copied by VersionId into "
                    "runs/<run_id>/dataset/, 50 to a Lambda, ImageCheckConcurrency at a time. Any failed batch "
                    "fails the Map (no tolerated failures); per-image problems are issues in the batch's result, "
                    "merged by Summarize image checks.",
            label="ImageChecks",
            item_reader={"Resource": resource("s3:getObject"), "ReaderConfig": {"InputType": "JSONL"},
                         "Parameters": {"Bucket.$": "$.validation.summary.image_items_bucket",
                                        "Key.$": "$.validation.summary.image_items_key"}},
            item_batcher={"MaxItemsPerBatch": 50, "BatchInput": DATASET_PAYLOAD},
            max_concurrency_path="$.validation.summary.image_check_concurrency",
            processor=Machine((lambda_task(
                "Check image batch", CHECK_IMAGES, "$", next=None, retry=LAMBDA,
                comment="Decode, size-check, hash and snapshot one batch. A throttled or failed invoke is retried "
                        "here: a child that still fails fails the whole Map.",
                output_path="$.Payload", timeout=150),)),
            result_writer={"Resource": resource("s3:putObject"),
                           "Parameters": {"Bucket": sub("ArtifactsBucketName"),
                                          "Prefix.$": "$.validation.summary.image_results_prefix"}},
            result_path="$.image_check", catch=catch_all("Explain failed image checks"))),
        lambda_task(
            "Explain failed image checks", SUMMARIZE_IMAGES, {**DATASET_PAYLOAD, "map_error.$": "$.error"},
            next="Record validation error", retry=LAMBDA,
            comment="The Map failed, and its error (States.ExceedToleratedFailureThreshold) does not say why: read "
                    "the Map Run's failed results and fail with the first failed batch's own error "
                    "(DatasetUnreadable, or ImageChecksFailed naming it).",
            result_path=None, timeout=120, catch=VALIDATION_CATCH),
        lambda_task(
            "Summarize image checks", SUMMARIZE_IMAGES,
            {**DATASET_PAYLOAD, "result_writer.$": "$.image_check.ResultWriterDetails"},
            next="Dataset valid?", retry=LAMBDA,
            comment="Merge every batch's results (the ResultWriter's files) into the validation report and the "
                    "inventory, check train/val overlap by content, and return the final summary.",
            result_selector={"summary.$": "$.Payload"}, result_path="$.validation", timeout=960,
            catch=VALIDATION_CATCH),
        ("Dataset accepted", Succeed()),
        record_failure(
            "Record dataset rejection", DATASET_REJECTED,
            fmt("dataset {} {} failed validation with {} errors; report {}", *DATASET,
                "$.validation.summary.error_count", "$.validation.summary.report_uri"),
            next=None,
            comment="Invalid data is a normal validation result; the report lists every problem.",
            **{"report_uri.$": "$.validation.summary.report_uri",
               "first_errors.$": "$.validation.summary.first_errors"}),
        record_failure("Record unreadable dataset", DATASET_REJECTED,
                       _caught("dataset {} {} cannot be read ({})", *DATASET), next=None,
                       comment="No manifest.json, a missing bucket or denied access."),
        record_failure("Record validation error", VALIDATION_FAILED,
                       _caught("validating dataset {} {} failed ({})", *DATASET), next=None,
                       comment="The validator itself failed (timeout, crash), not the data."),
    ]


# Waiting for the lease reads as one line: its rounds and their total time (d2ops_core.pipeline_stages.LOOPS).
LEASE_LOOP = LoopReading("Wait for endpoint lease")


def endpoint_lease() -> list[Named]:
    wait = "$.lease_wait"
    lease_failed = Catch("Record lease failure")

    def wait_state(seconds: str) -> Json:
        return {"waits.$": f"{wait}.waits", "seconds.$": seconds, "max_seconds.$": f"{wait}.max_seconds",
                "max_waits.$": f"{wait}.max_waits"}

    return [
        ("Prepare endpoint lease wait", Pass(
            "Acquire endpoint lease",
            comment="One run per endpoint: the champion comparison (prepare reads champion.json), the deployment and "
                    "the promotion happen under the endpoint lease. A run that finds it held waits, doubling the "
                    "wait up to LeaseMaxWaitSeconds, at most LeaseMaxWaits times.",
            parameters={"waits": 0, **{f"{key}.$": f"States.StringToJson('{sub(parameter)}')" for key, parameter in
                                       (("seconds", "LeaseWaitSeconds"), ("max_seconds", "LeaseMaxWaitSeconds"),
                                        ("max_waits", "LeaseMaxWaits"))}},
            result_path=wait)),
        ("Acquire endpoint lease", Task(
            resource("dynamodb:updateItem"), "Prepare training job",
            comment="Conditional write: free, or already ours (a retry after a lost response). Holder = this "
                    "execution's ARN, which the release on every exit path (and ReleaseEndpointLeaseFunction for "
                    "stopped and timed-out runs) matches.",
            parameters={"TableName": sub("LeaseTableName"), "Key": LEASE_KEY,
                        "UpdateExpression": "SET #holder = :holder, run_id = :run_id, acquired_at = :acquired_at",
                        "ConditionExpression": "attribute_not_exists(#holder) OR #holder = :holder",
                        "ExpressionAttributeNames": HOLDER,
                        "ExpressionAttributeValues": {":holder": {"S.$": EXECUTION_ARN}, ":run_id": {"S.$": RUN_ID},
                                                      ":acquired_at": {"S.$": ENTERED_TIME}}},
            result_selector={"table": sub("LeaseTableName"), "endpoint_name": ENDPOINT}, result_path="$.lease",
            retry=(DYNAMODB,),
            catch=(ExpectedCatch("Read endpoint lease", ("DynamoDB.ConditionalCheckFailedException",), "$.lease_error",
                                 meaning="another run holds the endpoint lease"),
                   lease_failed))),
        ("Read endpoint lease", Task(
            resource("dynamodb:getItem"), "Endpoint lease still held?",
            parameters={"TableName": sub("LeaseTableName"), "Key": LEASE_KEY, "ConsistentRead": True,
                        "ProjectionExpression": "#holder", "ExpressionAttributeNames": HOLDER},
            result_path="$.lease_holder", retry=(DYNAMODB,), catch=(lease_failed,))),
        ("Endpoint lease still held?", Choice(
            (when(Var("$.lease_holder.Item.holder.S").is_present(), "Check lease holder"),),
            "Acquire endpoint lease")),
        ("Check lease holder", Task(
            resource("aws-sdk:sfn:describeExecution"), "Lease holder running?",
            comment="A holder that ended without releasing (its release lost) no longer blocks: a lease is only as "
                    "long as its holder runs.",
            parameters={"ExecutionArn.$": "$.lease_holder.Item.holder.S"},
            result_selector={"arn.$": "$.ExecutionArn", "status.$": "$.Status"},
            result_path="$.lease_holder_status", retry=(SFN,),
            catch=(ExpectedCatch("Clear stale endpoint lease", ("Sfn.ExecutionDoesNotExistException",), "$.lease_error",
                                 meaning="the lease holder is gone: its lease is cleared"),
                   lease_failed))),
        ("Lease holder running?", Choice(
            (when(Var("$.lease_holder_status.status").test("StringEquals", "RUNNING"), "Lease waits left?"),),
            "Clear stale endpoint lease")),
        _release_lease(
            "Clear stale endpoint lease", "$.lease_holder.Item.holder.S", next="Acquire endpoint lease",
            comment="Only if the ended holder still has it (another waiting run may have cleared it and taken it).",
            on_conflict=ExpectedCatch("Acquire endpoint lease", ("DynamoDB.ConditionalCheckFailedException",),
                                      "$.lease_error", meaning="the lease changed meanwhile: asked again"),
            failed=lease_failed),
        ("Lease waits left?", Choice(
            (when(Var(f"{wait}.waits").test("NumericGreaterThanEqualsPath", f"{wait}.max_waits"),
                  "Record endpoint busy"),),
            "Wait for endpoint lease")),
        ("Wait for endpoint lease", Wait("Count endpoint lease wait", seconds_path=f"{wait}.seconds")),
        ("Count endpoint lease wait", Pass(
            "Longest lease wait reached?",
            parameters={**wait_state(f"States.MathAdd({wait}.seconds, {wait}.seconds)"),
                        "waits.$": f"States.MathAdd({wait}.waits, 1)"},
            result_path=wait)),
        ("Longest lease wait reached?", Choice(
            (when(Var(f"{wait}.seconds").test("NumericGreaterThanPath", f"{wait}.max_seconds"),
                  "Keep longest lease wait"),),
            "Acquire endpoint lease")),
        ("Keep longest lease wait", Pass("Acquire endpoint lease", parameters=wait_state(f"{wait}.max_seconds"),
                                         result_path=wait)),
    ]


TRAINING = SyncJob(
    kind="training", api="TrainingJob", create_name="Train model",
    create_comment="SageMaker training job, spot-safe via checkpoints; waits for completion.",
    request_path="$.plan.training_job",
    result_selector={"job_name.$": "$.TrainingJobName", "job_arn.$": "$.TrainingJobArn",
                     "status.$": "$.TrainingJobStatus", "model_data.$": "$.ModelArtifacts.S3ModelArtifacts"},
    result_path="$.training",
    output_field="OutputDataConfig.S3OutputPath", check_every=1800, max_checks=490,
    ours_comment_tail=" in about 5,400 history events of the 25,000 a run may write.")

EVALUATION = SyncJob(
    kind="evaluation", api="ProcessingJob", create_name="Evaluate challenger and champion",
    create_comment="One processing job scores the new model and the current champion on the same val split.",
    request_path="$.plan.evaluation_job",
    result_selector={"job_name.$": "$.ProcessingJobName", "status.$": "$.ProcessingJobStatus"},
    result_path="$.evaluation_job",
    output_field="ProcessingOutputConfig.Outputs[0].S3Output.S3Uri", check_every=60, max_checks=130,
    ours_comment_tail=".")


def preparation() -> list[Named]:
    return [
        *endpoint_lease(),
        lambda_task(
            "Prepare training job", PREPARE_TRAINING,
            {"run_id.$": RUN_ID, "dataset.$": "$.dataset", "manifest.$": "$.validation.summary.manifest",
             "validation.$": "$.validation.summary"},
            next=None, retry=LAMBDA,
            comment="Build the training and evaluation job requests from stack defaults and manifest overrides.",
            result_selector=payload_fields(PREPARE_TRAINING.output_model()), result_path="$.plan", timeout=330,
            catch=catch_all("Record preparation failure")),
        record_failure("Record preparation failure", PREPARATION_FAILED,
                       _caught("preparing the training job failed ({})"), next=None,
                       comment="Bad stack configuration or manifest overrides."),
        record_failure(
            "Record endpoint busy", ENDPOINT_BUSY,
            fmt(f"endpoint {ENDPOINT} stayed leased to {{}} through {{}} waits for the lease",
                "$.lease_holder.Item.holder.S", "$.lease_wait.waits"),
            next=None,
            comment="Another run kept the endpoint through every wait; this run trained nothing and can be started "
                    "again."),
        record_failure("Record lease failure", LEASE_FAILED,
                       _caught(f"the lease on endpoint {ENDPOINT} could not be taken ({{}})"), next=None),
    ]


def training() -> list[Named]:
    return [
        *sync_job_create_or_find(TRAINING, next=None, failed="Record training failure", retry=SAGEMAKER_READ),
        record_failure("Record training failure", TRAINING_FAILED,
                       _caught("training job {} failed ({})", "$.plan.names.training_job"), next=None,
                       comment="The job's Cause (with its FailureReason) becomes one line in Describe failure."),
    ]


def evaluation() -> list[Named]:
    return [
        *sync_job_create_or_find(EVALUATION, next="Read evaluation report", failed="Record evaluation failure",
                                 retry=SAGEMAKER_READ),
        lambda_task(
            "Read evaluation report", SUMMARIZE_EVALUATION,
            {"report_uri.$": "$.plan.evaluation_report_uri", "gate.$": "$.plan.gate", "dataset.$": "$.dataset"},
            next=None, retry=LAMBDA,
            comment="Pick the primary metric BY NAME from evaluation.json for the quality gate.",
            result_selector=payload_fields(SUMMARIZE_EVALUATION.output_model()),
            result_path="$.evaluation", timeout=120, catch=catch_all("Record evaluation failure")),
        record_failure("Record evaluation failure", EVALUATION_FAILED,
                       _caught("evaluation job {} failed ({})", "$.plan.names.evaluation_job"), next=None,
                       comment="The processing job or its report failed."),
    ]


# People read the gate's failure records last (the console's states a run did not reach).
GATE_READING_ORDER = (("Record registration failure", ("Record review failure",)),)


def gate_and_register() -> list[Named]:
    refused_by = Var("$.evaluation.refused_by")
    approval_status = Var("$.gate.approval_status")

    def gate(name: str, decision: str, status: str, comment: str | None = None) -> Named:
        return name, Pass(
            "Register model version", comment=comment,
            parameters={"decision": decision, "approval_status": status,
                        "reason.$": "$.evaluation.gate_reason",
                        "description.$": fmt("{}{}", "$.evaluation.description_head",
                                             "$.evaluation.gate_description")},
            result_path="$.gate")

    return [
        ("Quality gate", Choice(
            (when(refused_by.test("StringEquals", "below_min_map"), "Below quality threshold"),
             when(refused_by.test("StringEquals", "regressed"), "Worse than champion"),
             when(refused_by.test("StringEquals", "class_regressed"), "Worse than champion on a class"),
             when(not_(Var("$.evaluation.decision").test("StringEquals", "approve")), "Needs review")),
            "Quality gate passed",
            comment="The summarize Lambda decided once (d2ops_core.gate_decision.judge): refuse (refused_by: the "
                    "challenger's AP below MinMap, the interval of challenger - champion wholly below "
                    "-MaxRegression, or a judged class's wholly below -MaxClassRegression), review (the numbers "
                    "cannot settle it: a person decides) or approve. Only decision 'approve' with no refusal "
                    "passes; any other decision goes to a person, never to an approval by default.")),
        gate("Quality gate passed", "approved", "Approved"),
        gate("Below quality threshold", "rejected", "Rejected"),
        gate("Worse than champion", "rejected", "Rejected"),
        gate("Worse than champion on a class", "rejected", "Rejected",
             comment="The reason names each class, both APs, the interval of the difference and its val instance "
                     "count (summarize_evaluation); the registry's description is its bounded, cleaned form."),
        gate("Needs review", "review", "PendingManualApproval",
             comment="The interval straddles -MaxRegression, a class dropped, too few held-out images were "
                     "compared, or the champion's training images are unknown (review_because): registered "
                     "PendingManualApproval, then a person decides."),
        ("Register model version", Task(
            resource("aws-sdk:sagemaker:createModelPackage"), "Model approved?",
            comment="Every evaluated model is registered, Approved, Rejected or PendingManualApproval (a person "
                    "decides), with its evaluation as model metrics.",
            parameters={
                "ModelPackageGroupName": sub("ModelPackageGroupName"),
                "ClientToken.$": f"States.Hash({RUN_ID}, 'MD5')",
                "ModelPackageDescription.$": "$.gate.description",
                "ModelApprovalStatus.$": "$.gate.approval_status",
                "InferenceSpecification": {
                    "Containers": [{"Image": sub("ServingImageUri"), "ModelDataUrl.$": "$.training.model_data"}],
                    "SupportedContentTypes": ["image/jpeg", "image/png", "application/json"],
                    "SupportedResponseMIMETypes": ["application/json"],
                    "SupportedRealtimeInferenceInstanceTypes": [sub("EndpointInstanceType")]},
                "ModelMetrics": {"ModelQuality": {"Statistics": {"ContentType": "application/json",
                                                                 "S3Uri.$": "$.evaluation.report_uri"}}},
                "CustomerMetadataProperties": {
                    "run_id.$": RUN_ID, "training_job.$": "$.training.job_name",
                    "primary_metric.$": "$.evaluation.primary_metric",
                    "primary_value.$": fmt("{}", "$.evaluation.challenger_value"),
                    "inventory_digest.$": "$.plan.inventory_digest",
                    "dataset_snapshot.$": "$.plan.dataset_snapshot_uri",
                    "score_thresholds.$": "$.evaluation.score_thresholds"}},
            result_selector={"model_package_arn.$": "$.ModelPackageArn"}, result_path="$.registration",
            retry=(SAGEMAKER_WRITE,), catch=catch_all("Record registration failure"))),
        ("Model approved?", Choice(
            (when(approval_status.test("StringEquals", "Approved"), "Ready to deploy"),
             when(approval_status.test("StringEquals", "PendingManualApproval"), "Prepare review wait")),
            "Record quality gate failure")),
        *review(),
        ("Ready to deploy", Succeed()),
        record_failure("Record quality gate failure", QUALITY_GATE_FAILED, "$.gate.reason", next=None,
                       comment="Registered as Rejected first, so the registry shows every challenger. The gate's "
                               "record says who decided: the numbers, or a person (decided_by).",
                       **{"evaluation.$": "$.evaluation", "model_package_arn.$": "$.registration.model_package_arn",
                          "gate.$": "$.gate"}),
        record_failure("Record registration failure", REGISTRATION_FAILED,
                       _caught("registering the model failed ({})"), next=None,
                       comment="The Model Registry refused the package."),
    ]


def review() -> list[Named]:
    """A person decides what the numbers could not: the run waits on a task token (the request Lambda writes
    it where the status API's POST /runs/{runId}/decision finds it), at most ReviewTimeoutSeconds, still
    holding the endpoint lease, so the champion cannot change under the pending decision."""
    return [
        ("Prepare review wait", Pass(
            "Wait for review",
            comment="ReviewTimeoutSeconds (default 7 days): a stack parameter reaches the definition as text, and "
                    "TimeoutSeconds must be a number, so the wait reads it from here (TimeoutSecondsPath).",
            parameters={"timeout_seconds.$": f"States.StringToJson('{sub('ReviewTimeoutSeconds')}')"},
            result_path="$.review_wait")),
        ("Wait for review", Task(
            resource("lambda:invoke.waitForTaskToken"), "Read review decision",
            comment="The request Lambda writes runs/<run>/review/request.json with this task's token and tells "
                    "people what to decide, why, until when and how. The decision (d2ops approve/reject, the "
                    "console, POST /runs/{runId}/decision) completes the task with SendTaskSuccess: its output, a "
                    "ReviewDecision, is $.review. A time-out (no HeartbeatSeconds: nobody is there to send one "
                    "while a person thinks) or a SendTaskFailure is caught into $.review too, and refuses.",
            parameters={"FunctionName": function_name(REQUEST_REVIEW), "Payload": {
                "task_token.$": "$$.Task.Token", "run_id.$": RUN_ID, "execution_arn.$": EXECUTION_ARN,
                "dataset.$": "$.dataset", "model_package_arn.$": "$.registration.model_package_arn",
                "gate_reason.$": "$.evaluation.gate_reason", "review_because.$": "$.evaluation.review_because",
                "images_compared.$": "$.evaluation.images_compared", "requested_at.$": ENTERED_TIME,
                "timeout_seconds.$": "$.review_wait.timeout_seconds"}},
            result_path="$.review", timeout_path="$.review_wait.timeout_seconds", retry=(LAMBDA,),
            # Nobody deciding in time is an outcome of the review, not a failure of the step: the model is refused.
            catch=(ExpectedCatch("Read review decision", ("States.Timeout", "States.HeartbeatTimeout"), "$.review",
                                 meaning="nobody decided in time: the model is refused"),
                   *catch_all("Read review decision", "$.review")))),
        lambda_task(
            "Read review decision", READ_REVIEW_DECISION,
            {"run_id.$": RUN_ID, "review.$": "$.review", "timeout_seconds.$": "$.review_wait.timeout_seconds",
             "gate_reason.$": "$.evaluation.gate_reason"},
            next="Record review in registry", retry=LAMBDA,
            comment="Approved only when a person approved; a rejection, a time-out, a SendTaskFailure or an answer "
                    "that is not a decision refuses. $.gate then says who decided and why.",
            result_selector=payload_fields(READ_REVIEW_DECISION.output_model()),
            result_path="$.gate", timeout=60, catch=catch_all("Record review failure")),
        ("Record review in registry", Task(
            resource("aws-sdk:sagemaker:updateModelPackage"), "Review approved?",
            comment="The registry entry leaves PendingManualApproval: Approved or Rejected, its ApprovalDescription "
                    "'<approved|rejected> by <ARN>: <reason>' (or why nobody decided), one line within SageMaker's "
                    "1,024 characters.",
            parameters={"ModelPackageArn.$": "$.registration.model_package_arn",
                        "ModelApprovalStatus.$": "$.gate.approval_status",
                        "ApprovalDescription.$": "$.gate.approval_description"},
            result_path=None, retry=(SAGEMAKER_WRITE,), catch=catch_all("Record review failure"))),
        ("Review approved?", Choice(
            (when(Var("$.gate.approval_status").test("StringEquals", "Approved"), "Ready to deploy"),),
            "Record quality gate failure")),
        record_failure("Record review failure", REGISTRATION_FAILED,
                       _caught("recording the review decision failed ({})"), next=None,
                       comment="The decision could not be read or the registry refused it: the model is not "
                               "deployed; $.gate says what was decided, when it was read.",
                       **{"model_package_arn.$": "$.registration.model_package_arn"}),
    ]


DEPLOYMENT_CAUSE = fmt(f"deploying model {{}} to endpoint {ENDPOINT} failed ({{}})", "$.plan.names.model",
                       "$.error.Error")


def _caught(template: str, *args: str) -> str:
    """A cause naming the caught error: ``template`` ends with ``({})``, filled with ``$.error.Error``."""
    return fmt(template, *args, "$.error.Error")


# Waiting for the endpoint, or for a rollback, reads as one line; the smoke test on the way is a line of its own.
DEPLOY_LOOPS = (LoopReading("Wait for endpoint", entry="Start waiting for endpoint", apart=("Smoke test endpoint",)),
                LoopReading("Wait for rollback", entry="Start waiting for rollback"))
# People read the deployment with its smoke test and failure record, then the rollback and its records, then the
# promotion (the console's states a run did not reach).
DEPLOY_READING_ORDER = (
    ("Canary baking?", ("Smoke test endpoint", "Deployment complete?", "Record deployment failure")),
    ("Endpoint history not written", ("Record champion", "Record endpoint history", "Promote to champion")),
)


def deploy() -> list[Named]:
    failed = "Record deployment failure"
    endpoint_config = "$.plan.names.endpoint_config"
    status = Var("$.endpoint.EndpointStatus")
    serves_new_config = (status.test("StringEquals", "InService"),
                         Var("$.endpoint.EndpointConfigName").test("StringEqualsPath", endpoint_config))
    canary_status = "$.endpoint.PendingDeploymentSummary.ProductionVariants[0].VariantStatus[0].Status"
    waits_left = Var("$.endpoint_wait.attempts").test("NumericLessThanPath", "$.plan.endpoint.max_wait_attempts")
    deployment = {"endpoint_arn.$": "$.EndpointArn", "started_at.$": ENTERED_TIME}
    return [
        *create_or_find(
            ("Create model", Task(
                resource("sagemaker:createModel"), "Create endpoint config",
                parameters={"ModelName.$": "$.plan.names.model", "ExecutionRoleArn": sub("EndpointRoleArn"),
                            "EnableNetworkIsolation": True,
                            # The serving image reads both: the image rule's pixel limit, and which server it starts
                            # (model_code.serving.backends.BACKEND_ENV, from the stack parameter ServingBackend).
                            "PrimaryContainer": {"ModelPackageName.$": "$.registration.model_package_arn",
                                                 "Environment": {"MAX_IMAGE_PIXELS": sub("MaxImagePixels"),
                                                                 "D2OPS_SERVING_BACKEND": sub("ServingBackend")}},
                            "Tags": RUN_TAGS},
                result_path=None, retry=(SAGEMAKER_OPTIMISED,),
                # A model name in use is a ValidationException, which SageMaker does not model for CreateModel
                # (only ResourceLimitExceeded): AmazonSageMakerException, told apart by its Cause.
                catch=(ExpectedCatch("Model already created?", ("SageMaker.AmazonSageMakerException",),
                                     meaning="the model exists already", recovered_by=("Find created model",)),
                       *catch_all(failed)))),
            thing="model", exists_cause="Cannot create already existing model*",
            lookup=Lookup("Find created model", "aws-sdk:sagemaker:describeModel",
                          {"ModelName.$": "$.plan.names.model"},
                          {"model_package.$": "$.PrimaryContainer.ModelPackageName"}, "$.created_model"),
            ours=Var("$.created_model.model_package").test("StringEqualsPath", "$.registration.model_package_arn"),
            next="Create endpoint config", failed=failed, retry=SAGEMAKER_READ),
        *create_or_find(
            ("Create endpoint config", Task(
                resource("aws-sdk:sagemaker:createEndpointConfig"), "Find current endpoint",
                comment="aws-sdk, not the optimised integration: the variants carry InferenceAmiVersion "
                        "(prepare_training adds it on GPU families whose default driver cannot run the serving "
                        "image), a field newer than the optimised integration's parameter list. prepare_training "
                        "builds the variants whole because Parameters cannot add a key conditionally; the data "
                        "capture config too (EnableCapture false when CaptureSamplingPercentage is 0).",
                parameters={"EndpointConfigName.$": endpoint_config,
                            "ProductionVariants.$": "$.plan.endpoint.production_variants",
                            "DataCaptureConfig.$": "$.plan.endpoint.data_capture_config", "Tags": RUN_TAGS},
                result_path=None, retry=(SAGEMAKER_WRITE,),
                catch=(ExpectedCatch("Endpoint config already created?", ("SageMaker.SageMakerException",),
                                     meaning="the endpoint config exists already",
                                     recovered_by=("Find created endpoint config",)),
                       *catch_all(failed)))),
            thing="endpoint config", exists_cause="Cannot create already existing endpoint configuration*",
            lookup=Lookup("Find created endpoint config", "aws-sdk:sagemaker:describeEndpointConfig",
                          {"EndpointConfigName.$": endpoint_config},
                          {"model.$": "$.ProductionVariants[0].ModelName"}, "$.created_endpoint_config"),
            ours=Var("$.created_endpoint_config.model").test("StringEqualsPath", "$.plan.names.model"),
            next="Find current endpoint", failed=failed, retry=SAGEMAKER_READ),
        _describe_endpoint(
            "Find current endpoint", "Update endpoint (blue/green)",
            comment="An existing endpoint is updated blue/green. SageMaker models no not-found error: a missing "
                    "endpoint is a ValidationException (SageMaker.SageMakerException, Cause 'Could not find "
                    "endpoint ...'), which 'Endpoint missing?' tells from throttling and AccessDenied.",
            result_selector={"endpoint_config.$": "$.EndpointConfigName", "status.$": "$.EndpointStatus"},
            result_path="$.previous_endpoint", retry=SAGEMAKER_CLIENT,
            catch=(ExpectedCatch("Endpoint missing?", ("SageMaker.SageMakerException",), "$.endpoint_lookup_error",
                                 meaning="no endpoint yet: it is created", recovered_by=("Create endpoint",)),
                   *catch_all(failed))),
        ("Endpoint missing?", Choice(
            (when(Var("$.endpoint_lookup_error.Cause").test("StringMatches", "Could not find endpoint *"),
                  "Create endpoint"),),
            "Endpoint lookup failed",
            comment="Only 'does not exist' creates the endpoint; throttling, AccessDenied and the rest fail the "
                    "deployment.")),
        ("Endpoint lookup failed", Pass(failed, input_path="$.endpoint_lookup_error", result_path="$.error")),
        ("Create endpoint", Task(
            resource("sagemaker:createEndpoint"), "Start waiting for endpoint", comment="First deployment.",
            parameters={"EndpointName": ENDPOINT, "EndpointConfigName.$": endpoint_config, "Tags": RUN_TAGS},
            result_selector={"mode": "create", **deployment}, result_path="$.deployment",
            retry=(SAGEMAKER_OPTIMISED,), catch=catch_all(failed))),
        ("Update endpoint (blue/green)", Task(
            resource("aws-sdk:sagemaker:updateEndpoint"), "Start waiting for endpoint",
            comment="Blue/green (docs/pipeline.md#canary-deployment); plan.endpoint.traffic_routing is decided by "
                    "prepare_training from the instance count: a 25 % CANARY with 2+ instances, ALL_AT_ONCE with "
                    "one (SageMaker refuses a canary over 50 % of the variant's instances). Either way the new "
                    "fleet takes its share for WaitIntervalInSeconds while the old fleet stays up and the smoke "
                    "test and the alarms judge it; any alarm in ALARM (the smoke test trips its own) makes "
                    "SageMaker roll back. The aws-sdk integration: the optimised one does not take "
                    "DeploymentConfig.",
            parameters={"EndpointName": ENDPOINT, "EndpointConfigName.$": endpoint_config, "DeploymentConfig": {
                "BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration.$": "$.plan.endpoint.traffic_routing",
                                          "TerminationWaitInSeconds": 120, "MaximumExecutionTimeoutInSeconds": 3600},
                "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": sub(a)} for a in ROLLBACK_ALARMS]}}},
            result_selector={"mode": "update", **deployment}, result_path="$.deployment",
            retry=(SAGEMAKER_WRITE,), catch=catch_all(failed))),
        start_counter("Start waiting for endpoint", "$.endpoint_wait", "Wait for endpoint", attempts=0),
        ("Wait for endpoint", Wait("Check endpoint status", seconds_path="$.plan.endpoint.poll_seconds")),
        _describe_endpoint(
            "Check endpoint status", "Count endpoint check",
            comment="The whole DescribeEndpoint answer (a few KB): PendingDeploymentSummary, present only during an "
                    "update, says when the canary bakes.",
            result_path="$.endpoint", retry=SAGEMAKER_READ, catch=catch_all("Undo deployment"),
            comment_after="Resource"),
        count("Count endpoint check", "$.endpoint_wait", "Endpoint in service?", counter="attempts"),
        ("Endpoint in service?", Choice(
            (when(all_of(*serves_new_config, Var("$.smoke_test").is_present()), "Record champion"),
             when(all_of(*serves_new_config), "Smoke test endpoint"),
             when(status.test("StringEquals", "InService"), "Endpoint rolled back by alarms"),
             when(all_of(status.test("StringEquals", "Updating"), Var(canary_status).is_present(),
                         Var("$.smoke_test").is_present(False)), "Canary baking?"),
             when(all_of(status.one_of("Creating", "Updating", "SystemUpdating", "RollingBack"), waits_left),
                  "Wait for endpoint")),
            "Endpoint not in service",
            comment="Bounded: at most plan.endpoint.max_wait_attempts checks, poll_seconds apart. The smoke test "
                    "runs once: during the canary's bake when the poll sees it, else once the new config serves "
                    "everyone.")),
        ("Canary baking?", Choice(
            (when(Var(canary_status).test("StringEquals", "Baking"), "Smoke test endpoint"),
             when(waits_left, "Wait for endpoint")),
            "Endpoint not in service",
            comment="SageMaker reports the new fleet's stage in PendingDeploymentSummary; Baking means the new "
                    "fleet takes its share of the traffic (the canary's, or all of it with ALL_AT_ONCE) while the "
                    "old fleet is still provisioned.")),
        ("Endpoint rolled back by alarms", Pass(
            "Find rollback alarms",
            comment="The blue/green update was rolled back by SageMaker: the old config serves again.",
            parameters={"Error": "EndpointRolledBack",
                        "Cause.$": fmt(f"endpoint {ENDPOINT} is in service with {{}} instead of {{}}: an alarm "
                                       "rolled the update back", "$.endpoint.EndpointConfigName", endpoint_config)},
            result_path="$.error")),
        ("Find rollback alarms", Task(
            resource("aws-sdk:cloudwatch:describeAlarms"), "Record alarm rollback",
            comment="Which of the update's AutoRollbackConfiguration alarms fired: those still in ALARM, with "
                    "CloudWatch's StateReason (DescribeEndpoint does not name them). Filtered again here: the state "
                    "is what matters, whatever the StateValue filter did.",
            parameters={"AlarmNames": [sub(a) for a in ROLLBACK_ALARMS], "StateValue": "ALARM"},
            result_selector={"alarms.$": "$.MetricAlarms[?(@.StateValue == 'ALARM')].AlarmName",
                             "reasons.$": "$.MetricAlarms[?(@.StateValue == 'ALARM')].StateReason"},
            result_path="$.rollback_alarms", retry=(CLOUDWATCH,),
            catch=catch_all("Rollback alarms unreadable", "$.rollback_alarms_error"))),
        ("Rollback alarms unreadable", Pass(
            "Record alarm rollback",
            comment="The rollback is still recorded, saying why its alarms are not named.",
            parameters={"alarms": [], "reasons.$": "States.Array(" + fmt(
                "the rollback alarms could not be read ({})", "$.rollback_alarms_error.Error") + ")"},
            result_path="$.rollback_alarms")),
        record_failure(
            "Record alarm rollback", DEPLOYMENT_FAILED, DEPLOYMENT_CAUSE, next="Record rollback in endpoint history",
            comment="SageMaker's deployment guardrails undid the update: the same record as 'Record rolled-back "
                    "deployment' (d2ops_core.champion.EndpointRollback), by an alarm. FailureReason is read with "
                    "'..' because DescribeEndpoint may leave it out.",
            **{"endpoint_name": ENDPOINT, "model_package_arn.$": "$.registration.model_package_arn",
               "rolled_back_at.$": ENTERED_TIME, "rolled_back_by": "alarm", "alarms.$": "$.rollback_alarms.alarms",
               "kept_serving.$": "$.endpoint.EndpointConfigName",
               "rollback": {"action": "SageMaker rolled the update back: the previous endpoint config kept serving",
                            "alarm_reasons.$": "$.rollback_alarms.reasons",
                            "failure_reason.$": "$.endpoint..FailureReason"}}),
        ("Endpoint not in service", Pass(
            "Undo deployment",
            parameters={"Error": "EndpointNotInService",
                        "Cause.$": fmt(f"endpoint {ENDPOINT} is {{}} after {{}} checks", "$.endpoint.EndpointStatus",
                                       "$.endpoint_wait.attempts")},
            result_path="$.error")),
        lambda_task(
            "Smoke test endpoint", SMOKE_TEST_ENDPOINT,
            {"endpoint_name": ENDPOINT, "bucket.$": "$.dataset.bucket", "prefix.$": "$.dataset.prefix",
             "requests": 24},
            next="Deployment complete?", retry=LAMBDA,
            comment="InvokeEndpoint with a validation image, `requests` times: during a CANARY's bake the requests "
                    "split between the fleets (25 % canary share: 0.75^24 = 0.1 % chance none reaches the canary; "
                    "with ALL_AT_ONCE all reach the new fleet), and every answer must be well-formed detections.",
            result_selector=payload_fields(SMOKE_TEST_ENDPOINT.output_model(),
                                           exclude=("endpoint_name",)),
            result_path="$.smoke_test", timeout=120, catch=catch_all("Undo deployment")),
        ("Deployment complete?", Choice(
            (when(all_of(*serves_new_config), "Record champion"),), "Wait for endpoint",
            comment="A smoke test during the bake leaves SageMaker to shift the rest of the traffic: keep polling "
                    "until the new config serves everyone.")),
    ]


def roll_back() -> list[Named]:
    failed = "Rollback not verified"
    rollback_status = Var("$.rollback_endpoint.status")
    update = Var("$.deployment.mode").test("StringEquals", "update")
    return [
        ("Undo deployment", Choice(
            (when(all_of(update, Var("$.endpoint.EndpointStatus").is_present(),
                         not_(Var("$.endpoint.EndpointStatus").test("StringEquals", "InService")),
                         not_(Var("$.endpoint.EndpointStatus").test("StringEquals", "Failed"))),
                  "Report smoke test failure"),
             when(update, "Roll back endpoint")),
            "Delete new endpoint",
            comment="A new endpoint is deleted. An update still in progress (the canary baking) is rolled back by "
                    "SageMaker once the smoke test alarm fires (UpdateEndpoint is refused while Updating); an update "
                    "already in service is updated back to the previous config. Either way the pipeline waits until "
                    "the old config serves again.")),
        ("Roll back endpoint", Task(
            resource("sagemaker:updateEndpoint"), "Start waiting for rollback",
            parameters={"EndpointName": ENDPOINT, "EndpointConfigName.$": "$.previous_endpoint.endpoint_config"},
            result_selector={"action": "rolled back to the previous endpoint config",
                             "endpoint_arn.$": "$.EndpointArn"},
            result_path="$.rollback", retry=(SAGEMAKER_OPTIMISED,), catch=catch_all(failed))),
        ("Report smoke test failure", Task(
            resource("aws-sdk:cloudwatch:putMetricData"), "Trip smoke test alarm",
            comment="A datapoint keeps the smoke test alarm in ALARM for its evaluation period (SetAlarmState alone "
                    "lasts until the next evaluation).",
            parameters={"Namespace": sub("SmokeTestMetricNamespace"), "MetricData": [
                {"MetricName": sub("SmokeTestMetricName"), "Dimensions": [{"Name": "EndpointName", "Value": ENDPOINT}],
                 "Value": 1, "Unit": "Count"}]},
            result_path=None, retry=(CLOUDWATCH,), catch=catch_all("Trip smoke test alarm", None))),
        ("Trip smoke test alarm", Task(
            resource("aws-sdk:cloudwatch:setAlarmState"), "Start waiting for rollback",
            comment="The alarm is in the update's AutoRollbackConfiguration: ALARM now makes SageMaker send all "
                    "traffic back to the old fleet.",
            parameters={"AlarmName": sub("SmokeTestAlarmName"), "StateValue": "ALARM",
                        "StateReason.$": fmt("d2ops run {} failed the smoke test of endpoint config {}", RUN_ID,
                                             "$.plan.names.endpoint_config")},
            result_selector={"action": "tripped the smoke test alarm: SageMaker rolls the update back to the "
                                       "previous endpoint config"},
            result_path="$.rollback", retry=(CLOUDWATCH_ALARM,), catch=catch_all(failed))),
        start_counter("Start waiting for rollback", "$.rollback_wait", "Wait for rollback", attempts=0),
        ("Wait for rollback", Wait("Check rollback", seconds_path="$.plan.endpoint.poll_seconds")),
        _describe_endpoint(
            "Check rollback", "Count rollback check",
            result_selector={"status.$": "$.EndpointStatus", "endpoint_config.$": "$.EndpointConfigName"},
            result_path="$.rollback_endpoint", retry=SAGEMAKER_SERVICE, catch=catch_all(failed)),
        count("Count rollback check", "$.rollback_wait", "Rolled back?", counter="attempts"),
        ("Rolled back?", Choice(
            (when(all_of(rollback_status.test("StringEquals", "InService"),
                         Var("$.rollback_endpoint.endpoint_config").test("StringEqualsPath",
                                                                         "$.previous_endpoint.endpoint_config")),
                  "Record rolled-back deployment"),
             when(all_of(rollback_status.one_of("Updating", "RollingBack", "SystemUpdating", "InService"),
                         Var("$.rollback_wait.attempts").test("NumericLessThanPath",
                                                              "$.plan.endpoint.max_wait_attempts")),
                  "Wait for rollback")),
            failed,
            comment="Verified: the endpoint serves the config it served before this run. Bounded by "
                    "plan.endpoint.max_wait_attempts checks, like the deployment.")),
        (failed, Pass(
            "Record deployment failure",
            comment="The run still fails with DeploymentFailed; the error says the old config was not seen serving "
                    "again.",
            parameters={"Error": "RollbackNotVerified",
                        "Cause.$": fmt(f"endpoint {ENDPOINT} was not seen in service with its previous config {{}} "
                                       "again", "$.previous_endpoint.endpoint_config")},
            result_path="$.error")),
        ("Delete new endpoint", Task(
            resource("aws-sdk:sagemaker:deleteEndpoint"), "Record rolled-back deployment",
            parameters={"EndpointName": ENDPOINT}, result_selector={"action": "deleted the new endpoint"},
            result_path="$.rollback", retry=(SAGEMAKER_READ,),
            catch=catch_all("Record rolled-back deployment", "$.rollback"))),
    ]


def _compose_notification(outcome: str, *, next: str, fallback: str) -> Named:
    return lambda_task(
        f"Compose {'success' if outcome == 'succeeded' else 'failure'} notification", COMPOSE_NOTIFICATION,
        {"outcome": outcome, "run_id.$": RUN_ID, "at.$": ENTERED_TIME, "document.$": "$"}, next=next,
        retry=LAMBDA_WITH_FALLBACK,
        comment="The subject and the run's cost (training, evaluation, endpoint time so far, spot savings; "
                "d2ops_core.cost, as GET /runs/{id} prices it), merged into the message. An unknown cost is said in "
                "the message; if this step fails the notification goes out without it.",
        result_selector=payload_fields(COMPOSE_NOTIFICATION.output_model()),
        result_path="$.notification", timeout=60, catch=catch_all(fallback, "$.notification_error"))


def _without_cost(name: str, subject: Json, next: str) -> Named:
    error = "$.notification_error.Error"
    return name, Pass(next, parameters={**subject, "fields": {
        "cost": None, "cost_summary.$": fmt("cost unknown: composing the notification failed ({})", error),
        "cost_unknown.$": fmt("composing the notification failed ({})", error)}}, result_path="$.notification")


def _notify(name: str, document: str, next: str, *, on_error: str) -> Named:
    return name, Task(
        resource("sns:publish"), next,
        parameters={"TopicArn": sub("NotificationTopicArn"), "Subject.$": "$.notification.subject",
                    "Message.$": f"States.JsonToString(States.JsonMerge({document}, $.notification.fields, false))"},
        result_path=None, retry=(SNS,), catch=catch_all(on_error, "$.notify_error"))


def promotion() -> list[Named]:
    promotion_failed = Catch("Record promotion failure")
    return [
        ("Record champion", Pass(
            "Record endpoint history", comment="The champion.json record (d2ops_core.champion.ChampionRecord).",
            parameters={"run_id.$": RUN_ID, "dataset.$": "$.dataset",
                        "model_package_arn.$": "$.registration.model_package_arn",
                        "model_name.$": "$.plan.names.model", "model_data.$": "$.training.model_data",
                        "endpoint_name": ENDPOINT, "endpoint_config_name.$": "$.plan.names.endpoint_config",
                        "primary_metric.$": "$.evaluation.primary_metric",
                        "primary_value.$": "$.evaluation.challenger_value",
                        "evaluation_uri.$": "$.evaluation.report_uri", "gate.$": "$.gate",
                        "promoted_at.$": ENTERED_TIME},
            result_path="$.champion")),
        _put_object("Record endpoint history", (f"endpoint-history/{ENDPOINT}/promoted-{{}}.json", RUN_ID),
                    "$.champion", next="Promote to champion", catch=promotion_failed,
                    comment="Append-only: one object per promotion (d2ops_core.champion.EndpointHistoryEntry), "
                            "written before champion.json."),
        _put_object("Promote to champion", "champion.json", "$.champion", next=None, catch=promotion_failed),
    ]


def deployment_records() -> list[Named]:
    """How a deployment (or its promotion) fails: the record, and for a rollback its entry in the endpoint's
    history."""
    return [
        record_failure("Record deployment failure", DEPLOYMENT_FAILED, DEPLOYMENT_CAUSE, next=None,
                       comment="The endpoint was not changed by us (or SageMaker already rolled it back)."),
        record_failure("Record rolled-back deployment", DEPLOYMENT_FAILED, DEPLOYMENT_CAUSE,
                       next="Record rollback in endpoint history",
                       comment="The new endpoint config was undone; see rollback.",
                       **{"rollback.$": "$.rollback", "endpoint_name": ENDPOINT,
                          "model_package_arn.$": "$.registration.model_package_arn", "rolled_back_at.$": ENTERED_TIME,
                          "rolled_back_by": "pipeline"}),
        _put_object("Record rollback in endpoint history",
                    (f"endpoint-history/{ENDPOINT}/rolled-back-{{}}.json", RUN_ID), "$.failure", next=None,
                    catch=Catch("Endpoint history not written", result_path="$.history_error"),
                    comment="Append-only: the attempt that was rolled back (d2ops_core.champion.EndpointRollback); "
                            "the run still fails."),
        ("Endpoint history not written", Succeed()),
        record_failure("Record promotion failure", PROMOTION_FAILED, _caught("recording the champion failed ({})"),
                       next=None, comment="The endpoint serves the new model but champion.json was not written."),
    ]


def notification() -> list[Named]:
    return [
        _release_lease(
            "Release endpoint lease", EXECUTION_ARN, next="Compose success notification",
            comment="The champion record and the endpoint agree: the next run may compare and deploy. Only if this "
                    "execution still holds it.",
            failed=Catch("Compose success notification", result_path="$.lease_error")),
        _compose_notification("succeeded", next="Notify success", fallback="Success notification without cost"),
        _without_cost("Success notification without cost", {"subject": "d2ops: new model deployed (cost unknown)"},
                      "Notify success"),
        _notify("Notify success", "$.champion", "Run succeeded", on_error="Notification failed"),
        ("Run succeeded", Succeed()),
        ("Notification failed", Fail("NotificationFailed", "$.notify_error.Cause")),
    ]


def failure_report() -> list[Named]:
    explained = Var("$.failure.error")
    return [
        ("Failure explained?", Choice(
            (when(explained.one_of(QUALITY_GATE_FAILED.error, ENDPOINT_BUSY.error), NOTIFY_FAILURE),
             when(all_of(explained.test("StringEquals", DATASET_REJECTED.error),
                         Var("$.failure.report_uri").is_present()), NOTIFY_FAILURE)),
            DESCRIBE,
            comment="A rejected dataset (its report), a refused model (the gate's reason) and a busy endpoint are "
                    "explained by their record; every other failure carries a caught error Describe failure reads.")),
        lambda_task(
            DESCRIBE, DESCRIBE_FAILURE, "$", next=NOTIFY_FAILURE, retry=LAMBDA_WITH_FALLBACK,
            comment="People get one line: the summary above plus the failing step's own message or FailureReason, "
                    "never a stack trace (that stays in the logs). If this fails, the summary alone is sent.",
            output_path="$.Payload", timeout=60, catch=catch_all(NOTIFY_FAILURE, "$.describe_error")),
        _compose_notification("failed", next="Notify failure", fallback="Failure notification without cost"),
        _without_cost("Failure notification without cost",
                      {"subject.$": fmt("d2ops run failed: {}", "$.failure.error")}, "Notify failure"),
        _notify("Notify failure", "$.failure", "Holding endpoint lease?", on_error="Holding endpoint lease?"),
        ("Holding endpoint lease?", Choice(
            (when(Var("$.lease").is_present(), "Release endpoint lease after failure"),), "Route failure")),
        _release_lease(
            "Release endpoint lease after failure", EXECUTION_ARN, next="Route failure",
            comment="Every failure after the lease was taken passes here; a run stopped or timed out is released "
                    "by ReleaseEndpointLeaseFunction.",
            failed=Catch("Route failure", result_path="$.lease_error")),
        route_failures("Route failure", ROUTED, default=PIPELINE_FAILED),
        *fail_states(FAILURE_KINDS),
    ]


def _stage(key: str, name: str, states: list[Named], *, next: str | None, comment: str,
           loops: tuple[LoopReading, ...] = (), reading_order: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Named:
    return name, StageParallel(Machine(tuple(states)), next, comment, key=key, loops=loops,
                               reading_order=reading_order)


def _unless_failed(name: str, next: str) -> Named:
    """After a stage: on to ``next``, or to Report failure when the stage recorded ``$.failure``."""
    return name, Choice((when(Var("$.failure").is_present(), REPORT_FAILURE),), next)


def definition() -> Machine:
    # The top level is the stages a user thinks in (d2ops_core.pipeline_stages.STAGES names the same ones); each
    # stage's branch holds its recovery, retry and wait machinery and ends with $.failure recorded when it failed.
    return Machine(
        (_stage("validate", "Validate", validation(), next="Validated?",
                comment="Validate the COCO dataset version: annotations, then every image."),
         _unless_failed("Validated?", "Prepare"),
         _stage("prepare", "Prepare", preparation(), next="Prepared?", loops=(LEASE_LOOP,),
                comment="Take the endpoint lease and build the training and evaluation job requests."),
         _unless_failed("Prepared?", "Train"),
         _stage("train", "Train", training(), next="Trained?", comment="Train the model on SageMaker.",
                loops=sync_job_loops(TRAINING)),
         _unless_failed("Trained?", "Evaluate"),
         _stage("evaluate", "Evaluate", evaluation(), next="Evaluated?", loops=sync_job_loops(EVALUATION),
                comment="Score the new model and the champion on the same val split."),
         _unless_failed("Evaluated?", "Gate"),
         _stage("gate", "Gate", gate_and_register(), next="Approved?", reading_order=GATE_READING_ORDER,
                comment="Decide on the evaluation and register the model, Approved or Rejected; when the numbers "
                        "cannot settle it, a person decides (Wait for review)."),
         _unless_failed("Approved?", "Deploy"),
         _stage("deploy", "Deploy", [*deploy(), *roll_back(), *promotion(), *deployment_records()], next="Deployed?",
                loops=DEPLOY_LOOPS, reading_order=DEPLOY_READING_ORDER,
                comment="Deploy blue/green, smoke-test, roll back if unhealthy, promote to champion."),
         _unless_failed("Deployed?", "Notify"),
         _stage("notify", "Notify", notification(), next=None,
                comment="Release the endpoint lease and tell people the new model is deployed."),
         _stage("failure", REPORT_FAILURE, failure_report(), next=None,
                comment="Describe the failure, notify, release the lease, and fail with the error that says what "
                        "happened.")),
        comment="d2ops: validate a COCO dataset version, train, evaluate against the champion, gate, register, "
                "deploy blue/green, smoke-test, promote, notify. Every failure notifies and ends in a Fail state "
                "named after what happened.",
        timeout=2100000)
