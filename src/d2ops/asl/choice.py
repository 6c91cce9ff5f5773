"""Choice rule evaluation with the service's typing rules.

A comparison whose variable has the wrong type is simply false (``NumericEquals`` on a string
never matches); a Variable or ``...Path`` operand that matches nothing is a ``States.Runtime``
error, except under ``IsPresent``. Strings compare like Java's ``String.compareTo`` (UTF-16 code
units); timestamps compare as instants.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import datetime
from typing import Any

from d2ops.asl.definition import is_timestamp
from d2ops.asl.errors import RUNTIME, StatesError
from d2ops.asl.paths import PathError, select

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "Equals": operator.eq, "LessThan": operator.lt, "GreaterThan": operator.gt,
    "LessThanEquals": operator.le, "GreaterThanEquals": operator.ge,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _java_key(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def string_matches(value: str, pattern: str) -> bool:
    """``StringMatches``: ``*`` matches any run of characters; ``\\*`` and ``\\\\`` are literal.

    The literal pieces between stars are matched greedily left to right with ``str.find`` (leftmost
    is always safe when ``*`` is the only wildcard), so a long value and a pattern of many stars
    cost linear time, not the quadratic backtracking of a naive matcher or a regex.
    """
    pieces: list[str] = []  # the literal runs between stars
    current: list[str] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and index + 1 < len(pattern) and pattern[index + 1] in "*\\":
            current.append(pattern[index + 1])
            index += 2
            continue
        if char == "*":
            pieces.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    pieces.append("".join(current))
    if len(pieces) == 1:
        return value == pieces[0]
    first, last = pieces[0], pieces[-1]
    if len(value) < len(first) + len(last) or not value.startswith(first) or not value.endswith(last):
        return False
    position, stop = len(first), len(value) - len(last)
    for piece in pieces[1:-1]:
        found = value.find(piece, position, stop)
        if found < 0:
            return False
        position = found + len(piece)
    return True


class ConditionPathError(StatesError):
    """A Variable or ``...Path`` operand that matches nothing; the Choice state adds where it ran."""

    def __init__(self, path: str) -> None:
        # AWS's words, after its "An error occurred while executing the state ..." prefix.
        super().__init__(RUNTIME, f"Invalid path '{path}': The choice state's condition path references an "
                                  "invalid value.")
        self.path = path


def _lookup(path: str, data: Any, context: Any, field: str) -> Any:
    try:
        return select(path, data, context)
    except PathError as exc:
        raise ConditionPathError(path) from exc


def evaluate_rule(rule: dict[str, Any], data: Any, context: Any) -> bool:
    if "And" in rule:
        return all(evaluate_rule(sub, data, context) for sub in rule["And"])
    if "Or" in rule:
        return any(evaluate_rule(sub, data, context) for sub in rule["Or"])
    if "Not" in rule:
        return not evaluate_rule(rule["Not"], data, context)
    op = next(key for key in rule if key not in ("Variable", "Next", "Comment"))
    expected = rule[op]
    if op == "IsPresent":
        try:
            select(rule["Variable"], data, context)
            present = True
        except PathError:
            present = False
        return present is expected
    value = _lookup(rule["Variable"], data, context, "Variable")
    if op.endswith("Path"):
        expected = _lookup(expected, data, context, op)
        op = op[: -len("Path")]
    if op.startswith("Is"):
        checks: dict[str, Callable[[Any], bool]] = {
            "IsNull": lambda v: v is None, "IsNumeric": _is_number, "IsString": lambda v: isinstance(v, str),
            "IsBoolean": lambda v: isinstance(v, bool), "IsTimestamp": is_timestamp,
        }
        return checks[op](value) is expected
    if op == "StringMatches":
        return isinstance(value, str) and string_matches(value, expected)
    if op == "BooleanEquals":
        return isinstance(value, bool) and isinstance(expected, bool) and value is expected
    for prefix, accepts, key in (
        ("String", lambda v: isinstance(v, str), _java_key),
        ("Numeric", _is_number, lambda v: v),
        ("Timestamp", is_timestamp, _instant),
    ):
        if op.startswith(prefix):
            if not (accepts(value) and accepts(expected)):
                return False
            return _COMPARE[op[len(prefix):]](key(value), key(expected))
    raise StatesError(RUNTIME, f"unsupported comparison operator {op}")
