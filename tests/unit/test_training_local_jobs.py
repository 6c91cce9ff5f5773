"""The local SageMaker-style runner's layout, the train-local CLI's arguments, and the docs table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops.local import jobs as local_jobs
from d2ops.template import REPO_ROOT
from model_code.training.config import Hyperparameters, load_environment, parse_hyperparameters


def test_host_tree_is_what_the_entry_point_reads(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    spec = local_jobs.TrainingJobSpec(job_name="j", channels={"train": data, "val": data}, work_dir=tmp_path / "w",
                                      output_dir=tmp_path / "o", hyperparameters={"max_iter": "7"},
                                      instance_count=3, cpus_per_host=1)
    root, env = local_jobs.prepare_training_host(spec, "algo-2", 41000)
    assert root == tmp_path / "w" / "algo-2"
    config = root / "input" / "config"
    assert json.loads((config / "resourceconfig.json").read_text()) == {
        "current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-3"], "network_interface_name": "lo"}
    assert json.loads((config / "hyperparameters.json").read_text()) == {"max_iter": "7"}
    assert set(json.loads((config / "inputdataconfig.json").read_text())) == {"train", "val"}
    assert (root / "input" / "data" / "train").resolve() == data.resolve()
    assert env["SM_CURRENT_HOST"] == "algo-2" and json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2", "algo-3"]
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["OMP_NUM_THREADS"]) == ("127.0.0.1", "41000", "1")
    # the entry point's own parser reads this tree back: both sides of the contract agree
    parsed = load_environment(env)
    assert parsed.current_host == "algo-2" and parsed.model_dir == root / "model"
    assert parsed.channel("val") == root / "input" / "data" / "val"
    assert parsed.checkpoint_dir == root / "checkpoints"
    assert parse_hyperparameters(parsed.hyperparameters).max_iter == 7
    # from the config files alone (no SM_* variables), as under a bare SageMaker launcher
    bare = load_environment({"D2OPS_ML_ROOT": str(root)}, gpu_count=0)
    assert bare.hosts == parsed.hosts and bare.channels == parsed.channels


def test_missing_channel_directory_is_refused(tmp_path: Path) -> None:
    spec = local_jobs.TrainingJobSpec(job_name="j", channels={"train": tmp_path / "nope"}, work_dir=tmp_path / "w",
                                      output_dir=tmp_path / "o")
    with pytest.raises(local_jobs.LocalJobError, match="channel 'train'"):
        local_jobs.prepare_training_host(spec, "algo-1", 1)


def test_local_jobs_leave_a_core_to_the_machine_and_their_threads_sleep_while_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # this machine's cores less one, split over the hosts, at least one each
    assert [local_jobs.local_cpus(1, cores) for cores in (1, 2, 4, 16)] == [1, 1, 3, 15]
    assert [local_jobs.local_cpus(hosts, 8) for hosts in (1, 2, 3, 7, 8)] == [7, 3, 2, 1, 1]
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # tests/conftest.py sets it for the whole session
    data = tmp_path / "data"
    data.mkdir()
    spec = local_jobs.TrainingJobSpec(job_name="j", channels={"train": data, "val": data}, work_dir=tmp_path / "w",
                                      output_dir=tmp_path / "o")
    _, env = local_jobs.prepare_training_host(spec, "algo-1", 41000)
    assert env["OMP_NUM_THREADS"] == env["SM_NUM_CPUS"] == str(local_jobs.local_cpus(1))
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    processing = local_jobs.ProcessingJobSpec(job_name="e", inputs={"val": data}, work_dir=tmp_path / "root",
                                              output_dir=tmp_path / "out")
    _, env = local_jobs.prepare_processing(processing)
    assert (env["OMP_NUM_THREADS"], env["OMP_WAIT_POLICY"]) == (str(local_jobs.local_cpus()), "PASSIVE")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # a policy the user chose wins
    assert local_jobs.prepare_training_host(spec, "algo-1", 41000)[1]["OMP_WAIT_POLICY"] == "ACTIVE"


def test_local_jobs_count_the_cores_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 2-CPU cpuset on a 64-core host: one thread, not 63.
    monkeypatch.setattr(local_jobs.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(local_jobs.os, "sched_getaffinity", lambda pid: {4, 5}, raising=False)
    assert local_jobs.usable_cores() == 2 and local_jobs.local_cpus() == 1


def test_processing_layout_mounts_files_and_directories(tmp_path: Path) -> None:
    tar = tmp_path / "model.tar.gz"
    tar.write_bytes(b"x")
    val = tmp_path / "val"
    val.mkdir()
    spec = local_jobs.ProcessingJobSpec(job_name="e", inputs={"challenger": tar, "val": val},
                                        work_dir=tmp_path / "root", output_dir=tmp_path / "out")
    root, env = local_jobs.prepare_processing(spec)
    assert (root / "processing" / "input" / "challenger" / "model.tar.gz").read_bytes() == b"x"
    assert (root / "processing" / "input" / "val").resolve() == val.resolve()
    assert env["D2OPS_ML_ROOT"] == str(root)


@pytest.mark.parametrize(("args", "message"), [
    (["--hyperparameters", "{bad"], "--hyperparameters is not valid JSON"),
    (["--hyperparameters", "[1]"], "must be a JSON object"),
    (["--hosts", "0"], "--hosts must be at least 1"),
])
def test_train_local_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "d2ops", "train-local", str(tmp_path), str(tmp_path / "o"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr


def test_every_hyperparameter_is_documented() -> None:
    doc = (REPO_ROOT / "docs" / "training.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", doc, flags=re.M))
    assert documented == set(Hyperparameters.model_fields)


# A processing "image" in a few lines: it reads the tree where the runner says it is (remap mode).
_PROCESSING_SCRIPT = """
import os, pathlib, sys, time
root = pathlib.Path(os.environ["D2OPS_ML_ROOT"])
print("d2ops-metric val:bbox_AP=0.5 iter=3", flush=True)
if sys.argv[1] == "ok":
    (root / "processing" / "output" / "sub").mkdir(parents=True, exist_ok=True)
    (root / "processing" / "output" / "sub" / "report.json").write_text("{}")
elif sys.argv[1] == "fail":
    (root / "output").mkdir(exist_ok=True)
    (root / "output" / "message").write_text("ValueError: no val split\\n")
    raise SystemExit(3)
else:
    time.sleep(60)
"""


@pytest.mark.parametrize(("mode", "status", "reason"), [
    ("ok", "Completed", None),
    ("fail", "Failed", "ValueError: no val split"),
    ("hang", "Failed", "MaxRuntimeExceeded: the job ran longer than 2 s"),
])
def test_processing_job_lifecycle(tmp_path: Path, mode: str, status: str, reason: str | None) -> None:
    spec = local_jobs.ProcessingJobSpec(
        job_name="e", inputs={}, work_dir=tmp_path / "root", output_dir=tmp_path / "out",
        command=(sys.executable, "-c", _PROCESSING_SCRIPT, mode), environment={"D2OPS_ML_MOUNT": "remap"},
        max_runtime_seconds=2 if mode == "hang" else 60)
    lines: list[str] = []
    result = local_jobs.run_processing_job(spec, log=lines.append)
    assert (result.status, result.failure_reason) == (status, reason)
    assert result.metrics == {"val:bbox_AP": 0.5}
    assert "[processing] d2ops-metric val:bbox_AP=0.5 iter=3" in lines
    if mode == "ok":
        assert result.exit_codes == {"processing": 0}
        assert result.outputs == {"sub/report.json": tmp_path / "out" / "sub" / "report.json"}
        assert (tmp_path / "out" / "sub" / "report.json").read_text() == "{}"


def test_a_jobs_environment_never_overrides_what_the_runner_sets(tmp_path: Path) -> None:
    """Mutation caught: the request's Environment applied last (its PATH/PYTHONPATH decided which
    `python` and which modules the runner's command loads)."""
    data = tmp_path / "data"
    data.mkdir()
    foreign = {"PATH": str(tmp_path / "bin"), "PYTHONPATH": str(tmp_path / "evil"), "OMP_NUM_THREADS": "64",
               "PYTHONUNBUFFERED": "0", "D2OPS_ML_ROOT": str(tmp_path / "elsewhere"), "SM_CURRENT_HOST": "algo-9",
               "MAX_IMAGE_PIXELS": "1000"}
    spec = local_jobs.TrainingJobSpec(job_name="j", channels={"train": data}, work_dir=tmp_path / "w",
                                      output_dir=tmp_path / "o", environment=foreign, code_dir=tmp_path / "code")
    processing = local_jobs.ProcessingJobSpec(job_name="e", inputs={"val": data}, work_dir=tmp_path / "root",
                                              output_dir=tmp_path / "out", environment=foreign)
    remap = local_jobs.MlMount(False, "test: no namespace")
    for (root, env), code_dir in ((local_jobs.prepare_training_host(spec, "algo-1", 41000, remap), spec.code_dir),
                                  (local_jobs.prepare_processing(processing, remap), None)):
        assert env["MAX_IMAGE_PIXELS"] == "1000"  # the job's own variables still reach it
        assert str(tmp_path / "bin") not in env["PATH"].split(os.pathsep)
        assert str(tmp_path / "evil") not in env.get("PYTHONPATH", "").split(os.pathsep)
        assert code_dir is None or env["PYTHONPATH"].split(os.pathsep)[0] == str(code_dir)
        assert (env["PYTHONUNBUFFERED"], env["D2OPS_ML_ROOT"]) == ("1", str(root))
        assert env["OMP_NUM_THREADS"] != "64"
    assert local_jobs.prepare_training_host(spec, "algo-1", 41000, remap)[1]["SM_CURRENT_HOST"] == "algo-1"
