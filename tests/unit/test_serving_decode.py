"""Request decoding and options: every bad input is a 4xx RequestError whose message says why."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import pytest
from PIL import Image

from model_code.serving import decode
from model_code.serving.errors import RequestError
from model_code.serving.options import PredictOptions, parse_custom_attributes
from tests.fixtures.serving.support import jpeg_bytes, png_bytes, shapes_image

ATTRS = "X-Amzn-SageMaker-Custom-Attributes"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png_with_size(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (only the header is read before refusing)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def refused(body, content_type, **kwargs) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode.decode_request(body, content_type, **kwargs)
    return info.value


@pytest.mark.parametrize(("content_type", "data"), [("image/jpeg", jpeg_bytes()), ("image/png", png_bytes()),
                                                    ("application/x-image", png_bytes()), (None, jpeg_bytes()),
                                                    ("image/jpeg; charset=binary", jpeg_bytes())])
def test_raw_images_decode_to_rgb_uint8_in_original_size(content_type, data):
    req = decode.decode_request(data, content_type)
    assert req.image.dtype.is_floating_point is False and tuple(req.image.shape) == (3, 120, 160)
    assert (req.width, req.height) == (160, 120)
    assert req.options == PredictOptions()


def test_pixels_survive_decoding_exactly_for_png():
    image = shapes_image(64, 48, seed=3)
    req = decode.decode_request(png_bytes(64, 48, seed=3), "image/png")
    assert req.image.permute(1, 2, 0).numpy().tobytes() == image.tobytes()


def test_grayscale_and_rgba_pngs_become_rgb():
    for mode in ("L", "RGBA", "P"):
        buf = io.BytesIO()
        shapes_image(40, 30).convert(mode).save(buf, format="PNG")
        assert tuple(decode.decode_request(buf.getvalue(), "image/png").image.shape) == (3, 30, 40)


def test_json_form_with_options_and_data_url():
    body = json.dumps({"image": "data:image/png;base64," + b64(png_bytes()), "score_threshold": 0.25,
                       "max_detections": 7, "masks": True}).encode()
    req = decode.decode_request(body, "application/json")
    assert req.options == PredictOptions(score_threshold=0.25, max_detections=7, masks=True)
    assert (req.width, req.height) == (160, 120)


def test_options_from_query_and_custom_attributes_with_json_body_winning():
    body = json.dumps({"image": b64(jpeg_bytes()), "max_detections": 3}).encode()
    req = decode.decode_request(body, "application/json", query={"score_threshold": b"0.7", "max_detections": b"9"},
                                headers={ATTRS: "score_threshold=0.1; masks=true"})
    assert req.options == PredictOptions(score_threshold=0.7, max_detections=3, masks=True)
    raw = decode.decode_request(jpeg_bytes(), "image/jpeg", headers={ATTRS.lower(): "max_detections=4"},
                                query={"model_name": b"model"})
    assert raw.options.max_detections == 4


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code", "message"),
    [
        (b"", "image/jpeg", 400, "empty_body", "request body is empty"),
        (b"hello, world", "image/png", 415, "unsupported_content_type", "is not a JPEG or PNG image"),
        (png_with_size(0, 10), "image/png", 400, "corrupt_image", "its header cannot be read"),
        (jpeg_bytes(400, 300)[: len(jpeg_bytes(400, 300)) * 2 // 3], "image/jpeg", 400, "corrupt_image",
         "truncated or damaged JPEG image (400x300)"),
        (png_bytes(200, 100)[:-300], "image/png", 400, "corrupt_image", "truncated or damaged PNG image (200x100)"),
        (png_with_size(7000, 6000), "image/png", 413, "image_too_large", "7000x6000 (42,000,000 pixels)"),
        (b"\xff" * (decode.MAX_IMAGE_BYTES + 1), "application/x-image", 413, "body_too_large", "the limit is"),
        (jpeg_bytes(), "text/plain", 415, "unsupported_content_type", "Content-Type 'text/plain' is not supported"),
        (jpeg_bytes(), "multipart/form-data; boundary=x", 415, "unsupported_content_type", "multipart/form-data"),
        (b"{not json", "application/json", 400, "invalid_json", "request body is not valid JSON"),
        (b"[1, 2]", "application/json", 400, "invalid_json", "must be an object"),
        (b"{}", "application/json", 400, "invalid_json", "no 'image' field"),
        (b"", "application/json", 400, "empty_body", "request body is empty"),
        (b'{"image": 42}', "application/json", 400, "invalid_json", "must be a base64 string, got int"),
        (b'{"image": "not base64!"}', "application/json", 400, "invalid_base64", "is not valid base64"),
        (b'{"image": ""}', "application/json", 400, "empty_body", "JSON field 'image' is empty"),
        (json.dumps({"image": b64(jpeg_bytes()), "treshold": 0.3}).encode(), "application/json", 400,
         "invalid_option", "unknown option 'treshold' in the JSON body"),
        (json.dumps({"image": b64(jpeg_bytes()), "score_threshold": 1.5}).encode(), "application/json", 400,
         "invalid_option", "option score_threshold=1.5 in the JSON body"),
        (json.dumps({"image": b64(b"GIF89a....")}).encode(), "application/json", 415, "unsupported_content_type",
         "JSON field 'image' is not a JPEG or PNG image (it looks like GIF); send a JPEG or PNG"),
        (json.dumps({"image": b64(b"\x00\x01junk")}).encode(), "application/json", 415, "unsupported_content_type",
         "JSON field 'image' is not a JPEG or PNG image (it starts with"),
    ],
    ids=["empty", "not-an-image", "zero-width-png", "truncated-jpeg", "truncated-png", "too-many-pixels",
         "too-many-bytes", "text-plain", "multipart", "invalid-json", "json-array", "json-no-image", "json-empty",
         "image-not-string", "bad-base64", "empty-base64", "unknown-option", "option-out-of-range", "base64-gif",
         "base64-junk"],
)
def test_bad_inputs_are_4xx_with_a_message(body, content_type, status, code, message):
    err = refused(body, content_type)
    assert (err.status, err.code) == (status, code)
    assert message in err.message
    assert err.to_json() == {"error": {"status": status, "code": code, "message": err.message}}


def test_gif_is_refused_as_unsupported_format():
    buf = io.BytesIO()
    shapes_image(20, 20).save(buf, format="GIF")
    err = refused(buf.getvalue(), "image/gif")
    assert (err.status, err.message) == (415, "request body is not a JPEG or PNG image (it looks like GIF); "
                                              "send a JPEG or PNG")


def test_bad_options_in_query_and_header_name_their_source():
    err = refused(jpeg_bytes(), "image/jpeg", query={"max_detections": b"0"})
    assert err.status == 400 and "max_detections='0' in the query string" in err.message
    err = refused(jpeg_bytes(), "image/jpeg", query={"maxdet": b"3"})
    assert "unknown option 'maxdet' in the query string" in err.message
    err = refused(jpeg_bytes(), "image/jpeg", headers={ATTRS: "masks=perhaps"})
    assert "masks='perhaps' in the custom attributes header" in err.message
    err = refused(jpeg_bytes(), "image/jpeg", headers={ATTRS: "score_threshold"})
    assert "is not key=value" in err.message


def test_headers_and_query_parameters_may_arrive_as_bytes():
    """Servers hand over bytes: a bytes header was a TypeError (a generic 400), a bytes query name 'unknown'."""
    got = decode.decode_request(jpeg_bytes(), "image/jpeg", query={b"max_detections": b"7"},
                                headers={ATTRS.encode(): b"score_threshold=0.25"})
    assert (got.options.max_detections, got.options.score_threshold) == (7, 0.25)
    err = refused(jpeg_bytes(), "image/jpeg", query={"score_threshold": [b"0.3"]})
    assert (err.status, err.code) == (400, "invalid_option")
    assert err.message == "query parameter 'score_threshold' arrived as list <a JSON array>, not text"


def test_custom_attributes_parsing():
    assert parse_custom_attributes("a=1;b = 2 ,c=x=y;") == {"a": "1", "b": "2", "c": "x=y"}
    with pytest.raises(RequestError, match="longer than 1024"):
        parse_custom_attributes("a=" + "1" * 1100)


def test_torchserve_may_hand_over_str_or_parsed_json_bodies():
    document = {"image": b64(png_bytes()), "max_detections": 2}
    assert decode.decode_request(document, "application/json").options.max_detections == 2
    assert decode.decode_request(json.dumps(document), "application/json").width == 160


def test_decompression_bomb_header_is_refused_before_decoding():
    # Pillow's own limit (2 x 89.5 MP) trips inside Image.open: still a 413 with Pillow's explanation.
    err = refused(png_with_size(20000, 20000), "image/png")
    assert err.status == 413 and err.code == "image_too_large"


def test_image_open_is_not_fooled_by_a_valid_header_with_no_pixels():
    data = png_with_size(50, 40)  # header says 50x40, the IDAT holds nothing
    err = refused(data, "image/png")
    assert err.status == 400 and err.code == "corrupt_image"


def test_jpeg_progressive_and_cmyk_are_accepted():
    buf = io.BytesIO()
    shapes_image(64, 64).convert("CMYK").save(buf, format="JPEG", progressive=True)
    assert tuple(decode.decode_request(buf.getvalue(), "image/jpeg").image.shape) == (3, 64, 64)
    assert Image.open(io.BytesIO(buf.getvalue())).mode == "CMYK"
