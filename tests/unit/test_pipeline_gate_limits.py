"""A manifest can only tighten the stack's gate and training limits (issue 10).

The merge rule (d2ops_core.validation.manifest): validation names every laxer setting with a code
that says which limit; the prepare step takes the stricter value of each pair.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from d2ops import synth
from d2ops_core.validation import Code
from d2ops_core.validation.dataset import validate_source
from d2ops_core.validation.manifest import (
    Gate,
    StackLimits,
    TrainingOverrides,
    effective_class_gate,
    effective_gate,
    stack_limit_problems,
)
from d2ops_core.validation.sources import LocalSource

STACK = StackLimits(min_map=0.3, max_regression=0.01, max_iter=1000, max_ims_per_batch=16)
fractions = st.floats(min_value=0, max_value=1, allow_nan=False)


def codes(gate: Gate | None = None, training: TrainingOverrides | None = None) -> list[Code]:
    return [code for code, _, _ in stack_limit_problems(gate, training or TrainingOverrides(), STACK)]


@pytest.mark.parametrize(("gate", "training", "expected"), [
    (Gate(min_map=0.0), None, [Code.GATE_MIN_MAP_BELOW_STACK]),
    (Gate(max_regression=1.0), None, [Code.GATE_MAX_REGRESSION_ABOVE_STACK]),
    (Gate(min_map=0.0, max_regression=1.0), TrainingOverrides(max_iter=1),  # the attack: all gates off
     [Code.GATE_MIN_MAP_BELOW_STACK, Code.GATE_MAX_REGRESSION_ABOVE_STACK]),
    (None, TrainingOverrides(max_iter=1001), [Code.TRAINING_MAX_ITER_ABOVE_STACK]),
    (None, TrainingOverrides(ims_per_batch=32), [Code.TRAINING_IMS_PER_BATCH_ABOVE_STACK]),
    (Gate(min_map=0.3, max_regression=0.01), TrainingOverrides(max_iter=1000, ims_per_batch=16), []),  # equal: ok
    (Gate(min_map=0.9, max_regression=0.0), TrainingOverrides(max_iter=1, ims_per_batch=1), []),  # tighter: ok
    (None, None, []),
])
def test_laxer_settings_are_named_by_the_limit_they_break(gate: Gate | None, training: TrainingOverrides | None,
                                                          expected: list[Code]) -> None:
    assert codes(gate, training) == expected


def test_messages_say_which_stack_parameter_and_both_values() -> None:
    ((_, message, path),) = stack_limit_problems(Gate(min_map=0.05), TrainingOverrides(), STACK)
    assert path == "gate.min_map" and "MinMap" in message and "0.05" in message and "0.3" in message


def test_without_training_caps_only_the_schema_bounds_apply() -> None:
    limits = StackLimits(min_map=0.3, max_regression=0.01)
    assert stack_limit_problems(None, TrainingOverrides(max_iter=200_000, ims_per_batch=512), limits) == []


@given(stack_min=fractions, stack_reg=fractions, min_map=st.none() | fractions, max_reg=st.none() | fractions)
def test_the_effective_gate_is_never_laxer_than_the_stack_nor_the_manifest(
        stack_min: float, stack_reg: float, min_map: float | None, max_reg: float | None) -> None:
    limits = StackLimits(min_map=stack_min, max_regression=stack_reg)
    gate = Gate(min_map=min_map, max_regression=max_reg)
    eff_min, eff_reg = effective_gate(limits, gate)
    assert eff_min >= stack_min and eff_reg <= stack_reg
    assert min_map is None or eff_min >= min_map
    assert max_reg is None or eff_reg <= max_reg
    # Validation rejects exactly the manifests the merge would have to override.
    laxer = {c for c, _, _ in stack_limit_problems(gate, TrainingOverrides(), limits)}
    assert (Code.GATE_MIN_MAP_BELOW_STACK in laxer) == (min_map is not None and min_map < stack_min)
    assert (Code.GATE_MAX_REGRESSION_ABOVE_STACK in laxer) == (max_reg is not None and max_reg > stack_reg)


def test_limits_come_from_the_environment_the_template_sets() -> None:
    from d2ops import template as sam

    env = sam.load_template().function("ValidateDatasetFunction").environment
    assert set(StackLimits.ENV) <= set(env)  # all four reach the validator
    limits = StackLimits.from_env({"MIN_MAP": "0.40", "MAX_REGRESSION": "0.005", "MAX_TRAINING_ITERATIONS": "500",
                                   "MAX_IMAGES_PER_BATCH": "8"})
    assert limits == StackLimits(min_map=0.4, max_regression=0.005, max_iter=500, max_ims_per_batch=8)
    with pytest.raises(ValidationError, match="min_map"):  # no gate configured: refuse to run, never default to 0
        StackLimits.from_env({"MAX_REGRESSION": "0.01"})


def dataset(tmp_path: Path, **manifest_changes: Any) -> Path:
    root = tmp_path / "shapes-v1"
    synth.generate(root, images=8, size=32)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest.update(manifest_changes)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_the_validation_report_rejects_a_manifest_that_switches_the_gate_off(tmp_path: Path) -> None:
    root = dataset(tmp_path, gate={"min_map": 0, "max_regression": 1}, training={"max_iter": 1})
    report = validate_source(LocalSource(root), check_images=False, stack_limits=STACK)
    assert not report.valid
    assert [(i.code, i.location) for i in report.errors] == [
        (Code.GATE_MIN_MAP_BELOW_STACK, "manifest.json:gate.min_map"),
        (Code.GATE_MAX_REGRESSION_ABOVE_STACK, "manifest.json:gate.max_regression")]
    # The same dataset is valid where no stack applies (d2ops validate on a laptop) and with a tighter gate.
    assert validate_source(LocalSource(root), check_images=False).valid
    tighter = dataset(tmp_path, gate={"min_map": 0.5, "max_regression": 0.0})
    assert validate_source(LocalSource(tighter), check_images=False, stack_limits=STACK).valid


PER_CLASS = StackLimits(min_map=0.3, max_regression=0.01, max_class_regression=0.1, min_class_instances=30)


@pytest.mark.parametrize(("gate", "expected"), [
    (Gate(max_class_regression=0.2), [Code.GATE_MAX_CLASS_REGRESSION_ABOVE_STACK]),
    (Gate(min_class_instances=31), [Code.GATE_MIN_CLASS_INSTANCES_ABOVE_STACK]),  # fewer classes judged: laxer
    (Gate(max_class_regression=1.0, min_class_instances=1_000_000),
     [Code.GATE_MAX_CLASS_REGRESSION_ABOVE_STACK, Code.GATE_MIN_CLASS_INSTANCES_ABOVE_STACK]),
    (Gate(max_class_regression=0.1, min_class_instances=30), []),  # equal: ok
    (Gate(max_class_regression=0.0, min_class_instances=1), []),  # tighter: ok
])
def test_a_laxer_per_class_gate_is_named_by_the_stack_parameter(gate: Gate, expected: list[Code]) -> None:
    problems = stack_limit_problems(gate, TrainingOverrides(), PER_CLASS)
    assert [code for code, _, _ in problems] == expected
    for code, message, path in problems:
        parameter = "MaxClassRegression" if code is Code.GATE_MAX_CLASS_REGRESSION_ABOVE_STACK else "MinClassInstances"
        assert parameter in message and path in {"gate.max_class_regression", "gate.min_class_instances"}


@given(stack_margin=st.none() | fractions, stack_count=st.none() | st.integers(1, 10_000),
       margin=st.none() | fractions, count=st.none() | st.integers(1, 10_000))
def test_the_effective_per_class_gate_only_tightens(stack_margin: float | None, stack_count: int | None,
                                                    margin: float | None, count: int | None) -> None:
    limits = StackLimits(min_map=0.3, max_regression=0.01, max_class_regression=stack_margin,
                         min_class_instances=stack_count)
    gate = Gate(max_class_regression=margin, min_class_instances=count)
    eff_margin, eff_count = effective_class_gate(limits, gate)
    assert (eff_margin is None) == (stack_margin is None and margin is None)
    if eff_margin is not None:
        assert eff_margin == min(v for v in (stack_margin, margin) if v is not None)
    assert (eff_count is None) == (stack_count is None and count is None)
    if eff_count is not None:
        assert eff_count == min(v for v in (stack_count, count) if v is not None)
    laxer = {c for c, _, _ in stack_limit_problems(gate, TrainingOverrides(), limits)}
    assert (Code.GATE_MAX_CLASS_REGRESSION_ABOVE_STACK in laxer) == (
        None not in (margin, stack_margin) and margin > stack_margin)  # type: ignore[operator]
    assert (Code.GATE_MIN_CLASS_INSTANCES_ABOVE_STACK in laxer) == (
        None not in (count, stack_count) and count > stack_count)  # type: ignore[operator]


def test_the_per_class_limits_come_from_the_environment() -> None:
    limits = StackLimits.from_env({"MIN_MAP": "0.3", "MAX_REGRESSION": "0.01", "MAX_CLASS_REGRESSION": "0.10",
                                   "MIN_CLASS_INSTANCES": "30"})
    assert (limits.max_class_regression, limits.min_class_instances) == (0.1, 30)
    with pytest.raises(ValidationError, match="min_class_instances"):
        StackLimits.from_env({"MIN_MAP": "0.3", "MAX_REGRESSION": "0.01", "MIN_CLASS_INSTANCES": "0"})
