"""training_images.txt: what a model trained on, by content, written by the export and read by load_artifact."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest
import torch
from torch import nn

from model_code import artifact


class Nothing(nn.Module):
    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return [{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
                for _ in images]


def model_dir(tmp_path: Path) -> Path:
    metadata = artifact.ArtifactMetadata(framework="torchvision", task="detection", model="nothing",
                                         class_names=["a"], category_ids=[1])
    return artifact.save_artifact(tmp_path / "model", torch.jit.script(Nothing()), metadata)


def sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def test_the_list_is_sorted_unique_lowercase_and_ships_in_model_tar_gz(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    artifact.write_training_images(directory, [sha(2), sha(1).upper(), sha(2)])
    text = (directory / artifact.TRAINING_IMAGES_FILE).read_text()
    assert text == "".join(f"{s}\n" for s in sorted([sha(1), sha(2)]))
    tar = artifact.pack_artifact(directory, tmp_path / "model.tar.gz")
    with tarfile.open(tar) as t:
        assert artifact.TRAINING_IMAGES_FILE in t.getnames()
    assert artifact.load_artifact(tar).training_images == frozenset({sha(1), sha(2)})


def test_an_artifact_from_before_the_list_says_none_and_an_empty_list_says_nothing(tmp_path: Path) -> None:
    """None (unknown: the gate cannot verify held-out) is not the empty set (trained on no image)."""
    directory = model_dir(tmp_path)
    assert artifact.load_artifact(directory).training_images is None
    artifact.write_training_images(directory, [])
    assert artifact.load_artifact(directory).training_images == frozenset()


@pytest.mark.parametrize(("content", "named"), [
    (f"{sha(1)}\nnot-a-hash\n".encode(), "line 2: 'not-a-hash' is not a lowercase hex SHA-256"),
    (f"{sha(1).upper()}\n".encode(), "line 1:"),
    (f"{sha(1)}\n\n{sha(2)}\n".encode(), "line 2: '' is not"),
    (f"{sha(1)} \n".encode(), "line 1:"),
    (f"{sha(1)}\n{sha(2)[:-1]}é\n".encode(), "line 2: not ASCII"),
])
def test_a_malformed_list_is_an_artifact_error_naming_the_line(tmp_path: Path, content: bytes, named: str) -> None:
    """A list that cannot be read must never pass as a shorter list (the comparison would keep training images)."""
    directory = model_dir(tmp_path)
    (directory / artifact.TRAINING_IMAGES_FILE).write_bytes(content)
    loaded = artifact.load_artifact(directory)
    with pytest.raises(artifact.ArtifactError, match=f"training_images.txt: {named}"):
        _ = loaded.training_images


def test_the_writer_refuses_what_is_not_a_sha256(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a hex SHA-256"):
        artifact.write_training_images(tmp_path, ["images/a.jpg"])
