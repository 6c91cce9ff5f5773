"""The operator's pixel limit (stack parameter MaxImagePixels -> env MAX_IMAGE_PIXELS): read by the one image
rule at call time, applied by the local validator and the validation Lambdas alike, and carried by the stack to
every part that applies the rule (the functions, the training and evaluation jobs, the serving model)."""

from __future__ import annotations

import importlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws
from PIL import Image

from d2ops import synth
from d2ops.asl import substitute
from d2ops.offline.stack import load_stack
from d2ops_core import images as rule
from d2ops_core.pipeline_stages import all_states
from d2ops_core.validation import Code, validate_local
from d2ops_core.validation.inventory import ImageBatchResult, ImageItem
from tests.fixtures.pipeline import support

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "datasets/shapes/v1/"  # what the synthetic manifest names
DRONE = (8192, 5460)  # a 45-megapixel aerial camera's frame (44.7 MP)
DRONE_IMAGE = "train/000001.jpg"


def test_the_limit_is_read_from_the_environment_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rule.MAX_PIXELS_ENV, raising=False)
    assert rule.max_pixels() == rule.MAX_PIXELS == 36_000_000
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "50000000")
    assert rule.max_pixels() == 50_000_000
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, " ")  # empty: the default, as an unset variable
    assert rule.max_pixels() == rule.MAX_PIXELS


@pytest.mark.parametrize(("value", "message"), [
    ("36MP", r"MAX_IMAGE_PIXELS='36MP' is not a whole number of pixels"),
    ("3.6e7", "not a whole number"),
    ("999999", r"MAX_IMAGE_PIXELS=999999 is outside 1,000,000\.\.150,000,000"),
    ("150000001", "outside"),
])
def test_a_bad_limit_is_a_one_line_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str,
                                                             message: str) -> None:
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, value)
    with pytest.raises(rule.PixelLimitError, match=message):
        rule.max_pixels()
    # never silently another limit: the rule itself refuses to judge an image
    with pytest.raises(rule.PixelLimitError):
        rule.open_image(_jpeg((16, 16)))


def test_the_header_check_applies_the_limit_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _jpeg((2000, 1000))  # 2 MP
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "1999999")
    with pytest.raises(rule.ImageRejected) as caught:
        rule.open_image(data, "images/a.jpg")
    assert caught.value.reason == "too_large"
    assert str(caught.value) == ("images/a.jpg is 2000x1000 (2,000,000 pixels); the limit is 1,999,999 pixels "
                                 "(MAX_IMAGE_PIXELS)")
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "2000000")
    with rule.open_image(data) as image:
        assert image.size == (2000, 1000)


def _jpeg(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size, 128).save(buffer, "JPEG", quality=50)  # flat grey: a 45 MP file of a few hundred KB
    return buffer.getvalue()


@pytest.fixture(scope="module")
def drone_jpeg() -> bytes:
    return _jpeg(DRONE)


@pytest.fixture
def drone_dataset(tmp_path: Path, drone_jpeg: bytes) -> Path:
    """A small version whose train image 000001.jpg is a 45 MP aerial frame (declared so in train.json)."""
    root = tmp_path / "ds"
    synth.generate(root, images=8, seed=2, size=48)
    (root / "images" / DRONE_IMAGE).write_bytes(drone_jpeg)
    train_path = root / "annotations/train.json"
    train = json.loads(train_path.read_text())
    [entry] = [im for im in train["images"] if im["file_name"] == DRONE_IMAGE]
    entry["width"], entry["height"] = DRONE
    train_path.write_text(json.dumps(train))
    return root


def _too_large(issues: list[Any]) -> list[tuple[str | None, str]]:
    return [(i.path, i.message) for i in issues if i.code == Code.IMAGE_TOO_LARGE]


def test_a_45_mp_version_validates_at_50_mp_and_is_refused_at_36_mp_locally(drone_dataset: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "36000000")
    refused = validate_local(drone_dataset)
    assert not refused.valid
    found = _too_large(refused.errors)
    # the annotations' declared size (from coco.py's header check) names the limit in force
    assert any("8192x5460 (44,728,320 pixels); the limit is 36,000,000 pixels (MAX_IMAGE_PIXELS)" in message
               for _, message in found), found

    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "50000000")
    accepted = validate_local(drone_dataset)
    assert accepted.valid, accepted.errors
    assert not _too_large(accepted.errors) and accepted.images.decoded == 8


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    for key, value in {"ARTIFACTS_BUCKET": "artifacts", "MIN_MAP": "0.3", "MAX_REGRESSION": "0.01"}.items():
        monkeypatch.setenv(key, value)
    with support.image_check_buckets(monkeypatch) as client:
        yield client


def _upload(s3: Any, root: Path) -> None:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json")
    for path in [*files, root / "manifest.json"]:
        s3.put_object(Bucket="data", Key=PREFIX + path.relative_to(root).as_posix(), Body=path.read_bytes())


def _context(name: str) -> Any:
    return SimpleNamespace(function_name=name, memory_limit_in_mb=4096, aws_request_id="req-1",
                           invoked_function_arn=f"arn:aws:lambda:us-east-1:123456789012:function:{name}")


def _validate(run_id: str) -> dict[str, Any]:
    """The validate Lambda's handler, as the state machine invokes it."""
    handler = importlib.import_module("validate_dataset.handler")
    return dict(handler.handler({"bucket": "data", "prefix": PREFIX, "run_id": run_id}, _context("validate")))


def _check_drone_image(s3: Any, run_id: str) -> ImageBatchResult:
    """The check_images Lambda's handler on the batch holding the 45 MP image (the Distributed Map's path)."""
    body = s3.get_object(Bucket="artifacts", Key=f"runs/{run_id}/validation/image-items.jsonl")["Body"].read()
    items = [ImageItem.model_validate_json(line) for line in body.splitlines() if line.strip()]
    drone = [item for item in items if item.key.endswith(DRONE_IMAGE)]
    assert len(drone) == 1, [item.key for item in items]
    handler = importlib.import_module("check_images.handler")
    batch = {"BatchInput": {"bucket": "data", "prefix": PREFIX, "run_id": run_id},
             "Items": [item.model_dump(mode="json") for item in drone]}
    return ImageBatchResult.model_validate(handler.handler(batch, _context("check_images")))


def test_the_lambdas_apply_the_stacks_limit(s3: Any, drone_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _upload(s3, drone_dataset)
    # inline (every image checked by the validate Lambda itself)
    monkeypatch.setenv("INLINE_IMAGE_LIMIT", "100")
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "36000000")
    refused = _validate("run-36")
    assert not refused["valid"] and refused["error_codes"].get(str(Code.IMAGE_TOO_LARGE), 0) >= 1, refused
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "50000000")
    accepted = _validate("run-50")
    assert accepted["valid"] and not accepted["images_pending"], accepted

    # through the Map: the annotations are judged with the limit at 50 MP, the image by the batch Lambda
    monkeypatch.setenv("INLINE_IMAGE_LIMIT", "0")
    pending = _validate("run-map")
    assert pending["images_pending"] and pending["valid"], pending
    ok = _check_drone_image(s3, "run-map")
    assert not ok.issues and [(r.passed, r.decoded, r.copied) for r in ok.images] == [(True, True, True)], ok
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "36000000")
    too_large = _check_drone_image(s3, "run-map")
    assert [(str(i.code), "the limit is 36,000,000 pixels" in i.message) for i in too_large.issues] == [
        (str(Code.IMAGE_TOO_LARGE), True)], too_large
    assert [r.passed for r in too_large.images] == [False]


def test_a_bad_limit_stops_validation_before_any_file_is_judged(s3: Any, drone_dataset: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from d2ops.cli import main

    _upload(s3, drone_dataset)
    monkeypatch.setenv("INLINE_IMAGE_LIMIT", "0")
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "50000000")
    pending = _validate("run-ok")  # its images are left for the Map's batches
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "45 MP")
    # never a report of CHECK_FAILED or refused images: the part stops, naming the variable
    with pytest.raises(rule.PixelLimitError, match="MAX_IMAGE_PIXELS='45 MP'"):
        validate_local(drone_dataset)
    with pytest.raises(rule.PixelLimitError, match="MAX_IMAGE_PIXELS"):
        _validate("run-bad")
    assert pending["images_pending"]
    with pytest.raises(rule.PixelLimitError, match="MAX_IMAGE_PIXELS"):
        _check_drone_image(s3, "run-ok")
    assert main(["validate", str(drone_dataset), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("d2ops validate: MAX_IMAGE_PIXELS='45 MP' is not a whole number of pixels (the stack parameter "
                   "MaxImagePixels, e.g. 36000000)")


def test_the_template_parameter_and_the_rule_agree_on_default_and_range() -> None:
    from d2ops.template import load_template

    spec = load_template().parameters()["MaxImagePixels"]
    assert spec.type == "Number" and spec.default == str(rule.MAX_PIXELS)
    assert (spec.min_value, spec.max_value) == (rule.MIN_PIXELS_LIMIT, rule.MAX_PIXELS_LIMIT)


def test_the_offline_stack_refuses_a_limit_cloudformation_would_refuse() -> None:
    from d2ops.offline.stack import StackError

    with pytest.raises(StackError, match=r"MaxImagePixels=999999 is outside its range 1,000,000\.\.150,000,000"):
        load_stack(parameters={"MaxImagePixels": "999999"})
    with pytest.raises(StackError, match="MaxImagePixels='45MP' is not a number"):
        load_stack(parameters={"MaxImagePixels": "45MP"})


def test_the_stack_parameter_reaches_every_part_that_applies_the_rule() -> None:
    stack = load_stack(parameters={"MaxImagePixels": "50000000"})
    assert load_stack().parameters["MaxImagePixels"] == "36000000"  # the default: today's limit
    # every function (validate, check images, summarize, the smoke test...) gets it: Globals
    assert {name: fn.environment.get(rule.MAX_PIXELS_ENV) for name, fn in stack.functions.items()} == {
        name: "50000000" for name in stack.functions}

    # the jobs: the prepare function's real plan, from the environment the stack gives it
    plan = _stack_plan(stack)
    assert plan.training_job["Environment"] == {"MAX_IMAGE_PIXELS": "50000000"}
    assert plan.evaluation_job["Environment"]["MAX_IMAGE_PIXELS"] == "50000000"  # beside the gate's GATE_*

    # the serving model: Create model's container environment in the definition the stack deploys
    create = _create_model_state(stack)
    assert create["Resource"].endswith(":states:::sagemaker:createModel")
    assert create["Parameters"]["PrimaryContainer"]["Environment"]["MAX_IMAGE_PIXELS"] == "50000000"


def _stack_plan(stack: Any) -> Any:
    """The prepare function's real plan, from the environment the stack gives it, for the sample event."""
    support.function_path("prepare_training")
    models = importlib.import_module("prepare_training.models")
    service = importlib.import_module("prepare_training.service")
    settings = models.PrepareSettings.from_env(stack.functions["PrepareTrainingFunction"].environment)
    return service.build_plan(settings, _prepare_event(models, stack), None)


def _prepare_event(models: Any, stack: Any) -> Any:
    """The sample prepare event, its run's artifacts (the snapshot it names) in this stack's bucket."""
    text = json.dumps(support.load_event("prepare_training", "defaults"))
    return models.PrepareEvent.model_validate_json(text.replace(support.ARTIFACTS_BUCKET, stack.artifacts_bucket))


def _create_model_state(stack: Any) -> dict[str, Any]:
    """The definition's "Create model" state with the stack's DefinitionSubstitutions applied to it."""
    definition = json.loads(stack.definition_path.read_text())
    state = json.dumps(all_states(definition)["Create model"])
    return dict(json.loads(substitute(state, stack.substitutions)))


def test_what_the_pipeline_builds_is_accepted_by_sagemaker(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore validates the Environment maps against the API model (strings, in the right members)."""
    stack = load_stack(parameters={"MaxImagePixels": "45000000"})
    plan = _stack_plan(stack)
    container = dict(_create_model_state(stack)["Parameters"]["PrimaryContainer"])
    container.pop("ModelPackageName.$")
    support.aws_env(monkeypatch)
    with mock_aws():
        sagemaker = boto3.client("sagemaker")
        sagemaker.create_training_job(**plan.training_job)  # moto keeps no Environment: the request is the proof
        sagemaker.create_processing_job(**plan.evaluation_job)
        image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/serving:1"  # moto needs one where a package would be
        sagemaker.create_model(ModelName="m", ExecutionRoleArn="arn:aws:iam::123456789012:role/r",
                               PrimaryContainer={**container, "Image": image})
        assert sagemaker.describe_model(ModelName="m")["PrimaryContainer"]["Environment"] == {
            "MAX_IMAGE_PIXELS": "45000000", "D2OPS_SERVING_BACKEND": "torchserve"}


def test_the_jobs_stop_at_once_on_a_bad_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training and evaluation read MAX_IMAGE_PIXELS (their Environment) before anything else: one line, exit 1."""
    from model_code.evaluation import job
    from model_code.training import train

    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "lots")
    config = tmp_path / "training" / "input" / "config"
    config.mkdir(parents=True)
    (tmp_path / "training" / "input" / "data" / "dataset").mkdir(parents=True)
    for name in ("SM_HPS", "SM_HOSTS", "SM_CURRENT_HOST", "SM_OUTPUT_DIR", "SM_INPUT_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("D2OPS_ML_ROOT", str(tmp_path / "training"))
    assert train.main() == train.EXIT_FAILED
    failure = (tmp_path / "training" / "output" / "failure").read_text()
    assert failure.startswith("ConfigError: MAX_IMAGE_PIXELS='lots' is not a whole number") and failure.count("\n") == 1

    assert job.main(["--root", str(tmp_path / "evaluation")]) == 1
    message = (tmp_path / "evaluation" / "output" / "message").read_text()
    assert message.startswith("EvaluationError: MAX_IMAGE_PIXELS='lots' is not a whole number"), message


def test_the_decode_budget_admits_one_image_at_the_highest_limit() -> None:
    """A 150 MP image (600 MB decoded) is more than the 320 MB budget: it waits for the others, then runs alone."""
    import threading

    from d2ops_core.validation.sources import DECODE_BUDGET_BYTES, DecodeBudget

    budget = DecodeBudget(DECODE_BUDGET_BYTES)
    largest = rule.MAX_PIXELS_LIMIT * rule.DECODED_BYTES_PER_PIXEL
    assert largest > DECODE_BUDGET_BYTES
    done = threading.Event()

    def decode_largest() -> None:
        with budget.reserve(largest):
            done.set()

    with budget.reserve(rule.MAX_PIXELS * rule.DECODED_BYTES_PER_PIXEL):  # one 36 MP image decoding
        worker = threading.Thread(target=decode_largest)
        worker.start()
        assert not done.wait(0.2)  # it does not fit beside another image
    worker.join(5)
    assert done.is_set() and budget.used == 0 and budget.peak == DECODE_BUDGET_BYTES  # alone, then released


def test_a_local_endpoint_runs_with_its_containers_environment(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline endpoint's TorchServe gets CreateModel's container Environment over the runtime's own."""
    from d2ops.local.serving import LocalEndpoint

    monkeypatch.setenv(rule.MAX_PIXELS_ENV, "36000000")  # the runtime process's (every Lambda's) value
    endpoint = LocalEndpoint(tmp_path / "model.tar.gz", workdir=tmp_path / "serve",
                             environment={rule.MAX_PIXELS_ENV: "50000000"})
    assert endpoint.environment()[rule.MAX_PIXELS_ENV] == "50000000"
    monkeypatch.delenv(rule.MAX_PIXELS_ENV)
    assert rule.MAX_PIXELS_ENV not in LocalEndpoint(tmp_path / "m", workdir=tmp_path / "s").environment()
