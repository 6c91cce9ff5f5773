"""EventBridge Scheduler (hourly) -> compare the last full window of the endpoint's capture with the baseline of
the model serving it; write the window's verdict, put its metrics, send one message when it drifted."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core.lambda_task import task_handler
from monitor_endpoint.models import MonitorEvent
from monitor_endpoint.service import Settings, monitor
from monitor_endpoint.statistics import Thresholds

logger = Logger()
tracer = Tracer()


def settings_from(env: dict[str, str] | os._Environ[str]) -> Settings:
    return Settings(bucket=env["ARTIFACTS_BUCKET"], endpoint=env["ENDPOINT_NAME"],
                    topic_arn=env.get("TOPIC_ARN") or None,
                    thresholds=Thresholds(ks=float(env["DRIFT_KS_THRESHOLD"]), psi=float(env["DRIFT_PSI_THRESHOLD"]),
                                          min_records=int(env["MONITOR_MIN_RECORDS"])),
                    window_minutes=int(env.get("WINDOW_MINUTES", "60")))


@task_handler(MonitorEvent, logger, tracer)
def handler(event: MonitorEvent, context: LambdaContext) -> dict[str, Any]:
    result = monitor(event, settings_from(os.environ), boto3.client("s3"), boto3.client("cloudwatch"),
                     boto3.client("sns"))
    logger.info(f"window {result.verdict}", extra=result.model_dump(mode="json"))
    return result.model_dump(mode="json")
