"""The fine-tuning checkpoint leaves the served artifact but stays findable from its metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from model_code import artifact


def test_native_checkpoint_goes_to_the_output_data_dir_and_is_named_in_metadata(tmp_path: Path) -> None:
    weights = tmp_path / "work" / "model_final.pth"
    weights.parent.mkdir()
    weights.write_bytes(b"w" * 1000)
    config = weights.with_name("training_config.json")
    config.write_text("{}")
    output_data = tmp_path / "output" / "data"
    ref = artifact.copy_native_checkpoint(output_data, [weights, config])
    assert ref is not None
    assert ref.archive == "output.tar.gz" and ref.bytes == 1002
    assert ref.files == ["checkpoint/model_final.pth", "checkpoint/training_config.json"]
    for name in ref.files:  # the names are paths inside output.tar.gz, i.e. under SM_OUTPUT_DATA_DIR
        assert (output_data / name).is_file()
    metadata = artifact.ArtifactMetadata(framework="torchvision", task="detection", model="m", class_names=["a"],
                                         category_ids=[1], checkpoint=ref)
    again = artifact.ArtifactMetadata.model_validate_json(metadata.model_dump_json())
    assert again.checkpoint == ref
    assert artifact.copy_native_checkpoint(output_data, []) is None


def test_checkpoint_reference_is_validated() -> None:
    with pytest.raises(ValidationError):
        artifact.NativeCheckpoint(archive="model.tar.gz", files=["checkpoint/x"], bytes=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        artifact.NativeCheckpoint(files=[], bytes=0)
