"""samconfig.toml: every environment deploys its own stack with its own SageMaker names, and every
parameter override fits the template's constraints."""

from __future__ import annotations

import re
import shlex
import tomllib
from typing import Any

import pytest

from d2ops.template import REPO_ROOT, load_template

CONFIG = tomllib.loads((REPO_ROOT / "samconfig.toml").read_text())
PARAMETERS = load_template().document["Parameters"]
PREFIX = "SageMakerNamePrefix"


def environments(config: dict[str, Any]) -> list[str]:
    """Every environment that deploys (a `[<env>.deploy.parameters]` table), so a third one is checked too."""
    return [env for env, table in config.items()
            if isinstance(table, dict) and "parameters" in table.get("deploy", {})]


ENVIRONMENTS = environments(CONFIG)


def overrides(env: str, config: dict[str, Any] = CONFIG) -> dict[str, str]:
    text = config[env]["deploy"]["parameters"].get("parameter_overrides", "")
    pairs = [item.partition("=") for item in shlex.split(text)]
    return {k: v for k, _, v in pairs}


def check_value(name: str, value: str) -> None:
    spec: dict[str, Any] = PARAMETERS[name]
    if "AllowedValues" in spec:
        assert value in [str(v) for v in spec["AllowedValues"]], f"{name}={value} not in {spec['AllowedValues']}"
    if "AllowedPattern" in spec:
        assert re.fullmatch(spec["AllowedPattern"], value), f"{name}={value} fails {spec['AllowedPattern']}"
    if spec["Type"] == "String":
        assert int(spec.get("MinLength", 0)) <= len(value) <= int(spec.get("MaxLength", len(value))), \
            f"{name}={value} is {len(value)} characters, outside [{spec.get('MinLength')}, {spec.get('MaxLength')}]"
    if spec["Type"] == "Number":
        number = float(value)
        assert spec.get("MinValue", number) <= number <= spec.get("MaxValue", number), f"{name}={value} out of range"


def shared_prefixes(config: dict[str, Any]) -> dict[str, list[str]]:
    """Prefixes that more than one environment deploys with (an override, else the template's default).

    The endpoint <prefix>-detector, its lease and the model package group are per account and
    region: two stacks with one prefix would update, roll back and lease each other's endpoint.
    """
    by_prefix: dict[str, list[str]] = {}
    for env in environments(config):
        by_prefix.setdefault(overrides(env, config).get(PREFIX, str(PARAMETERS[PREFIX]["Default"])), []).append(env)
    return {prefix: envs for prefix, envs in by_prefix.items() if len(envs) > 1}


def test_samconfig_has_the_dev_and_prod_environments() -> None:
    assert {"default", "prod"} <= set(ENVIRONMENTS)


def test_no_two_environments_share_a_sagemaker_name_prefix() -> None:
    assert shared_prefixes(CONFIG) == {}, "environments share SageMaker names (endpoint <prefix>-detector): " \
                                          f"{shared_prefixes(CONFIG)}; set {PREFIX} in each parameter_overrides"
    for env in ENVIRONMENTS:
        assert PREFIX in overrides(env), f"{env}: no {PREFIX} (the template default is everyone's)"


def test_the_prefix_check_itself_finds_environments_that_share_one() -> None:
    def config(**prefixes: str | None) -> dict[str, Any]:
        return {env: {"deploy": {"parameters": {"parameter_overrides": "Stage=dev" + (f" {PREFIX}={p}" if p else "")}}}
                for env, p in prefixes.items()}

    default = str(PARAMETERS[PREFIX]["Default"])
    assert shared_prefixes(config(default=None, prod=None)) == {default: ["default", "prod"]}  # the old samconfig
    assert shared_prefixes(config(default=None, prod=default)) == {default: ["default", "prod"]}
    assert shared_prefixes(config(default="a", prod="a", staging="b")) == {"a": ["default", "prod"]}
    assert shared_prefixes(config(default=None, prod="d2ops-prod")) == {}


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_environment_deploys_a_separate_stack_with_iam_capability(env: str) -> None:
    assert CONFIG["version"] == 0.1
    deploy = CONFIG[env]["deploy"]["parameters"]
    assert deploy["capabilities"] == "CAPABILITY_IAM"  # roles are unnamed, so no CAPABILITY_NAMED_IAM
    assert deploy["confirm_changeset"] is True
    assert deploy["resolve_s3"] is True
    assert CONFIG[env]["validate"]["parameters"]["lint"] is True
    stacks = [CONFIG[e]["global"]["parameters"]["stack_name"] for e in ENVIRONMENTS]
    assert len(set(stacks)) == len(stacks), f"environments share a stack: {stacks}"


@pytest.mark.parametrize("env", ENVIRONMENTS)
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
    with pytest.raises(AssertionError, match="characters"):  # fits the pattern, not MaxLength 40
        check_value(PREFIX, "d" * 41)
    with pytest.raises(AssertionError, match="fails"):  # capitals never match SageMaker's lower-cased ARNs
        check_value(PREFIX, "D2ops-prod")
