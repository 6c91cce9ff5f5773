"""One torch: the training image, the serving image and the development environment pin the same torch,
torchvision and detectron2 commit, and both images the same CUDA build. An artifact is traced by the
training image's torch and loaded by the serving image's; here both sides are the development
environment's, so the pair the tests exercise is the pair that ships only while these pins agree.

And the rest of the supply chain (issue 31): every other Python dependency of the images and the Lambda
layer comes from a lock with hashes, installed with --require-hashes; every base image is pinned by
digest; the locks agree with each other, with their inputs and with what `make setup` installs."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from d2ops import pins as supply
from d2ops.layer_build import pip_command
from d2ops.template import REPO_ROOT

DOCKERFILES = {image: REPO_ROOT / "containers" / image / "Dockerfile" for image in ("training", "serving")}
WHEELS_README = REPO_ROOT.parent / "shared" / "wheels" / "README.md"


def pins(text: str, package: str) -> set[str]:
    """Every exact pin of ``package`` in ``text`` (``torch==2.14.1``, quoted or not)."""
    return set(re.findall(rf"(?<![\w-]){re.escape(package)}==([0-9][\w.+]*)", text))


def sources() -> dict[str, str]:
    files = {f"containers/{image}/Dockerfile": path for image, path in DOCKERFILES.items()}
    files |= {"pyproject.toml": REPO_ROOT / "pyproject.toml", "Makefile": REPO_ROOT / "Makefile"}
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


# ------------------------------------------------------------------------------ locks and digests
LOCKS = {lock: REPO_ROOT / lock for lock in supply.LOCKS}


def test_every_base_image_is_pinned_by_digest() -> None:
    """Mutation caught: a FROM (or the ARG BASE_IMAGE it names) back on a bare tag, or a digest without a tag."""
    for name in supply.DOCKERFILES:
        text = (REPO_ROOT / name).read_text()
        assert supply.base_images(text), f"{name}: no FROM found"
        assert not supply.unpinned(text), f"{name}: base images not pinned by digest: {supply.unpinned(text)}"


def test_the_digest_check_sees_a_dropped_digest() -> None:
    """The check itself, on the real Dockerfiles mutated: a stripped digest is reported, ARG defaults included."""
    for name in supply.DOCKERFILES:
        text = (REPO_ROOT / name).read_text()
        stripped = re.sub(r"@sha256:[0-9a-f]{64}", "", text)
        assert supply.unpinned(stripped), f"{name}: a stripped digest went unnoticed"
    assert supply.unpinned("FROM python@sha256:" + "a" * 64) == ["python@sha256:" + "a" * 64]  # no tag


def test_every_lock_line_is_an_exact_pin_with_hashes() -> None:
    """Mutation caught: a hand-edited lock with a range, a missing hash, or a package without its hash lines."""
    for name, path in LOCKS.items():
        packages = supply.read_lock(path.read_text(), name)
        assert packages, f"{name}: empty"
        assert all(p.hashes for p in packages.values())


def test_the_lock_reader_refuses_a_lock_without_a_hash() -> None:
    """The reader on the real serving lock mutated: one package's hash lines removed, one pin made a range."""
    text = LOCKS["containers/serving/requirements.lock"].read_text()
    no_hash = re.sub(r"(torchserve==[\w.]+) \\\n(\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", r"\1\n", text)
    assert no_hash != text
    with pytest.raises(supply.PinError, match=r"torchserve==0\.12\.0 has no --hash"):
        supply.read_lock(no_hash, "serving")
    with pytest.raises(supply.PinError, match="not an exact pin"):
        supply.read_lock(text.replace("torchserve==", "torchserve>="), "serving")


def _current(name: str, lock: dict[str, supply.Locked], source: str) -> list[str]:
    """What is wrong between a lock and its input: a requirement the lock lacks or whose range it misses."""
    wrong = []
    for line in source.splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        locked = lock.get(supply.normalize(req.name))
        if locked is None or not req.specifier.contains(locked.version, prereleases=True):
            wrong.append(f"{name}: {req} but the lock has {locked and locked.version}")
    return wrong


def test_each_lock_is_current_with_its_input() -> None:
    """Mutation caught: an input (src/requirements.txt, containers/*/requirements.txt) edited without
    `make pins`: a new requirement missing from the lock, or a range the locked version falls outside."""
    for name, source in supply.LOCKS.items():
        lock = supply.read_lock(LOCKS[name].read_text(), name)
        assert not _current(name, lock, (REPO_ROOT / source).read_text())
    drifted = (REPO_ROOT / "src/requirements.txt").read_text().replace("pydantic>=2.7,<3", "pydantic>=2.14,<3")
    assert _current("layer", supply.read_lock(LOCKS["src/requirements.lock"].read_text()), drifted)


def test_the_locks_agree_with_each_other() -> None:
    """One pydantic, one Pillow, one numpy: the layer, the serving image and the training image run the same
    version of every package they share. Mutation caught: one lock's version drifting alone."""
    seen: dict[str, tuple[str, str]] = {}
    for name, path in LOCKS.items():
        for package in supply.read_lock(path.read_text(), name).values():
            first = seen.setdefault(package.name, (package.version, name))
            assert first[0] == package.version, f"{package.name}: {name} locks {package.version}, {first[1]} {first[0]}"


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def test_the_development_environment_runs_the_locked_versions() -> None:
    """`make setup` installs with the locks as constraints (d2ops.pins constraints), so the tests run the
    versions that ship: the layer's whole lock (the library's runtime) is installed, and every locked package
    the venv has is the locked version (detectron2's requirements are absent where setup could not install
    it). Mutation caught: a lock's version moved without `make setup`, or the other way round."""
    layer = supply.read_lock(LOCKS["src/requirements.lock"].read_text())
    assert all(_installed(name) for name in layer), "make setup did not install the layer's lock"
    for line in supply.constraints().splitlines():
        name, version = line.split("  #")[0].split("==")
        assert _installed(name) in (None, version), f"the venv has {name} {_installed(name)}, the lock {line}"


def test_make_setup_installs_with_the_locks_as_constraints() -> None:
    """Mutation caught: the Makefile's install no longer constrained by the locks (dev drifts from the images)."""
    makefile = sources()["Makefile"]
    assert re.search(r"-m d2ops\.pins constraints > (\S+)", makefile), "make setup writes no constraints"
    target = re.search(r"-m d2ops\.pins constraints > (\S+)", makefile)[1]  # type: ignore[index]
    assert re.search(rf"pip install .*-e '\.\[dev\]' .*-c {re.escape(target)}", makefile), makefile
    assert re.search(rf"detectron2==0\.6 'setuptools<81' \\\n\s*-c {re.escape(target)}", makefile), \
        "make setup's detectron2 install is not constrained by the locks"
    for lock in supply.LOCKS:
        assert lock in makefile, f"the Makefile neither compiles nor depends on {lock}"


def test_torch_and_detectron2_are_outside_the_locks() -> None:
    """They come from PyTorch's index and a git commit, in steps of their own (a --require-hashes call cannot
    also install unhashed pins). Mutation caught: a lock compiled with PyPI's torch (a CUDA 13 build)."""
    for name, path in LOCKS.items():
        locked = supply.read_lock(path.read_text(), name)
        assert not {"torch", "torchvision", "detectron2"} & set(locked), name
        assert not any(n.startswith("nvidia-") for n in locked), f"{name}: CUDA libraries from PyPI"


def _pip_installs(dockerfile: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    return [m.strip() for line in joined.splitlines() if line.startswith("RUN")
            for m in re.findall(r"pip install ([^&;]+)", line)]


def test_every_pip_install_in_the_images_is_locked_or_exactly_pinned() -> None:
    """Each image installs its own lock with --require-hashes; every other pip install is the torch pair from
    the index, detectron2 at its commit with --no-deps, or the project itself with --no-deps.
    Mutation caught: a lock installed without --require-hashes, a new unpinned `pip install x`, an image
    installing requirements.txt (the ranges) again."""
    for image in ("training", "serving"):
        text = DOCKERFILES[image].read_text()
        lock = f"containers/{image}/requirements.lock"
        assert re.search(rf"^COPY {re.escape(lock)} (\S+)$", text, re.MULTILINE), f"{image}: does not copy {lock}"
        installs = _pip_installs(text)
        hashed = [i for i in installs if "--require-hashes" in i]
        assert len(hashed) == 1 and hashed[0].endswith("requirements.lock"), f"{image}: {hashed}"
        for line in installs:
            allowed = ("--require-hashes" in line
                       or re.search(r'--index-url "\$\{TORCH_INDEX_URL\}" torch==[\w.]+ torchvision==[\w.]+$', line)
                       or ("--no-deps" in line and "git+https://github.com/facebookresearch/detectron2.git@"
                           "${DETECTRON2_COMMIT}" in line)
                       or re.fullmatch(r"--no-cache-dir --no-deps /tmp/d2ops", line))
            assert allowed, f"{image}: `pip install {line}` is neither locked nor exactly pinned"
        assert "pip check" in text, f"{image}: no pip check after the split installs"
        # The lock first: torchvision then finds the locked numpy and Pillow instead of taking them from
        # PyTorch's index, unchecked (an already-installed version is never re-checked against the lock).
        assert text.index("--require-hashes") < text.index('"${TORCH_INDEX_URL}" torch=='), f"{image}: lock after torch"


def test_every_function_ships_the_functions_lock() -> None:
    """`sam build` installs each functions/<name>/requirements.txt; each is the functions' lock, byte for byte
    (hashes and all, so pip's hash-checking mode is on), compiled against the layer's lock: a function's
    pydantic shadows the layer's in Lambda, so the two must be one version. Mutation caught: one function's
    requirements.txt hand-edited back to ranges, or the lock re-compiled without copying it."""
    lock = (REPO_ROOT / supply.FUNCTIONS_LOCK).read_text()
    copies = sorted((REPO_ROOT / "functions").glob("*/requirements.txt"))
    assert len(copies) >= 11
    assert [c for c in copies if c.read_text() != lock] == []
    locked = supply.read_lock(lock, supply.FUNCTIONS_LOCK)
    assert {"aws-lambda-powertools", "aws-xray-sdk", "pydantic", "boto3"} <= set(locked)  # [parser,tracer]


def test_the_layer_build_requires_hashes() -> None:
    """Mutation caught: d2ops.layer_build installing src/requirements.txt or without --require-hashes."""
    cmd = pip_command(REPO_ROOT / "src" / "requirements.lock", Path("/tmp/out"))
    assert "--require-hashes" in cmd and cmd[-1].endswith("src/requirements.lock")
