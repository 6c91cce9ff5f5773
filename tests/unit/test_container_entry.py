"""The images' declared entry is what SageMaker runs and what the local runner runs.

A Dockerfile whose entry would not reach the project's code must fail here, before an image is
built: the base image's `train` winning through PATH, a missing ENTRYPOINT, a CMD that is not
the word SageMaker passes. The local jobs must run that same command with the job's tree at
/opt/ml (a private mount namespace per host process) or, where the OS forbids it, say so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from d2ops.local import container_entry
from d2ops.local import jobs as local_jobs
from d2ops.local.container_entry import EntryError, check_entry, image_command, local_command, parse_entry
from d2ops.template import REPO_ROOT


def test_training_image_runs_the_projects_train_script_with_train() -> None:
    entry = parse_entry(container_entry.dockerfile_for("training"))
    # What `docker run IMAGE train` starts inside the image...
    assert entry.docker_run("train") == ("/usr/bin/tini", "--", "/usr/local/bin/train", "train")
    assert entry.docker_run() == entry.docker_run("train")  # the bare image behaves the same
    # ...is the repository's script, and the Dockerfile copies exactly that script there.
    assert entry.copies["/usr/local/bin/train"] == "containers/training/train"
    assert image_command("training") == (str(REPO_ROOT / "containers" / "training" / "train"), "train")
    script = (REPO_ROOT / "containers" / "training" / "train").read_text()
    # through the forward-compatibility switch beside it (tests/unit/test_platform_gpu.py)
    assert 'exec "$(dirname "$0")/cuda-compat" python -m model_code.training.train' in script


def test_serving_image_runs_the_serving_entrypoint_with_serve() -> None:
    entry = parse_entry(container_entry.dockerfile_for("serving"))
    assert entry.docker_run("serve")[:3] == ("/usr/bin/tini", "--", "/usr/local/bin/python")
    assert image_command("serving") == (sys.executable, "-m", "model_code.serving.entrypoint", "serve")


def _mutated(tmp_path: Path, image: container_entry.Image, old: str, new: str) -> Path:
    text = container_entry.dockerfile_for(image).read_text()
    assert old in text, f"the mutation's anchor {old!r} is gone from the {image} Dockerfile"
    path = tmp_path / "Dockerfile"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(("image", "old", "new", "message"), [
    ("training", 'ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/train"]', "", "no ENTRYPOINT"),
    ("training", '"/usr/local/bin/train"]', '"train"]', "through PATH"),
    ("training", 'CMD ["train"]', 'CMD ["serve"]', "CMD is ['serve'], expected ['train']"),
    ("training", 'CMD ["train"]', "", "CMD is [], expected ['train']"),
    ("training", 'ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/train"]',
     "ENTRYPOINT /usr/local/bin/train", "not in exec form"),
    ("training", '["/usr/bin/tini", "--", "/usr/local/bin/train"]', '["/usr/local/bin/train"]',
     "does not start with an init"),
    ("training", "COPY --chmod=755 containers/training/train /usr/local/bin/train", "",
     "no `COPY containers/training/train /usr/local/bin/train`"),
    ("training", '"/usr/local/bin/train"]', '"/opt/conda/bin/train"]',
     "not in d2ops.local.container_entry.IMAGE_PATHS"),
    ("serving", '"/usr/local/bin/python", "-m"', '"python", "-m"', "through PATH"),
    ("serving", 'CMD ["serve"]', 'CMD ["train"]', "expected ['serve']"),
    ("serving", '"model_code.serving.entrypoint"]', '"model_code.serving.nowhere"]', "not in the repository"),
])
def test_an_entry_that_would_not_reach_our_code_is_refused(tmp_path: Path, image: container_entry.Image, old: str,
                                                           new: str, message: str) -> None:
    path = _mutated(tmp_path, image, old, new)
    with pytest.raises(EntryError) as caught:
        image_command(image, path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)  # says which file


def test_an_entry_declared_only_in_an_earlier_stage_does_not_count(tmp_path: Path) -> None:
    text = container_entry.dockerfile_for("training").read_text()
    path = tmp_path / "Dockerfile"
    path.write_text(text + "\nFROM python:3.11-slim AS final\nCOPY --from=0 /opt/ml/code /opt/ml/code\n")
    with pytest.raises(EntryError, match="no ENTRYPOINT in the final stage"):
        parse_entry(path)


def test_continuation_lines_and_cmd_reset_follow_docker(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text('FROM x\nCMD ["ignored"]\n# comment\n'
                    'ENTRYPOINT ["/usr/bin/tini", \\\n  "--", "/usr/local/bin/train"]\n')
    entry = parse_entry(path)
    assert entry.entrypoint == ("/usr/bin/tini", "--", "/usr/local/bin/train")
    assert entry.cmd == ()  # Docker drops an earlier CMD when ENTRYPOINT is declared after it
    with pytest.raises(EntryError, match="CMD is"):
        check_entry(entry, "training")


def test_local_command_maps_image_paths_and_refuses_unknown_ones() -> None:
    assert local_command(["python", "-m", "model_code.evaluation.job"], python="/venv/python") == (
        "/venv/python", "-m", "model_code.evaluation.job")
    assert local_command(["/usr/bin/tini", "--", "/opt/conda/bin/python", "x.py"], python="/p") == ("/p", "x.py")
    with pytest.raises(EntryError, match="/usr/bin/something"):
        local_command(["/usr/bin/something", "train"])
    with pytest.raises(EntryError, match="no program"):
        local_command(["/usr/bin/tini", "--"])


def test_train_script_refuses_other_words_with_a_failure_reason(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "D2OPS_ML_ROOT": str(tmp_path)}
    proc = subprocess.run(["sh", str(REPO_ROOT / "containers" / "training" / "train"), "serve"],
                          capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 2 and "docker run IMAGE train" in proc.stderr
    assert "got: serve" in (tmp_path / "output" / "failure").read_text()


def _probe_job(tmp_path: Path, hosts: int, environment: dict[str, str]) -> tuple[local_jobs.JobResult, list[str]]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    # Cheap stand-in for the trainer: each host prints what it finds at /opt/ml or $D2OPS_ML_ROOT.
    probe = ("import json, os; root = os.environ.get('D2OPS_ML_ROOT', '/opt/ml'); "
             "rc = json.load(open(root + '/input/config/resourceconfig.json')); "
             "print('PROBE', root, rc['current_host'], os.path.isdir(os.environ['SM_CHANNEL_TRAIN']))")
    spec = local_jobs.TrainingJobSpec(job_name="probe", channels={"train": data}, work_dir=tmp_path / "w",
                                      output_dir=tmp_path / "o", instance_count=hosts, cpus_per_host=1,
                                      command=(sys.executable, "-c", probe), environment=environment)
    lines: list[str] = []
    result = local_jobs.run_training_job(spec, log=lines.append)
    return result, lines


def test_each_host_sees_its_own_tree_at_opt_ml(tmp_path: Path) -> None:
    mount = local_jobs.ml_mount({})
    if not mount.namespace:
        pytest.skip(f"no private mount namespace here ({mount.reason}); the remap fallback is tested below")
    result, lines = _probe_job(tmp_path, 2, {})
    assert result.status == "Completed", lines
    assert sum("(a private mount namespace per process)" in line for line in lines) == 1
    assert "[algo-1] PROBE /opt/ml algo-1 True" in lines
    assert "[algo-2] PROBE /opt/ml algo-2 True" in lines  # each host its own namespace, side by side


def test_without_a_namespace_the_job_is_told_where_its_tree_is_and_the_log_says_so(tmp_path: Path) -> None:
    result, lines = _probe_job(tmp_path, 1, {local_jobs.ML_MOUNT_VARIABLE: "remap"})
    assert result.status == "Completed", lines
    notices = [line for line in lines if "cannot mount the job's tree at /opt/ml" in line]
    assert len(notices) == 1 and "D2OPS_ML_ROOT" in notices[0]
    assert f"[algo-1] PROBE {tmp_path / 'w' / 'algo-1'} algo-1 True" in lines


def test_unknown_mount_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(local_jobs.LocalJobError, match="D2OPS_ML_MOUNT='bind': expected auto, namespace or remap"):
        _probe_job(tmp_path, 1, {local_jobs.ML_MOUNT_VARIABLE: "bind"})


def test_train_local_with_relative_paths_runs_the_declared_entry_and_reports_the_trainers_reason(
        tmp_path: Path) -> None:
    """`d2ops train-local srv/ds srv/out`, as a user types it, through the training image's entry."""
    dataset = tmp_path / "srv" / "ds"
    dataset.mkdir(parents=True)
    # A dataset version whose train annotations are missing: the trainer fails fast with its reason.
    (dataset / "manifest.json").write_text(json.dumps(
        {"name": "x", "version": "v1", "format": "coco", "train": "annotations/train.json"}))
    proc = subprocess.run([sys.executable, "-m", "d2ops", "train-local", "srv/ds", "srv/out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1, proc.stderr
    # The channel was found (the failure is inside it), and the reason is the trainer's own, read
    # back from the failure file the job wrote at /opt/ml/output/failure.
    assert "is not a directory" not in proc.stderr
    assert "wrote no failure file" not in summary["failure_reason"]
    assert summary["failure_reason"].startswith("algo-1: DatasetError: ")
    assert "input/data/dataset/annotations/train.json: missing" in summary["failure_reason"]
    failure = tmp_path / "srv" / "out" / "hosts" / "algo-1" / "output" / "failure"
    assert failure.read_text().strip() == summary["failure_reason"].removeprefix("algo-1: ")


def test_sigterm_reaches_the_job_through_the_namespace_wrapper(tmp_path: Path) -> None:
    """StopTrainingJob / spot: the runner's SIGTERM must reach the job itself, not a wrapper shell."""
    data = tmp_path / "data"
    data.mkdir()
    script = ("import signal, sys, time\n"
              "def stop(*_):\n    print('got SIGTERM', flush=True)\n    sys.exit(143)\n"
              "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    spec = local_jobs.TrainingJobSpec(job_name="stop", channels={"train": data}, work_dir=tmp_path / "w",
                                      output_dir=tmp_path / "o", cpus_per_host=1,
                                      command=(sys.executable, "-c", script))
    stop = threading.Event()
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if line.endswith("] ready"):
            stop.set()

    result = local_jobs.run_training_job(spec, stop=stop, log=log)
    assert result.status == "Stopped" and result.exit_codes == {"algo-1": 143}, lines
    assert "[algo-1] got SIGTERM" in lines


def test_namespace_host_environment_points_at_opt_ml(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    spec = local_jobs.TrainingJobSpec(job_name="j", channels={"train": data}, work_dir=tmp_path / "w",
                                      output_dir=tmp_path / "o")
    root, env = local_jobs.prepare_training_host(spec, "algo-1", 1, local_jobs.MlMount(True, ""))
    assert "D2OPS_ML_ROOT" not in env  # the job uses the default, /opt/ml, like in SageMaker
    assert env["SM_MODEL_DIR"] == "/opt/ml/model" and env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data"
    assert (root / "input" / "data" / "train").resolve() == data.resolve()
    wrapped = local_jobs.MlMount(True, "").wrap(root, ("/bin/true",))
    assert wrapped[:2] == ("unshare", "--mount") and wrapped[-2:] == (str(root), "/bin/true")


def test_the_images_python_on_path_is_this_interpreter(tmp_path: Path) -> None:
    import shutil

    env = {"PATH": "/usr/bin:/bin"}
    container_entry.python_on_path(env)
    found = shutil.which("python", path=env["PATH"])
    assert found and Path(found).resolve() == Path(sys.executable).resolve()
    # an interpreter whose directory has no `python` of its own gets one: a symlink in a directory of its own
    odd = tmp_path / "bin" / "python3.11-custom"
    odd.parent.mkdir()
    odd.symlink_to(sys.executable)
    env = {"PATH": "/usr/bin:/bin"}
    container_entry.python_on_path(env, python=str(odd))
    found = shutil.which("python", path=env["PATH"])
    assert found and Path(found).resolve() == Path(sys.executable).resolve()
    assert Path(found).parent != odd.parent
