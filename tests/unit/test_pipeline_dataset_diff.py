"""The prepare Lambda's diff against the champion's dataset: stored next to the run, its summary in the plan,
and never a reason for the run to fail."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops_core import s3_layout
from d2ops_core.champion import CHAMPION_KEY, ChampionRecord
from d2ops_core.dataset_identity import DatasetRef
from d2ops_core.documents.dataset_diff import DatasetDiff
from d2ops_core.documents.run_state import RunState
from tests.fixtures.pipeline import support
from tests.unit.test_dataset_diff import VERSION_A, VERSION_B, snapshot_run, upload, write_version

support.function_path("prepare_training")
from prepare_training import handler as prepare_handler  # noqa: E402
from prepare_training.models import PrepareEvent, PrepareSettings  # noqa: E402
from prepare_training.service import diff_against_champion  # noqa: E402

RUN_ID = "shapes_v1_bf3cc289798108cc"  # events/prepare_training/defaults.json
CHAMPION_RUN = "pets_v1_0123456789abcdef"
CHAMPION_DATASET = DatasetRef(bucket=support.DATA_BUCKET, prefix="datasets/pets/v1/", name="pets", version="v1",
                              manifest_key="datasets/pets/v1/manifest.json", manifest_version="1")


def champion_record() -> dict[str, Any]:
    return {"run_id": CHAMPION_RUN, "dataset": CHAMPION_DATASET.model_dump(),
            "model_package_arn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/d2ops-models/1",
            "model_name": "m", "model_data": f"s3://{support.ARTIFACTS_BUCKET}/runs/{CHAMPION_RUN}/model.tar.gz",
            "endpoint_name": support.ENDPOINT_NAME, "endpoint_config_name": "c", "primary_metric": "bbox_AP",
            "primary_value": 0.62, "evaluation_uri": "s3://x/e.json",
            "gate": {"decision": "approved", "approval_status": "Approved", "reason": "ok"},
            "promoted_at": "2026-11-01T08:00:00Z"}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    support.prepare_env(monkeypatch)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=support.ARTIFACTS_BUCKET)
        support.put_pretrained_weights(s3)  # creates the data bucket
        s3.put_bucket_versioning(Bucket=support.DATA_BUCKET, VersioningConfiguration={"Status": "Enabled"})
        s3.put_object(Bucket=support.ARTIFACTS_BUCKET, Key=CHAMPION_KEY, Body=json.dumps(champion_record()))
        yield s3


def prepare() -> dict[str, Any]:
    return dict(prepare_handler.handler(support.load_event("prepare_training", "defaults"),
                                        support.FakeLambdaContext()))


def test_the_diff_is_stored_and_its_summary_travels_in_the_plan(aws: Any, tmp_path: Path) -> None:
    old = upload(aws, support.DATA_BUCKET, CHAMPION_DATASET.prefix, write_version(tmp_path / "a", VERSION_A,
                                                                                  version="v1"))
    new = upload(aws, support.DATA_BUCKET, "datasets/shapes/v1/", write_version(tmp_path / "b", VERSION_B,
                                                                                version="v2"))
    for run_id, prefix, entries in ((CHAMPION_RUN, CHAMPION_DATASET.prefix, old), (RUN_ID, "datasets/shapes/v1/", new)):
        snapshot_run(aws, run_id, prefix, entries, artifacts=support.ARTIFACTS_BUCKET, data=support.DATA_BUCKET)
    plan = prepare()
    state = RunState.read({"plan": plan})
    assert state.plan is not None
    summary = state.plan.dataset_diff
    assert summary is not None and summary.error is None
    assert summary.uri == f"s3://{support.ARTIFACTS_BUCKET}/{s3_layout.dataset_diff_key(RUN_ID)}"
    assert (summary.added, summary.removed, summary.renamed, summary.content_changed) == (1, 2, 1, 1)
    assert (summary.annotations_changed, summary.split_moved, summary.instances_delta) == (1, 1, 1)
    assert summary.champion_run_id == CHAMPION_RUN and summary.against == "pets/v1"
    assert summary.classes_new == ["bird"] and summary.classes_vanished == ["cow"]
    body = aws.get_object(Bucket=support.ARTIFACTS_BUCKET, Key=s3_layout.dataset_diff_key(RUN_ID))["Body"].read()
    document = DatasetDiff.model_validate_json(body)
    assert document.a.run_id == CHAMPION_RUN and document.a.source == "run snapshot"
    assert document.b.run_id == RUN_ID and document.b.inventory_digest
    assert len(json.dumps(plan["dataset_diff"])) < 2000  # small in the state


def test_a_diff_that_cannot_be_computed_never_fails_the_run(aws: Any) -> None:
    # The champion predates inventories and its dataset prefix is empty: no manifest anywhere.
    support.put_inventory(aws, RUN_ID)  # this run's, which sizes its jobs' volumes
    plan = prepare()
    assert plan["training_job"]["TrainingJobName"]  # the run goes on
    summary = plan["dataset_diff"]
    assert summary["error"].startswith("DiffInputError: s3://d2ops-data-example/datasets/pets/v1/: no manifest.json")
    assert summary["champion_run_id"] == CHAMPION_RUN
    listed = aws.list_objects_v2(Bucket=support.ARTIFACTS_BUCKET, Prefix=s3_layout.dataset_diff_key(RUN_ID))
    assert listed.get("KeyCount", 0) == 0


def test_the_time_budget_ends_the_diff_not_the_run(aws: Any, tmp_path: Path) -> None:
    old = upload(aws, support.DATA_BUCKET, CHAMPION_DATASET.prefix, write_version(tmp_path / "a", VERSION_A,
                                                                                  version="v1"))
    snapshot_run(aws, CHAMPION_RUN, CHAMPION_DATASET.prefix, old, artifacts=support.ARTIFACTS_BUCKET,
                 data=support.DATA_BUCKET)
    import os

    event = PrepareEvent.model_validate(support.load_event("prepare_training", "defaults"))
    summary = diff_against_champion(aws, PrepareSettings.from_env(os.environ), event,
                                    ChampionRecord.model_validate(champion_record()), seconds=0)
    assert summary is not None and summary.error == "DiffTimeout: the diff ran past its time budget"
    assert summary.line() == "data diff not computed: DiffTimeout: the diff ran past its time budget"


def test_no_champion_no_diff(aws: Any) -> None:
    aws.delete_object(Bucket=support.ARTIFACTS_BUCKET, Key=CHAMPION_KEY)
    support.put_inventory(aws, RUN_ID)
    assert prepare()["dataset_diff"] is None


def test_a_champion_older_than_inventories_is_read_from_its_prefix_and_the_diff_says_so(aws: Any,
                                                                                       tmp_path: Path) -> None:
    upload(aws, support.DATA_BUCKET, CHAMPION_DATASET.prefix, write_version(tmp_path / "a", VERSION_A, version="v1"))
    new = upload(aws, support.DATA_BUCKET, "datasets/shapes/v1/", write_version(tmp_path / "b", VERSION_B,
                                                                                version="v2"))
    snapshot_run(aws, RUN_ID, "datasets/shapes/v1/", new, artifacts=support.ARTIFACTS_BUCKET,
                 data=support.DATA_BUCKET)  # only this run has an inventory
    summary = prepare()["dataset_diff"]
    assert summary["error"] is None and "has no inventory" in summary["notes"][0]
    document = DatasetDiff.model_validate_json(
        aws.get_object(Bucket=support.ARTIFACTS_BUCKET, Key=s3_layout.dataset_diff_key(RUN_ID))["Body"].read())
    assert document.a.source == "dataset prefix (no inventory)"
    # No image is downloaded in the Lambda: content is not compared, so no rename is claimed either.
    assert (document.images.not_compared, document.images.renamed, document.images.content_changed) == (4, 0, 0)
    assert (document.images.added, document.images.removed) == (2, 3)
    assert document.images.annotations_changed == 1 and document.images.split_moved == 1
