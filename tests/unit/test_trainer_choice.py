"""Which trainer the demo trains (d2ops.local.trainer_choice) and how the offline stack receives it."""

from __future__ import annotations

import shutil
import sys

import pytest

from d2ops.local.trainer_choice import TrainerUnavailable, choose_trainer, detectron2_problem
from d2ops.offline.stack import load_stack
from tests.fixtures.frameworks import require_detectron2


def test_auto_trains_detectron2_where_it_imports_with_its_own_cpu_profile():
    choice = choose_trainer("auto", 128, check=lambda: None)
    assert choice.framework == "detectron2" and "production" in choice.reason
    # No model and no torchvision schedule: the detectron2 trainer picks its CPU profile itself.
    assert "model" not in choice.manifest_training and "base_lr" not in choice.manifest_training
    assert not {"min_size", "warmup_iters", "base_lr"} & set(choice.training_defaults)


def test_auto_falls_back_to_torchvision_and_says_why():
    choice = choose_trainer("auto", 96, check=lambda: "ModuleNotFoundError: No module named 'detectron2'")
    assert choice.framework == "torchvision"
    assert "No module named 'detectron2'" in choice.reason and "make setup" in choice.reason
    assert choice.manifest_training["model"] == "fasterrcnn_resnet18_fpn"
    assert choice.training_defaults["min_size"] == "96"


def test_explicit_choices():
    assert choose_trainer("torchvision", 128, check=lambda: None).framework == "torchvision"
    with pytest.raises(TrainerUnavailable, match=r"--framework detectron2: .*No module named 'detectron2'"):
        choose_trainer("detectron2", 128, check=lambda: "ModuleNotFoundError: No module named 'detectron2'")
    with pytest.raises(ValueError, match="unknown framework 'mmdet'"):
        choose_trainer("mmdet", 128, check=lambda: None)


def test_the_import_check_reports_the_real_error():
    # An interpreter without detectron2 (the system Python next to the virtualenv's).
    system_python = shutil.which("python3.11", path="/usr/bin:/usr/local/bin")
    if system_python is None or system_python == sys.executable:
        pytest.skip("no second Python 3.11 interpreter on this machine")
    problem = detectron2_problem(system_python)
    assert problem is not None and "detectron2" in problem


def test_detectron2_imports_in_this_environment_when_installed():
    require_detectron2()
    assert detectron2_problem() is None


def test_the_offline_stack_takes_the_framework():
    assert load_stack().functions["PrepareTrainingFunction"].environment["FRAMEWORK"] == "torchvision"
    stack = load_stack(function_env={"PrepareTrainingFunction": {"FRAMEWORK": "detectron2"}})
    assert stack.functions["PrepareTrainingFunction"].environment["FRAMEWORK"] == "detectron2"
