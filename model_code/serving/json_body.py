"""The JSON form of a request (``{"image": "<base64>", "score_threshold": 0.3}``), parsed with bounded work.

``json.loads`` on bytes a caller chose can recurse until ``RecursionError`` (100k nested
brackets), build lists of millions of numbers (12 MB of ``0,``) or refuse a 5000-digit
integer with a ``ValueError`` that is not a ``JSONDecodeError``. The request format is one
flat object of a few strings, numbers and booleans, so this module parses exactly that
grammar, and nothing else, in one linear pass (strings through json's own C scanner): no
recursion, no containers, at most MAX_FIELDS fields, numbers of at most MAX_LITERAL_CHARS
characters. Memory stays a small multiple of the body, and every way to be wrong is a 4xx
naming the problem and the character where it was found.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from _json import scanstring  # json's C string scanner: linear, strict about control characters
from collections.abc import Mapping
from typing import Any

from model_code.serving.errors import RequestError, bad_request, too_large

# SageMaker's 6 MB image as base64 is 8 MB; TorchServe's max_request_size (16 MB) is above this.
MAX_JSON_BYTES = 12 * 1024 * 1024
MAX_FIELDS = 16  # "image" and the options, with room for routing parameters
MAX_LITERAL_CHARS = 32  # the longest float repr is 24 characters
EXAMPLE = '{"image": "<base64 JPEG or PNG>"}'

_SPACE = re.compile(r"[ \t\r\n]*")
_LITERAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
_JUNK = re.compile(r'[^ \t\r\n,:{}\[\]"]*')
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None}
_UTF8_BOM = b"\xef\xbb\xbf"


def describe(value: Any, limit: int = 60) -> str:
    """A short repr for messages: never converts a huge int to decimal, never echoes megabytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits>"
    if isinstance(value, bytes | bytearray):
        value = bytes(value[: limit + 1]).decode("utf-8", "replace")
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} characters)"
    if isinstance(value, list | dict | tuple):
        return f"<a JSON {'object' if isinstance(value, dict) else 'array'}>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _invalid(message: str) -> RequestError:
    return bad_request("invalid_json", f"request body is not valid JSON: {message}")


class _Reader:
    """A cursor over the body's text; every step is a C-speed regex match or ``scanstring`` call."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def skip_space(self) -> str:
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]  # matches empty too
        return self.text[self.pos:self.pos + 1]

    def expect(self, char: str, what: str) -> None:
        if self.skip_space() != char:
            found = repr(self.text[self.pos]) if self.pos < len(self.text) else "the end of the body"
            raise _invalid(f"expected {what} at character {self.pos}, found {found}")
        self.pos += 1

    def string(self, what: str) -> str:
        if self.skip_space() != '"':
            raise _invalid(f"expected {what} (a string in double quotes) at character {self.pos}")
        try:
            value, self.pos = scanstring(self.text, self.pos + 1)
        except json.JSONDecodeError as exc:
            raise _invalid(f"{exc.msg} (character {exc.pos})") from exc
        return value

    def value(self, key: str) -> Any:
        char = self.skip_space()
        if char == '"':
            return self.string("a value")
        if char in ("{", "["):
            kind = "an object" if char == "{" else "an array"
            raise bad_request("invalid_json", f"JSON field {describe(key)} is {kind} (at character {self.pos}); the "
                                              f"body is one flat object whose values are strings, numbers or "
                                              f"booleans, like {EXAMPLE}")
        junk = _JUNK.match(self.text, self.pos).end() - self.pos  # type: ignore[union-attr]  # matches empty too
        if junk > MAX_LITERAL_CHARS:
            raise bad_request("invalid_json", f"JSON field {describe(key)}: a value of {junk} characters at character "
                                              f"{self.pos} (numbers are at most {MAX_LITERAL_CHARS} characters)")
        match = _LITERAL.match(self.text, self.pos)
        if match is None or match.end() - self.pos != junk:
            raise _invalid(f"field {describe(key)}: {describe(self.text[self.pos:self.pos + junk] or char)} at "
                           f"character {self.pos} is not a JSON value")
        self.pos = match.end()
        word = match.group()
        if word in _CONSTANTS:
            return _CONSTANTS[word]
        number = float(word) if any(c in word for c in ".eE") else int(word)
        if isinstance(number, float) and not math.isfinite(number):
            raise bad_request("invalid_json", f"JSON field {describe(key)} is {word}, which overflows a float")
        return number


def parse_flat_object(text: str) -> dict[str, Any]:
    """``{"k": scalar, ...}`` with at most MAX_FIELDS fields; anything else is a 4xx naming where it broke."""
    reader = _Reader(text)
    if reader.skip_space() == "":
        raise bad_request("empty_body", f"request body is empty: send {EXAMPLE}")
    if reader.skip_space() != "{":
        found = {"[": "an array", '"': "a string"}.get(reader.skip_space(), "a value")
        raise bad_request("invalid_json", f"JSON body must be an object like {EXAMPLE}, got {found}")
    reader.pos += 1
    fields: dict[str, Any] = {}
    if reader.skip_space() == "}":
        reader.pos += 1
    else:
        for count in itertools.count(1):
            if count > MAX_FIELDS:
                raise bad_request("invalid_json", f"JSON body has more than {MAX_FIELDS} fields (at character "
                                                  f"{reader.pos}); it takes 'image' and a few options")
            key = reader.string("a field name")
            reader.expect(":", "':'")
            fields[key] = reader.value(key)
            if reader.skip_space() == "}":
                reader.pos += 1
                break
            reader.expect(",", "',' or '}'")
    if reader.skip_space() != "":
        raise _invalid(f"extra data after the object at character {reader.pos}")
    return fields


def check_fields(document: Mapping[Any, Any]) -> dict[str, Any]:
    """A document TorchServe already parsed gets the same rules as one parsed here."""
    if len(document) > MAX_FIELDS:
        raise bad_request("invalid_json", f"JSON body has {len(document)} fields; it takes 'image' and a few options")
    fields: dict[str, Any] = {}
    for key, value in document.items():
        if not isinstance(key, str):
            raise bad_request("invalid_json", f"JSON body: field name {describe(key)} is not a string")
        if isinstance(value, list | dict | tuple):
            raise bad_request("invalid_json", f"JSON field {describe(key)} is {describe(value)}; the body is one flat "
                                              f"object whose values are strings, numbers or booleans")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise bad_request("invalid_json", f"JSON field {describe(key)} has type {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise bad_request("invalid_json", f"JSON field {describe(key)} is {value}, not a finite number")
        fields[key] = value
    return fields


def parse_json_body(body: Any) -> dict[str, Any]:
    """Bytes, str or an already-parsed dict -> the request's fields, or a RequestError (4xx)."""
    if isinstance(body, Mapping):
        return check_fields(body)
    if body is None:
        raw = b""
    elif isinstance(body, str):
        raw = body.encode("utf-8", "surrogatepass")
    elif isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
    else:
        raise bad_request("invalid_json", f"JSON body must be an object like {EXAMPLE}, got {type(body).__name__}")
    if len(raw) > MAX_JSON_BYTES:
        raise too_large("body_too_large", f"JSON body is {len(raw)} bytes; the limit is {MAX_JSON_BYTES}")
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request("invalid_json", f"JSON body is not UTF-8: byte {exc.start} is {raw[exc.start]:#04x}") from exc
    return check_fields(parse_flat_object(text))
