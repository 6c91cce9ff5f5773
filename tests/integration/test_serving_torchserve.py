"""Both servers of the serving image, for real, serving an exported detector through LocalEndpoint:
TorchServe (Java 17 + Python workers) and Ray Serve (a local Ray instance, one replica).

One server per backend for the module, every test run against each: /ping before and after
loading, /invocations and /predictions with real JPEG and PNG images and the JSON form, every
bad input as a 4xx with its message, concurrent requests that the server batches, and the
model's per-class score thresholds as the default. Same requests, same answers: that is the contract.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from d2ops.local.serving import LocalEndpoint
from model_code.serving.backends import BACKENDS
from tests.fixtures.serving.support import (
    CATEGORY_IDS,
    CLASS_NAMES,
    cached_artifact,
    jpeg_bytes,
    png_bytes,
    served_posts,
    server_processes,
    still_running,
    wait_for_log,
)
from tests.fixtures.serving.thresholds import (
    SPLIT_CLASS,
    artifact_with_thresholds,
    expected_by_default,
    split_thresholds,
)

pytestmark = pytest.mark.integration

BATCH_DELAY_MS = 150  # long enough that 8 concurrent requests reliably land in one batch


@pytest.fixture(scope="module", params=BACKENDS)
def served(request, tmp_path_factory):
    """Start the server while watching /ping from outside; yields (endpoint, observed ping answers)."""
    workdir = tmp_path_factory.mktemp(f"serving-{request.param}")
    # The cached detector with per-class thresholds that split its own detections (the other tests here send
    # score_threshold=0, so only test_default_is_the_model_s_per_class_thresholds sees them).
    model = artifact_with_thresholds(tmp_path_factory.mktemp("thresholds"), split_thresholds(), pack=True)
    endpoint = LocalEndpoint(model, batch_size=8, max_batch_delay_ms=BATCH_DELAY_MS,
                             workdir=workdir, startup_timeout=240, backend=request.param)
    pings: list[tuple[int | None, str]] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                r = requests.get(endpoint.ping_url, timeout=2)
                pings.append((r.status_code, r.text))
                if r.status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):  # a busy frontend may answer late
                pings.append((None, ""))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        endpoint.start()
    except BaseException:
        done.set()
        raise
    finally:
        # Once start() has seen 200 the watcher's next poll sees it too; stopping it at that
        # moment instead could leave a 503 from just before readiness as its last answer.
        watcher.join(timeout=30)
        done.set()
    yield endpoint, pings
    processes = server_processes(endpoint)
    endpoint.stop()
    # Catches a stop that leaves the server's group running (Ray's raylet or replicas, TorchServe's Java).
    assert len(processes) > 2 and still_running(processes) == [], "processes left after stop"


def post(url, data, content_type, **kwargs):
    return requests.post(url, data=data, headers={"Content-Type": content_type, **kwargs.pop("headers", {})},
                         timeout=60, **kwargs)


def test_ping_is_unhealthy_until_the_model_is_loaded_and_warm(served):
    endpoint, pings = served
    statuses = [code for code, _ in pings]
    assert statuses[-1] == 200
    loading = [text for code, text in pings if code == 503]
    assert loading, f"/ping never answered 503 while loading: {statuses}"
    assert "still loading" in loading[0]
    # Never a 200 before the last answer. Ray Serve's proxy may listen a moment before the app's route is
    # registered and answer 404 then (unhealthy for SageMaker too); once the route answers it is 503 until ready.
    first_503 = statuses.index(503)
    early = {None, 404} if endpoint.backend == "ray-serve" else {None}
    assert set(statuses[:first_503]) <= early and set(statuses[first_503:-1]) <= {None, 503}, statuses
    assert "warm-up done" in wait_for_log(endpoint, "warm-up done")


def test_invocations_with_jpeg_and_png(served):
    endpoint, _ = served
    for data, ctype in ((jpeg_bytes(), "image/jpeg"), (png_bytes(200, 100), "image/png"),
                        (png_bytes(), "application/x-image")):
        r = post(endpoint.invocations_url, data, ctype, params={"score_threshold": "0", "max_detections": "4"})
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"] == "application/json"
        body = r.json()
        assert len(body["detections"]) == 4
        for det in body["detections"]:
            assert CLASS_NAMES[CATEGORY_IDS.index(det["class_id"])] == det["class_name"]
            assert len(det["box"]) == 4 and 0 <= det["score"] <= 1
        assert body["image"]["width"] in (160, 200)


def test_default_is_the_model_s_per_class_thresholds_and_a_request_overrides(served):
    # Through TorchServe and SageMaker's header. Catches a server that ignores metadata.json's score_thresholds
    # (0.5 for all: no detection), applies one class's value to all (square's 0.0: all of them), or lets the
    # default win over the request's value.
    endpoint, _ = served
    thresholds = split_thresholds()
    everything = post(endpoint.invocations_url, png_bytes(), "image/png",
                      headers={"X-Amzn-SageMaker-Custom-Attributes": "score_threshold=0;max_detections=1000"}).json()
    default = post(endpoint.invocations_url, png_bytes(), "image/png",
                   headers={"X-Amzn-SageMaker-Custom-Attributes": "max_detections=1000"})
    assert default.status_code == 200, default.text
    expected = expected_by_default(everything["detections"], thresholds)
    assert 0 < len(expected) < len(everything["detections"])
    assert expected != [d for d in everything["detections"] if d["score"] >= 0.5]  # what ignoring them gives
    assert default.json()["detections"] == expected
    assert default.json()["score_thresholds"] == {"source": "model",
                                                  "by_class": {SPLIT_CLASS: thresholds[SPLIT_CLASS]}}
    assert everything["score_thresholds"]["source"] == "request"
    override = post(endpoint.invocations_url, png_bytes(), "image/png", params={"score_threshold": "0"},
                    headers={"X-Amzn-SageMaker-Custom-Attributes": "max_detections=1000"}).json()
    assert override["detections"] == everything["detections"]


def test_predictions_route_and_json_form_agree(served):
    endpoint, _ = served
    raw = post(endpoint.predictions_url, png_bytes(seed=5), "image/png",
               headers={"X-Amzn-SageMaker-Custom-Attributes": "score_threshold=0;max_detections=3"})
    as_json = post(endpoint.invocations_url, json.dumps({"image": base64.b64encode(png_bytes(seed=5)).decode(),
                                                         "score_threshold": 0.0, "max_detections": 3}),
                   "application/json")
    assert raw.status_code == as_json.status_code == 200
    assert raw.json()["detections"] == as_json.json()["detections"] and len(raw.json()["detections"]) == 3


@pytest.mark.parametrize(
    ("data", "content_type", "status", "message"),
    [
        (b"", "image/jpeg", 400, "request body is empty"),
        (b"definitely not an image", "image/png", 415, "is not a JPEG or PNG image"),
        (jpeg_bytes(400, 300)[:4000], "image/jpeg", 400, "truncated or damaged JPEG image (400x300)"),
        (b"{oops", "application/json", 400, "request body is not valid JSON"),
        (b'{"image": "%%%"}', "application/json", 400, "is not valid base64"),
        (json.dumps({"image": base64.b64encode(jpeg_bytes()).decode(), "masks": True}), "application/json", 400,
         "detects boxes only"),
        (jpeg_bytes(), "text/csv", 415, "Content-Type 'text/csv' is not supported"),
    ],
    ids=["empty", "not-an-image", "truncated", "bad-json", "bad-base64", "masks-on-detector", "wrong-type"],
)
def test_bad_input_gets_a_4xx_with_the_reason(served, data, content_type, status, message):
    endpoint, _ = served
    r = post(endpoint.invocations_url, data, content_type)
    assert r.status_code == status
    assert message in r.json()["error"]["message"]


def test_too_many_pixels_and_too_many_bytes_are_413(served):
    endpoint, _ = served
    from tests.unit.test_serving_decode import png_with_size

    r = post(endpoint.invocations_url, png_with_size(8000, 8000), "image/png")
    assert r.status_code == 413 and "8000x8000 (64,000,000 pixels)" in r.json()["error"]["message"]
    r = post(endpoint.invocations_url, b"\0" * (7 * 1024 * 1024), "image/jpeg")
    assert r.status_code == 413 and "the limit is 6291456 bytes" in r.json()["error"]["message"]
    # Beyond max_request_size (config.properties) the server refuses the body itself (SageMaker never sends
    # one): TorchServe's frontend with an empty 413, Ray Serve's route with the same limit and a JSON 413.
    r = post(endpoint.invocations_url, b"\0" * (17 * 1024 * 1024), "image/jpeg")
    assert r.status_code == 413


def test_unknown_option_in_query_string(served):
    endpoint, _ = served
    r = post(endpoint.invocations_url, jpeg_bytes(), "image/jpeg", params={"treshold": "0.2"})
    assert r.status_code == 400 and "unknown option 'treshold' in the query string" in r.json()["error"]["message"]


def test_concurrent_requests_are_batched_and_bad_ones_fail_alone(served):
    endpoint, _ = served
    image = jpeg_bytes(seed=9)
    single = post(endpoint.invocations_url, image, "image/jpeg", params={"score_threshold": "0"})
    assert single.headers["X-D2ops-Batch-Size"] == "1"
    payloads = [(image, "image/jpeg")] * 6 + [(b"junk", "image/jpeg"), (b"", "image/png")]
    barrier = threading.Barrier(len(payloads))

    def send(payload):
        barrier.wait()
        return post(endpoint.invocations_url, payload[0], payload[1], params={"score_threshold": "0"})

    with ThreadPoolExecutor(len(payloads)) as pool:
        responses = list(pool.map(send, payloads))
    sizes = [int(r.headers["X-D2ops-Batch-Size"]) for r in responses]
    assert max(sizes) > 1, f"no request shared a batch: {sizes}"
    assert [r.status_code for r in responses] == [200] * 6 + [415, 400]
    for r in responses[:6]:  # batched answers equal the unbatched one (same image, same size)
        assert [d["class_id"] for d in r.json()["detections"]] == [d["class_id"] for d in single.json()["detections"]]
        assert [d["score"] for d in r.json()["detections"]] == pytest.approx(
            [d["score"] for d in single.json()["detections"]], abs=1e-3)
    # The server's own request log shows the requests went through its inference API
    assert served_posts(endpoint) >= len(payloads)


def test_a_second_endpoint_runs_beside_the_first_and_stops_alone(served, tmp_path):
    """Blue/green locally: green starts on another port while blue serves; stopping green leaves blue up."""
    blue, _ = served
    green = LocalEndpoint(cached_artifact(), workdir=tmp_path / "green", startup_timeout=240, backend=blue.backend)
    with green:
        assert green.port != blue.port
        for endpoint in (blue, green):
            r = post(endpoint.invocations_url, jpeg_bytes(), "image/jpeg", params={"score_threshold": "0"})
            assert r.status_code == 200 and r.json()["detections"]
        green_processes = server_processes(green)
        assert len(green_processes) > 2
        assert not {p.pid for p in green_processes} & {p.pid for p in server_processes(blue)}
    assert still_running(green_processes) == []
    assert green.ping() is None
    assert blue.ping() == 200


def test_crafted_requests_in_one_batch_are_4xx_and_leave_the_others_alone(served):
    """Hostile bodies (issue 10) sent concurrently with good ones: each crafted one gets a 4xx with a
    message (never a 5xx, which would trip the rollback alarm), the good ones in the same batch a 200."""
    endpoint, _ = served
    from tests.unit.test_serving_hostile import CRAFTED

    image = jpeg_bytes(seed=9)
    payloads = [(image, "image/jpeg")] * 3 + [(body, content_type) for body, content_type, _ in CRAFTED.values()]
    barrier = threading.Barrier(len(payloads))

    def send(payload):
        barrier.wait()
        return post(endpoint.invocations_url, payload[0], payload[1])

    with ThreadPoolExecutor(len(payloads)) as pool:
        responses = list(pool.map(send, payloads))
    assert [r.status_code for r in responses[:3]] == [200] * 3
    for name, r in zip(CRAFTED, responses[3:], strict=True):
        assert r.status_code == CRAFTED[name][2], (name, r.status_code, r.text[:300])
        assert r.json()["error"]["message"], name
    assert max(int(r.headers["X-D2ops-Batch-Size"]) for r in responses) > 1
    assert requests.get(endpoint.ping_url, timeout=5).status_code == 200
    # TorchServe handed the bodies over as bytes (decode_input_request=false): its worker did not
    # json.loads them first, unbounded, and the handler's parser saw every one. (Ray Serve's route reads bytes.)
    if endpoint.backend == "torchserve":
        assert "Failed json decoding" not in (endpoint.logs_dir / "model_log.log").read_text()
