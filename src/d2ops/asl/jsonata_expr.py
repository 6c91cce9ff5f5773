"""JSONata in Step Functions: ``{% … %}`` expressions, evaluated by the jsonata-python library.

The one place the interpreter touches the library: expressions are parsed once (cached), run with
``$states`` (``input``, ``result``, ``errorOutput``, ``context``) and the workflow variables bound,
plus the functions Step Functions adds (``$partition $range $hash $random $uuid $parse``; ``$eval``
is not available, as in the service). Values cross as JSON: JSON ``null`` stays null, an expression
that yields nothing (JSONata's undefined) or a function is an error.

Every runtime failure is ``States.QueryEvaluationError`` with the service's wording (recorded
executions): "The JSONata expression '<expr>' specified for the field '<field>' returned nothing
(undefined)." / "... threw an error during evaluation. <code>: <message>" / "... returned an
unexpected result type. Expected '<type>', but was '<type>' for value: <json>" / "... returned an
unsupported result type.", after "An error occurred while executing the state ..." which the
interpreter puts in front.
"""

from __future__ import annotations

import functools
import json
import random
import sys
from collections.abc import Callable, Mapping
from typing import Any

_RECURSION_LIMIT = sys.getrecursionlimit()
import jsonata  # noqa: E402 (the library raises the process's recursion limit to 10,000 when imported)
from jsonata import jexception, parser, timebox  # noqa: E402
from jsonata.utils import Utils  # noqa: E402

# Put it back: the interpreter's depth limits (jsonvalue.MAX_JSON_DEPTH, the path checks) are set for
# Python's default, and deep recursion in a worker thread must end as a RecursionError, not a crash.
sys.setrecursionlimit(_RECURSION_LIMIT)

from d2ops.asl import intrinsics  # noqa: E402
from d2ops.asl.errors import StatesError  # noqa: E402
from d2ops.asl.jsonvalue import MAX_JSON_DEPTH  # noqa: E402

QUERY_EVALUATION_ERROR = "States.QueryEvaluationError"
_MAX_SAFE_INTEGER = 2**53
# One expression's bounds. The service evaluates a state's expressions in bounded time (an endless
# loop does not hold an execution open for a year); it does not publish the bound, so this one is
# generous -- real expressions take milliseconds -- yet ends a runaway `$f := function($x){ $f($x) }`
# (a tail call, which never deepens the stack) within seconds, as a States.QueryEvaluationError.
EVALUATION_TIMEOUT_MS = 5000
# Nested evaluation steps (about three per call of a recursive function) before the library's "D1011:
# Stack overflow". About where Python's default recursion limit stops the library anyway (a
# RecursionError, given the same cause); it still holds if something raises that limit again (the
# library sets 10,000 on import), where a worker thread's C stack could overflow first.
EVALUATION_MAX_DEPTH = 300


class JsonataSyntaxError(ValueError):
    """An expression the JSONata parser refuses (the service refuses the definition)."""


def is_expression(value: Any) -> bool:
    """Whether a field value is a JSONata expression: a string that is exactly ``{% … %}``."""
    return isinstance(value, str) and len(value) >= 4 and value.startswith("{%") and value.endswith("%}")


def body(text: str) -> str:
    return text[2:-2].strip()


@functools.lru_cache(maxsize=4096)
def compile_expression(text: str) -> jsonata.Jsonata:
    """The parsed expression of ``{% text %}`` (raises JsonataSyntaxError)."""
    source = body(text)
    if not source:
        raise JsonataSyntaxError("the expression is empty")
    try:
        return jsonata.Jsonata(source)
    except jexception.JException as exc:
        raise JsonataSyntaxError(_message(exc)) from exc
    except (RecursionError, ValueError, TypeError, IndexError) as exc:  # the parser's own failures
        raise JsonataSyntaxError(str(exc)) from exc


# jsonata-js (the service's engine) names an array signature's member type in the plural.
_ARRAY_OF = {"a": "arrays", "b": "booleans", "f": "functions", "n": "numbers", "o": "objects", "s": "strings"}


# Parts of a step evaluated against that step's values, not the expression's input: a predicate or
# filter, a group-by, a focus/index binding, a lambda's body.
_RELATIVE = frozenset({"stages", "predicate", "group", "focus", "index", "body", "tuple", "terms"})


def top_level_reference(text: str) -> str | None:
    """The first field name an expression reads from the document root, or None. A Step Functions
    expression has no root document (data comes from ``$states`` and variables): the service refuses
    ``phone`` or ``$count(phone)`` at load, while ``$states.input.phone`` or ``items[price > 5]`` inside
    a path are fine."""
    seen: set[int] = set()

    def visit(node: Any, root: bool) -> str | None:
        if isinstance(node, list | tuple):
            for item in node:
                if (found := visit(item, root)) is not None:
                    return found
            return None
        if not isinstance(node, parser.Parser.Symbol) or id(node) in seen:
            return None
        seen.add(id(node))
        if node.type == "path":
            for position, step in enumerate(node.steps or []):
                if (found := visit(step, root and position == 0)) is not None:
                    return found
            return None
        if node.type == "name" and root:
            return str(node.value)
        for key, value in vars(node).items():
            if not key.startswith("_") and key != "steps" and (found := visit(value, root and key not in _RELATIVE)):
                return found
        return None

    return visit(compile_expression(text).ast, True)


def _message(exc: BaseException) -> str:
    """``<code>: <message>`` as jsonata-js words it (quoted values are JSON, as its templates write them).
    The library garbles two signature messages ("of Object sum"); those are rebuilt from its fields."""
    fields: Any = exc
    code = getattr(fields, "error", None)
    text = str(exc)
    function = getattr(fields, "expected", None)
    if code == "T0410" and isinstance(function, str):
        text = f"Argument {json.dumps(fields.current)} of function {json.dumps(function)} does not match function " \
               "signature"
    elif code == "T0412" and isinstance(function, str):
        kind = _ARRAY_OF.get(str(fields.extra), str(fields.extra))
        text = f"Argument {json.dumps(fields.current)} of function {json.dumps(function)} must be an array of " \
               f"{json.dumps(kind)}"
    return f"{code}: {text}" if isinstance(code, str) and code and not text.startswith(code) else text


class _TooDeep(Exception):
    pass


def _copy(value: Any, leaf: Callable[[Any], Any], max_depth: int | None = None) -> Any:
    """A copy of nested objects/arrays with every other value passed through ``leaf``, made without
    recursion: an expression can build a value thousands of levels deep (``$reduce`` wrapping an object
    in itself), deeper than Python's recursion limit. Raises _TooDeep past ``max_depth`` levels."""
    holder: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, holder, 0, 1)]
    while stack:
        node, parent, slot, depth = stack.pop()
        if isinstance(node, dict | list | tuple) and max_depth is not None and depth > max_depth:
            raise _TooDeep
        branch: Any
        if isinstance(node, dict):
            keys = [str(key) for key in node]
            parent[slot] = branch = dict.fromkeys(keys)  # keys placed now keep the document's order
            stack.extend((item, branch, key, depth + 1) for key, item in zip(keys, node.values(), strict=True))
        elif isinstance(node, list | tuple):
            parent[slot] = branch = [None] * len(node)
            stack.extend((item, branch, index, depth + 1) for index, item in enumerate(node))
        else:
            parent[slot] = leaf(node)
    return holder[0]


def _jsonata_leaf(value: Any) -> Any:
    return Utils.NULL_VALUE if value is None else value


def _to_jsonata(value: Any) -> Any:
    """JSON from the execution -> the library's values (JSON null is its NULL_VALUE, not undefined)."""
    return _copy(value, _jsonata_leaf)


class _Unsupported(Exception):
    pass


def _json_leaf(value: Any) -> Any:
    if value is None or value is Utils.NULL_VALUE:
        return None
    if isinstance(value, bool | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < _MAX_SAFE_INTEGER else value
    if isinstance(value, int):
        return value
    raise _Unsupported(type(value).__name__)


def _to_json(value: Any) -> Any:
    """The library's result -> JSON (its sequences become lists; an integral float an integer, as JSON
    written by JavaScript has it). Raises _TooDeep for a value no payload may hold (MAX_JSON_DEPTH)."""
    return _copy(value, _json_leaf, MAX_JSON_DEPTH)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class FunctionError(jexception.JException):
    """An error from a function Step Functions adds (``$partition``, ``$hash``…): the library's
    JException takes its message arguments as template values, so its text would be another code's."""

    def __init__(self, message: str) -> None:
        super().__init__("D3001", 0)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _intrinsic(name: str, rng: random.Random) -> Callable[..., Any]:
    function = intrinsics.FUNCTIONS[name]

    def call(*args: Any) -> Any:
        try:
            values = [_to_json(a) for a in args]
        except _TooDeep as exc:
            raise FunctionError(f"an argument is nested more than {MAX_JSON_DEPTH} levels deep") from exc
        except _Unsupported as exc:
            raise FunctionError("an argument is not a JSON value") from exc
        try:
            return _to_jsonata(function(values, rng))
        except intrinsics.IntrinsicError as exc:
            raise FunctionError(str(exc)) from exc

    return call


def _sequence(function: Callable[..., Any]) -> Callable[..., Any]:
    """AWS's $range yields a JSONata sequence, so a one-element range is that element (recorded:
    $range(1, 9, 9) is 1), while $partition's chunks stay an array."""
    def call(*args: Any) -> Any:
        result = function(*args)
        return result[0] if isinstance(result, list) and len(result) == 1 else result

    return call


def _random(rng: random.Random) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if args and args[0] is not None:
            try:
                seed = _to_json(args[0])
            except (_TooDeep, _Unsupported):
                seed = None
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise FunctionError("the seed of $random must be an integer")
            return random.Random(seed).random()
        return rng.random()

    return call


def _functions(rng: random.Random) -> dict[str, Any]:
    lam = jsonata.Jsonata.JLambda
    return {
        "partition": lam(_intrinsic("States.ArrayPartition", rng)),
        "range": lam(_sequence(_intrinsic("States.ArrayRange", rng))),
        "hash": lam(_intrinsic("States.Hash", rng)),
        "uuid": lam(_intrinsic("States.UUID", rng)),
        "parse": lam(_intrinsic("States.StringToJson", rng)),
        "random": lam(_random(rng)),
        "eval": None,  # not available in Step Functions: invoking it fails (T1006)
    }


class Evaluator:
    """Evaluates the JSONata fields of one state: ``$states`` and the variables are bound once."""

    def __init__(self, states: Mapping[str, Any], variables: Mapping[str, Any], rng: random.Random,
                 prefix: str, on_error: Callable[[StatesError, str | None], None] | None = None) -> None:
        bindings = {name: _to_jsonata(value) for name, value in variables.items()}
        bindings["states"] = _to_jsonata(dict(states))
        bindings.update(_functions(rng))
        self._bindings = bindings
        self._prefix = prefix  # "An error occurred while executing the state ..."
        # Told of each failure with the field it is in (the service records an EvaluationFailed event).
        self._on_error = on_error

    def fail(self, text: str, field: str, detail: str) -> StatesError:
        return self.error(f"The JSONata expression '{body(text)}' specified for the field '{field}' {detail}", field)

    def error(self, detail: str, field: str | None) -> StatesError:
        """A States.QueryEvaluationError of this state (``field``: where, or None for the state as a whole),
        reported to ``on_error`` before the caller raises it."""
        err = StatesError(QUERY_EVALUATION_ERROR, f"{self._prefix} {detail}")
        if self._on_error is not None:
            self._on_error(err, field)
        return err

    def expression(self, text: str, field: str) -> Any:
        """The JSON value of one ``{% … %}`` expression."""
        try:
            expr = compile_expression(text)
        except JsonataSyntaxError as exc:  # validated at load; kept for definitions built around validation
            raise self.fail(text, field, f"could not be parsed. {exc}") from exc
        jsonata.Jsonata.CURRENT.jsonata = expr  # the library's per-thread "current expression"
        expr.set_output_convert_nulls(False)
        # The bounds live on a frame of this evaluation alone: the parsed expression is cached and shared,
        # and a timeout given to its constructor would count from when it was parsed.
        frame = expr.create_frame()
        for name, value in self._bindings.items():
            frame.bind(name, value)
        timebox.Timebox(frame, EVALUATION_TIMEOUT_MS, EVALUATION_MAX_DEPTH)
        try:
            raw = expr.evaluate(None, frame)
        except jexception.JException as exc:
            raise self.fail(text, field, f"threw an error during evaluation. {_message(exc)}") from exc
        except RecursionError as exc:  # the same overflow, caught by Python before the depth bound
            overflow = _message(jexception.JException("D1011", -1))
            raise self.fail(text, field, f"threw an error during evaluation. {overflow}") from exc
        except Exception as exc:  # the library's own bugs must still end as the service's error
            raise self.fail(text, field, f"threw an error during evaluation. {exc}") from exc
        if raw is None:
            raise self.fail(text, field, "returned nothing (undefined).")
        try:
            return _to_json(raw)
        except _Unsupported as exc:
            raise self.fail(text, field, "returned an unsupported result type.") from exc
        except _TooDeep as exc:
            raise self.fail(text, field, f"returned a value nested more than {MAX_JSON_DEPTH} levels deep, more "
                                         "than a state's data may be.") from exc

    def typed(self, text: str, field: str, expected: str, check: Callable[[Any], bool]) -> Any:
        """An expression whose value must be of one kind (``Items``: an array, ``Seconds``: an integer…)."""
        value = self.expression(text, field)
        if not check(value):
            raise self.fail(text, field, f"returned an unexpected result type. Expected '{expected}', but was "
                                         f"'{_type_name(value)}' for value: {_dumps(value)}")
        return value

    def template(self, template: Any, field: str) -> Any:
        """A JSON template whose string leaves may be expressions (Arguments, Output, ItemSelector...)."""
        if is_expression(template):
            return self.expression(template, field)
        if isinstance(template, dict):
            return {key: self.template(value, f"{field}/{key}") for key, value in template.items()}
        if isinstance(template, list):
            return [self.template(value, f"{field}[{index}]") for index, value in enumerate(template)]
        return template


def expressions(template: Any) -> list[str]:
    """Every ``{% … %}`` expression in a template (for validation)."""
    if is_expression(template):
        return [template]
    if isinstance(template, dict):
        return [text for value in template.values() for text in expressions(value)]
    if isinstance(template, list):
        return [text for value in template for text in expressions(value)]
    return []
