"""The SageMaker training-container contract, parsed: environment, config files and hyperparameters.

SageMaker itself provides only ``<root>/input/config/*.json`` and the channel directories;
the training toolkit (present in the SageMaker PyTorch images) adds the ``SM_*`` variables.
We read the ``SM_*`` variables when they are set and the config files otherwise, so the
entry point works under either launcher. ``D2OPS_ML_ROOT`` moves the whole tree (default
``/opt/ml``); a local runner sets it, SageMaker does not need to.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from d2ops_core.gate import DEFAULT_MIN_CLASS_INSTANCES

DEFAULT_ML_ROOT = "/opt/ml"
ML_ROOT_VARIABLE = "D2OPS_ML_ROOT"
CHECKPOINT_DIR_VARIABLE = "D2OPS_CHECKPOINT_DIR"
# One channel holds the dataset version (manifest, both split files, images): SageMaker downloads each
# channel separately, so the train and val splits of one version come from this one (prepare_training).
DATASET_CHANNEL = "dataset"
REQUIRED_CHANNELS = (DATASET_CHANNEL,)
# A safety net against a single bad batch, not a regulator of ordinary steps: measured gradient norms
# of a converging run stay well below it after the first iterations (docs/training.md, calibration).
CLIP_GRAD_NORM = 10.0
# Upper bounds so an astronomical integer is a ConfigError at parse, not an OverflowError in the schedule's
# float arithmetic hours later; far above any real run.
MAX_ITERATIONS = 1_000_000
MAX_PROPOSALS = 1_000_000


class ConfigError(Exception):
    """A bad hyperparameter, a missing channel or an unreadable config file; the message says which."""


def ml_root(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(ML_ROOT_VARIABLE) or DEFAULT_ML_ROOT)


def failure_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where the one-line failure reason goes; resolvable even when everything else is broken."""
    env = os.environ if environ is None else environ
    return Path(env.get("SM_OUTPUT_DIR") or ml_root(env) / "output") / "failure"


class Hyperparameters(BaseModel):
    """Hyperparameters as SageMaker passes them (strings), typed. Unknown names are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    framework: Literal["torchvision", "detectron2"] = "torchvision"
    model: str | None = Field(default=None, min_length=1, description="architecture or config; default per task")
    max_iter: int = Field(default=1000, ge=1, le=MAX_ITERATIONS)
    ims_per_batch: int = Field(default=16, ge=1, le=4096, description="global batch at reference_world_size")
    base_lr: float = Field(default=0.02, gt=0, le=10)
    reference_world_size: int = Field(default=0, ge=0, le=4096,
                                      description="0: batch and LR fixed; N: scale linearly from N workers")
    warmup_iters: int = Field(default=100, ge=0, le=MAX_ITERATIONS)
    lr_steps: tuple[float, ...] = Field(default=(0.8,), description="fractions of max_iter where LR drops x0.1")
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0, lt=1)
    clip_grad_norm: float = Field(default=CLIP_GRAD_NORM, ge=0, le=1e6,
                                  description="clip the gradient's global L2 norm to this (0: no clipping)")
    eval_period: int = Field(default=0, ge=0, le=MAX_ITERATIONS, description="0: evaluate only at the end")
    checkpoint_period: int = Field(default=500, ge=1, le=MAX_ITERATIONS)
    log_period: int = Field(default=20, ge=1, le=MAX_ITERATIONS)
    # The pipeline's validated inventory (prepare_training sets it): recorded in the artifact's metadata
    # so a model names the exact dataset bytes it learned from.
    inventory_digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    overrides: str = Field(default="", description="detectron2: JSON object or 'KEY VALUE ...'")
    weights: Literal["pretrained", "scratch"] = Field(
        default="pretrained", description="detectron2: 'scratch' makes a config built for pretrained weights "
                                          "(frozen stem, FrozenBN) trainable without them (GN, FREEZE_AT 0)")
    # torchvision trainer
    min_size: int = Field(default=800, ge=32, le=4096)
    max_size: int = Field(default=1333, ge=32, le=8192)
    rpn_pre_nms_train: int = Field(default=2000, ge=1, le=MAX_PROPOSALS)
    rpn_post_nms_train: int = Field(default=2000, ge=1, le=MAX_PROPOSALS)
    rpn_pre_nms_test: int = Field(default=1000, ge=1, le=MAX_PROPOSALS)
    rpn_post_nms_test: int = Field(default=1000, ge=1, le=MAX_PROPOSALS)
    roi_batch_size_per_image: int = Field(default=512, ge=16, le=4096, description="sampled RoIs per image")
    num_workers: int = Field(default=2, ge=0, le=64, description="data loader processes per worker")
    horizontal_flip: bool = True
    # distributed
    cpu_processes_per_host: int = Field(default=1, ge=1, le=256)
    dist_port: int = Field(default=29500, ge=1024, le=65535)
    dist_timeout_minutes: int = Field(default=30, ge=1, le=24 * 60)
    # evaluation
    report_images: int = Field(default=6, ge=0, le=64)
    # The stack's MinClassInstances (prepare_training passes the plan's gate.min_class_instances): a class with
    # fewer non-crowd val objects gets the pooled score threshold (model_code/evaluation/thresholds.py).
    min_class_instances: int = Field(default=DEFAULT_MIN_CLASS_INSTANCES, ge=1, le=1_000_000)

    @field_validator("lr_steps", mode="before")
    @classmethod
    def _steps_from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            try:
                return tuple(float(p) for p in parts)
            except ValueError as exc:
                raise ValueError(f"expected comma-separated fractions such as '0.7,0.9', got {value!r}") from exc
        return value

    @field_validator("lr_steps")
    @classmethod
    def _steps_are_fractions(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < s < 1 for s in value) or list(value) != sorted(value):
            raise ValueError(f"must be increasing fractions of max_iter within (0, 1), got {value}")
        return value

    @model_validator(mode="after")
    def _sizes(self) -> Hyperparameters:
        if self.min_size > self.max_size:
            raise ValueError(f"min_size {self.min_size} is larger than max_size {self.max_size}")
        return self


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def _clip_value(value: Any) -> str:
    return repr(_clip(value)) if isinstance(value, str) else _clip(repr(value))


def _unquote(value: str) -> str:
    # The SageMaker Python SDK JSON-encodes framework hyperparameters ('"abc"'); accept both forms.
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) else value
    return value


def parse_hyperparameters(raw: Mapping[str, Any]) -> Hyperparameters:
    values = {k: _unquote(v) if isinstance(v, str) else v for k, v in raw.items()
              # keys the SageMaker SDK adds for script mode; not ours to validate
              if not k.startswith("sagemaker_")}
    try:
        return Hyperparameters.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            name = ".".join(str(p) for p in err["loc"]) or "hyperparameters"
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(name, Hyperparameters.model_fields, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(f"unknown hyperparameter {_clip(name)!r}{hint} (see docs/training.md)")
            else:
                # The input is clipped: a megabyte value must not push the reason out of FailureReason's 1024 chars.
                problems.append(f"hyperparameter {_clip(name)}={_clip_value(err.get('input'))}: {err['msg']}")
        raise ConfigError("; ".join(problems)) from None


class TrainingEnvironment(BaseModel):
    """Where everything is, which host this is and what hardware it has."""

    model_config = ConfigDict(frozen=True)

    hosts: list[str] = Field(min_length=1)
    current_host: str
    network_interface: str | None = None
    num_gpus: int = Field(ge=0)
    num_cpus: int = Field(ge=1)
    channels: dict[str, Path]
    model_dir: Path
    output_data_dir: Path
    output_dir: Path
    checkpoint_dir: Path
    job_name: str | None = None
    hyperparameters: dict[str, Any]

    @model_validator(mode="after")
    def _current_host_listed(self) -> TrainingEnvironment:
        if self.current_host not in self.hosts:
            raise ValueError(f"current host {self.current_host!r} is not in the host list {self.hosts}")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"host list has duplicates: {self.hosts}")
        return self

    def channel(self, name: str) -> Path:
        path = self.channels.get(name)
        if path is None:
            raise ConfigError(f"input channel {name!r} is missing: the job has channels {sorted(self.channels)}; "
                              f"it needs {list(REQUIRED_CHANNELS)} (the dataset version, both splits in one)")
        if not path.is_dir():
            raise ConfigError(f"input channel {name!r}: {path} is not a directory")
        return path


def _read_json(path: Path, default: Any) -> Any:
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable JSON: {exc}") from exc


def _read_object(path: Path) -> dict[str, Any]:
    document = _read_json(path, {})
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(document).__name__}")
    return document


def _json_env(env: Mapping[str, str], name: str) -> Any:
    try:
        return json.loads(env[name])
    except ValueError as exc:
        raise ConfigError(f"environment variable {name}: not valid JSON: {exc}") from exc


def load_environment(environ: Mapping[str, str] | None = None, *, gpu_count: int | None = None) -> TrainingEnvironment:
    env = os.environ if environ is None else environ
    root = ml_root(env)
    config_dir = Path(env.get("SM_INPUT_CONFIG_DIR") or root / "input" / "config")
    resource = _read_object(config_dir / "resourceconfig.json")
    data_config = _read_object(config_dir / "inputdataconfig.json")
    for name, channel in data_config.items():
        mode = channel.get("TrainingInputMode", "File") if isinstance(channel, dict) else None
        if mode not in ("File", "FastFile"):
            # Pipe mode streams the channel through FIFOs (<channel>_0, _1...): there is no directory to read.
            raise ConfigError(f"{config_dir / 'inputdataconfig.json'}: channel {_clip(str(name))!r} has "
                              f"TrainingInputMode {_clip(repr(mode))}; this trainer reads files: use File or FastFile")

    hosts = _json_env(env, "SM_HOSTS") if "SM_HOSTS" in env else resource.get("hosts", ["algo-1"])
    current: Any = env.get("SM_CURRENT_HOST") or resource.get(
        "current_host", hosts[0] if isinstance(hosts, list) and hosts else "algo-1")
    hyperparameters = (_json_env(env, "SM_HPS") if "SM_HPS" in env
                       else _read_json(config_dir / "hyperparameters.json", {}))
    if not isinstance(hyperparameters, dict):
        raise ConfigError(f"hyperparameters must be a JSON object, got {type(hyperparameters).__name__}")

    data_dir = Path(env.get("SM_INPUT_DATA_DIR") or root / "input" / "data")
    names = set(data_config) | {k[len("SM_CHANNEL_"):].lower() for k in env if k.startswith("SM_CHANNEL_")}
    channels = {n: Path(env.get(f"SM_CHANNEL_{n.upper()}") or data_dir / n) for n in sorted(names)}

    if gpu_count is None:
        gpu_count = _count(env, "SM_NUM_GPUS", 0) if env.get("SM_NUM_GPUS") else _cuda_devices()
    cpu_count = _count(env, "SM_NUM_CPUS", 1) if env.get("SM_NUM_CPUS") else os.cpu_count() or 1
    try:
        return TrainingEnvironment(
            hosts=hosts, current_host=current,
            network_interface=env.get("SM_NETWORK_INTERFACE_NAME") or resource.get("network_interface_name"),
            num_gpus=gpu_count, num_cpus=cpu_count,
            channels=channels,
            model_dir=Path(env.get("SM_MODEL_DIR") or root / "model"),
            output_data_dir=Path(env.get("SM_OUTPUT_DATA_DIR") or root / "output" / "data"),
            output_dir=Path(env.get("SM_OUTPUT_DIR") or root / "output"),
            checkpoint_dir=Path(env.get(CHECKPOINT_DIR_VARIABLE) or root / "checkpoints"),
            job_name=env.get("TRAINING_JOB_NAME"),
            hyperparameters=hyperparameters,
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"training environment: {where + ': ' if where else ''}{first['msg']}") from None


def _count(env: Mapping[str, str], name: str, minimum: int) -> int:
    raw = env[name]
    if not (raw.isascii() and raw.isdigit()) or int(raw) < minimum:
        raise ConfigError(f"environment variable {name}={_clip(raw)!r} is not a count (an integer >= {minimum})")
    return int(raw)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
