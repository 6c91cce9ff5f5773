"""What a run is called: its id (the Step Functions execution name) and the SageMaker names made from it.

The run id is derived only from the dataset name, version and the manifest object's version id
(or ETag), so a run started by the S3 trigger or by the status API's ``POST /runs`` is the same
execution (d2ops_core.run_start). SageMaker resource names are derived from the run id here as
well (<= 63 characters, the SageMaker limit), so the state machine, the status API and the tests
agree on them.
"""

from __future__ import annotations

import hashlib
import re

MAX_RUN_ID_LENGTH = 80  # Step Functions execution name limit
MAX_SAGEMAKER_NAME_LENGTH = 63  # training/processing job, model, endpoint config names
RUN_ID_SEPARATOR = "_"  # never produced by slug, so run ids split back unambiguously
# What a run id may be wherever one is read (request paths, Lambda inputs, S3 keys): run_id_for makes
# only such ids. RUN_ID_CHARS is the unanchored form, for patterns that embed a run id.
RUN_ID_CHARS = r"[A-Za-z0-9_-]{1,80}"
RUN_ID_PATTERN = rf"^{RUN_ID_CHARS}$"
# A job's environment variable naming its run (the evaluation job writes it into the monitor's baseline).
RUN_ID_ENV = "D2OPS_RUN_ID"
_NAME_PART = 30
_VERSION_PART = 30
_TOKEN_LENGTH = 16
_SLUG_DROP = re.compile(r"[^A-Za-z0-9]+")


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


def execution_arn(state_machine_arn: str, run_id: str) -> str:
    """The execution ARN Step Functions gives ``run_id`` (arn:<p>:states:<r>:<a>:execution:<sm>:<name>)."""
    parts = state_machine_arn.split(":")
    if len(parts) != 7 or parts[5] != "stateMachine":
        raise ValueError(f"not a state machine ARN: {state_machine_arn!r}")
    return ":".join([*parts[:5], "execution", parts[6], run_id])
