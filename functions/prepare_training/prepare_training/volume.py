"""How much ML storage a run's jobs get (VolumeSizeInGB), from the size of the dataset they download.

Both jobs download the snapshot once, in File mode, onto the volume; the training job also keeps
the pretrained weights, its checkpoints and the exported model there, the evaluation job the two
models it compares. The sum, with a margin, becomes VolumeSizeInGB, never below :data:`FLOOR_GB`,
and a run whose jobs cannot get that much on their instance types is refused before anything starts
(d2ops_core.platform.job_volume_limit says how much each type can have).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from d2ops_core import platform, s3_layout
from d2ops_core.validation.inventory import read_inventory

GIB = 1024**3
# What every job got before sizing, and SageMaker's own floor is far below it: small datasets keep
# the volume they have always run with (gp2 costs cents per GB-month, prorated to the job's hours).
FLOOR_GB = 50
# A file takes whole filesystem blocks (4 KiB on ext4/xfs): a million small images cost ~4 GB beyond
# their bytes.
BLOCK_BYTES = 4096
# The parameters' size when the run starts from no checkpoint (PretrainedWeightsKey=none): more than
# any model-zoo detector's (an R-50 FPN checkpoint is ~170 MB, the X-101 ones under 0.5 GB).
MODEL_ALLOWANCE_BYTES = GIB
# model_code.training.detectron2_trainer.CHECKPOINTS_KEPT (tests/unit/test_job_volume.py keeps them equal).
CHECKPOINTS_KEPT = 2
# Training, in copies of the parameters: the pretrained weights (1), the kept checkpoints plus the one
# being written and model_final (CHECKPOINTS_KEPT + 2), each holding the weights and SGD's momentum (x2),
# and the export, a CPU and a CUDA trace in the model directory and again in model.tar.gz (2 x 2).
TRAINING_MODEL_COPIES = 1 + (CHECKPOINTS_KEPT + 2) * 2 + 2 * 2
# Evaluation, the challenger's and the champion's model.tar.gz, each also unpacked (2 x 2 traces x 2).
EVALUATION_MODEL_COPIES = 2 * 2 * 2
# For what the sum does not itemise: logs, output data, the evaluation's reports, filesystem metadata.
MARGIN = 1.10
CHUNK_BYTES = 1024 * 1024


class DatasetTooLarge(Exception):
    """A job of the run needs more storage than its instance type can have: refused before any job starts."""


class InventoryUnreadable(Exception):
    """The run's inventory (written by validation with the snapshot) is missing or not an inventory."""


@dataclass(frozen=True)
class DatasetSize:
    """What the jobs download: the snapshot's bytes and files (the inventory's entries)."""

    bytes: int
    files: int

    def on_disk(self) -> int:
        return self.bytes + self.files * BLOCK_BYTES


def gb(nbytes: int) -> str:
    return f"{nbytes / GIB:,.1f} GB"


def needed_bytes(dataset: DatasetSize, model_bytes: int | None, model_copies: int) -> int:
    """The bytes a job writes onto its volume, margin included."""
    params = model_bytes or MODEL_ALLOWANCE_BYTES
    return math.ceil((dataset.on_disk() + model_copies * params) * MARGIN)


def volume_gb(dataset: DatasetSize, model_bytes: int | None, model_copies: int) -> int:
    return max(FLOOR_GB, math.ceil(needed_bytes(dataset, model_bytes, model_copies) / GIB))


def sized_volume(job: str, instance_type: str, parameter: str, dataset: DatasetSize, model_bytes: int | None,
                 model_copies: int) -> int:
    """VolumeSizeInGB for ``job`` on ``instance_type``; DatasetTooLarge names the sizes and the limit."""
    size = volume_gb(dataset, model_bytes, model_copies)
    limit = platform.job_volume_limit(instance_type)
    if limit.gb is not None and size > limit.gb:
        models = gb(model_copies * (model_bytes or MODEL_ALLOWANCE_BYTES))
        raise DatasetTooLarge(
            f"the {job} job needs {size} GB of storage (dataset {gb(dataset.bytes)} in {dataset.files:,} files, "
            f"models, checkpoints and output {models}, {round((MARGIN - 1) * 100)}% margin) but {limit.what} "
            f"holds {limit.gb} GB: choose a {parameter} with more storage or train on a smaller dataset version")
    return size


def dataset_size(s3: Any, artifacts_bucket: str, run_id: str) -> DatasetSize:
    """Sum the run's inventory (``runs/<run id>/inventory.jsonl``: every object the snapshot copied, with its
    size), read as a stream."""
    key = s3_layout.inventory_key(run_id)
    where = s3_layout.s3_uri(artifacts_bucket, key)
    try:
        body = s3.get_object(Bucket=artifacts_bucket, Key=key)["Body"]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        raise InventoryUnreadable(f"{where}: {code} reading the run's inventory, which sizes the jobs' "
                                  "volumes") from None
    total = files = 0
    try:
        # Streamed line by line (botocore's iter_lines, as validation reads it): a million images' inventory is
        # ~200 MB, never held whole.
        for entry in read_inventory(body.iter_lines(CHUNK_BYTES)):
            total += entry.size
            files += 1
    except ValueError as exc:
        raise InventoryUnreadable(f"{where}: {exc}") from None
    return DatasetSize(bytes=total, files=files)


def prefix_size(s3: Any, bucket: str, prefix: str) -> DatasetSize:
    """What an S3Prefix channel of ``s3://bucket/prefix`` downloads (an SDK experiment's dataset: the prefix
    as it is now, every object under it)."""
    total = files = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents") or []:
            total += int(item.get("Size", 0))
            files += 1
    return DatasetSize(bytes=total, files=files)
