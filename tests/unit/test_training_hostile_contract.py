"""Hostile /opt/ml trees at the training image's entry: each ends as exit 1 with a one-line reason.

The entry (``model_code.training.train.main``) runs in-process against a tree under
``D2OPS_ML_ROOT``; every case fails before any model is built, so each costs milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from model_code.training import train


def _tree(root: Path, *, hyperparameters: Any = None, resource: Any = None, data: Any = None) -> Path:
    config = root / "input" / "config"
    config.mkdir(parents=True)
    for name, document in (("hyperparameters.json", hyperparameters), ("resourceconfig.json", resource),
                           ("inputdataconfig.json", data)):
        if document is not None:
            (config / name).write_text(document if isinstance(document, str) else json.dumps(document))
    (root / "input" / "data" / "dataset").mkdir(parents=True)
    return root


def _run(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    for name in ("SM_HPS", "SM_HOSTS", "SM_CURRENT_HOST", "SM_OUTPUT_DIR", "SM_INPUT_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("D2OPS_ML_ROOT", str(root))
    code = train.main()
    failure = root / "output" / "failure"
    return code, failure.read_text() if failure.exists() else ""


FILE_MODE = {"train": {"TrainingInputMode": "File"}, "val": {"TrainingInputMode": "File"}}
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "inputdataconfig is a list": ({"data": [1]}, "inputdataconfig.json: expected a JSON object, got list"),
    "resourceconfig is a list": ({"resource": []}, "resourceconfig.json: expected a JSON object, got list"),
    "resourceconfig hosts not a list": ({"resource": {"hosts": 5}}, "training environment: hosts: Input should be"),
    "Pipe mode": ({"data": {**FILE_MODE, "val": {"TrainingInputMode": "Pipe"}}},
                  "channel 'val' has TrainingInputMode 'Pipe'; this trainer reads files: use File or FastFile"),
    "channel config not an object": ({"data": {"train": None}}, "channel 'train' has TrainingInputMode None"),
    "typo of a known hyperparameter": ({"hyperparameters": {"max_iters": "5"}},
                                       "unknown hyperparameter 'max_iters'; did you mean 'max_iter'?"),
    "current host not listed": ({"resource": {"current_host": "algo-9", "hosts": ["algo-1"]}},
                                "current host 'algo-9' is not in the host list"),
    "duplicate hosts": ({"resource": {"current_host": "algo-1", "hosts": ["algo-1", "algo-1"]}},
                        "host list has duplicates"),
    "hyperparameters not JSON": ({"hyperparameters": "{max_iter: 5"}, "hyperparameters.json: unreadable JSON"),
    "NaN learning rate": ({"hyperparameters": {"base_lr": "nan"}}, "hyperparameter base_lr='nan'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_config_fails_with_one_line_naming_it(case: str, tmp_path: Path, monkeypatch) -> None:
    documents, expected = CASES[case]
    code, failure = _run(_tree(tmp_path, **documents), monkeypatch)
    assert code == train.EXIT_FAILED
    assert failure.startswith("ConfigError: ") and failure.count("\n") == 1, failure
    assert expected in failure
    assert not (tmp_path / "model").exists() or not any((tmp_path / "model").iterdir())


def test_a_megabyte_value_keeps_the_reason_within_failure_reasons_limit(tmp_path: Path, monkeypatch) -> None:
    # Before: the echoed input filled all 1000 characters and the reason itself was cut off.
    code, failure = _run(_tree(tmp_path, hyperparameters={"max_iter": "9" * 100_000}), monkeypatch)
    assert code == train.EXIT_FAILED
    assert len(failure) < 300 and "(100000 chars)" in failure
    assert failure.rstrip().endswith("exceeded maximum size"), failure


def test_a_pointer_of_binary_junk_is_a_checkpoint_error_not_a_decode_traceback(tmp_path: Path) -> None:
    from model_code.training.checkpoints import POINTER, CheckpointError, latest_checkpoint

    (tmp_path / POINTER).write_bytes(b"\xff\xfe\x00model" * 100_000)
    with pytest.raises(CheckpointError, match="not a checkpoint file; delete"):
        latest_checkpoint(tmp_path)


@pytest.mark.parametrize("iteration, rng", [("12", None), (-1, None), (True, None), (5, "seeded"), (5, {"torch": 1})])
def test_a_foreign_checkpoint_with_the_right_keys_is_refused_on_load(tmp_path: Path, iteration: Any, rng: Any) -> None:
    import torch

    from model_code.training.checkpoints import CheckpointError, load_checkpoint, rng_state

    path = tmp_path / "model_0000005.pth"
    torch.save({"model": {}, "optimizer": {}, "scheduler": {}, "iteration": iteration,
                "rng": rng_state() if rng is None else rng}, path)
    with pytest.raises(CheckpointError, match=r"not a d2ops checkpoint \(iteration"):
        load_checkpoint(path)


def _coco(file_name: str) -> dict[str, Any]:
    return {"images": [{"id": 1, "file_name": file_name, "width": 8, "height": 8}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4]}],
            "categories": [{"id": 3, "name": "thing"}]}


@pytest.mark.parametrize("file_name", ["../outside.jpg", "/etc/hostname", "a/../../b.jpg", ""])
def test_a_file_name_reaching_outside_the_channel_is_refused(tmp_path: Path, file_name: str) -> None:
    from model_code.dataset_version import DatasetError, categories_of
    from model_code.training.coco_dataset import CocoDetectionSet

    coco = _coco(file_name)
    with pytest.raises(DatasetError, match=r"train\.json: image 1 file_name"):
        CocoDetectionSet(coco, tmp_path, categories_of(coco), with_masks=False, horizontal_flip=False, seed=0,
                         source="train.json")


def test_a_symlink_pointing_outside_the_channel_is_not_read(tmp_path: Path) -> None:
    from PIL import Image

    from model_code.dataset_version import DatasetError, categories_of
    from model_code.training.coco_dataset import CocoDetectionSet

    secret = tmp_path / "elsewhere" / "secret.png"
    secret.parent.mkdir()
    Image.new("RGB", (8, 8)).save(secret)
    images = tmp_path / "channel" / "images"
    images.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(images / "inside.png")
    (images / "a.png").symlink_to(secret)
    coco = _coco("a.png")
    dataset = CocoDetectionSet(coco, images, categories_of(coco), with_masks=False, horizontal_flip=False, seed=0,
                               source="train.json")
    with pytest.raises(DatasetError, match="outside the channel's images directory"):
        dataset[0, 0]
    dataset.images[0] = {**dataset.images[0], "file_name": "inside.png"}
    assert dataset[0, 0][0].shape == (3, 8, 8)  # a file inside the channel still reads


def test_an_unwritable_model_directory_fails_before_training(tmp_path: Path, monkeypatch) -> None:
    # A file where /opt/ml/model should be (chmod does not stop root, which containers often run as).
    # Before: the run trained to the end and then died in save_artifact with a FileExistsError.
    root = _tree(tmp_path, data=FILE_MODE)
    (root / "model").write_text("not a directory")
    code, failure = _run(root, monkeypatch)
    assert code == train.EXIT_FAILED
    assert failure.startswith(f"ConfigError: model directory {root / 'model'} is not writable"), failure
    assert (root / "model").read_text() == "not a directory"


def test_sigterm_during_start_up_ends_the_job_at_once_with_nothing_written(tmp_path: Path) -> None:
    # StopTrainingJob or a spot reclaim can come while Python is still importing torch: the image's declared
    # entry must die by the signal right away (no handler yet, so nothing to hang on) and leave no model.
    import os
    import signal
    import subprocess
    import time

    from d2ops.local.container_entry import image_command, python_on_path

    root = _tree(tmp_path, hyperparameters={}, data=FILE_MODE)
    env = {**os.environ, "D2OPS_ML_ROOT": str(root)}
    python_on_path(env)
    proc = subprocess.Popen(image_command("training"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert code in (-signal.SIGTERM, train.EXIT_STOPPED)
    assert not (root / "model").exists() or not any((root / "model").iterdir())


def test_detectron2_planning_refuses_an_image_symlinked_outside_the_channel(tmp_path: Path) -> None:
    # detectron2's own loader opens file_name wherever it points, so the check runs when the job is planned.
    from d2ops import synth
    from model_code.dataset_version import DatasetError
    from model_code.training import detectron2_trainer as d2
    from model_code.training.config import load_environment, parse_hyperparameters

    channel = tmp_path / "ds"
    synth.generate(channel, images=4, size=32)
    first = json.loads((channel / "annotations" / "train.json").read_text())["images"][0]["file_name"]
    outside = tmp_path / "outside.png"
    (channel / "images" / first).rename(outside)
    (channel / "images" / first).symlink_to(outside)
    root = _tree(tmp_path / "ml", hyperparameters={"framework": "detectron2"})
    environ = {"D2OPS_ML_ROOT": str(root), "SM_CHANNEL_DATASET": str(channel)}
    env = load_environment(environ, gpu_count=0)
    with pytest.raises(DatasetError, match="outside the channel's images directory"):
        d2.plan_job(env, parse_hyperparameters(env.hyperparameters), environ)


def test_a_failure_after_export_leaves_no_half_artifact_in_the_model_directory(tmp_path: Path, monkeypatch) -> None:
    # E.g. the evaluation of the exported model fails: model.pt and a metrics-less metadata.json are on disk.
    from model_code.training.torchvision_trainer import TrainingError

    def export_then_fail(env: Any, hp: Any) -> None:
        (env.model_dir / "model.pt").write_bytes(b"PK")
        (env.model_dir / "metadata.json").write_text("{}")
        (env.model_dir / "model.pt.tmp").write_bytes(b"")
        raise TrainingError("evaluation failed")

    monkeypatch.setattr(train, "run", export_then_fail)
    root = _tree(tmp_path, data=FILE_MODE)
    code, failure = _run(root, monkeypatch)
    assert code == train.EXIT_FAILED and failure.startswith("TrainingError: evaluation failed")
    assert list((root / "model").iterdir()) == []


@pytest.mark.parametrize("name, raw", [("SM_NUM_GPUS", "two"), ("SM_NUM_CPUS", "1.5"), ("SM_NUM_GPUS", "-1")])
def test_a_count_variable_that_is_not_a_count_is_named(name: str, raw: str) -> None:
    from model_code.training.config import ConfigError, load_environment

    with pytest.raises(ConfigError, match=f"{name}={raw!r}"):
        load_environment({"D2OPS_ML_ROOT": "/nonexistent", name: raw})


@pytest.mark.parametrize("name", ["warmup_iters", "eval_period", "checkpoint_period", "log_period",
                                  "rpn_pre_nms_train", "rpn_post_nms_test"])
def test_an_astronomical_integer_is_refused_at_parse_not_as_an_overflow_later(name: str) -> None:
    # Before: 10**400 parsed, then the schedule's division (hp.warmup_iters / scale) raised OverflowError.
    from model_code.training.config import ConfigError, parse_hyperparameters
    from model_code.training.distributed import scaled_schedule

    with pytest.raises(ConfigError, match=f"hyperparameter {name}="):
        scaled_schedule(parse_hyperparameters({name: "1" + "0" * 400}), 1)
