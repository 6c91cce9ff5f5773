"""The SageMaker Python SDK (v2) on d2ops' terms: sessions for a deployed or the offline stack, and an
Estimator that launches the pipeline's own training job as a one-off experiment (from a notebook).

The Estimator is not configured here: the pipeline's *prepare* step (``prepare_training``, the
function the state machine calls) builds the CreateTrainingJob request from the stack's settings
(the function's environment, i.e. template.yaml's parameters) and the dataset's training
overrides, and the Estimator is read off that request. So image, hyperparameters, channels,
checkpoint config, metric definitions, spot settings and the stack's limits are the pipeline's,
whatever template.yaml says today. ``tests/unit/test_sdk.py`` compares the request the SDK sends
with the prepare step's, key by key.

The SDK is imported lazily (it takes seconds and is a dev dependency): ``import_sagemaker``
gives a clear error when it is missing.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from d2ops_core import run_ids, s3_layout
from d2ops_core.dataset_identity import DatasetRef

# The v2 API (Predictor, Estimator, TrainingInput); v3 is a different API.
SDK_REQUIREMENT = "sagemaker>=2.250,<3"
# The prepare step's code directory (template.yaml's CodeUri functions/<name>/).
PREPARE_FUNCTION_CODE = "prepare_training"
# The SDK's own defaults for every session made here:
# - telemetry off: the SDK's telemetry is an HTTP GET to a public S3 URL (after an STS call) made
#   with no timeout on every fit/deploy; offline there is no internet to reach, and a tool should
#   not phone home on its user's behalf;
# - an explicit config also means no sagemaker config file (admin or user defaults: VPC, KMS keys,
#   tags) silently changes the job away from the one the pipeline runs.
SDK_CONFIG: dict[str, Any] = {"SchemaVersion": "1.0",
                              "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}


class SdkMissing(RuntimeError):
    """The SageMaker Python SDK (v2) is not installed."""


class ExperimentError(ValueError):
    """An experiment the stack would refuse (bad dataset URI, overrides past the stack's limits ...)."""


def import_sagemaker() -> ModuleType:
    """``import sagemaker`` (v2), quietly: its v2-deprecation banner is noise for a d2ops user."""
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    try:
        module = importlib.import_module("sagemaker")
        importlib.import_module("sagemaker.estimator")
    except ImportError as exc:
        raise SdkMissing(f"the SageMaker Python SDK is not installed ({exc}); "
                         f"pip install '{SDK_REQUIREMENT}' (d2ops' dev extra has it)") from exc
    version = str(getattr(module, "__version__", "0"))
    if not version.startswith("2."):
        raise SdkMissing(f"sagemaker {version} is installed; d2ops uses the v2 API: pip install '{SDK_REQUIREMENT}'")
    return module


def sagemaker_session(boto_session: Any = None, *, endpoint_url: str | None = None,
                      default_bucket: str | None = None) -> Any:
    """A ``sagemaker.session.Session`` on ``boto_session`` (default: the usual boto3 chain).

    ``endpoint_url`` sends SageMaker and SageMaker Runtime calls there (the offline gateway).
    ``default_bucket`` spares the SDK its own bucket lookup (an STS call and a CreateBucket).
    """
    import boto3

    sagemaker = import_sagemaker()
    boto_session = boto_session or boto3.session.Session()
    clients: dict[str, Any] = {}
    if endpoint_url:
        clients = {"sagemaker_client": boto_session.client("sagemaker", endpoint_url=endpoint_url),
                   "sagemaker_runtime_client": boto_session.client("sagemaker-runtime", endpoint_url=endpoint_url)}
    return sagemaker.session.Session(boto_session=boto_session, default_bucket=default_bucket,
                                     sagemaker_config=SDK_CONFIG, **clients)


def offline_boto_session() -> Any:
    """A boto3 session as the identity of the offline runtime running in this process, in its region.

    Another process's runtime: ``d2ops.offline.client.running_runtime(work_dir).session()``.
    """
    from d2ops.offline.client import session_for
    from d2ops.offline.runtime import offline_credentials

    return session_for(offline_credentials())


def _prepare_training() -> tuple[ModuleType, ModuleType, str]:
    """The prepare step's ``models`` and ``service`` modules and its function's logical id (from template.yaml)."""
    from d2ops import template
    from d2ops.functions import import_handler

    spec = template.load_template().function_for_code_dir(PREPARE_FUNCTION_CODE)
    models = import_handler(f"{PREPARE_FUNCTION_CODE}.models", spec.code_dir)
    service = import_handler(f"{PREPARE_FUNCTION_CODE}.service", spec.code_dir)
    return models, service, spec.logical_id


def offline_settings(function_env: Mapping[str, Mapping[str, str]] | None = None) -> Any:
    """The offline stack's prepare-step settings (``PrepareSettings``), resolved from template.yaml."""
    from d2ops.offline.stack import load_stack

    models, _, logical_id = _prepare_training()
    stack = load_stack(function_env=function_env)
    return models.PrepareSettings.from_env(stack.functions[logical_id].environment)


def stack_settings(stack_name: str, boto_session: Any = None) -> Any:
    """A deployed stack's prepare-step settings: its function's environment, as the pipeline reads it."""
    import boto3
    from botocore.exceptions import ClientError

    models, _, logical_id = _prepare_training()
    boto_session = boto_session or boto3.session.Session()
    try:
        resource = boto_session.client("cloudformation").describe_stack_resource(
            StackName=stack_name, LogicalResourceId=logical_id)["StackResourceDetail"]
        config = boto_session.client("lambda").get_function_configuration(
            FunctionName=resource["PhysicalResourceId"])
    except ClientError as exc:  # no such stack, not a d2ops stack, no permission
        error = exc.response.get("Error", {})
        raise ExperimentError(f"stack {stack_name}: cannot read its {logical_id}'s settings: "
                              f"{error.get('Code')}: {error.get('Message')}") from None
    return models.PrepareSettings.from_env((config.get("Environment") or {}).get("Variables") or {})


def experiment_run_id(name: str, version: str, now: _dt.datetime | None = None) -> str:
    """``experiment-<name>-<version>-<UTC time>``: no ``_``, so it never reads as a pipeline run id."""
    stamp = (now or _dt.datetime.now(_dt.UTC)).strftime("%Y%m%dT%H%M%S")
    return f"experiment-{run_ids.slug(f'{name}-{version}', 50)}-{stamp}"


@dataclass(frozen=True)
class ExperimentJob:
    """An Estimator for the pipeline's training job on one dataset version, with its channels."""

    estimator: Any  # sagemaker.estimator.Estimator
    inputs: dict[str, Any]  # channel name -> sagemaker.inputs.TrainingInput
    job_name: str
    request: dict[str, Any]  # the CreateTrainingJob request the pipeline's prepare step builds for it

    def fit(self, wait: bool = True, logs: str = "None") -> None:
        """Start the job (``logs="All"`` streams CloudWatch Logs, which a deployed stack has)."""
        self.estimator.fit(self.inputs, job_name=self.job_name, wait=wait, logs=logs)


def _dataset_version(dataset_uri: str) -> DatasetRef:
    """``s3://<bucket>/datasets/<name>/<version>/`` as the run's dataset (the layout is d2ops_core.s3_layout's)."""
    bucket, key = s3_layout.parse_s3_uri(dataset_uri)
    name, version = s3_layout.parse_manifest_key(key.rstrip("/") + "/" + s3_layout.MANIFEST_NAME)
    prefix = s3_layout.dataset_prefix(name, version)
    return DatasetRef(bucket=bucket, prefix=prefix, name=name, version=version,
                      manifest_key=prefix + s3_layout.MANIFEST_NAME, manifest_version="experiment")


def experiment_job(settings: Any, dataset_uri: str, *, sagemaker_session: Any, run_id: str | None = None,
                   training: Mapping[str, Any] | None = None,
                   task: str = "detection") -> ExperimentJob:
    """The pipeline's training job for ``dataset_uri`` (``s3://<DataBucket>/datasets/<name>/<version>/``).

    ``settings`` comes from :func:`stack_settings` or :func:`offline_settings`; ``training`` takes
    the manifest's ``training`` keys (model, max_iter, ims_per_batch, base_lr, seed), checked
    against the stack's limits as the pipeline checks them.
    """
    from pydantic import ValidationError

    from d2ops.functions import import_handler

    sagemaker = import_sagemaker()
    from sagemaker.inputs import TrainingInput

    models, service, _ = _prepare_training()
    try:
        dataset = _dataset_version(dataset_uri)
    except ValueError as exc:  # not an s3:// URI, or not datasets/<name>/<version>/
        raise ExperimentError(f"dataset {dataset_uri!r}: expected s3://<DataBucket>/datasets/<name>/<version>/ "
                              f"({exc})") from None
    run_id = run_id or experiment_run_id(dataset.name, dataset.version)
    volume = import_handler(f"{PREPARE_FUNCTION_CODE}.volume")
    try:
        event = models.PrepareEvent.model_validate({
            "run_id": run_id, "dataset": dataset.model_dump(),
            "manifest": {"task": task, "training": dict(training or {})}})
        service.check_request(settings, event)  # the stack's limits, before anything reads S3
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ExperimentError(f"experiment {run_id}: {problems}") from exc
    except (service.ManifestExceedsStackLimits, service.PretrainedWeightsMismatch) as exc:
        raise ExperimentError(f"experiment {run_id}: {exc}") from exc
    s3 = sagemaker_session.boto_session.client("s3")
    try:  # the pipeline's prepare step refuses a run whose weights are missing; so does an experiment
        weights_bytes = service.require_pretrained_weights(s3, settings)
    except (service.PretrainedWeightsMissing, service.PretrainedWeightsUnreadable,
            service.PretrainedWeightsAmbiguous) as exc:
        raise ExperimentError(f"experiment {run_id}: {exc}") from exc
    try:
        # An experiment reads the dataset prefix itself (no validation run made a snapshot for it): its
        # listing is what the one dataset channel downloads, and sizes the volume as an inventory would.
        request: dict[str, Any] = service.experiment_training_job(
            settings, event, dataset=volume.prefix_size(s3, dataset.bucket, dataset.prefix),
            weights_bytes=weights_bytes)
    except volume.DatasetTooLarge as exc:
        raise ExperimentError(f"experiment {run_id}: {exc}") from exc

    algorithm = request["AlgorithmSpecification"]
    resources = request["ResourceConfig"]
    stopping = request["StoppingCondition"]
    checkpoint = request["CheckpointConfig"]
    estimator = sagemaker.estimator.Estimator(
        image_uri=algorithm["TrainingImage"], role=request["RoleArn"],
        instance_count=resources["InstanceCount"], instance_type=resources["InstanceType"],
        volume_size=resources["VolumeSizeInGB"], input_mode=algorithm["TrainingInputMode"],
        max_run=stopping["MaxRuntimeInSeconds"], max_wait=stopping.get("MaxWaitTimeInSeconds"),
        use_spot_instances=request["EnableManagedSpotTraining"],
        output_path=request["OutputDataConfig"]["S3OutputPath"],
        hyperparameters=request["HyperParameters"], metric_definitions=algorithm["MetricDefinitions"],
        environment=request.get("Environment"),  # the image rule's MAX_IMAGE_PIXELS, as the pipeline's job has
        enable_sagemaker_metrics=algorithm["EnableSageMakerMetricsTimeSeries"],
        enable_network_isolation=request["EnableNetworkIsolation"],
        encrypt_inter_container_traffic=request["EnableInterContainerTrafficEncryption"],
        checkpoint_s3_uri=checkpoint["S3Uri"], checkpoint_local_path=checkpoint["LocalPath"],
        tags=request["Tags"],
        # The pipeline's job has neither: no Debugger hook or profiler writing next to the model.
        debugger_hook_config=False, disable_profiler=True,
        sagemaker_session=sagemaker_session)
    inputs = {c["ChannelName"]: TrainingInput(s3_data=c["DataSource"]["S3DataSource"]["S3Uri"],
                                              s3_data_type=c["DataSource"]["S3DataSource"]["S3DataType"],
                                              distribution=c["DataSource"]["S3DataSource"]["S3DataDistributionType"],
                                              input_mode=c["InputMode"])
              for c in request["InputDataConfig"]}
    return ExperimentJob(estimator=estimator, inputs=inputs, job_name=request["TrainingJobName"], request=request)
