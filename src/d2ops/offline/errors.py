"""Errors the local AWS endpoints answer with, in the shape boto3 parses for each protocol."""

from __future__ import annotations


class ApiError(Exception):
    """An AWS API error: ``code`` becomes the ``__type`` (JSON protocols) boto3 raises by name."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
