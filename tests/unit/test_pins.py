"""d2ops.pins: what `make pins` rewrites and how it resolves a tag's digest (the registry faked here)."""

from __future__ import annotations

import email.message
import io
import json
import shutil
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from d2ops import pins
from d2ops.template import REPO_ROOT

NEW = "sha256:" + "1" * 64
TRAINING = (REPO_ROOT / "containers" / "training" / "Dockerfile").read_text()


def test_repin_replaces_only_the_base_images_digests() -> None:
    """The ARG a FROM names and a literal FROM are repinned, their tags kept; other ARGs (an index URL, a
    version) and `FROM ${BASE_IMAGE}` stay. Mutation caught: a rewrite that drops the tag or touches ARGs."""
    text = ("ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04@sha256:" + "0" * 64 + "\n"
            "FROM ${BASE_IMAGE}\nARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126\n"
            "ARG EFA_INSTALLER_VERSION=1.43.3\nFROM python:3.11-slim-bookworm AS serve\n")
    asked: list[str] = []

    def resolve(tag: str) -> str:
        asked.append(tag)
        return NEW

    out = pins.repin(text, resolve)
    assert asked == ["nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04", "python:3.11-slim-bookworm"]
    assert f"ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04@{NEW}\n" in out
    assert f"FROM python:3.11-slim-bookworm@{NEW} AS serve\n" in out
    assert "FROM ${BASE_IMAGE}\nARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126\n" in out
    assert "ARG EFA_INSTALLER_VERSION=1.43.3\n" in out
    assert not pins.unpinned(out)


def test_repin_of_the_training_image_changes_one_line() -> None:
    out = pins.repin(TRAINING, lambda tag: NEW)
    changed = [(a, b) for a, b in zip(TRAINING.splitlines(), out.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].endswith(f"ubuntu22.04@{NEW}")


class FakeRegistry:
    """Docker Hub's shape: 401 with a Bearer challenge, a token endpoint, then the digest header."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []

    def __call__(self, request: Any, timeout: float) -> Any:
        url = request if isinstance(request, str) else request.full_url
        headers = {} if isinstance(request, str) else dict(request.header_items())
        self.requests.append((url, headers))
        if url.startswith("https://auth.example/token"):
            return io.BytesIO(json.dumps({"token": "T"}).encode())
        answer = email.message.Message()
        if "Authorization" not in headers:
            answer["WWW-Authenticate"] = ('Bearer realm="https://auth.example/token",service="registry.example",'
                                          'scope="repository:library/python:pull"')
            raise urllib.error.HTTPError(url, 401, "Unauthorized", answer, None)
        response = io.BytesIO(b"")
        answer["Docker-Content-Digest"] = NEW
        response.headers = answer  # type: ignore[attr-defined]
        return response


def test_resolve_follows_the_token_challenge(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Docker Hub official image: library/ prefixed, token fetched for the challenge's scope, manifest
    index types accepted (the digest of the multi-platform index, not one platform's manifest)."""
    registry = FakeRegistry()
    monkeypatch.setattr(pins.urllib.request, "urlopen", registry)
    assert pins.resolve_digest("python:3.11-slim-bookworm@sha256:" + "0" * 64) == NEW
    (first, _), (token, _), (second, headers) = registry.requests
    assert first == second == "https://registry-1.docker.io/v2/library/python/manifests/3.11-slim-bookworm"
    assert "scope=repository%3Alibrary%2Fpython%3Apull" in token
    assert headers["Authorization"] == "Bearer T"
    assert "application/vnd.oci.image.index.v1+json" in headers["Accept"]


def test_an_unreachable_registry_fails_make_pins_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Mutation caught: an unreachable registry leaving the Dockerfiles half-rewritten or failing with a
    traceback instead of one line naming the registry."""
    def offline(request: Any, timeout: float) -> Any:
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(pins.urllib.request, "urlopen", offline)
    for name in pins.DOCKERFILES:
        (tmp_path / name).parent.mkdir(parents=True)
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    with pytest.raises(SystemExit) as exit_:
        pins.main(["digests", "--root", str(tmp_path)])
    assert exit_.value.code == 1
    assert "registry-1.docker.io: cannot resolve nvidia/cuda:12.6.3" in capsys.readouterr().err
    assert (tmp_path / pins.DOCKERFILES[0]).read_text() == TRAINING


def test_constraints_refuse_locks_that_disagree(tmp_path: Path) -> None:
    """Mutation caught: the serving lock drifting from the layer's pydantic while `make setup` silently
    takes one of them."""
    for lock, source in pins.LOCKS.items():
        for name in (lock, source):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO_ROOT / name, tmp_path / name)
    serving = tmp_path / "containers/serving/requirements.lock"
    layer_version = pins.read_lock((REPO_ROOT / "src/requirements.lock").read_text())["pydantic"].version
    serving.write_text(serving.read_text().replace(f"pydantic=={layer_version}", "pydantic==2.99.0"))
    with pytest.raises(pins.PinError, match=r"pydantic==2\.99\.0, but src/requirements\.lock locks"):
        pins.constraints(tmp_path)


def test_the_dev_ceiling_keeps_what_make_setup_constrains() -> None:
    """The locks follow the dev tools' resolution for the packages `make setup` constrains (the layer lock's,
    every image input's) and for nothing else. Mutation caught: the ceiling dropping pydantic (a lock then
    passes aws-sam-cli's ~=2.13.3 and `make setup` cannot resolve) or pinning the functions' boto3."""
    resolution = ("pydantic==2.13.5\n    # via aws-sam-translator\npydantic-core==2.46.5\nboto3==1.43.108\n"
                  "setuptools==80.10.2\nPillow==12.2.0\nprotobuf==6.33.6\n")
    assert pins.dev_ceiling(resolution) == ("pydantic==2.13.5\npydantic-core==2.46.5\nsetuptools==80.10.2\n"
                                            "pillow==12.2.0\n")
