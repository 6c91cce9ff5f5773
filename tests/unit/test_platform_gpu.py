"""Every GPU job and endpoint the stack can configure runs the image's CUDA build on the driver its
host really gets (d2ops_core.platform), read from what ships: the Dockerfiles' TORCH_INDEX_URL, the
requests prepare_training really builds, the entry scripts the images really run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops.local import container_entry
from d2ops.template import REPO_ROOT, load_template
from d2ops_core import platform
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
from prepare_training.models import PrepareEvent, PrepareSettings  # noqa: E402
from prepare_training.service import build_plan  # noqa: E402

CONTAINERS = REPO_ROOT / "containers"
CUDA_COMPAT = CONTAINERS / "training" / "cuda-compat"
INSTANCE_PARAMETERS = {"training": "TrainingInstanceType", "processing": "EvaluationInstanceType",
                       "endpoint": "EndpointInstanceType"}


def image_cuda(image: str) -> tuple[int, int]:
    """The CUDA build of an image's torch, from its one place: ARG TORCH_INDEX_URL=.../whl/cuXYZ."""
    text = (CONTAINERS / image / "Dockerfile").read_text()
    index = re.search(r"^ARG TORCH_INDEX_URL=\S+/whl/cu(\d+)(\d)$", text, re.MULTILINE)
    assert index, f"containers/{image}/Dockerfile: no ARG TORCH_INDEX_URL=.../whl/cu<major><minor>"
    return int(index.group(1)), int(index.group(2))


def template_families(parameter: str) -> set[str]:
    pattern = load_template().document["Parameters"][parameter]["AllowedPattern"]
    match = re.fullmatch(r"\^ml\\\.\(([a-z0-9|]+)\)\\\.\[a-z0-9\]\+\$", pattern)
    assert match, f"{parameter}: AllowedPattern {pattern!r} does not list instance families"
    return set(match.group(1).split("|"))


def plan_for(**types: str) -> dict[str, Any]:
    """What prepare_training really builds with these stack settings (the defaults otherwise)."""
    env = {**support.PREPARE_ENV, **{key.upper(): value for key, value in types.items()}}
    event = PrepareEvent.model_validate(support.load_event("prepare_training", "defaults"))
    return build_plan(PrepareSettings.from_env(env), event, None).model_dump(mode="json")


def sample_type(family: str) -> str:
    size = "48xlarge" if family.startswith("p5") else "24xlarge" if family.startswith("p4") else "xlarge"
    return f"ml.{family}.{size}"


def test_the_template_allows_exactly_the_families_the_table_knows() -> None:
    """Mutation caught: a family added to the template (ml.inf2, ml.p3, any ml.x.y) without a row in
    the table, or a table family the template forgets."""
    for parameter in INSTANCE_PARAMETERS.values():
        assert template_families(parameter) == set(platform.known_families()), parameter
        default = load_template().document["Parameters"][parameter]["Default"]
        assert platform.instance_family(default) in platform.known_families()


def test_the_table_says_what_both_images_are_built_for() -> None:
    """Mutation caught: one Dockerfile's TORCH_INDEX_URL moved (to cu130, say) while prepare_training
    keeps choosing AMIs for platform.IMAGE_CUDA, or the two images' CUDA builds drifting apart."""
    assert image_cuda("serving") == image_cuda("training") == platform.IMAGE_CUDA


@pytest.mark.parametrize("family", sorted(template_families("EndpointInstanceType")))
def test_the_endpoint_variant_runs_the_serving_image_on_its_host(family: str) -> None:
    """The serving image ships no forward-compatibility libraries, so its CUDA build must run natively
    on the driver the variant gets: the family's default, or the InferenceAmiVersion's.
    Mutations caught: prepare_training not setting InferenceAmiVersion (g4dn, g5, p4d, p4de get 470 /
    CUDA 11.4), setting it on CPU variants, choosing an AMI not documented for the family, the
    serving Dockerfile moving to a CUDA build no documented AMI runs (cu130 needs driver 580)."""
    instance_type = sample_type(family)
    (variant,) = plan_for(endpoint_instance_type=instance_type)["endpoint"]["production_variants"]
    assert variant["InstanceType"] == instance_type
    ami = variant.get("InferenceAmiVersion")
    driver = platform.endpoint_driver(instance_type, ami)
    if family in platform.CPU_FAMILIES:
        assert driver is None and "InferenceAmiVersion" not in variant
        return
    assert driver is not None
    assert platform.runs_natively(image_cuda("serving"), driver), (
        f"{instance_type} ({ami or 'default AMI'}): driver {driver.branch} / CUDA {driver.cuda} cannot run the "
        f"serving image's CUDA {image_cuda('serving')}")
    if ami is None:  # no override where none is needed: the variant stays on SageMaker's documented default
        assert driver == platform.GPU_FAMILIES[family].endpoint_default
    # the serving image relies on the driver alone (no compat libraries that could load over a newer one)
    assert not re.search(r"\bcuda-compat-\d", _apt_installs("serving"))


def test_the_default_endpoint_asks_for_a_535_driver_ami() -> None:
    """The shipped default, ml.g4dn.xlarge, named outright. Mutation caught: the AMI table entry or
    the choice changed so the default endpoint loses its override."""
    (variant,) = plan_for()["endpoint"]["production_variants"]
    assert variant["InstanceType"] == "ml.g4dn.xlarge"
    assert variant["InferenceAmiVersion"] == "al2-ami-sagemaker-inference-gpu-2"


def _training_entry_enables_forward_compat() -> bool:
    """The training image's ENTRYPOINT program (train) execs the cuda-compat wrapper beside it, which the
    Dockerfile copies to the same directory."""
    entry = container_entry.parse_entry(container_entry.dockerfile_for("training"))
    program = next(word for word in entry.entrypoint if word.startswith("/usr/local/bin/"))
    script = (REPO_ROOT / container_entry.IMAGE_PATHS[program]).read_text()
    execs = [line for line in script.splitlines() if line.strip().startswith("exec ")]
    return (bool(execs) and 'cuda-compat" ' in execs[-1]
            and entry.copies.get("/usr/local/bin/cuda-compat") == "containers/training/cuda-compat")


def _apt_installs(image: str) -> str:
    """The packages an image's `apt-get install` commands name (continuation lines joined; comments out)."""
    text = (CONTAINERS / image / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return " ".join(line for line in lines if "apt-get install" in line)


def _image_ships_forward_compat(image: str) -> bool:
    major, minor = image_cuda(image)
    return re.search(rf"\bcuda-compat-{major}-{minor}\b", _apt_installs(image)) is not None


@pytest.mark.parametrize("family", sorted(template_families("TrainingInstanceType")))
def test_the_training_job_runs_the_training_image_on_its_host(family: str) -> None:
    """Training hosts' drivers are undocumented; they are taken to be the oldest SageMaker documents (470),
    which a CUDA 12 build reaches only through forward compatibility, switched on by the entry.
    Mutations caught: the training Dockerfile without cuda-compat-<its CUDA>, train exec'ing python
    directly, the wrapper no longer copied into the image."""
    instance_type = sample_type(family)
    job = plan_for(training_instance_type=instance_type)["training_job"]
    assert job["ResourceConfig"]["InstanceType"] == instance_type
    compat = _image_ships_forward_compat("training") and _training_entry_enables_forward_compat()
    assert platform.job_can_run(image_cuda("training"), instance_type, "training", compat)


@pytest.mark.parametrize("family", sorted(template_families("EvaluationInstanceType")))
def test_the_evaluation_job_runs_the_training_image_on_its_host(family: str) -> None:
    """A processing job's ContainerEntrypoint replaces the image's ENTRYPOINT, so the evaluation job
    must start through the wrapper itself. Mutation caught: ContainerEntrypoint back to
    ["python", "-m", "model_code.evaluation.job"] (no forward compatibility on a 470 host)."""
    instance_type = sample_type(family)
    job = plan_for(evaluation_instance_type=instance_type)["evaluation_job"]
    assert job["ProcessingResources"]["ClusterConfig"]["InstanceType"] == instance_type
    entry = job["AppSpecification"]["ContainerEntrypoint"]
    copies = container_entry.parse_entry(container_entry.dockerfile_for("training")).copies
    compat = (_image_ships_forward_compat("training") and entry[0] == "/usr/local/bin/cuda-compat"
              and copies.get(entry[0]) == "containers/training/cuda-compat")
    assert platform.job_can_run(image_cuda("training"), instance_type, "processing", compat)


@pytest.mark.parametrize(("setting", "instance_type", "reason"), [
    ("endpoint_instance_type", "ml.inf2.xlarge", "Neuron-compiled model"),
    ("training_instance_type", "ml.trn1.32xlarge", "Neuron-compiled training"),
    ("training_instance_type", "ml.p3.2xlarge", "compute capability 7.0"),
    ("evaluation_instance_type", "ml.g6e.xlarge", "not yet in this table"),
    ("endpoint_instance_type", "ml.x9.xlarge", "not in d2ops_core.platform's table"),
])
def test_prepare_refuses_an_instance_type_the_images_cannot_run_on(setting: str, instance_type: str,
                                                                   reason: str) -> None:
    """Mutation caught: prepare_training no longer checking the instance types (the run would fail much
    later, on SageMaker, or serve on CPU behind a 503 /ping)."""
    with pytest.raises(platform.UnsupportedInstanceType) as caught:
        plan_for(**{setting: instance_type})
    message = str(caught.value)
    assert "\n" not in message and instance_type in message and reason in message


def test_the_endpoint_config_is_accepted_by_the_sagemaker_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore validates InferenceAmiVersion against its enum and moto stores it. Mutation caught: an
    AMI name in the table that SageMaker's API does not have."""
    support.aws_env(monkeypatch)
    plan = plan_for()
    with mock_aws():
        sagemaker = boto3.client("sagemaker")
        sagemaker.create_model(ModelName=plan["names"]["model"], PrimaryContainer={"Image": "x"},
                               ExecutionRoleArn="arn:aws:iam::123456789012:role/endpoint")
        sagemaker.create_endpoint_config(EndpointConfigName=plan["names"]["endpoint_config"],
                                         ProductionVariants=plan["endpoint"]["production_variants"])
        described = sagemaker.describe_endpoint_config(EndpointConfigName=plan["names"]["endpoint_config"])
    assert described["ProductionVariants"][0]["InferenceAmiVersion"] == "al2-ami-sagemaker-inference-gpu-2"
    model = boto3.client("sagemaker", region_name="us-east-1").meta.service_model
    enum = model.shape_for("ProductionVariantInferenceAmiVersion").enum  # type: ignore[attr-defined]
    assert set(platform.INFERENCE_AMIS) <= set(enum)


# ------------------------------------------------------------------------- the cuda-compat wrapper
def run_wrapper(tmp_path: Path, version_line: str | None, compat_lib: str | None = "libcuda.so.560.35.05",
                ld_library_path: str = "") -> tuple[str, str]:
    compat_dir = tmp_path / "compat"
    compat_dir.mkdir(exist_ok=True)
    if compat_lib:
        (compat_dir / compat_lib).touch()
        (compat_dir / "libcuda.so.1").touch()
    version_file = tmp_path / "version"
    if version_line is not None:
        version_file.write_text(f"{version_line}\nGCC version:  gcc version 11.4.0\n")
    env = {"PATH": "/usr/bin:/bin", "D2OPS_NVIDIA_VERSION_FILE": str(version_file),
           "D2OPS_CUDA_COMPAT_DIR": str(compat_dir), "LD_LIBRARY_PATH": ld_library_path}
    proc = subprocess.run([str(CUDA_COMPAT), "sh", "-c", 'printf %s "$LD_LIBRARY_PATH"'], env=env,
                          capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout, proc.stderr


def test_the_wrapper_puts_the_compat_libraries_first_on_an_older_driver(tmp_path: Path) -> None:
    """Mutation caught: the comparison inverted or dropped (a 470 host would load its own libcuda)."""
    out, err = run_wrapper(tmp_path, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  Thu May  2 2024",
                           ld_library_path="/opt/amazon/efa/lib")
    assert out == f"{tmp_path / 'compat'}:/opt/amazon/efa/lib"
    assert "driver 470 is older" in err


@pytest.mark.parametrize("version_line", [
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build",
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.05  Tue Aug 2024",
    None,  # a CPU host: no NVIDIA driver at all
])
def test_the_wrapper_leaves_a_new_enough_driver_or_a_cpu_host_alone(tmp_path: Path, version_line: str | None) -> None:
    """An older user-mode driver over a newer kernel module fails. Mutation caught: compat always on."""
    out, _ = run_wrapper(tmp_path, version_line, ld_library_path="/opt/amazon/efa/lib")
    assert out == "/opt/amazon/efa/lib"


def test_the_wrapper_without_compat_libraries_changes_nothing(tmp_path: Path) -> None:
    """An image built without them (a CPU variant of the base) must still start. Mutation caught: the
    wrapper prepending a directory with no libcuda in it."""
    out, _ = run_wrapper(tmp_path, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  x", compat_lib=None)
    assert out == ""
