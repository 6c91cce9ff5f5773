"""samconfig.toml: both environments deploy, and every parameter override fits the template."""

from __future__ import annotations

import re
import shlex
import tomllib
from typing import Any

import pytest

from d2ops.template import REPO_ROOT, load_template

CONFIG = tomllib.loads((REPO_ROOT / "samconfig.toml").read_text())
PARAMETERS = load_template().document["Parameters"]


def overrides(env: str) -> dict[str, str]:
    text = CONFIG[env]["deploy"]["parameters"].get("parameter_overrides", "")
    pairs = [item.partition("=") for item in shlex.split(text)]
    return {k: v for k, _, v in pairs}


def check_value(name: str, value: str) -> None:
    spec: dict[str, Any] = PARAMETERS[name]
    if "AllowedValues" in spec:
        assert value in [str(v) for v in spec["AllowedValues"]], f"{name}={value} not in {spec['AllowedValues']}"
    if "AllowedPattern" in spec:
        assert re.fullmatch(spec["AllowedPattern"], value), f"{name}={value} fails {spec['AllowedPattern']}"
    if spec["Type"] == "Number":
        number = float(value)
        assert spec.get("MinValue", number) <= number <= spec.get("MaxValue", number), f"{name}={value} out of range"


@pytest.mark.parametrize("env", ["default", "prod"])
def test_environment_deploys_a_separate_stack_with_iam_capability(env: str) -> None:
    assert CONFIG["version"] == 0.1
    deploy = CONFIG[env]["deploy"]["parameters"]
    assert deploy["capabilities"] == "CAPABILITY_IAM"  # roles are unnamed, so no CAPABILITY_NAMED_IAM
    assert deploy["confirm_changeset"] is True
    assert deploy["resolve_s3"] is True
    assert CONFIG[env]["validate"]["parameters"]["lint"] is True
    stacks = {e: CONFIG[e]["global"]["parameters"]["stack_name"] for e in ("default", "prod")}
    assert stacks["default"] != stacks["prod"]


@pytest.mark.parametrize("env", ["default", "prod"])
def test_parameter_overrides_name_real_parameters_with_valid_values(env: str) -> None:
    values = overrides(env)
    assert values, f"{env}: no parameter_overrides"
    unknown = set(values) - set(PARAMETERS)
    assert unknown == set(), f"{env}: overrides for parameters the template does not declare: {sorted(unknown)}"
    for name, value in values.items():
        check_value(name, value)
    assert values["Stage"] == ("prod" if env == "prod" else "dev")


def test_template_defaults_are_valid_values_too() -> None:
    for name, spec in PARAMETERS.items():
        if "Default" in spec and spec["Default"] != "":
            check_value(name, str(spec["Default"]))


def test_the_check_itself_rejects_bad_values() -> None:
    with pytest.raises(AssertionError):
        check_value("MinMap", "1.5")
    with pytest.raises(AssertionError):
        check_value("TrainingInstanceCount", "0")
    with pytest.raises(AssertionError):
        check_value("UseSpotTraining", "yes")
