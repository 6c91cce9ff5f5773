"""Distributed Map in the ASL interpreter against moto's S3 server: readers, selector, batching,
tolerated failures, ResultWriter files, child executions, and ``d2ops asl run`` with an ItemReader."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from d2ops.asl import AslDefinitionError, StateMachine, TaskFailed
from tests.fixtures.moto_server import moto_server

BUCKET = "items"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url, pytest.MonkeyPatch.context() as mp:
        env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "offline", "AWS_SECRET_ACCESS_KEY": "offline",
               "AWS_DEFAULT_REGION": "us-east-1"}
        for key, value in env.items():
            mp.setenv(key, value)
        yield url


@pytest.fixture
def s3(moto_url: str) -> Any:
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)
    client.create_bucket(Bucket=BUCKET)  # again: leaving an in-process mock_aws resets moto's shared backends
    return client


def _map(extra: dict[str, Any], child: dict[str, Any] | None = None, execution_type: str = "STANDARD") -> dict:
    processor = {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": execution_type},
                 "StartAt": "Child", "States": {"Child": child or {"Type": "Pass", "End": True}}}
    return {"StartAt": "Map", "States": {"Map": {"Type": "Map", "ItemProcessor": processor, "End": True, **extra}}}


def _reader(kind: str, key: str, **config: Any) -> dict[str, Any]:
    return {"ItemReader": {"Resource": "arn:aws:states:::s3:getObject", "ReaderConfig": {"InputType": kind, **config},
                           "Parameters": {"Bucket": BUCKET, "Key": key}}}


def _run(definition: dict, data: Any = None, **options: Any) -> Any:
    return StateMachine.from_definition(definition, name="dm").run(data, **options)


def test_json_reader_output_in_item_order_and_history_names_the_map_run(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key="a.json", Body=json.dumps([{"n": i} for i in range(5)]))
    execution = _run(_map({**_reader("JSON", "a.json"), "Label": "Lbl", "MaxConcurrency": 2}))
    assert execution.status == "SUCCEEDED", execution.cause
    assert execution.output == [{"n": i} for i in range(5)]
    types = [e["type"] for e in execution.history]
    assert types == ["ExecutionStarted", "MapStateEntered", "MapStateStarted", "MapRunStarted", "MapRunSucceeded",
                     "MapStateSucceeded", "MapStateExited", "ExecutionSucceeded"]
    started = execution.history[2]["mapStateStartedEventDetails"]
    assert started == {"length": 0}
    arn = execution.history[3]["mapRunStartedEventDetails"]["mapRunArn"]
    assert arn.startswith("arn:aws:states:us-east-1:123456789012:mapRun:dm/Lbl:")
    assert execution.history[6]["previousEventId"] == 5  # MapStateExited follows MapRunSucceeded, as AWS records
    children = execution.map_runs[arn]["executions"]
    assert [c.arn.rsplit(":", 1)[0] for c in children] == ["arn:aws:states:us-east-1:123456789012:execution:dm/Lbl"] * 5


def test_jsonl_csv_given_delimiter_and_max_items(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key="a.jsonl", Body=b'{"k": 1}\n\n{"k": 2}\n{"k": 3}\n')
    assert _run(_map(_reader("JSONL", "a.jsonl", MaxItems=2))).output == [{"k": 1}, {"k": 2}]
    s3.put_object(Bucket=BUCKET, Key="a.csv", Body=b"Col1,Col2\nValue1,Value2\nValue3\nV5,V6,extra\n")
    out = _run(_map(_reader("CSV", "a.csv", CSVHeaderLocation="FIRST_ROW"))).output
    assert out == [{"Col1": "Value1", "Col2": "Value2"}, {"Col1": "Value3", "Col2": ""}, {"Col1": "V5", "Col2": "V6"}]
    s3.put_object(Bucket=BUCKET, Key="b.csv", Body=b"a|b\nc|d\n")
    out = _run(_map(_reader("CSV", "b.csv", CSVHeaderLocation="GIVEN", CSVHeaders=["X", "Y"],
                            CSVDelimiter="PIPE"))).output
    assert out == [{"X": "a", "Y": "b"}, {"X": "c", "Y": "d"}]
    # MaxItemsPath from the input; 0 means no limit.
    definition = _map({**_reader("JSONL", "a.jsonl")})
    definition["States"]["Map"]["ItemReader"]["ReaderConfig"]["MaxItemsPath"] = "$.max"
    assert len(_run(definition, {"max": 0}).output) == 3
    assert len(_run(definition, {"max": 1}).output) == 1


def test_reader_failures_use_the_services_errors(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key="dup.csv", Body=b"x\n")
    failed = _run(_map(_reader("CSV", "dup.csv", CSVHeaderLocation="GIVEN", CSVHeaders=["H", "H"])))
    assert (failed.error, failed.cause) == ("States.ItemReaderFailed", "CSV headers cannot contain duplicates.")
    assert [e["type"] for e in failed.history][-3:] == ["MapRunFailed", "MapStateFailed", "ExecutionFailed"]
    s3.put_object(Bucket=BUCKET, Key="obj.json", Body=b'{"a": 1}')
    failed = _run(_map(_reader("JSON", "obj.json")))
    assert (failed.error, failed.cause) == ("States.ItemReaderFailed", "Attempting to map over non-iterable node.")
    definition = _map(_reader("JSON", "obj.json"))
    definition["States"]["Map"]["ItemReader"]["ReaderConfig"]["MaxItemsPath"] = "$.max"
    negative = _run(definition, {"max": -1})
    assert (negative.error, negative.cause) == ("States.ItemReaderFailed", "field MaxItems must be positive")
    fraction = _run(definition, {"max": 1.5})
    assert fraction.error == "States.Runtime"
    assert fraction.cause.endswith('The MaxItemsPath field refers to value "1.5" which is not a valid integer: $.max')
    missing = _run(_map(_reader("JSON", "no-such.json")))
    assert missing.error == "States.ItemReaderFailed" and "no-such.json" in missing.cause


def test_manifest_and_list_objects_v2(s3: Any) -> None:
    rows = b"src,photos/1.jpg,10\nsrc,photos/2.jpg,20\n"
    s3.put_object(Bucket=BUCKET, Key="inv/data/f1.csv.gz", Body=gzip.compress(rows))
    manifest = {"sourceBucket": "src", "destinationBucket": f"arn:aws:s3:::{BUCKET}", "fileFormat": "CSV",
                "fileSchema": "Bucket, Key, Size", "files": [{"key": "inv/data/f1.csv.gz", "size": 1}]}
    s3.put_object(Bucket=BUCKET, Key="inv/manifest.json", Body=json.dumps(manifest))
    out = _run(_map(_reader("MANIFEST", "inv/manifest.json"))).output
    assert out == [{"Bucket": "src", "Key": "photos/1.jpg", "Size": "10"},
                   {"Bucket": "src", "Key": "photos/2.jpg", "Size": "20"}]
    for name in ("p/file_0.txt", "p/file_1.txt"):
        s3.put_object(Bucket=BUCKET, Key=name, Body=b"hello world!")
    reader = {"ItemReader": {"Resource": "arn:aws:states:::s3:listObjectsV2",
                             "Parameters": {"Bucket.$": "$.bucket", "Prefix": "p/"}}}
    out = _run(_map(reader), {"bucket": BUCKET}).output
    assert [list(item) for item in out] == [["Etag", "LastModified", "Key", "Size", "StorageClass"]] * 2
    assert [(i["Key"], i["Size"], i["StorageClass"]) for i in out] == [("p/file_0.txt", 12, "STANDARD"),
                                                                       ("p/file_1.txt", 12, "STANDARD")]
    assert out[0]["Etag"].startswith('"') and isinstance(out[0]["LastModified"], int)
    # A versioned source is read at the VersionId named in Parameters.
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=BUCKET, Key="v.jsonl", Body=b'"old"\n')["VersionId"]
    s3.put_object(Bucket=BUCKET, Key="v.jsonl", Body=b'"new"\n')
    definition = _map(_reader("JSONL", "v.jsonl"))
    definition["States"]["Map"]["ItemReader"]["Parameters"]["VersionId.$"] = "$.version"
    assert _run(definition, {"version": first}).output == ["old"]


def test_selector_batcher_and_child_context(s3: Any) -> None:
    child = {"Type": "Pass", "Parameters": {"input.$": "$", "exec.$": "$$.Execution.Id", "name.$": "$$.Execution.Name"},
             "End": True}
    extra = {"ItemsPath": "$.items", "ItemSelector": {"v.$": "$$.Map.Item.Value", "i.$": "$$.Map.Item.Index",
                                                      "tag.$": "$.tag"},
             "ItemBatcher": {"MaxItemsPerBatch": 2, "BatchInput": {"run.$": "$.tag"}}}
    execution = _run(_map(extra, child), {"items": ["a", "b", "c"], "tag": "T"})
    assert execution.status == "SUCCEEDED", execution.cause
    inputs = [o["input"] for o in execution.output]
    assert inputs == [{"BatchInput": {"run": "T"}, "Items": [{"v": "a", "i": 0, "tag": "T"},
                                                             {"v": "b", "i": 1, "tag": "T"}]},
                      {"BatchInput": {"run": "T"}, "Items": [{"v": "c", "i": 2, "tag": "T"}]}]
    names = [o["name"] for o in execution.output]
    assert len(set(names)) == 2
    assert all(o["exec"].endswith(f":execution:dm/Map:{o['name']}") for o in execution.output)
    # MaxInputBytesPerBatch splits by the child input's size.
    extra = {"ItemsPath": "$.items", "ItemBatcher": {"MaxInputBytesPerBatch": 40}}
    out = _run(_map(extra), {"items": ["x" * 10, "y" * 10, "z" * 10]}).output
    assert [len(batch["Items"]) for batch in out] == [2, 1]


def _failing(resource: str, parameters: Any, context: Any) -> Any:
    if parameters.get("bad"):
        raise TaskFailed("Bad", f"item {parameters['id']}")
    return parameters["id"]


_TASK = {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True}
_ITEMS = {"items": [{"id": i, "bad": i in (1, 3)} for i in range(6)]}


@pytest.mark.parametrize(("tolerance", "succeeds"), [
    ({}, False), ({"ToleratedFailureCount": 2}, True), ({"ToleratedFailureCount": 1}, False),
    ({"ToleratedFailurePercentage": 34}, True), ({"ToleratedFailurePercentage": 33}, False),
])
def test_tolerated_failures_at_and_over_the_threshold(tolerance: dict[str, Any], succeeds: bool) -> None:
    execution = _run(_map({"ItemsPath": "$.items", **tolerance}, _TASK), _ITEMS,
                     executors={"arn:aws:states:::lambda:invoke": _failing})
    if succeeds:
        assert execution.status == "SUCCEEDED", execution.cause
        # A tolerated failure stays in its item's place as the child's record (the docs' note on COMPACT).
        output = execution.output
        assert [output[i] for i in (0, 2, 4, 5)] == [0, 2, 4, 5]
        assert [(output[i]["Status"], output[i]["Error"], output[i]["Cause"]) for i in (1, 3)] == [
            ("FAILED", "Bad", "item 1"), ("FAILED", "Bad", "item 3")]
    else:
        assert (execution.error, execution.cause) == ("States.ExceedToleratedFailureThreshold",
                                                      "The specified tolerated failure threshold was exceeded")
        failed = next(e for e in execution.history if e["type"] == "MapRunFailed")
        assert failed["mapRunFailedEventDetails"]["error"] == "States.ExceedToleratedFailureThreshold"


def test_tolerance_path_errors_are_the_services_words() -> None:
    definition = _map({"ItemsPath": "$.items", "ToleratedFailureCountPath": "$.n"})
    bad = _run(definition, {"items": [0], "n": "NoNumber"})
    assert bad.cause.endswith('The ToleratedFailureCountPath field refers to value "NoNumber" which is not a '
                              "valid integer: $.n")
    assert _run(definition, {"items": [0], "n": -1}).cause.endswith("ToleratedFailureCount cannot be negative.")
    definition = _map({"ItemsPath": "$.items", "ToleratedFailurePercentagePath": "$.n"})
    assert _run(definition, {"items": [0], "n": 100.1}).cause.endswith(
        "ToleratedFailurePercentage must be between 0 and 100.")
    assert _run(definition, {"items": [0], "n": 1.1}).status == "SUCCEEDED"


def test_result_writer_files_and_manifest(s3: Any) -> None:
    extra = {"ItemsPath": "$.items", "ToleratedFailureCount": 5, "MaxConcurrency": 3,
             "ResultWriter": {"Resource": "arn:aws:states:::s3:putObject",
                              "Parameters": {"Bucket": BUCKET, "Prefix.$": "$.prefix"}}}
    execution = _run(_map(extra, _TASK, "EXPRESS"), {**_ITEMS, "prefix": "runs/r1/results"},
                     executors={"arn:aws:states:::lambda:invoke": _failing})
    assert execution.status == "SUCCEEDED", execution.cause
    arn = execution.output["MapRunArn"]
    run_id = arn.rsplit(":", 1)[1]
    key = f"runs/r1/results/{run_id}/manifest.json"
    assert execution.output == {"MapRunArn": arn, "ResultWriterDetails": {"Bucket": BUCKET, "Key": key}}
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    assert manifest["DestinationBucket"] == BUCKET and manifest["MapRunArn"] == arn
    files = manifest["ResultFiles"]
    assert files["PENDING"] == [] and [f["Key"] for f in files["SUCCEEDED"]] == [
        f"runs/r1/results/{run_id}/SUCCEEDED_0.json"]
    body = s3.get_object(Bucket=BUCKET, Key=files["SUCCEEDED"][0]["Key"])["Body"].read()
    assert files["SUCCEEDED"][0]["Size"] == len(body)
    succeeded = json.loads(body)
    assert [json.loads(r["Output"]) for r in succeeded] == [0, 2, 4, 5]
    assert {r["Status"] for r in succeeded} == {"SUCCEEDED"}
    assert set(succeeded[0]) >= {"ExecutionArn", "Input", "InputDetails", "Name", "Output", "OutputDetails",
                                 "StartDate", "StateMachineArn", "Status", "StopDate"}
    failed = json.loads(s3.get_object(Bucket=BUCKET, Key=files["FAILED"][0]["Key"])["Body"].read())
    assert [(r["Error"], r["Cause"]) for r in failed] == [("Bad", "item 1"), ("Bad", "item 3")]
    assert "Output" not in failed[0]
    children = execution.children  # Express children's histories are kept offline for inspection
    assert [c.status for c in children] == ["SUCCEEDED", "FAILED", "SUCCEEDED", "FAILED", "SUCCEEDED", "SUCCEEDED"]
    scheduled = [json.loads(e["taskScheduledEventDetails"]["parameters"]) for c in children for e in c.history
                 if e["type"] == "TaskScheduled"]
    assert [p["id"] for p in scheduled] == list(range(6))


def test_express_children_time_out_after_five_minutes() -> None:
    child = {"Type": "Wait", "Seconds": 301, "End": True}
    execution = _run(_map({"ItemsPath": "$", "ToleratedFailureCount": 1}, child, "EXPRESS"), [1])
    assert execution.status == "SUCCEEDED"
    (record,) = execution.output
    assert (record["Status"], record["Error"]) == ("TIMED_OUT", "States.Timeout")
    standard = _run(_map({"ItemsPath": "$"}, child, "STANDARD"), [1])
    assert standard.output == [1]


def test_definition_checks_for_distributed_fields() -> None:
    inline = {"StartAt": "M", "States": {"M": {"Type": "Map", "End": True, "ToleratedFailureCount": 1,
                                               "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Pass",
                                                                                                  "End": True}}}}}}
    with pytest.raises(AslDefinitionError, match="only a Distributed Map"):
        StateMachine.from_definition(inline)
    with pytest.raises(AslDefinitionError, match="ExecutionType"):
        StateMachine.from_definition(_map({}, execution_type="BOGUS"))
    with pytest.raises(AslDefinitionError, match="CSVHeaderLocation"):
        StateMachine.from_definition(_map(_reader("CSV", "k")))
    with pytest.raises(AslDefinitionError, match="ToleratedFailurePercentage"):
        StateMachine.from_definition(_map({"ToleratedFailurePercentage": 101}))
    with pytest.raises(AslDefinitionError, match="putObject"):
        StateMachine.from_definition(_map({"ResultWriter": {"Resource": "arn:aws:states:::s3:getObject",
                                                            "Parameters": {"Bucket": "b"}}}))


def test_asl_run_cli_reads_items_through_aws_endpoint_url(s3: Any, moto_url: str, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="cli.jsonl", Body=b'"a"\n"b"\n')
    definition = tmp_path / "dm.asl.json"
    definition.write_text(json.dumps(_map(_reader("JSONL", "cli.jsonl"))))
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_url}
    done = subprocess.run([sys.executable, "-m", "d2ops", "asl", "run", str(definition), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["a", "b"]


def test_items_path_is_ignored_when_an_item_reader_supplies_the_items(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key="nested.json", Body=json.dumps([["from-bucket"]]))
    definition = _map({**_reader("JSON", "nested.json"), "ItemsPath": "$.other", "MaxConcurrency": 1})
    assert _run(definition, {"other": ["from-input"]}).output == [["from-bucket"]]


def test_real_clock_threads_honour_max_concurrency_and_keep_item_order() -> None:
    import threading
    import time

    from d2ops.asl import Clock

    lock = threading.Lock()
    running, peak = [0], [0]

    def slow(resource: str, parameters: Any, context: Any) -> Any:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05 * (5 - parameters["id"] % 5))  # later items finish first
        with lock:
            running[0] -= 1
        return parameters["id"]

    machine = StateMachine.from_definition(_map({"ItemsPath": "$.items", "MaxConcurrency": 3}, _TASK), name="dm")
    execution = machine.start({"items": [{"id": i} for i in range(10)]}, clock=Clock(),
                              executors={"arn:aws:states:::lambda:invoke": slow})
    assert execution.wait(30)
    assert execution.status == "SUCCEEDED", execution.cause
    assert execution.output == list(range(10))
    assert peak[0] == 3


def test_siblings_stopped_by_the_threshold_are_aborted_and_pending(s3: Any) -> None:
    from d2ops.asl import Clock

    def slow_or_bad(resource: str, parameters: Any, context: Any) -> Any:
        if parameters["id"] == 0:
            raise TaskFailed("Bad", "first")
        context.sleep(5)  # cancelled when the Map Run fails
        return parameters["id"]

    extra = {"ItemsPath": "$.items", "ResultWriter": {"Resource": "arn:aws:states:::s3:putObject",
                                                      "Parameters": {"Bucket": BUCKET, "Prefix": "stop"}}}
    machine = StateMachine.from_definition(_map(extra, _TASK), name="dm")
    execution = machine.start({"items": [{"id": i} for i in range(3)]}, clock=Clock(),
                              executors={"arn:aws:states:::lambda:invoke": slow_or_bad})
    assert execution.wait(30)
    assert execution.error == "States.ExceedToleratedFailureThreshold"
    assert (execution.stop_date - execution.start_date).total_seconds() < 4  # the 5 s siblings were stopped
    (run,) = execution.map_runs.values()
    statuses = sorted(c.status for c in run["executions"])  # a sibling may not have started at all
    assert statuses.count("FAILED") == 1 and set(statuses) <= {"ABORTED", "FAILED"}
    manifest_key = next(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="stop/")["Contents"]
                        if o["Key"].endswith("manifest.json"))
    files = json.loads(s3.get_object(Bucket=BUCKET, Key=manifest_key)["Body"].read())["ResultFiles"]
    assert (len(files["FAILED"]), files["SUCCEEDED"]) == (1, [])
    pending = [json.loads(s3.get_object(Bucket=BUCKET, Key=f["Key"])["Body"].read()) for f in files["PENDING"]]
    assert sum(len(p) for p in pending) == statuses.count("ABORTED")
    assert all(r["Status"] == "ABORTED" for p in pending for r in p)


@pytest.mark.parametrize(("label", "problem"), [
    ("", "Label cannot be empty"), ("x" * 41, "Label cannot exceed 40 characters"),
    ("label_ ", "Label contains invalid character: ' '"), ("label_\x96", "Label contains invalid character: '\\x96'"),
    ("label_:", "Label contains invalid character: ':'"),
])
def test_labels_are_checked_with_the_services_words(label: str, problem: str) -> None:
    with pytest.raises(AslDefinitionError) as raised:
        StateMachine.from_definition(_map({"Label": label}))
    assert raised.value.problems == [f"States.Map.Label: {problem}"]


def test_map_run_is_described_like_describe_map_run() -> None:
    first_of_batch = _TASK | {"Parameters": {"id.$": "$.Items[0].id", "bad.$": "$.Items[0].bad"}}
    execution = _run(_map({"ItemsPath": "$.items", "ToleratedFailurePercentage": 50,
                           "ItemBatcher": {"MaxItemsPerBatch": 2}}, first_of_batch),
                     {"items": [{"id": i, "bad": i == 2} for i in range(5)]},
                     executors={"arn:aws:states:::lambda:invoke": _failing})
    assert execution.status == "SUCCEEDED", execution.cause
    (run,) = execution.map_runs.values()
    assert run["status"] == "SUCCEEDED" and run["toleratedFailurePercentage"] == 50.0
    assert run["executionCounts"] | {} == {"aborted": 0, "failed": 1, "pending": 0, "resultsWritten": 0,
                                           "running": 0, "succeeded": 2, "timedOut": 0, "total": 3}
    assert run["itemCounts"]["failed"] == 2 and run["itemCounts"]["total"] == 5
    assert execution.output[0] == 0 and execution.output[2] == 4 and execution.output[1]["Error"] == "Bad"


def test_aborting_the_parent_aborts_the_map_run_and_its_children() -> None:
    import time

    from d2ops.asl import Clock

    def sleepy(resource: str, parameters: Any, context: Any) -> Any:
        context.sleep(30)
        return parameters["id"]

    machine = StateMachine.from_definition(_map({"ItemsPath": "$.items"}, _TASK), name="dm")
    execution = machine.start({"items": [{"id": i} for i in range(2)]}, clock=Clock(),
                              executors={"arn:aws:states:::lambda:invoke": sleepy})
    deadline = time.monotonic() + 10
    while not any(e["type"] == "MapRunStarted" for e in execution.history) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    execution.abort("Stop", "by the test")
    assert execution.wait(10)
    assert execution.status == "ABORTED"
    assert [e["type"] for e in execution.history][-3:] == ["MapRunAborted", "MapStateAborted", "ExecutionAborted"]


@pytest.mark.parametrize(("config", "expected"), [
    ({"Transformation": "COMPACT"}, [[0, 1], [2]]),
    ({"Transformation": "FLATTEN"}, [0, 1, 2]),
])
def test_writer_config_alone_shapes_the_state_output(config: dict[str, Any], expected: list[Any]) -> None:
    child = {"Type": "Pass", "InputPath": "$.Items", "End": True}
    extra = {"ItemsPath": "$", "ItemBatcher": {"MaxItemsPerBatch": 2}, "ResultWriter": {"WriterConfig": config}}
    assert _run(_map(extra, child), [0, 1, 2]).output == expected


def test_writer_config_none_gives_records_and_jsonl_export(s3: Any) -> None:
    records = _run(_map({"ItemsPath": "$", "ResultWriter": {"WriterConfig": {"Transformation": "NONE"}}}), ["a"])
    assert [(r["Status"], json.loads(r["Output"])) for r in records.output] == [("SUCCEEDED", "a")]
    extra = {"ItemsPath": "$", "ResultWriter": {"WriterConfig": {"Transformation": "FLATTEN", "OutputType": "JSONL"},
                                                "Resource": "arn:aws:states:::s3:putObject",
                                                "Parameters": {"Bucket": BUCKET, "Prefix": "jl"}}}
    child = {"Type": "Pass", "Parameters": {"x.$": "States.Array($, $)"}, "OutputPath": "$.x", "End": True}
    details = _run(_map(extra, child), ["a", "b"]).output["ResultWriterDetails"]
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=details["Key"])["Body"].read())
    (entry,) = manifest["ResultFiles"]["SUCCEEDED"]
    assert entry["Key"].endswith("/SUCCEEDED_0.jsonl")
    body = s3.get_object(Bucket=BUCKET, Key=entry["Key"])["Body"].read().decode()
    assert [json.loads(line) for line in body.splitlines()] == ["a", "a", "b", "b"]


def test_result_writer_needs_writer_config_or_an_export() -> None:
    with pytest.raises(AslDefinitionError, match="cannot be empty"):
        StateMachine.from_definition(_map({"ResultWriter": {}}))
    with pytest.raises(AslDefinitionError, match="Transformation: must be NONE, COMPACT or FLATTEN"):
        StateMachine.from_definition(_map({"ResultWriter": {"WriterConfig": {"Transformation": "ZIP"}}}))

def test_in_process_moto_serves_the_reader_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Path tests without a server: moto's in-process mock intercepts the Map's own S3 client."""
    from moto import mock_aws

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="local")
        s3.put_object(Bucket="local", Key="i.json", Body=b"[1, 2]")
        definition = _map({"ItemReader": {"Resource": "arn:aws:states:::s3:getObject",
                                          "ReaderConfig": {"InputType": "JSON"},
                                          "Parameters": {"Bucket": "local", "Key": "i.json"}}})
        assert _run(definition).output == [1, 2]
