"""A Distributed Map run by the offline runtime: its ItemReader and ResultWriter reach the runtime's moto S3."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from d2ops.asl import StateMachine
from d2ops.offline.runtime import OfflineRuntime

pytestmark = pytest.mark.integration

DEFINITION = {"StartAt": "Map", "States": {"Map": {
    "Type": "Map", "Label": "Offline",
    "ItemReader": {"Resource": "arn:aws:states:::s3:getObject", "ReaderConfig": {"InputType": "JSONL"},
                   "Parameters": {"Bucket.$": "$.bucket", "Key": "items.jsonl"}},
    "ItemBatcher": {"MaxItemsPerBatch": 2, "BatchInput": {"run.$": "$$.Execution.Name"}},
    "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"}, "StartAt": "Echo",
                      "States": {"Echo": {"Type": "Pass", "Parameters": {"n.$": "States.ArrayLength($.Items)",
                                                                         "run.$": "$.BatchInput.run"},
                                          "End": True}}},
    "ResultWriter": {"Resource": "arn:aws:states:::s3:putObject",
                     "Parameters": {"Bucket.$": "$.bucket", "Prefix": "results"}},
    "ResultPath": "$.map", "End": True}}}


def test_the_offline_runtime_reads_items_and_writes_results_in_its_own_s3(tmp_path: Path) -> None:
    with OfflineRuntime(tmp_path / "work") as rt:
        s3 = rt.client("s3")
        s3.create_bucket(Bucket="dm-items")
        s3.put_object(Bucket="dm-items", Key="items.jsonl", Body=b"1\n2\n3\n")
        machine = StateMachine.from_definition(DEFINITION, name="dm", region=rt.machine.region,
                                               account_id=rt.machine.account_id)
        rt.sfn.add_state_machine(machine)
        sfn = rt.client("stepfunctions")
        arn = sfn.start_execution(stateMachineArn=machine.arn, name="run-1",
                                  input=json.dumps({"bucket": "dm-items"}))["executionArn"]
        deadline = time.monotonic() + 30
        while (described := sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
            assert time.monotonic() < deadline, "the execution did not end"
            time.sleep(0.1)
        assert described["status"] == "SUCCEEDED", described
        events = sfn.get_execution_history(executionArn=arn)["events"]  # the Map Run events pass the API
        started = next(e for e in events if e["type"] == "MapRunStarted")["mapRunStartedEventDetails"]
        assert started["mapRunArn"].startswith(f"arn:aws:states:{rt.machine.region}:{rt.machine.account_id}:"
                                               "mapRun:dm/Offline:")
        assert [e["type"] for e in events].count("MapRunSucceeded") == 1
        details = json.loads(described["output"])["map"]["ResultWriterDetails"]
        manifest = json.loads(s3.get_object(Bucket=details["Bucket"], Key=details["Key"])["Body"].read())
        (result_file,) = manifest["ResultFiles"]["SUCCEEDED"]
        records = json.loads(s3.get_object(Bucket="dm-items", Key=result_file["Key"])["Body"].read())
        assert [json.loads(r["Output"]) for r in records] == [{"n": 2, "run": "run-1"}, {"n": 1, "run": "run-1"}]
