"""Where moto's answer differs from AWS's in a way the offline stack depends on, and the repair.

- S3 GetBucketNotificationConfiguration: moto 5 stores a bucket's ``EventBridgeConfiguration``
  (PutBucketNotificationConfiguration) but leaves it out of the answer, so a bucket that sends its
  events to EventBridge looks as if it sent none. S3 answers ``<EventBridgeConfiguration/>``
  (botocore: ``"EventBridgeConfiguration": {}``); ``d2ops doctor`` reads exactly that.

:func:`apply` patches moto in this process (the offline runtime's moto server and ``mock_aws``
alike); it is idempotent and changes nothing once moto renders the member itself.
"""

from __future__ import annotations

from typing import Any

_APPLIED = "_d2ops_eventbridge_rendered"
_ELEMENT = "<EventBridgeConfiguration/>"


def _with_eventbridge(body: str) -> str:
    if "EventBridgeConfiguration" in body:
        return body  # moto renders it (a later release)
    if body.rstrip().endswith("/>"):  # <NotificationConfiguration xmlns="..."/>: nothing else configured
        head = body.rstrip()[:-2]
        return f"{head}>{_ELEMENT}</NotificationConfiguration>"
    return body.replace("</NotificationConfiguration>", f"{_ELEMENT}</NotificationConfiguration>", 1)


def apply() -> None:
    from moto.s3.responses import S3Response

    if getattr(S3Response, _APPLIED, False):
        return
    if not hasattr(S3Response, "get_bucket_notification"):
        # Another moto than the pinned one renamed what this repairs: run without the repair (doctor's
        # upload-events check then reads what that moto answers) rather than fail the whole runtime.
        return
    original = S3Response.get_bucket_notification

    def get_bucket_notification(self: Any) -> Any:
        response = original(self)
        config = self.backend.get_bucket_notification_configuration(self.bucket_name)
        if config is None or getattr(config, "event_bridge", None) is None:
            return response
        status, headers, body = response
        text = body.decode() if isinstance(body, bytes) else str(body)
        return status, headers, _with_eventbridge(text)

    S3Response.get_bucket_notification = get_bucket_notification  # type: ignore[method-assign]
    setattr(S3Response, _APPLIED, True)
