"""Start one pipeline run per manifest upload (duplicate deliveries start nothing new)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_plus

from d2ops_core import run_start, s3_layout
from start_pipeline.models import ObjectCreatedEvent, TriggerResult

OBJECT_CREATED = "Object Created"  # EventBridge detail-type of an S3 upload (or copy, multipart completion)


def handle_object_created(event: ObjectCreatedEvent, sfn: Any, state_machine_arn: str) -> TriggerResult:
    """Start the run for ``datasets/<name>/<version>/manifest.json``; ignore every other key.

    S3 URL-encodes object keys in its event notifications, so the key is decoded first. Only
    "Object Created" starts a run: the rule filters on it, but a replayed or hand-sent event
    of another type (an "Object Deleted" of the manifest) must not start a run of a dataset
    that is gone.
    """
    raw_key = event.detail.object.key
    try:  # S3 keys are UTF-8: an escape that decodes to anything else names no object S3 could hold
        key = unquote_plus(raw_key, errors="strict")
    except UnicodeDecodeError:
        return TriggerResult(action="ignored", key=raw_key, reason=f"{raw_key!r} is not URL-encoded UTF-8, as S3 "
                                                                   "writes object keys into its events")
    if event.detail_type != OBJECT_CREATED:
        return TriggerResult(action="ignored", key=key, reason=f"event type {event.detail_type!r} is not "
                                                               f"{OBJECT_CREATED!r}")
    try:
        dataset = run_start.dataset_ref(event.detail.bucket.name, key, event.detail.object.version_id,
                                        event.detail.object.etag)
    except s3_layout.NotADatasetManifest as exc:
        return TriggerResult(action="ignored", key=key, reason=str(exc))
    trigger = run_start.Trigger(source="s3-event", object_key=key, object_version=dataset.manifest_version)
    return TriggerResult.from_run(key, run_start.start_run(sfn, state_machine_arn, dataset, trigger))
