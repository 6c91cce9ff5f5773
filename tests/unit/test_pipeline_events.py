"""Every sample event in events/ for the pipeline's functions is one its function accepts.

`sam local invoke -e events/<fn>/<case>.json` is how people try a function; a sample that
drifted from the function's input model would fail there first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from d2ops_core.run_ids import RUN_ID_PATTERN
from tests.fixtures.pipeline import support

for _directory in ("start_pipeline", "prepare_training", "summarize_evaluation", "smoke_test_endpoint", "status_api",
                   "compose_notification", "check_images"):
    support.function_path(_directory)
from check_images.models import ImageBatchEvent  # noqa: E402
from compose_notification.models import NotificationEvent  # noqa: E402
from prepare_training.models import PrepareEvent  # noqa: E402
from smoke_test_endpoint.models import SmokeTestEvent  # noqa: E402
from start_pipeline.models import ObjectCreatedEvent  # noqa: E402
from status_api.models import ENDPOINT_NAME_PATTERN, DecisionRequest, StartRunRequest  # noqa: E402
from summarize_evaluation.models import SummarizeEvent  # noqa: E402

INPUT_MODELS: dict[str, type[BaseModel]] = {"start_pipeline": ObjectCreatedEvent, "prepare_training": PrepareEvent,
                                            "summarize_evaluation": SummarizeEvent,
                                            "smoke_test_endpoint": SmokeTestEvent,
                                            "compose_notification": NotificationEvent,
                                            "check_images": ImageBatchEvent}
EVENTS = support.REPO / "events"


def samples(directory: str) -> list[Path]:
    found = sorted((EVENTS / directory).glob("*.json"))
    assert found, f"events/{directory}/ has no sample event"
    return found


@pytest.mark.parametrize("path", [p for d in INPUT_MODELS for p in samples(d)],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_task_events_are_valid_function_input(path: Path) -> None:
    event = INPUT_MODELS[path.parent.name].model_validate_json(path.read_bytes())
    run_id = getattr(event, "run_id", None) or getattr(getattr(event, "BatchInput", None), "run_id", None)
    if run_id is not None:  # the run of the example dataset, as the state machine would name it
        assert run_id == support.RUN_ID


def test_status_api_events_name_documented_routes_with_valid_requests() -> None:
    document = json.loads((support.REPO / "docs" / "status-api.openapi.json").read_text())
    routes: set[tuple[str, str]] = set()
    for path in samples("status_api"):
        event: dict[str, Any] = json.loads(path.read_text())
        method, route = event["routeKey"].split(" ", 1)
        assert method == event["requestContext"]["http"]["method"], path.name
        assert method.lower() in document["paths"][route], path.name
        assert event["rawPath"] == event["requestContext"]["http"]["path"], path.name
        for name, value in (event.get("pathParameters") or {}).items():
            pattern = ENDPOINT_NAME_PATTERN if name == "endpointName" else RUN_ID_PATTERN
            assert "{" + name + "}" in route and re.fullmatch(pattern, value), path.name
        if method == "POST":
            body_model = DecisionRequest if route.endswith("/decision") else StartRunRequest
            body_model.model_validate_json(event["body"])
        routes.add((method.lower(), route))
    # One sample per documented operation.
    assert routes == {(m, p) for p, ops in document["paths"].items() for m in ops}
