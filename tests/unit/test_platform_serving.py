"""The platform table's serving stacks against what ships: the serving image installs every server the table
lists, the stack parameter ServingBackend offers exactly those, the pipeline hands the choice to the endpoint's
container, and every artifact form has a maintained server. Runs in well under a second (no server started)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from d2ops.offline.stack import StackError, load_stack
from d2ops.template import REPO_ROOT, load_template
from d2ops_core import platform

SERVING = REPO_ROOT / "containers" / "serving"
BACKEND_ENV = "D2OPS_SERVING_BACKEND"  # model_code.serving.backends.BACKEND_ENV (checked below)


def _requirements(path: Path) -> dict[str, Requirement]:
    """name -> requirement of a pip requirements file (hash continuation lines and comments skipped)."""
    found: dict[str, Requirement] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith("-"):
            continue
        requirement = Requirement(line)
        found[canonicalize_name(requirement.name)] = requirement
    return found


def test_the_serving_image_installs_every_server_of_the_table() -> None:
    """Mutation caught: ServingBackend=ray-serve offered while the image lacks ray[serve] (or torchserve), so an
    endpoint of that stack would never answer /ping."""
    for source in ("requirements.txt", "requirements.lock"):
        installed = _requirements(SERVING / source)
        for server in platform.SERVING_SERVERS.values():
            assert canonicalize_name(server.distribution) in installed, (source, server.name)
    ray = _requirements(SERVING / "requirements.txt")["ray"]
    assert "serve" in ray.extras  # Ray Serve is ray's extra, not ray itself


def test_the_stack_parameter_offers_exactly_the_tables_servers_with_torchserve_the_default() -> None:
    """Mutation caught: a server added to the template (or dropped from it) without its facts here, or a
    default other than the user's TorchServe."""
    spec = load_template().parameters()[platform.SERVING_BACKEND_PARAMETER]
    assert spec.allowed_values is not None
    assert sorted(spec.allowed_values) == sorted(platform.SERVING_SERVERS)
    assert spec.default == "torchserve"


def _states(node: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield from (node.get("States") or {}).items()
        for value in node.values():
            yield from _states(value)
    elif isinstance(node, list):
        for value in node:
            yield from _states(value)


def test_create_model_hands_the_stacks_choice_to_the_endpoints_container() -> None:
    """Mutation caught: the parameter defined but never reaching the container (the endpoint would serve with
    the image's default whatever the stack says), or reaching it under another name."""
    template = load_template()
    machine = template.state_machine()
    assert machine.definition_substitutions[platform.SERVING_BACKEND_PARAMETER] == {
        "Ref": platform.SERVING_BACKEND_PARAMETER}
    definition = json.loads(machine.definition_path.read_text())
    create_model = dict(_states(definition))["Create model"]
    environment = create_model["Parameters"]["PrimaryContainer"]["Environment"]
    assert environment[BACKEND_ENV] == "${" + platform.SERVING_BACKEND_PARAMETER + "}"


def test_the_offline_stack_takes_either_server_and_refuses_another() -> None:
    assert load_stack().substitutions[platform.SERVING_BACKEND_PARAMETER] == "torchserve"
    stack = load_stack(parameters={platform.SERVING_BACKEND_PARAMETER: "ray-serve"})
    assert stack.substitutions[platform.SERVING_BACKEND_PARAMETER] == "ray-serve"
    with pytest.raises(StackError, match="ServingBackend='triton' is not one of"):
        load_stack(parameters={platform.SERVING_BACKEND_PARAMETER: "triton"})


def test_every_form_has_a_maintained_server_and_each_missing_form_says_why() -> None:
    """Mutation caught: a form only the archived server runs (switching servers would then cost a re-export),
    or a server that silently lacks a form."""
    for form in platform.ARTIFACT_FORMS:
        servers = platform.serving_servers_for(form)
        assert servers and not platform.SERVING_SERVERS[servers[0]].archived, form
    for server in platform.SERVING_SERVERS.values():
        assert set(server.forms) <= set(platform.ARTIFACT_FORMS), server.name
        assert set(server.why_not) == set(platform.ARTIFACT_FORMS) - set(server.forms), server.name
        assert server.sources and all(s.url.startswith("https://") for s in server.sources)
    assert platform.maintained_servers() == ["ray-serve"]
    assert platform.ARTIFACT_FORMS["torchscript"].deprecated
    with pytest.raises(ValueError, match="'onnx' is not an artifact form"):
        platform.serving_servers_for("onnx")


def test_every_serving_fact_carries_a_source_and_the_date_it_was_read() -> None:
    facts = [s for server in platform.SERVING_SERVERS.values() for s in server.sources]
    facts += [form.source for form in platform.ARTIFACT_FORMS.values()]
    assert all(source.checked == platform.SERVING_CHECKED for source in facts)


class _Started(Exception):
    pass


def test_d2ops_demo_serving_backend_becomes_the_offline_stacks_parameter(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """Mutation caught: the flag parsed but not handed to the runtime (the demo would serve TorchServe)."""
    from d2ops import cli
    from d2ops.offline import processes, runtime

    started: list[dict[str, Any]] = []

    def fake_runtime(work_dir: Path, **settings: Any) -> Any:
        started.append(settings)
        raise _Started

    monkeypatch.setattr(runtime, "OfflineRuntime", fake_runtime)
    monkeypatch.setattr(processes, "install_signal_handlers", lambda: None)
    work = ["--work-dir", str(tmp_path / "work"), "--framework", "torchvision"]
    with pytest.raises(_Started):
        cli.main(["demo", *work, "--serving-backend", "ray-serve"])
    assert started[-1]["parameters"][platform.SERVING_BACKEND_PARAMETER] == "ray-serve"
    with pytest.raises(_Started):
        cli.main(["demo", *work])
    assert platform.SERVING_BACKEND_PARAMETER not in started[-1]["parameters"]  # the template's default
    with pytest.raises(SystemExit) as refused:
        cli.main(["demo", *work, "--serving-backend", "triton"])
    assert refused.value.code == 2


def test_the_tables_forms_are_the_artifacts() -> None:
    """Mutation caught: a form added to the export (model_forms.FORMS) with no word on which server runs it."""
    from model_code import model_forms

    assert tuple(platform.ARTIFACT_FORMS) == model_forms.FORMS


def test_the_tables_servers_are_the_serving_codes_backends() -> None:
    """Mutation caught: a backend the serving code accepts that the table (and so doctor) knows nothing of."""
    from model_code.serving import backends

    assert set(backends.BACKENDS) == set(platform.SERVING_SERVERS)
    assert load_template().parameters()[platform.SERVING_BACKEND_PARAMETER].default == backends.DEFAULT_BACKEND
    assert backends.BACKEND_ENV == BACKEND_ENV
