"""SigV4 verification as API Gateway's IAM authorizer does it, against botocore's own signer."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from botocore.credentials import Credentials

from d2ops.sigv4 import BAD_SIGNATURE, MISSING_TOKEN, SignatureRejected, SignedStatusApi, verify

REGION = "eu-west-1"
KEY = Credentials("AKIDEXAMPLE", "secret", "session-token")
URL = "http://127.0.0.1:8123/runs?limit=5&status=FAILED"


def _signed(method: str = "GET", url: str = URL, body: bytes = b"") -> dict[str, str]:
    headers = {"Content-Type": "application/json"} if body else {}
    signed = SignedStatusApi("http://127.0.0.1:8123", KEY, REGION).signed_headers(method, url, body, headers)
    return {**signed, "Host": "127.0.0.1:8123"}  # what the HTTP client adds


def test_a_request_signed_by_botocore_verifies_and_names_its_signer() -> None:
    body = b'{"dataset_uri": "s3://b/datasets/x/v1/"}'
    caller = verify("POST", URL, _signed("POST", URL, body), body, {"AKIDEXAMPLE": KEY}, REGION)
    assert caller.access_key == "AKIDEXAMPLE"


@pytest.mark.parametrize(("method", "url", "body"), [
    ("POST", URL, b"{}"),  # another method
    ("GET", URL.replace("limit=5", "limit=6"), b""),  # another query
    ("GET", URL.replace("/runs", "/models"), b""),  # another path
])
def test_any_change_to_the_signed_request_breaks_the_signature(method: str, url: str, body: bytes) -> None:
    with pytest.raises(SignatureRejected) as info:
        verify(method, url, _signed(), body, {"AKIDEXAMPLE": KEY}, REGION)
    assert info.value.message == BAD_SIGNATURE and info.value.status == 403


def test_a_changed_body_breaks_the_signature() -> None:
    headers = _signed("POST", URL, b'{"a": 1}')
    with pytest.raises(SignatureRejected, match="does not match"):
        verify("POST", URL, headers, b'{"a": 2}', {"AKIDEXAMPLE": KEY}, REGION)


def test_unsigned_unknown_key_wrong_token_region_and_skew_are_refused() -> None:
    known = {"AKIDEXAMPLE": KEY}
    with pytest.raises(SignatureRejected) as info:
        verify("GET", URL, {}, b"", known, REGION)
    assert (info.value.message, info.value.error_type) == (MISSING_TOKEN, "MissingAuthenticationTokenException")
    with pytest.raises(SignatureRejected, match="security token included in the request is invalid"):
        verify("GET", URL, _signed(), b"", {"OTHER": KEY}, REGION)
    with pytest.raises(SignatureRejected, match="security token"):
        verify("GET", URL, {**_signed(), "X-Amz-Security-Token": "stolen"}, b"", known, REGION)
    with pytest.raises(SignatureRejected, match="valid region"):
        verify("GET", URL, _signed(), b"", known, "us-east-1")
    signed_at = datetime.strptime(_signed()["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    with pytest.raises(SignatureRejected, match="Signature expired"):
        verify("GET", URL, _signed(), b"", known, REGION, now=signed_at + timedelta(minutes=6))
    with pytest.raises(SignatureRejected, match="not yet current"):
        verify("GET", URL, _signed(), b"", known, REGION, now=signed_at - timedelta(minutes=6))
    # Within API Gateway's five minutes either way, the clock difference is accepted.
    verify("GET", URL, _signed(), b"", known, REGION, now=signed_at + timedelta(minutes=4))
    with pytest.raises(SignatureRejected, match="requires 'Credential'"):
        verify("GET", URL, {"Authorization": "Bearer abc"}, b"", known, REGION)


def test_a_claimed_payload_hash_must_be_the_body_s() -> None:
    body = b'{"a": 1}'
    headers = SignedStatusApi("http://127.0.0.1:8123", KEY, REGION).signed_headers(
        "POST", URL, body, {"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()})
    headers["Host"] = "127.0.0.1:8123"
    verify("POST", URL, headers, body, {"AKIDEXAMPLE": KEY}, REGION)
    with pytest.raises(SignatureRejected, match="does not match"):
        verify("POST", URL, headers, b'{"a": 2}', {"AKIDEXAMPLE": KEY}, REGION)
