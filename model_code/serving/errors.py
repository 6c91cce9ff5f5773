"""The one error type a request can fail with: an HTTP status, a stable code and a message."""

from __future__ import annotations

from http import HTTPStatus


class RequestError(Exception):
    """A request the endpoint refuses; the caller gets ``status`` and ``message`` back as JSON.

    ``code`` is stable (tests and clients match on it); ``message`` says what was wrong and
    where, in words a caller can act on.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    @property
    def phrase(self) -> str:
        return HTTPStatus(self.status).phrase

    def to_json(self) -> dict[str, object]:
        return {"error": {"status": self.status, "code": self.code, "message": self.message}}


def bad_request(code: str, message: str) -> RequestError:
    return RequestError(400, code, message)


def too_large(code: str, message: str) -> RequestError:
    return RequestError(413, code, message)


def unsupported_media_type(message: str) -> RequestError:
    return RequestError(415, "unsupported_content_type", message)
