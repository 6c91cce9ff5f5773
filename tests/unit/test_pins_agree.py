"""One torch: the training image, the serving image and the development environment pin the same torch,
torchvision and detectron2 commit, and both images the same CUDA build. An artifact is traced by the
training image's torch and loaded by the serving image's; here both sides are the development
environment's, so the pair the tests exercise is the pair that ships only while these pins agree."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from d2ops.template import REPO_ROOT

DOCKERFILES = {image: REPO_ROOT / "containers" / image / "Dockerfile" for image in ("training", "serving")}
WHEELS_README = REPO_ROOT.parent / "shared" / "wheels" / "README.md"


def pins(text: str, package: str) -> set[str]:
    """Every exact pin of ``package`` in ``text`` (``torch==2.14.1``, quoted or not)."""
    return set(re.findall(rf"(?<![\w-]){re.escape(package)}==([0-9][\w.+]*)", text))


def sources() -> dict[str, str]:
    files = {f"containers/{image}/Dockerfile": path for image, path in DOCKERFILES.items()}
    files |= {"containers/serving/requirements.txt": REPO_ROOT / "containers" / "serving" / "requirements.txt",
              "pyproject.toml": REPO_ROOT / "pyproject.toml", "Makefile": REPO_ROOT / "Makefile"}
    return {name: path.read_text() for name, path in files.items()}


def test_torch_and_torchvision_are_pinned_once_everywhere() -> None:
    """Mutation caught: any one place moving torch or torchvision (the training image back on 2.5.1, the
    Makefile or pyproject on another release) while the others stay."""
    for package in ("torch", "torchvision"):
        found = {name: pins(text, package) for name, text in sources().items()}
        missing = [name for name, versions in found.items() if not versions]
        assert not missing, f"{package} is not pinned in {missing}"
        versions = set().union(*found.values())
        assert len(versions) == 1, f"{package} pins disagree: {found}"


def test_the_development_environment_runs_the_pinned_torch() -> None:
    """The venv the tests run in is what the pins say (its CUDA flavour may differ: it runs on CPU).
    Mutation caught: pins moved without `make setup` re-run, so tests exercise another torch."""
    (torch_pin,) = pins(sources()["pyproject.toml"], "torch")
    (vision_pin,) = pins(sources()["pyproject.toml"], "torchvision")
    assert metadata.version("torch").split("+")[0] == torch_pin
    assert metadata.version("torchvision").split("+")[0] == vision_pin


def test_both_images_install_the_same_cuda_build() -> None:
    """Mutation caught: one image's TORCH_INDEX_URL moved to another CUDA build (cu128, cu130)."""
    indexes = {image: re.findall(r"^ARG TORCH_INDEX_URL=(\S+)$", path.read_text(), re.MULTILINE)
               for image, path in DOCKERFILES.items()}
    assert all(len(found) == 1 for found in indexes.values()), indexes
    assert indexes["training"] == indexes["serving"], indexes
    for image, path in DOCKERFILES.items():
        assert '--index-url "${TORCH_INDEX_URL}" torch==' in path.read_text(), f"{image}: torch not from the index"


def _commit(pattern: str, text: str, where: str) -> str:
    found = re.findall(pattern, text, re.MULTILINE)
    assert len(found) == 1, f"{where}: expected one detectron2 commit, found {found}"
    return str(found[0])


def test_detectron2_is_one_commit_everywhere() -> None:
    """The training image builds ARG DETECTRON2_COMMIT; the Makefile reads that line (no copy of its own);
    ../shared/wheels (the CPU build make setup installs) names the commit it was built from.
    Mutation caught: the Dockerfile's commit moved without a wheel rebuilt from it, or the Makefile
    given a commit of its own."""
    training = _commit(r"^ARG DETECTRON2_COMMIT=([0-9a-f]{40})$", DOCKERFILES["training"].read_text(),
                       "containers/training/Dockerfile")
    makefile = sources()["Makefile"]
    assert re.search(r"^DETECTRON2_COMMIT := \$\(shell sed -n 's\|\^ARG DETECTRON2_COMMIT=\|\|p' "
                     r"containers/training/Dockerfile\)$", makefile, re.MULTILINE), \
        "the Makefile must read DETECTRON2_COMMIT from containers/training/Dockerfile"
    assert not re.findall(r"[0-9a-f]{40}", makefile), "the Makefile names a commit of its own"
    if WHEELS_README.is_file():  # ../shared/wheels exists on the project's machines, not on every clone
        wheel = _commit(r"at commit `([0-9a-f]{40})`", WHEELS_README.read_text(), str(WHEELS_README))
        assert wheel == training, f"../shared/wheels was built from {wheel}, the training image builds {training}"
    docs = (REPO_ROOT / "docs" / "training.md").read_text()
    assert all(commit == training for commit in re.findall(r"\b[0-9a-f]{40}\b", docs)), \
        "docs/training.md names another detectron2 commit"


def test_the_pin_reader_finds_pins() -> None:
    """The helper itself: quoted, unquoted, with a local version; not a longer package name."""
    text = 'pip install "torch==2.14.1" torchvision==0.29.1+cu126 torch-model-archiver==0.12.0'
    assert pins(text, "torch") == {"2.14.1"}
    assert pins(text, "torchvision") == {"0.29.1+cu126"}
    assert pins(Path(__file__).read_text(), "no-such-package") == set()
