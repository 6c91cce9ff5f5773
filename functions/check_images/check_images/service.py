"""Check a batch of image files by the one image rule and copy them into the run's snapshot."""

from __future__ import annotations

from typing import Any

from check_images.models import ImageBatchEvent
from d2ops_core import s3_layout
from d2ops_core.validation.images import check_image_batch
from d2ops_core.validation.inventory import ImageBatchResult
from d2ops_core.validation.sources import S3Source

# Threads per batch: each holds at most one image's first 16 MB and its decode (within the decode budget).
WORKERS = 4


def check_batch(event: ImageBatchEvent, s3_client: Any, artifacts_bucket: str) -> ImageBatchResult:
    """Every item read at its listed VersionId (If-Match on its ETag), judged, hashed, and copied when it passed.

    The snapshot's bucket comes from the function's environment and its prefix from the run id, never
    from the batch: a Map input cannot send copies anywhere else. DatasetUnreadable (access denied)
    propagates and fails the Map; every per-image problem is an issue in the result.
    """
    batch = event.BatchInput
    snapshot = (artifacts_bucket, s3_layout.snapshot_prefix(batch.run_id))
    source = S3Source(s3_client, batch.bucket, batch.prefix, snapshot=snapshot)
    source.pin(list(event.Items))
    return check_image_batch(source, event.Items, snapshot=True, workers=WORKERS)
