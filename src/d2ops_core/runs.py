"""Run identity: which dataset upload a pipeline run belongs to, and what it is called.

The S3 trigger (``functions/start_pipeline``) and the status API's ``POST /runs``
(``functions/status_api``) both start runs through :func:`start_run`, so a run started by
either is the same Step Functions execution: the execution name (the run id) is derived
only from the dataset name, version and the manifest object's version id (or ETag), and
Step Functions refuses a second execution with a used name. A changed re-upload gets a new
version id, hence a new run.

SageMaker resource names are derived from the run id here as well (<= 63 characters, the
SageMaker limit), so the state machine, the status API and the tests agree on them.

Standard library and pydantic only: Lambdas import this through the CoreLayer.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_NAME = "manifest.json"
DATASETS_ROOT = "datasets"
MAX_RUN_ID_LENGTH = 80  # Step Functions execution name limit
MAX_SAGEMAKER_NAME_LENGTH = 63  # training/processing job, model, endpoint config names
RUN_ID_SEPARATOR = "_"  # never produced by slug, so run ids split back unambiguously
_NAME_PART = 30
_VERSION_PART = 30
_TOKEN_LENGTH = 16
_SEGMENT = re.compile(r"^[^/\\]+$")
_SLUG_DROP = re.compile(r"[^A-Za-z0-9]+")
_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(?P<key>.*)$")


class NotADatasetManifest(ValueError):
    """The object key is not ``datasets/<name>/<version>/manifest.json``."""


class DatasetRef(BaseModel):
    """The ``dataset`` part of the state machine input (docs/interfaces.md, Run identity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str
    prefix: str = Field(description="datasets/<name>/<version>/")
    name: str
    version: str
    manifest_key: str
    manifest_version: str = Field(description="the manifest object's version id, or its ETag when unversioned")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


class DatasetVersion(BaseModel):
    """The dataset version a model was trained on: ``dataset`` in the model artifact's
    ``metadata.json`` (docs/interfaces.md, Model artifact metadata).

    The trainers' export writes it (``model_code.training``), ``model_code.artifact`` reads it
    back. The same version as :class:`DatasetRef` names it, without the run's S3 upload
    details, which a training job does not see (it gets the name and version as hyperparameters).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    uri: str | None = Field(default=None, description="s3://<bucket>/datasets/<name>/<version>/, where the writer "
                                                      "knows it")
    inventory_digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$",
                                         description="the run's validated inventory (runs/<run_id>/inventory.jsonl) "
                                                     "the job read its snapshot by; None outside the pipeline")


class Trigger(BaseModel):
    """How a run was started. Deterministic for one upload, so identical inputs repeat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["s3-event", "api"]
    object_key: str
    object_version: str


class StartedRun(BaseModel):
    run_id: str
    execution_arn: str
    already_started: bool


def parse_manifest_key(key: str) -> tuple[str, str]:
    """``datasets/<name>/<version>/manifest.json`` -> (name, version); anything else raises."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != DATASETS_ROOT or parts[3] != MANIFEST_NAME:
        raise NotADatasetManifest(f"{key!r} is not {DATASETS_ROOT}/<name>/<version>/{MANIFEST_NAME}")
    name, version = parts[1], parts[2]
    for label, value in (("name", name), ("version", version)):
        if not _SEGMENT.match(value) or value in {".", ".."}:
            raise NotADatasetManifest(f"{key!r}: dataset {label} {value!r} is empty or a relative path segment")
    return name, version


def dataset_prefix(name: str, version: str) -> str:
    return f"{DATASETS_ROOT}/{name}/{version}/"


def object_version_token(version_id: str | None, etag: str | None) -> str:
    """The manifest upload's identity: its version id, or its ETag when the bucket is unversioned."""
    if version_id and version_id != "null":
        return version_id
    if etag:
        return etag.strip('"')
    raise ValueError("the manifest object has neither a version id nor an ETag")


def slug(value: str, limit: int) -> str:
    """``value`` as at most ``limit`` of [A-Za-z0-9-] (runs of anything else become one ``-``; never empty)."""
    slugged = _SLUG_DROP.sub("-", value).strip("-")[:limit].strip("-")
    return slugged or "x"


def run_id_for(name: str, version: str, object_version: str) -> str:
    """``<name>_<version>_<token>``: readable, <= 80 chars of [A-Za-z0-9-_], unique per upload.

    The token hashes the untruncated name, version and object version, so truncating or
    slugging long names never makes two uploads share a run id.
    """
    digest = hashlib.sha256(f"{name}\n{version}\n{object_version}".encode()).hexdigest()[:_TOKEN_LENGTH]
    run_id = RUN_ID_SEPARATOR.join((slug(name, _NAME_PART), slug(version, _VERSION_PART), digest))
    assert len(run_id) <= MAX_RUN_ID_LENGTH
    return run_id


def split_run_id(run_id: str) -> tuple[str, str, str] | None:
    """(name slug, version slug, token) of a run id made by :func:`run_id_for`, else None."""
    parts = run_id.split(RUN_ID_SEPARATOR)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def dataset_slug(name: str) -> str:
    """The form a dataset name takes inside run ids (for filtering runs by dataset)."""
    return slug(name, _NAME_PART)


def sagemaker_name(run_id: str, suffix: str) -> str:
    """A SageMaker resource name for this run: ``^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$``.

    Underscores are not allowed there, so the run id is slugged; a hash of the full run id
    is kept at the end whenever the name has to be shortened, so names stay unique.
    """
    if not re.fullmatch(r"[a-z0-9]{1,12}", suffix):
        raise ValueError(f"suffix must be 1-12 lowercase letters or digits, got {suffix!r}")
    base = slug(run_id, MAX_RUN_ID_LENGTH)
    name = f"{base}-{suffix}"
    if len(name) > MAX_SAGEMAKER_NAME_LENGTH:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
        keep = MAX_SAGEMAKER_NAME_LENGTH - len(suffix) - len(digest) - 2
        name = f"{base[:keep].rstrip('-')}-{digest}-{suffix}"
    return name


TRAINING_JOB_SUFFIX = "train"
EVALUATION_JOB_SUFFIX = "eval"

# The run's objects in the artifacts bucket (docs/interfaces.md): everything a run writes lives
# under runs/<run id>/, its spot checkpoints under checkpoints/<run id>/. Writers and readers take
# these from here, never spell the layout themselves.
RUNS_ROOT = "runs"
CHECKPOINTS_ROOT = "checkpoints"
VALIDATION_REPORT_NAME = "report.json"
EVALUATION_REPORT_NAME = "evaluation.json"


def run_prefix(run_id: str) -> str:
    """``runs/<run id>/``: the key prefix of everything the run writes to the artifacts bucket."""
    return f"{RUNS_ROOT}/{run_id}/"


def s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def validation_report_key(run_id: str) -> str:
    """Where validate_dataset stores the run's full validation report (the status API reads it back)."""
    return f"{run_prefix(run_id)}validation/{VALIDATION_REPORT_NAME}"


INVENTORY_NAME = "inventory.jsonl"
SNAPSHOT_DIR = "dataset"


def inventory_key(run_id: str) -> str:
    """The run's inventory (d2ops_core.validation.inventory): every object it read, pinned, sorted by key."""
    return f"{run_prefix(run_id)}{INVENTORY_NAME}"


def pending_inventory_key(run_id: str) -> str:
    """The inventory of the files validate_dataset read itself (manifest, annotations) while the image
    checks are still running; the summarize step adds the images and writes :func:`inventory_key`."""
    return f"{run_prefix(run_id)}validation/files-inventory.jsonl"


def image_items_key(run_id: str) -> str:
    """The Distributed Map's items: one ImageItem JSON per line."""
    return f"{run_prefix(run_id)}validation/image-items.jsonl"


def image_results_prefix(run_id: str) -> str:
    """The Map's ResultWriter prefix (Step Functions adds ``<map run id>/manifest.json`` and result files)."""
    return f"{run_prefix(run_id)}validation/image-results"


def snapshot_prefix(run_id: str) -> str:
    """``runs/<run id>/dataset/``: the run's copy (by VersionId) of every object it validated."""
    return f"{run_prefix(run_id)}{SNAPSHOT_DIR}/"


def dataset_diff_key(run_id: str) -> str:
    """The diff of the run's dataset against the champion's (d2ops_core.documents.dataset_diff.DatasetDiff)."""
    return f"{run_prefix(run_id)}dataset-diff.json"


def snapshot_uri(artifacts_bucket: str, run_id: str) -> str:
    """What the training and evaluation channels read: the snapshot, never the mutable data prefix."""
    return s3_uri(artifacts_bucket, snapshot_prefix(run_id))


def checkpoint_uri(artifacts_bucket: str, run_id: str) -> str:
    """The training job's ``CheckpointConfig.S3Uri``: a spot restart of the same job resumes from it."""
    return s3_uri(artifacts_bucket, f"{CHECKPOINTS_ROOT}/{run_id}/")


def training_output_uri(artifacts_bucket: str, run_id: str) -> str:
    """The run's training job's ``S3OutputPath``; also how a job of this name is known to be this run's."""
    return s3_uri(artifacts_bucket, f"{run_prefix(run_id)}training/")


def evaluation_output_uri(artifacts_bucket: str, run_id: str) -> str:
    """The run's evaluation (processing) job's output ``S3Uri``; also how that job is known to be this run's."""
    return s3_uri(artifacts_bucket, f"{run_prefix(run_id)}evaluation/")


def evaluation_report_uri(artifacts_bucket: str, run_id: str) -> str:
    """The evaluation job's report: ``evaluation.json`` in its output (``model_code.evaluation`` writes it)."""
    return evaluation_output_uri(artifacts_bucket, run_id) + EVALUATION_REPORT_NAME


JobKind = Literal["training", "processing"]
# SageMaker's API model names no not-found error for Describe/Stop of a job: it answers a name it
# does not know with ValidationException ("Requested resource not found", "Could not find requested
# job with name ...", moto: "Could not find training job '...'"); ResourceNotFound where it does.
_MISSING_PHRASES = ("not found", "could not find", "does not exist")


def is_missing_job(exc: BaseException) -> bool:
    """Whether a SageMaker client error says the job does not exist (and nothing else: throttling,
    access denied, other validation errors are not "missing").

    Recognised by the botocore ``ClientError``'s ``response["Error"]`` dict, so the core needs no botocore.
    """
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    if not isinstance(error, dict):
        return False
    code, message = error.get("Code"), str(error.get("Message") or "").lower()
    return code == "ResourceNotFound" or (
        code == "ValidationException" and any(phrase in message for phrase in _MISSING_PHRASES))


def describe_job(sagemaker: Any, kind: JobKind, name: str) -> dict[str, Any] | None:
    """DescribeTrainingJob / DescribeProcessingJob of ``name``; None when no job of that name exists.

    Every other error (throttling, access denied) propagates: the caller decides whether the answer
    can do without the job. ``sagemaker`` is a boto3 SageMaker client (or one with the same methods).
    """
    try:
        if kind == "training":
            return dict(sagemaker.describe_training_job(TrainingJobName=name))
        return dict(sagemaker.describe_processing_job(ProcessingJobName=name))
    except Exception as exc:
        if is_missing_job(exc):
            return None
        raise


def described_job_output(described: dict[str, Any]) -> str | None:
    """Where the job of a DescribeTrainingJob/DescribeProcessingJob answer writes (None if it says nothing).

    A job is this run's when this equals the run's output URI above: the rule the state machine's
    "Created … job is ours?" applies to the same two fields, and the release function before it
    stops a job. Names alone do not prove it: another stack may use the same SageMaker name.
    """
    if "TrainingJobName" in described:
        uri = (described.get("OutputDataConfig") or {}).get("S3OutputPath")
    else:
        outputs = (described.get("ProcessingOutputConfig") or {}).get("Outputs") or [{}]
        uri = (outputs[0].get("S3Output") or {}).get("S3Uri")
    return uri if isinstance(uri, str) else None


def execution_arn(state_machine_arn: str, run_id: str) -> str:
    """The execution ARN Step Functions gives ``run_id`` (arn:<p>:states:<r>:<a>:execution:<sm>:<name>)."""
    parts = state_machine_arn.split(":")
    if len(parts) != 7 or parts[5] != "stateMachine":
        raise ValueError(f"not a state machine ARN: {state_machine_arn!r}")
    return ":".join([*parts[:5], "execution", parts[6], run_id])


def parse_s3_uri(uri: str) -> tuple[str, str]:
    match = _S3_URI.match(uri)
    if not match:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    return match["bucket"], match["key"]


def key_listed(s3: Any, bucket: str, key: str) -> bool:
    """Whether the object ``key`` exists, asked by listing with the key as the prefix.

    A GET or HEAD of a missing key answers 404 only to callers allowed to list the bucket;
    our roles may list only the prefixes they read (an ``s3:prefix`` condition, which a
    GET request does not carry), so they could see 403 instead. A listing with that very
    prefix is what the condition allows. The key sorts first among keys it prefixes.
    """
    page = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    return any(obj["Key"] == key for obj in page.get("Contents", []))


def dataset_ref(bucket: str, key: str, version_id: str | None, etag: str | None) -> DatasetRef:
    name, version = parse_manifest_key(key)
    return DatasetRef(bucket=bucket, prefix=dataset_prefix(name, version), name=name, version=version,
                      manifest_key=key, manifest_version=object_version_token(version_id, etag))


def execution_input(dataset: DatasetRef, trigger: Trigger) -> dict[str, Any]:
    return {"dataset": dataset.model_dump(), "trigger": trigger.model_dump()}


def delivery_token() -> str:
    """A token unique to one StartExecution call (see :func:`start_run`)."""
    return uuid.uuid4().hex


class _StepFunctionsClient(Protocol):
    exceptions: Any

    def start_execution(self, **kwargs: Any) -> Any: ...


def start_run(sfn: _StepFunctionsClient, state_machine_arn: str, dataset: DatasetRef,
              trigger: Trigger) -> StartedRun:
    """Start the run for this dataset upload, or report the one already started.

    The run id (execution name) makes the start idempotent: Step Functions never runs two
    executions of one name. It answers a used name with ``ExecutionAlreadyExists``, except
    while the first execution is still running *with identical input*: then it returns that
    execution as if it had just started it, so 100 concurrent duplicate deliveries all said
    "started". Each call therefore carries its own ``delivery`` token: the input of a second
    call never matches the first's, every call but the one that started the run gets
    ``ExecutionAlreadyExists``, and exactly one caller reports ``started``.
    """
    run_id = run_id_for(dataset.name, dataset.version, dataset.manifest_version)
    arn = execution_arn(state_machine_arn, run_id)
    document = {**execution_input(dataset, trigger), "delivery": delivery_token()}
    try:
        response = sfn.start_execution(stateMachineArn=state_machine_arn, name=run_id,
                                       input=json.dumps(document, sort_keys=True))
    except sfn.exceptions.ExecutionAlreadyExists:
        return StartedRun(run_id=run_id, execution_arn=arn, already_started=True)
    return StartedRun(run_id=run_id, execution_arn=response["executionArn"], already_started=False)
