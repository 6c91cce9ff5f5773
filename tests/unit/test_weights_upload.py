"""`d2ops weights upload`: only a detectron2 checkpoint whose format the stack's key can carry goes up,
to the data bucket and key the deployed stack names (moto's CloudFormation and S3)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import torch
import yaml
from moto import mock_aws

from d2ops import cli
from d2ops.weights import PROGRESS_FROM_BYTES, CheckpointError, Progress, inspect_checkpoint
from d2ops_core import pretrained

KEY = pretrained.DEFAULT_KEY
ZOO_URL = "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_50_FPN_3x/137849458/model_final_280758.pkl"


def zoo_pkl(path: Path, state: dict[str, Any] | None = None) -> Path:
    state = {"backbone.stem.conv1.weight": np.zeros((4, 3, 1, 1), np.float32)} if state is None else state
    path.write_bytes(pickle.dumps({"model": state, "__author__": "tests"}))
    return path


class _Runs:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_model_zoo_pickle_and_a_torch_checkpoint_are_accepted_under_their_own_suffix(tmp_path: Path) -> None:
    found = inspect_checkpoint(zoo_pkl(tmp_path / "a.pkl"), KEY)
    assert (found.format, found.tensors) == ("pickle", 1) and len(found.sha256) == 64
    pth = tmp_path / "b.pth"
    torch.save({"model": {"w": torch.zeros(2), "b": torch.zeros(1)}, "iteration": 9}, pth)
    assert inspect_checkpoint(pth, "pretrained/mine.pth").tensors == 2
    # detectron2 picks the loader by name: a torch file under a .pkl key would be unpickled and fail in the job
    with pytest.raises(CheckpointError, match=r"is a torch \(\.pth\) checkpoint but PretrainedWeightsKey .* \.pkl"):
        inspect_checkpoint(pth, KEY)
    with pytest.raises(CheckpointError, match=r"ends without a suffix"):
        inspect_checkpoint(tmp_path / "a.pkl", "pretrained/weights")


def test_a_pickle_that_would_run_code_is_refused_unexecuted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"model": {"w": _Runs()}}))
    with pytest.raises(CheckpointError, match=r"pickles posix\.system|pickles os\.system"):
        inspect_checkpoint(evil, KEY)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(("content", "message"), [
    (b"not a checkpoint at all", "neither a pickle"),
    (pickle.dumps({"model": {}}), "holds no tensors"),
    (pickle.dumps(["a", "list"]), "no state dict"),
    (pickle.dumps({"model": {"w": np.zeros(2)}})[:20], "not a readable pickle checkpoint"),
])
def test_what_is_not_a_checkpoint_gets_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(content)
    with pytest.raises(CheckpointError, match=message) as raised:
        inspect_checkpoint(bad, KEY)
    assert "\n" not in str(raised.value) and str(bad) in str(raised.value)


def test_progress_is_printed_in_tenths_for_a_large_file_only() -> None:
    lines: list[str] = []
    progress = Progress(10 * PROGRESS_FROM_BYTES, lines.append)
    for _ in range(40):
        progress(PROGRESS_FROM_BYTES // 4)
    assert [line.split("%")[0].strip() for line in lines] == [str(p) for p in range(10, 101, 10)]
    small: list[str] = []
    Progress(1000, small.append)(1000)
    assert small == []


def test_help_prints_the_model_zoo_link_of_the_default_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["weights", "upload", "--help"])
    out = capsys.readouterr().out
    assert ZOO_URL in out and KEY in out
    assert pretrained.MODEL_ZOO_CHECKPOINTS[pretrained.DEFAULT_CONFIGS["detection"]] == ZOO_URL


STACK_TEMPLATE = {
    "Parameters": {"PretrainedWeightsKey": {"Type": "String", "Default": KEY}},
    "Resources": {"DataBucket": {"Type": "AWS::S3::Bucket"}},
    "Outputs": {"DataBucketName": {"Value": {"Ref": "DataBucket"}}},
}


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        cfn = boto3.client("cloudformation")
        cfn.create_stack(StackName="d2ops-dev", TemplateBody=yaml.safe_dump(STACK_TEMPLATE))
        outputs = cfn.describe_stacks(StackName="d2ops-dev")["Stacks"][0]["Outputs"]
        yield boto3.client("s3"), outputs[0]["OutputValue"]


def test_upload_puts_the_file_at_the_stacks_key(stack: tuple[Any, str], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    s3, bucket = stack
    weights = zoo_pkl(tmp_path / "model_final_280758.pkl")
    assert cli.main(["weights", "upload", str(weights), "--stack", "d2ops-dev"]) == 0
    stored = s3.get_object(Bucket=bucket, Key=KEY)
    assert stored["Body"].read() == weights.read_bytes()
    found = inspect_checkpoint(weights, KEY)
    assert stored["Metadata"]["sha256"] == found.sha256
    assert f"uploaded s3://{bucket}/{KEY} (sha256 {found.sha256})" in capsys.readouterr().out


def test_a_refused_file_uploads_nothing_and_exits_2(stack: tuple[Any, str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    s3, bucket = stack
    bad = tmp_path / "model.pkl"
    bad.write_bytes(b"<html>not found</html>")  # a download that went wrong
    with pytest.raises(SystemExit) as raised:
        cli.main(["weights", "upload", str(bad), "--stack", "d2ops-dev"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a pickle" in err and "Traceback" not in err
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_an_unknown_stack_is_one_line(stack: tuple[Any, str], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["weights", "upload", str(zoo_pkl(tmp_path / "w.pkl")), "--stack", "nope"])
    assert raised.value.code == 2
    assert "--stack nope" in capsys.readouterr().err



def test_a_stack_that_trains_from_scratch_takes_no_weights(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        boto3.client("cloudformation").create_stack(
            StackName="scratch", TemplateBody=yaml.safe_dump(STACK_TEMPLATE),
            Parameters=[{"ParameterKey": "PretrainedWeightsKey", "ParameterValue": pretrained.SCRATCH}])
        with pytest.raises(SystemExit) as raised:
            cli.main(["weights", "upload", str(zoo_pkl(tmp_path / "w.pkl")), "--stack", "scratch"])
    assert raised.value.code == 2
    assert f"PretrainedWeightsKey={pretrained.DEFAULT_KEY}" in capsys.readouterr().err
