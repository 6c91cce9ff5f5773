"""`make images` (needs Docker and an AWS account, so only its dry run is checked here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from d2ops.local.container_entry import dockerfile_for, parse_entry
from d2ops.template import REPO_ROOT, load_template


def dry_run(*overrides: str) -> str:
    proc = subprocess.run(["make", "--no-print-directory", "-n", "images", *overrides],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout


def test_images_recipe_builds_and_pushes_both_images_with_the_given_coordinates() -> None:
    out = dry_run("AWS_ACCOUNT_ID=123456789012", "AWS_REGION=eu-west-1", "IMAGE_TAG=v7")
    registry = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    assert f"docker login --username AWS --password-stdin {registry}" in out
    # Both bases are public images (the training image's is NVIDIA's CUDA image): one login, ECR's.
    dockerfile = (REPO_ROOT / "containers" / "training" / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.MULTILINE)
    assert base and ".dkr.ecr." not in base.group(1), "the training base is expected to be a public image"
    assert out.count("docker login") == 1
    assert re.search(r"for name in training serving;", out)
    assert f"-f containers/$name/Dockerfile -t {registry}/d2ops-$name:v7 ." in out
    assert f"docker push {registry}/d2ops-$name:v7" in out
    assert "--provenance=false" in out  # SageMaker rejects OCI image indexes
    for name in ("training", "serving"):
        assert (REPO_ROOT / "containers" / name / "Dockerfile").is_file(), f"containers/{name}/Dockerfile missing"


def test_printed_uris_are_accepted_by_the_template_parameters() -> None:
    out = dry_run("AWS_ACCOUNT_ID=123456789012", "AWS_REGION=us-east-1", "IMAGE_TAG=abc1234-dirty20260101120000")
    uris = dict(re.findall(r"(TrainingImageUri|ServingImageUri)=(\S+?)\"", out))
    assert set(uris) == {"TrainingImageUri", "ServingImageUri"}
    params = load_template().document["Parameters"]
    for name, uri in uris.items():
        assert re.fullmatch(params[name]["AllowedPattern"], uri), f"{name}={uri} fails the template's pattern"


def test_default_tag_is_the_commit() -> None:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    out = dry_run("AWS_ACCOUNT_ID=123456789012", "AWS_REGION=us-east-1")
    tags = set(re.findall(r"d2ops-training:(\S+?)\"", out))
    assert len(tags) == 1
    assert re.fullmatch(re.escape(head) + r"(-dirty\d{14})?", tags.pop())


def test_dockerfiles_are_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(hadolint).is_file():
        pytest.skip("hadolint is not installed (make setup installs it into .venv)")
    dockerfiles = [str(REPO_ROOT / "containers" / name / "Dockerfile") for name in ("training", "serving")]
    proc = subprocess.run([hadolint, *dockerfiles], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_each_image_installs_the_init_its_entrypoint_names() -> None:
    for image in ("training", "serving"):
        dockerfile = dockerfile_for(image)
        init = parse_entry(dockerfile).entrypoint[0]
        package = init.rsplit("/", 1)[-1]  # /usr/bin/tini is Debian's and Ubuntu's `tini` package
        installs = re.findall(r"apt-get install[^\n]*(?:\\\n[^\n]*)*", dockerfile.read_text())
        assert any(re.search(rf"\b{re.escape(package)}\b", line) for line in installs), \
            f"{dockerfile}: ENTRYPOINT starts {init} but no apt-get install brings {package}"


def _copy_like_docker(sources: list[str], target: Path) -> None:
    """COPY's rules: a directory's contents go into the target; files go into it when it ends in / ."""
    for source in sources:
        origin = REPO_ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target / origin.name)


@pytest.mark.parametrize("image", ["training", "serving"])
def test_each_image_installs_the_core_and_model_code_but_no_tooling(image: str, tmp_path: Path) -> None:
    # Rebuild the image's /tmp/d2ops build context from its COPY lines and build the wheel its
    # `pip install /tmp/d2ops` installs: the folders copied decide what ships.
    context = tmp_path / "context"
    copies = re.findall(r"^COPY ((?:\S+ )+)/tmp/d2ops/(\S*)$", dockerfile_for(image).read_text(), re.MULTILINE)
    assert copies, f"containers/{image}/Dockerfile copies nothing into /tmp/d2ops"
    for sources, target in copies:
        assert target == "" or target.endswith("/"), f"COPY ... /tmp/d2ops/{target}: expected a directory"
        _copy_like_docker(sources.split(), context / target)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "-w", str(wheels), str(context)], check=True, timeout=300,
                   capture_output=True)
    [wheel] = wheels.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"d2ops_core", "model_code"}
    assert "d2ops_core/images.py" in names and "model_code/serving/resources/config.properties" in names
