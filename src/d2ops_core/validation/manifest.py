"""``manifest.json``: the schema of a dataset version's manifest (required, defaulted and optional keys).

Unknown keys are errors at every level so a typo (``"max_iters"``) is caught before a
training job silently ignores it. ``manifest_json_schema()`` is what docs/manifest.schema.json
holds.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from d2ops_core import gate as gate_settings
from d2ops_core.validation.codes import Code
from d2ops_core.validation.encoding import encoding_problem, utf8_problem

MANIFEST_FILE = "manifest.json"
MAX_MANIFEST_BYTES = 64 * 1024
# Names and versions become S3 path segments and part of the run id.
SEGMENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")  # s3://, https://, file:/, ...


def unsafe_relative_path(value: str) -> str | None:
    """Why ``value`` is not a safe path relative to the dataset root, or None when it is."""
    if not value:
        return "is empty"
    if "\\" in value:
        return "contains a backslash (use /)"
    if "\x00" in value:
        return "contains a NUL character"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode (it has a lone surrogate escape such as \\ud800)"
    if _URL_SCHEME.match(value):  # "s3://b/x.jpg" would otherwise get "not normalized (write 's3:/b/x.jpg')"
        return "is a URL; write a path relative to the dataset root (files are read from the dataset version only)"
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
    max_class_regression: float | None = Field(
        default=None, ge=0, le=1, description="allowed per-class AP drop below the champion, on any class with at "
                                              "least min_class_instances val instances")
    min_class_instances: int | None = Field(
        default=None, ge=1, le=1_000_000, description="val instances a class needs to be judged per class")
    confidence: float | None = Field(
        default=None, gt=gate_settings.MIN_CONFIDENCE_EXCLUSIVE, lt=gate_settings.MAX_CONFIDENCE_EXCLUSIVE,
        description="two-sided level of the interval of challenger - champion; at least the stack's GateConfidence")
    resamples: int | None = Field(
        default=None, ge=gate_settings.MIN_RESAMPLES, le=gate_settings.MAX_RESAMPLES,
        description="paired-bootstrap resamples of the val images; at least the stack's GateResamples")


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
    def val_named(self) -> bool:
        """The manifest names ``val`` itself: a missing file is then an error, never a derived split."""
        return "val" in self.model_fields_set

    @property
    def images_prefix(self) -> str:
        """``images`` as a prefix ending in exactly one slash."""
        return self.images.rstrip("/") + "/"

    def optional_settings(self) -> dict[str, Any]:
        """The optional keys (defaults applied) later pipeline steps read: task, training, gate."""
        return self.model_dump(mode="json", include={"task", "training", "gate"}, exclude_none=True)


class StackLimits(BaseModel):
    """What the operator's stack allows (template.yaml parameters): a manifest may only tighten these.

    ``min_map``/``max_regression`` are the MinMap/MaxRegression gate parameters; the training
    caps (MaxTrainingIterations, MaxImagesPerBatch) bound what one dataset may make a training
    job cost. A dataset author is not the operator, so a manifest asking for a laxer gate or a
    larger job is an error, never silently clamped: the report names the limit it broke.
    """

    model_config = ConfigDict(frozen=True)

    min_map: float = Field(ge=0, le=1)
    max_regression: float = Field(ge=0, le=1)
    max_iter: int | None = Field(default=None, ge=1, description="cap on training.max_iter (None: schema bound)")
    max_ims_per_batch: int | None = Field(default=None, ge=1, description="cap on training.ims_per_batch")
    # The per-class gate (MaxClassRegression, MinClassInstances); None where a caller sets no such limit.
    max_class_regression: float | None = Field(default=None, ge=0, le=1)
    min_class_instances: int | None = Field(default=None, ge=1)
    # The interval the gate judges (GateConfidence, GateResamples); None where a caller sets no such limit.
    confidence: float | None = Field(default=None, gt=gate_settings.MIN_CONFIDENCE_EXCLUSIVE,
                                     lt=gate_settings.MAX_CONFIDENCE_EXCLUSIVE)
    resamples: int | None = Field(default=None, ge=gate_settings.MIN_RESAMPLES, le=gate_settings.MAX_RESAMPLES)
    # MinComparedImages: the held-out val images an approval needs (no manifest key: a dataset cannot lower it).
    min_compared_images: int | None = Field(default=None, ge=1)

    # Environment variable -> field: template.yaml sets these on the functions that enforce them.
    ENV: ClassVar[dict[str, str]] = {"MIN_MAP": "min_map", "MAX_REGRESSION": "max_regression",
                                     "MAX_TRAINING_ITERATIONS": "max_iter", "MAX_IMAGES_PER_BATCH": "max_ims_per_batch",
                                     "MAX_CLASS_REGRESSION": "max_class_regression",
                                     "MIN_CLASS_INSTANCES": "min_class_instances",
                                     gate_settings.CONFIDENCE_ENV: "confidence",
                                     gate_settings.RESAMPLES_ENV: "resamples",
                                     "MIN_COMPARED_IMAGES": "min_compared_images"}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StackLimits:
        """Read MIN_MAP, MAX_REGRESSION (required) and the optional training caps."""
        return cls.model_validate({field: env[name] for name, field in cls.ENV.items() if env.get(name)})


_N = TypeVar("_N", int, float)


def _above(manifest: _N | None, stack: _N | None) -> bool:
    """The manifest sets a value and the stack a cap, and the value is over the cap."""
    return manifest is not None and stack is not None and manifest > stack


def stack_limit_problems(gate: Gate | None, training: TrainingOverrides,
                         limits: StackLimits) -> list[tuple[Code, str, str]]:
    """Every manifest setting (its gate, its training overrides) laxer than the stack allows: (code, message, path)."""
    problems: list[tuple[Code, str, str]] = []
    if gate is not None and gate.min_map is not None and gate.min_map < limits.min_map:
        problems.append((Code.GATE_MIN_MAP_BELOW_STACK, f"gate.min_map {gate.min_map:g} is below the stack's MinMap "
                         f"{limits.min_map:g}: a manifest may raise the quality bar, not lower it", "gate.min_map"))
    if gate is not None and gate.max_regression is not None and gate.max_regression > limits.max_regression:
        problems.append((Code.GATE_MAX_REGRESSION_ABOVE_STACK, f"gate.max_regression {gate.max_regression:g} is above "
                         f"the stack's MaxRegression {limits.max_regression:g}: a manifest may allow a smaller drop "
                         "below the champion, not a larger one", "gate.max_regression"))
    if gate is not None and _above(gate.max_class_regression, limits.max_class_regression):
        problems.append((Code.GATE_MAX_CLASS_REGRESSION_ABOVE_STACK, f"gate.max_class_regression "
                         f"{gate.max_class_regression:g} is above the stack's MaxClassRegression "
                         f"{limits.max_class_regression:g}: a manifest may allow a smaller per-class drop, not a "
                         "larger one", "gate.max_class_regression"))
    if gate is not None and _above(gate.min_class_instances, limits.min_class_instances):
        problems.append((Code.GATE_MIN_CLASS_INSTANCES_ABOVE_STACK, f"gate.min_class_instances "
                         f"{gate.min_class_instances} is above the stack's MinClassInstances "
                         f"{limits.min_class_instances}: a manifest may judge more classes, not fewer",
                         "gate.min_class_instances"))
    # A stack that sets no interval settings has the defaults (d2ops_core.gate), so it is checked against those.
    stack_confidence = gate_settings.DEFAULT_CONFIDENCE if limits.confidence is None else limits.confidence
    stack_resamples = gate_settings.DEFAULT_RESAMPLES if limits.resamples is None else limits.resamples
    if gate is not None and gate.confidence is not None and gate.confidence < stack_confidence:
        problems.append((Code.GATE_CONFIDENCE_BELOW_STACK, f"gate.confidence {gate.confidence:g} is below the "
                         f"stack's GateConfidence {stack_confidence:g}: a manifest may ask for a wider interval "
                         "(approving less readily), not a narrower one", "gate.confidence"))
    if gate is not None and gate.resamples is not None and gate.resamples < stack_resamples:
        problems.append((Code.GATE_RESAMPLES_BELOW_STACK, f"gate.resamples {gate.resamples} is below the stack's "
                         f"GateResamples {stack_resamples}: a manifest may ask for more resamples (up to "
                         f"{gate_settings.MAX_RESAMPLES}), not fewer", "gate.resamples"))
    if _above(training.max_iter, limits.max_iter):
        problems.append((Code.TRAINING_MAX_ITER_ABOVE_STACK, f"training.max_iter {training.max_iter} is above the "
                         f"stack's MaxTrainingIterations {limits.max_iter}", "training.max_iter"))
    if _above(training.ims_per_batch, limits.max_ims_per_batch):
        problems.append((Code.TRAINING_IMS_PER_BATCH_ABOVE_STACK, f"training.ims_per_batch {training.ims_per_batch} "
                         f"is above the stack's MaxImagesPerBatch {limits.max_ims_per_batch}",
                         "training.ims_per_batch"))
    return problems


def effective_gate(limits: StackLimits, gate: Gate | None) -> tuple[float, float]:
    """(min_map, max_regression) a run is judged by: the stack's, tightened by the manifest's, never loosened.

    Validation already rejects a laxer manifest; taking the stricter value here as well means
    no path (an old run's input, a hand-started execution) can lower the bar.
    """
    min_map, max_regression = limits.min_map, limits.max_regression
    if gate is not None and gate.min_map is not None:
        min_map = max(min_map, gate.min_map)
    if gate is not None and gate.max_regression is not None:
        max_regression = min(max_regression, gate.max_regression)
    return min_map, max_regression


def _stricter(stack: _N | None, manifest: _N | None) -> _N | None:
    if stack is None:
        return manifest
    return stack if manifest is None else min(stack, manifest)


def effective_class_gate(limits: StackLimits, gate: Gate | None) -> tuple[float | None, int | None]:
    """(max_class_regression, min_class_instances) of the per-class gate, tightened like :func:`effective_gate`.

    Both only go down: a smaller margin, and a smaller instance count (more classes judged).
    """
    return (_stricter(limits.max_class_regression, gate.max_class_regression if gate else None),
            _stricter(limits.min_class_instances, gate.min_class_instances if gate else None))


def effective_interval(limits: StackLimits, gate: Gate | None) -> tuple[float, int]:
    """(confidence, resamples) of the interval the gate judges, tightened like :func:`effective_gate`.

    The gate approves only when the interval's lower end clears the tolerance, so a lower confidence (a
    narrower interval) would approve more readily: a manifest may only raise it. More resamples only make
    the ends more precise. A stack that sets neither has d2ops_core.gate's defaults.
    """
    stack_confidence = gate_settings.DEFAULT_CONFIDENCE if limits.confidence is None else limits.confidence
    stack_resamples = gate_settings.DEFAULT_RESAMPLES if limits.resamples is None else limits.resamples
    asked_confidence, asked_resamples = (gate.confidence, gate.resamples) if gate else (None, None)
    return (max(stack_confidence, asked_confidence or stack_confidence),
            max(stack_resamples, asked_resamples or stack_resamples))


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

