"""TorchServe adapter: the only module that knows TorchServe. All logic is in ``service``.

torch-model-archiver copies this file into the model archive; TorchServe imports it by file
name and instantiates its one class. ``model_code`` itself comes from PYTHONPATH (the serving
image installs it; ``d2ops serve`` points PYTHONPATH at the repository).
"""

from __future__ import annotations

import logging
from typing import Any

from ts.torch_handler.base_handler import BaseHandler

from model_code.artifact import load_artifact
from model_code.serving.device import GpuUnavailableError, select_device
from model_code.serving.service import DetectionService, RawRequest

logger = logging.getLogger(__name__)


def _header(headers: dict[str, Any], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name and isinstance(value, str):
            return value
    return None


class DetectionHandler(BaseHandler):
    """Loads the artifact and warms up in ``initialize``: TorchServe marks the worker ready (and
    ``/ping`` healthy) only when ``initialize`` returns, so ``/ping`` never answers before that."""

    service: DetectionService

    def initialize(self, context: Any) -> None:
        properties = context.system_properties
        try:
            # Never a silent CPU fallback where a GPU is needed: failing here keeps /ping unhealthy.
            decision = select_device(properties.get("gpu_id"))
        except GpuUnavailableError as exc:
            logger.error("d2ops serving: %s", exc)
            raise
        device = decision.device
        logger.info(decision.log_line())
        self.context = context
        self.service = DetectionService(load_artifact(properties["model_dir"], device=device), device=device)
        meta = self.service.metadata
        logger.info("loaded %s (%s, %d classes) on %s; batch_size=%s", meta.model, meta.task,
                    len(meta.class_names), device, properties.get("batch_size"))
        self.service.warm_up()
        self.initialized = True

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[bytes]:
        requests = []
        for idx, row in enumerate(data):
            headers = {k: v for k, v in context.get_all_request_header(idx).items() if isinstance(v, str)}
            body_headers = context.get_request_header(idx, "body")
            content_type = _header(headers, "content-type") or (
                body_headers.get("content-type") if isinstance(body_headers, dict) else None)
            # TorchServe puts the query string's parameters next to the body in the same dict.
            query = {k: v for k, v in row.items() if k != "body"}
            requests.append(RawRequest(body=row.get("body"), content_type=content_type, query=query, headers=headers))
        responses = self.service.handle_batch(requests)
        for idx, response in enumerate(responses):
            context.set_response_status(response.status, response.phrase, idx)
            for key, value in response.headers.items():
                if key.lower() == "content-type":
                    context.set_response_content_type(idx, value)
                else:
                    context.set_response_header(idx, key, value)
        return [response.body for response in responses]
