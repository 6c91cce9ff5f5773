"""Platform facts: what SageMaker's hosts and an AWS account give a job or an endpoint.

Nothing here can be observed on a development machine (no GPU driver, no account quota, no
network rule), so each fact is written down once, with its source and the date it was read, and
the images, the job requests and the preflight (`d2ops doctor`) are tested against this table.
When AWS changes a fact, change it here and let the tests say what no longer fits.

Standard library only (the Lambda layer and both images ship it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

CHECKED = "2026-11-26"


@dataclass(frozen=True)
class Source:
    """Where a fact was read, and when."""

    url: str
    checked: str = CHECKED


_INSTANCE_TYPE = re.compile(r"^ml\.(?P<family>[a-z0-9]+)\.(?P<size>[a-z0-9]+)$")


def instance_family(instance_type: str) -> str:
    """``ml.g4dn.xlarge`` -> ``g4dn``; a ValueError names anything that is not a SageMaker instance type."""
    match = _INSTANCE_TYPE.match(instance_type)
    if match is None:
        raise ValueError(f"{instance_type!r} is not a SageMaker instance type (ml.<family>.<size>)")
    return match["family"]


# ---------------------------------------------------------------------------------------- quotas
# Service Quotas names SageMaker's per-instance-type limits "<instance type> for <usage>"; a new
# account's GPU quotas are often 0 (spot training in particular). The quota *codes* (L-...) differ
# per instance type and are not derivable, so the preflight and the failure message find a quota by
# its name (ListServiceQuotas, service code "sagemaker").
QUOTA_SERVICE_CODE = "sagemaker"
QUOTA_SOURCE = Source("https://docs.aws.amazon.com/sagemaker/latest/dg/regions-quotas.html")

QuotaUsage = Literal["training", "spot training", "processing", "endpoint"]
_QUOTA_SUFFIX: dict[str, str] = {
    "training": "for training job usage",
    "spot training": "for spot training job usage",
    "processing": "for processing job usage",
    "endpoint": "for endpoint usage",
}


def quota_name(instance_type: str, usage: QuotaUsage) -> str:
    """The Service Quotas name of the limit a job or an endpoint of ``instance_type`` counts against."""
    instance_family(instance_type)  # refuse a malformed type here, not as a quota that never matches
    return f"{instance_type} {_QUOTA_SUFFIX[usage]}"


_QUOTA_MESSAGE = re.compile(
    r"account-level service limit '(?P<name>[^']+)' is (?P<value>\d+(?:\.\d+)?) Instances?"
    r"(?:, with current utilization of (?P<used>\d+(?:\.\d+)?) Instances?)?"
    r"(?: and a request delta of (?P<delta>\d+(?:\.\d+)?) Instances?)?")


@dataclass(frozen=True)
class QuotaRefusal:
    """What SageMaker's ResourceLimitExceeded message says about the quota a request exceeded."""

    name: str
    value: float
    used: float | None = None
    requested: float | None = None


def parse_quota_refusal(message: str) -> QuotaRefusal | None:
    """SageMaker words a quota refusal as "The account-level service limit '<quota name>' is N
    Instances, with current utilization of U Instances and a request delta of D Instances. Please use
    AWS Service Quotas to request an increase for this quota." None when ``message`` is not one."""
    match = _QUOTA_MESSAGE.search(message)
    if match is None:
        return None

    def number(group: str) -> float | None:
        return float(match[group]) if match[group] is not None else None

    return QuotaRefusal(name=match["name"], value=float(match["value"]), used=number("used"),
                        requested=number("delta"))


_QUOTA_NAME = re.compile(r"^(?P<type>ml\.[a-z0-9]+\.[a-z0-9]+) (?P<suffix>for .+)$")


def parse_quota_name(name: str) -> tuple[str, QuotaUsage] | None:
    """``"ml.g4dn.xlarge for spot training job usage"`` -> ``("ml.g4dn.xlarge", "spot training")``; None for a
    quota that is not one of the per-instance-type limits :func:`quota_name` names."""
    match = _QUOTA_NAME.match(name)
    if match is None:
        return None
    usage = next((u for u, suffix in _QUOTA_SUFFIX.items() if suffix == match["suffix"]), None)
    return (match["type"], usage) if usage is not None else None  # type: ignore[return-value]


def _instances(value: float) -> str:
    return f"{value:g} Instances"  # SageMaker's plural, "1 Instances" too


def quota_refusal_message(name: str, value: float, used: float, requested: float) -> str:
    """SageMaker's ResourceLimitExceeded message for a request over a per-instance-type quota, in the words
    :func:`parse_quota_refusal` reads (the offline SageMaker answers with it)."""
    return (f"The account-level service limit '{name}' is {_instances(value)}, with current utilization of "
            f"{_instances(used)} and a request delta of {_instances(requested)}. Please use AWS Service Quotas to "
            "request an increase for this quota.")


# How a quota is raised: Service Quotas, in its console (service "Amazon SageMaker") or with the AWS CLI. The
# quota code is per instance type and usage, so it is found by name first. Sources: the Service Quotas user
# guide, "Requesting a quota increase"; the AWS CLI reference of list-service-quotas and
# request-service-quota-increase. ListServiceQuotas answers only quotas whose value was changed (applied); a
# new account's quota still at its default (often 0) is listed, with its code, by ListAWSDefaultServiceQuotas.
QUOTA_INCREASE_SOURCE = Source("https://docs.aws.amazon.com/servicequotas/latest/userguide/request-quota-increase.html")
QUOTA_CONSOLE_SERVICE = "Amazon SageMaker"
QUOTA_FIND_CODE = f"aws service-quotas list-aws-default-service-quotas --service-code {QUOTA_SERVICE_CODE}"
QUOTA_REQUEST_INCREASE = ("aws service-quotas request-service-quota-increase --service-code "
                          f"{QUOTA_SERVICE_CODE} --quota-code CODE --desired-value {{desired}}")

# A blue/green UpdateEndpoint (all at once, canary or linear) provisions the new ("green") fleet in full
# beside the old ("blue") one, which keeps its instances until the baking period ends: an update holds
# twice the variant's instances against the endpoint quota, where the first CreateEndpoint holds once.
BLUE_GREEN_SOURCE = Source("https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-blue-green.html")
BLUE_GREEN_FLEETS = 2


# ------------------------------------------------------------------------------ model registry
# CreateModelPackage's ModelPackageDescription (botocore shape EntityDescription): at most 1,024
# characters, each of the Unicode categories letter, mark, separator, symbol, number or punctuation
# (pattern [\p{L}\p{M}\p{Z}\p{S}\p{N}\p{P}]*): no control, format or unassigned characters. A request
# outside it is a ValidationException, so the run would end RegistrationFailed instead of with the
# gate's verdict. tests/unit/test_registry_description.py reads both from botocore's model.
MODEL_PACKAGE_DESCRIPTION_SOURCE = Source(
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateModelPackage.html")
MODEL_PACKAGE_DESCRIPTION_MAX = 1024
MODEL_PACKAGE_DESCRIPTION_CATEGORIES = frozenset("LMZSNP")  # first letters of unicodedata.category

# UpdateModelPackage's ApprovalDescription (botocore shape ApprovalDescription): at most 1,024 characters of
# pattern .* , a Java regex whose . matches anything but a line terminator (\n, \r, \u0085, \u2028,
# \u2029): one line. The review's decision is written there ("<approved|rejected> by <ARN>: <reason>",
# the "Read review decision" Lambda, functions/request_review); a longer or multi-line one would be a
# ValidationException and end the run RegistrationFailed instead of with the reviewer's decision.
# tests/unit/test_review_decision.py reads both from botocore's model.
APPROVAL_DESCRIPTION_SOURCE = Source(
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_UpdateModelPackage.html")
APPROVAL_DESCRIPTION_MAX = 1024
JAVA_LINE_TERMINATORS = frozenset("\n\r\u0085\u2028\u2029")

# CreateModelPackage's CustomerMetadataProperties (botocore shapes CustomerMetadataMap, CustomerMetadataKey,
# CustomerMetadataValue): at most 50 entries; keys of 1-128 and values of 1-256 characters, each a letter,
# separator or number (\p{L}\p{Z}\p{N}) or one of _.:/=+-@. No JSON fits (no braces, quotes, commas), so a
# map (the per-class score thresholds) goes in as "name=value" words, bounded (d2ops_core.score_thresholds).
# tests/unit/test_score_thresholds_registry.py reads these from botocore's model.
CUSTOMER_METADATA_SOURCE = MODEL_PACKAGE_DESCRIPTION_SOURCE
CUSTOMER_METADATA_MAX_ENTRIES = 50
CUSTOMER_METADATA_KEY_MAX = 128
CUSTOMER_METADATA_VALUE_MAX = 256
CUSTOMER_METADATA_CATEGORIES = frozenset("LZN")  # first letters of unicodedata.category
CUSTOMER_METADATA_SYMBOLS = frozenset("_.:/=+-@")


# ------------------------------------------------------------------------------ GPU hosts, CUDA
# Whether an image's CUDA build can run on a host depends on the NVIDIA driver the host carries,
# which nothing here can observe. SageMaker documents it for real-time endpoints only (per instance
# family, and per InferenceAmiVersion); the images and the job/endpoint requests are tested against
# this section (tests/unit/test_platform_gpu.py).

Version = tuple[int, int]


@dataclass(frozen=True)
class Driver:
    """An NVIDIA driver branch and the newest CUDA it runs natively."""

    branch: int  # 470, 535, 550, 580
    cuda: Version  # (11, 4) ...
    source: Source


ENDPOINT_DRIVERS_SOURCE = Source("https://docs.aws.amazon.com/sagemaker/latest/dg/inference-gpu-drivers.html")
_R470 = Driver(470, (11, 4), ENDPOINT_DRIVERS_SOURCE)
_R535 = Driver(535, (12, 2), ENDPOINT_DRIVERS_SOURCE)
_R550 = Driver(550, (12, 4), ENDPOINT_DRIVERS_SOURCE)


@dataclass(frozen=True)
class GpuFamily:
    """A SageMaker GPU instance family: its GPU, and the driver a real-time endpoint gets by default
    ("SageMaker AI does not apply AMI overrides automatically": without InferenceAmiVersion, this one)."""

    family: str
    gpu: str
    compute_capability: Version  # NVIDIA's "CUDA GPUs" table
    endpoint_default: Driver


GPU_SOURCE = Source("https://developer.nvidia.com/cuda-gpus")
GPU_FAMILIES: dict[str, GpuFamily] = {f.family: f for f in (
    GpuFamily("g4dn", "NVIDIA T4", (7, 5), _R470),
    GpuFamily("g5", "NVIDIA A10G", (8, 6), _R470),
    GpuFamily("p4d", "NVIDIA A100", (8, 0), _R470),
    GpuFamily("p4de", "NVIDIA A100 80GB", (8, 0), _R470),
    GpuFamily("g6", "NVIDIA L4", (8, 9), _R535),
    GpuFamily("p5", "NVIDIA H100", (9, 0), _R535),
    GpuFamily("p5e", "NVIDIA H200", (9, 0), _R550),
    GpuFamily("p5en", "NVIDIA H200", (9, 0), _R550),
)}

# Families with no accelerator the images need: both run there on CPU (x86_64 images, so no
# Graviton families). Source: SageMaker's instance types for training, processing and hosting.
CPU_FAMILIES_SOURCE = Source("https://aws.amazon.com/sagemaker/pricing/")
CPU_FAMILIES: frozenset[str] = frozenset({
    "t2", "t3", "m4", "m5", "m5d", "m6i", "m7i", "c4", "c5", "c5d", "c6i", "c7i", "r5", "r5d", "r6i", "r7i"})

# Families SageMaker offers that these images cannot use, and why (a stack parameter naming one is
# refused by the template's pattern, and prepare_training says why).
UNSUPPORTED_FAMILIES: dict[str, str] = {
    "p2": "NVIDIA K80 (compute capability 3.7): no current torch build has kernels for it",
    "p3": "NVIDIA V100 (compute capability 7.0): below the images' floor of 7.5 (torch's CUDA 13 "
          "builds already dropped Volta)",
    "p3dn": "NVIDIA V100 (compute capability 7.0): see p3",
    "g4ad": "AMD Radeon GPU: the images are CUDA builds",
    "g6e": "not yet in this table (its endpoint driver is not documented on the page this table reads)",
    "inf1": "AWS Inferentia: needs a Neuron-compiled model, the images serve TorchScript on CUDA or CPU",
    "inf2": "AWS Inferentia2: needs a Neuron-compiled model, the images serve TorchScript on CUDA or CPU",
    "trn1": "AWS Trainium: needs Neuron-compiled training, the training image is a CUDA build",
    "trn1n": "AWS Trainium: needs Neuron-compiled training, the training image is a CUDA build",
    "trn2": "AWS Trainium2: needs Neuron-compiled training, the training image is a CUDA build",
}
# The lowest compute capability the images are checked for (torch's CUDA 12.x wheels and the
# training image's TORCH_CUDA_ARCH_LIST start here; see UNSUPPORTED_FAMILIES for what that excludes).
MIN_COMPUTE_CAPABILITY: Version = (7, 5)


@dataclass(frozen=True)
class InferenceAmi:
    """A ProductionVariant.InferenceAmiVersion value: the driver it brings and the families it is
    documented for (only what a source names; an AMI is never chosen for a family it does not list)."""

    name: str
    driver: Driver
    families: frozenset[str]
    cuda_compat_mounting: bool  # False: "NVIDIA Container Toolkit with disabled CUDA-compat mounting"


# botocore's model (ProductionVariant.InferenceAmiVersion; botocore 1.43 in this repository's venv)
# gives each version's driver and CUDA; its February 2025 wording (botocore 1.36.20, as synced into
# aws/sagemaker-core#245) listed al2-ami-sagemaker-inference-gpu-2's instance types. The others'
# families are only those the driver page names as their defaults.
AMI_SOURCE = Source("https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariant.html")
AMI_FAMILIES_SOURCE = Source("https://github.com/aws/sagemaker-core/pull/245")
INFERENCE_AMIS: dict[str, InferenceAmi] = {a.name: a for a in (
    InferenceAmi("al2-ami-sagemaker-inference-gpu-2", Driver(535, (12, 2), AMI_SOURCE),
                 frozenset({"g4dn", "g5", "g6", "p3", "p4d", "p4de", "p5"}), cuda_compat_mounting=True),
    InferenceAmi("al2-ami-sagemaker-inference-gpu-2-1", Driver(535, (12, 2), AMI_SOURCE),
                 frozenset({"g6", "p5"}), cuda_compat_mounting=False),
    InferenceAmi("al2-ami-sagemaker-inference-gpu-3-1", Driver(550, (12, 4), AMI_SOURCE),
                 frozenset({"p5e", "p5en"}), cuda_compat_mounting=False),
    InferenceAmi("al2023-ami-sagemaker-inference-gpu-4-1", Driver(580, (13, 0), AMI_SOURCE),
                 frozenset(), cuda_compat_mounting=False),
)}

# CUDA's minor-version compatibility: a build for CUDA <major>.x runs on any driver of at least this
# branch (with no PTX JIT: the wheels must carry machine code for the GPU). CUDA 11: 450, 12: 525,
# 13: 580.
CUDA_SOURCE = Source("https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html")
MINOR_VERSION_COMPAT_DRIVER: dict[int, int] = {11: 450, 12: 525, 13: 580}
# Forward compatibility: the cuda-compat-<major>-<minor> package's user-mode driver, put first on
# LD_LIBRARY_PATH, runs a newer CUDA on an older kernel driver, on data-center GPUs (every
# family above), from the R470 branch on. NVIDIA Container Toolkit 1.17.4 and later no longer
# mount it: the container must point the loader at it itself.
FORWARD_COMPAT_SOURCE = Source("https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html")
FORWARD_COMPAT_MIN_DRIVER = 470

# Training and processing hosts: SageMaker documents no driver table for them. AWS's own training
# images (aws/deep-learning-containers, start_cuda_compat.sh, run from every GPU image's entry "for
# older drivers (e.g., g5 instances)") enable forward compatibility when the host's driver is older
# than their CUDA. So a job is assumed to get the oldest driver SageMaker documents for any GPU
# family, and an image must run there.
JOB_DRIVER_SOURCE = Source("https://github.com/aws/deep-learning-containers")
JOB_HOST_DRIVER = Driver(470, (11, 4), JOB_DRIVER_SOURCE)

# The CUDA build of both images' torch: ARG TORCH_INDEX_URL (.../whl/cu126) in containers/training and
# containers/serving's Dockerfiles. prepare_training chooses InferenceAmiVersion for it (a Lambda
# cannot read a Dockerfile); tests/unit/test_platform_gpu.py fails when the Dockerfiles say otherwise.
IMAGE_CUDA: Version = (12, 6)

# NVIDIA's container toolkit gives a container the GPUs and driver libraries its environment names:
# NVIDIA_VISIBLE_DEVICES ("all"; void, empty or unset: the container starts as under runc, with no GPU
# and no driver) and NVIDIA_DRIVER_CAPABILITIES ("compute" = libcuda, "utility" = nvidia-smi/NVML).
# NVIDIA's CUDA images set both to these values; python:*-slim sets neither, and whether SageMaker's
# hosts set them is not documented, so an image that needs the GPU declares them itself or inherits
# them from a base listed here. tests/unit/test_platform_container_toolkit.py reads the Dockerfiles.
CONTAINER_TOOLKIT_SOURCE = Source(
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html",
    "2026-11-29")
CONTAINER_TOOLKIT_ENV: dict[str, str] = {"NVIDIA_VISIBLE_DEVICES": "all",
                                         "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
# Base images (repository, any tag or digest) that already set CONTAINER_TOOLKIT_ENV: NVIDIA's CUDA
# images declare both in their base layer (dist/<version>/ubuntu2204/base/Dockerfile).
CUDA_IMAGES_SOURCE = Source("https://gitlab.com/nvidia/container-images/cuda", "2026-11-29")
BASES_WITH_CONTAINER_TOOLKIT_ENV: frozenset[str] = frozenset({"nvidia/cuda"})


# --------------------------------------------------------------- multi-node training: EFA and NCCL
# NCCL finds a network plugin through the dynamic loader: with NCCL_NET_PLUGIN unset it opens
# libnccl-net.so; set to a library name it opens that, set to a suffix libnccl-net-<suffix>.so;
# "none" loads none. Without a loadable plugin NCCL uses its own transports (TCP sockets here).
NCCL_PLUGIN_SOURCE = Source("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-net-plugin",
                            "2026-11-29")
NCCL_DEFAULT_PLUGIN = "libnccl-net.so"
# Where AWS's EFA installer puts aws-ofi-nccl on Ubuntu (AWS's own deep learning containers check these
# paths after installing): before 1.44.0 lib/<multiarch>/libnccl-net.so (beside libnccl-net-ofi.so), so
# NCCL finds it by default once the directory is on LD_LIBRARY_PATH; from 1.44.0 lib/libnccl-net-ofi.so
# only, which NCCL loads with NCCL_NET_PLUGIN=ofi. The training image's LD_LIBRARY_PATH and ENV are
# tested against this (tests/unit/test_nccl_check.py).
OFI_NCCL_LAYOUT_SOURCE = Source(
    "https://github.com/aws/deep-learning-containers/blob/master/scripts/common/install_efa.sh", "2026-11-29")
OFI_NCCL_ROOT = "/opt/amazon/ofi-nccl"
OFI_NCCL_FLAT_LAYOUT_FROM: tuple[int, int, int] = (1, 44, 0)


@dataclass(frozen=True)
class NcclPlugin:
    """Where an EFA installer version puts the plugin, and the NCCL_NET_PLUGIN it needs (None: the default)."""

    directory: str
    library: str
    net_plugin: str | None


def ofi_nccl_plugin(efa_installer: tuple[int, int, int], multiarch: str = "x86_64-linux-gnu") -> NcclPlugin:
    if efa_installer >= OFI_NCCL_FLAT_LAYOUT_FROM:
        return NcclPlugin(f"{OFI_NCCL_ROOT}/lib", "libnccl-net-ofi.so", "ofi")
    return NcclPlugin(f"{OFI_NCCL_ROOT}/lib/{multiarch}", NCCL_DEFAULT_PLUGIN, None)


# aws-ofi-nccl on EC2 restricts libfabric to the efa provider by itself when FI_PROVIDER is unset, and
# where no EFA device exists its init fails and NCCL falls back to TCP (src/platform-aws.cpp). Its docs
# call FI_PROVIDER=efa needed only up to aws-ofi-nccl 1.5.0 and FI_EFA_USE_DEVICE_RDMA=1 unneeded from
# libfabric 1.18 / aws-ofi-nccl 1.7 (installer 1.43 ships newer). A FI_PROVIDER naming another provider
# keeps the plugin off EFA, so the image sets none globally: its entry sets FI_PROVIDER=efa only where an
# EFA device exists (model_code/training/nccl_check.py) and logs what NCCL will load.
OFI_NCCL_SOURCE = Source("https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md", "2026-11-29")
EFA_PROVIDER = "efa"
# An EFA device is an RDMA device (/sys/class/infiniband/<name>, named rdmap<..> or efa_<n>) bound to the
# kernel's "efa" driver: <device>/device/driver links to .../drivers/efa.
EFA_DRIVER = "efa"


# ------------------------------------------------------------------------- the training image's Python
# Ubuntu 22.04's python3.11 (universe) is 3.11.0~rc1-1~22.04.1: the 3.11.0 release candidate, whose
# later fixes come only through Ubuntu Pro's ESM (…~esm<n> versions). The training image instead runs
# CPython 3.11.18, python-build-standalone's build (release 20261110, the one uv 0.13.9 installs; uv
# checks its sha256). The serving image's base, python:3.11-slim-bookworm, is CPython's own 3.11.x.
# tests/unit/test_training_python.py reads ARG PYTHON_VERSION from the training Dockerfile.
UBUNTU_JAMMY_PYTHON311 = "3.11.0~rc1-1~22.04.1"
UBUNTU_PYTHON_SOURCE = Source("https://launchpad.net/ubuntu/+source/python3.11", "2026-11-29")
TRAINING_PYTHON: tuple[int, int, int] = (3, 11, 18)
TRAINING_PYTHON_SOURCE = Source(
    "https://github.com/astral-sh/python-build-standalone/releases/tag/20261110", "2026-11-29")

Usage = Literal["training", "processing", "endpoint"]


class UnsupportedInstanceType(ValueError):
    """An instance type the images cannot run on, or that this table does not know."""


def gpu_family(instance_type: str, usage: Usage) -> GpuFamily | None:
    """The GPU family of ``instance_type``; None for a CPU family. Raises UnsupportedInstanceType
    (one line, naming the type, its use and why) for anything the images cannot run on."""
    try:
        family = instance_family(instance_type)
    except ValueError as exc:
        raise UnsupportedInstanceType(f"{usage} instance type {exc}") from None
    if family in GPU_FAMILIES:
        return GPU_FAMILIES[family]
    if family in CPU_FAMILIES:
        return None
    reason = UNSUPPORTED_FAMILIES.get(family, "not in d2ops_core.platform's table of instance families "
                                              "(add it there, with its source, once its driver is known)")
    raise UnsupportedInstanceType(f"{usage} instance type {instance_type}: {reason}")


def known_families() -> frozenset[str]:
    """Every family a stack may name (the template's instance-type patterns list exactly these)."""
    return frozenset(GPU_FAMILIES) | CPU_FAMILIES


def runs_natively(cuda: Version, driver: Driver) -> bool:
    """A CUDA ``cuda`` build runs on ``driver`` without forward compatibility: the driver's own CUDA
    is as new, or minor-version compatibility covers it (same major, branch new enough)."""
    if driver.cuda >= cuda:
        return True
    floor = MINOR_VERSION_COMPAT_DRIVER.get(cuda[0])
    return driver.cuda[0] == cuda[0] and floor is not None and driver.branch >= floor


def endpoint_ami(instance_type: str, cuda: Version) -> InferenceAmi | None:
    """The InferenceAmiVersion a real-time endpoint of ``instance_type`` needs to run a CUDA ``cuda``
    build: None where the default driver already runs it (and always for CPU families); otherwise the
    documented AMI for that family with the oldest driver that runs it. UnsupportedInstanceType when
    no documented AMI does."""
    family = gpu_family(instance_type, "endpoint")
    if family is None or runs_natively(cuda, family.endpoint_default):
        return None
    for ami in sorted(INFERENCE_AMIS.values(), key=lambda a: (a.driver.branch, a.name)):
        if family.family in ami.families and runs_natively(cuda, ami.driver):
            return ami
    raise UnsupportedInstanceType(
        f"endpoint instance type {instance_type}: its default NVIDIA driver {family.endpoint_default.branch} "
        f"cannot run the serving image's CUDA {cuda[0]}.{cuda[1]}, and no documented InferenceAmiVersion "
        "for it can")


def endpoint_driver(instance_type: str, ami: str | None) -> Driver | None:
    """The driver a real-time endpoint variant really gets: the AMI's when the variant names one
    (refused for a family the AMI is not documented for), else the family's default; None on CPU."""
    family = gpu_family(instance_type, "endpoint")
    if family is None:
        return None
    if ami is None:
        return family.endpoint_default
    chosen = INFERENCE_AMIS[ami]
    if family.family not in chosen.families:
        raise UnsupportedInstanceType(f"endpoint instance type {instance_type}: {ami} is not documented for it")
    return chosen.driver


def job_can_run(cuda: Version, instance_type: str, usage: Usage, forward_compat: bool) -> bool:
    """Whether a training or processing job's image (CUDA ``cuda`` build, forward compatibility
    enabled at its entry or not) can use the GPU of ``instance_type`` on the driver jobs are assumed
    to get. True on CPU families."""
    family = gpu_family(instance_type, usage)
    if family is None:
        return True
    if family.compute_capability < MIN_COMPUTE_CAPABILITY:
        return False
    if runs_natively(cuda, JOB_HOST_DRIVER):
        return True
    return forward_compat and JOB_HOST_DRIVER.branch >= FORWARD_COMPAT_MIN_DRIVER


# ----------------------------------------------------------------------------------- job storage
# A training or processing job keeps its File-mode inputs, checkpoints and model output on one ML
# storage volume of VolumeSizeInGB (GB: SageMaker's unit, taken here as GiB to err large). On an
# instance type with NVMe instance storage SageMaker attaches no EBS volume: the job gets the
# instance store, whose size is fixed, and a VolumeSizeInGB larger than it is not accepted
# (ResourceConfig and ProcessingClusterConfig's VolumeSizeInGB in botocore's sagemaker model and the
# API reference). Elsewhere the volume is gp2 EBS: at most 16384 (ProcessingVolumeSizeInGB's max in
# botocore 1.43; gp2's own maximum, 16 TiB, bounds a training volume, whose model field has none).
# Each account also has an adjustable quota per job kind, "Size of EBS volume for a training|processing
# job instance" (1024 GB where recorded: aws/sagemaker-python-sdk#4939): a job over it is refused
# with ResourceLimitExceeded, which the failure summary explains; the stack does not guess a raised one.
JOB_VOLUME_SOURCE = Source("https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ResourceConfig.html",
                           "2026-11-29")
JOB_VOLUME_PROCESSING_SOURCE = Source(
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProcessingClusterConfig.html", "2026-11-29")
EBS_VOLUME_MAX_GB = 16384
EBS_VOLUME_QUOTA_SOURCE = Source("https://github.com/aws/sagemaker-python-sdk/issues/4939", "2026-11-29")
EBS_VOLUME_DEFAULT_QUOTA_GB = 1024
# Instance store per instance type (total of its NVMe devices, GB), for the families above that have
# one: the EC2 Instance Types guide's "Instance store specifications" tables (accelerated computing,
# general purpose, compute and memory optimized). A type of these families missing here is not
# refused early; SageMaker judges its request.
INSTANCE_STORE_SOURCE = Source("https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html#ac_instance-store",
                               "2026-11-29")
_D_SIZES = {"large": 75, "xlarge": 150, "2xlarge": 300, "4xlarge": 600, "8xlarge": 1200, "12xlarge": 1800,
            "16xlarge": 2400, "24xlarge": 3600}  # m5d and r5d share these
INSTANCE_STORE_GB: dict[str, int] = {
    **{f"ml.g4dn.{s}": gb for s, gb in {"xlarge": 125, "2xlarge": 225, "4xlarge": 225, "8xlarge": 900,
                                         "12xlarge": 900, "16xlarge": 900}.items()},
    **{f"ml.g5.{s}": gb for s, gb in {"xlarge": 250, "2xlarge": 450, "4xlarge": 600, "8xlarge": 900,
                                       "12xlarge": 3800, "16xlarge": 1900, "24xlarge": 3800, "48xlarge": 7600}.items()},
    **{f"ml.g6.{s}": gb for s, gb in {"xlarge": 250, "2xlarge": 450, "4xlarge": 600, "8xlarge": 900,
                                       "12xlarge": 3760, "16xlarge": 1880, "24xlarge": 3760, "48xlarge": 7520}.items()},
    "ml.p4d.24xlarge": 8000, "ml.p4de.24xlarge": 8000,
    # p5, p5e and p5en: 8 x 3840 GB NVMe (AWS's P5 page: "30 TB local NVMe"); some third-party tables say 8 x 475.
    "ml.p5.48xlarge": 30720, "ml.p5e.48xlarge": 30720, "ml.p5en.48xlarge": 30720,
    **{f"ml.c5d.{s}": gb for s, gb in {"large": 50, "xlarge": 100, "2xlarge": 200, "4xlarge": 400, "9xlarge": 900,
                                        "12xlarge": 1800, "18xlarge": 1800, "24xlarge": 3600}.items()},
    **{f"ml.m5d.{s}": gb for s, gb in _D_SIZES.items()},
    **{f"ml.r5d.{s}": gb for s, gb in _D_SIZES.items()},
}
# Families whose every size has instance storage (the ResourceConfig page names p4d, g4dn and g5).
INSTANCE_STORE_FAMILIES = frozenset({"g4dn", "g5", "g6", "p4d", "p4de", "p5", "p5e", "p5en", "c5d", "m5d", "r5d"})


@dataclass(frozen=True)
class VolumeLimit:
    """The most storage a job's host can have: ``gb`` (None: unknown, SageMaker judges) and what it is."""

    gb: int | None
    what: str


def job_volume_limit(instance_type: str) -> VolumeLimit:
    """How much ML storage a training or processing job on ``instance_type`` can have."""
    if instance_family(instance_type) in INSTANCE_STORE_FAMILIES:
        store = INSTANCE_STORE_GB.get(instance_type)
        return VolumeLimit(store, f"{instance_type}'s instance storage"
                                  + ("" if store else " (size not in d2ops_core.platform.INSTANCE_STORE_GB)")
                                  + ", which SageMaker uses instead of an EBS volume")
    return VolumeLimit(EBS_VOLUME_MAX_GB, "the largest EBS volume SageMaker attaches to a job instance")


# ------------------------------------------------------------------------- training job metrics
# SageMaker publishes each value a training job's MetricDefinitions regexes find in its logs to
# CloudWatch, in this namespace, under the definition's Name, with one dimension: the job's name.
# The SageMaker Python SDK's TrainingJobAnalytics reads them so (Dimensions [{"Name":
# "TrainingJobName", ...}]); its instance metrics (CPUUtilization, ...) carry "Host" instead.
TRAINING_METRICS_SOURCE = Source("https://github.com/aws/sagemaker-python-sdk/blob/master/src/sagemaker/analytics.py")
TRAINING_METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"
TRAINING_METRICS_DIMENSION = "TrainingJobName"
# The SageMaker docs document the "Host" dimension ("<job>/algo-<n>") for a training job's instance metrics
# and say nothing of its algorithm metrics' dimension; older SDKs (before TrainingJobAnalytics moved to
# TrainingJobName) read those under Host "<job>/algo-1", and so does this stack's dashboard. Readers ask
# for both; rank 0 (algo-1) prints the metric lines.
TRAINING_INSTANCE_METRICS_SOURCE = Source("https://docs.aws.amazon.com/sagemaker/latest/dg/monitoring-cloudwatch.html")
TRAINING_METRICS_HOST_DIMENSION = "Host"


def training_metrics_dimensions(job_name: str) -> tuple[list[dict[str, str]], ...]:
    """The dimension sets a training job's published metric values may carry, the one SageMaker's SDK reads first."""
    return ([{"Name": TRAINING_METRICS_DIMENSION, "Value": job_name}],
            [{"Name": TRAINING_METRICS_HOST_DIMENSION, "Value": f"{job_name}/algo-1"}])

# GetMetricData (MetricStat.Period): a metric of regular resolution (SageMaker's training metrics are
# published at a 1-minute frequency) has periods of 60 s or multiples; a query whose StartTime is
# 3 hours to 15 days ago must use a multiple of 60, 15 to 63 days a multiple of 300, beyond a
# multiple of 3600, or it gets no data points. At most 100,800 data points an answer (NextToken beyond).
METRIC_PERIODS_SOURCE = Source("https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_MetricStat.html")
METRIC_PERIOD_BY_AGE: tuple[tuple[float, int], ...] = ((15 * 86400, 60), (63 * 86400, 300), (float("inf"), 3600))


def metric_period(start_age_seconds: float) -> int:
    """The finest period (seconds) CloudWatch answers for regular-resolution data starting this long ago."""
    return next(period for age, period in METRIC_PERIOD_BY_AGE if start_age_seconds < age)

# PutMetricData (MetricDatum.Value): values between -2^360 and 2^360; NaN and the infinities are refused.
PUT_METRIC_DATA_SOURCE = Source("https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_MetricDatum.html")
CLOUDWATCH_MAX_MAGNITUDE = 2.0 ** 360


# ------------------------------------------------------------------------------- serving stacks
# Which server runs the serving image (stack parameter ServingBackend, env D2OPS_SERVING_BACKEND in the
# endpoint's container) and which artifact forms each serves. Both servers wrap one framework-free service
# (model_code.serving.service), so a form runs on a server when that service loads it there. The serving
# image, the template's AllowedValues and `d2ops doctor` are tested against this section
# (tests/unit/test_platform_serving.py).
SERVING_CHECKED = "2026-11-29"

# TorchServe: pytorch/serve's README opens with "Notice: Limited Maintenance ... no planned updates, bug fixes,
# new features, or security patches" (commit b5871e20f, #3395, 2025-02-28; its last commit is 2025-03-17) and
# the repository is archived (read-only; issue 33 dates the archive August 2025). Its last release, 0.12.0
# (tag v0.12.0, 2024-09-24), was built and tested against torch 2.4.0 (requirements/torch_linux.txt at that tag).
TORCHSERVE_SOURCE = Source("https://github.com/pytorch/serve", SERVING_CHECKED)
TORCHSERVE_RELEASE_SOURCE = Source("https://github.com/pytorch/serve/releases/tag/v0.12.0", SERVING_CHECKED)
# AWS released no PyTorch inference container after 2.6 because TorchServe, which they embed, went into
# maintenance (aws/deep-learning-containers#5239, 2025-09-05); the 2.6 ones were patched until 2026-06-30
# (#5673, #6290). AWS's answer (#5673, 2026-04-25) is a Ray Serve container with a SageMaker adapter
# answering /ping and /invocations (first released 2026-04-23).
AWS_PYTORCH_INFERENCE_SOURCE = Source("https://github.com/aws/deep-learning-containers/issues/5239", SERVING_CHECKED)
AWS_PYTORCH_INFERENCE_END_SOURCE = Source("https://github.com/aws/deep-learning-containers/issues/5673",
                                          SERVING_CHECKED)
AWS_RAY_SERVE_SOURCE = Source("https://aws.github.io/deep-learning-containers/ray/", SERVING_CHECKED)
# KServe is removing its TorchServe runtime for the same reason (kserve/kserve#5638, open).
KSERVE_TORCHSERVE_SOURCE = Source("https://github.com/kserve/kserve/pull/5638", SERVING_CHECKED)

# The artifact's forms (model_code.model_forms.FORMS; docs/model-artifact.md). PyTorch's TorchScript pages open with
# "TorchScript is deprecated, please use torch.export instead"; AOTInductor compiles an exported program
# ahead of time into a .pt2 package for one device, "for inference deployments on the server side".
TORCHSCRIPT_SOURCE = Source("https://docs.pytorch.org/docs/stable/jit.html", SERVING_CHECKED)
EXPORT_SOURCE = Source("https://docs.pytorch.org/docs/stable/export.html", SERVING_CHECKED)
AOTI_SOURCE = Source("https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html", SERVING_CHECKED)


@dataclass(frozen=True)
class ArtifactForm:
    """One form of the exported detector, and where PyTorch stands on it."""

    name: str  # as the artifact's metadata names it
    deprecated: bool
    status: str
    source: Source


ARTIFACT_FORMS: dict[str, ArtifactForm] = {f.name: f for f in (
    ArtifactForm("torchscript", True, "TorchScript (model.pt): deprecated by PyTorch in favour of torch.export",
                 TORCHSCRIPT_SOURCE),
    ArtifactForm("exported", False, "torch.export ExportedProgram (model.pt2): what PyTorch says to use instead",
                 EXPORT_SOURCE),
    ArtifactForm("aoti", False, "AOTInductor package (model.aoti.pt2): an exported program compiled ahead of time "
                                "for the serving device", AOTI_SOURCE),
)}


@dataclass(frozen=True)
class ServingServer:
    """A server the serving image can run, its upstream's state, and the artifact forms d2ops serves on it."""

    name: str  # the ServingBackend value
    distribution: str  # the PyPI distribution containers/serving/requirements.txt installs
    archived: bool  # upstream read-only: no fixes, no security patches
    status: str  # one line, for `d2ops doctor` and the docs
    sources: tuple[Source, ...]
    forms: tuple[str, ...]
    why_not: dict[str, str]  # a form it does not serve -> why


SERVING_SERVERS: dict[str, ServingServer] = {s.name: s for s in (
    ServingServer(
        "torchserve", "torchserve", archived=True,
        status="TorchServe is archived upstream (pytorch/serve read-only, no fixes or security patches; last release "
               "0.12.0, 2024-09-24), and AWS stopped its PyTorch inference containers after 2.6 because of it",
        sources=(TORCHSERVE_SOURCE, TORCHSERVE_RELEASE_SOURCE, AWS_PYTORCH_INFERENCE_SOURCE),
        # Every form, through the same service: both servers' adapters load the artifact with
        # model_code.artifact.load_artifact (the best form the device runs, or D2OPS_MODEL_FORM), so the form is
        # never TorchServe's concern, though its last release was only tested against torch 2.4 (TorchScript).
        forms=("torchscript", "exported", "aoti"), why_not={}),
    ServingServer(
        "ray-serve", "ray", archived=False,
        status="Ray Serve is maintained, and AWS's own SageMaker inference container for PyTorch after 2.6 runs it",
        sources=(AWS_PYTORCH_INFERENCE_END_SOURCE, AWS_RAY_SERVE_SOURCE),
        forms=("torchscript", "exported", "aoti"), why_not={}),
)}

# The stack parameter that picks the server, and how to switch away from an archived one.
SERVING_BACKEND_PARAMETER = "ServingBackend"


def serving_servers_for(form: str) -> list[str]:
    """The servers that serve an artifact ``form`` (maintained ones first); a ValueError for an unknown form."""
    if form not in ARTIFACT_FORMS:
        raise ValueError(f"{form!r} is not an artifact form; expected one of {', '.join(ARTIFACT_FORMS)}")
    servers = [s for s in SERVING_SERVERS.values() if form in s.forms]
    return [s.name for s in sorted(servers, key=lambda s: s.archived)]


def maintained_servers() -> list[str]:
    return [s.name for s in SERVING_SERVERS.values() if not s.archived]
