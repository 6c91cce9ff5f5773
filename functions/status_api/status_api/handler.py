"""The status API (API Gateway HTTP API, IAM auth) as a Powertools event handler.

``python -m status_api.handler`` prints the OpenAPI document generated from these routes
(docs/status-api.openapi.json holds it; a test keeps it current).
"""

# No `from __future__ import annotations`: Powertools reads the route signatures at runtime
# to validate requests and to generate the OpenAPI document.
import json
import os
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.exceptions import ConnectionError as AwsConnectionError

from d2ops_core.champion import EndpointHistory
from d2ops_core.failures import one_line
from d2ops_core.run_ids import RUN_ID_PATTERN
from d2ops_core.validation.report import ValidationReport
from status_api import clients, monitoring, review, service, views
from status_api.envelope import BadEnvelope, check_event, json_body
from status_api.models import (
    ENDPOINT_NAME_PATTERN,
    DecisionRequest,
    DecisionResponse,
    ErrorResponse,
    EvaluationView,
    ModelsResponse,
    MonitoringView,
    RunDetail,
    RunGraph,
    RunList,
    RunStatus,
    StartRunRequest,
    StartRunResponse,
)

logger = Logger()
tracer = Tracer()
# The body is parsed once, by the resolver, through envelope.json_body (hostile JSON -> BadEnvelope).
app = APIGatewayHttpResolver(enable_validation=True, json_body_deserializer=json_body)

OPENAPI_TITLE = "d2ops status API"
OPENAPI_VERSION = "1.0.0"


def answer(description: str, model: type) -> OpenAPIResponse:
    return {"description": description, "content": {"application/json": {"model": model}}}


def error(description: str) -> OpenAPIResponse:
    return answer(description, ErrorResponse)


BUSY = error("an AWS service behind the API is throttling or unreachable; retry after Retry-After seconds")
NO_RUN = "no run with this id"
BAD_PAGE = "a query parameter is invalid, or nextToken is not a token of this listing"
# Page tokens of Step Functions and SageMaker are at most 1024 characters; a longer one is no token.
MAX_PAGE_TOKEN = 1024


def _problem(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON,
                    body=json.dumps({"statusCode": status, "message": message}), headers=headers)


def route(method: str, path: str, summary: str, answers: dict[int, OpenAPIResponse], errors: dict[int, str],
          description: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A route as this API sets up each: its answers, then its client errors, then 503 (any AWS call may be
    throttled, `busy`), all documented; the route traced."""
    register = app.route(path, method, summary=summary, description=description,
                         responses={**answers, **{status: error(why) for status, why in errors.items()}, 503: BUSY})

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        return register(tracer.capture_method(function))
    return decorate


def report_missing(report: str) -> str:
    """The 404 of a route that reads one of the run's reports from S3."""
    return (f"{NO_RUN}, or it has no {report} report (yet), or S3 refused it to the API (AccessDenied: the message "
            "says so)")


@app.exception_handler(BadEnvelope)
def bad_envelope(exc: BadEnvelope) -> Response:
    """A body json.loads cannot read (nested too deeply, a number too long, malformed): 400 naming why."""
    logger.warning("refused request", extra={"reason": str(exc)})
    return _problem(exc.status, one_line(str(exc)))


@app.exception_handler(RequestValidationError)
def bad_request(exc: RequestValidationError) -> Response:
    """Malformed requests are 400s with one message naming the parameter (Powertools' default is a 422).

    A path that cannot be a run id names no run: 404, like a well-formed id that does not exist.
    """
    problems = exc.errors()
    if problems and all(e["loc"][:1] == ("path",) for e in problems):
        if any(e["loc"][1:] == ("endpointName",) for e in problems):
            return _problem(404, "no endpoint with this name (SageMaker endpoint names are 1-63 letters, digits "
                                 "or '-')")
        return _problem(404, "no run with this id (run ids are 1-80 letters, digits, '-' or '_')")
    first = problems[0] if problems else {"loc": (), "msg": "invalid request"}
    where = {"query": "query parameter", "path": "path parameter", "body": "request body"}.get(
        str(first["loc"][0]) if first["loc"] else "", "request")
    name = ".".join(str(p) for p in first["loc"][1:])
    return _problem(400, one_line(f"{where} {name!r}: {first['msg']}" if name else f"{where}: {first['msg']}"))


@app.exception_handler(service.NotFound)
def not_found(exc: service.NotFound) -> Response:
    """Every "no such run/dataset/..." of the service layer is a 404, mapped here once; a report S3 refused
    the API's role is one too (the caller cannot fix the role), logged for the operator who can."""
    if isinstance(exc, views.ReportUnreadable):
        logger.warning("S3 refused a report to the status API's role: check its policy in template.yaml",
                       extra={"reason": str(exc)})
    return _problem(404, one_line(str(exc)))


@app.exception_handler(service.BadRequest)
def cannot_serve(exc: service.BadRequest) -> Response:
    """Every request the service layer cannot serve as asked (bad page token, dataset URI) is a 400."""
    return _problem(400, one_line(str(exc)))


@app.exception_handler(review.Forbidden)
def forbidden(exc: review.Forbidden) -> Response:
    """A caller the route does not allow (not the stack's reviewer role): 403 naming who may."""
    logger.warning("refused caller", extra={"reason": str(exc)})
    return _problem(403, one_line(str(exc)))


@app.exception_handler(review.Conflict)
def conflict(exc: review.Conflict) -> Response:
    """A request that contradicts what happened already (decided before, or no longer waiting): 409."""
    return _problem(409, one_line(str(exc)))


@app.exception_handler([ClientError, AwsConnectionError, ReadTimeoutError])
def busy(exc: Exception) -> Response:
    """Throttled or unreachable AWS APIs are a 503 with Retry-After, not a 500; other AWS errors stay 5xx."""
    if isinstance(exc, ClientError) and not service.is_throttling(exc):
        raise exc
    logger.warning("AWS service busy", extra={"error": str(exc)})
    return _problem(503, "the pipeline's AWS services are busy or unreachable; retry later",
                    headers={"Retry-After": str(service.RETRY_AFTER_SECONDS)})


@route("GET", "/runs", "List pipeline runs, newest first", {200: answer("one page of runs", RunList)},
       {400: BAD_PAGE})
def list_runs(
    dataset: Annotated[str | None, Query(description="only runs of this dataset name")] = None,
    status: Annotated[RunStatus | None, Query(description="only runs in this status")] = None,
    next_token: Annotated[str | None, Query(alias="nextToken", description="from the previous page",
                                            min_length=1, max_length=MAX_PAGE_TOKEN)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 25,
) -> RunList:
    return service.list_runs(clients.client("stepfunctions"), os.environ["STATE_MACHINE_ARN"], dataset=dataset,
                             status=status, next_token=next_token, limit=limit)


@route("GET", "/runs/<runId>", "One run: status, timeline, validation, training, evaluation, gate, endpoint",
       {200: answer("the run", RunDetail)}, {404: NO_RUN})
def get_run(runId: Annotated[str, Path(pattern=RUN_ID_PATTERN)]) -> RunDetail:  # the route spells it runId
    return service.get_run(clients.client("stepfunctions"), clients.client("sagemaker"),
                           os.environ["STATE_MACHINE_ARN"], runId, cloudwatch=clients.Lazy("cloudwatch"),
                           s3=clients.Lazy("s3"), artifacts_bucket=os.environ["ARTIFACTS_BUCKET"])


@route("GET", "/runs/<runId>/graph", "The state machine laid out, each state coloured by its outcome in the run",
       {200: answer("states (with duration) and transitions (taken or not)", RunGraph)}, {404: NO_RUN})
def get_run_graph(runId: Annotated[str, Path(pattern=RUN_ID_PATTERN)]) -> RunGraph:
    return views.run_graph(clients.client("stepfunctions"), os.environ["STATE_MACHINE_ARN"], runId)


@route("GET", "/runs/<runId>/validation", "The run's full validation report (errors, warnings, class statistics)",
       {200: answer("the validation report", ValidationReport)}, {404: report_missing("validation")})
def get_validation_report(runId: Annotated[str, Path(pattern=RUN_ID_PATTERN)]) -> ValidationReport:
    return views.validation_report(clients.client("stepfunctions"), clients.client("s3"),
                                   os.environ["STATE_MACHINE_ARN"], os.environ["ARTIFACTS_BUCKET"], runId)


@route("GET", "/runs/<runId>/evaluation",
       "The run's evaluation report: challenger and champion metrics, per-class AP, precision-recall curves",
       {200: answer("the evaluation report", EvaluationView)}, {404: report_missing("evaluation")},
       description="An answer the whole report would make larger than Lambda's 6 MB leaves out its largest parts "
                   "(truncated: true; left_out names them) and links each S3 document of the report whole "
                   f"(full_report: presigned GETs, valid for {views.LINK_SECONDS // 60} minutes). Any other answer "
                   "is the whole report.")
def get_evaluation_report(runId: Annotated[str, Path(pattern=RUN_ID_PATTERN)]) -> EvaluationView:
    return views.evaluation_report(clients.client("stepfunctions"), clients.client("s3"),
                                   os.environ["STATE_MACHINE_ARN"], os.environ["ARTIFACTS_BUCKET"], runId)


@route("GET", "/endpoints/<endpointName>/history",
       "What served the endpoint when (run, dataset version, model package, metrics), what was rolled back",
       {200: answer("served periods, newest first, and rolled-back deployments", EndpointHistory)},
       {404: "no endpoint with this name has a recorded deployment, or S3 refused its history to the API "
             "(AccessDenied: the message says so)"})
def get_endpoint_history(
        endpointName: Annotated[str, Path(pattern=ENDPOINT_NAME_PATTERN)]) -> EndpointHistory:  # the route's spelling
    return views.endpoint_history(clients.client("s3"), os.environ["ARTIFACTS_BUCKET"], endpointName)


# The monitoring routes' query, declared once for both.
WindowLimit = Annotated[int, Query(ge=1, le=monitoring.MAX_LIMIT, description="the newest this many windows")]
WindowsFrom = Annotated[datetime | None, Query(alias="from", description="windows starting at or after this time")]
WindowsTo = Annotated[datetime | None, Query(alias="to", description="windows starting at or before this time")]


@route("GET", "/endpoints/<endpointName>/monitoring",
       "The endpoint's monitoring windows, newest first: each statistic against its threshold, and the verdict",
       {200: answer("windows newest first (none yet: an empty list), and the window objects that could not be read",
                    MonitoringView)},
       {400: "limit is not 1-500, from or to is not an ISO 8601 time, or from is after to",
        404: "endpointName is not a SageMaker endpoint name, or S3 refused the endpoint's monitoring windows to the "
             "API (AccessDenied: the message says so)"},
       description="Windows are written by the endpoint's monitor (docs/monitoring.md), one per window of captured "
                   "traffic; from and to bound the windows' start times (UTC when no offset is given). Draw them "
                   "beside GET /endpoints/{endpointName}/history to see which model served each window.")
def get_endpoint_monitoring(
    endpointName: Annotated[str, Path(pattern=ENDPOINT_NAME_PATTERN)],  # the route's spelling
    limit: WindowLimit = monitoring.DEFAULT_LIMIT,
    start: WindowsFrom = None,
    end: WindowsTo = None,
) -> MonitoringView:
    return monitoring.monitoring_view(clients.client("s3"), os.environ["ARTIFACTS_BUCKET"], endpointName, limit,
                                      start, end)


@route("GET", "/endpoint/monitoring",
       "The stack's own endpoint's monitoring windows (EndpointName): GET /endpoints/{endpointName}/monitoring for it",
       {200: answer("windows newest first (none yet: an empty list), and the window objects that could not be read",
                    MonitoringView)},
       {400: "limit is not 1-500, from or to is not an ISO 8601 time, or from is after to",
        404: "S3 refused the endpoint's monitoring windows to the API (AccessDenied: the message says so)"},
       description="The stack serves one endpoint (the EndpointName parameter); this path needs no name.")
def get_stack_endpoint_monitoring(
    limit: WindowLimit = monitoring.DEFAULT_LIMIT,
    start: WindowsFrom = None,
    end: WindowsTo = None,
) -> MonitoringView:
    return monitoring.monitoring_view(clients.client("s3"), os.environ["ARTIFACTS_BUCKET"], os.environ["ENDPOINT_NAME"],
                                      limit, start, end)


@route("POST", "/runs", "Start the run for a dataset version (idempotent, like the S3 trigger)",
       {202: answer("the run was started", StartRunResponse),
        200: answer("this upload's run had been started already", StartRunResponse)},
       {400: "the body is not {\"dataset_uri\": ...}, or not a dataset version of the data bucket",
        404: "the dataset version has no manifest.json"})
def start_run(request: StartRunRequest) -> tuple[StartRunResponse, int]:
    started = service.start_run_for_uri(clients.client("s3"), clients.client("stepfunctions"),
                                        os.environ["STATE_MACHINE_ARN"], os.environ["DATA_BUCKET"],
                                        request.dataset_uri)
    logger.info("run requested", extra=started.model_dump())
    return started, 200 if started.already_started else 202


@route("POST", "/runs/<runId>/decision",
       "Decide a run the quality gate sent to review: approve (deploy as if the gate approved) or reject",
       {200: answer("the decision the run received (already_decided: this caller's same decision, recorded before)",
                    DecisionResponse)},
       {400: "the body is not {\"decision\": \"approve\"|\"reject\", \"reason\": ...} (a rejection needs a reason)",
        403: "the caller is not a session of the stack's reviewer role",
        404: "the run is not waiting for a review (no such run, or the gate did not ask for one)",
        409: "the run was already decided (the message names by whom), or it no longer waits (timed out or ended)",
        413: "the request body is larger than the status API takes"},
       description="Only sessions of the stack's reviewer role (its ReviewerRoleArn output) may decide. The "
                   "decision completes the run's wait (SendTaskSuccess) and is recorded once: the caller's ARN, "
                   "the reason and the time, in the run, the registry entry and the endpoint history.")
def decide(runId: Annotated[str, Path(pattern=RUN_ID_PATTERN)], request: DecisionRequest) -> DecisionResponse:
    decided = review.decide(clients.client("stepfunctions"), clients.client("s3"), os.environ["ARTIFACTS_BUCKET"],
                            os.environ.get("REVIEWER_ROLE_ARN", ""), runId, request,
                            review.caller_arn(app.current_event.raw_event))
    logger.info("review decision", extra={"run_id": runId, "decision": decided.decision,
                                          "decided_by": decided.decided_by, "repeated": decided.already_decided})
    return decided


@route("GET", "/models", "Model Registry versions and the current champion",
       {200: answer("one page of model versions and the champion", ModelsResponse)}, {400: BAD_PAGE})
def list_models(
    next_token: Annotated[str | None, Query(alias="nextToken", min_length=1, max_length=MAX_PAGE_TOKEN)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 25,
) -> ModelsResponse:
    return service.list_models(clients.client("sagemaker"), clients.client("s3"),
                               os.environ["MODEL_PACKAGE_GROUP_NAME"], os.environ["ARTIFACTS_BUCKET"], next_token,
                               limit)


def openapi_document() -> str:
    document = json.loads(app.get_openapi_json_schema(
        title=OPENAPI_TITLE, version=OPENAPI_VERSION,
        description="Follow d2ops pipeline runs and models. Requests are signed with AWS SigV4 (IAM authorization). "
                    "Client errors are 400 (or 404), never 422; a throttled AWS service is a 503 with Retry-After."))
    # Powertools documents its own 422 for validation errors; bad_request answers those as 400/404.
    for operation in (op for item in document["paths"].values() for op in item.values()):
        operation["responses"].pop("422", None)
        if "503" in operation["responses"]:
            operation["responses"]["503"]["headers"] = {
                "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
    for unused in ("HTTPValidationError", "ValidationError"):
        document.get("components", {}).get("schemas", {}).pop(unused, None)
    return json.dumps(document, indent=2)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        check_event(event)
    except BadEnvelope as exc:  # the resolver would raise on this event: a 400 naming why instead of a 500
        logger.warning("refused request", extra={"reason": str(exc)})
        return {"statusCode": exc.status, "headers": {"Content-Type": content_types.APPLICATION_JSON},
                "body": json.dumps({"statusCode": exc.status, "message": one_line(str(exc))}),
                "isBase64Encoded": False}
    return app.resolve(event, context)


if __name__ == "__main__":
    print(openapi_document())
