"""The offline runtime answers only its own caller (issue 23): every refusal over real HTTP.

A runtime starts once for the module; its gateway and its moto server are asked with raw HTTP
(unsigned, foreign Host, altered after signing, a forged forward mark) and with boto3 signing as the
runtime, as another key or with a wrong secret. Processing jobs go to a job backend that records what
it was asked to run, so a refused request is seen never to reach it.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import stat
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from d2ops.local import container_entry
from d2ops.local import jobs as local_jobs
from d2ops.local.serving import LocalEndpoint
from d2ops.offline.aws_endpoint import FORWARDED_HEADER
from d2ops.offline.runtime import RUNTIME_INFO, OfflineRuntime
from d2ops.offline.services.sagemaker_jobs import JobOutcome
from d2ops.offline.stack import REGION

# What the pipeline's evaluation job runs (functions/prepare_training plans it; tests/unit/test_platform_gpu.py).
PIPELINE_ENTRYPOINT = ["/usr/local/bin/cuda-compat", "python", "-m", "model_code.evaluation.job"]
LIST_JOBS = "SageMaker.ListProcessingJobs"
NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"})


class _RecordingJobs:
    """Processing jobs that only record the request they were asked to run."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        raise AssertionError("no training here")

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        self.ran.append(request)
        return JobOutcome(failure_reason=None, processing_outputs={})


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OfflineRuntime, _RecordingJobs]]:
    jobs = _RecordingJobs()
    with OfflineRuntime(tmp_path_factory.mktemp("caller") / "work", jobs=jobs) as rt:
        yield rt, jobs


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _send(url: str, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One request to 127.0.0.1:<port of url>, with exactly ``headers`` (a Host header among them)."""
    connection = http.client.HTTPConnection("127.0.0.1", _port(url), timeout=30)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            connection.putheader(key, value)
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _signed(credentials: Credentials, service: str, host: str, target: str, document: dict[str, Any],
            path: str = "/") -> tuple[bytes, dict[str, str]]:
    """(body, headers) of an AWS JSON 1.1 request signed by ``credentials`` for ``http://<host><path>``."""
    body = json.dumps(document).encode()
    request = AWSRequest(method="POST", url=f"http://{host}{path}", data=body,
                         headers={"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1"})
    SigV4Auth(credentials, service, REGION).add_auth(request)
    return body, {"Host": host, **dict(request.headers.items())}


def _raw_signed(rt: OfflineRuntime, target: str, document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A request signed by the runtime's credentials, sent as it is (the test suite's boto3 checks
    requests against the AWS contract before sending them; a hostile caller does not)."""
    body, headers = _signed(rt.credentials, "sagemaker", f"127.0.0.1:{_port(rt.gateway.url)}", target, document)
    status, _, answer = _send(rt.gateway.url, "POST", "/", body, headers)
    return status, json.loads(answer)


def _sagemaker(rt: OfflineRuntime, credentials: Credentials | None = None) -> Any:
    if credentials is None:
        return rt.client("sagemaker")
    return boto3.client("sagemaker", region_name=REGION, endpoint_url=rt.gateway.url, config=NO_RETRIES,
                        aws_access_key_id=credentials.access_key, aws_secret_access_key=credentials.secret_key,
                        aws_session_token=credentials.token)


def _refused(call: Any, **kwargs: Any) -> tuple[int, str, str]:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    error = info.value.response["Error"]
    return info.value.response["ResponseMetadata"]["HTTPStatusCode"], error["Code"], error["Message"]


def _processing_job(rt: OfflineRuntime, name: str, entrypoint: list[str] | None) -> dict[str, Any]:
    app: dict[str, Any] = {"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/d2ops-training:offline"}
    if entrypoint is not None:
        app["ContainerEntrypoint"] = entrypoint
    return {"ProcessingJobName": name, "RoleArn": "arn:aws:iam::123456789012:role/d2ops-EvaluationJobRole",
            "AppSpecification": app,
            "ProcessingResources": {"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large",
                                                      "VolumeSizeInGB": 1}}}


def test_each_runtime_has_its_own_credentials_in_a_private_runtime_json(
        runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    """Mutation caught: the fixed dummy credentials back (or runtime.json readable by others)."""
    rt, _ = runtime
    assert rt.credentials.access_key != "offline" and len(rt.credentials.secret_key) >= 40
    info_path = rt.work_dir / RUNTIME_INFO
    assert stat.S_IMODE(info_path.stat().st_mode) == 0o600
    assert json.loads(info_path.read_text("utf-8"))["credentials"] == {
        "AWS_ACCESS_KEY_ID": rt.credentials.access_key, "AWS_SECRET_ACCESS_KEY": rt.credentials.secret_key,
        "AWS_SESSION_TOKEN": rt.credentials.token}
    # What every runtime accepted before: refused now.
    status, code, _ = _refused(_sagemaker(rt, Credentials("offline", "offline", "offline")).list_processing_jobs)
    assert (status, code) == (400, "UnrecognizedClientException")


def test_unsigned_requests_are_refused_before_any_service(runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    rt, _ = runtime
    host = f"127.0.0.1:{_port(rt.gateway.url)}"
    status, _, body = _send(rt.gateway.url, "POST", "/", b"{}", {"Host": host, "X-Amz-Target": LIST_JOBS,
                                                                  "Content-Type": "application/x-amz-json-1.1"})
    assert (status, json.loads(body)) == (400, {"__type": "MissingAuthenticationTokenException",
                                                "message": "Missing Authentication Token"})
    # SageMaker Runtime (REST JSON): the error type in x-amzn-ErrorType, HTTP 403.
    status, headers, body = _send(rt.gateway.url, "POST", "/endpoints/d2ops-detector/invocations", b"{}",
                                  {"Host": host, "Content-Type": "application/json"})
    assert (status, headers["x-amzn-errortype"]) == (403, "MissingAuthenticationTokenException")


def test_an_unknown_key_and_a_wrong_secret_are_refused(runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    rt, _ = runtime
    stranger = Credentials("ASIASTRANGERSTRANGER", "x" * 40, rt.credentials.token)
    assert _refused(_sagemaker(rt, stranger).list_processing_jobs) == (
        400, "UnrecognizedClientException", "The security token included in the request is invalid.")
    forged = Credentials(rt.credentials.access_key, "not-the-secret", rt.credentials.token)
    status, code, message = _refused(_sagemaker(rt, forged).list_processing_jobs)
    assert (status, code) == (400, "InvalidSignatureException")
    assert message.startswith("The request signature we calculated does not match")
    # Step Functions too (the same check, before the interpreter's service).
    sfn = boto3.client("stepfunctions", region_name=REGION, endpoint_url=rt.gateway.url, config=NO_RETRIES,
                       aws_access_key_id=forged.access_key, aws_secret_access_key=forged.secret_key,
                       aws_session_token=forged.token)
    assert _refused(sfn.list_state_machines)[:2] == (400, "InvalidSignatureException")


def test_only_the_endpoints_own_host_is_answered(runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    """A page that reaches the port by its own name (DNS rebinding) sends that name as Host."""
    rt, _ = runtime
    port = _port(rt.gateway.url)
    for host in (f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", f"localhost.evil.example:{port}"):
        # Even correctly signed (for the host it names), a foreign Host is refused.
        body, headers = _signed(rt.credentials, "sagemaker", host, LIST_JOBS, {})
        status, _, answer = _send(rt.gateway.url, "POST", "/", body, headers)
        refusal = json.loads(answer)
        assert (status, refusal["__type"]) == (403, "AccessDeniedException"), host
        assert repr(host) in refusal["message"] and "\n" not in refusal["message"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        body, headers = _signed(rt.credentials, "sagemaker", host, LIST_JOBS, {})
        status, _, answer = _send(rt.gateway.url, "POST", "/", body, headers)
        assert status == 200 and "ProcessingJobSummaries" in json.loads(answer), host


def test_names_outside_sagemakers_patterns_never_reach_a_path(runtime: tuple[OfflineRuntime, _RecordingJobs],
                                                             tmp_path: Path) -> None:
    """Mutation caught: the check gone (a job's directory is work_dir/jobs/<name>: this one escapes it)."""
    rt, jobs = runtime
    escape = (rt.work_dir / "jobs" / "../../../tmp/x").resolve()
    status, answer = _raw_signed(rt, "SageMaker.CreateProcessingJob",
                                 _processing_job(rt, "../../../tmp/x", PIPELINE_ENTRYPOINT))
    assert (status, answer) == (400, {
        "__type": "ValidationException",
        "message": "1 validation error detected: params.ProcessingJobName: '../../../tmp/x' does not match the "
                   "pattern [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"})
    assert not escape.exists() and not jobs.ran
    # Nested members are named by their path; a Describe with such a name is refused the same way.
    bad = {**_processing_job(rt, "fine-name", None), "RoleArn": "../role",
           "ProcessingResources": {"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large",
                                                     "VolumeSizeInGB": 1, "VolumeKmsKeyId": "not a key"}}}
    status, answer = _raw_signed(rt, "SageMaker.CreateProcessingJob", bad)
    assert status == 400 and answer["message"].startswith("2 validation errors detected: ")
    assert "params.RoleArn: '../role'" in answer["message"]
    assert "params.ProcessingResources.ClusterConfig.VolumeKmsKeyId" in answer["message"]
    status, answer = _raw_signed(rt, "SageMaker.DescribeProcessingJob", {"ProcessingJobName": "a/../b"})
    assert (status, answer["__type"]) == (400, "ValidationException")
    # A member in a REST path (SageMaker Runtime's EndpointName), answered in that protocol's shape.
    host = f"127.0.0.1:{_port(rt.gateway.url)}"
    request = AWSRequest(method="POST", url=f"http://{host}/endpoints/a_b/invocations", data=b"{}",
                         headers={"Content-Type": "application/json"})
    SigV4Auth(rt.credentials, "sagemaker", REGION).add_auth(request)
    status, headers, raw = _send(rt.gateway.url, "POST", "/endpoints/a_b/invocations", b"{}",
                                 {"Host": host, **dict(request.headers.items())})
    assert (status, headers["x-amzn-errortype"]) == (400, "ValidationException")
    assert "params.EndpointName: 'a_b'" in json.loads(raw)["message"]


def test_a_processing_job_runs_only_an_entrypoint_the_pipeline_runs(
        runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    """Mutation caught: any ContainerEntrypoint accepted (a local process running `python -c ...` as you)."""
    rt, jobs = runtime
    sagemaker = _sagemaker(rt)
    foreign = ["python", "-c", "import os; os.system('touch /tmp/owned')"]
    status, code, message = _refused(sagemaker.create_processing_job, **_processing_job(rt, "foreign", foreign))
    assert (status, code) == (400, "ValidationException")
    assert message.startswith("entrypoint not allowed offline: " + json.dumps(foreign))
    assert json.dumps(PIPELINE_ENTRYPOINT) in message
    assert _refused(sagemaker.describe_processing_job, ProcessingJobName="foreign")[1] == "ValidationException"
    assert not jobs.ran and not (rt.work_dir / "jobs" / "foreign").exists()
    # The pipeline's own entrypoint (and none: the image's) still runs, signed by the runtime's credentials.
    for name, entrypoint in (("evaluation", PIPELINE_ENTRYPOINT), ("image-default", None)):
        sagemaker.create_processing_job(**_processing_job(rt, name, entrypoint))
    for _ in range(600):
        if len(jobs.ran) == 2:
            break
        threading.Event().wait(0.05)
    assert [job["ProcessingJobName"] for job in jobs.ran] == ["evaluation", "image-default"]


def test_moto_serves_no_web_origin_and_no_foreign_host(runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    """Mutation caught: moto's global CORS back (a page could read the offline buckets) or any Host answered."""
    rt, _ = runtime
    bucket = rt.stack.data_bucket
    host = f"127.0.0.1:{_port(rt.moto_url)}"
    preflight = {"Host": host, "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"}
    status, headers, _ = _send(rt.moto_url, "OPTIONS", f"/{bucket}", b"", preflight)
    assert status == 403 and not any(k.startswith("access-control-") for k in headers)
    status, headers, _ = _send(rt.moto_url, "GET", f"/{bucket}", b"", {"Host": host, "Origin": "http://evil.example"})
    assert status == 403 and "access-control-allow-origin" not in headers
    status, _, body = _send(rt.moto_url, "GET", f"/{bucket}", b"", {"Host": f"evil.example:{_port(rt.moto_url)}"})
    assert status == 403 and b"is not this offline endpoint" in body
    # boto3 (no Origin, its own Host) is served as before.
    assert bucket in [b["Name"] for b in rt.client("s3").list_buckets()["Buckets"]]


def _training_job(rt: OfflineRuntime, name: str) -> dict[str, Any]:
    return {"TrainingJobName": name, "RoleArn": "arn:aws:iam::123456789012:role/d2ops-TrainingJobRole",
            "AlgorithmSpecification": {"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/d2ops-training:"
                                                        "offline", "TrainingInputMode": "File"},
            "OutputDataConfig": {"S3OutputPath": f"s3://{rt.stack.artifacts_bucket}/out"},
            "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60}}


def test_a_jobs_environment_cannot_change_which_code_it_loads(
        runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    """Mutation caught: Environment passed through unchecked (PYTHONPATH with a sitecustomize.py of the
    caller's runs inside the allowed entrypoint; LD_PRELOAD loads a library into any process)."""
    rt, jobs = runtime
    ran = len(jobs.ran)
    cases = [("SageMaker.CreateProcessingJob", _processing_job(rt, "env-python", PIPELINE_ENTRYPOINT),
              "PYTHONPATH"),
             ("SageMaker.CreateProcessingJob", _processing_job(rt, "env-loader", PIPELINE_ENTRYPOINT), "LD_PRELOAD"),
             ("SageMaker.CreateProcessingJob", _processing_job(rt, "env-path", None), "PATH"),
             ("SageMaker.CreateTrainingJob", _training_job(rt, "env-train"), "PYTHONSTARTUP"),
             ("SageMaker.CreateTrainingJob", _training_job(rt, "env-shell"), "BASH_ENV")]
    for target, document, key in cases:
        document["Environment"] = {"MAX_IMAGE_PIXELS": "1000", key: "/tmp/elsewhere"}
        status, answer = _raw_signed(rt, target, document)
        assert (status, answer["__type"]) == (400, "ValidationException"), key
        assert answer["message"].startswith(f"Environment: variable {key!r} not allowed offline"), answer
    # A model's container (the local TorchServe) the same way.
    model = {"ModelName": "env-model", "ExecutionRoleArn": "arn:aws:iam::123456789012:role/x",
             "PrimaryContainer": {"Image": "x", "Environment": {"DYLD_INSERT_LIBRARIES": "/tmp/x.dylib"}}}
    status, answer = _raw_signed(rt, "SageMaker.CreateModel", model)
    assert status == 400 and answer["message"].startswith("PrimaryContainer.Environment: variable "
                                                          "'DYLD_INSERT_LIBRARIES' not allowed offline")
    assert len(jobs.ran) == ran and not (rt.work_dir / "jobs" / "env-python").exists()
    # The pipeline's own variables (the image rule's, the gate's) still pass.
    document = _processing_job(rt, "env-pipeline", PIPELINE_ENTRYPOINT)
    document["Environment"] = {"MAX_IMAGE_PIXELS": "1000", "GATE_CONFIDENCE": "0.9"}
    assert _raw_signed(rt, "SageMaker.CreateProcessingJob", document)[0] == 200
    for _ in range(600):  # it runs (and the next test counts from there)
        if len(jobs.ran) == ran + 1:
            break
        threading.Event().wait(0.05)
    assert jobs.ran[-1]["ProcessingJobName"] == "env-pipeline"


def test_names_that_become_job_directories_are_plain_names(runtime: tuple[OfflineRuntime, _RecordingJobs],
                                                          tmp_path: Path) -> None:
    """Mutation caught: InputName/OutputName/ChannelName or a LocalPath's '..' unchecked (an input named
    by a relative path was downloaded outside the job's directory: SageMaker's own pattern allows it)."""
    rt, jobs = runtime
    ran = len(jobs.ran)
    rt.client("s3").put_object(Bucket=rt.stack.artifacts_bucket, Key="names/in/planted.txt", Body=b"x")
    victim = tmp_path / "victim"
    escape = os.path.relpath(victim, rt.work_dir / "jobs" / "names-in" / "inputs")
    source = {"S3Uri": f"s3://{rt.stack.artifacts_bucket}/names/in/", "LocalPath": "/opt/ml/processing/input/x",
              "S3DataType": "S3Prefix", "S3InputMode": "File"}
    for name in (escape, "..", ".", "a/b"):
        document = _processing_job(rt, "names-in", PIPELINE_ENTRYPOINT)
        document["ProcessingInputs"] = [{"InputName": name, "S3Input": source}]
        status, answer = _raw_signed(rt, "SageMaker.CreateProcessingJob", document)
        assert (status, answer["__type"]) == (400, "ValidationException"), name
        assert answer["message"].startswith(f"ProcessingInputs[0].InputName: {name!r} not allowed offline"), name
    output = {"S3Uri": f"s3://{rt.stack.artifacts_bucket}/names/out", "LocalPath": "/opt/ml/processing/output",
              "S3UploadMode": "EndOfJob"}
    document = _processing_job(rt, "names-out", PIPELINE_ENTRYPOINT)
    document["ProcessingOutputConfig"] = {"Outputs": [{"OutputName": "..", "S3Output": output}]}
    assert _raw_signed(rt, "SageMaker.CreateProcessingJob", document)[1]["message"].startswith(
        "ProcessingOutputConfig.Outputs[0].OutputName: '..' not allowed offline")
    escaping = {**output, "LocalPath": "/opt/ml/processing/output/../../../../home"}
    document["ProcessingOutputConfig"] = {"Outputs": [{"OutputName": "metrics", "S3Output": escaping}]}
    status, answer = _raw_signed(rt, "SageMaker.CreateProcessingJob", document)
    assert status == 400 and answer["message"].startswith(
        "ProcessingOutputConfig.Outputs[0].S3Output.LocalPath: '/opt/ml/processing/output/../../../../home' "
        "not allowed offline")
    training = _training_job(rt, "names-train")
    training["InputDataConfig"] = [{"ChannelName": "..", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": f"s3://{rt.stack.artifacts_bucket}/names/in/"}}}]
    status, answer = _raw_signed(rt, "SageMaker.CreateTrainingJob", training)
    assert status == 400 and answer["message"].startswith("InputDataConfig[0].ChannelName: '..' not allowed offline")
    assert len(jobs.ran) == ran and not victim.exists()


def test_jobs_and_endpoints_run_without_the_runtimes_credentials(runtime: tuple[OfflineRuntime, _RecordingJobs],
                                                                 tmp_path: Path) -> None:
    """Mutation caught: a local job's or TorchServe's environment copied from the runtime's process (which
    holds the runtime's credentials: a job's code could sign requests to the endpoint as the runtime)."""
    rt, _ = runtime
    secrets = {rt.credentials.access_key, rt.credentials.secret_key, rt.credentials.token}
    assert secrets <= set(os.environ.values())  # this process holds them (boto3 in-process reads them)
    data = tmp_path / "data"
    data.mkdir()
    processing = local_jobs.ProcessingJobSpec(job_name="e", inputs={"val": data}, work_dir=tmp_path / "root",
                                              output_dir=tmp_path / "out", environment={"MAX_IMAGE_PIXELS": "1"})
    training = local_jobs.TrainingJobSpec(job_name="t", channels={"train": data}, work_dir=tmp_path / "w",
                                          output_dir=tmp_path / "o")
    served = LocalEndpoint(tmp_path / "model.tar.gz", workdir=tmp_path / "serve", environment={"MAX_IMAGE_PIXELS": "1"})
    for env in (local_jobs.prepare_processing(processing)[1],
                local_jobs.prepare_training_host(training, "algo-1", 41000)[1], served.environment()):
        assert not secrets & set(env.values())
        assert not set(container_entry.HOST_CREDENTIAL_VARIABLES) & set(env)
        assert env["AWS_ENDPOINT_URL"] == rt.moto_url  # the rest of the runtime's environment still reaches them


# ----- moto's port: only requests signed with the runtime's credentials (MotoCallerCheck) ---------------------
class _TrailerSigner(S3SigV4Auth):
    """S3's signer as botocore signs a body with a trailing checksum (over TLS; this endpoint is plain HTTP)."""

    def payload(self, request: AWSRequest) -> str:
        return "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


def _moto(rt: OfflineRuntime, service: str, credentials: Credentials | None, region: str = REGION) -> Any:
    """A boto3 client straight to moto's port, signing as ``credentials`` (None: unsigned)."""
    if credentials is None:
        return boto3.client(service, region_name=region, endpoint_url=rt.moto_url,
                            config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1, "mode": "standard"}))
    return boto3.client(service, region_name=region, endpoint_url=rt.moto_url, config=NO_RETRIES,
                        aws_access_key_id=credentials.access_key, aws_secret_access_key=credentials.secret_key,
                        aws_session_token=credentials.token)


def _s3_signed(rt: OfflineRuntime, method: str, path: str, body: bytes = b"",
               headers: dict[str, str] | None = None, signer: type[S3SigV4Auth] = S3SigV4Auth) -> dict[str, str]:
    """The headers (Host among them) of an S3 request to moto signed by the runtime as botocore signs it."""
    host = f"127.0.0.1:{_port(rt.moto_url)}"
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=dict(headers or {}))
    signer(rt.credentials, "s3", REGION).add_auth(request)
    return {"Host": host, **dict(request.headers.items())}


@pytest.fixture(scope="module")
def private_object(runtime: tuple[OfflineRuntime, _RecordingJobs]) -> tuple[str, str]:
    rt, _ = runtime
    rt.client("s3").put_object(Bucket=rt.stack.data_bucket, Key="private/x.txt", Body=b"private")
    return rt.stack.data_bucket, "private/x.txt"


def test_moto_refuses_unsigned_requests(runtime: tuple[OfflineRuntime, _RecordingJobs],
                                        private_object: tuple[str, str]) -> None:
    """Mutation caught: moto's port served without the signature check (any local process read the buckets)."""
    rt, _ = runtime
    bucket, key = private_object
    status, _, body = _send(rt.moto_url, "GET", f"/{bucket}/{key}", b"", {"Host": f"127.0.0.1:{_port(rt.moto_url)}"})
    assert status == 403 and b"<Code>AccessDenied</Code>" in body and b"private" not in body.split(b"</Code>")[1]
    s3 = _moto(rt, "s3", None)
    assert _refused(s3.list_buckets)[:2] == (403, "AccessDenied")
    assert _refused(s3.get_object, Bucket=bucket, Key=key)[:2] == (403, "AccessDenied")
    # AWS JSON (DynamoDB: the endpoint lease's table), the query protocol (SNS) and RPC v2 CBOR (CloudWatch).
    assert _refused(_moto(rt, "dynamodb", None).list_tables)[:2] == (400, "MissingAuthenticationTokenException")
    assert _refused(_moto(rt, "sns", None).list_topics)[:2] == (403, "MissingAuthenticationToken")
    assert _refused(_moto(rt, "cloudwatch", None).describe_alarms)[:2] == (400, "MissingAuthenticationTokenException")


def test_moto_refuses_another_key_a_wrong_secret_and_another_region(
        runtime: tuple[OfflineRuntime, _RecordingJobs], private_object: tuple[str, str]) -> None:
    """Mutation caught: any well-formed signature accepted (key, secret or region not the runtime's)."""
    rt, _ = runtime
    bucket, key = private_object
    stranger = Credentials("ASIASTRANGERSTRANGER", "x" * 40, rt.credentials.token)
    assert _refused(_moto(rt, "s3", stranger).get_object, Bucket=bucket, Key=key) == (
        403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    assert _refused(_moto(rt, "dynamodb", stranger).list_tables)[:2] == (400, "UnrecognizedClientException")
    assert _refused(_moto(rt, "sns", stranger).list_topics)[:2] == (403, "InvalidClientTokenId")
    assert _refused(_moto(rt, "cloudwatch", stranger).describe_alarms)[:2] == (400, "UnrecognizedClientException")
    forged = Credentials(rt.credentials.access_key, "not-the-secret", rt.credentials.token)
    status, code, message = _refused(_moto(rt, "s3", forged).get_object, Bucket=bucket, Key=key)
    assert (status, code) == (403, "SignatureDoesNotMatch")
    assert message.startswith("The request signature we calculated does not match")
    assert _refused(_moto(rt, "dynamodb", forged).list_tables)[:2] == (400, "InvalidSignatureException")
    assert _refused(_moto(rt, "sns", forged).list_topics)[:2] == (403, "SignatureDoesNotMatch")
    elsewhere = _refused(_moto(rt, "dynamodb", rt.credentials, region="eu-west-1").list_tables)
    assert elsewhere == (400, "InvalidSignatureException",
                         "Credential should be scoped to a valid region, not 'eu-west-1'.")


def test_moto_refuses_a_signed_request_whose_path_header_or_body_changed(
        runtime: tuple[OfflineRuntime, _RecordingJobs], private_object: tuple[str, str]) -> None:
    """Mutation caught: the signature checked against something other than what was sent (the path, a signed
    header's value, the body's hash), or S3's payload hash taken on trust."""
    rt, _ = runtime
    bucket, key = private_object
    s3 = rt.client("s3")
    headers = _s3_signed(rt, "GET", f"/{bucket}/{key}")
    assert _send(rt.moto_url, "GET", f"/{bucket}/{key}", b"", headers)[2] == b"private"  # as signed: served
    status, _, body = _send(rt.moto_url, "GET", f"/{bucket}/private/other.txt", b"", headers)
    assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body
    put = _s3_signed(rt, "PUT", f"/{bucket}/altered.txt", b"mine", {"x-amz-meta-owner": "me"})
    status, _, body = _send(rt.moto_url, "PUT", f"/{bucket}/altered.txt", b"mine", {**put, "x-amz-meta-owner": "you"})
    assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body
    status, _, body = _send(rt.moto_url, "PUT", f"/{bucket}/altered.txt", b"evil", put)  # the hash is mine's
    assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body
    assert _refused(s3.head_object, Bucket=bucket, Key="altered.txt")[1] == "404"
    # A JSON service's body is covered by the signature the same way.
    body_json, signed = _signed(rt.credentials, "dynamodb", f"127.0.0.1:{_port(rt.moto_url)}",
                                "DynamoDB_20120810.ListTables", {})
    status, _, answer = _send(rt.moto_url, "POST", "/", b'{"Limit": 1}', signed)
    assert (status, json.loads(answer)["__type"]) == (400, "InvalidSignatureException")
    assert _send(rt.moto_url, "POST", "/", body_json, signed)[0] == 200


def test_moto_serves_the_runtimes_own_clients(runtime: tuple[OfflineRuntime, _RecordingJobs]) -> None:
    """Mutation caught: S3 checked by the generic signer (a key with '//', '..' or a space is normalised and
    refused), or a body S3 does not hash (botocore's trailing checksum) refused."""
    rt, _ = runtime
    bucket = rt.stack.artifacts_bucket
    s3 = rt.client("s3")
    key = "dir//a b/../c+d%é.txt"
    s3.put_object(Bucket=bucket, Key=key, Body=b"payload")  # botocore's default checksum (x-amz-checksum-crc32)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"payload"
    assert key in [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["Contents"]]
    # An aws-chunked body with a trailing checksum, as botocore sends a PutObject over TLS.
    data = b"trailed"
    checksum = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    chunked = f"{len(data):x}\r\n".encode() + data + f"\r\n0\r\nx-amz-checksum-crc32:{checksum}\r\n\r\n".encode()
    headers = _s3_signed(rt, "PUT", f"/{bucket}/trailed.txt", chunked, {
        "Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(len(data)),
        "X-Amz-Trailer": "x-amz-checksum-crc32"}, signer=_TrailerSigner)
    assert headers["X-Amz-Content-SHA256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    assert _send(rt.moto_url, "PUT", f"/{bucket}/trailed.txt", chunked, headers)[0] == 200
    assert s3.get_object(Bucket=bucket, Key="trailed.txt")["Body"].read() == data
    dynamodb = rt.client("dynamodb")
    table = next(iter(rt.stack.tables))
    key_name = rt.stack.tables[table]["KeySchema"][0]["AttributeName"]
    dynamodb.put_item(TableName=table, Item={key_name: {"S": "caller-check"}})
    assert dynamodb.get_item(TableName=table, Key={key_name: {"S": "caller-check"}})["Item"]
    dynamodb.delete_item(TableName=table, Key={key_name: {"S": "caller-check"}})


def test_requests_the_endpoint_forwards_reach_moto_and_a_forged_mark_does_not(
        runtime: tuple[OfflineRuntime, _RecordingJobs], private_object: tuple[str, str]) -> None:
    """Mutation caught: the forwarder without the runtime's secret (SageMaker's records unreachable: its
    signature names the endpoint's Host), or the mark let through without comparing its value."""
    rt, _ = runtime
    sagemaker = _sagemaker(rt)
    assert sagemaker.describe_model_package_group(ModelPackageGroupName=rt.stack.model_package_group)
    model = {"ModelName": "forwarded", "ExecutionRoleArn": "arn:aws:iam::123456789012:role/x",
             "PrimaryContainer": {"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/d2ops-serving:offline"}}
    sagemaker.create_model(**model)
    # The second create is forwarded as a DescribeModel (target and body rewritten), then refused as SageMaker does.
    status, code, message = _refused(sagemaker.create_model, **model)
    assert (status, code) == (400, "ValidationException") and message.startswith("Cannot create already existing")
    bucket, key = private_object
    host = f"127.0.0.1:{_port(rt.moto_url)}"
    status, _, body = _send(rt.moto_url, "GET", f"/{bucket}/{key}", b"", {"Host": host, FORWARDED_HEADER: "guess"})
    assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body and FORWARDED_HEADER.encode() in body
    # The mark decides, not the signature beside it: a forged one is refused even on a signed request.
    signed = _s3_signed(rt, "GET", f"/{bucket}/{key}")
    assert _send(rt.moto_url, "GET", f"/{bucket}/{key}", b"", {**signed, FORWARDED_HEADER: "guess"})[0] == 403
