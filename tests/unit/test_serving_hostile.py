"""Hostile and unlucky requests (issue 10): every one is a 4xx with a message, never an exception or a 5xx.

Any 5xx trips the endpoint's error alarm, which rolls a blue/green deployment back, so a caller
who may invoke must not be able to cause one. Explicit crafted cases, then Hypothesis over
request bodies, content types, options and mutated images, then the same through the service
with good requests in the same batch. ``CRAFTED`` is reused by the real-TorchServe test.
"""

from __future__ import annotations

import base64
import io
import json
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from d2ops_core import images as rule
from model_code.artifact import load_artifact
from model_code.inference import image_to_tensor
from model_code.serving import decode
from model_code.serving.errors import RequestError
from model_code.serving.json_body import MAX_JSON_BYTES, parse_json_body
from model_code.serving.service import DetectionService, RawRequest
from tests.fixtures.serving.support import cached_artifact, encode, jpeg_bytes, png_bytes, shapes_image

SMALL_JPEG = jpeg_bytes(32, 24, seed=3)
SMALL_PNG = png_bytes(32, 24, seed=4)
B64 = base64.b64encode(SMALL_JPEG).decode()


def _json(**fields: object) -> bytes:
    return json.dumps({"image": B64, **fields}).encode()


def _thin_png(width: int, height: int) -> bytes:
    return encode(Image.new("RGB", (width, height), (200, 30, 30)), "PNG")


# name -> (body, content type, expected status); each body is a few MB at most.
CRAFTED: dict[str, tuple[bytes, str, int]] = {
    "nested-100k-under-image": (b'{"image":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json", 400),
    "nested-100k-top-level": (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
    "nested-objects-unknown-key": (b'{"x":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001, "application/json", 400),
    "5000-digit-integer": (_json()[:-1] + b', "max_detections": ' + b"9" * 5000 + b"}", "application/json", 400),
    "5000-digit-float": (_json()[:-1] + b', "score_threshold": 0.' + b"1" * 5000 + b"}", "application/json", 400),
    "huge-array": (b'{"image": "' + B64.encode() + b'", "x": [' + b"0," * 1_000_000 + b"0]}", "application/json",
                   400),
    "many-fields": (b"{" + b",".join(b'"k%d": 1' % i for i in range(50_000)) + b"}", "application/json", 400),
    "image-is-object": (b'{"image": {"data": "x"}}', "application/json", 400),
    "image-is-number": (b'{"image": 1e999}', "application/json", 400),
    "option-wrong-type": (_json(score_threshold="high"), "application/json", 400),
    "option-is-array": (_json(masks=[True]), "application/json", 400),
    "option-nan": (_json()[:-1] + b', "score_threshold": NaN}', "application/json", 400),
    "unterminated-string": (b'{"image": "' + b'\\"' * 500_000, "application/json", 400),
    "not-utf8": (b'{"image": "\xff\xfe"}', "application/json", 400),
    "thin-png-1x5000": (_thin_png(1, 5000), "image/png", 400),
    "wide-png-6000x1": (_thin_png(6000, 1), "image/png", 400),
    "gif": (encode(shapes_image(20, 20), "GIF"), "image/gif", 415),
    "tiff-as-jpeg": (encode(shapes_image(20, 20), "TIFF"), "image/jpeg", 415),
    "eps-as-png": (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n", "image/png", 415),
}


def refused(body: object, content_type: str | None, **kwargs: object) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode.decode_request(body, content_type, **kwargs)  # type: ignore[arg-type]
    return info.value


@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_request_is_a_4xx_with_a_message(name):
    body, content_type, status = CRAFTED[name]
    err = refused(body, content_type)
    assert err.status == status and err.message and len(err.message) < 400, (name, err.status, err.message)


def test_messages_name_the_problem_and_where():
    assert "a value of 5000 characters" in refused(*CRAFTED["5000-digit-integer"][:2]).message
    assert "JSON field 'image' is an array (at character 9)" in refused(*CRAFTED["nested-100k-under-image"][:2]).message
    assert "JSON field 'x' is an array" in refused(*CRAFTED["huge-array"][:2]).message
    assert "more than 16 fields" in refused(*CRAFTED["many-fields"][:2]).message
    assert "'NaN' at character" in refused(*CRAFTED["option-nan"][:2]).message
    assert "option score_threshold='high' in the JSON body" in refused(*CRAFTED["option-wrong-type"][:2]).message
    assert "1x5000; its longer side may be at most 20 times" in refused(*CRAFTED["thin-png-1x5000"][:2]).message
    assert "it looks like PostScript" in refused(*CRAFTED["eps-as-png"][:2]).message


def test_options_from_query_and_header_never_echo_megabytes_or_huge_integers():
    err = refused(SMALL_JPEG, "image/jpeg", query={"max_detections": b"9" * 5000})
    assert err.status == 400 and "(5000 characters)" in err.message and len(err.message) < 300
    err = refused(SMALL_JPEG, "image/jpeg", query={"x" * 100_000: b"1"})
    assert err.status == 400 and "unknown option" in err.message and len(err.message) < 300
    # A document TorchServe parsed itself (TS_DECODE_INPUT_REQUEST unset) gets the same rules.
    err = refused({"image": B64, "max_detections": 10**5000}, "application/json")
    assert err.status == 400 and "an integer of about 5001 digits" in err.message
    err = refused({"image": B64, "masks": {"a": [1]}}, "application/json")
    assert err.status == 400 and "<a JSON object>" in err.message


def test_json_parsing_memory_stays_a_small_multiple_of_the_body():
    """Python-level allocations while parsing (json and str work; the bytes exist already)."""
    legit = json.dumps({"image": base64.b64encode(np.random.default_rng(0).bytes(6_000_000)).decode()}).encode()
    assert len(legit) < MAX_JSON_BYTES
    for body in (legit, CRAFTED["huge-array"][0], CRAFTED["nested-100k-under-image"][0],
                 CRAFTED["unterminated-string"][0], CRAFTED["many-fields"][0]):
        tracemalloc.start()
        try:
            parse_json_body(body)
        except RequestError:
            pass
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 2.5 * len(body) + 1_000_000, (len(body), peak)


def test_camera_jpeg_mpo_is_accepted_as_its_first_picture():
    first, preview = shapes_image(64, 48, seed=5), shapes_image(16, 12, seed=6)
    buf = io.BytesIO()
    first.save(buf, "MPO", save_all=True, append_images=[preview])
    data = buf.getvalue()
    assert Image.open(io.BytesIO(data)).format == "MPO"
    decoded = decode.decode_request(data, "image/jpeg")
    assert (decoded.width, decoded.height) == (64, 48)
    assert torch.equal(decoded.image, image_to_tensor(rule.load_rgb(data)))


def test_exif_orientation_is_applied_as_training_and_evaluation_apply_it():
    stored = shapes_image(40, 20, seed=7)
    exif = Image.Exif()
    exif[rule.EXIF_ORIENTATION] = 6  # "rotate 90 degrees clockwise to view"
    buf = io.BytesIO()
    stored.save(buf, "JPEG", exif=exif, quality=95)
    decoded = decode.decode_request(buf.getvalue(), "image/jpeg")
    assert (decoded.width, decoded.height) == (20, 40)
    assert torch.equal(decoded.image, image_to_tensor(rule.load_rgb(buf.getvalue())))  # the trainers' reader
    upright = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB").transpose(Image.Transpose.ROTATE_270))
    assert np.abs(decoded.image.permute(1, 2, 0).numpy().astype(int) - upright.astype(int)).max() == 0


# ---------------------------------------------------------------- properties

CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8", "image/jpeg", "image/png",
                                 "application/x-image", "application/octet-stream", "image/gif", "text/plain",
                                 "multipart/form-data; boundary=x", "", None])
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**60), max_value=10**60)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
OPTION_KEYS = st.sampled_from(["score_threshold", "max_detections", "masks", "image", "model_name", "x", ""])


@st.composite
def json_documents(draw: st.DrawFn) -> bytes:
    """Mostly request-shaped objects with odd values, sometimes anything JSON, sometimes mutated bytes."""
    if draw(st.booleans()):
        doc: object = {k: draw(JSON_VALUES) for k in draw(st.lists(OPTION_KEYS, max_size=5))}
        if draw(st.booleans()):
            doc["image"] = draw(st.sampled_from([B64, "data:image/png;base64," + base64.b64encode(SMALL_PNG).decode(),
                                                 B64[:-7], "", "////"]))
    else:
        doc = draw(JSON_VALUES)
    raw = json.dumps(doc).encode()
    for _ in range(draw(st.integers(0, 3))):  # byte-level mutations: deletions, insertions, replacements
        if not raw:
            break
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + draw(st.binary(max_size=3)) + raw[at + draw(st.integers(0, 2)):]
    return raw


def assert_refused_properly(call) -> None:  # type: ignore[no-untyped-def]
    try:
        call()
    except RequestError as err:
        assert 400 <= err.status < 500 and err.code and err.message.strip(), err
        assert err.to_json()["error"]["status"] == err.status
        json.dumps(err.to_json())  # the answer must always serialise


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(json_documents(), st.binary(max_size=300), st.text(max_size=200)), content_type=CONTENT_TYPES)
def test_any_body_and_content_type_is_decoded_or_refused_with_a_4xx(body, content_type):
    assert_refused_properly(lambda: decode.decode_request(body, content_type))


@settings(max_examples=200, deadline=None)
@given(query=st.dictionaries(OPTION_KEYS | st.text(max_size=8), st.binary(max_size=40) | st.text(max_size=40),
                             max_size=4),
       attributes=st.text(max_size=120))
def test_any_options_in_query_and_header_are_used_or_refused_with_a_4xx(query, attributes):
    headers = {"X-Amzn-SageMaker-Custom-Attributes": attributes}
    assert_refused_properly(lambda: decode.decode_request(SMALL_PNG, "image/png", query=query, headers=headers))


@settings(max_examples=150, deadline=None)
@given(seed=st.sampled_from([SMALL_JPEG, SMALL_PNG]), cuts=st.lists(st.tuples(st.integers(0, 10**6),
                                                                               st.binary(max_size=4)), max_size=4),
       truncate=st.integers(0, 10**6))
def test_mutated_images_are_decoded_or_refused_with_a_4xx(seed, cuts, truncate):
    data = seed
    for at, junk in cuts:  # replace a few bytes anywhere: header fields, chunk lengths, entropy data
        at %= len(data)
        data = data[:at] + junk + data[at + len(junk):]
    data = data[: max(1, len(data) - truncate % 64)] if truncate % 3 == 0 else data
    assert_refused_properly(lambda: decode.decode_request(data, "image/jpeg"))


# ---------------------------------------------------------------- through the service, in batches


@pytest.fixture(scope="module")
def service() -> DetectionService:
    return DetectionService(load_artifact(cached_artifact()))


def test_one_crafted_request_per_kind_never_fails_the_good_requests_of_its_batch(service):
    batch = [RawRequest(SMALL_JPEG, "image/jpeg")] + [RawRequest(b, t) for b, t, _ in CRAFTED.values()] + [
        RawRequest(SMALL_PNG, "image/png"), RawRequest(_thin_png(400, 20), "image/png", {"score_threshold": b"0"})]
    responses = service.handle_batch(batch)
    assert responses[0].status == 200 and responses[-2].status == 200
    assert responses[-1].status == 200  # 20:1, the widest shape the rule accepts, runs through the detector
    assert [r.status for r in responses[1:-2]] == [status for _, _, status in CRAFTED.values()]
    assert all(r.json()["error"]["message"] for r in responses[1:-2])


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies=st.lists(st.tuples(st.one_of(json_documents(), st.binary(max_size=100)), CONTENT_TYPES), max_size=3))
def test_any_batch_answers_each_request_alone_and_never_5xx(service, bodies):
    requests = [RawRequest(SMALL_JPEG, "image/jpeg"), *(RawRequest(b, t) for b, t in bodies)]
    responses = service.handle_batch(requests)
    assert len(responses) == len(requests) and responses[0].status == 200
    assert all(200 <= r.status < 500 for r in responses), [r.status for r in responses]
