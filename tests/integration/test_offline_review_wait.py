"""The pipeline's own review states in a real offline runtime: "Prepare review wait", "Wait for review" and
"Read review decision" taken from the definition (substituted as the offline stack resolves template.yaml),
the real RequestReviewFunction writing the request with the wait's token and publishing to the stack's topic,
and ``d2ops approve`` (a real process, through the status API) completing the wait. The rest of the run (training,
the registry, the deployment) is the path tests' (tests/unit/test_pipeline_paths.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import StateMachine
from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.stack import ACCOUNT_ID, REGION
from d2ops.offline.status_api_server import reviewer_session
from d2ops_core.documents.review import ReviewRequest
from d2ops_core.pipeline_stages import all_states
from d2ops_core.s3_layout import review_request_key
from tests.fixtures.offline.review import finished

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
REVIEW_STATES = ("Prepare review wait", "Wait for review", "Read review decision")
GATE_REASON = "needs a person's review: only 31 held-out val images could be compared, fewer than the 50 the gate needs"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp("review-wait") / "work") as rt:
        states = all_states(rt.machine.definition)
        definition = {"StartAt": REVIEW_STATES[0], "States": {name: dict(states[name]) for name in REVIEW_STATES}}
        last = definition["States"][REVIEW_STATES[-1]]
        last.pop("Next")
        last["End"] = True
        last["Catch"] = []  # a failure here fails the test's execution, loudly
        rt.sfn.add_state_machine(StateMachine.from_definition(definition, name="review-states", region=REGION,
                                                              account_id=ACCOUNT_ID))
        yield rt


def run_input() -> dict[str, Any]:
    return {"dataset": {"name": "shapes", "version": "v2"},
            "registration": {"model_package_arn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT_ID}:model-package/m/2"},
            "evaluation": {"gate_reason": GATE_REASON, "review_because": ["too_few_images"], "images_compared": 31}}


def waiting(rt: OfflineRuntime, run_id: str) -> tuple[str, ReviewRequest]:
    arn = next(a for a in rt.sfn.machines if a.endswith(":review-states"))
    execution = rt.client("stepfunctions").start_execution(stateMachineArn=arn, name=run_id,
                                                           input=json.dumps(run_input()))["executionArn"]
    s3, key = rt.client("s3"), review_request_key(run_id)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = s3.list_objects_v2(Bucket=rt.stack.artifacts_bucket, Prefix=key).get("KeyCount", 0)
        if found:
            body = s3.get_object(Bucket=rt.stack.artifacts_bucket, Key=key)["Body"].read()
            return execution, ReviewRequest.model_validate_json(body)
        time.sleep(0.1)
    raise AssertionError(f"{run_id}: no review request was written")


def test_a_person_s_approval_through_the_status_api_completes_the_pipeline_s_wait(runtime: OfflineRuntime) -> None:
    run_id = "shapes_v2_reviewwait000000001"
    execution, request = waiting(runtime, run_id)
    assert request.execution_arn == execution and request.review_because == ["too_few_images"]
    # The stack's ReviewTimeoutSeconds (7 days) reached the wait through the offline substitutions.
    assert (request.expires_at - request.requested_at).total_seconds() == 604800
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    approved = subprocess.run([sys.executable, "-m", "d2ops", "approve", run_id, "--reason", "labels checked",
                               "--work-dir", str(runtime.work_dir)], capture_output=True, text=True, env=env,
                              timeout=120)
    assert approved.returncode == 0, approved.stderr
    described = finished(runtime, execution, timeout=60)
    assert described["status"] == "SUCCEEDED", described
    gate = json.loads(described["output"])["gate"]
    who = reviewer_session(runtime.stack, runtime.credentials.access_key).user_arn
    assert (gate["approval_status"], gate["decided_by"], gate["review_reason"]) == ("Approved", who,
                                                                                    "labels checked")
    assert gate["approval_description"] == f"approved by {who}: labels checked"


def test_the_request_s_message_names_the_offline_commands(runtime: OfflineRuntime) -> None:
    """The message goes to the stack's topic; offline (no stack name) it says `d2ops approve RUN` without
    --stack. Read back through an SQS subscription, as a subscriber gets it."""
    sqs, sns = runtime.client("sqs"), runtime.client("sns")
    queue = sqs.create_queue(QueueName="review-subscriber")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=runtime.stack.topic_arn, Protocol="sqs", Endpoint=queue_arn)
    run_id = "shapes_v2_reviewwait000000002"
    execution, _ = waiting(runtime, run_id)
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=5).get("Messages", [])
    (message,) = [json.loads(json.loads(m["Body"])["Message"]) for m in messages]
    assert message["run_id"] == run_id and message["gate_reason"] == GATE_REASON
    assert message["how_to_decide"][0] == f"d2ops approve {run_id} [--reason TEXT]"
    runtime.client("stepfunctions").stop_execution(executionArn=execution)
