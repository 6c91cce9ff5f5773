"""Both images ask NVIDIA's container toolkit for the GPU and the driver (d2ops_core.platform's
CONTAINER_TOOLKIT_ENV), read from what ships: each Dockerfile's final stage, its own ENV lines and the
base image it starts FROM."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from d2ops.local import container_entry
from d2ops_core import platform


def final_stage(dockerfile: Path) -> tuple[str, dict[str, str]]:
    """The final stage's base image repository (ARG defaults resolved, tag and digest dropped) and the
    environment its ENV lines declare."""
    args: dict[str, str] = {}
    base, env = "", {}
    for keyword, rest in container_entry._instructions(dockerfile.read_text()):
        if keyword == "ARG" and not base:  # global ARGs: the only ones FROM can use
            name, _, default = rest.partition("=")
            args[name] = default.strip('"')
        elif keyword == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], ""), image)
            base, env = re.split(r"[@]|:(?=[^/]*$)", image)[0], {}
        elif keyword == "ENV":
            words = shlex.split(rest)
            if words and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
                env[words[0]] = rest.split(None, 1)[1] if len(words) > 1 else ""
            else:
                for word in words:
                    key, _, value = word.partition("=")
                    env[key] = value
    return base, env


def effective_toolkit_env(dockerfile: Path) -> dict[str, str]:
    base, env = final_stage(dockerfile)
    inherited = dict(platform.CONTAINER_TOOLKIT_ENV) if base in platform.BASES_WITH_CONTAINER_TOOLKIT_ENV else {}
    return {**inherited, **{k: v for k, v in env.items() if k in platform.CONTAINER_TOOLKIT_ENV}}


@pytest.mark.parametrize("image", ["serving", "training"])
def test_each_image_asks_the_container_toolkit_for_the_gpu_and_driver(image: container_entry.Image) -> None:
    """Mutations caught: the serving image's NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES dropped
    (python:*-slim sets neither: no GPU, /ping refuses forever), either narrowed to "utility" (no
    libcuda), the training image moved to a base that does not set them (ubuntu:22.04)."""
    dockerfile = container_entry.dockerfile_for(image)
    assert effective_toolkit_env(dockerfile) == platform.CONTAINER_TOOLKIT_ENV, dockerfile


def test_the_reader_resolves_the_base_and_follows_env_overrides(tmp_path: Path) -> None:
    """The reader itself: a digest-pinned ARG base counts, an ENV in an earlier stage does not, a later ENV
    narrowing a capability wins over the base's. Mutation caught: a reader that always answers the table."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE=nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04@sha256:" + "0" * 64 + "\n"
        "FROM python:3.11-slim AS build\nENV NVIDIA_VISIBLE_DEVICES=all\n"
        "FROM ${BASE}\nENV NVIDIA_DRIVER_CAPABILITIES=utility \\\n    OTHER=1\n")
    assert final_stage(dockerfile)[0] == "nvidia/cuda"
    assert effective_toolkit_env(dockerfile) == {"NVIDIA_VISIBLE_DEVICES": "all",
                                                 "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    dockerfile.write_text("FROM registry.example:5000/python:3.11-slim\nENV NVIDIA_VISIBLE_DEVICES all\n")
    assert final_stage(dockerfile)[0] == "registry.example:5000/python"
    assert effective_toolkit_env(dockerfile) == {"NVIDIA_VISIBLE_DEVICES": "all"}
