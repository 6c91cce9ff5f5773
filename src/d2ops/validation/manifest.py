"""``manifest.json``: the schema of a dataset version's manifest (required, defaulted and optional keys).

Unknown keys are errors at every level so a typo (``"max_iters"``) is caught before a
training job silently ignores it. ``manifest_json_schema()`` is what docs/manifest.schema.json
holds.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from d2ops.validation.codes import Code
from d2ops.validation.encoding import encoding_problem, utf8_problem

MANIFEST_FILE = "manifest.json"
MAX_MANIFEST_BYTES = 64 * 1024
# Names and versions become S3 path segments and part of the run id.
SEGMENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def unsafe_relative_path(value: str) -> str | None:
    """Why ``value`` is not a safe path relative to the dataset root, or None when it is."""
    if not value:
        return "is empty"
    if "\\" in value:
        return "contains a backslash (use /)"
    if "\x00" in value:
        return "contains a NUL character"
    if value.startswith("/") or re.match(r"^[A-Za-z]:", value):
        return "is absolute"
    segments = value.split("/")
    if ".." in segments:
        return "contains '..'"
    if posixpath.normpath(value).startswith("../"):
        return "escapes the dataset"
    # S3 keys are literal: "train/./a.jpg" or "train//a.jpg" name no uploaded object even though a
    # file system would resolve them, so they would pass locally and fail in the pipeline.
    if "." in segments or "" in segments[:-1]:
        return f"is not normalized (write {posixpath.normpath(value)!r})"
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TrainingOverrides(_Strict):
    """Bounded training settings a dataset may ask for; the pipeline's defaults apply otherwise."""

    model: str | None = Field(default=None, min_length=1, max_length=128, description="model or config name")
    max_iter: int | None = Field(default=None, ge=1, le=200_000)
    ims_per_batch: int | None = Field(default=None, ge=1, le=512)
    base_lr: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)


class Gate(_Strict):
    """Quality-gate thresholds (AP as a fraction in [0, 1])."""

    min_map: float | None = Field(default=None, ge=0, le=1, description="challenger primary AP must reach this")
    max_regression: float | None = Field(default=None, ge=0, le=1, description="allowed AP drop below the champion")


class Manifest(_Strict):
    name: str = Field(pattern=SEGMENT_PATTERN)
    version: str = Field(pattern=SEGMENT_PATTERN)
    format: Literal["coco"]
    train: str = Field(description="train split annotations, relative to the dataset root")
    val: str = Field(default="annotations/val.json", description="val split annotations, relative to the dataset root")
    images: str = Field(default="images/", description="directory COCO file_name values are relative to")
    task: Literal["detection", "instance_segmentation"] = "detection"
    training: TrainingOverrides = TrainingOverrides()
    gate: Gate | None = None

    @field_validator("train", "val", "images")
    @classmethod
    def _relative(cls, value: str) -> str:
        problem = unsafe_relative_path(value)
        if problem:
            raise ValueError(f"path {value!r} {problem}")
        return value

    @property
    def images_prefix(self) -> str:
        """``images`` as a prefix ending in exactly one slash."""
        return self.images.rstrip("/") + "/"

    def optional_settings(self) -> dict[str, Any]:
        """The optional keys (defaults applied) later pipeline steps read: task, training, gate."""
        return self.model_dump(mode="json", include={"task", "training", "gate"}, exclude_none=True)


def manifest_json_schema() -> dict[str, Any]:
    return Manifest.model_json_schema()


def parse_manifest(raw: bytes) -> tuple[Manifest | None, list[tuple[Code, str, str | None]]]:
    """Parse manifest bytes into a Manifest, or the problems as (code, message, key path) triples."""
    if len(raw) > MAX_MANIFEST_BYTES:
        return None, [(Code.FILE_UNREADABLE, f"manifest is {len(raw)} bytes, more than {MAX_MANIFEST_BYTES}", None)]
    if not raw.strip():
        return None, [(Code.JSON_MALFORMED, "manifest is empty", None)]
    problem = encoding_problem(raw) or utf8_problem(raw)
    if problem:
        return None, [(Code.JSON_MALFORMED, f"manifest {problem}", None)]
    try:
        return Manifest.model_validate_json(raw), []
    except ValidationError as exc:
        problems: list[tuple[Code, str, str | None]] = []
        for err in exc.errors(include_url=False):
            path = ".".join(str(p) for p in err["loc"]) or None
            if err["type"] == "json_invalid":
                problems.append((Code.JSON_MALFORMED, f"manifest is not valid JSON: {err['msg']}", None))
            elif err["type"] == "missing":
                problems.append((Code.MANIFEST_KEY_MISSING, f"required key {path!r} is missing", path))
            elif err["type"] == "extra_forbidden":
                problems.append((Code.MANIFEST_KEY_UNKNOWN,
                                 f"unknown key {path!r} (allowed keys: docs/dataset-format.md)", path))
            elif err["type"] == "model_type" and not err["loc"]:
                problems.append((Code.MANIFEST_VALUE_INVALID, "manifest must be a JSON object", None))
            else:
                problems.append((Code.MANIFEST_VALUE_INVALID, f"{path}: {err['msg']} (got {err.get('input')!r})", path))
        return None, problems

