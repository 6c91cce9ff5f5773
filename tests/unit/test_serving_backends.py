"""Choosing the server (D2OPS_SERVING_BACKEND) and preparing Ray Serve, without starting either server.

The servers themselves are started for real in tests/integration/test_serving_torchserve.py (both backends).
"""

from __future__ import annotations

import pytest

from d2ops.local.serving import LocalEndpoint, LocalServingError
from model_code.serving import backends, entrypoint, launch, ray_launch
from tests.fixtures.serving.support import cached_artifact


def test_the_backend_defaults_to_torchserve_and_refuses_anything_else() -> None:
    assert backends.backend_from_env({}) == backends.backend_from_env({backends.BACKEND_ENV: ""}) == "torchserve"
    assert backends.backend_from_env({backends.BACKEND_ENV: "ray-serve"}) == "ray-serve"
    # Catches a lenient parse ("Ray-Serve", "ray_serve" silently served by TorchServe).
    for bad in ("Ray-Serve", "ray_serve", "triton", " torchserve"):
        with pytest.raises(ValueError, match=r"D2OPS_SERVING_BACKEND=.* expected one of torchserve, ray-serve"):
            backends.backend_from_env({backends.BACKEND_ENV: bad})


def test_a_bad_backend_is_one_line_and_exit_1_before_anything_is_prepared(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("D2OPS_MODEL_PATH", str(cached_artifact()))
    monkeypatch.setenv("D2OPS_SERVING_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv(backends.BACKEND_ENV, "tensorrt")
    assert entrypoint.main(["serve"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d2ops serving: error: D2OPS_SERVING_BACKEND='tensorrt'" in err
    assert not (tmp_path / "work").exists()  # refused before the model store or a server was made


def test_local_endpoint_takes_the_backend_from_the_container_environment(tmp_path) -> None:
    model = cached_artifact()
    from_env = LocalEndpoint(model, workdir=tmp_path / "a", environment={backends.BACKEND_ENV: "ray-serve"})
    assert from_env.backend == "ray-serve" and from_env.environment()[backends.BACKEND_ENV] == "ray-serve"
    assert from_env.logs_dir == tmp_path / "a" / "ray" / "session_latest" / "logs"
    default = LocalEndpoint(model, workdir=tmp_path / "b")
    assert default.backend == "torchserve" and default.environment()[backends.BACKEND_ENV] == "torchserve"
    explicit = LocalEndpoint(model, workdir=tmp_path / "c", environment={backends.BACKEND_ENV: "torchserve"},
                             backend="ray-serve")
    assert explicit.environment()[backends.BACKEND_ENV] == "ray-serve"  # the argument wins
    with pytest.raises(LocalServingError, match="backend='jetty'"):
        LocalEndpoint(model, workdir=tmp_path / "d", backend="jetty")


def test_ray_serve_gets_the_torchserve_limits_a_private_instance_and_no_usage_report(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a cluster the host happens to name: never joined
    config = launch.read_properties(launch.config_path())
    server = ray_launch.RayServeProcess(tmp_path / "model", tmp_path / "w", host="0.0.0.0", port=8080,
                                        ping_url="http://127.0.0.1:8080/ping",
                                        settings=launch.BatchSettings(batch_size=4, max_batch_delay_ms=7, workers=2),
                                        config=config)
    command = server.command()
    options = dict(zip(command[3::2], command[4::2], strict=True))
    assert options["--max-request-bytes"] == config["max_request_size"]
    assert options["--request-timeout-s"] == config["default_response_timeout"]
    assert options["--max-ongoing-requests"] == config["job_queue_size"]
    assert (options["--batch-size"], options["--max-batch-delay-ms"], options["--workers"]) == ("4", "7", "2")
    env = server.environment()
    assert "RAY_ADDRESS" not in env and env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] == "0"  # Ray must not hide the GPUs device.py decides on
    assert options["--temp-dir"].startswith(str(tmp_path / "w")) or server.temp.name.startswith("d2ops-ray-")
    server.stop()  # never started: removes only the short temp dir a deep tmp_path gets


def test_a_deep_work_dir_gets_a_short_ray_temp_dir_that_stop_removes(tmp_path) -> None:
    deep = tmp_path / ("x" * 60) / "work"
    deep.mkdir(parents=True)
    server = ray_launch.RayServeProcess(tmp_path / "model", deep, host="127.0.0.1", port=1, ping_url="",
                                        settings=launch.BatchSettings(), config={})
    # Ray's sockets sit about 70 characters below its temp dir; a Unix socket path may not exceed 107 bytes.
    assert len(str(server.temp)) <= ray_launch.MAX_TEMP_DIR_CHARS and server.temp.is_dir()
    assert (deep / "ray").resolve() == server.temp.resolve()  # the logs are still found under the work dir
    server.stop()
    assert not server.temp.exists()
