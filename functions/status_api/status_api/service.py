"""What the status API answers, from Step Functions, SageMaker and S3 (clients passed in)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel

from d2ops_core import cost, platform, run_ids, run_start, s3_layout, s3_probe, sagemaker_jobs
from d2ops_core.champion import read_champion
from d2ops_core.documents.run_state import RunState
from d2ops_core.documents.training_curve import LossPoint, TrainingCurve, TrainingProgress
from d2ops_core.failures import reason
from d2ops_core.stage_timeline import steps_from_history
from d2ops_core.training_progress import progress_from_series
from status_api.curve_store import CurveStore, settled
from status_api.models import (
    EndpointInfo,
    ModelsResponse,
    ModelVersion,
    RunDetail,
    RunList,
    RunSummary,
    StartRunResponse,
    StateStep,
    TrainingInfo,
)

MAX_HISTORY_PAGES = 10  # 10 000 events: far more than one run writes
MAX_LIST_PAGES = 10  # pages scanned per GET /runs when filtering by dataset
MAX_METRIC_PAGES = 5  # GetMetricData pages (100,800 points each) per run detail: a 28-day job needs one
# The training job's published metrics the run detail reads, with the statistic of each period: the
# iteration a period reached, the mean of the values it logged.
PROGRESS_METRICS: tuple[tuple[str, str], ...] = (
    ("train:iteration", "Maximum"), ("train:total_iterations", "Maximum"), ("train:loss", "Average"),
    ("train:lr", "Average"), ("train:iter_seconds", "Average"), ("train:images_per_second", "Average"))
RETRY_AFTER_SECONDS = 5
# Error codes AWS services use for "slow down" (S3 answers SlowDown with HTTP 503).
THROTTLING_CODES = frozenset({"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
                              "RequestThrottledException", "TooManyRequestsException", "SlowDown",
                              "RequestLimitExceeded", "ProvisionedThroughputExceededException",
                              "ServiceUnavailable", "ServiceUnavailableException"})

logger = Logger(child=True)  # the handler's logger, with its service name and context


def is_throttling(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return error.get("Code") in THROTTLING_CODES or status in (429, 503)


class NotFound(Exception):
    """What the request names does not exist: the handler answers 404 (one exception handler)."""


class BadRequest(Exception):
    """The request is well-formed but cannot be served as asked: the handler answers 400."""


class RunNotFound(NotFound):
    pass


class DatasetNotFound(NotFound):
    pass


class BadDatasetUri(BadRequest):
    pass


class BadPageToken(BadRequest):
    """A nextToken the listing did not hand out (or one that expired)."""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def summarize_execution(item: dict[str, Any]) -> RunSummary:
    parts = run_ids.split_run_id(item["name"])
    return RunSummary(run_id=item["name"], dataset_name=parts[0] if parts else None,
                      dataset_version=parts[1] if parts else None, status=item["status"],
                      started_at=item["startDate"].isoformat(), stopped_at=_iso(item.get("stopDate")))


def list_runs(sfn: Any, state_machine_arn: str, *, dataset: str | None, status: str | None,
              next_token: str | None, limit: int) -> RunList:
    """One page of runs, newest first; with ``dataset``, pages are scanned until one matches."""
    wanted = run_ids.dataset_slug(dataset) if dataset else None
    found: list[RunSummary] = []
    token = next_token
    for _ in range(MAX_LIST_PAGES):
        kwargs: dict[str, Any] = {"stateMachineArn": state_machine_arn, "maxResults": limit}
        if status:
            kwargs["statusFilter"] = status
        if token:
            kwargs["nextToken"] = token
        try:
            page = sfn.list_executions(**kwargs)
        except sfn.exceptions.InvalidToken as exc:
            raise BadPageToken(f"nextToken is not a page token of this run listing: {exc}") from exc
        except ClientError as exc:
            # A token Step Functions cannot even parse is refused as a validation error.
            if token and exc.response.get("Error", {}).get("Code") == "ValidationException":
                raise BadPageToken(f"nextToken is not a page token of this run listing: {exc}") from exc
            raise
        token = page.get("nextToken")
        found.extend(s for s in map(summarize_execution, page["executions"])
                     if wanted is None or s.dataset_name == wanted)
        if found or not token or wanted is None:
            break
    return RunList(runs=found, next_token=token)


def execution_history(sfn: Any, arn: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"executionArn": arn, "maxResults": 1000, "includeExecutionData": True}
    for _ in range(MAX_HISTORY_PAGES):
        page = sfn.get_execution_history(**kwargs)
        events.extend(page["events"])
        if not page.get("nextToken"):
            break
        kwargs["nextToken"] = page["nextToken"]
    return events


def timeline(events: list[dict[str, Any]], execution_status: str) -> tuple[list[StateStep], str | None]:
    """Per-state steps (entered, exited, duration, error) and the state a running run is in
    (d2ops_core.stage_timeline.steps_from_history: `d2ops graph` reads the history the same way)."""
    steps = [StateStep.model_validate(vars(step)) for step in steps_from_history(events, execution_status)]
    if execution_status != "RUNNING":
        return steps, None
    current = [s for s in steps if s.status == "running"]
    return steps, current[-1].name if current else None


def latest_document(events: list[dict[str, Any]], execution: dict[str, Any]) -> dict[str, Any]:
    """The run's state document as far as it got (each state's output carries all earlier results)."""
    text = execution.get("output")
    if not text:
        for event in reversed(events):
            details = event.get("stateExitedEventDetails")
            if details and details.get("output"):
                text = details["output"]
                break
    if not text:
        text = execution.get("input") or "{}"
    try:
        document = json.loads(text)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def _describe_job(sagemaker: Any, document: RunState | dict[str, Any],
                  kind: sagemaker_jobs.JobKind) -> dict[str, Any] | None:
    """DescribeTrainingJob / DescribeProcessingJob of the run's job, None when it does not exist (yet).

    Throttling and other errors propagate (the handler answers 503 for throttling): a job that could
    not be described is not a job that does not exist, and the run's cost would silently drop it.
    """
    plan = RunState.read(document).plan
    if plan is None:
        return None
    return sagemaker_jobs.describe_job(sagemaker, kind, plan.names.training_job if kind == "training"
                                       else plan.names.evaluation_job)


def training_info(sagemaker: Any, document: RunState, job: dict[str, Any] | None = None,
                  cloudwatch: Any = None, store: CurveStore | None = None) -> TrainingInfo | None:
    if document.plan is None:
        return None
    info = TrainingInfo(job_name=document.plan.names.training_job,
                        model_data=document.training.model_data if document.training else None)
    job = job if job is not None else _describe_job(sagemaker, document, "training")
    if job is None:
        return info  # the plan's name is still useful
    info.status = job.get("TrainingJobStatus")
    info.secondary_status = job.get("SecondaryStatus")
    info.failure_reason = job.get("FailureReason")
    info.metrics = {m["MetricName"]: float(m["Value"]) for m in job.get("FinalMetricDataList", [])}
    if cloudwatch is not None:
        info.progress = job_progress(cloudwatch, job, store)
    return info


def _metric_series(cloudwatch: Any, job_name: str, start: datetime, end: datetime,
                   period: int) -> dict[str, list[tuple[float, float]]]:
    """GetMetricData of PROGRESS_METRICS: metric name -> (epoch seconds, value), oldest first.

    One call asks under each dimension set the values may carry (d2ops_core.platform); the first set
    holding an iteration is the job's."""
    sets = platform.training_metrics_dimensions(job_name)
    queries, names = [], {}
    for d, dimensions in enumerate(sets):
        for i, (name, stat) in enumerate(PROGRESS_METRICS):
            names[f"d{d}m{i}"] = (d, name)
            queries.append({"Id": f"d{d}m{i}", "ReturnData": True, "MetricStat": {
                "Metric": {"Namespace": platform.TRAINING_METRICS_NAMESPACE, "MetricName": name,
                           "Dimensions": dimensions}, "Period": period, "Stat": stat}})
    series: list[dict[str, list[tuple[float, float]]]] = [{name: [] for name, _ in PROGRESS_METRICS} for _ in sets]
    kwargs: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": start, "EndTime": end,
                              "ScanBy": "TimestampAscending"}
    for _ in range(MAX_METRIC_PAGES):
        page = cloudwatch.get_metric_data(**kwargs)
        for result in page.get("MetricDataResults", []):
            where = names.get(result.get("Id", ""))
            if where is not None:
                series[where[0]][where[1]] += [(t.timestamp(), float(v)) for t, v in zip(
                    result.get("Timestamps", []), result.get("Values", []), strict=False)]
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    found = next((s for s in series if s["train:iteration"]), series[0])
    return {name: sorted(points) for name, points in found.items()}


def job_progress(cloudwatch: Any, job: dict[str, Any], store: CurveStore | None,
                 now: datetime | None = None) -> TrainingProgress | None:
    """:func:`training_progress`, read from CloudWatch once for a job that ended (status_api.curve_store):
    its stored curve when there is one, else CloudWatch's, stored for the next request."""
    now = now or datetime.now(UTC)
    name = job.get("TrainingJobName")
    if store is None or not name or job.get("TrainingStartTime") is None or not settled(job, now):
        return training_progress(cloudwatch, job, now)
    stored = store.load(name)
    if stored is not None:
        return stored.progress
    try:
        progress = _read_progress(cloudwatch, job, now)
    except (ClientError, BotoCoreError) as exc:  # nothing is stored: the next request asks CloudWatch again
        logger.warning("training progress of %s left out: %s", name, exc)
        return None
    store.save(TrainingCurve(job_name=name, job_status=job["TrainingJobStatus"],
                             job_ended_at=job.get("TrainingEndTime"), stored_at=now, progress=progress))
    return progress


def training_progress(cloudwatch: Any, job: dict[str, Any], now: datetime | None = None) -> TrainingProgress | None:
    """The job's progress and loss curve from the metric values SageMaker published to CloudWatch.

    None before the job started training or published an iteration, and when CloudWatch cannot be read
    (logged): progress is an addition to the run's detail, which must stay readable without it.
    """
    try:
        return _read_progress(cloudwatch, job, now or datetime.now(UTC))
    except (ClientError, BotoCoreError) as exc:
        logger.warning("training progress of %s left out: %s", job.get("TrainingJobName"), exc)
        return None


def _read_progress(cloudwatch: Any, job: dict[str, Any], now: datetime) -> TrainingProgress | None:
    """:func:`training_progress`, with CloudWatch's errors raised (a stored curve must not be an error's None)."""
    start: datetime | None = job.get("TrainingStartTime")
    name = job.get("TrainingJobName")
    if start is None or not name:
        return None
    period = platform.metric_period((now - start).total_seconds())
    # Whole periods from the one the job started in, to the end of the one it ended (or is) in.
    first = datetime.fromtimestamp(start.timestamp() // period * period, UTC)
    end = (job.get("TrainingEndTime") or now) + timedelta(seconds=period)
    series = _metric_series(cloudwatch, name, first, end, period)
    progress, curve = progress_from_series(series)
    if progress is None:
        return None
    running = job.get("TrainingJobStatus") == "InProgress"
    newest = max(points[-1][0] for points in series.values() if points)
    return TrainingProgress(
        iteration=progress.iteration, total_iterations=progress.total, fraction=progress.fraction,
        loss=_finite(progress.loss), learning_rate=_finite(progress.learning_rate),
        images_per_second=_finite(progress.images_per_second),
        seconds_per_iteration=_finite(progress.seconds_per_iteration),
        seconds_left=_finite(progress.seconds_left) if running else None,
        updated_at=datetime.fromtimestamp(newest, UTC).isoformat(), period_seconds=period,
        loss_series=[LossPoint(iteration=int(i), loss=loss) for i, loss in curve])


def _finite(value: float | None) -> float | None:
    """JSON has no NaN: a value that is not a finite number is not shown."""
    return value if value is not None and math.isfinite(value) else None


def get_run(sfn: Any, sagemaker: Any, state_machine_arn: str, run_id: str, cloudwatch: Any = None,
            s3: Any = None, artifacts_bucket: str | None = None) -> RunDetail:
    """The run's detail; with ``cloudwatch``, its training job's progress (TrainingInfo.progress) too; with ``s3``
    and ``artifacts_bucket``, the review documents of a run the gate sent to review (status_api.review), and an
    ended job's progress read from CloudWatch once and kept (status_api.curve_store)."""
    from status_api.review import review_view  # it builds on this module


    arn = run_ids.execution_arn(state_machine_arn, run_id)
    try:
        execution = sfn.describe_execution(executionArn=arn)
    except sfn.exceptions.ExecutionDoesNotExist as exc:
        raise RunNotFound(f"no run {run_id!r}") from exc
    events = execution_history(sfn, arn)
    steps, current = timeline(events, execution["status"])
    raw = latest_document(events, execution)
    doc = RunState.read(raw)
    for section, why in doc.unreadable.items():  # left out of the answer; the rest still shows
        logger.warning("run %s: section %s unreadable: %s", run_id, section, why)
    try:  # the input's dataset: the document's own may be missing from a run that failed early
        dataset = RunState.read(json.loads(execution.get("input") or "{}")).dataset
    except ValueError:
        dataset = None
    training_job = _describe_job(sagemaker, doc, "training")
    store = CurveStore(s3, artifacts_bucket, run_id) if s3 is not None and artifacts_bucket else None
    evaluation_job = _describe_job(sagemaker, doc, "processing")
    endpoint = None
    if doc.deployment or doc.endpoint:
        endpoint = EndpointInfo(name=doc.champion.endpoint_name if doc.champion else None,
                                mode=doc.deployment.mode if doc.deployment else None,
                                # $.endpoint is the run's last DescribeEndpoint answer
                                status=doc.endpoint.EndpointStatus if doc.endpoint else None,
                                endpoint_config=doc.plan.names.endpoint_config if doc.plan else None)
    return RunDetail(
        run_id=run_id, execution_arn=arn, status=execution["status"],
        started_at=execution["startDate"].isoformat(), stopped_at=_iso(execution.get("stopDate")),
        dataset=dataset,
        current_state=current, timeline=steps,
        validation=_shown(doc.validation.summary if doc.validation else None),
        training=training_info(sagemaker, doc, training_job, cloudwatch, store), evaluation=_shown(doc.evaluation),
        gate=_shown(doc.gate), model_package_arn=doc.registration.model_package_arn if doc.registration else None,
        endpoint=endpoint, failure=_failure(doc), error=execution.get("error"), cause=_cause(execution.get("cause")),
        dataset_diff=doc.plan.dataset_diff if doc.plan else None,
        cost=run_cost(doc, training_job, evaluation_job, execution.get("stopDate")),
        review=review_view(s3, artifacts_bucket, run_id, raw, execution["status"]))


def _shown(section: BaseModel | None) -> dict[str, Any] | None:
    """A section as the run wrote it (its unmodelled keys kept), for the answer's free-form fields."""
    return section.model_dump(mode="json", exclude_unset=True) if section is not None else None


def run_cost(doc: RunState | dict[str, Any], training_job: dict[str, Any] | None, evaluation_job: dict[str, Any] | None,
             stopped: datetime | None, table: cost.PriceTable | None = None) -> cost.RunCost | None:
    """Training, evaluation and endpoint time priced with the stack's table; None before any job ran,
    or when the operator's price table cannot be read (logged: the run itself must still be readable).

    Endpoint time is billed from ``$.deployment.started_at``, which the create/update state writes only
    when its call succeeded (an unreadable one: no endpoint time), as the notification does."""
    state = RunState.read(doc)
    if table is None:
        try:
            table = cost.load_price_table()
        except cost.PriceTableError as exc:
            logger.error("run cost left out: %s", exc)
            return None
    plan = state.plan
    endpoint = None if plan is None else {"instance_type": plan.endpoint.instance_type,
                                          "instance_count": plan.endpoint.instance_count,
                                          "name": plan.names.endpoint_config}
    return cost.price_run(table, training_job, evaluation_job, endpoint,
                          state.deployment.started_at if state.deployment else None,
                          stopped or datetime.now(UTC))


def _cause(cause: Any) -> str | None:
    """One line, whatever the execution recorded (runs from before Describe failure, timeouts, aborts)."""
    return reason(cause) if cause else None


def _failure(doc: RunState) -> dict[str, Any] | None:
    failure = _shown(doc.failure)
    if failure is None:
        return None
    return {**failure, "cause": _cause(failure.get("cause"))} if "cause" in failure else failure


def start_run_for_uri(s3: Any, sfn: Any, state_machine_arn: str, data_bucket: str, uri: str) -> StartRunResponse:
    """``POST /runs``: the same run the S3 trigger starts for the manifest's current version."""
    try:
        bucket, key = s3_layout.parse_s3_uri(uri)
    except ValueError as exc:
        raise BadDatasetUri(str(exc)) from exc
    if bucket != data_bucket:
        raise BadDatasetUri(f"{uri}: datasets live in s3://{data_bucket}/, not s3://{bucket}/")
    if not key.endswith(s3_layout.MANIFEST_NAME):
        key = key.rstrip("/") + "/" + s3_layout.MANIFEST_NAME
    try:
        s3_layout.parse_manifest_key(key)
    except s3_layout.NotADatasetManifest as exc:
        raise BadDatasetUri(str(exc)) from exc
    # Listed first: a HEAD of a missing key may answer 403 to a role that lists only some
    # prefixes; access denied or throttling on the HEAD is then not mistaken for a 404.
    if not s3_probe.key_listed(s3, bucket, key):
        raise DatasetNotFound(f"s3://{bucket}/{key} does not exist (upload manifest.json last)")
    head = s3.head_object(Bucket=bucket, Key=key)
    try:
        dataset = run_start.dataset_ref(bucket, key, head.get("VersionId"), head.get("ETag"))
    except ValueError as exc:
        raise BadDatasetUri(str(exc)) from exc
    trigger = run_start.Trigger(source="api", object_key=key, object_version=dataset.manifest_version)
    started = run_start.start_run(sfn, state_machine_arn, dataset, trigger)
    return StartRunResponse(run_id=started.run_id, execution_arn=started.execution_arn,
                            already_started=started.already_started)


def list_models(sagemaker: Any, s3: Any, group: str, artifacts_bucket: str, next_token: str | None,
                limit: int) -> ModelsResponse:
    kwargs: dict[str, Any] = {"ModelPackageGroupName": group, "ModelPackageType": "Versioned",
                              "SortBy": "CreationTime", "SortOrder": "Descending", "MaxResults": limit}
    if next_token:
        kwargs["NextToken"] = next_token
    try:
        page = sagemaker.list_model_packages(**kwargs)
    except sagemaker.exceptions.ClientError as exc:
        # SageMaker refuses a foreign or expired token as a validation error.
        if next_token and exc.response.get("Error", {}).get("Code") in {"InvalidToken", "ValidationException"}:
            raise BadPageToken(f"nextToken is not a page token of the model listing: {exc}") from exc
        raise
    versions = [ModelVersion(model_package_arn=p["ModelPackageArn"], version=p.get("ModelPackageVersion"),
                             approval_status=p.get("ModelApprovalStatus", "Unknown"),
                             created_at=p["CreationTime"].isoformat(), description=p.get("ModelPackageDescription"))
                for p in page.get("ModelPackageSummaryList", [])]
    return ModelsResponse(champion=read_champion(s3, artifacts_bucket), versions=versions,
                          next_token=page.get("NextToken"))
