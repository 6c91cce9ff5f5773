"""Start one pipeline run per manifest upload (duplicate deliveries start nothing new)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_plus

from d2ops import runs
from start_pipeline.models import ObjectCreatedEvent, TriggerResult


def handle_object_created(event: ObjectCreatedEvent, sfn: Any, state_machine_arn: str) -> TriggerResult:
    """Start the run for ``datasets/<name>/<version>/manifest.json``; ignore every other key.

    S3 URL-encodes object keys in its event notifications, so the key is decoded first.
    """
    key = unquote_plus(event.detail.object.key)
    try:
        dataset = runs.dataset_ref(event.detail.bucket.name, key, event.detail.object.version_id,
                                   event.detail.object.etag)
    except runs.NotADatasetManifest as exc:
        return TriggerResult(action="ignored", key=key, reason=str(exc))
    trigger = runs.Trigger(source="s3-event", object_key=key, object_version=dataset.manifest_version)
    return TriggerResult.from_run(key, runs.start_run(sfn, state_machine_arn, dataset, trigger))
