"""``make bench-status-api``: status API requests/s with boto3 clients made per request vs reused.

The status API handler runs in-process (as Lambda runs it: one request at a time) against a moto
server on loopback, on a state machine holding a few runs. Each round is the same
``GET /runs`` + ``GET /runs/{runId}`` pair; ``per request`` empties the handler's client cache
before every request (what the handler did before ``status_api.clients``), ``reused`` keeps it
(one client per service for the execution environment). Ends with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from d2ops.functions import import_handler
from d2ops.template import REPO_ROOT, load_template
from d2ops_core import run_ids, run_start

REGION = "us-east-1"
ROLE_ARN = "arn:aws:iam::123456789012:role/d2ops-bench"
RUNS = 3
ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
               "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "POWERTOOLS_TRACE_DISABLED": "1",
               "POWERTOOLS_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_NAMESPACE": "d2ops-bench",
               "DATA_BUCKET": "d2ops-bench-data", "ARTIFACTS_BUCKET": "d2ops-bench-artifacts",
               "MODEL_PACKAGE_GROUP_NAME": "d2ops-bench-models"}


class _Context:
    """The attributes Powertools' Logger reads from a Lambda context."""

    function_name = "status-api-bench"
    function_version = "$LATEST"
    memory_limit_in_mb = 512
    invoked_function_arn = f"arn:aws:lambda:{REGION}:123456789012:function:status-api-bench"
    aws_request_id = "c0ffee00-0000-4000-8000-000000000000"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 30_000


def _import_status_api() -> tuple[Any, Any]:
    """The handler module and its client cache, imported as the offline runtime imports Lambdas."""
    spec = next(f for f in load_template().functions().values() if f.handler_module == "status_api.handler")
    return import_handler("status_api.handler", spec.code_dir), import_handler("status_api.clients", spec.code_dir)


def _seed(state_machine_arn_env: str) -> list[str]:
    """A state machine (one Pass state: moto records executions without running them) and a few runs."""
    import boto3

    sfn = boto3.client("stepfunctions")
    definition = {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}}
    arn = sfn.create_state_machine(name="training_pipeline", definition=json.dumps(definition), roleArn=ROLE_ARN,
                                   type="STANDARD")["stateMachineArn"]
    os.environ[state_machine_arn_env] = arn
    started = []
    for n in range(RUNS):
        key = f"datasets/shapes/v{n}/manifest.json"
        dataset = run_start.dataset_ref(ENVIRONMENT["DATA_BUCKET"], key, version_id=f"version-{n}", etag=None)
        run_id = run_ids.run_id_for(dataset.name, dataset.version, dataset.manifest_version)
        trigger = run_start.Trigger(source="api", object_key=key, object_version=dataset.manifest_version)
        sfn.start_execution(stateMachineArn=arn, name=run_id,
                            input=json.dumps(run_start.execution_input(dataset, trigger)))
        started.append(run_id)
    return started


def _events(run_id: str) -> list[dict[str, Any]]:
    events = []
    for case in ("list_runs", "get_run"):
        event = json.loads((REPO_ROOT / "events" / "status_api" / f"{case}.json").read_text())
        if case == "get_run":
            event = copy.deepcopy(event)
            event["rawPath"] = event["requestContext"]["http"]["path"] = f"/runs/{run_id}"
            event["pathParameters"] = {"runId": run_id}
        events.append(event)
    return events


def _measure(handler: Callable[[Any, Any], Any], events: list[dict[str, Any]], requests: int,
             before_each: Callable[[], None]) -> float:
    started = time.perf_counter()
    for n in range(requests):
        before_each()
        response = handler(events[n % len(events)], _Context())
        if response["statusCode"] != 200:
            raise SystemExit(f"status API answered {response['statusCode']}: {response.get('body')}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per mode (default 200)")
    args = parser.parse_args(argv)
    if args.requests < 2:
        parser.error("--requests must be at least 2 (one GET /runs and one GET /runs/{runId})")

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = dict(os.environ)
    try:
        host, port = server.get_host_and_port()
        for key in ("AWS_PROFILE",):
            os.environ.pop(key, None)
        os.environ.update(ENVIRONMENT, AWS_ENDPOINT_URL=f"http://{host}:{port}")
        run_ids = _seed("STATE_MACHINE_ARN")
        handler_module, clients = _import_status_api()
        events = _events(run_ids[0])
        _measure(handler_module.handler, events, len(events), clients.clear)  # imports, first parse: warm both
        per_request = _measure(handler_module.handler, events, args.requests, clients.clear)
        reused = _measure(handler_module.handler, events, args.requests, lambda: None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()
    figures = {"requests": args.requests, "routes": ["GET /runs", "GET /runs/{runId}"],
               "per_request_clients": {"seconds": round(per_request, 3),
                                       "requests_per_s": round(args.requests / per_request, 1)},
               "reused_clients": {"seconds": round(reused, 3), "requests_per_s": round(args.requests / reused, 1)},
               "speedup": round(per_request / reused, 2)}
    print(f"per-request clients: {figures['per_request_clients']['requests_per_s']} req/s; "
          f"reused clients: {figures['reused_clients']['requests_per_s']} req/s; "
          f"ratio (reused / per request) {figures['speedup']}", flush=True)
    print(json.dumps(figures), flush=True)
    return figures


if __name__ == "__main__":
    main()
