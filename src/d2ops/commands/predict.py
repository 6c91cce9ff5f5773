"""``d2ops predict IMAGE``: send one image to an endpoint and print its detections as JSON.

The endpoint is a deployed stack's SageMaker endpoint (``--endpoint NAME``; region and
credentials from the usual boto3 chain, ``--region``/``--profile``), or the offline endpoint of
the runtime that holds ``--work-dir`` (``--offline``; the runtime's gateway serves SageMaker
Runtime). The call goes through the SageMaker Python SDK's ``Predictor``, as in a notebook: the
image's bytes with the content type its content says (d2ops_core.images decides, never the file
name), JSON detections back, checked against the serving response document
(d2ops_core.documents.detections). ``--draw OUT.png`` draws them on the image.

Exit codes: 0 detections printed; 2 the input is wrong (file, image, options); 1 the endpoint
could not answer (unknown endpoint, model error, unreachable, malformed answer). One line on
stderr says why; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import stat
import sys
from pathlib import Path
from typing import Any

from d2ops.commands.errors import UsageError

# SageMaker's real-time InvokeEndpoint payload limit.
MAX_IMAGE_BYTES = 6 * 1024 * 1024
DRAW_SUFFIXES = (".png", ".jpg", ".jpeg")
COLOURS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45")


class EndpointFailed(Exception):
    """The endpoint (or the way to it) failed: exit code 1."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("predict", help="send an image to an endpoint (SageMaker's or the offline one) and "
                                              "print its detections as JSON")
    p.add_argument("image", metavar="IMAGE", help="a JPEG or PNG file, or - to read it from stdin")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--endpoint", metavar="NAME", help="a deployed SageMaker endpoint's name")
    where.add_argument("--offline", action="store_true",
                       help="the offline endpoint of the runtime running on --work-dir (d2ops demo, run, console)")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"), help="offline runtime state (default .d2ops)")
    p.add_argument("--offline-endpoint", metavar="NAME",
                   help="with --offline: the endpoint's name (default: the offline stack's endpoint)")
    p.add_argument("--region", help="AWS region of --endpoint (default: the boto3 chain's)")
    p.add_argument("--profile", help="AWS profile for --endpoint (default: the boto3 chain's)")
    p.add_argument("--score-threshold", type=float, metavar="S",
                   help="drop detections scored below S, in [0, 1], whatever their class (default: none sent, so "
                        "the model's own per-class thresholds apply)")
    p.add_argument("--draw", type=Path, metavar="OUT.png", help="also draw boxes, labels and scores on the image")
    p.set_defaults(func=run)


def read_image(source: str) -> tuple[bytes, str]:
    """(bytes, name for messages) of a file or of stdin (``-``); UsageError when it cannot be read."""
    if source == "-":
        data = sys.stdin.buffer.read(MAX_IMAGE_BYTES + 1)
        where = "stdin"
    else:
        path = Path(source)
        where = str(path)
        try:
            status = path.stat()
            if not stat.S_ISREG(status.st_mode) and not stat.S_ISDIR(status.st_mode):
                # a named pipe would block the read until someone writes to it; a device never ends
                raise UsageError(f"{where}: not a regular file (a pipe or device); use - to read stdin")
            if status.st_size > MAX_IMAGE_BYTES:
                raise UsageError(f"{where}: {status.st_size} bytes, over SageMaker's "
                                 f"{MAX_IMAGE_BYTES}-byte InvokeEndpoint limit")
            data = path.read_bytes()
        except FileNotFoundError:
            raise UsageError(f"{where}: no such file") from None
        except IsADirectoryError:
            raise UsageError(f"{where}: is a directory, not an image file") from None
        except OSError as exc:
            raise UsageError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise UsageError(f"{where}: over SageMaker's {MAX_IMAGE_BYTES}-byte InvokeEndpoint limit")
    return data, where


def check_image(data: bytes, where: str) -> tuple[str, Any]:
    """(content type, upright RGB image) under the project's one image rule; UsageError otherwise."""
    from d2ops_core import images

    try:
        with images.open_image(data, where) as header:
            content_type = images.CONTENT_TYPES[str(header.format)]
        return content_type, images.load_rgb(data, where)
    except images.ImageRejected as exc:
        raise UsageError(exc.message) from None


def _check_draw_target(path: Path | None) -> None:
    if path is None:
        return
    if path.suffix.lower() not in DRAW_SUFFIXES:
        raise UsageError(f"--draw {path}: name it .png or .jpg (the format follows the name)")
    if not path.parent.is_dir():
        raise UsageError(f"--draw {path}: directory {path.parent} does not exist")


def _boto_session(args: argparse.Namespace) -> Any:
    import boto3
    from botocore.exceptions import ProfileNotFound

    try:
        session = boto3.session.Session(profile_name=args.profile, region_name=args.region)
    except ProfileNotFound as exc:
        raise UsageError(str(exc)) from None
    if not session.region_name:
        raise UsageError("no AWS region: pass --region or set AWS_REGION (or a profile's region)")
    return session


def _offline_target(args: argparse.Namespace) -> tuple[Any, str]:
    """(sagemaker Session on the running runtime's gateway, endpoint name)."""
    from d2ops import sdk
    from d2ops.offline.client import running_runtime
    from d2ops.offline.stack import StackError, load_stack

    running = running_runtime(args.work_dir)
    if running is None:
        raise EndpointFailed(f"no offline runtime is running on {args.work_dir} (its endpoint lives only while "
                             f"d2ops demo, run or console runs there)")
    name = args.offline_endpoint
    if name is None:
        try:
            name = load_stack().endpoint_name
        except StackError as exc:
            raise UsageError(f"the offline stack cannot be resolved: {exc}") from None
    # Signed with the runtime's own credentials (runtime.json): its gateway answers no others.
    return sdk.sagemaker_session(running.session(), endpoint_url=running.gateway), name


def invoke(session: Any, endpoint: str, data: bytes, content_type: str,
           score_threshold: float | None = None) -> dict[str, Any]:
    """InvokeEndpoint through the SDK's Predictor; the answer checked against the response document."""
    from botocore.exceptions import BotoCoreError, ClientError
    from pydantic import ValidationError
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import IdentitySerializer

    from d2ops_core.documents.detections import InvocationResponse

    predictor = Predictor(endpoint, sagemaker_session=session, serializer=IdentitySerializer(content_type),
                          deserializer=JSONDeserializer())
    attributes = None if score_threshold is None else f"score_threshold={score_threshold}"
    try:
        answer = predictor.predict(data, custom_attributes=attributes)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), str(error.get("Message") or "")
        if code == "ModelError":  # the container answered an error (SageMaker wraps it, 424)
            original = exc.response.get("OriginalMessage") or message
            raise EndpointFailed(f"endpoint {endpoint} refused the image "
                                 f"({exc.response.get('OriginalStatusCode', '?')}): {original}") from None
        if code in ("ValidationError", "ValidationException") and "not found" in message:
            raise EndpointFailed(f"endpoint {endpoint} not found: {message}") from None
        raise EndpointFailed(f"InvokeEndpoint on {endpoint} failed: {code}: {message}") from None
    except BotoCoreError as exc:  # no credentials, unreachable endpoint URL, timeouts
        raise EndpointFailed(f"endpoint {endpoint} could not be reached: {exc}") from None
    except ValueError as exc:  # JSONDeserializer on a body that is not JSON
        raise EndpointFailed(f"endpoint {endpoint} answered something that is not JSON: {exc}") from None
    try:
        InvocationResponse.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise EndpointFailed(f"endpoint {endpoint} answered malformed detections: "
                             f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    result: dict[str, Any] = answer
    return result


def draw(image: Any, detections: list[dict[str, Any]]) -> Any:
    """Boxes (xyxy, original pixels), class names and scores drawn on a copy of ``image``."""
    from PIL import ImageDraw

    canvas = image.convert("RGB").copy()
    pen = ImageDraw.Draw(canvas)
    for det in detections:
        x1, y1, x2, y2 = det["box"]
        colour = COLOURS[int(det["class_id"]) % len(COLOURS)]
        pen.rectangle([x1, y1, x2, y2], outline=colour, width=2)
        label = f"{det['class_name']} {det['score']:.2f}"
        left, top, right, bottom = pen.textbbox((x1 + 2, y1 + 1), label)
        pen.rectangle([left - 1, top - 1, right + 1, bottom + 1], fill=colour)  # readable on any background
        pen.text((x1 + 2, y1 + 1), label, fill="white")
    return canvas


def _quiet_sdk_logs() -> None:
    """The SDK logs (to stdout, by default) which config files it looked for; stdout is the answer here."""
    import logging

    sdk_log = logging.getLogger("sagemaker")
    if not sdk_log.handlers:
        sdk_log.addHandler(logging.StreamHandler(sys.stderr))
    logging.getLogger("sagemaker.config").setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    from d2ops.sdk import SdkMissing

    if args.score_threshold is not None and not 0 <= args.score_threshold <= 1:
        raise UsageError(f"--score-threshold {args.score_threshold} is not in [0, 1]")
    if args.offline_endpoint is not None and not args.offline:
        raise UsageError("--offline-endpoint goes with --offline (a deployed endpoint is --endpoint NAME)")
    _check_draw_target(args.draw)
    data, where = read_image(args.image)
    content_type, image = check_image(data, where)
    _quiet_sdk_logs()
    try:
        if args.offline:
            session, endpoint = _offline_target(args)
        else:
            from d2ops import sdk

            session, endpoint = sdk.sagemaker_session(_boto_session(args)), args.endpoint
        answer = invoke(session, endpoint, data, content_type, args.score_threshold)
    except (SdkMissing, EndpointFailed) as exc:
        print(f"d2ops predict: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, EndpointFailed) else 2  # the endpoint's failure, or no SDK to ask it with
    print(json.dumps(answer, indent=1))
    if args.draw is not None:
        try:
            draw(image, answer["detections"]).save(args.draw)
        except OSError as exc:
            raise UsageError(f"--draw {args.draw}: cannot be written ({exc})") from None
        print(f"d2ops predict: {len(answer['detections'])} detection(s) drawn on {args.draw}", file=sys.stderr)
    return 0
