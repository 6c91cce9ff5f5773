"""Packaging for TorchServe: artifact checks, the model archive, the effective configuration, the plugin."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from model_code.serving import entrypoint, launch
from tests.fixtures.serving.support import cached_artifact

REPO = Path(__file__).resolve().parents[2]


def test_the_image_config_disables_token_auth_and_keeps_management_on_loopback():
    props = launch.read_properties(launch.PACKAGED_CONFIG)
    assert props["inference_address"] == "http://0.0.0.0:8080"
    assert props["management_address"].startswith("http://127.0.0.1:")
    assert props["metrics_address"].startswith("http://127.0.0.1:")
    assert props["disable_token_authorization"] == "true" and props["enable_model_api"] == "false"
    assert int(props["max_request_size"]) > 2 * 6 * 1024 * 1024  # base64 JSON of a 6 MiB image fits
    assert "load_models" not in props and "models" not in props  # added at start, for exactly one model


def test_render_config_loads_exactly_one_model_with_its_batching(tmp_path):
    base = launch.read_properties(launch.PACKAGED_CONFIG)
    props = launch.render_config(base, model_store=tmp_path / "store", plugins=tmp_path / "plugins",
                                 inference_address="http://127.0.0.1:9999", management_address="http://127.0.0.1:1",
                                 metrics_address="http://127.0.0.1:2",
                                 settings=launch.BatchSettings(batch_size=4, max_batch_delay_ms=7, workers=2),
                                 grpc_ports=(7100, 7101))
    assert props["load_models"] == "model" and props["inference_address"] == "http://127.0.0.1:9999"
    assert (props["grpc_inference_port"], props["grpc_management_port"]) == ("7100", "7101")
    assert base["grpc_inference_address"] == base["grpc_management_address"] == "127.0.0.1"
    models = json.loads(props["models"])
    assert models == {"model": {"1.0": {"defaultVersion": True, "marName": "model", "minWorkers": 2, "maxWorkers": 2,
                                        "batchSize": 4, "maxBatchDelay": 7}}}
    for key in ("disable_token_authorization", "default_response_timeout", "max_request_size"):
        assert props[key] == base[key]
    written = launch.write_properties(tmp_path / "config.properties", props)
    assert launch.read_properties(written) == props


def test_batch_settings_from_env_are_validated():
    assert launch.BatchSettings.from_env({"D2OPS_BATCH_SIZE": "16", "D2OPS_WORKERS": ""}).batch_size == 16
    with pytest.raises(ValueError, match="batch_size"):
        launch.BatchSettings.from_env({"D2OPS_BATCH_SIZE": "0"})


def test_prepare_model_dir_accepts_a_directory_or_model_tar_gz(tmp_path):
    model_dir = cached_artifact()
    assert launch.prepare_model_dir(model_dir, tmp_path) == model_dir
    extracted = launch.prepare_model_dir(cached_artifact(pack=True), tmp_path / "work")
    assert (extracted / "model.pt").is_file() and (extracted / "metadata.json").is_file()


def test_prepare_model_dir_refuses_what_is_not_an_artifact(tmp_path):
    with pytest.raises(launch.ServingError, match="no such model directory"):
        launch.prepare_model_dir(tmp_path / "absent", tmp_path)
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(launch.ServingError, match=r"not a readable model\.tar\.gz"):
        launch.prepare_model_dir(tmp_path / "junk.tar.gz", tmp_path / "w1")
    with pytest.raises(launch.ServingError, match=r"metadata\.json: missing"):
        launch.prepare_model_dir(tmp_path / "w1", tmp_path)
    no_model = tmp_path / "no-model"
    no_model.mkdir()
    shutil.copy(cached_artifact() / "metadata.json", no_model)
    with pytest.raises(launch.ServingError, match=r"model\.pt: missing"):
        launch.prepare_model_dir(no_model, tmp_path)
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(launch.ServingError, match=r"not a readable model\.tar\.gz"):
        launch.prepare_model_dir(evil, tmp_path / "w2")
    assert not (tmp_path / "escaped.json").exists()


def test_build_model_archive_holds_the_model_metadata_and_handler(tmp_path):
    store = tmp_path / "store"
    archive = launch.build_model_archive(cached_artifact(), store)
    manifest = json.loads((archive / "MAR-INF" / "MANIFEST.json").read_text())
    assert manifest["model"]["modelName"] == "model" and manifest["model"]["handler"] == "torchserve_handler.py"
    assert manifest["model"]["serializedFile"] == "model.pt"
    assert {p.name for p in archive.iterdir()} >= {"model.pt", "metadata.json", "torchserve_handler.py"}


def test_build_model_archive_carries_every_form_the_artifact_holds(tmp_path):
    # catches: model.pt2 / model.aoti.pt2 left out of TorchServe's model store, so D2OPS_MODEL_FORM=exported
    # (or the AOTInductor package load_artifact prefers) fails in the TorchServe worker while Ray Serve serves it
    model = tmp_path / "model"
    shutil.copytree(cached_artifact(), model)
    (model / "model.pt2").write_bytes(b"exported")
    (model / "model.aoti.pt2").write_bytes(b"aoti")
    archive = launch.build_model_archive(model, tmp_path / "store")
    assert (archive / "model.pt2").read_bytes() == b"exported"
    assert (archive / "model.aoti.pt2").read_bytes() == b"aoti"


def test_readiness_ping_plugin_compiles_into_a_service_jar(tmp_path):
    jar = launch.build_ping_plugin(tmp_path)
    with zipfile.ZipFile(jar) as zf:
        assert "io/d2ops/serving/ReadinessPing.class" in zf.namelist()
        assert zf.read(launch.PLUGIN_SERVICE).decode().strip() == "io.d2ops.serving.ReadinessPing"
    assert launch.build_ping_plugin(tmp_path) == jar  # cached
    with pytest.raises(launch.ServingError, match="holds no"):
        launch.plugins_dir({launch.PLUGINS_ENV: str(tmp_path / "empty")})
    assert launch.plugins_dir({launch.PLUGINS_ENV: str(tmp_path)}) == tmp_path


def test_entrypoint_accepts_only_serve_and_fails_fast_on_a_bad_model(tmp_path, monkeypatch, capsys):
    assert entrypoint.main(["train"]) == 2
    assert "SageMaker runs the image with 'serve'" in capsys.readouterr().err
    monkeypatch.setenv("D2OPS_MODEL_PATH", str(tmp_path / "absent"))
    monkeypatch.setenv("D2OPS_SERVING_WORKDIR", str(tmp_path / "work"))
    assert entrypoint.main(["serve"]) == 1
    assert "no such model directory or model.tar.gz" in capsys.readouterr().err
    monkeypatch.setenv("D2OPS_BATCH_SIZE", "0")
    monkeypatch.setenv("D2OPS_MODEL_PATH", str(cached_artifact()))
    assert entrypoint.main(["serve"]) == 1
    assert "batching settings" in capsys.readouterr().err


def test_entrypoint_fails_fast_on_a_bad_pixel_limit(tmp_path, monkeypatch, capsys):
    # CreateModel's Environment carries MaxImagePixels: a bad value stops the start, it is not a 500 per request
    monkeypatch.setenv("D2OPS_MODEL_PATH", str(tmp_path / "absent"))
    monkeypatch.setenv("MAX_IMAGE_PIXELS", "0")
    assert entrypoint.main(["serve"]) == 1
    assert capsys.readouterr().err.strip() == ("d2ops serving: error: MAX_IMAGE_PIXELS=0 is outside "
                                               "1,000,000..150,000,000 pixels (the stack parameter MaxImagePixels)")


def test_entrypoint_port_validation():
    with pytest.raises(launch.ServingError, match="is not a TCP port"):
        entrypoint._port({"SAGEMAKER_BIND_TO_PORT": "80a"}, "SAGEMAKER_BIND_TO_PORT", 8080)
    assert entrypoint._port({}, "SAGEMAKER_BIND_TO_PORT", 8080) == 8080


def test_deep_workdirs_get_a_temp_dir_short_enough_for_worker_sockets(tmp_path):
    from model_code.serving.launch import MAX_UNIX_SOCKET_PATH, serving_env

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    temp = serving_env(deep, base={})["TEMP"]
    shutil.rmtree(temp)  # outside tmp_path: a server's own stop removes it (the next test)
    assert len(temp + "/.ts.sock.9000") <= MAX_UNIX_SOCKET_PATH
    assert serving_env(tmp_path / "w", base={})["TEMP"] == str(tmp_path / "w" / "tmp")


def test_a_short_temp_dir_outside_the_workdir_is_removed_when_the_server_stops(tmp_path):
    from model_code.serving.launch import TorchServeProcess

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    server = TorchServeProcess(deep / "config.properties", deep, "http://127.0.0.1:1/ping")
    assert server.environment()["TMPDIR"] == str(server.temp) and server.temp.is_dir()
    assert not server.temp.is_relative_to(deep)
    server.stop()
    assert not server.temp.exists()  # not left in /tmp, one per endpoint started

    shallow = TorchServeProcess(tmp_path / "w" / "config.properties", tmp_path / "w", "http://127.0.0.1:1/ping")
    shallow.environment()
    shallow.stop()
    assert (tmp_path / "w" / "tmp").is_dir()  # inside the work dir: its logs' neighbour, kept


def _tar_of(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def test_extraction_is_capped_in_bytes_and_files_before_anything_is_written(tmp_path):
    from model_code.artifact import ArtifactError, safe_extract

    # 64 MB of zeros is a 64 KB gzip: the declared sizes are summed before extraction starts.
    bomb = _tar_of(tmp_path / "bomb.tar.gz", {"metadata.json": b"{}", "model.pt": b"\0" * (64 * 1024**2)})
    assert bomb.stat().st_size < 1024**2
    with pytest.raises(ArtifactError, match=r"expands to more than 1048576 bytes \(at 'model\.pt'\)"):
        safe_extract(bomb, tmp_path / "out", max_bytes=1024**2)
    assert not (tmp_path / "out").exists()
    many = _tar_of(tmp_path / "many.tar.gz", {f"f{i}": b"x" for i in range(50)})
    with pytest.raises(ArtifactError, match="more than 20 files"):
        safe_extract(many, tmp_path / "out", max_members=20)
    safe_extract(many, tmp_path / "out")  # within the default caps
    assert len(list((tmp_path / "out").iterdir())) == 50
