"""The status API (API Gateway HTTP API, IAM auth) as a Powertools event handler.

``python -m status_api.handler`` prints the OpenAPI document generated from these routes
(docs/status-api.openapi.json holds it; a test keeps it current).
"""

# No `from __future__ import annotations`: Powertools reads the route signatures at runtime
# to validate requests and to generate the OpenAPI document.
import os
from typing import Annotated, Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from aws_lambda_powertools.event_handler.exceptions import BadRequestError, NotFoundError
from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from status_api import service
from status_api.models import (
    RUN_ID_PATTERN,
    ErrorResponse,
    ModelsResponse,
    RunDetail,
    RunList,
    RunStatus,
    StartRunRequest,
    StartRunResponse,
)

logger = Logger()
tracer = Tracer()
app = APIGatewayHttpResolver(enable_validation=True)

OPENAPI_TITLE = "d2ops status API"
OPENAPI_VERSION = "1.0.0"


def error(description: str) -> OpenAPIResponse:
    return {"description": description, "content": {"application/json": {"model": ErrorResponse}}}


@app.get("/runs", summary="List pipeline runs, newest first",
         responses={200: {"description": "one page of runs", "content": {"application/json": {"model": RunList}}},
                    400: error("nextToken is not a token of this listing")})
@tracer.capture_method
def list_runs(
    dataset: Annotated[str | None, Query(description="only runs of this dataset name")] = None,
    status: Annotated[RunStatus | None, Query(description="only runs in this status")] = None,
    next_token: Annotated[str | None, Query(alias="nextToken", description="from the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 25,
) -> RunList:
    try:
        return service.list_runs(boto3.client("stepfunctions"), os.environ["STATE_MACHINE_ARN"], dataset=dataset,
                                 status=status, next_token=next_token, limit=limit)
    except service.BadPageToken as exc:
        raise BadRequestError(str(exc)) from exc


@app.get("/runs/<runId>", summary="One run: status, timeline, validation, training, evaluation, gate, endpoint",
         responses={200: {"description": "the run", "content": {"application/json": {"model": RunDetail}}},
                    404: error("no run with this id")})
@tracer.capture_method
def get_run(runId: Annotated[str, Path(pattern=RUN_ID_PATTERN)]) -> RunDetail:  # the route spells it runId
    try:
        return service.get_run(boto3.client("stepfunctions"), boto3.client("sagemaker"),
                               os.environ["STATE_MACHINE_ARN"], runId)
    except service.RunNotFound as exc:
        raise NotFoundError(str(exc)) from exc


@app.post("/runs", summary="Start the run for a dataset version (idempotent, like the S3 trigger)",
          responses={202: {"description": "the run was started",
                           "content": {"application/json": {"model": StartRunResponse}}},
                     200: {"description": "this upload's run had been started already",
                           "content": {"application/json": {"model": StartRunResponse}}},
                     400: error("not a dataset version of the data bucket"),
                     404: error("the dataset version has no manifest.json")})
@tracer.capture_method
def start_run(request: StartRunRequest) -> tuple[StartRunResponse, int]:
    try:
        started = service.start_run_for_uri(boto3.client("s3"), boto3.client("stepfunctions"),
                                            os.environ["STATE_MACHINE_ARN"], os.environ["DATA_BUCKET"],
                                            request.dataset_uri)
    except service.DatasetNotFound as exc:
        raise NotFoundError(str(exc)) from exc
    except (service.BadDatasetUri, ValueError) as exc:
        raise BadRequestError(str(exc)) from exc
    logger.info("run requested", extra=started.model_dump())
    return started, 200 if started.already_started else 202


@app.get("/models", summary="Model Registry versions and the current champion",
         responses={200: {"description": "one page of model versions and the champion",
                          "content": {"application/json": {"model": ModelsResponse}}},
                    400: error("nextToken is not a token of this listing")})
@tracer.capture_method
def list_models(
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 25,
) -> ModelsResponse:
    try:
        return service.list_models(boto3.client("sagemaker"), boto3.client("s3"),
                                   os.environ["MODEL_PACKAGE_GROUP_NAME"], os.environ["ARTIFACTS_BUCKET"], next_token,
                                   limit)
    except service.BadPageToken as exc:
        raise BadRequestError(str(exc)) from exc


def openapi_document() -> str:
    return app.get_openapi_json_schema(title=OPENAPI_TITLE, version=OPENAPI_VERSION,
                                       description="Follow d2ops pipeline runs and models. Requests are "
                                                   "signed with AWS SigV4 (IAM authorization).")


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)


if __name__ == "__main__":
    print(openapi_document())
