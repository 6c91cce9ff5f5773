"""The serving logic, independent of TorchServe: a batch of raw requests in, one response each out.

One bad request never fails the others: decoding errors become that request's 4xx; the valid
images go through the detector in one call (the batch TorchServe assembled), and if that call
fails the images are retried one by one so a single poisonous image only fails itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import torch
import torchvision  # noqa: F401  (registers torchvision::nms & co, which the exported detectors call)

from model_code.artifact import ArtifactMetadata, LoadedDetector
from model_code.inference import Detections, predict
from model_code.serving.decode import DecodedRequest, decode_request
from model_code.serving.errors import RequestError, bad_request
from model_code.serving.options import MAX_DETECTIONS_LIMIT, PredictOptions
from model_code.serving.response import detections_to_json

logger = logging.getLogger(__name__)

JSON_TYPE = "application/json"
BATCH_SIZE_HEADER = "X-D2ops-Batch-Size"  # how many requests shared this request's model call
WARM_UP_SIZES = ((480, 640), (320, 240))  # two sizes, so the batched path with padding runs once


@dataclass(frozen=True)
class RawRequest:
    body: Any
    content_type: str | None = None
    query: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    headers: dict[str, str]

    @property
    def phrase(self) -> str:
        return HTTPStatus(self.status).phrase

    def json(self) -> Any:
        return json.loads(self.body)


def narrow(detections: Detections, options: PredictOptions, class_thresholds: torch.Tensor) -> Detections:
    """Apply one request's threshold and limit to detections already sorted by score.

    ``class_thresholds`` [K] is the model's own threshold of each label, used when the request sets none.
    """
    if options.score_threshold is not None:
        keep = detections.scores >= options.score_threshold
    else:
        keep = detections.scores >= class_thresholds.to(detections.labels.device)[detections.labels]
    index = torch.nonzero(keep).flatten()[:options.max_detections]  # still by descending score
    return Detections(boxes=detections.boxes[index], scores=detections.scores[index],
                      labels=detections.labels[index],
                      masks=None if detections.masks is None else detections.masks[index])


class DetectionService:
    def __init__(self, detector: LoadedDetector, device: str = "cpu") -> None:
        self.detector = detector
        self.device = torch.device(device)
        self.ready = False
        # The default per class (artifact.ArtifactMetadata.score_threshold: its own, else the fallback).
        self.class_thresholds = torch.tensor(
            [detector.metadata.score_threshold(i) for i in range(len(detector.metadata.class_names))],
            dtype=torch.float32)

    @property
    def metadata(self) -> ArtifactMetadata:
        return self.detector.metadata

    def warm_up(self) -> float:
        """Run the detector (and mask encoding) on synthetic images; returns the seconds it took."""
        started = time.perf_counter()
        generator = torch.Generator().manual_seed(0)
        images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for h, w in WARM_UP_SIZES]
        options = PredictOptions(score_threshold=0.0, masks=self.metadata.has_masks)
        for _ in range(2):  # TorchScript optimises on the first calls; the second is the steady state
            results = self._predict(images, [options] * len(images))
        for image, det in zip(images, results, strict=True):
            detections_to_json(det, self.metadata, options, int(image.shape[2]), int(image.shape[1]))
        self.ready = True
        seconds = time.perf_counter() - started
        logger.info("warm-up done in %.2f s", seconds)
        return seconds

    def _predict(self, images: Sequence[torch.Tensor], options: Sequence[PredictOptions]) -> list[Detections]:
        # One model call for the whole batch with the loosest options, then each request's own. The model
        # call's limit is the largest asked for, taken from the best scores of any class: a per-class default
        # can drop some of them, so it asks for every detection the model has where one relies on it.
        model_lowest = float(self.class_thresholds.min())
        loosest = min(model_lowest if o.score_threshold is None else o.score_threshold for o in options)
        most = max(o.max_detections for o in options)
        if any(o.score_threshold is None for o in options):
            most = MAX_DETECTIONS_LIMIT
        on_device = [image.to(self.device) for image in images]
        raw = predict(self.detector, on_device, score_threshold=loosest, max_detections=most)
        return [narrow(det, o, self.class_thresholds) for det, o in zip(raw, options, strict=True)]

    def _decode(self, request: RawRequest) -> DecodedRequest:
        decoded = decode_request(request.body, request.content_type, request.query, request.headers)
        if decoded.options.masks and not self.metadata.has_masks:
            raise bad_request("masks_unavailable",
                              f"masks=true, but model {self.metadata.model!r} detects boxes only (task "
                              f"{self.metadata.task!r})")
        return decoded

    def handle_batch(self, requests: Sequence[RawRequest]) -> list[Response]:
        headers = {BATCH_SIZE_HEADER: str(len(requests))}
        responses: list[Response | None] = [None] * len(requests)
        decoded: dict[int, DecodedRequest] = {}
        for i, request in enumerate(requests):
            try:
                decoded[i] = self._decode(request)
            except RequestError as exc:
                responses[i] = error_response(exc, headers)
            except Exception:  # a decoding bug must not become a 5xx (the rollback alarm) or fail the batch
                logger.exception("request %d of %d could not be decoded", i + 1, len(requests))
                responses[i] = error_response(bad_request("undecodable_request", "the request could not be decoded "
                                                          "as a JPEG/PNG image or JSON document"), headers)
        if decoded:
            started = time.perf_counter()
            for i, result in self._run(decoded).items():
                responses[i] = result if isinstance(result, Response) else self._answer(i, result, decoded[i], headers)
            logger.info("batch of %d requests: %d images through the model in %.1f ms", len(requests), len(decoded),
                        (time.perf_counter() - started) * 1000)
        return [r if r is not None else error_response(RequestError(500, "internal_error", "no response"), headers)
                for r in responses]

    def _answer(self, i: int, result: Detections, request: DecodedRequest, headers: Mapping[str, str]) -> Response:
        """The 200 answer of one request; a failure to write it fails that request alone (a 500), not the batch."""
        try:
            return json_response(200, detections_to_json(result, self.metadata, request.options, request.width,
                                                          request.height), headers)
        except Exception:
            logger.exception("the detections of request %d could not be written as JSON", i + 1)
            return error_response(RequestError(500, "inference_failed", "the detector's answer for this image could "
                                                                         "not be written; see the endpoint logs"),
                                  headers)

    def _run(self, decoded: dict[int, DecodedRequest]) -> dict[int, Detections | Response]:
        order = list(decoded)
        try:
            results = self._predict([decoded[i].image for i in order], [decoded[i].options for i in order])
            return dict(zip(order, results, strict=True))
        except Exception:
            if len(order) == 1:
                logger.exception("inference failed")
                return {order[0]: error_response(
                    RequestError(500, "inference_failed", "the detector failed on this image; see the endpoint logs"),
                    {BATCH_SIZE_HEADER: str(len(decoded))})}
            logger.exception("batched inference failed; retrying the %d images one at a time", len(order))
        out: dict[int, Detections | Response] = {}
        for i in order:
            out.update(self._run({i: decoded[i]}))
        return out


def json_response(status: int, document: Any, headers: Mapping[str, str]) -> Response:
    return Response(status=status, body=json.dumps(document, allow_nan=False).encode("utf-8"),
                    headers={"Content-Type": JSON_TYPE, **headers})


def error_response(error: RequestError, headers: Mapping[str, str]) -> Response:
    return json_response(error.status, error.to_json(), headers)
