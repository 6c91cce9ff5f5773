"""The intrinsic function parser and the functions' edge cases (beyond the documented examples)."""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

import pytest

from d2ops.asl import StateMachine
from d2ops.asl.intrinsics import IntrinsicError, Literal, PathArg, evaluate, parse


def ev(expression: str, data: Any = None, seed: int | None = None) -> Any:
    return evaluate(parse(expression), data or {}, {"Execution": {"Name": "x"}},
                    random.Random(seed) if seed is not None else None)


def test_parser_handles_nesting_literals_escapes_and_paths() -> None:
    call = parse(r"States.Array( 'it\'s', -1.5, 2e3, 7, null, true, false, $.a['b,c'][0], $$.Execution.Name,"
                 r" States.Array())")
    assert call.name == "States.Array"
    assert call.args[:7] == (Literal("it's", ("it's",)), Literal(-1.5), Literal(2000.0), Literal(7), Literal(None),
                             Literal(True), Literal(False))
    assert call.args[7:9] == (PathArg("$.a['b,c'][0]"), PathArg("$$.Execution.Name"))
    assert ev(r"States.Array($.a['b,c'][0], $$.Execution.Name, States.Array())", {"a": {"b,c": [9]}}) == [9, "x", []]


@pytest.mark.parametrize(("expression", "message"), [
    ("States.Format('x'", "expected ',' or ')'"),
    ("States.Format('x)", "unterminated string literal"),
    ("States.Unknown(1)", "unknown intrinsic function States.Unknown"),
    (r"States.Format('a\b')", "open escape backslash"),
    ("States.Array(1) trailing", "unexpected text"),
    ("States.Array(@)", "expected a string, number, path"),
    ("States.Array($.a[)", "invalid JSONPath"),
    ("States.Array(" * 11 + ")" * 11, "more than 10 nested"),
])
def test_parse_errors_name_the_problem_and_position(expression: str, message: str) -> None:
    with pytest.raises(IntrinsicError, match=re.escape(message)):
        parse(expression)


def test_format_escapes_and_argument_types() -> None:
    assert ev(r"States.Format('\{\} is literal, {} is not \\', 'this')") == "{} is literal, this is not \\"
    assert ev("States.Format('{} {} {} {}', 1, 2.5, null, true)") == "1 2.5 null true"
    # Objects and arrays are printed the way the service's Java runtime prints them.
    assert ev("States.Format('{} {}', $.o, $.l)", {"o": {"a": [1, "x"], "b": None}, "l": []}) == "{a=[1, x], b=null} []"
    with pytest.raises(IntrinsicError, match="2 placeholders but 1 arguments"):
        ev("States.Format('{}{}', 1)")


@pytest.mark.parametrize(("expression", "data", "message"), [
    ("States.StringToJson($.s)", {"s": "{nope"}, "not a JSON text"),
    ("States.ArrayPartition($.a, 0)", {"a": [1]}, "greater than 0"),
    ("States.ArrayPartition($.a, 1)", {"a": "x"}, "must be an array"),
    ("States.ArrayRange(1, 2000, 1)", {}, "more than 1000"),
    ("States.ArrayRange(1, 5, 0)", {}, "must be a positive integer"),
    ("States.ArrayRange(9, 1, -4)", {}, "must be a positive integer"),
    ("States.Hash($.o, 'MD5')", {"o": {"a": 1}}, "the data must be a string"),
    ("States.Hash($.s, 'MD5')", {"s": "x" * 10_001}, "longer than 10000"),
    ("States.ArrayGetItem($.a, 3)", {"a": [1, 2, 3]}, "out of bounds"),
    ("States.Base64Decode('***')", {}, "not base64"),
    ("States.Hash('x', 'SHA-3')", {}, "unsupported algorithm"),
    ("States.JsonMerge($.a, $.a, true)", {"a": {}}, "only shallow merging"),
    ("States.MathAdd(2147483647, 1)", {}, "32-bit"),
    ("States.MathAdd('1', 1)", {}, "must be a number"),
    ("States.MathRandom(5, 1)", {}, "must not be greater"),
    ("States.StringSplit($.s, '')", {"s": "a"}, "must not be empty"),
    ("States.UUID(1)", {}, "expected 0 arguments"),
    ("States.Array($.missing)", {}, "could not be found"),
])
def test_function_errors(expression: str, data: Any, message: str) -> None:
    with pytest.raises(IntrinsicError, match=message):
        ev(expression, data)


def test_functions_beyond_the_examples() -> None:
    assert ev("States.ArrayRange(0.6, 4.4, 1.5)") == [1, 3]  # arguments are rounded
    assert ev("States.ArrayRange(5, 1, 1)") == []
    assert ev("States.ArrayContains($.a, $.v)", {"a": [{"k": [1]}], "v": {"k": [1]}}) is True
    assert ev("States.ArrayUnique($.a)", {"a": [{"x": 1}, {"x": 1}, 1, "1"]}) == [{"x": 1}, 1, "1"]
    # JSON equality, not Python's: true is not 1, false is not 0, also inside objects
    assert ev("States.ArrayContains($.a, 1)", {"a": [True, {"k": 1}]}) is False
    assert ev("States.ArrayContains($.a, $.v)", {"a": [{"k": False}], "v": {"k": 0}}) is False
    assert ev("States.ArrayUnique($.a)", {"a": [1, True, 0, False, 1, True]}) == [1, True, 0, False]
    assert ev("States.MathAdd(1.4, 2.6)") == 4  # non-integers are rounded
    assert ev("States.StringSplit(',a,,b,', ',')") == ["a", "b"]
    for name, algorithm in (("MD5", "md5"), ("SHA-256", "sha256"), ("SHA-384", "sha384"), ("SHA-512", "sha512")):
        assert ev(f"States.Hash('input data', '{name}')") == hashlib.new(algorithm, b"input data").hexdigest()
    assert ev("States.Base64Decode(States.Base64Encode('üñí'))") == "üñí"
    assert ev("States.StringToJson(States.JsonToString($.o))", {"o": {"a": [1, None]}}) == {"a": [1, None]}


def test_random_functions_are_seedable() -> None:
    values = {ev("States.MathRandom(1, 3)", seed=s) for s in range(40)}
    assert values == {1, 2, 3}  # both ends included
    assert ev("States.MathRandom(0.6, 1.4)") == 1
    assert ev("States.MathRandom(1, 1000, 42)") == ev("States.MathRandom(1, 1000, 42)")
    first, second = ev("States.UUID()", seed=5), ev("States.UUID()", seed=5)
    assert first == second
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", first)


def test_an_intrinsic_failure_at_runtime_is_states_runtime_naming_the_field() -> None:
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True,
                                                   "Parameters": {"part.$": "States.ArrayGetItem($.a, 5)"}}}}
    execution = StateMachine.from_definition(definition, name="I").run({"a": [1]})
    assert execution.error == "States.Runtime"
    assert "Parameters.part.$" in (execution.cause or "") and "out of bounds" in (execution.cause or "")
