"""Step Functions task: build the run's training/evaluation job requests (``$.plan``)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core.champion import read_champion
from d2ops_core.lambda_task import task_handler
from prepare_training.models import PrepareEvent, PrepareSettings
from prepare_training.service import (
    build_plan,
    champion_ref,
    dataset_snapshot,
    diff_against_champion,
    require_pretrained_weights,
)
from prepare_training.volume import dataset_size

DIFF_MARGIN_SECONDS = 10

logger = Logger()
tracer = Tracer()


@task_handler(PrepareEvent, logger, tracer)
def handler(event: PrepareEvent, context: LambdaContext) -> dict[str, Any]:
    settings = PrepareSettings.from_env(os.environ)
    s3 = boto3.client("s3")
    weights_bytes = require_pretrained_weights(s3, settings)
    dataset_snapshot(settings, event)  # a run without a validated snapshot (hence no inventory) is refused first
    # The jobs' volumes are sized from what they download: the inventory lists every object of the snapshot.
    dataset = dataset_size(s3, settings.artifacts_bucket, event.run_id)
    record = read_champion(s3, settings.artifacts_bucket)
    champion = champion_ref(record)
    plan = build_plan(settings, event, champion, dataset=dataset, weights_bytes=weights_bytes)
    # What changed in the data since the champion: information, computed in what the invocation has left.
    budget = max(1.0, context.get_remaining_time_in_millis() / 1000 - DIFF_MARGIN_SECONDS)
    plan.dataset_diff = diff_against_champion(s3, settings, event, record, seconds=budget)
    if plan.dataset_diff is not None and plan.dataset_diff.error:
        logger.warning("dataset diff not computed", extra={"run_id": event.run_id, "error": plan.dataset_diff.error})
    if plan.dataset_diff is not None and plan.dataset_diff.warning():
        logger.warning(plan.dataset_diff.warning(), extra={"run_id": event.run_id,
                                                           "train_to_val": plan.dataset_diff.train_to_val})
    logger.info("prepared training job", extra={"run_id": event.run_id, "names": plan.names.model_dump(),
                                                "dataset_bytes": dataset.bytes, "dataset_files": dataset.files,
                                                "volume_gb": plan.training_job["ResourceConfig"]["VolumeSizeInGB"],
                                                "champion": champion.run_id if champion else None})
    return plan.model_dump(mode="json")
