"""One download of the dataset, and a volume sized for it: the prepare step's ``dataset`` channel,
VolumeSizeInGB from the run's inventory (with a floor), an oversize dataset refused before any job
starts, and the trainers and the evaluation reading both splits from that one input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops import synth
from d2ops_core import platform, s3_layout
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
from prepare_training import handler as prepare_handler  # noqa: E402
from prepare_training import service, volume  # noqa: E402
from prepare_training.models import PrepareEvent, PrepareSettings  # noqa: E402

GIB = 1024**3


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.prepare_env(monkeypatch)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=support.ARTIFACTS_BUCKET)
        support.put_pretrained_weights(s3)
        yield s3


def prepare() -> dict[str, Any]:
    return dict(prepare_handler.handler(support.load_event("prepare_training", "defaults"),
                                        support.FakeLambdaContext()))


def volumes(plan: dict[str, Any]) -> tuple[int, int]:
    return (plan["training_job"]["ResourceConfig"]["VolumeSizeInGB"],
            plan["evaluation_job"]["ProcessingResources"]["ClusterConfig"]["VolumeSizeInGB"])


def test_one_dataset_channel_carries_the_snapshot_and_no_train_or_val(aws: Any) -> None:
    """Mutation caught: train and val channels of the same snapshot (File mode downloads each)."""
    support.put_inventory(aws, support.RUN_ID)
    plan = prepare()
    snapshot = s3_layout.snapshot_uri(support.ARTIFACTS_BUCKET, support.RUN_ID)
    channels = plan["training_job"]["InputDataConfig"]
    of_snapshot = [c for c in channels if c["DataSource"]["S3DataSource"]["S3Uri"] == snapshot]
    assert [c["ChannelName"] for c in of_snapshot] == ["dataset"]
    assert not {"train", "val"} & {c["ChannelName"] for c in channels}
    assert of_snapshot[0]["InputMode"] == "File"
    inputs = plan["evaluation_job"]["ProcessingInputs"]
    assert [i["InputName"] for i in inputs if i["S3Input"]["S3Uri"] == snapshot] == ["dataset"]


def test_the_volume_grows_with_the_inventory_and_never_goes_below_the_floor(aws: Any) -> None:
    """Mutations caught: a constant VolumeSizeInGB; the floor dropped; the inventory's sizes not summed."""
    support.put_inventory(aws, support.RUN_ID)  # a few KB
    assert volumes(prepare()) == (volume.FLOOR_GB, volume.FLOOR_GB)
    # The inventory says what the snapshot holds; nothing that large is written (moto keeps only the lines).
    support.put_inventory(aws, support.RUN_ID, image_sizes=(30 * GIB, 30 * GIB))
    training, evaluation = volumes(prepare())
    assert training > 60 and evaluation > 60
    support.put_inventory(aws, support.RUN_ID, image_sizes=(40 * GIB, 40 * GIB))
    bigger_training, bigger_evaluation = volumes(prepare())
    assert bigger_training - training >= 20 and bigger_evaluation - evaluation >= 20


def test_the_size_covers_the_dataset_the_models_and_a_margin() -> None:
    dataset = volume.DatasetSize(bytes=100 * GIB, files=1_000_000)
    weights = 170 * 1024**2  # an R-50 FPN checkpoint
    need = volume.needed_bytes(dataset, weights, volume.TRAINING_MODEL_COPIES)
    assert need >= dataset.bytes + dataset.files * volume.BLOCK_BYTES + volume.TRAINING_MODEL_COPIES * weights
    assert need > (dataset.bytes + volume.TRAINING_MODEL_COPIES * weights) * 1.05  # the margin is there
    # Unknown weights (training from scratch) are assumed large, never zero.
    assert volume.needed_bytes(dataset, None, 1) >= dataset.bytes + volume.MODEL_ALLOWANCE_BYTES
    assert volume.volume_gb(volume.DatasetSize(0, 0), None, volume.TRAINING_MODEL_COPIES) == volume.FLOOR_GB


def test_an_oversize_dataset_is_refused_before_any_job_with_the_sizes_and_the_limit(aws: Any) -> None:
    """ml.g4dn.xlarge's 125 GB instance store (SageMaker attaches no EBS volume there) cannot hold 200 GB."""
    support.put_inventory(aws, support.RUN_ID, image_sizes=(100 * GIB, 100 * GIB))
    with pytest.raises(volume.DatasetTooLarge) as refused:
        prepare()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("the training job needs ")
    assert "dataset 200.0 GB in 5 files" in message
    assert "ml.g4dn.xlarge's instance storage" in message and "holds 125 GB" in message
    assert "TrainingInstanceType" in message


@pytest.mark.parametrize(("instance_type", "dataset_gib", "refused_at"), [
    ("ml.m5.xlarge", 200, None),  # EBS: the volume grows past any instance store
    ("ml.m5.xlarge", 20_000, platform.EBS_VOLUME_MAX_GB),  # past the largest EBS volume
    ("ml.g5.12xlarge", 2_000, None),  # 3800 GB of instance store
    ("ml.p4d.24xlarge", 9_000, 8000),
])
def test_each_instance_type_is_judged_by_its_own_storage(instance_type: str, dataset_gib: int,
                                                         refused_at: int | None) -> None:
    settings = PrepareSettings.from_env({**support.PREPARE_ENV, "TRAINING_INSTANCE_TYPE": instance_type})
    event = PrepareEvent.model_validate(support.load_event("prepare_training", "defaults"))
    dataset = volume.DatasetSize(bytes=dataset_gib * GIB, files=10)
    if refused_at is None:
        job = service.training_job_request(settings, event, service.job_names(event.run_id), dataset=dataset)
        assert job["ResourceConfig"]["VolumeSizeInGB"] > dataset_gib
        return
    with pytest.raises(volume.DatasetTooLarge, match=f"holds {refused_at} GB"):
        service.training_job_request(settings, event, service.job_names(event.run_id), dataset=dataset)


def test_an_instance_store_size_not_in_the_table_is_left_to_sagemaker() -> None:
    limit = platform.job_volume_limit("ml.g5.96xlarge")  # a g5 size the table does not list
    assert limit.gb is None and "instance storage" in limit.what
    assert platform.job_volume_limit("ml.c5.xlarge").gb == platform.EBS_VOLUME_MAX_GB


def test_the_inventory_is_summed_as_a_stream_across_chunk_boundaries(aws: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    total = support.put_inventory(aws, support.RUN_ID, image_sizes=(1, 22, 333, 4444))
    monkeypatch.setattr(volume, "CHUNK_BYTES", 7)  # lines split mid-record
    size = volume.dataset_size(aws, support.ARTIFACTS_BUCKET, support.RUN_ID)
    assert (size.bytes, size.files) == (total, 7)


def test_a_missing_inventory_names_its_key(aws: Any) -> None:
    with pytest.raises(volume.InventoryUnreadable, match=f"runs/{support.RUN_ID}/inventory.jsonl: NoSuchKey"):
        prepare()


def test_the_constants_the_lambda_restates_agree_with_the_images() -> None:
    """The Lambda cannot import model_code: its copies of the trainer's facts are kept equal here."""
    from model_code.evaluation import job
    from model_code.training import config, detectron2_trainer

    assert volume.CHECKPOINTS_KEPT == detectron2_trainer.CHECKPOINTS_KEPT
    assert service.DATASET_CHANNEL == config.DATASET_CHANNEL == job.DATASET_INPUT
    assert config.REQUIRED_CHANNELS == (config.DATASET_CHANNEL,)


def test_the_trainer_reads_both_splits_from_the_dataset_channel(tmp_path: Path) -> None:
    """Mutation caught: a trainer still opening SM_CHANNEL_TRAIN / SM_CHANNEL_VAL."""
    from model_code.training import torchvision_launch
    from model_code.training.config import ConfigError, load_environment, parse_hyperparameters

    channel = tmp_path / "snapshot"
    synth.generate(channel, images=6, size=48)
    config = tmp_path / "ml" / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps({"framework": "torchvision"}))
    environ = {"D2OPS_ML_ROOT": str(tmp_path / "ml"), "SM_CHANNEL_DATASET": str(channel)}
    env = load_environment(environ, gpu_count=0)
    ctx = torchvision_launch.build_context(env, parse_hyperparameters(env.hyperparameters), environ)
    assert ctx.dataset.train_json.parent.parent == channel and ctx.val_dataset.val_json.parent.parent == channel

    old = {"D2OPS_ML_ROOT": str(tmp_path / "ml"), "SM_CHANNEL_TRAIN": str(channel), "SM_CHANNEL_VAL": str(channel)}
    env = load_environment(old, gpu_count=0)
    with pytest.raises(ConfigError, match=r"input channel 'dataset' is missing: the job has channels \['train', "
                                          r"'val'\]"):
        torchvision_launch.build_context(env, parse_hyperparameters(env.hyperparameters), old)
