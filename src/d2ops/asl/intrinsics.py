"""Intrinsic functions (``States.Format(...)`` and friends) for JSONPath payload templates.

``parse`` turns an invocation string into a small tree (nested calls, quoted strings with the
``\\'`` ``\\{`` ``\\}`` ``\\\\`` escapes, paths, numbers, ``true``/``false``/``null``); ``evaluate`` runs it
against a state's input and the context object. Every problem is an ``IntrinsicError`` naming the
function; the interpreter reports it as ``States.Runtime``, as the service does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from d2ops.asl.jsonvalue import MAX_JSON_DEPTH, json_problem, text_too_deep
from d2ops.asl.paths import PathError, check_path, select

MAX_NESTING = 10
_MAX_STRING = 10_000
_MAX_RANGE = 1000
_INT32 = (-(2**31), 2**31 - 1)


class IntrinsicError(ValueError):
    """An intrinsic invocation that does not parse or cannot be evaluated."""


@dataclass(frozen=True)
class Literal:
    value: Any
    # For string literals: the text split at its unescaped ``{}`` (States.Format placeholders).
    format_parts: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PathArg:
    path: str


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Literal | PathArg | Call, ...]


Node = Literal | PathArg | Call

_NAME = re.compile(r"States\.[A-Za-z0-9]+")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
_KEYWORDS = {"null": None, "true": True, "false": False}


def is_intrinsic(text: Any) -> bool:
    return isinstance(text, str) and _NAME.match(text.lstrip()) is not None


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str) -> IntrinsicError:
        return IntrinsicError(f"{message} at position {self.pos} of {self.text!r}")

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def call(self, depth: int) -> Call:
        if depth > MAX_NESTING:
            raise self.fail(f"more than {MAX_NESTING} nested intrinsic functions")
        match = _NAME.match(self.text, self.pos)
        if not match:
            raise self.fail("expected an intrinsic function name (States.Xxx)")
        name = match.group(0)
        if name not in FUNCTIONS:
            raise self.fail(f"unknown intrinsic function {name}")
        self.pos = match.end()
        self.skip_space()
        if self.text[self.pos : self.pos + 1] != "(":
            raise self.fail(f"expected '(' after {name}")
        self.pos += 1
        args: list[Node] = []
        self.skip_space()
        if self.text[self.pos : self.pos + 1] == ")":
            self.pos += 1
            return Call(name, ())
        while True:
            self.skip_space()
            args.append(self.argument(depth))
            self.skip_space()
            char = self.text[self.pos : self.pos + 1]
            self.pos += 1
            if char == ")":
                return Call(name, tuple(args))
            if char != ",":
                self.pos -= 1
                raise self.fail(f"expected ',' or ')' in the arguments of {name}")

    def argument(self, depth: int) -> Node:
        char = self.text[self.pos : self.pos + 1]
        if char == "'":
            return self.string()
        if char == "$":
            return self.path()
        if _NAME.match(self.text, self.pos):
            return self.call(depth + 1)
        match = _NUMBER.match(self.text, self.pos)
        if match:
            self.pos = match.end()
            token = match.group(0)
            return Literal(int(token) if match.group(1) is None and match.group(2) is None else float(token))
        for word, value in _KEYWORDS.items():
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return Literal(value)
        raise self.fail("expected a string, number, path, null, true, false or intrinsic function")

    def string(self) -> Literal:
        self.pos += 1
        parts: list[str] = []
        current: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.fail("unterminated string literal")
            char = self.text[self.pos]
            if char == "\\":
                escaped = self.text[self.pos + 1 : self.pos + 2]
                if escaped not in ("'", "{", "}", "\\"):
                    raise self.fail("an open escape backslash (only \\' \\{ \\} \\\\ are escapes)")
                current.append(escaped)
                self.pos += 2
                continue
            if char == "'":
                self.pos += 1
                parts.append("".join(current))
                return Literal("{}".join(parts), tuple(parts))
            if char == "{" and self.text[self.pos + 1 : self.pos + 2] == "}":
                parts.append("".join(current))
                current = []
                self.pos += 2
                continue
            current.append(char)
            self.pos += 1

    def path(self) -> PathArg:
        start, depth, quote = self.pos, 0, ""
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if quote:
                if char == "\\":
                    self.pos += 1
                elif char == quote:
                    quote = ""
            elif char in "'\"" and depth:
                quote = char
            elif char == "[":
                depth += 1
            elif char == "]":
                depth -= 1
            elif depth == 0 and (char in ",)" or char.isspace()):
                break
            self.pos += 1
        path = self.text[start : self.pos]
        try:
            check_path(path)
        except PathError as exc:
            raise self.fail(str(exc)) from exc
        return PathArg(path)


def parse(text: str) -> Call:
    """Parse one intrinsic invocation; raises IntrinsicError naming the problem and position."""
    parser = _Parser(text)
    parser.skip_space()
    call = parser.call(1)
    parser.skip_space()
    if parser.pos != len(text):
        raise parser.fail("unexpected text after the intrinsic function")
    return call


def evaluate(node: Node, data: Any, context: Any, rng: random.Random | None = None) -> Any:
    """Evaluate a parsed invocation against the state's input ``data`` and the context object."""
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, PathArg):
        try:
            return select(node.path, data, context)
        except PathError as exc:
            raise IntrinsicError(str(exc)) from exc
    if node.name == "States.Format" and node.args and isinstance(node.args[0], Literal):
        template = node.args[0]
        rest = [evaluate(arg, data, context, rng) for arg in node.args[1:]]
        if template.format_parts is None:
            raise IntrinsicError("States.Format: the first argument must be a string")
        return _format(template.format_parts, rest)
    values = [evaluate(arg, data, context, rng) for arg in node.args]
    try:
        return FUNCTIONS[node.name](values, rng or random.Random())
    except IntrinsicError as exc:
        raise IntrinsicError(f"{node.name}: {exc}") from exc


def _argc(args: list[Any], low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(args) <= high:
        expected = str(low) if low == high else f"{low} to {high}"
        raise IntrinsicError(f"expected {expected} arguments, got {len(args)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any, what: str) -> int:
    if _is_number(value) and float(value).is_integer():
        return int(value)
    raise IntrinsicError(f"{what} must be an integer, got {json.dumps(value)}")


def _rounded(value: Any, what: str) -> int:
    """Where the service rounds a non-integer number to the nearest integer (half up)."""
    if not _is_number(value):
        raise IntrinsicError(f"{what} must be a number, got {json.dumps(value)}")
    return math.floor(value + 0.5)


def _array(value: Any, what: str = "the first argument") -> list[Any]:
    if not isinstance(value, list):
        raise IntrinsicError(f"{what} must be an array, got {json.dumps(value)}")
    return value


def _string(value: Any, what: str = "the argument", limit: int | None = None) -> str:
    if not isinstance(value, str):
        raise IntrinsicError(f"{what} must be a string, got {json.dumps(value)}")
    if limit is not None and len(value) > limit:
        raise IntrinsicError(f"{what} is longer than {limit} characters")
    return value


def _text(value: Any) -> str:
    """How States.Format renders a value: strings as they are, objects and arrays the way the
    service's Java runtime prints them (``{a=1, b=[x, y]}``), other values as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}={_text(item)}" for key, item in value.items()) + "}"
    return json.dumps(value)


def _format(parts: tuple[str, ...], values: list[Any]) -> str:
    if len(parts) - 1 != len(values):
        raise IntrinsicError(f"States.Format: the template has {len(parts) - 1} placeholders "
                             f"but {len(values)} arguments were given")
    out = [parts[0]]
    for value, part in zip(values, parts[1:], strict=True):
        out.append(_text(value))
        out.append(part)
    return "".join(out)


def _f_format(args: list[Any], rng: random.Random) -> Any:
    # Reached when the template comes from a path: every "{}" in its value is a placeholder.
    if not args:
        raise IntrinsicError("expected a template argument")
    return _format(tuple(_string(args[0], "the template").split("{}")), args[1:])


def _f_string_to_json(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 1)
    text = _string(args[0])
    if text_too_deep(text):
        raise IntrinsicError(f"the argument is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        value = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, or an integer of over 4300 digits
        raise IntrinsicError(f"the argument is not a JSON text: {exc}") from exc
    problem = json_problem(value)
    if problem is not None:
        raise IntrinsicError(f"the argument is not a valid JSON payload: {problem}")
    return value



def _f_json_to_string(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 1)
    return json.dumps(args[0], separators=(",", ":"), ensure_ascii=False)


def _f_array(args: list[Any], rng: random.Random) -> Any:
    return list(args)


def _f_array_partition(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 2)
    items = _array(args[0])
    size = _integer(args[1], "the chunk size")
    if size <= 0:
        raise IntrinsicError("the chunk size must be greater than 0")
    return [items[i : i + size] for i in range(0, len(items), size)]


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ``==``, ``true`` is not ``1`` and ``false`` is not ``0``, at any depth."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _f_array_contains(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 2)
    return any(_json_equal(item, args[1]) for item in _array(args[0]))


def _f_array_range(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 3)
    start, end, step = (_rounded(v, w) for v, w in zip(args, ("the start", "the end", "the step"), strict=True))
    if step <= 0:
        raise IntrinsicError("the step must be a positive integer")
    values = range(start, end + 1, step)  # counted before it is built: ArrayRange(0, 2147483647, 1) is cheap
    if len(values) > _MAX_RANGE:
        raise IntrinsicError(f"the range has {len(values)} elements, more than {_MAX_RANGE}")
    return list(values)


def _f_array_get_item(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 2)
    items = _array(args[0])
    index = _integer(args[1], "the index")
    if not 0 <= index < len(items):
        raise IntrinsicError(f"index {index} is out of bounds for an array of {len(items)} elements")
    return items[index]


def _f_array_length(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 1)
    return len(_array(args[0]))


def _f_array_unique(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 1)
    unique: list[Any] = []
    for item in _array(args[0]):
        if not any(_json_equal(item, kept) for kept in unique):
            unique.append(item)
    return unique


def _f_base64_encode(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 1)
    return base64.b64encode(_string(args[0], limit=_MAX_STRING).encode()).decode("ascii")


def _f_base64_decode(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 1)
    try:
        return base64.b64decode(_string(args[0], limit=_MAX_STRING), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise IntrinsicError(f"the argument is not base64-encoded UTF-8 text: {exc}") from exc


_HASHES = {"MD5": "md5", "SHA-1": "sha1", "SHA-256": "sha256", "SHA-384": "sha384", "SHA-512": "sha512"}


def _f_hash(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 2)
    data = _string(args[0], "the data", limit=_MAX_STRING)
    algorithm = _string(args[1], "the algorithm")
    if algorithm not in _HASHES:
        raise IntrinsicError(f"unsupported algorithm {algorithm!r} (one of {', '.join(_HASHES)})")
    return hashlib.new(_HASHES[algorithm], data.encode()).hexdigest()


def _f_json_merge(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 3)
    first, second, deep = args
    if not isinstance(first, dict) or not isinstance(second, dict):
        raise IntrinsicError("the first two arguments must be JSON objects")
    if deep is not False:
        raise IntrinsicError("only shallow merging is supported: the third argument must be false")
    return {**first, **second}


def _f_math_random(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 2, 3)
    start, end = _rounded(args[0], "the start"), _rounded(args[1], "the end")
    if start > end:
        raise IntrinsicError("the start must not be greater than the end")
    source = random.Random(_rounded(args[2], "the seed")) if len(args) == 3 else rng
    return source.randint(start, end)


def _f_math_add(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 2)
    values = [_rounded(value, "each argument") for value in args]
    total = values[0] + values[1]
    if not all(_INT32[0] <= v <= _INT32[1] for v in (*values, total)):
        raise IntrinsicError("the values must be 32-bit integers")
    return total


def _f_string_split(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 2)
    text = _string(args[0], "the string")
    delimiters = _string(args[1], "the delimiter")
    if not delimiters:
        raise IntrinsicError("the delimiter must not be empty")
    pattern = "[" + re.escape(delimiters) + "]"
    return [piece for piece in re.split(pattern, text) if piece]


def _f_uuid(args: list[Any], rng: random.Random) -> Any:
    _argc(args, 0)
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


FUNCTIONS: dict[str, Callable[[list[Any], random.Random], Any]] = {
    "States.Format": _f_format,
    "States.StringToJson": _f_string_to_json,
    "States.JsonToString": _f_json_to_string,
    "States.Array": _f_array,
    "States.ArrayPartition": _f_array_partition,
    "States.ArrayContains": _f_array_contains,
    "States.ArrayRange": _f_array_range,
    "States.ArrayGetItem": _f_array_get_item,
    "States.ArrayLength": _f_array_length,
    "States.ArrayUnique": _f_array_unique,
    "States.Base64Encode": _f_base64_encode,
    "States.Base64Decode": _f_base64_decode,
    "States.Hash": _f_hash,
    "States.JsonMerge": _f_json_merge,
    "States.MathRandom": _f_math_random,
    "States.MathAdd": _f_math_add,
    "States.StringSplit": _f_string_split,
    "States.UUID": _f_uuid,
}
