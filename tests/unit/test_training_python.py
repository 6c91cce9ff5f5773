"""The training image runs a maintained CPython 3.11.x (d2ops_core.platform.TRAINING_PYTHON), not Ubuntu 22.04's
python3.11 release candidate, read from its Dockerfile; and both images run the same Python minor."""

from __future__ import annotations

import re

from d2ops.template import REPO_ROOT
from d2ops_core import platform
from tests.unit.test_platform_container_toolkit import final_stage

TRAINING = REPO_ROOT / "containers" / "training" / "Dockerfile"
SERVING = REPO_ROOT / "containers" / "serving" / "Dockerfile"


def dockerfile_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))


def run_lines(text: str) -> list[str]:
    """RUN instructions, continuation lines joined, comments out."""
    joined = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")).replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def test_the_training_image_installs_the_python_the_table_names() -> None:
    """Mutations caught: ARG PYTHON_VERSION moved without the table (or the reverse), the venv made from another
    interpreter than the one uv installed (python3.11 from PATH: Ubuntu's, or none)."""
    text = TRAINING.read_text()
    args = dockerfile_args(text)
    assert tuple(int(p) for p in args["PYTHON_VERSION"].split(".")) == platform.TRAINING_PYTHON
    (install,) = [line for line in run_lines(text) if "python install" in line]
    assert '"${PYTHON_VERSION}"' in install.split("python install", 1)[1].split("&&")[0]
    assert re.search(r'python find --managed-python [^&]*"\$\{PYTHON_VERSION\}"', install)
    assert '"${python}" -m venv /opt/venv' in install
    assert not [line for line in run_lines(text) if re.search(r"\bpython3(\.\d+)? -m venv", line)]


def test_no_distribution_python_is_installed() -> None:
    """Mutation caught: apt's python3.11 (3.11.0~rc1 on Ubuntu 22.04) back in the image."""
    installs = " ".join(line for line in run_lines(TRAINING.read_text()) if "apt-get install" in line)
    assert not re.search(r"\bpython3(\.\d+)?(-dev|-venv|-minimal)?\b", installs), installs


def test_uv_is_taken_from_its_checked_wheel() -> None:
    """The installer runs only after its wheel's sha256 is checked. Mutations caught: the hash check dropped, the
    wheel URL and UV_VERSION drifting apart (unzip would find no uv-<version>.data/scripts/uv)."""
    text = TRAINING.read_text()
    args = dockerfile_args(text)
    assert re.fullmatch(r"[0-9a-f]{64}", args["UV_WHEEL_SHA256"])
    assert f"/uv-{args['UV_VERSION']}-py3-none-manylinux" in args["UV_WHEEL_URL"]
    (install,) = [line for line in run_lines(text) if "python install" in line]
    fetch, check = install.index('"${UV_WHEEL_URL}"'), install.index('sha256sum -c')
    assert fetch < check < install.index("unzip -p") < install.index("python install")


def test_both_images_run_the_same_python_minor() -> None:
    """What evaluation traces in the training image is loaded by the serving image. Mutation caught: the serving
    base moved to python:3.12-slim while the training image stays on 3.11."""
    base, _ = final_stage(SERVING)
    assert base == "python"
    tag = re.search(r"^FROM python:(\d+)\.(\d+)", SERVING.read_text(), re.MULTILINE)
    assert tag, "containers/serving/Dockerfile: FROM python:<major>.<minor>..."
    assert (int(tag[1]), int(tag[2])) == platform.TRAINING_PYTHON[:2]
