"""Build the training and evaluation job requests for one run (pure, apart from reading champion.json)."""

from __future__ import annotations

import time
from typing import Any

from botocore.exceptions import ClientError

from d2ops_core import gate as gate_settings
from d2ops_core import images, metrics, platform, pretrained, run_ids, s3_layout
from d2ops_core.champion import ChampionRecord
from d2ops_core.dataset_diff import compare
from d2ops_core.dataset_diff_s3 import index_run
from d2ops_core.documents.capture import JSON_CONTENT_TYPES
from d2ops_core.documents.dataset_diff import DatasetDiffSummary
from d2ops_core.documents.evaluation import GateThresholds
from d2ops_core.validation.manifest import (
    effective_class_gate,
    effective_gate,
    effective_interval,
    stack_limit_problems,
)
from prepare_training.models import (
    CapacitySize,
    ChampionRef,
    EndpointPlan,
    JobNames,
    Plan,
    PrepareEvent,
    PrepareSettings,
    TrafficRoutingConfig,
)
from prepare_training.volume import (
    EVALUATION_MODEL_COPIES,
    TRAINING_MODEL_COPIES,
    DatasetSize,
    sized_volume,
)

CHECKPOINT_DIR = "/opt/ml/checkpoints"
PROCESSING_ROOT = "/opt/ml/processing"
EVALUATION_MAX_SECONDS = 2 * 3600
# The one input both jobs read the snapshot from: /opt/ml/input/data/dataset (SM_CHANNEL_DATASET) in
# training, /opt/ml/processing/input/dataset in the evaluation. One channel, so one download.
DATASET_CHANNEL = "dataset"
# The evaluation job runs in the training image through its cuda-compat wrapper, as the training
# entry does: a processing job's ContainerEntrypoint replaces the image's ENTRYPOINT, so without it
# the job would skip the forward-compatibility switch (containers/training/cuda-compat says why).
EVALUATION_ENTRYPOINT = ("/usr/local/bin/cuda-compat", "python", "-m", "model_code.evaluation.job")
# The blue/green update's bake (docs/pipeline.md#canary-deployment): long enough for two
# DescribeEndpoint polls and the smoke test (tests/unit/test_pipeline_canary.py checks it).
BAKE_SECONDS = 600
CANARY_PERCENT = 25
# The endpoint's one variant (template.yaml's alarms and dashboard name it too).
VARIANT_NAME = "AllTraffic"


class ManifestExceedsStackLimits(Exception):
    """The manifest asks for a laxer gate or a bigger training job than the stack allows.

    Validation rejects such a manifest first (DatasetRejected); this is the second lock, for
    an execution started with input that never went through validation.
    """


class PretrainedWeightsMissing(Exception):
    """The stack fine-tunes from PretrainedWeightsKey but no object is there: refused before training
    (a network-isolated job cannot download weights, and a config built for pretrained weights trains
    badly from random ones). The message names the bucket, the key and the command that uploads them."""


class PretrainedWeightsUnreadable(Exception):
    """The prepare step may not list PretrainedWeightsKey (S3 answered 403): the stack's policies and
    the key disagree, or a bucket policy denies it. The message names the bucket and the key."""


class PretrainedWeightsAmbiguous(Exception):
    """Another object's key starts with PretrainedWeightsKey (``model.pkl.old`` beside ``model.pkl``): the
    ``pretrained`` channel is an S3 prefix, so SageMaker would download that object too, and the training
    role, which may read exactly the key, would fail the job at its download instead of here."""


class PretrainedWeightsMismatch(Exception):
    """PretrainedWeightsKey is the documented key of one config's checkpoint and the run trains another
    (the manifest's task or training.model chose it): the job would start from the wrong model's weights."""


class DatasetSnapshotMissing(Exception):
    """The validation summary names no snapshot of this run (runs/<run_id>/dataset/) or no inventory digest:
    validation did not finish (images still pending) or the execution's input skipped it. Training reads
    only a validated snapshot, never the mutable data prefix, so the run is refused before any job starts."""


def dataset_snapshot(settings: PrepareSettings, event: PrepareEvent) -> tuple[str, str]:
    """The snapshot URI the ``dataset`` channel and the evaluation read, and the inventory's digest."""
    summary = event.validation
    expected = s3_layout.snapshot_uri(settings.artifacts_bucket, event.run_id)
    if summary is None or summary.images_pending or not summary.snapshot_uri or not summary.inventory_digest:
        missing = ("no validation summary was passed" if summary is None else
                   "the validation summary still has images_pending" if summary.images_pending else
                   "the validation summary has no snapshot_uri" if not summary.snapshot_uri else
                   "the validation summary has no inventory_digest")
        raise DatasetSnapshotMissing(f"run {event.run_id}: {missing}; training reads only the validated snapshot "
                                     f"{expected}, so nothing was started")
    if summary.snapshot_uri != expected:
        raise DatasetSnapshotMissing(f"run {event.run_id}: the validation summary's snapshot_uri "
                                     f"{summary.snapshot_uri} is not this run's snapshot {expected}")
    return expected, summary.inventory_digest


def run_config(settings: PrepareSettings, event: PrepareEvent) -> str | None:
    """The model-zoo config the run's trainer picks (model_code.training.detectron2_trainer.config_source):
    the manifest's ``training.model``, else the task's default on a GPU. None where it is no model-zoo
    config: the CPU profile (a CPU training instance) or a config file shipped in the image (e.g.
    faster_rcnn_R_50_FPN_small_objects.yaml, made to fine-tune from the default config's checkpoint)."""
    if event.manifest.training.model:
        return event.manifest.training.model if "/" in event.manifest.training.model else None
    if platform.gpu_family(settings.training_instance_type, "training") is None:
        return None
    return pretrained.DEFAULT_CONFIGS[event.manifest.task]


def check_weights_match(settings: PrepareSettings, event: PrepareEvent) -> None:
    """A documented key (pretrained/<config>.pkl) must name the config the run trains; another key is the
    operator's own choice and is not second-guessed."""
    key = settings.pretrained_weights_key
    named = pretrained.conventional_config(key)
    config = run_config(settings, event) if settings.fine_tunes else None
    if named is None or config is None or named == config:
        return
    raise PretrainedWeightsMismatch(
        f"PretrainedWeightsKey {key} holds {named}'s checkpoint but this run trains {config} (manifest task "
        f"{event.manifest.task!r}{', training.model' if event.manifest.training.model else ''}): upload {config}'s "
        f"checkpoint and deploy with PretrainedWeightsKey={pretrained.weights_key(config)}"
        f"{pretrained.download_hint(pretrained.weights_key(config))}")


def require_pretrained_weights(s3: Any, settings: PrepareSettings) -> int | None:
    """Refuse a run whose stack expects weights that are not at ``s3://<DataBucket>/<PretrainedWeightsKey>``;
    the checkpoint's size in bytes (None: the stack trains from scratch), which sizes the jobs' volumes.

    Lists exactly that key (the function's only permission there): an empty listing is a missing
    object, AccessDenied is a permission problem, never confused with each other.
    """
    if not settings.fine_tunes:
        return None
    bucket, key = settings.data_bucket, settings.pretrained_weights_key
    try:
        listing = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=2)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"AccessDenied", "403", "AllAccessDisabled"}:
            raise PretrainedWeightsUnreadable(
                f"s3://{bucket}/{key}: access denied listing the pretrained weights (PretrainedWeightsKey); "
                "check the stack's policies and the data bucket's policy") from None
        raise
    sizes = {item["Key"]: int(item.get("Size", 0)) for item in listing.get("Contents") or []}
    keys = list(sizes)
    others = [k for k in keys if k != key]
    if key in keys and others:
        raise PretrainedWeightsAmbiguous(
            f"s3://{bucket}/{others[0]} starts with PretrainedWeightsKey {key}: the pretrained channel is an S3 "
            "prefix, so the training job would download it too (and may not read it); rename or delete it")
    if key not in keys:
        raise PretrainedWeightsMissing(
            f"no pretrained weights at s3://{bucket}/{key} (PretrainedWeightsKey): put the checkpoint there with "
            f"`{pretrained.upload_command(settings.stack_name)}`{pretrained.download_hint(key)}, or deploy with "
            f"PretrainedWeightsKey={pretrained.SCRATCH} to train from scratch")
    return sizes[key]


def job_names(run_id: str) -> JobNames:
    return JobNames(training_job=run_ids.sagemaker_name(run_id, run_ids.TRAINING_JOB_SUFFIX),
                    evaluation_job=run_ids.sagemaker_name(run_id, run_ids.EVALUATION_JOB_SUFFIX),
                    model=run_ids.sagemaker_name(run_id, "model"),
                    endpoint_config=run_ids.sagemaker_name(run_id, "config"))


def hyperparameters(settings: PrepareSettings, event: PrepareEvent) -> dict[str, str]:
    """Strings, as SageMaker passes them; only the manifest's overrides besides the framework (and what the
    pipeline knows: the validated inventory, the score thresholds' support).

    The trainer owns the defaults (model, schedule) per framework and task, so they are
    not repeated here.
    """
    hps: dict[str, str] = {"framework": settings.framework}
    if settings.framework == "detectron2" and not settings.fine_tunes:
        # The operator opted out of weights: the trainer makes a frozen-for-pretrained config scratch-capable.
        hps["weights"] = "scratch"
    for key, value in event.manifest.training.model_dump(exclude_none=True).items():
        hps[key] = str(value)
    if event.validation is not None and event.validation.inventory_digest:
        # Recorded in the job (DescribeTrainingJob) and by the trainer in the artifact's metadata.json.
        hps["inventory_digest"] = event.validation.inventory_digest
    # The plan's gate.min_class_instances: the support below which the export gives a class the pooled
    # score threshold, the same count the gate judges a class from.
    _, min_class_instances = effective_class_gate(settings.limits, event.manifest.gate)
    hps["min_class_instances"] = str(min_class_instances or gate_settings.DEFAULT_MIN_CLASS_INSTANCES)
    return hps


def image_rule_environment(settings: PrepareSettings) -> dict[str, str]:
    """The jobs' environment: the one image rule's pixel limit (MaxImagePixels), so training and evaluation
    refuse and read exactly the images validation did (d2ops_core.images.max_pixels reads it)."""
    return {images.MAX_PIXELS_ENV: str(settings.max_image_pixels)}


def training_job_request(settings: PrepareSettings, event: PrepareEvent, names: JobNames, *,
                         dataset_uri: str | None = None, dataset: DatasetSize | None = None,
                         weights_bytes: int | None = None) -> dict[str, Any]:
    """CreateTrainingJob's request. A pipeline run reads its validated snapshot; only an SDK experiment
    (experiment_training_job) names another ``dataset_uri``. ``dataset`` (what the channel downloads) and
    ``weights_bytes`` (the pretrained checkpoint's size) size the volume; unknown, it is the floor."""
    snapshot = dataset_uri or dataset_snapshot(settings, event)[0]
    # One channel, the run's snapshot of the whole dataset version (COCO layout with manifest.json,
    # copied by VersionId at validation): the trainer reads both split files the manifest names from it,
    # exactly the bytes validation checked. Two channels of the same prefix would download it twice.
    # File mode, not FastFile: detectron2's loader opens many small images in random order every epoch,
    # and FastFile fetches a file from S3 when the job reads it (SageMaker's guide suits it to sequential
    # reads), so training would wait on S3 requests; File mode downloads once, before training, and reads
    # local disk after, at the cost of the volume sized below.
    channels = [{"ChannelName": DATASET_CHANNEL, "InputMode": "File",
                 "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": snapshot,
                                                 "S3DataDistributionType": "FullyReplicated"}}}]
    if settings.fine_tunes:
        # An S3Prefix of the full key: the one object require_pretrained_weights found (IAM lets the
        # job read nothing else under pretrained/), as <channel dir>/<its file name>.
        channels.append({"ChannelName": pretrained.CHANNEL, "InputMode": "File",
                         "DataSource": {"S3DataSource": {
                             "S3DataType": "S3Prefix",
                             "S3Uri": f"s3://{settings.data_bucket}/{settings.pretrained_weights_key}",
                             "S3DataDistributionType": "FullyReplicated"}}})
    stopping: dict[str, int] = {"MaxRuntimeInSeconds": settings.max_training_seconds}
    if settings.use_spot:
        # Spot may wait for capacity and be interrupted; twice the run time bounds the wait.
        stopping["MaxWaitTimeInSeconds"] = 2 * settings.max_training_seconds
    return {
        "TrainingJobName": names.training_job,
        "RoleArn": settings.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": settings.training_image_uri, "TrainingInputMode": "File",
                                   "MetricDefinitions": [dict(d) for d in metrics.METRIC_DEFINITIONS],
                                   "EnableSageMakerMetricsTimeSeries": True},
        "HyperParameters": hyperparameters(settings, event),
        "Environment": image_rule_environment(settings),
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": s3_layout.training_output_uri(settings.artifacts_bucket, event.run_id)},
        "ResourceConfig": {"InstanceType": settings.training_instance_type,
                           "InstanceCount": settings.training_instance_count,
                           "VolumeSizeInGB": sized_volume(
                               "training", settings.training_instance_type, "TrainingInstanceType",
                               dataset or DatasetSize(0, 0), weights_bytes if settings.fine_tunes else None,
                               TRAINING_MODEL_COPIES)},
        "StoppingCondition": stopping,
        "EnableManagedSpotTraining": settings.use_spot,
        # The container needs no network: SageMaker moves channels, output and checkpoints, and
        # pretrained weights arrive as the `pretrained` channel. Hosts still talk to each other, encrypted.
        "EnableNetworkIsolation": True,
        "EnableInterContainerTrafficEncryption": True,
        # Checkpoints sync to S3 so a spot restart (same job) resumes instead of starting over.
        "CheckpointConfig": {"S3Uri": s3_layout.checkpoint_uri(settings.artifacts_bucket, event.run_id),
                             "LocalPath": CHECKPOINT_DIR},
        "Tags": [{"Key": "d2ops:run-id", "Value": event.run_id}],
    }


def model_artifact_uri(training_job: dict[str, Any]) -> str:
    """Where SageMaker writes model.tar.gz: <S3OutputPath>/<TrainingJobName>/output/model.tar.gz."""
    output = training_job["OutputDataConfig"]["S3OutputPath"].rstrip("/")
    return f"{output}/{training_job['TrainingJobName']}/output/model.tar.gz"


def evaluation_job_request(settings: PrepareSettings, event: PrepareEvent, names: JobNames,
                           challenger_model: str, champion: ChampionRef | None,
                           thresholds: GateThresholds, *, dataset: DatasetSize | None = None,
                           weights_bytes: int | None = None) -> dict[str, Any]:
    def model_input(name: str, uri: str) -> dict[str, Any]:
        return {"InputName": name, "S3Input": {"S3Uri": uri, "LocalPath": f"{PROCESSING_ROOT}/input/{name}",
                                                "S3DataType": "S3Prefix", "S3InputMode": "File"}}

    snapshot, _ = dataset_snapshot(settings, event)
    # The snapshot once, as training reads it (the job reads the val split's files from it).
    inputs = [model_input("challenger", challenger_model), model_input(DATASET_CHANNEL, snapshot)]
    if champion is not None:
        inputs.append(model_input("champion", champion.model_data))
    return {
        "ProcessingJobName": names.evaluation_job,
        "RoleArn": settings.evaluation_role_arn,
        "AppSpecification": {"ImageUri": settings.evaluation_image_uri,
                             "ContainerEntrypoint": list(EVALUATION_ENTRYPOINT)},
        "ProcessingInputs": inputs,
        # The bootstrap's settings are the plan's gate ($.plan.gate), so the interval is the one it judges.
        # The run id names the monitor's baseline the job writes (monitoring-baseline.json's run_id).
        "Environment": {**image_rule_environment(settings), run_ids.RUN_ID_ENV: event.run_id,
                        **gate_settings.job_environment(
            thresholds.confidence, thresholds.resamples, thresholds.min_class_instances, thresholds.max_regression,
            thresholds.max_class_regression)},
        "ProcessingOutputConfig": {"Outputs": [{
            "OutputName": "evaluation",
            "S3Output": {"S3Uri": s3_layout.evaluation_output_uri(settings.artifacts_bucket, event.run_id),
                         "LocalPath": f"{PROCESSING_ROOT}/output", "S3UploadMode": "EndOfJob"}}]},
        "ProcessingResources": {"ClusterConfig": {
            "InstanceCount": 1, "InstanceType": settings.evaluation_instance_type,
            "VolumeSizeInGB": sized_volume("evaluation", settings.evaluation_instance_type, "EvaluationInstanceType",
                                           dataset or DatasetSize(0, 0),
                                           weights_bytes if settings.fine_tunes else None, EVALUATION_MODEL_COPIES)}},
        "StoppingCondition": {"MaxRuntimeInSeconds": EVALUATION_MAX_SECONDS},
        # Evaluation reads its inputs and writes its report through SageMaker's own transfer: no network.
        "NetworkConfig": {"EnableNetworkIsolation": True, "EnableInterContainerTrafficEncryption": True},
        "Tags": [{"Key": "d2ops:run-id", "Value": event.run_id}],
    }


def traffic_routing(instance_count: int) -> TrafficRoutingConfig:
    """How UpdateEndpoint shifts traffic to the new fleet, from the variant's instance count.

    SageMaker's TrafficRoutingConfig.CanarySize "must be less than or equal to 50% of the
    variant's total instance count", and a canary is whole instances, so a one-instance variant
    cannot have one. It gets ALL_AT_ONCE with the same bake: the new fleet takes all traffic
    while the old one stays provisioned, and an alarm during the bake shifts everything back
    (SageMaker's "all at once traffic shifting" guide), so the smoke test still judges the new
    model before the old fleet is terminated. Two instances or more: a 25 % canary (at least
    one instance, at most half of them).
    """
    if instance_count >= 2:
        return TrafficRoutingConfig(Type="CANARY", WaitIntervalInSeconds=BAKE_SECONDS,
                                    CanarySize=CapacitySize(Type="CAPACITY_PERCENT", Value=CANARY_PERCENT))
    return TrafficRoutingConfig(Type="ALL_AT_ONCE", WaitIntervalInSeconds=BAKE_SECONDS)


def check_instance_types(settings: PrepareSettings) -> None:
    """Refuse, before anything starts, an instance type the images cannot run on (Inferentia and
    Trainium need Neuron-compiled models, p2/p3 GPUs are older than the images' CUDA build covers,
    an unknown family has no known driver): platform.UnsupportedInstanceType, one line naming it."""
    platform.gpu_family(settings.training_instance_type, "training")
    platform.gpu_family(settings.evaluation_instance_type, "processing")
    platform.gpu_family(settings.endpoint_instance_type, "endpoint")


def production_variants(settings: PrepareSettings, names: JobNames) -> list[dict[str, Any]]:
    """CreateEndpointConfig's ProductionVariants. A GPU variant whose family's default driver cannot
    run the serving image's CUDA build (g4dn, g5, p4d, p4de: driver 470 / CUDA 11.4 unless the
    variant asks for another AMI; SageMaker never applies one by itself) names the documented
    InferenceAmiVersion that can; CPU variants and GPU families whose default already runs it name
    none (the field is for GPU and Neuron hosts)."""
    variant: dict[str, Any] = {"VariantName": VARIANT_NAME, "ModelName": names.model,
                               "InstanceType": settings.endpoint_instance_type,
                               "InitialInstanceCount": settings.endpoint_instance_count}
    ami = platform.endpoint_ami(settings.endpoint_instance_type, platform.IMAGE_CUDA)
    if ami is not None:
        variant["InferenceAmiVersion"] = ami.name
    return [variant]


def data_capture_config(settings: PrepareSettings) -> dict[str, Any]:
    """CreateEndpointConfig's DataCaptureConfig: requests and answers, sampled at CaptureSamplingPercentage, to
    ``capture/`` in the artifacts bucket (d2ops_core.capture_files reads them back). Answers are JSON, so they
    are stored as text; images are not, so base64. 0 % is EnableCapture false (the API allows 0-100 and the
    state cannot leave the key out). No KmsKeyId: the bucket's default encryption (SSE-S3) applies."""
    percent = settings.capture_sampling_percentage
    return {"EnableCapture": percent > 0, "InitialSamplingPercentage": percent,
            "DestinationS3Uri": s3_layout.capture_destination_uri(settings.artifacts_bucket),
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
            "CaptureContentTypeHeader": {"JsonContentTypes": list(JSON_CONTENT_TYPES)}}


def check_request(settings: PrepareSettings, event: PrepareEvent) -> None:
    """What refuses a run's jobs before anything starts, whatever data they read."""
    problems = stack_limit_problems(event.manifest.gate, event.manifest.training, settings.limits)
    if problems:
        raise ManifestExceedsStackLimits("; ".join(f"{code}: {message}" for code, message, _ in problems))
    check_instance_types(settings)
    check_weights_match(settings, event)


def experiment_training_job(settings: PrepareSettings, event: PrepareEvent, *, dataset: DatasetSize | None = None,
                            weights_bytes: int | None = None) -> dict[str, Any]:
    """The pipeline's training job on ``event.dataset``'s prefix as it is now (d2ops.sdk's experiments:
    nothing validated, nothing snapshotted, never promoted), with the pipeline's checks; ``dataset`` is the
    prefix's listing, which the channel downloads whole."""
    check_request(settings, event)
    return training_job_request(settings, event, job_names(event.run_id), dataset_uri=event.dataset.uri,
                                dataset=dataset, weights_bytes=weights_bytes)


def build_plan(settings: PrepareSettings, event: PrepareEvent, champion: ChampionRef | None,
               dataset_diff: DatasetDiffSummary | None = None, *, dataset: DatasetSize | None = None,
               weights_bytes: int | None = None) -> Plan:
    """The run's plan. ``dataset`` (the inventory's sum, handler.py reads it) and ``weights_bytes`` size the
    jobs' volumes; None sizes them for an empty dataset, i.e. the floor (tests that do not size)."""
    snapshot, digest = dataset_snapshot(settings, event)
    check_request(settings, event)
    names = job_names(event.run_id)
    training = training_job_request(settings, event, names, dataset=dataset, weights_bytes=weights_bytes)
    min_map, max_regression = effective_gate(settings.limits, event.manifest.gate)
    max_class_regression, min_class_instances = effective_class_gate(settings.limits, event.manifest.gate)
    confidence, resamples = effective_interval(settings.limits, event.manifest.gate)
    gate = GateThresholds(primary_metric=metrics.primary_metric(event.manifest.task), min_map=min_map,
                          max_regression=max_regression, max_class_regression=max_class_regression,
                          min_class_instances=min_class_instances, confidence=confidence, resamples=resamples,
                          min_compared_images=settings.limits.min_compared_images
                          or gate_settings.DEFAULT_MIN_COMPARED_IMAGES)
    return Plan(
        training_job=training,
        evaluation_job=evaluation_job_request(settings, event, names, model_artifact_uri(training), champion, gate,
                                              dataset=dataset, weights_bytes=weights_bytes),
        names=names,
        gate=gate,
        endpoint=EndpointPlan(instance_type=settings.endpoint_instance_type,
                              instance_count=settings.endpoint_instance_count,
                              production_variants=production_variants(settings, names),
                              data_capture_config=data_capture_config(settings),
                              poll_seconds=settings.endpoint_poll_seconds,
                              max_wait_attempts=settings.endpoint_max_wait_attempts,
                              traffic_routing=traffic_routing(settings.endpoint_instance_count)),
        evaluation_report_uri=s3_layout.evaluation_report_uri(settings.artifacts_bucket, event.run_id),
        champion=champion,
        dataset_diff=dataset_diff,
        dataset_snapshot_uri=snapshot,
        inventory_digest=digest,
    )


def champion_ref(record: ChampionRecord | None) -> ChampionRef | None:
    if record is None:
        return None
    return ChampionRef(run_id=record.run_id, model_data=record.model_data, model_package_arn=record.model_package_arn,
                       primary_metric=record.primary_metric, primary_value=record.primary_value)


def diff_against_champion(s3: Any, settings: PrepareSettings, event: PrepareEvent, champion: ChampionRecord | None,
                          *, seconds: float) -> DatasetDiffSummary | None:
    """What changed in the data since the champion's run: ``runs/<run id>/dataset-diff.json`` and its summary.

    Both sides are read from their runs' inventories and snapshots (the champion's expired snapshot: its
    dataset prefix at the versions its inventory pinned; a champion older than inventories: its prefix as
    it is now, images uncompared). Information only: any failure, the time budget (``seconds``) included,
    becomes the summary's ``error`` and the run goes on. None: there is no champion to compare with.
    """
    if champion is None:
        return None
    deadline = time.monotonic() + seconds
    key = s3_layout.dataset_diff_key(event.run_id)
    try:
        old = index_run(s3, settings.artifacts_bucket, champion.run_id, dataset_bucket=champion.dataset.bucket,
                        dataset_prefix=champion.dataset.prefix, hash_fallback_images=False, deadline=deadline)
        new = index_run(s3, settings.artifacts_bucket, event.run_id, deadline=deadline)
        diff = compare(old, new)
        s3.put_object(Bucket=settings.artifacts_bucket, Key=key, Body=diff.model_dump_json(indent=1).encode(),
                      ContentType="application/json")
    except Exception as exc:  # the diff informs; it never decides whether the run trains
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return DatasetDiffSummary(champion_run_id=champion.run_id,
                                  against=f"{champion.dataset.name}/{champion.dataset.version}",
                                  error=f"{type(exc).__name__}: {reason}"[:500])
    return DatasetDiffSummary.of(diff, uri=s3_layout.s3_uri(settings.artifacts_bucket, key),
                                 champion_run_id=champion.run_id)
