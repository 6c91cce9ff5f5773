"""The round trip through a real Label Studio: export a selection as pre-annotated tasks, read finished labels back.

``d2ops label export`` (:func:`export_selection`) creates or reuses a project, by title, whose labelling
config has exactly the dataset's classes as ``RectangleLabels``; uploads each selected image as a file
(Label Studio stores it: nothing needs our servers later) and adds the serving model's detections as a
prediction (``model_version`` = the serving run), so labellers correct boxes rather than draw them. Each task's
data carries ``d2ops_sha256``; a re-run uploads only images the project does not already hold.

``d2ops label import`` reads back (:func:`read_labels`) only **completed** tasks (Label Studio's own
``is_labeled``: the project's required number of annotations reached) and only their non-cancelled
(non-skipped) annotations, and converts the boxes (percent of the image's size) to COCO pixels.
Conflicts between annotators, the documented rule (docs/labelling.md):

1. An annotation marked *ground truth* in Label Studio wins (several: rules 2 and 3 among them alone).
2. Otherwise annotations that **agree** (the same number of boxes, matched one to one by class with
   IoU >= ``AGREE_IOU``) are one answer; the most recently updated one is taken.
3. Otherwise the task is a **conflict**: left out of the new version and reported (task, annotation ids,
   annotators), so no disputed box trains a model; resolve it in Label Studio and import again.

Everything goes through label-studio-sdk, except uploading an image file and downloading it back, which
the SDK has no method for: those two requests use the SDK's own authenticated HTTP client.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import quoteattr

import httpx
from label_studio_sdk import LabelStudio
from label_studio_sdk.core.api_error import ApiError

from d2ops.labelling.documents import LabelSelection, SelectedImage, SelectionError, read_selection
from d2ops_core.images import ImageRejected, load_rgb

DEFAULT_TOKEN_ENV = "LABEL_STUDIO_API_KEY"  # the SDK's own default variable
CONTROL = "label"  # the RectangleLabels control's name in the config we write
OBJECT = "image"  # the Image object's name, and the task data key it shows
AGREE_IOU = 0.5
SHA_KEY = "d2ops_sha256"
# An uploaded file's name as Label Studio stores it: "<8 hex>-<the name we sent>", ours "<sha256>.<ext>".
_UPLOADED = re.compile(r"(?:^|/)[0-9a-f]{8}-(?P<sha>[0-9a-f]{64})\.(?:jpg|png|bin)$")
# Region types that are not an axis-aligned box: a project edited to draw them cannot become COCO boxes.
_NOT_BOXES = frozenset({"polygon", "brush", "ellipse", "keypoint"})

Progress = Callable[[str], None]


class LabellingError(ValueError):
    """A one-line reason naming the item (server, project, task, image) that stops an export or an import."""


def _quiet(_: str) -> None:
    pass


# --- connecting -----------------------------------------------------------------------------------------


class Server:
    """A Label Studio server reached with a token, every failure a LabellingError naming the server."""

    def __init__(self, url: str, token: str | None, token_env: str = DEFAULT_TOKEN_ENV, timeout: float = 60) -> None:
        if not re.match(r"^https?://[^/]+", url):
            raise LabellingError(f"{url!r} is not a Label Studio URL (http://HOST:PORT)")
        if not token:
            raise LabellingError(f"no Label Studio API token: set {token_env} (Label Studio: Account & Settings, "
                                 "Access Token)")
        self.url = url.rstrip("/")
        self.token_env = token_env
        self.client = self.call("connect", LabelStudio, base_url=self.url, api_key=token, timeout=timeout)
        self.user = self.call("check the token", self.client.users.whoami)

    def call(self, what: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, an SDK call; its failure a LabellingError saying what it was doing."""
        try:
            return fn(*args, **kwargs)
        except ApiError as exc:
            raise self._api_error(what, exc) from None
        except httpx.TransportError as exc:
            raise LabellingError(f"Label Studio at {self.url} cannot be reached ({what}): "
                                 f"{type(exc).__name__}: {exc}") from None

    def _api_error(self, what: str, exc: ApiError) -> LabellingError:
        detail = exc.body.get("detail") if isinstance(exc.body, dict) else exc.body
        if exc.status_code == 401:
            return LabellingError(f"Label Studio at {self.url} refused the token in {self.token_env} (HTTP 401, "
                                  f"expired or invalid: {detail}); create a new one under Account & Settings")
        if exc.status_code == 403:
            return LabellingError(f"Label Studio at {self.url}: the token's user may not {what} (HTTP 403: {detail})")
        return LabellingError(f"Label Studio at {self.url} failed to {what}: HTTP {exc.status_code}: "
                              f"{str(detail)[:300]}")

    def raw(self, what: str, path: str, *, method: str = "GET", **kwargs: Any) -> httpx.Response:
        """A request the SDK has no method for, through its own authenticated client."""
        http = self.client._client_wrapper.httpx_client
        response: httpx.Response = self.call(what, http.request, path.lstrip("/"), method=method, **kwargs)
        if response.status_code >= 400:
            body: Any
            try:
                body = response.json()
            except ValueError:
                body = response.text[:300]
            raise self._api_error(what, ApiError(status_code=response.status_code, body=body))
        return response


# --- the project --------------------------------------------------------------------------------------------


def label_config(classes: Sequence[str]) -> str:
    """The labelling config: one image, one RectangleLabels control with exactly ``classes``."""
    labels = "".join(f"    <Label value={quoteattr(c)}/>\n" for c in classes)
    return (f'<View>\n  <Image name="{OBJECT}" value="${OBJECT}"/>\n'
            f'  <RectangleLabels name="{CONTROL}" toName="{OBJECT}">\n{labels}  </RectangleLabels>\n</View>\n')


@dataclass(frozen=True)
class BoxControl:
    from_name: str
    to_name: str
    data_key: str


def check_project_classes(title: str, parsed: dict[str, Any] | None, classes: Sequence[str]) -> BoxControl:
    """The project's one RectangleLabels control, whose labels must be exactly ``classes``; else LabellingError.

    Other controls may be there (a comment box, even PolygonLabels): a task that uses one for a region is
    refused at import, naming the task (:func:`boxes_of`)."""
    controls = {name: c for name, c in (parsed or {}).items() if isinstance(c, dict)}
    boxes = {name: c for name, c in controls.items() if c.get("type") == "RectangleLabels"}
    if len(boxes) != 1:
        found = ", ".join(sorted(f"{c.get('type')} {n!r}" for n, c in controls.items())) or "no control"
        raise LabellingError(f"project {title!r}: its labelling config has {found}; d2ops needs exactly one "
                             "RectangleLabels control (boxes; PolygonLabels or BrushLabels regions cannot become "
                             "COCO boxes)")
    name, control = next(iter(boxes.items()))
    labels = [str(label) for label in control.get("labels", [])]
    missing = sorted(set(classes) - set(labels))
    extra = sorted(set(labels) - set(classes))
    if missing or extra:
        raise LabellingError(f"project {title!r}: labels do not match the dataset's classes (missing {missing}, "
                             f"not a dataset class {extra}); fix the project's labelling config or use another "
                             "--project")
    to_names = control.get("to_name") or [OBJECT]
    inputs = control.get("inputs") or [{"value": OBJECT}]
    return BoxControl(from_name=name, to_name=str(to_names[0]), data_key=str(inputs[0].get("value", OBJECT)))


def find_project(server: Server, title: str) -> Any | None:
    """The project titled ``title`` (exactly: Label Studio's filter also matches substrings), or None."""
    found = [p for p in server.call("list projects", lambda: list(server.client.projects.list(title=title)))
             if p.title == title]
    if len(found) > 1:
        raise LabellingError(f"Label Studio at {server.url} has {len(found)} projects titled {title!r} (ids "
                             f"{sorted(p.id for p in found)}): rename all but one")
    return found[0] if found else None


def ensure_project(server: Server, title: str, classes: Sequence[str]) -> tuple[Any, BoxControl, bool]:
    """(project, its box control, created?): the project titled ``title``, created with ``classes`` if absent."""
    project = find_project(server, title)
    created = project is None
    if project is None:
        project = server.call("create the project", server.client.projects.create,
                              title=title, label_config=label_config(classes),
                              description="Images the model was least sure of (d2ops label export); correct the "
                                          "pre-annotated boxes, then d2ops label import.")
        project = server.call("read the project", server.client.projects.get, project.id)
    control = check_project_classes(title, project.parsed_label_config, classes)
    return project, control, created


def _tasks(server: Server, project_id: int) -> list[Any]:
    return list(server.call("list tasks", lambda: list(server.client.tasks.list(project=project_id, fields="all"))))


def task_sha256(task: Any) -> str | None:
    """The image's SHA-256 recorded in the task's data, or read from the uploaded file's name (a re-run after
    an export that stopped between uploading and recording it)."""
    data = task.data if isinstance(task.data, dict) else {}
    sha = data.get(SHA_KEY)
    if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
        return sha
    match = _UPLOADED.search(str(data.get(OBJECT, "")))
    return match.group("sha") if match else None


# --- export ---------------------------------------------------------------------------------------------------


def prediction_result(image: SelectedImage, control: BoxControl) -> list[dict[str, Any]]:
    """The model's detections on ``image`` as Label Studio regions (percent of the upright image's size)."""
    w, h = image.width, image.height
    result = []
    for i, det in enumerate(image.detections):
        x1, y1, x2, y2 = (max(0.0, min(v, lim)) for v, lim in zip(det.box, (w, h, w, h), strict=True))
        result.append({
            "id": f"d{i}", "from_name": control.from_name, "to_name": control.to_name, "type": "rectanglelabels",
            "original_width": w, "original_height": h, "image_rotation": 0, "score": det.score,
            "value": {"x": 100 * x1 / w, "y": 100 * y1 / h, "width": 100 * (x2 - x1) / w,
                      "height": 100 * (y2 - y1) / h, "rotation": 0, "rectanglelabels": [det.class_name]},
        })
    return result


@dataclass
class ExportSummary:
    project_id: int
    project_created: bool
    uploaded: int = 0
    already_there: int = 0
    predictions: int = 0
    task_ids: list[int] = field(default_factory=list)


def check_selection(selection_dir: str, selection: LabelSelection) -> dict[str, bytes]:
    """Each selected image's bytes, after checking they are still the captured ones and still decode."""
    from pathlib import Path

    out: dict[str, bytes] = {}
    for image in selection.images:
        path = Path(selection_dir) / image.file
        where = f"selected image rank {image.rank} ({path})"
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != image.sha256:
            raise LabellingError(f"{where}: its bytes no longer have the selection's sha256 {image.sha256}")
        try:
            load_rgb(io.BytesIO(data), where, verify=True)
        except ImageRejected as exc:
            raise LabellingError(f"{where} no longer decodes: {exc.message}") from None
        unknown = sorted({d.class_name for d in image.detections} - set(selection.class_names))
        if unknown:
            raise LabellingError(f"{where}: detections of classes {unknown} that are not the selection's classes "
                                 f"{selection.class_names}")
        out[image.sha256] = data
    return out


def export_selection(server: Server, project_title: str, selection_dir: str, *,
                     progress: Progress = _quiet) -> ExportSummary:
    """Upload the selection in ``selection_dir`` to the project (created if absent); idempotent by sha256."""
    try:
        selection = read_selection(selection_dir)
    except SelectionError as exc:
        raise LabellingError(str(exc)) from None
    images = check_selection(selection_dir, selection)
    project, control, created = ensure_project(server, project_title, selection.class_names)
    summary = ExportSummary(project_id=project.id, project_created=created)
    progress(f"project {project_title!r} (id {project.id}) {'created' if created else 'reused'} at {server.url}")
    existing = {}
    for task in _tasks(server, project.id):
        sha = task_sha256(task)
        if sha:
            existing[sha] = task
    model_version = selection.model_run_id or "unknown"
    for image in selection.images:
        task = existing.get(image.sha256)
        if task is None:
            name = image.file.rsplit("/", 1)[-1]  # images/<sha256>.<ext>: the name keeps the sha256 in Label Studio
            response = server.raw(f"upload {image.file}", f"api/projects/{project.id}/import", method="POST",
                                  params={"return_task_ids": True},
                                  files={"file": (name, images[image.sha256], image.content_type)})
            ids = response.json().get("task_ids") or []
            if len(ids) != 1:
                raise LabellingError(f"Label Studio at {server.url} made {len(ids)} tasks of {image.file}, not 1")
            task = server.call("read the new task", server.client.tasks.get, str(ids[0]))
            summary.uploaded += 1
        else:
            summary.already_there += 1
        data = task.data if isinstance(task.data, dict) else {}
        if data.get(SHA_KEY) != image.sha256:
            record = {**data, SHA_KEY: image.sha256, "d2ops_rank": image.rank,
                      "d2ops_capture": f"{image.source.key}:{image.source.line}"}
            server.call("record the image's sha256", server.client.tasks.update, str(task.id), data=record)
        if image.detections and not (task.total_predictions or 0):
            server.call("add the model's boxes", server.client.predictions.create, task=task.id,
                        result=prediction_result(image, control), model_version=model_version,
                        score=min(d.score for d in image.detections))
            summary.predictions += 1
        summary.task_ids.append(task.id)
    progress(f"{summary.uploaded} images uploaded, {summary.already_there} already in the project, "
             f"{summary.predictions} pre-annotated by model {model_version}")
    return summary


# --- import -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    class_name: str
    bbox: tuple[float, float, float, float]  # COCO [x, y, width, height] in upright pixels


@dataclass(frozen=True)
class LabelledImage:
    task_id: int
    sha256: str
    data: bytes
    extension: str  # "jpg" or "png", from the content
    width: int
    height: int
    boxes: tuple[Box, ...]
    annotation_id: int


@dataclass
class Conflict:
    task_id: int
    annotation_ids: list[int]
    annotators: list[str]
    why: str

    def describe(self) -> str:
        return (f"task {self.task_id}: annotations {self.annotation_ids} by {', '.join(self.annotators)} "
                f"disagree ({self.why}); left out")


@dataclass
class ReadBack:
    labelled: list[LabelledImage] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    pending: int = 0  # not completed yet (no annotation, or fewer than the project's overlap)
    skipped: int = 0  # every annotation cancelled (the labeller pressed Skip)
    agreed_multi: int = 0  # tasks with several annotations that agreed


def boxes_of(result: Iterable[dict[str, Any]], control: BoxControl, classes: Sequence[str], width: int,
             height: int, where: str) -> tuple[Box, ...]:
    """COCO boxes from one annotation's ``result``; a polygon, a brush stroke, a rotated box or an unknown
    class is a LabellingError naming ``where``. Regions of other controls (a comment, a choice) are ignored."""
    boxes = []
    for region in result:
        kind = str(region.get("type", ""))
        if kind in _NOT_BOXES or (kind.endswith("labels") and kind != "rectanglelabels"):
            raise LabellingError(f"{where}: a {kind} region where a box (rectanglelabels) is expected; d2ops trains "
                                 "on boxes: redraw it as a rectangle")
        if kind != "rectanglelabels" or region.get("from_name") != control.from_name:
            continue
        value = region.get("value") or {}
        if abs(float(value.get("rotation") or 0)) > 1e-6:
            raise LabellingError(f"{where}: a box rotated by {value.get('rotation')} degrees; COCO boxes are "
                                 "axis-aligned: straighten it")
        labels = value.get("rectanglelabels") or []
        if len(labels) != 1 or labels[0] not in classes:
            raise LabellingError(f"{where}: a box labelled {labels}, not one of the dataset's classes {list(classes)}")
        ow, oh = region.get("original_width"), region.get("original_height")
        if ow is not None and oh is not None and (int(ow), int(oh)) != (width, height):
            raise LabellingError(f"{where}: boxes drawn on a {ow}x{oh} image, but the image is {width}x{height} "
                                 "upright (EXIF orientation applied)")
        try:
            x, y, w, h = (float(value[k]) for k in ("x", "y", "width", "height"))
        except (KeyError, TypeError, ValueError):
            raise LabellingError(f"{where}: a box without numeric x, y, width, height: {value}") from None
        x1, y1 = max(0.0, x * width / 100), max(0.0, y * height / 100)
        x2, y2 = min(float(width), (x + w) * width / 100), min(float(height), (y + h) * height / 100)
        if x2 - x1 <= 0 or y2 - y1 <= 0:
            raise LabellingError(f"{where}: a box of no size inside the image ({value})")
        boxes.append(Box(str(labels[0]), (round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2))))
    return tuple(boxes)


def _iou(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    ix = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def disagreement(a: Sequence[Box], b: Sequence[Box]) -> str | None:
    """None when the two box sets agree (same size, matched one to one by class at IoU >= AGREE_IOU), else why."""
    if len(a) != len(b):
        return f"{len(a)} boxes vs {len(b)}"
    free = list(b)
    for box in sorted(a, key=lambda x: -x.bbox[2] * x.bbox[3]):
        best = max((c for c in free if c.class_name == box.class_name), key=lambda c: _iou(box.bbox, c.bbox),
                   default=None)
        if best is None or _iou(box.bbox, best.bbox) < AGREE_IOU:
            return f"no match for a {box.class_name} box at {[round(v) for v in box.bbox]}"
        free.remove(best)
    return None


def _download(server: Server, task: Any, control: BoxControl) -> bytes:
    data = task.data if isinstance(task.data, dict) else {}
    url = str(data.get(control.data_key, ""))
    if not url:
        raise LabellingError(f"task {task.id}: no image in its data key {control.data_key!r}")
    if "://" in url and not url.startswith(server.url):  # cloud storage or another host: not our upload
        raise LabellingError(f"task {task.id}: its image {url} is not stored in Label Studio; export images with "
                             "d2ops label export (uploaded files)")
    path = url[len(server.url):] if url.startswith(server.url) else url
    return server.raw(f"download task {task.id}'s image", path).content


def read_labels(server: Server, project_title: str, classes: Sequence[str], *,
                progress: Progress = _quiet) -> ReadBack:
    """The completed, non-skipped tasks of the project as labelled images (module docstring: the rules)."""
    project = find_project(server, project_title)
    if project is None:
        raise LabellingError(f"Label Studio at {server.url} has no project titled {project_title!r}")
    control = check_project_classes(project_title, project.parsed_label_config, classes)
    out = ReadBack()
    tasks = _tasks(server, project.id)
    for task in tasks:
        annotations = [a for a in (task.annotations or []) if isinstance(a, dict)]
        kept = [a for a in annotations if not a.get("was_cancelled")]
        if not kept:
            if annotations:
                out.skipped += 1
            else:
                out.pending += 1
            continue
        if not task.is_labeled:
            out.pending += 1
            continue
        data = _download(server, task, control)
        sha = hashlib.sha256(data).hexdigest()
        where_image = f"task {task.id} (image {sha[:12]})"
        recorded = task_sha256(task)
        if recorded and recorded != sha:
            raise LabellingError(f"{where_image}: Label Studio's file is not the exported image (sha256 {recorded})")
        try:
            image = load_rgb(io.BytesIO(data), where_image, verify=True)
        except ImageRejected as exc:
            raise LabellingError(f"{where_image} no longer decodes: {exc.message}") from None
        width, height = image.size
        answers = [(a, boxes_of(a.get("result") or [], control, classes, width, height,
                                f"task {task.id} annotation {a.get('id')}")) for a in kept]
        truth = [x for x in answers if x[0].get("ground_truth")]
        chosen = truth[0] if len(truth) == 1 else None
        if chosen is None:
            candidates = truth or answers
            why = next((d for x in candidates[1:] if (d := disagreement(candidates[0][1], x[1])) is not None), None)
            if why is not None:
                out.conflicts.append(Conflict(task.id, [int(a["id"]) for a, _ in candidates],
                                              [str(a.get("created_username") or a.get("completed_by")).strip()
                                               for a, _ in candidates], why))
                continue
            chosen = max(candidates, key=lambda x: str(x[0].get("updated_at") or ""))
            if len(candidates) > 1:
                out.agreed_multi += 1
        extension = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "jpg"
        out.labelled.append(LabelledImage(task_id=task.id, sha256=sha, data=data, extension=extension, width=width,
                                          height=height, boxes=chosen[1], annotation_id=int(chosen[0]["id"])))
    progress(f"project {project_title!r}: {len(tasks)} tasks, {len(out.labelled)} completed, {out.skipped} skipped, "
             f"{out.pending} not completed, {len(out.conflicts)} conflicts")
    return out
