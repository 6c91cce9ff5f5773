"""`make images` (needs Docker and an AWS account, so only its dry run is checked here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops.container_entry import dockerfile_for, parse_entry
from d2ops.template import REPO_ROOT, load_template


def dry_run(*overrides: str) -> str:
    proc = subprocess.run(["make", "--no-print-directory", "-n", "images", *overrides],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout


def test_images_recipe_builds_and_pushes_both_images_with_the_given_coordinates() -> None:
    out = dry_run("AWS_ACCOUNT_ID=123456789012", "AWS_REGION=eu-west-1", "IMAGE_TAG=v7")
    registry = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    assert f"docker login --username AWS --password-stdin {registry}" in out
    # The training Dockerfile's base image lives in AWS's Deep Learning Containers registry.
    dockerfile = (REPO_ROOT / "containers" / "training" / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=([^/\s]+)/", dockerfile, re.MULTILINE)
    assert base, "containers/training/Dockerfile no longer names its base image in ARG BASE_IMAGE"
    base_region = base.group(1).split(".")[3]
    assert f"--region {base_region} | docker login --username AWS --password-stdin {base.group(1)}" in out
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
