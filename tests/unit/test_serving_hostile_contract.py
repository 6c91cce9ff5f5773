"""Hostile inputs at the serving image's SageMaker contract: each is a clear error before TorchServe starts.

Cheap: nothing here starts TorchServe; a bad model or setting must be refused in the launcher,
not found 600 s later as a /ping that never turns healthy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from model_code.serving import entrypoint, launch
from tests.fixtures.serving.support import cached_artifact


@pytest.mark.parametrize("raw", ["\u00b2", "\uff11\uff12\uff13", "\u0668\u0660\u0668\u0660",
                                 "80a", "0", "65536", "-1", " 8080"])
def test_a_bind_port_that_is_not_an_ascii_port_number_is_a_serving_error(raw: str) -> None:
    # Before: "²".isdigit() is True and int("²") raised ValueError (a traceback, not a log line).
    with pytest.raises(launch.ServingError, match=r"SAGEMAKER_BIND_TO_PORT=.* is not a TCP port"):
        entrypoint._port({"SAGEMAKER_BIND_TO_PORT": raw}, "SAGEMAKER_BIND_TO_PORT", 8080)


def test_a_startup_timeout_that_is_not_a_number_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("D2OPS_MODEL_PATH", str(cached_artifact()))
    monkeypatch.setenv("D2OPS_SERVING_WORKDIR", str(tmp_path / "work"))
    for raw in ("soon", "nan", "-5", "inf"):
        monkeypatch.setenv("D2OPS_STARTUP_TIMEOUT", raw)
        assert entrypoint.main(["serve"]) == 1
        err = capsys.readouterr().err
        assert f"D2OPS_STARTUP_TIMEOUT={raw!r}" in err and "Traceback" not in err


def test_a_stop_with_parent_flag_that_is_not_a_boolean_is_one_line_and_exit_1(tmp_path, monkeypatch,
                                                                              capsys) -> None:
    monkeypatch.setenv("D2OPS_MODEL_PATH", str(cached_artifact()))
    monkeypatch.setenv("D2OPS_SERVING_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("D2OPS_STOP_WITH_PARENT", "yes please")
    assert entrypoint.main(["serve"]) == 1
    err = capsys.readouterr().err
    assert "D2OPS_STOP_WITH_PARENT='yes please' is not 1, true, 0 or false" in err and "Traceback" not in err
    assert not (tmp_path / "work").exists()  # refused before anything was prepared


def _copy_artifact(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(cached_artifact(), model)
    return model


@pytest.mark.parametrize("damage", ["truncated", "empty", "text"])
def test_a_corrupt_model_pt_is_refused_before_torchserve(tmp_path, damage: str) -> None:
    model = _copy_artifact(tmp_path)
    weights = model / "model.pt"
    data = weights.read_bytes()
    weights.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "text": b"hello"}[damage])
    with pytest.raises(launch.ServingError, match=r"model\.pt: not a TorchScript archive"):
        launch.prepare_model_dir(model, tmp_path / "work")


def test_metadata_from_a_future_version_names_the_field(tmp_path) -> None:
    model = _copy_artifact(tmp_path)
    metadata = json.loads((model / "metadata.json").read_text())
    metadata["schema_version"] = 2
    (model / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(launch.ServingError, match=r"metadata\.json: invalid metadata: .*schema_version"):
        launch.prepare_model_dir(model, tmp_path / "work")


def test_extra_ports_come_from_sagemaker_safe_port_range() -> None:
    # Multi-container endpoints: SageMaker says which ports besides the bind port a container may use.
    env = {"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_SAFE_PORT_RANGE": "9000-9004"}
    assert entrypoint.extra_ports(env, (8081, 8082, 7070, 7071)) == (9001, 9002, 9003, 9004)
    # An explicit D2OPS_* port still wins; without the range the defaults stay.
    env["D2OPS_METRICS_PORT"] = "7999"
    assert entrypoint.extra_ports(env, (8081, 8082, 7070, 7071)) == (9001, 7999, 9002, 9003)
    assert entrypoint.extra_ports({}, (8081, 8082, 7070, 7071)) == (8081, 8082, 7070, 7071)


@pytest.mark.parametrize("raw", ["9000", "9004-9000", "a-b", "0-5", "9000-70000", "9000-9001", "9000 - 9010"])
def test_a_bad_or_too_small_safe_port_range_is_a_serving_error(raw: str) -> None:
    env = {"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_SAFE_PORT_RANGE": raw}
    with pytest.raises(launch.ServingError, match="SAGEMAKER_SAFE_PORT_RANGE="):
        entrypoint.extra_ports(env, (8081, 8082, 7070, 7071))
