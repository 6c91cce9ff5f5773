"""The offline runtime words a refused ``.sync`` create call as Step Functions does, and the pipeline's
'already created?' Choices wait for the created job on a name in use only."""

from __future__ import annotations

import json
import re

import boto3
from botocore.exceptions import ClientError

from d2ops.asl.choice import evaluate_rule
from d2ops.offline.task_integrations import error_name, sync_create_cause
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

STATES = all_states(json.loads(support.DEFINITION.read_text()))
SAGEMAKER = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
TAKEN = ("Training job names must be unique within an AWS account and region, and a training job with this name "
         "already exists (arn:aws:sagemaker:us-east-1:123456789012:training-job/shapes-v1-x-train)")


def refused(code: str, message: str, request_id: str | None = None) -> ClientError:
    meta = {"HTTPStatusCode": 400, **({"RequestId": request_id} if request_id else {})}
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": meta}, "CreateTrainingJob")


def test_the_cause_is_the_java_sdk_text_step_functions_writes() -> None:
    cause = sync_create_cause(refused("ResourceInUse", TAKEN, "5e3c1a0b-0000-4000-8000-000000000000"))
    assert cause == (f"{TAKEN} (Service: AmazonSageMaker; Status Code: 400; Error Code: ResourceInUse; "
                     "Request ID: 5e3c1a0b-0000-4000-8000-000000000000; Proxy: null)")
    # Without a request id from the service (an in-process fake), one is made up, as a UUID.
    made_up = sync_create_cause(refused("ResourceInUse", "taken"))
    assert re.fullmatch(r"taken \(Service: AmazonSageMaker; Status Code: 400; Error Code: ResourceInUse; "
                        r"Request ID: [0-9a-f-]{36}; Proxy: null\)", made_up)


def test_the_already_created_choices_match_a_name_in_use_and_nothing_else() -> None:
    for choice in ("Training job already created?", "Evaluation job already created?"):
        (rule,) = STATES[choice]["Choices"]
        for code, message, expected in (("ResourceInUse", "taken", True),
                                        ("ResourceLimitExceeded", "The account-level service limit", False),
                                        ("ValidationException", "bad image", False)):
            name = error_name(SAGEMAKER, "sagemaker", code, sdk=False)
            data = {"error": {"Error": name, "Cause": sync_create_cause(refused(code, message, "r-1"))}}
            assert evaluate_rule(rule, data, {}) is expected, (choice, code)
