"""The model artifact every trainer writes and evaluation and serving load.

Layout and signature are documented in docs/model-artifact.md. This module needs torch (to
load TorchScript) and pydantic, never a training framework.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch
import torchvision  # noqa: F401  registers torchvision::nms & co., which exported detectors call
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from d2ops_core.dataset_identity import DatasetVersion
from d2ops_core.documents.evaluation import ModelEvaluation
from d2ops_core.score_thresholds import DEFAULT_SCORE_THRESHOLD
from model_code.archive import (  # noqa: F401  re-exported: the artifact's names in one place
    MAX_ARCHIVE_MEMBERS,
    MAX_EXTRACTED_BYTES,
    ArtifactError,
    extract_archive,
    pack_directory,
    safe_extract,
)
from model_code.model_forms import (
    FORM_FILES,
    AotiDevice,
    Detector,
    Form,
    FormError,
    choose_form,
    load_compiled,
)
from model_code.torchscript_device import retarget

MODEL_FILE = "model.pt"
# torch.jit.trace bakes the device of every tensor the traced code creates into the graph, so a
# detectron2 trace taken on CPU fails on CUDA ("Expected all tensors to be on the same device"), and
# loading any trace with map_location="cuda" moves the CPU tensors its image-size arithmetic needs.
# An export on a GPU host therefore also writes a trace taken on cuda:0, which serving on a GPU loads
# as saved (measured on an H100: docs/benchmarks.md, "GPU").
CUDA_MODEL_FILE = "model.cuda.pt"
TRACED_CUDA_DEVICE = "cuda:0"
METADATA_FILE = "metadata.json"
EVALUATION_FILE = "evaluation.json"
# What the model trained on: the lowercase hex SHA-256 of each training image's bytes, one a line, sorted,
# unique. The evaluation job scores champion and challenger only on val images neither trained on
# (model_code.evaluation.held_out); an artifact without the file cannot say, and the gate asks a person.
TRAINING_IMAGES_FILE = "training_images.txt"
_SHA256_LINE = re.compile(r"^[0-9a-f]{64}$")
REPORT_DIR = "report"
CHECKPOINT_DIR = "checkpoint"
# The training job's other archive: SageMaker packs SM_OUTPUT_DATA_DIR as output.tar.gz next to
# model.tar.gz (same S3 prefix). The fine-tuning checkpoint goes there, not into the artifact every
# endpoint instance downloads (for a resnet18 detector it doubled model.tar.gz, 104 MB -> 209 MB).
OUTPUT_ARCHIVE = "output.tar.gz"

Task = Literal["detection", "instance_segmentation"]
Framework = Literal["torchvision", "detectron2"]


class NativeCheckpoint(BaseModel):
    """Where the framework-native weights for fine-tuning are: files inside the job's output.tar.gz."""

    model_config = ConfigDict(extra="forbid")
    archive: Literal["output.tar.gz"] = Field(
        default="output.tar.gz", description="sibling of model.tar.gz under the training job's S3 output path")
    files: list[str] = Field(min_length=1, description="paths inside the archive, e.g. checkpoint/model_final.pth")
    bytes: int = Field(ge=0, description="their total size")


class InitialWeights(BaseModel):
    """The checkpoint training started from (the job's `pretrained` channel), so a model can be traced
    to the exact weights it was fine-tuned from."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="the file as the training job saw it, e.g. /opt/ml/input/data/pretrained/x.pkl")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="the file's SHA-256, as the job's log prints it")
    bytes: int = Field(ge=0, description="the file's size")


class ArtifactMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    framework: Framework
    task: Task
    model: str = Field(description="architecture, e.g. fasterrcnn_resnet18_fpn or a model-zoo config name")
    class_names: list[str] = Field(min_length=1)
    category_ids: list[int] = Field(min_length=1, description="dataset COCO category id of each label index")
    input_format: Literal["RGB"] = "RGB"
    training_job: str | None = None
    dataset: DatasetVersion | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    checkpoint: NativeCheckpoint | None = None
    initial_weights: InitialWeights | None = Field(
        default=None, description="the pretrained checkpoint training started from; None: from scratch")
    score_thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="class name -> the score the server keeps a detection of it from by default: the best F1 at "
                    "IoU 0.5 on val (model_code/evaluation/thresholds.py); empty in artifacts exported before them")
    forms: list[Form] = Field(
        default_factory=lambda: list[Form](["torchscript"]),
        description="the forms of the detector the artifact holds (model_code/model_forms.py); absent in artifacts "
                    "exported before them: TorchScript only")
    export_problems: dict[str, str] = Field(
        default_factory=dict, description="form -> why the export step could not write it (the call that stopped it)")
    aoti_device: AotiDevice | None = Field(
        default=None, description="the device type the AOTInductor package (model.aoti.pt2) was compiled for")
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @model_validator(mode="after")
    def _forms_line_up(self) -> ArtifactMetadata:
        if "torchscript" not in self.forms or len(set(self.forms)) != len(self.forms):
            raise ValueError(f"forms must hold torchscript once and each form at most once: {self.forms}")
        if ("aoti" in self.forms) != (self.aoti_device is not None):
            raise ValueError("aoti_device names the AOTInductor package's device exactly when forms holds aoti")
        return self

    @model_validator(mode="after")
    def _labels_line_up(self) -> ArtifactMetadata:
        if len(self.class_names) != len(self.category_ids):
            raise ValueError(
                f"class_names has {len(self.class_names)} entries but category_ids has {len(self.category_ids)}"
            )
        if len(set(self.category_ids)) != len(self.category_ids):
            raise ValueError("category_ids must be unique")
        unknown = sorted(set(self.score_thresholds) - set(self.class_names))
        if unknown:
            raise ValueError(f"score_thresholds names classes the model does not have: {unknown}")
        bad = {name: v for name, v in self.score_thresholds.items() if not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"score_thresholds must be scores in [0, 1]: {bad}")
        return self

    def score_threshold(self, label: int) -> float:
        """The default threshold of label index ``label``: its own, else DEFAULT_SCORE_THRESHOLD."""
        return self.score_thresholds.get(self.class_names[label], DEFAULT_SCORE_THRESHOLD)

    @property
    def has_masks(self) -> bool:
        return self.task == "instance_segmentation"


@dataclass
class LoadedDetector:
    module: Detector  # a ScriptModule, or a loaded model.pt2 / model.aoti.pt2 with the same call
    metadata: ArtifactMetadata
    path: Path
    evaluation: ModelEvaluation | None = None
    form: Form = "torchscript"
    _tempdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)
    _training_images: tuple[frozenset[str] | None] | None = field(default=None, repr=False)

    @property
    def class_names(self) -> list[str]:
        return self.metadata.class_names

    @property
    def training_images(self) -> frozenset[str] | None:
        """SHA-256s of the images it trained on (TRAINING_IMAGES_FILE); None: an artifact from before the list.

        Read on first use, not by every serving worker (a million images is a 65 MB file, ~150 MB as a
        set); a malformed file is an ArtifactError naming the line.
        """
        if self._training_images is None:
            self._training_images = (read_training_images(self.path),)
        return self._training_images[0]


def save_artifact(
    directory: Path | str,
    module: torch.jit.ScriptModule,
    metadata: ArtifactMetadata,
    *,
    evaluation: ModelEvaluation | None = None,
    cuda_module: torch.jit.ScriptModule | None = None,
) -> Path:
    """Write ``model.pt`` and ``metadata.json`` (and ``evaluation.json``, and a detectron2 export's
    CUDA trace ``model.cuda.pt``) into ``directory``.

    Files are written under a temporary name and renamed, so a crash never leaves a
    half-written model next to valid metadata.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp_model = out / (MODEL_FILE + ".tmp")
    torch.jit.save(module, str(tmp_model))
    os.replace(tmp_model, out / MODEL_FILE)
    if cuda_module is not None:
        tmp_cuda = out / (CUDA_MODEL_FILE + ".tmp")
        torch.jit.save(cuda_module, str(tmp_cuda))
        os.replace(tmp_cuda, out / CUDA_MODEL_FILE)
    write_json(out / METADATA_FILE, metadata.model_dump(mode="json"))
    if evaluation is not None:
        write_json(out / EVALUATION_FILE, evaluation.model_dump(mode="json", exclude_none=True))
    return out


def write_json(path: Path, document: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=True))
    os.replace(tmp, path)


pack_artifact = pack_directory  # a model directory as SageMaker packs it: model.tar.gz, files at its root


def read_metadata(directory: Path | str) -> ArtifactMetadata:
    path = Path(directory) / METADATA_FILE
    try:
        return ArtifactMetadata.model_validate_json(path.read_bytes())
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path}: missing; not a d2ops model artifact") from exc
    except OSError as exc:  # a directory, unreadable: one line naming it, not a traceback at start-up
        raise ArtifactError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    except ValidationError as exc:  # one line: the serving start-up log and `d2ops serve` show it as is
        raise ArtifactError(f"{path}: invalid metadata: {_problems(exc)}") from exc


def _problems(exc: ValidationError) -> str:
    """pydantic's errors as one line, each naming the field (``metrics.bbox_AP: ...``)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'the document'}: {e['msg']}"
                     for e in exc.errors(include_url=False))


def read_evaluation(directory: Path | str) -> ModelEvaluation | None:
    """The artifact's ``evaluation.json`` (the model on its own val split), or None when it has none.

    An edited or truncated file is an ArtifactError naming the file and each bad field, never a
    KeyError later in whoever reads the numbers.
    """
    path = Path(directory) / EVALUATION_FILE
    if not path.is_file():
        return None
    try:
        return ModelEvaluation.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ArtifactError(f"{path}: not a model evaluation: {_problems(exc)}") from exc


def write_training_images(directory: Path | str, sha256s: Iterable[str]) -> Path:
    """Write TRAINING_IMAGES_FILE: the hex SHA-256s, lowercased, sorted and unique, one a line."""
    lines = sorted({s.lower() for s in sha256s})
    bad = next((s for s in lines if not _SHA256_LINE.match(s)), None)
    if bad is not None:
        raise ValueError(f"{bad[:80]!r} is not a hex SHA-256")
    path = Path(directory) / TRAINING_IMAGES_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{s}\n" for s in lines), encoding="ascii")
    os.replace(tmp, path)
    return path


def read_training_images(directory: Path | str) -> frozenset[str] | None:
    """The artifact's TRAINING_IMAGES_FILE as a set of SHA-256s; None when it has none (an older artifact).

    Anything but one lowercase hex SHA-256 a line (a blank last line aside) is an ArtifactError
    naming the file and the line: a list that cannot be read must not pass as "trained on nothing".
    """
    path = Path(directory) / TRAINING_IMAGES_FILE
    if not path.is_file():
        return None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        bad_line = data[:exc.start].count(b"\n") + 1
        raise ArtifactError(f"{path}: line {bad_line}: not ASCII; expected one lowercase hex SHA-256 a line") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if not _SHA256_LINE.match(line):
            raise ArtifactError(f"{path}: line {number}: {line[:80]!r} is not a lowercase hex SHA-256")
    return frozenset(lines)


def open_artifact(path: Path | str, extract_to: Path | str) -> tuple[Path, ArtifactMetadata]:
    """The one way to open an artifact: a model directory as-is, or a ``model.tar.gz`` safely
    extracted into ``extract_to``; its metadata read and its TorchScript file present, or ArtifactError."""
    source = Path(path)
    if source.is_dir():
        directory = source
    elif source.is_file():
        directory = extract_archive(source, Path(extract_to))
    else:
        raise ArtifactError(f"{source}: no such model directory or model.tar.gz")
    metadata = read_metadata(directory)
    if not (directory / MODEL_FILE).is_file():
        raise ArtifactError(f"{directory / MODEL_FILE}: missing; the artifact has no TorchScript detector")
    return directory, metadata


def load_artifact(path: Path | str, *, device: str = "cpu", form: str | None = None) -> LoadedDetector:
    """Load a model directory or a ``model.tar.gz`` produced by any d2ops trainer.

    ``form`` (else $D2OPS_MODEL_FORM, else the best the device can run: model_forms.choose_form) picks
    which of the artifact's forms runs; one it does not hold, or the device cannot run, is an ArtifactError.
    """
    source = Path(path)
    tempdir = tempfile.TemporaryDirectory(prefix="d2ops-model-") if source.is_file() else None
    try:
        directory, metadata = open_artifact(source, tempdir.name if tempdir else "")
        evaluation = read_evaluation(directory)  # before the model: a bad file fails fast
        chosen = choose_form(metadata.forms, metadata.aoti_device, device, form, metadata.export_problems)
        if chosen != "torchscript":
            detector = _load_compiled_form(directory, chosen, device)
            return LoadedDetector(module=detector, metadata=metadata, path=directory, evaluation=evaluation,
                                  form=chosen, _tempdir=tempdir)
    except FormError as exc:
        if tempdir is not None:
            tempdir.cleanup()
        raise ArtifactError(f"{directory}: {exc}") from None
    except ArtifactError:
        if tempdir is not None:
            tempdir.cleanup()
        raise
    model_file = directory / MODEL_FILE
    target = torch.device(device)
    if target.type == "cuda" and metadata.framework == "detectron2":
        # A trace runs on the device it was taken on (see CUDA_MODEL_FILE).
        model_file = directory / CUDA_MODEL_FILE
        if not model_file.is_file():
            raise ArtifactError(f"{directory}: this detectron2 artifact holds no CUDA trace ({CUDA_MODEL_FILE}): it "
                                "was exported without a GPU; train it on a GPU instance, or serve it on CPU")
    cuda_trace = model_file.name == CUDA_MODEL_FILE
    try:
        # Not map_location for a trace: it would also move the trace's CPU constants (the image-size
        # arithmetic) to the GPU. Its weights are saved on cuda:0 and load there.
        module = torch.jit.load(str(model_file), map_location=None if cuda_trace else device)
    except RuntimeError as exc:
        raise ArtifactError(f"{model_file}: not a loadable TorchScript module: {exc}") from exc
    if cuda_trace and target not in (torch.device(TRACED_CUDA_DEVICE), torch.device("cuda")):
        module.to(target)  # a TorchServe worker on another GPU of the instance
        retarget(module, TRACED_CUDA_DEVICE, target)
    module.eval()
    return LoadedDetector(module=module, metadata=metadata, path=directory, evaluation=evaluation,
                          _tempdir=tempdir)


def _load_compiled_form(directory: Path, form: Form, device: str) -> Detector:
    path = directory / FORM_FILES[form]
    if not path.is_file():
        raise ArtifactError(f"{path}: missing, though metadata.json lists the {form} form")
    try:
        return load_compiled(directory, form, device)
    except Exception as exc:  # a truncated or foreign file (zipfile, torch and the AOTI runtime each raise their own)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ArtifactError(f"{path}: not a loadable {form} program: {first}") from exc


def copy_native_checkpoint(output_data_dir: Path | str, files: list[Path]) -> NativeCheckpoint | None:
    """Keep the framework-native checkpoint for later fine-tuning in ``SM_OUTPUT_DATA_DIR/checkpoint/``.

    That directory becomes the job's ``output.tar.gz``; the returned reference belongs in the
    artifact's metadata so the checkpoint stays findable from the model. Serving never reads it.
    """
    target = Path(output_data_dir) / CHECKPOINT_DIR
    target.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    size = 0
    for f in files:
        shutil.copy2(f, target / f.name)
        names.append(f"{CHECKPOINT_DIR}/{f.name}")
        size += (target / f.name).stat().st_size
    return NativeCheckpoint(files=names, bytes=size) if names else None
