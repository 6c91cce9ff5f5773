"""The selection ``d2ops label select`` writes and ``d2ops label export`` reads (docs/labelling.md).

A selection is a directory, self-contained so that export needs no S3 and no endpoint::

    <out>/selection.json            LabelSelection (this module)
    <out>/images/<sha256>.<ext>     each selected image's bytes, as the endpoint received them

- :class:`LabelSelection`: what was selected, from which capture, by which model and with which parameters.
- :class:`SelectedImage`: one image, in rank order: its content hash, where it was captured, the model's
  detections on it (the pre-annotations a labeller corrects) and why it ranked where it did.

Written once (a temporary directory renamed into place), never edited; readers ignore fields they do not know.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from d2ops_core.documents.detections import Detection

SELECTION_FILE = "selection.json"
IMAGES_DIR = "images"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
# The rule terms a rank score is the weighted sum of (docs/labelling.md "How images are ranked").
RankTerm = Literal["uncertainty", "weak_class", "empty", "disagreement", "diversity"]
RANK_TERMS: tuple[RankTerm, ...] = ("uncertainty", "weak_class", "empty", "disagreement", "diversity")


class SelectionError(ValueError):
    """A selection directory that cannot be read (missing, not JSON, not a selection, an image file missing)."""


class CaptureSource(BaseModel):
    """Where the image was captured: the capture file and line, and SageMaker's event id."""

    model_config = ConfigDict(extra="ignore")

    bucket: str | None = Field(None, description="the artifacts bucket the capture file is in")
    key: str = Field(description="the capture file's key (capture/<endpoint>/<variant>/yyyy/mm/dd/hh/<file>.jsonl)")
    line: int = Field(ge=1, description="the record's line in that file, from 1")
    event_id: str = Field(description="eventMetadata.eventId")
    inference_id: str | None = Field(None, description="eventMetadata.inferenceId, when the caller set one")
    inference_time: datetime


class RankReason(BaseModel):
    """One rule term's contribution to an image's rank score: ``weight * value``."""

    model_config = ConfigDict(extra="ignore")

    term: RankTerm
    value: float = Field(description="the term's value for this image, 0-1 (diversity: <= 0, a penalty)")
    weight: float = Field(description="the term's weight in the selection's parameters")
    detail: str = Field(description="what made the value, for a person: e.g. 'car 0.52 near threshold 0.50'")


class SelectedImage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rank: int = Field(ge=1, description="1 = labelled first")
    sha256: str = Field(pattern=SHA256_PATTERN, description="of the image bytes; the file's name and the exclusion key")
    file: str = Field(description="the image's path relative to the selection directory: images/<sha256>.<ext>")
    content_type: str = Field(description="as the caller sent it (image/jpeg, image/png)")
    width: int = Field(gt=0, description="upright pixels (EXIF orientation applied), the boxes' frame")
    height: int = Field(gt=0)
    source: CaptureSource
    detections: list[Detection] = Field(description="the serving model's answer as captured (xyxy pixels, class "
                                                    "names, scores): the pre-annotations")
    score: float = Field(description="the rank score: the sum of the reasons' weight * value")
    reasons: list[RankReason] = Field(description="each rule term that contributed (value != 0)")

    @model_validator(mode="after")
    def _file_is_the_images_own(self) -> SelectedImage:
        # `label export` uploads the file named here: a selection.json edited to name ../../id.jpg (its sha256
        # set to match) must not send a file from outside the selection to a labelling server.
        if self.file != image_file_name(self.sha256, self.content_type):
            raise ValueError(f"file {self.file!r} is not {image_file_name(self.sha256, self.content_type)!r}, "
                             "the image's own name in the selection")
        return self


class SelectionParameters(BaseModel):
    """How the selection was made, so that it can be repeated (the same capture gives the same selection)."""

    model_config = ConfigDict(extra="ignore")

    endpoint: str
    variant: str | None = None
    since: datetime | None = Field(None, description="capture window start (inclusive); None: from the first")
    until: datetime | None = Field(None, description="capture window end (exclusive); None: to the last")
    max_images: int = Field(ge=1)
    weights: dict[str, float] = Field(description="rule term -> weight")
    threshold_margin: float = Field(description="the uncertainty term's width around each class's score threshold")
    weak_classes: list[str] = Field(default_factory=list, description="classes the gate judged weak (the serving "
                                                                      "run's evaluation report)")
    duplicate_distance: float = Field(description="thumbnail distance (d2ops.labelling.selection.thumbnail) at or "
                                                  "below which an image is a near-duplicate of one ranked higher, "
                                                  "and dropped")
    compare_with: str | None = Field(None, description="the model the champion's answers were compared with")


class SelectionCounts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    records: int = Field(ge=0, description="captured records read in the window")
    unreadable: int = Field(0, ge=0, description="capture lines or images skipped (problems names them)")
    duplicates: int = Field(0, ge=0, description="records whose image bytes another record already had")
    excluded: int = Field(0, ge=0, description="images already labelled or in a dataset version")
    near_duplicates: int = Field(0, ge=0, description="candidates dropped as near-duplicates of a selected image")
    candidates: int = Field(0, ge=0, description="distinct images ranked")


class LabelSelection(BaseModel):
    model_config = ConfigDict(extra="ignore")

    schema_version: Literal[1] = 1
    created_at: datetime
    model_run_id: str | None = Field(None, description="the run whose model served (and answered) the images")
    class_names: list[str] = Field(description="the serving model's classes, in label order")
    parameters: SelectionParameters
    counts: SelectionCounts
    problems: list[str] = Field(default_factory=list, description="one line per skipped item, at most 20")
    images: list[SelectedImage] = Field(description="in rank order")


def image_file_name(sha256: str, content_type: str) -> str:
    """``images/<sha256>.<ext>``: the extension from the content type (jpg, png, else bin)."""
    media = content_type.split(";")[0].strip().lower()
    ext = {"image/jpeg": "jpg", "image/jpg": "jpg", "image/png": "png"}.get(media, "bin")
    return f"{IMAGES_DIR}/{sha256}.{ext}"


def read_selection(directory: str | Path) -> LabelSelection:
    """The selection in ``directory``, every image file present; SelectionError names what is wrong."""
    root = Path(directory)
    path = root / SELECTION_FILE
    try:
        selection = LabelSelection.model_validate_json(path.read_bytes())  # bounded nesting, unlike json.loads
    except FileNotFoundError as exc:
        raise SelectionError(f"{path}: missing (not a selection directory; run d2ops label select)") from exc
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise SelectionError(f"{path}: not JSON ({first['msg']})") from None
        where = ".".join(str(p) for p in first["loc"])
        raise SelectionError(f"{path}: not a selection ({where}: {first['msg']})") from None
    for image in selection.images:
        if not (root / image.file).is_file():
            raise SelectionError(f"{root / image.file}: missing (image rank {image.rank}, sha256 {image.sha256})")
    return selection
