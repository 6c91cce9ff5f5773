"""Validation of an ASL definition (JSONPath and JSONata states) before anything runs.

Every problem is collected with its location (``States.Train.Retry[0].BackoffRate: ...``) and
reported at once in an ``AslDefinitionError``. Each state is checked in its own query language (the
top-level ``QueryLanguage``, or the state's own): a field of the other language is refused with the
service's words, every ``{% … %}`` expression must parse, and ``Assign`` names must be variable names.
Features the interpreter does not implement (task credentials) are refused here by name, so a
definition either runs with the service's semantics or does not start.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from d2ops.asl import intrinsics, jsonata_expr, variables
from d2ops.asl.errors import ALL, AslDefinitionError
from d2ops.asl.jsonvalue import json_problem
from d2ops.asl.paths import PathError, check_path, check_reference_path

_COMMON = {"Type", "Comment", "QueryLanguage"}
_IO = {"InputPath", "OutputPath", "Output"}
_FLOW = {"Next", "End", "Assign"}
_RESULT = {"ResultPath", "Parameters"}
_ERRORS = {"Retry", "Catch", "ResultSelector"}
FIELDS: dict[str, set[str]] = {
    "Pass": _COMMON | _IO | _FLOW | _RESULT | {"Result"},
    "Task": _COMMON | _IO | _FLOW | _RESULT | _ERRORS | {"Resource", "TimeoutSeconds", "TimeoutSecondsPath",
                                                          "HeartbeatSeconds", "HeartbeatSecondsPath", "Arguments"},
    "Choice": _COMMON | _IO | {"Choices", "Default", "Assign"},
    "Wait": _COMMON | _IO | _FLOW | {"Seconds", "SecondsPath", "Timestamp", "TimestampPath"},
    "Succeed": _COMMON | _IO,
    "Fail": _COMMON | {"Error", "Cause", "ErrorPath", "CausePath"},
    "Parallel": _COMMON | _IO | _FLOW | _RESULT | _ERRORS | {"Branches", "Arguments"},
    "Map": _COMMON | _IO | _FLOW | _RESULT | _ERRORS | {"Iterator", "ItemProcessor", "ItemsPath", "ItemSelector",
                                                         "MaxConcurrency", "MaxConcurrencyPath", "Items"} | {
        "ItemReader", "ItemBatcher", "ResultWriter", "ToleratedFailureCount", "ToleratedFailureCountPath",
        "ToleratedFailurePercentage", "ToleratedFailurePercentagePath", "Label"},
}
# Fields only a Distributed Map (ProcessorConfig.Mode DISTRIBUTED) may have.
DISTRIBUTED_ONLY = ("ItemReader", "ItemBatcher", "ResultWriter", "ToleratedFailureCount", "ToleratedFailureCountPath",
                    "ToleratedFailurePercentage", "ToleratedFailurePercentagePath", "Label")
_INLINE_JSONATA_IGNORED = ("ToleratedFailureCount", "ToleratedFailurePercentage")
_READER_RESOURCES = ("arn:aws:states:::s3:getObject", "arn:aws:states:::s3:listObjectsV2")
_LABEL_INVALID = set(' ?*<>{}[]:;,\\|^~$#%&`"/')
# Fields of the service the interpreter refuses, with the reason given to the user.
REFUSED: dict[str, str] = {
    "Credentials": "cross-account task Credentials are not supported",
}
JSONPATH = "JSONPath"
JSONATA = "JSONata"
QUERY_LANGUAGES = (JSONPATH, JSONATA)
# The fields each query language has alone (the service refuses the other language's).
JSONPATH_ONLY = frozenset({"InputPath", "OutputPath", "Parameters", "ResultSelector", "ResultPath", "Result",
                           "ItemsPath", "SecondsPath", "TimestampPath", "TimeoutSecondsPath", "HeartbeatSecondsPath",
                           "ErrorPath", "CausePath", "MaxConcurrencyPath", "ToleratedFailureCountPath",
                           "ToleratedFailurePercentagePath"})
JSONATA_ONLY = frozenset({"Arguments", "Output", "Items"})
_TOP_LEVEL = {"StartAt", "States", "Comment", "Version", "TimeoutSeconds", "QueryLanguage"}
_RETRIER = {"ErrorEquals", "IntervalSeconds", "MaxAttempts", "BackoffRate", "MaxDelaySeconds",
            "JitterStrategy", "Comment"}
_CATCHER = {"ErrorEquals", "Next", "ResultPath", "Comment", "Assign", "Output"}

_STRING_OPS = {"StringEquals", "StringLessThan", "StringGreaterThan", "StringLessThanEquals",
               "StringGreaterThanEquals"}
_NUMERIC_OPS = {"NumericEquals", "NumericLessThan", "NumericGreaterThan", "NumericLessThanEquals",
                "NumericGreaterThanEquals"}
_TIMESTAMP_OPS = {"TimestampEquals", "TimestampLessThan", "TimestampGreaterThan", "TimestampLessThanEquals",
                  "TimestampGreaterThanEquals"}
_TYPE_TESTS = {"IsNull", "IsPresent", "IsNumeric", "IsString", "IsBoolean", "IsTimestamp"}
COMPARATORS: set[str] = (
    _STRING_OPS | _NUMERIC_OPS | _TIMESTAMP_OPS | {"BooleanEquals", "StringMatches"} | _TYPE_TESTS
    | {op + "Path" for op in _STRING_OPS | _NUMERIC_OPS | _TIMESTAMP_OPS | {"BooleanEquals"}}
)
# The service's bounds (the Task and error-handling pages): seconds and attempts up to 99999999,
# MaxDelaySeconds below 31622401 (a year and a day).
_MAX_SECONDS = 99_999_999
_MAX_DELAY = 31_622_400
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def is_timestamp(value: Any) -> bool:
    """RFC 3339 with an uppercase T and Z or an offset, and a real instant (no 2024-02-30, no month 13)."""
    if not isinstance(value, str) or _TIMESTAMP.match(value) is None:
        return False
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def language_problem(key: str, language: str) -> str | None:
    """The service's refusal of a field that belongs to the other query language, or None."""
    other = JSONATA if language == JSONPATH else JSONPATH
    if key in (JSONATA_ONLY if language == JSONPATH else JSONPATH_ONLY):
        return f"The QueryLanguage is set to '{language}', but field '{key}' is only supported for the '{other}' " \
               "QueryLanguage"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@functools.lru_cache(maxsize=2048)
def parse_intrinsic(text: str) -> intrinsics.Call:
    return intrinsics.parse(text)


class _Validator:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.names: dict[str, str] = {}  # state name -> where it is defined (names are machine-wide)
        self.top_language = JSONPATH  # every state's language unless it names its own
        self.language = JSONPATH  # the language of the state being checked

    def problem(self, where: str, message: str) -> None:
        self.problems.append(f"{where or 'the definition'}: {message}")

    def machine(self, definition: Any, where: str, top_level: bool) -> None:
        language = self.language  # a nested machine's states must not change the enclosing state's language
        try:
            self._machine(definition, where, top_level)
        finally:
            self.language = language

    def _machine(self, definition: Any, where: str, top_level: bool) -> None:
        if not isinstance(definition, dict):
            self.problem(where, "must be a JSON object")
            return
        allowed = _TOP_LEVEL if top_level else {"StartAt", "States", "Comment", "ProcessorConfig"}
        if top_level and "QueryLanguage" in definition:
            if definition["QueryLanguage"] in QUERY_LANGUAGES:
                self.top_language = definition["QueryLanguage"]
            else:
                self.problem("QueryLanguage", f"must be {JSONPATH} or {JSONATA}")
        for key in definition:
            if key in REFUSED:
                self.problem(f"{where}.{key}" if where else key, REFUSED[key])
            elif key == "QueryLanguage" and not top_level:
                self.problem(f"{where}.{key}", "Field 'QueryLanguage' is not supported")  # the service's words
            elif key not in allowed:
                self.problem(f"{where}.{key}" if where else key, "unknown field")
        if "ProcessorConfig" in definition:
            config = definition["ProcessorConfig"]
            mode = config.get("Mode", "INLINE") if isinstance(config, dict) else None
            if mode not in ("INLINE", "DISTRIBUTED"):
                self.problem(f"{where}.ProcessorConfig.Mode", "must be INLINE or DISTRIBUTED")
            elif set(config) - {"Mode", "ExecutionType"}:
                unknown = ", ".join(sorted(set(config) - {"Mode", "ExecutionType"}))
                self.problem(f"{where}.ProcessorConfig", f"unknown field(s): {unknown}")
            elif mode == "DISTRIBUTED" and config.get("ExecutionType") not in ("STANDARD", "EXPRESS"):
                self.problem(f"{where}.ProcessorConfig.ExecutionType", "a Distributed Map needs ExecutionType "
                                                                       "STANDARD or EXPRESS")
            elif mode == "INLINE" and "ExecutionType" in config:
                self.problem(f"{where}.ProcessorConfig.ExecutionType", "only a Distributed Map (Mode DISTRIBUTED) "
                                                                       "has an ExecutionType")
        if top_level and "TimeoutSeconds" in definition:
            timeout = definition["TimeoutSeconds"]
            if not _is_int(timeout) or timeout <= 0:
                self.problem("TimeoutSeconds", "must be a positive integer")
        states = definition.get("States")
        start_at = definition.get("StartAt")
        prefix = f"{where}." if where else ""
        if not isinstance(states, dict) or not states:
            self.problem(f"{prefix}States", "missing or empty (a non-empty object of states is required)")
            states = {}
        if not isinstance(start_at, str):
            self.problem(f"{prefix}StartAt", "missing (the name of the first state is required)")
        elif states and start_at not in states:
            self.problem(f"{prefix}StartAt", f"names a state that does not exist: {start_at!r}")
        for name, state in states.items():
            state_where = f"{prefix}States.{name}"
            if name in self.names:
                self.problem(state_where, f"duplicate state name (also defined at {self.names[name]})")
            self.names[name] = state_where
            if len(name) > 80:
                self.problem(state_where, "state names are at most 80 characters")
            self.state(name, state, state_where, states)
        if isinstance(start_at, str) and start_at in states:
            unreachable = set(states) - self._reachable(start_at, states)
            for name in sorted(unreachable):
                self.problem(f"{prefix}States.{name}", "is not reachable from StartAt")

    @staticmethod
    def _reachable(start: str, states: dict[str, Any]) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            name = todo.pop()
            if name in seen or name not in states or not isinstance(states[name], dict):
                continue
            seen.add(name)
            state = states[name]
            targets = [state.get("Next"), state.get("Default")]
            targets += [rule.get("Next") for rule in state.get("Choices", []) if isinstance(rule, dict)]
            targets += [c.get("Next") for c in state.get("Catch", []) if isinstance(c, dict)]
            todo.extend(t for t in targets if isinstance(t, str))
        return seen

    def state(self, name: str, state: Any, where: str, scope: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            self.problem(where, "must be a JSON object")
            return
        kind = state.get("Type")
        if kind not in FIELDS:
            self.problem(f"{where}.Type", f"missing or unknown state type {kind!r} (one of {', '.join(FIELDS)})")
            return
        language = state.get("QueryLanguage", self.top_language)
        if language not in QUERY_LANGUAGES:
            self.problem(f"{where}.QueryLanguage", f"must be {JSONPATH} or {JSONATA}")
            language = self.top_language
        elif language == JSONPATH and self.top_language == JSONATA:
            # The service's words.
            self.problem(f"{where}.QueryLanguage", "'QueryLanguage' can not be 'JSONPath' if set to 'JSONata' for "
                                                   "whole state machine")
        self.language = language
        for key in state:
            if key in REFUSED:
                self.problem(f"{where}.{key}", REFUSED[key])
            elif key not in FIELDS[kind]:
                self.problem(f"{where}.{key}", f"unknown field for a {kind} state")
            elif (refusal := language_problem(key, language)) is not None:
                self.problem(f"{where}.{key}", refusal)
        self.transition(state, kind, where, scope)
        for key in ("InputPath", "OutputPath"):
            if key in state and state[key] is not None:
                self.path(state[key], f"{where}.{key}")
        if "ResultPath" in state and state["ResultPath"] is not None:
            self.path(state["ResultPath"], f"{where}.ResultPath", reference=True, writes=True)
        for key in ("Parameters", "ResultSelector", "ItemSelector"):
            if key in state:
                if language == JSONATA:
                    self.jsonata(state[key], f"{where}.{key}")
                else:
                    self.template(state[key], f"{where}.{key}")
        for key in ("Arguments", "Output", "Items"):
            if key in state and language == JSONATA:
                self.jsonata(state[key], f"{where}.{key}")
        if "Assign" in state:
            self.assign(state["Assign"], f"{where}.Assign")
        if "Retry" in state:
            self.retriers(state["Retry"], f"{where}.Retry")
        if "Catch" in state:
            self.catchers(state["Catch"], f"{where}.Catch", scope)
        getattr(self, f"state_{kind.lower()}")(name, state, where, scope)

    def transition(self, state: dict[str, Any], kind: str, where: str, scope: dict[str, Any]) -> None:
        if kind in ("Choice", "Succeed", "Fail"):
            return
        has_next, end = "Next" in state, state.get("End")
        if "End" in state and end is not True:
            self.problem(f"{where}.End", "must be true when present")
        if has_next == (end is True):
            self.problem(where, "needs exactly one of Next or End: true")
        if has_next:
            self.target(state["Next"], f"{where}.Next", scope)

    def target(self, name: Any, where: str, scope: dict[str, Any]) -> None:
        if name is None:
            self.problem(where, "missing (the name of the state to go to)")
        elif not isinstance(name, str) or name not in scope:
            self.problem(where, f"names a state that does not exist in this scope: {name!r}")

    def path(self, value: Any, where: str, reference: bool = False, writes: bool = False) -> None:
        try:
            if reference:
                check_reference_path(value, variables_allowed=not writes)
            else:
                check_path(value)
        except PathError as exc:
            self.problem(where, str(exc))

    def jsonata(self, template: Any, where: str) -> None:
        """Every expression of a JSONata field must parse (INVALID_JSONATA_EXPRESSION, as the service says)."""
        for text in jsonata_expr.expressions(template):
            try:
                name = jsonata_expr.top_level_reference(text)
            except jsonata_expr.JsonataSyntaxError as exc:
                self.problem(where, f"INVALID_JSONATA_EXPRESSION: {exc}")
                continue
            if name is not None:  # the service's words
                self.problem(where, f"UNSUPPORTED_JSONATA_EXPRESSION: Reference to '{name}' at the top level is not "
                                    "supported.")

    def expression_or(self, state: dict[str, Any], key: str, where: str) -> bool:
        """In a JSONata state, a field given as an expression is checked by parsing it; True if it was one."""
        if self.language == JSONATA and jsonata_expr.is_expression(state.get(key)):
            self.jsonata(state[key], f"{where}.{key}")
            return True
        return False

    def assign(self, assign: Any, where: str) -> None:
        if not isinstance(assign, dict):
            self.problem(where, "must be a JSON object of variable names and values")
            return
        for key, value in assign.items():
            name = key[:-2] if self.language == JSONPATH and key.endswith(".$") else key
            problem = variables.name_problem(name)
            if problem is not None:
                self.problem(f"{where}.{key}", problem)
            if self.language == JSONATA:
                self.jsonata(value, f"{where}.{key}")
            else:
                self.template_field(key, value, where)

    def path_or_intrinsic(self, value: Any, where: str, reference: bool = False) -> None:
        if intrinsics.is_intrinsic(value):
            try:
                parse_intrinsic(value)
            except intrinsics.IntrinsicError as exc:
                self.problem(where, str(exc))
        else:
            self.path(value, where, reference=reference)

    def template_field(self, key: str, value: Any, where: str) -> None:
        """One field of a JSONPath payload template: a '.$' key takes a path or intrinsic, any other a template."""
        if key.endswith(".$"):
            if not isinstance(value, str):
                self.problem(f"{where}.{key}", "a '.$' field needs a path or intrinsic function string")
            else:
                self.path_or_intrinsic(value, f"{where}.{key}")
        else:
            self.template(value, f"{where}.{key}")

    def template(self, template: Any, where: str) -> None:
        if isinstance(template, dict):
            for key, value in template.items():
                self.template_field(key, value, where)
        elif isinstance(template, list):
            for index, item in enumerate(template):
                self.template(item, f"{where}[{index}]")

    def error_equals(self, value: Any, where: str, is_last: bool) -> None:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            self.problem(where, "must be a non-empty array of error names")
            return
        if ALL in value and (len(value) > 1 or not is_last):
            self.problem(where, "States.ALL must appear alone and in the last retrier/catcher")

    def handlers(self, items: Any, where: str, kind: str, fields: set[str]) -> Iterable[tuple[str, dict[str, Any]]]:
        """The well-formed retriers or catchers of ``items`` (with where they are), after the checks they share."""
        if not isinstance(items, list):
            self.problem(where, f"must be an array of {kind}s")
            return
        for index, item in enumerate(items):
            at = f"{where}[{index}]"
            if not isinstance(item, dict):
                self.problem(at, "must be an object")
                continue
            for key in sorted(set(item) - fields):
                self.problem(f"{at}.{key}", f"unknown {kind} field")
            self.error_equals(item.get("ErrorEquals"), f"{at}.ErrorEquals", index == len(items) - 1)
            yield at, item

    def retriers(self, retriers: Any, where: str) -> None:
        for at, retrier in self.handlers(retriers, where, "retrier", _RETRIER):
            checks = {
                "IntervalSeconds": (lambda v: _is_int(v) and 1 <= v <= _MAX_SECONDS,
                                    f"must be a positive integer up to {_MAX_SECONDS}"),
                "MaxAttempts": (lambda v: _is_int(v) and 0 <= v <= _MAX_SECONDS,
                                f"must be an integer from 0 to {_MAX_SECONDS}"),
                "BackoffRate": (lambda v: _is_number(v) and v >= 1.0, "must be a number >= 1.0"),
                "MaxDelaySeconds": (lambda v: _is_int(v) and 1 <= v <= _MAX_DELAY,
                                    f"must be a positive integer up to {_MAX_DELAY}"),
                "JitterStrategy": (lambda v: v in ("FULL", "NONE"), "must be FULL or NONE"),
            }
            for key, (ok, message) in checks.items():
                if key in retrier and not ok(retrier[key]):
                    self.problem(f"{at}.{key}", message)

    def catchers(self, catchers: Any, where: str, scope: dict[str, Any]) -> None:
        for at, catcher in self.handlers(catchers, where, "catcher", _CATCHER):
            self.target(catcher.get("Next"), f"{at}.Next", scope)
            for key in ("ResultPath", "Output"):
                if key in catcher and (refusal := language_problem(key, self.language)) is not None:
                    self.problem(f"{at}.{key}", refusal)
            if catcher.get("ResultPath") is not None and self.language == JSONPATH:
                self.path(catcher["ResultPath"], f"{at}.ResultPath", reference=True, writes=True)
            if "Output" in catcher and self.language == JSONATA:
                self.jsonata(catcher["Output"], f"{at}.Output")
            if "Assign" in catcher:
                self.assign(catcher["Assign"], f"{at}.Assign")

    def seconds_field(self, state: dict[str, Any], value_key: str, path_key: str, where: str) -> None:
        if self.expression_or(state, value_key, where):
            return
        if value_key in state and path_key in state:
            self.problem(where, f"{value_key} and {path_key} are mutually exclusive")
        if value_key in state and (not _is_int(state[value_key]) or state[value_key] <= 0):
            self.problem(f"{where}.{value_key}", "must be a positive integer")
        elif value_key in state and state[value_key] > _MAX_SECONDS:
            self.problem(f"{where}.{value_key}", f"must be at most {_MAX_SECONDS}")
        if path_key in state:
            self.path(state[path_key], f"{where}.{path_key}", reference=True)

    # One method per state type, for the fields only that type has.
    def state_pass(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        pass

    def state_succeed(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        pass

    def state_task(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        if not isinstance(state.get("Resource"), str) or not state["Resource"].startswith("arn:"):
            self.problem(f"{where}.Resource", "missing or not an ARN")
        self.seconds_field(state, "TimeoutSeconds", "TimeoutSecondsPath", where)
        self.seconds_field(state, "HeartbeatSeconds", "HeartbeatSecondsPath", where)
        timeout, heartbeat = state.get("TimeoutSeconds"), state.get("HeartbeatSeconds")
        if isinstance(timeout, int) and isinstance(heartbeat, int) and _is_int(timeout) and heartbeat >= timeout:
            self.problem(f"{where}.HeartbeatSeconds", "must be smaller than TimeoutSeconds")

    def state_wait(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        present = [k for k in ("Seconds", "SecondsPath", "Timestamp", "TimestampPath") if k in state]
        if len(present) != 1:
            self.problem(where, "needs exactly one of Seconds, SecondsPath, Timestamp, TimestampPath")
        seconds_expression = self.expression_or(state, "Seconds", where)
        timestamp_expression = self.expression_or(state, "Timestamp", where)
        if "Seconds" in state and not seconds_expression and (not _is_int(state["Seconds"])
                                                               or not 0 <= state["Seconds"] <= 99_999_999):
            self.problem(f"{where}.Seconds", "must be an integer from 0 to 99999999")  # AWS's Wait limit
        if "Timestamp" in state and not timestamp_expression and not is_timestamp(state["Timestamp"]):
            self.problem(f"{where}.Timestamp", "must be an ISO 8601 timestamp like 2016-03-14T01:59:00Z")
        for key in ("SecondsPath", "TimestampPath"):
            if key in state:
                self.path(state[key], f"{where}.{key}", reference=True)

    def state_fail(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        for value_key, path_key in (("Error", "ErrorPath"), ("Cause", "CausePath")):
            if value_key in state and path_key in state:
                self.problem(where, f"{value_key} and {path_key} are mutually exclusive")
            if self.expression_or(state, value_key, where):
                continue
            if value_key in state and not isinstance(state[value_key], str):
                self.problem(f"{where}.{value_key}", "must be a string")
            if path_key in state:
                self.path_or_intrinsic(state[path_key], f"{where}.{path_key}", reference=True)

    def state_choice(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        choices = state.get("Choices")
        if not isinstance(choices, list) or not choices:
            self.problem(f"{where}.Choices", "must be a non-empty array of choice rules")
            choices = []
        for index, rule in enumerate(choices):
            self.rule(rule, f"{where}.Choices[{index}]", top=True, scope=scope)
        if "Default" in state:
            self.target(state["Default"], f"{where}.Default", scope)

    def rule(self, rule: Any, where: str, top: bool, scope: dict[str, Any]) -> None:
        if not isinstance(rule, dict):
            self.problem(where, "must be an object")
            return
        if top:
            self.target(rule.get("Next"), f"{where}.Next", scope)
        elif "Next" in rule:
            self.problem(f"{where}.Next", "only top-level choice rules may have Next")
        if top and "Assign" in rule:
            self.assign(rule["Assign"], f"{where}.Assign")
        if self.language == JSONATA:
            self.jsonata_rule(rule, where)
            return
        combinators = [k for k in ("And", "Or", "Not") if k in rule]
        operators = [k for k in rule if k in COMPARATORS]
        allowed = {"Next", "Comment", "Variable", *combinators, *operators} | ({"Assign"} if top else set())
        for key in sorted(set(rule) - allowed):
            if key in ("Condition", "Output"):
                self.problem(f"{where}.{key}", language_problem(key, JSONPATH) or "")
            else:
                self.problem(f"{where}.{key}", "unknown choice rule field")
        if len(combinators) + len(operators) != 1:
            self.problem(where, "needs exactly one comparison operator or one of And/Or/Not")
            return
        if combinators:
            key = combinators[0]
            if "Variable" in rule:
                self.problem(f"{where}.Variable", f"not allowed beside {key}")
            if key == "Not":
                self.rule(rule["Not"], f"{where}.Not", top=False, scope=scope)
            elif not isinstance(rule[key], list) or not rule[key]:
                self.problem(f"{where}.{key}", "must be a non-empty array of choice rules")
            else:
                for index, sub in enumerate(rule[key]):
                    self.rule(sub, f"{where}.{key}[{index}]", top=False, scope=scope)
            return
        operator, value = operators[0], rule[operators[0]]
        if "Variable" not in rule:
            self.problem(where, "a comparison needs a Variable")
        else:
            self.path(rule["Variable"], f"{where}.Variable")
        at = f"{where}.{operator}"
        if operator.endswith("Path"):
            self.path(value, at, reference=True)
        elif operator in _STRING_OPS or operator == "StringMatches":
            if not isinstance(value, str):
                self.problem(at, "must be a string")
        elif operator in _NUMERIC_OPS:
            if not _is_number(value):
                self.problem(at, "must be a number")
        elif operator in _TIMESTAMP_OPS:
            if not is_timestamp(value):
                self.problem(at, "must be an ISO 8601 timestamp")
        elif not isinstance(value, bool):  # BooleanEquals and the Is* type tests
            self.problem(at, "must be true or false")

    def jsonata_rule(self, rule: dict[str, Any], where: str) -> None:
        """A JSONata choice rule: a Condition (true, false or an expression), optionally Assign and Output."""
        for key in sorted(set(rule) - {"Next", "Comment", "Condition", "Assign", "Output"}):
            if key == "Variable" or key in COMPARATORS or key in ("And", "Or", "Not"):
                self.problem(f"{where}.{key}", f"The QueryLanguage is set to '{JSONATA}', but field '{key}' is only "
                                               f"supported for the '{JSONPATH}' QueryLanguage")
            else:
                self.problem(f"{where}.{key}", "unknown choice rule field")
        if "Condition" not in rule:
            self.problem(where, "a JSONata choice rule needs a Condition")
        elif not isinstance(rule["Condition"], bool) and not jsonata_expr.is_expression(rule["Condition"]):
            self.problem(f"{where}.Condition", "must be true, false or a JSONata expression {% ... %}")
        else:
            self.jsonata(rule["Condition"], f"{where}.Condition")
        if "Output" in rule:
            self.jsonata(rule["Output"], f"{where}.Output")

    def state_parallel(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        branches = state.get("Branches")
        if not isinstance(branches, list) or not branches:
            self.problem(f"{where}.Branches", "must be a non-empty array of branches")
            return
        for index, branch in enumerate(branches):
            self.machine(branch, f"{where}.Branches[{index}]", top_level=False)

    def state_map(self, name: str, state: dict[str, Any], where: str, scope: dict[str, Any]) -> None:
        keys = [k for k in ("Iterator", "ItemProcessor") if k in state]
        if len(keys) != 1:
            self.problem(where, "needs exactly one of ItemProcessor or Iterator")
        else:
            self.machine(state[keys[0]], f"{where}.{keys[0]}", top_level=False)
        if "Parameters" in state and "ItemSelector" in state:
            self.problem(where, "Parameters and ItemSelector are mutually exclusive")
        if "ItemsPath" in state:
            self.path(state["ItemsPath"], f"{where}.ItemsPath", reference=True)
        if self.language == JSONATA and "Items" in state and not (
                isinstance(state["Items"], list) or jsonata_expr.is_expression(state["Items"])):
            self.problem(f"{where}.Items", "must be an array or a JSONata expression {% ... %}")
        concurrency_expression = self.expression_or(state, "MaxConcurrency", where)
        if "MaxConcurrency" in state and not concurrency_expression and (
                not _is_int(state["MaxConcurrency"]) or state["MaxConcurrency"] < 0):
            self.problem(f"{where}.MaxConcurrency", "must be a non-negative integer")
        if "MaxConcurrencyPath" in state:
            self.path(state["MaxConcurrencyPath"], f"{where}.MaxConcurrencyPath", reference=True)
        if "MaxConcurrency" in state and "MaxConcurrencyPath" in state:
            self.problem(where, "MaxConcurrency and MaxConcurrencyPath are mutually exclusive")
        processor = state.get(keys[0]) if len(keys) == 1 else None
        config = processor.get("ProcessorConfig") if isinstance(processor, dict) else None
        if isinstance(config, dict) and config.get("Mode") == "DISTRIBUTED":
            self.distributed(state, where)
        else:
            for key in DISTRIBUTED_ONLY:
                # AWS creates and runs an inline JSONata Map that names a tolerated failure count or percentage
                # (recorded); an inline Map fails with its first failed iteration, so they change nothing.
                if key in state and not (self.language == JSONATA and key in _INLINE_JSONATA_IGNORED):
                    self.problem(f"{where}.{key}", "only a Distributed Map (ItemProcessor.ProcessorConfig.Mode "
                                                   "DISTRIBUTED) has this field")

    def distributed(self, state: dict[str, Any], where: str) -> None:
        """The Distributed Map's own fields, as the service checks them when the state machine is created."""
        for key in ("ToleratedFailureCount", "ToleratedFailurePercentage", "Label"):
            if key in state and key + "Path" in state:
                self.problem(where, f"{key} and {key}Path are mutually exclusive")
        for key in ("ToleratedFailureCountPath", "ToleratedFailurePercentagePath"):
            if key in state:
                self.path(state[key], f"{where}.{key}", reference=True)
        count = None if self.expression_or(state, "ToleratedFailureCount", where) \
            else state.get("ToleratedFailureCount")
        if count is not None and (not _is_int(count) or count < 0):
            self.problem(f"{where}.ToleratedFailureCount", "must be a non-negative integer")
        percentage = None if self.expression_or(state, "ToleratedFailurePercentage", where) \
            else state.get("ToleratedFailurePercentage")
        if percentage is not None and (not _is_number(percentage) or not 0 <= percentage <= 100):
            self.problem(f"{where}.ToleratedFailurePercentage", "must be a number from 0 to 100")
        if "Label" in state:
            label = state["Label"]
            # The service's words (CreateStateMachine's InvalidDefinition messages).
            if not isinstance(label, str):
                self.problem(f"{where}.Label", "must be a string")
            elif not label:
                self.problem(f"{where}.Label", "Label cannot be empty")
            elif len(label) > 40:
                self.problem(f"{where}.Label", "Label cannot exceed 40 characters")
            else:
                bad = next((c for c in label if c in _LABEL_INVALID or ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
                if bad is not None:
                    self.problem(f"{where}.Label", f"Label contains invalid character: {bad!r}")
        if "ItemReader" in state:
            self.item_reader(state["ItemReader"], f"{where}.ItemReader")
        if "ItemBatcher" in state:
            self.item_batcher(state["ItemBatcher"], f"{where}.ItemBatcher")
        if "ResultWriter" in state:
            self.result_writer(state["ResultWriter"], f"{where}.ResultWriter")

    def _fields(self, value: Any, where: str, allowed: set[str]) -> bool:
        if not isinstance(value, dict):
            self.problem(where, "must be an object")
            return False
        for key in sorted(set(value) - allowed):
            self.problem(f"{where}.{key}", "unknown field")
        return True

    def _positive(self, config: dict[str, Any], key: str, where: str, maximum: int | None = None) -> None:
        if self.expression_or(config, key, where):
            return
        if key + "Path" in config and (refusal := language_problem(key + "Path", self.language)) is not None:
            self.problem(f"{where}.{key}Path", refusal)
            return
        if key in config and key + "Path" in config:
            self.problem(where, f"{key} and {key}Path are mutually exclusive")
        if key in config:
            value = config[key]
            if not _is_int(value) or value < 0 or (maximum is not None and value > maximum):
                bound = f" up to {maximum}" if maximum is not None else ""
                self.problem(f"{where}.{key}", f"must be a non-negative integer{bound}")
        if key + "Path" in config:
            self.path(config[key + "Path"], f"{where}.{key}Path", reference=True)

    def arguments(self, holder: dict[str, Any], where: str) -> str:
        """The payload template key of an ItemReader/ResultWriter in this state's language (Parameters or
        Arguments), refusing the other one."""
        key = "Arguments" if self.language == JSONATA else "Parameters"
        other = "Parameters" if key == "Arguments" else "Arguments"
        if other in holder:
            owner = JSONPATH if other == "Parameters" else JSONATA
            self.problem(f"{where}.{other}", f"The QueryLanguage is set to '{self.language}', but field '{other}' is "
                                             f"only supported for the '{owner}' QueryLanguage")
        return key

    def payload(self, template: Any, where: str) -> None:
        if self.language == JSONATA:
            self.jsonata(template, where)
        else:
            self.template(template, where)

    def item_reader(self, reader: Any, where: str) -> None:
        if not self._fields(reader, where, {"Resource", "ReaderConfig", "Parameters", "Arguments"}):
            return
        key = self.arguments(reader, where)
        resource = reader.get("Resource")
        normalised = re.sub(r"^arn:[^:]*:", "arn:aws:", resource) if isinstance(resource, str) else resource
        if normalised not in _READER_RESOURCES:
            self.problem(f"{where}.Resource", f"must be one of {', '.join(_READER_RESOURCES)}: {resource!r}")
        if key in reader:
            self.payload(reader[key], f"{where}.{key}")
        config = reader.get("ReaderConfig", {})
        if not self._fields(config, f"{where}.ReaderConfig", {"InputType", "CSVHeaderLocation", "CSVHeaders",
                                                              "CSVDelimiter", "MaxItems", "MaxItemsPath",
                                                              "ManifestType"}):
            return
        input_type = config.get("InputType")
        if input_type == "PARQUET":
            self.problem(f"{where}.ReaderConfig.InputType", "InputType PARQUET is not supported by the interpreter")
            return
        if "ManifestType" in config and (input_type != "MANIFEST" or config["ManifestType"] != "S3_INVENTORY"):
            self.problem(f"{where}.ReaderConfig.ManifestType", "only ManifestType S3_INVENTORY (with InputType "
                                                               "MANIFEST) is supported by the interpreter")
        if normalised == _READER_RESOURCES[0] and input_type not in ("JSON", "JSONL", "CSV", "MANIFEST"):
            self.problem(f"{where}.ReaderConfig.InputType", "s3:getObject needs InputType JSON, JSONL, CSV or "
                                                            f"MANIFEST (got {input_type!r})")
        if normalised == _READER_RESOURCES[1] and input_type is not None:
            self.problem(f"{where}.ReaderConfig.InputType", "s3:listObjectsV2 takes no InputType")
        csv_keys = [k for k in ("CSVHeaderLocation", "CSVHeaders", "CSVDelimiter") if k in config]
        if input_type != "CSV" and csv_keys:
            self.problem(f"{where}.ReaderConfig.{csv_keys[0]}", "only InputType CSV has this field")
        if input_type == "CSV":
            location = config.get("CSVHeaderLocation")
            if location not in ("FIRST_ROW", "GIVEN"):
                self.problem(f"{where}.ReaderConfig.CSVHeaderLocation", "InputType CSV needs CSVHeaderLocation "
                                                                        "FIRST_ROW or GIVEN")
            headers = config.get("CSVHeaders")
            if location == "GIVEN" and (not isinstance(headers, list) or not headers
                                        or not all(isinstance(h, str) for h in headers)):
                self.problem(f"{where}.ReaderConfig.CSVHeaders", "CSVHeaderLocation GIVEN needs CSVHeaders, a "
                                                                 "non-empty array of strings")
            if location == "FIRST_ROW" and headers is not None:
                self.problem(f"{where}.ReaderConfig.CSVHeaders", "only CSVHeaderLocation GIVEN has CSVHeaders")
            if "CSVDelimiter" in config and config["CSVDelimiter"] not in ("COMMA", "PIPE", "SEMICOLON", "SPACE",
                                                                           "TAB"):
                self.problem(f"{where}.ReaderConfig.CSVDelimiter", "must be COMMA, PIPE, SEMICOLON, SPACE or TAB")
        self._positive(config, "MaxItems", f"{where}.ReaderConfig", 100_000_000)

    def item_batcher(self, batcher: Any, where: str) -> None:
        if not self._fields(batcher, where, {"MaxItemsPerBatch", "MaxItemsPerBatchPath", "MaxInputBytesPerBatch",
                                             "MaxInputBytesPerBatchPath", "BatchInput"}):
            return
        if not any(k in batcher for k in ("MaxItemsPerBatch", "MaxItemsPerBatchPath", "MaxInputBytesPerBatch",
                                          "MaxInputBytesPerBatchPath")):
            self.problem(where, "needs MaxItemsPerBatch(Path) or MaxInputBytesPerBatch(Path)")
        self._positive(batcher, "MaxItemsPerBatch", where)
        self._positive(batcher, "MaxInputBytesPerBatch", where, 256 * 1024)
        for key in ("MaxItemsPerBatch", "MaxInputBytesPerBatch"):
            if batcher.get(key) == 0:
                self.problem(f"{where}.{key}", "must be a positive integer")
        if "BatchInput" in batcher:
            self.payload(batcher["BatchInput"], f"{where}.BatchInput")

    def result_writer(self, writer: Any, where: str) -> None:
        if not self._fields(writer, where, {"Resource", "Parameters", "Arguments", "WriterConfig"}):
            return
        key = self.arguments(writer, where)
        # The documented combinations: WriterConfig alone (the state output), or Resource with Parameters
        # (an export to S3), with or without WriterConfig.
        if "WriterConfig" in writer:
            config = writer["WriterConfig"]
            if self._fields(config, f"{where}.WriterConfig", {"Transformation", "OutputType"}):
                if config.get("Transformation", "NONE") not in ("NONE", "COMPACT", "FLATTEN"):
                    self.problem(f"{where}.WriterConfig.Transformation", "must be NONE, COMPACT or FLATTEN")
                if config.get("OutputType", "JSON") not in ("JSON", "JSONL"):
                    self.problem(f"{where}.WriterConfig.OutputType", "must be JSON or JSONL")
            if "Resource" not in writer and key not in writer:
                return
        elif "Resource" not in writer and key not in writer:
            self.problem(where, f"cannot be empty: needs WriterConfig, or Resource and {key}")
            return
        resource = writer.get("Resource")
        normalised = re.sub(r"^arn:[^:]*:", "arn:aws:", resource) if isinstance(resource, str) else resource
        if normalised != "arn:aws:states:::s3:putObject":
            self.problem(f"{where}.Resource", f"must be arn:aws:states:::s3:putObject: {resource!r}")
        parameters = writer.get(key)
        if self.language == JSONATA and jsonata_expr.is_expression(parameters):
            self.jsonata(parameters, f"{where}.{key}")
        elif not isinstance(parameters, dict) or not ({"Bucket", "Bucket.$"} & set(parameters)):
            self.problem(f"{where}.{key}", "needs Bucket (and optionally Prefix)")
        else:
            self.payload(parameters, f"{where}.{key}")


def validate(definition: Any, *, source: str | None = None) -> None:
    """Raise AslDefinitionError listing every problem of ``definition``; return None if it can run."""
    problem = json_problem(definition)
    if problem is not None:  # the checks below recurse once per level of nesting
        raise AslDefinitionError(f"not a usable definition: {problem}", source=source)
    validator = _Validator()
    validator.machine(definition, "", top_level=True)
    if validator.problems:
        raise AslDefinitionError(validator.problems, source=source)


def task_states(definition: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """Every Task state of a (validated) definition, branches and iterators included."""
    for name, state in definition["States"].items():
        if state["Type"] == "Task":
            yield name, state
        for branch in state.get("Branches", []):
            yield from task_states(branch)
        for key in ("Iterator", "ItemProcessor"):
            if key in state:
                yield from task_states(state[key])
