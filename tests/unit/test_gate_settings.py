"""The gate's settings (GateConfidence, GateResamples, MinComparedImages, the tolerances' defaults) from the
stack to the evaluation job and the summarize step.

The stack parameters agree with d2ops_core.gate; prepare_training writes the plan's gate and the
evaluation job's GATE_* Environment from the same tightened values; a manifest may only raise the
confidence and the resamples; the job refuses a bad value naming the variable.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from d2ops.offline.stack import load_stack
from d2ops.template import load_template
from d2ops_core import gate
from d2ops_core.validation import Code
from d2ops_core.validation.manifest import Gate, StackLimits, effective_interval, stack_limit_problems
from tests.fixtures.pipeline import support


def test_the_template_parameters_agree_with_the_gate_module() -> None:
    params = load_template().document["Parameters"]
    confidence, resamples = params["GateConfidence"], params["GateResamples"]
    assert confidence["Type"] == "String" and float(confidence["Default"]) == gate.DEFAULT_CONFIDENCE
    assert resamples["Type"] == "Number" and resamples["Default"] == gate.DEFAULT_RESAMPLES
    assert (resamples["MinValue"], resamples["MaxValue"]) == (gate.MIN_RESAMPLES, gate.MAX_RESAMPLES)
    # CloudFormation's pattern admits exactly the fractions strictly between 0.5 and 1 (mutation: 0.5 let in).
    pattern = re.compile(confidence["AllowedPattern"])
    for text in ("0.51", "0.501", "0.6", "0.9", "0.95", "0.999"):
        assert pattern.fullmatch(text) and gate.confidence_problem(float(text)) is None, text
    for text in ("0.5", "0.50", "0.500", "0.4", "1", "1.0", "95", ".95", "0.95 "):
        assert not pattern.fullmatch(text), text


def test_the_tolerances_defaults_are_the_stack_s_and_d2ops_gate_s() -> None:
    """One fact, three readers (the template, d2ops gate's defaults, the plan). Mutation: one changed alone."""
    params = load_template().document["Parameters"]
    assert float(params["MinMap"]["Default"]) == gate.DEFAULT_MIN_MAP
    assert float(params["MaxRegression"]["Default"]) == gate.DEFAULT_MAX_REGRESSION
    assert float(params["MaxClassRegression"]["Default"]) == gate.DEFAULT_MAX_CLASS_REGRESSION
    assert params["MinClassInstances"]["Default"] == gate.DEFAULT_MIN_CLASS_INSTANCES
    compared = params["MinComparedImages"]
    assert compared["Type"] == "Number" and compared["Default"] == gate.DEFAULT_MIN_COMPARED_IMAGES
    assert compared["MinValue"] == 1


def test_min_compared_images_reaches_the_plan_from_the_stack() -> None:
    stack = load_stack(parameters={"MinComparedImages": "120"})
    env = stack.functions["PrepareTrainingFunction"].environment
    assert env["MIN_COMPARED_IMAGES"] == "120"
    assert _plan({**support.PREPARE_ENV, "MIN_COMPARED_IMAGES": "120"}, None).gate.min_compared_images == 120
    assert _plan(support.PREPARE_ENV, None).gate.min_compared_images == gate.DEFAULT_MIN_COMPARED_IMAGES


def test_the_functions_that_enforce_the_limits_get_them_from_the_stack() -> None:
    stack = load_stack(parameters={"GateConfidence": "0.9", "GateResamples": "2000"})
    for name in ("ValidateDatasetFunction", "PrepareTrainingFunction"):
        env = stack.functions[name].environment
        assert (env[gate.CONFIDENCE_ENV], env[gate.RESAMPLES_ENV]) == ("0.9", "2000"), name


def _plan(stack_env: dict[str, str], manifest_gate: dict[str, Any] | None) -> Any:
    support.function_path("prepare_training")
    models = importlib.import_module("prepare_training.models")
    service = importlib.import_module("prepare_training.service")
    settings = models.PrepareSettings.from_env(stack_env)
    manifest = {"task": "detection", **({"gate": manifest_gate} if manifest_gate else {})}
    event = models.PrepareEvent(run_id=support.RUN_ID, dataset=support.DATASET, manifest=manifest,
                                validation=support.load_event("prepare_training", "defaults")["validation"])
    return service.build_plan(settings, event, None)


def test_the_plan_s_gate_and_the_evaluation_job_s_environment_carry_the_same_tightened_values() -> None:
    stack_env = {**support.PREPARE_ENV, "GATE_CONFIDENCE": "0.95", "GATE_RESAMPLES": "1000"}
    plan = _plan(stack_env, {"confidence": 0.99, "resamples": 4000, "min_class_instances": 20})
    assert (plan.gate.confidence, plan.gate.resamples, plan.gate.min_class_instances) == (0.99, 4000, 20)
    env = plan.evaluation_job["Environment"]
    # Read back the way the job reads it (mutation: the stack's values passed instead of the plan's).
    assert gate.read_job_environment(env) == gate.GateSettings(confidence=0.99, resamples=4000,
                                                               min_class_instances=20, seed=0, max_regression=0.01,
                                                               max_class_regression=0.1)
    assert all(isinstance(v, str) for v in env.values())  # SageMaker's Environment is strings
    # Without a manifest gate: the stack's.
    plain = _plan(stack_env, None)
    assert (plain.gate.confidence, plain.gate.resamples) == (0.95, 1000)
    assert gate.read_job_environment(plain.evaluation_job["Environment"]).min_class_instances == 30


@pytest.mark.parametrize(("asked", "codes"), [
    (Gate(confidence=0.8), [Code.GATE_CONFIDENCE_BELOW_STACK]),  # a narrower interval approves more readily
    (Gate(resamples=500), [Code.GATE_RESAMPLES_BELOW_STACK]),
    (Gate(confidence=0.95, resamples=1000), []),  # equal to the stack's: not laxer (mutation: <= for <)
    (Gate(confidence=0.99, resamples=gate.MAX_RESAMPLES), []),
])
def test_a_manifest_may_only_raise_the_confidence_and_the_resamples(asked: Gate, codes: list[Code]) -> None:
    limits = StackLimits(min_map=0.3, max_regression=0.01, confidence=0.95, resamples=1000)
    from d2ops_core.validation.manifest import TrainingOverrides

    assert [c for c, _, _ in stack_limit_problems(asked, TrainingOverrides(), limits)] == codes
    confidence, resamples = effective_interval(limits, asked)
    assert confidence >= 0.95 and resamples >= 1000  # never laxer or coarser than the stack, whatever was asked
    if not codes:
        assert (confidence, resamples) == (asked.confidence, asked.resamples)


def test_the_manifest_schema_bounds_the_settings() -> None:
    from pydantic import ValidationError

    for bad in ({"confidence": 0.5}, {"confidence": 1.0}, {"resamples": gate.MAX_RESAMPLES + 1},
                {"resamples": gate.MIN_RESAMPLES - 1}):
        with pytest.raises(ValidationError):
            Gate.model_validate(bad)


@pytest.mark.parametrize(("env", "message"), [
    ({"GATE_CONFIDENCE": "high"}, "GATE_CONFIDENCE='high' is not a number"),
    ({"GATE_CONFIDENCE": "0.5"}, "GATE_CONFIDENCE='0.5' must be a fraction strictly between 0.5 and 1"),
    ({"GATE_CONFIDENCE": "nan"}, "GATE_CONFIDENCE='nan' must be a fraction"),
    ({"GATE_RESAMPLES": "1e3"}, "GATE_RESAMPLES='1e3' is not a whole number"),
    ({"GATE_RESAMPLES": "99"}, "GATE_RESAMPLES='99' must be a whole number from 100 to 10000"),
    ({"GATE_MIN_CLASS_INSTANCES": "0"}, "GATE_MIN_CLASS_INSTANCES='0' must be at least 1"),
    ({"GATE_SEED": "-1"}, "GATE_SEED='-1' must be a whole number"),
    ({"GATE_MAX_REGRESSION": "2"}, "GATE_MAX_REGRESSION='2' must be a fraction in [0, 1]"),
])
def test_a_bad_job_setting_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(gate.GateSettingError, match=re.escape(message)):
        gate.read_job_environment(env)


def test_absent_job_settings_are_the_defaults() -> None:
    assert gate.read_job_environment({}) == gate.GateSettings(0.95, 1000, 30, 0)
    assert gate.read_job_environment({"GATE_SEED": "7", "GATE_CONFIDENCE": "0.9"}).seed == 7


def test_the_evaluation_job_stops_at_once_on_a_bad_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before it loads a model: one line naming the variable in the job's failure message, exit 1."""
    from model_code.evaluation import job

    monkeypatch.setenv(gate.RESAMPLES_ENV, "lots")
    assert job.main(["--root", str(tmp_path)]) == 1
    message = (tmp_path / "output" / "message").read_text()
    assert message == "EvaluationError: GATE_RESAMPLES='lots' is not a whole number\n"
    assert json.dumps(message).count("\\n") == 1
