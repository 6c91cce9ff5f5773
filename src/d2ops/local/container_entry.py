"""The images' declared entry (ENTRYPOINT + CMD), read from their Dockerfiles and run locally.

SageMaker starts the training image as ``docker run IMAGE train`` and the serving image as
``docker run IMAGE serve``: Docker runs the image's ``ENTRYPOINT`` with those words in place of
its ``CMD``. The local runner runs exactly that command, read from the Dockerfile (not a copy
of it in Python), with the few image paths that differ on this machine mapped through one
explicit table (:data:`IMAGE_PATHS`). A Dockerfile whose entry would not reach the project's
code (no ENTRYPOINT, a program resolved through PATH, a shell-form entry, a CMD that is not the
word SageMaker passes) is refused with the reason, so tests catch it before an image is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parents[3]
Image = Literal["training", "serving"]
# What SageMaker appends to `docker run IMAGE`, per image.
SAGEMAKER_ARGUMENT: dict[Image, str] = {"training": "train", "serving": "serve"}
INITS = ("/usr/bin/tini", "/usr/bin/dumb-init")
PYTHON = "<this interpreter>"
DROP = "<dropped>"

# Image path -> what runs it here. Only these differ between the image and this machine:
# - the image's Python (the AWS base image's /opt/conda/bin/python, python:3.11's
#   /usr/local/bin/python, or `python` looked up on the image's PATH by a ContainerEntrypoint)
#   is this interpreter, which has the same packages;
# - scripts the Dockerfile COPYs to an absolute path run from the repository;
# - the init (tini) is dropped: locally each host already runs in its own session and the
#   runner signals the whole process group, which is what tini gives PID 1 in a container.
IMAGE_PATHS: dict[str, str] = {
    "/usr/local/bin/train": "containers/training/train",
    "/usr/local/bin/cuda-compat": "containers/training/cuda-compat",
    "/usr/local/bin/python": PYTHON,
    "/opt/conda/bin/python": PYTHON,
    "python": PYTHON,
    "python3": PYTHON,
    "/usr/bin/tini": DROP,
    "/usr/bin/dumb-init": DROP,
}


class EntryError(Exception):
    """A Dockerfile's entry cannot be read, or would not reach the project's code."""


@dataclass(frozen=True)
class ImageEntry:
    dockerfile: Path
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    copies: dict[str, str]  # image destination path -> build-context source, from COPY lines

    def docker_run(self, *args: str) -> tuple[str, ...]:
        """The process ``docker run IMAGE ARGS...`` starts: ENTRYPOINT + (ARGS or CMD)."""
        return (*self.entrypoint, *(args or self.cmd))


def dockerfile_for(image: Image) -> Path:
    return REPO_ROOT / "containers" / image / "Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line:
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _exec_form(dockerfile: Path, keyword: str, value: str) -> tuple[str, ...]:
    try:
        words = json.loads(value)
    except ValueError:
        words = None
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
        raise EntryError(f"{dockerfile}: {keyword} {value} is not in exec form (a JSON array of strings); the shell "
                         "form runs through /bin/sh -c, which neither forwards SIGTERM nor takes SageMaker's argument")
    return tuple(words)


def parse_entry(dockerfile: Path) -> ImageEntry:
    """ENTRYPOINT, CMD and COPY destinations of the Dockerfile's final stage."""
    try:
        text = dockerfile.read_text()
    except OSError as exc:
        raise EntryError(f"{dockerfile}: cannot read it: {exc}") from exc
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] = ()
    copies: dict[str, str] = {}
    for keyword, rest in _instructions(text):
        if keyword == "FROM":  # a new stage inherits nothing we declared in an earlier one
            entrypoint, cmd, copies = None, (), {}
        elif keyword == "ENTRYPOINT":
            entrypoint = _exec_form(dockerfile, keyword, rest)
            cmd = ()  # Docker resets CMD when ENTRYPOINT is set after it
        elif keyword == "CMD":
            cmd = _exec_form(dockerfile, keyword, rest)
        elif keyword in ("COPY", "ADD"):
            words = [w for w in rest.split() if not w.startswith("--")]
            if len(words) == 2:
                copies[words[1]] = words[0]
    if entrypoint is None:
        raise EntryError(f"{dockerfile}: no ENTRYPOINT in the final stage, so the image inherits its base image's "
                         "entry (the AWS PyTorch image's runs the SageMaker toolkit's own `train`)")
    return ImageEntry(dockerfile=dockerfile, entrypoint=entrypoint, cmd=cmd, copies=copies)


def _program(command: Sequence[str]) -> tuple[int, str]:
    """Index and path of the program the init hands over to."""
    index = 0
    if command and command[0] in INITS:
        index = 1
        if len(command) > 1 and command[1] == "--":
            index = 2
    if index >= len(command):
        raise EntryError(f"the entry {list(command)} names an init but no program for it to run")
    return index, command[index]


def check_entry(entry: ImageEntry, image: Image) -> None:
    """The contract SageMaker relies on; raises EntryError naming the first thing that breaks it."""
    where = entry.dockerfile
    word = SAGEMAKER_ARGUMENT[image]
    if entry.entrypoint[0] not in INITS:
        raise EntryError(f"{where}: ENTRYPOINT {list(entry.entrypoint)} does not start with an init "
                         f"({', '.join(INITS)}): as PID 1 the program would not get SIGTERM's default action "
                         "nor reap its children")
    _, program = _program(entry.entrypoint)
    if not program.startswith("/"):
        raise EntryError(f"{where}: ENTRYPOINT runs {program!r} through PATH; the AWS base images put "
                         "/opt/conda/bin first, where the SageMaker toolkit's own programs win: use an absolute path")
    if entry.cmd != (word,):
        raise EntryError(f"{where}: CMD is {list(entry.cmd)}, expected [{word!r}], the argument SageMaker passes "
                         f"(`docker run IMAGE {word}`); the image must behave the same with and without it")
    mapped = IMAGE_PATHS.get(program)
    if mapped is None:
        raise EntryError(f"{where}: ENTRYPOINT program {program} is not in d2ops.local.container_entry.IMAGE_PATHS, so "
                         "nothing says which of the project's files it is")
    if mapped == PYTHON:
        index, _ = _program(entry.entrypoint)
        args = entry.entrypoint[index + 1:]
        if len(args) < 2 or args[0] != "-m":
            raise EntryError(f"{where}: ENTRYPOINT runs Python without `-m <module>` of the project: {list(args)}")
        module = REPO_ROOT.joinpath(*args[1].split("."))
        if not (module.with_suffix(".py").is_file() or (module / "__main__.py").is_file()):
            raise EntryError(f"{where}: ENTRYPOINT runs module {args[1]}, which is not in the repository")
    elif mapped != DROP:
        if entry.copies.get(program) != mapped:
            raise EntryError(f"{where}: ENTRYPOINT runs {program}, but no `COPY {mapped} {program}` puts the "
                             "project's script there")
        if not (REPO_ROOT / mapped).is_file():
            raise EntryError(f"{where}: {program} is copied from {mapped}, which does not exist")


def local_command(command: Sequence[str], python: str = sys.executable) -> tuple[str, ...]:
    """An in-image command as this machine runs it (:data:`IMAGE_PATHS`); refuses unknown image paths."""
    if not command:
        raise EntryError("empty command")
    words = list(command)
    if IMAGE_PATHS.get(words[0]) == DROP:
        words = words[2:] if len(words) > 1 and words[1] == "--" else words[1:]
        if not words:
            raise EntryError(f"{list(command)}: an init with no program to run")
    head = words[0]
    mapped = IMAGE_PATHS.get(head)
    if mapped == PYTHON:
        return (python, *words[1:])
    if mapped is not None and mapped != DROP:
        return (str(REPO_ROOT / mapped), *words[1:])
    if PurePosixPath(head).name.startswith("python") and "/" not in head:
        return (python, *words[1:])
    raise EntryError(f"{list(command)}: {head} is not a path the local runner knows how to run "
                     "(d2ops.local.container_entry.IMAGE_PATHS)")


def image_command(image: Image, dockerfile: Path | None = None) -> tuple[str, ...]:
    """What SageMaker runs in ``image`` (checked against the contract), as this machine runs it."""
    entry = parse_entry(dockerfile or dockerfile_for(image))
    check_entry(entry, image)
    return local_command(entry.docker_run(SAGEMAKER_ARGUMENT[image]))


def _python_dir(python: str) -> Path:
    """A directory whose ``python`` is ``python``: its own (a virtualenv's bin) or a symlink made once."""
    own = Path(python).parent
    candidate = own / "python"
    if candidate.exists() and candidate.resolve() == Path(python).resolve():
        return own
    digest = hashlib.sha256(python.encode()).hexdigest()[:12]
    shim = Path(tempfile.gettempdir()) / f"d2ops-python-{digest}"
    shim.mkdir(exist_ok=True)
    link = shim / "python"
    if not (link.is_symlink() and os.readlink(link) == python):
        tmp = shim / f".python.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(python)
        os.replace(tmp, link)
    return shim


# The AWS credentials of the shell that starts a local job or server (the offline runtime's, or a real
# account's): the image's code calls no AWS API (model_code imports no boto3), so its processes get none.
HOST_CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def host_environment() -> dict[str, str]:
    """This process's environment as the image's processes start from it: without its AWS credentials."""
    return {k: v for k, v in os.environ.items() if k not in HOST_CREDENTIAL_VARIABLES}


def python_on_path(env: dict[str, str], python: str = sys.executable) -> None:
    """Scripts in the image call ``python`` through PATH; here that must be this interpreter."""
    bindir = str(_python_dir(python))
    parts = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != bindir]
    env["PATH"] = os.pathsep.join([bindir, *parts])

