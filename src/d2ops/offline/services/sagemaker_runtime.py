"""SageMaker Runtime offline: ``InvokeEndpoint`` (REST JSON, ``POST /endpoints/<name>/invocations``),
answered by the endpoint's local TorchServe ``/invocations`` (`sagemaker_endpoints.LocalEndpoints.invoke`)."""

from __future__ import annotations

import re
from typing import Protocol

from d2ops.offline.errors import ApiError
from d2ops.offline.services.base import RuntimeParts, Upstream, WireRequest, WireResponse
from d2ops.offline.services.sagemaker import LocalSageMaker
from d2ops.offline.services.sagemaker_endpoints import CUSTOM_ATTRIBUTES

INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"  # InvokeEndpoint's InferenceId member (data capture keeps it)
_INVOKE = re.compile(r"^/endpoints/(?P<name>[A-Za-z0-9-]{1,63})/invocations$")


class Invoker(Protocol):
    def invoke(self, endpoint_name: str, body: bytes, content_type: str | None,
               accept: str | None, custom_attributes: str | None = None,
               inference_id: str | None = None) -> tuple[int, bytes, str]: ...


class SageMakerRuntime:
    CLIENT = "sagemaker-runtime"
    ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"

    def __init__(self, endpoints: Invoker) -> None:
        self.endpoints = endpoints

    @classmethod
    def from_runtime(cls, parts: RuntimeParts) -> SageMakerRuntime:
        return cls(parts.service(LocalSageMaker))

    def accepts(self, request: WireRequest) -> bool:
        return _INVOKE.match(request.route) is not None

    def handle(self, request: WireRequest, upstream: Upstream) -> WireResponse:
        match = _INVOKE.match(request.route)
        assert match is not None  # accepts() said so
        name = match["name"]
        try:
            # InvokeEndpoint's CustomAttributes reach the container as this header, as SageMaker passes them.
            status, data, content_type = self.endpoints.invoke(name, request.body, request.headers.get("Content-Type"),
                                                               request.headers.get("Accept"),
                                                               request.headers.get(CUSTOM_ATTRIBUTES),
                                                               request.headers.get(INFERENCE_ID))
        except ApiError as err:
            return WireResponse.json(err.status, {"message": err.message}, "application/json",
                                     {"x-amzn-ErrorType": err.code})
        if 200 <= status < 300:
            return WireResponse(200, data, content_type, {"x-Amzn-Invoked-Production-Variant": "AllTraffic"})
        # SageMaker wraps a container's error answer as ModelError (HTTP 424) with the original.
        message = data.decode("utf-8", "replace")[:4096]
        return WireResponse.json(424, {"message": f"Received client error ({status}) from primary with "
                                                  f"message \"{message}\"",
                                       "OriginalStatusCode": status, "OriginalMessage": message},
                                 "application/json", {"x-amzn-ErrorType": "ModelError"})
