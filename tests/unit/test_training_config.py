"""Hyperparameters, the SageMaker environment, the world layout and the batch/LR rule."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from model_code.training.config import ConfigError, load_environment, parse_hyperparameters
from model_code.training.distributed import (
    communication_environment,
    learning_rate_factor,
    plan_world,
    scaled_schedule,
)


def test_hyperparameters_arrive_as_strings_and_are_typed() -> None:
    hp = parse_hyperparameters({"max_iter": "150", "base_lr": "0.02", "horizontal_flip": "false",
                                "lr_steps": "0.6, 0.9", "model": '"fasterrcnn_resnet18_fpn"',
                                "sagemaker_program": "ignored.py"})
    assert hp.max_iter == 150 and hp.base_lr == 0.02 and hp.horizontal_flip is False
    assert hp.lr_steps == (0.6, 0.9)
    assert hp.model == "fasterrcnn_resnet18_fpn"  # the SageMaker SDK's JSON-quoted form is accepted


@pytest.mark.parametrize(("raw", "expected"), [
    ({"max_iter": "ten"}, "hyperparameter max_iter='ten'"),
    ({"max_iter": "0"}, "greater than or equal to 1"),
    ({"base_lr": "-1"}, "hyperparameter base_lr='-1'"),
    ({"max_iters": "10"}, "unknown hyperparameter 'max_iters'"),
    ({"framework": "keras"}, "hyperparameter framework='keras'"),
    ({"lr_steps": "0.9,0.5"}, "increasing fractions"),
    ({"lr_steps": "a,b"}, "comma-separated fractions"),
    ({"min_size": "900", "max_size": "800"}, "min_size 900 is larger than max_size 800"),
])
def test_bad_hyperparameters_name_the_problem(raw: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_hyperparameters(raw)


def write_tree(root, hosts=("algo-1", "algo-2"), current="algo-2", channels=("train", "val"), hps=None):
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": current, "hosts": list(hosts),
                                                            "network_interface_name": "eth0"}))
    (config / "inputdataconfig.json").write_text(json.dumps({c: {} for c in channels}))
    (config / "hyperparameters.json").write_text(json.dumps(hps or {"max_iter": "10"}))
    for c in channels:
        (root / "input" / "data" / c).mkdir(parents=True)
    return {"D2OPS_ML_ROOT": str(root)}


def test_environment_from_config_files_alone(tmp_path) -> None:
    env = load_environment(write_tree(tmp_path), gpu_count=0)
    assert env.hosts == ["algo-1", "algo-2"] and env.current_host == "algo-2"
    assert env.network_interface == "eth0"
    assert env.channel("train") == tmp_path / "input" / "data" / "train"
    assert env.model_dir == tmp_path / "model" and env.checkpoint_dir == tmp_path / "checkpoints"
    assert env.hyperparameters == {"max_iter": "10"}


def test_sm_variables_take_precedence(tmp_path) -> None:
    environ = write_tree(tmp_path) | {"SM_HOSTS": '["b", "a"]', "SM_CURRENT_HOST": "a",
                                      "SM_MODEL_DIR": str(tmp_path / "m"), "SM_HPS": '{"seed": "3"}',
                                      "SM_CHANNEL_TRAIN": str(tmp_path / "elsewhere")}
    env = load_environment(environ, gpu_count=0)
    assert env.hosts == ["b", "a"] and env.current_host == "a"
    assert env.model_dir == tmp_path / "m" and env.hyperparameters == {"seed": "3"}
    assert env.channels["train"] == tmp_path / "elsewhere"


def test_missing_channel_is_named(tmp_path) -> None:
    env = load_environment(write_tree(tmp_path, channels=("train",)), gpu_count=0)
    with pytest.raises(ConfigError, match=r"input channel 'val' is missing.*channels \['train'\]"):
        env.channel("val")


def test_current_host_must_be_listed(tmp_path) -> None:
    with pytest.raises(ConfigError, match="current host 'algo-9' is not in the host list"):
        load_environment(write_tree(tmp_path, current="algo-9"), gpu_count=0)


def test_rank_and_master_come_from_the_sorted_host_list(tmp_path) -> None:
    # Listed out of order: machine rank and master must both use the sorted order.
    environ = write_tree(tmp_path, hosts=("algo-2", "algo-1", "algo-3"), current="algo-1")
    env = load_environment(environ, gpu_count=0)
    hp = parse_hyperparameters({"cpu_processes_per_host": "2", "dist_port": "31000", "dist_timeout_minutes": "5"})
    plan = plan_world(env, hp, {})
    assert plan.hosts == ("algo-1", "algo-2", "algo-3") and plan.machine_rank == 0 and plan.is_master_host
    assert plan.master_addr == "algo-1" and plan.dist_url == "tcp://algo-1:31000"
    assert plan.world_size == 6 and plan.backend == "gloo" and plan.timeout == timedelta(minutes=5)
    assert [plan.global_rank(i) for i in range(2)] == [0, 1]
    env3 = load_environment(write_tree(tmp_path / "b", hosts=("algo-2", "algo-1", "algo-3"), current="algo-3"),
                            gpu_count=0)
    assert [plan_world(env3, hp, {}).global_rank(i) for i in range(2)] == [4, 5]


def test_gpus_set_processes_nccl_and_interface(tmp_path) -> None:
    env = load_environment(write_tree(tmp_path), gpu_count=8)
    plan = plan_world(env, parse_hyperparameters({"cpu_processes_per_host": "3"}), {})
    assert plan.processes_per_host == 8 and plan.world_size == 16 and plan.backend == "nccl"
    comm = communication_environment(plan, {"NCCL_DEBUG": "INFO"})
    assert comm["NCCL_SOCKET_IFNAME"] == "eth0" and comm["GLOO_SOCKET_IFNAME"] == "eth0"
    assert comm["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "NCCL_DEBUG" not in comm  # the user's own setting wins
    assert comm["MASTER_ADDR"] == "algo-1" and comm["MASTER_PORT"] == "29500"


def test_master_variables_override_for_launchers_without_dns(tmp_path) -> None:
    env = load_environment(write_tree(tmp_path), gpu_count=0)
    plan = plan_world(env, parse_hyperparameters({}), {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "40001"})
    assert plan.dist_url == "tcp://127.0.0.1:40001"
    with pytest.raises(ConfigError, match="MASTER_PORT='x'"):
        plan_world(env, parse_hyperparameters({}), {"MASTER_PORT": "x"})


def test_fixed_global_batch_splits_over_workers() -> None:
    hp = parse_hyperparameters({"ims_per_batch": "16", "base_lr": "0.02", "max_iter": "1000",
                                "warmup_iters": "100", "checkpoint_period": "200"})
    s = scaled_schedule(hp, 4)
    assert (s.global_batch, s.per_worker_batch, s.base_lr, s.max_iter, s.steps) == (16, 4, 0.02, 1000, (800,))
    with pytest.raises(ConfigError, match="does not split evenly over 3 workers"):
        scaled_schedule(hp, 3)


def test_reference_world_size_scales_batch_lr_and_schedule_linearly() -> None:
    hp = parse_hyperparameters({"ims_per_batch": "16", "base_lr": "0.02", "max_iter": "1000",
                                "warmup_iters": "100", "checkpoint_period": "200", "eval_period": "500",
                                "reference_world_size": "8", "lr_steps": "0.5,0.75"})
    s = scaled_schedule(hp, 16)  # twice the reference: twice the batch and LR, half the iterations
    assert (s.global_batch, s.per_worker_batch, s.max_iter) == (32, 2, 500)
    assert s.base_lr == pytest.approx(0.04)
    assert (s.warmup_iters, s.checkpoint_period, s.eval_period, s.steps) == (50, 100, 250, (250, 375))
    assert s.global_batch * s.max_iter == 16 * 1000  # the same number of images either way
    with pytest.raises(ConfigError, match="divisible by reference_world_size=3"):
        scaled_schedule(parse_hyperparameters({"ims_per_batch": "16", "reference_world_size": "3"}), 6)


def test_learning_rate_warms_up_then_steps() -> None:
    s = scaled_schedule(parse_hyperparameters({"max_iter": "100", "warmup_iters": "10", "lr_steps": "0.8"}), 1)
    assert learning_rate_factor(0, s) == pytest.approx(0.001)
    assert learning_rate_factor(5, s) == pytest.approx(0.5005)
    assert learning_rate_factor(10, s) == 1.0 and learning_rate_factor(79, s) == 1.0
    assert learning_rate_factor(80, s) == pytest.approx(0.1)
