"""JSONPath as Step Functions uses it: reference paths (one node) and general paths (any query).

Reference paths (``$``, ``$.a.b``, ``$['a b'][0]``) are parsed here, so ResultPath can create
and overwrite nodes and a missing node is reported precisely. Anything else (wildcards, slices,
filters, ``..``) is a query evaluated by jsonpath-ng and always yields a list, as in the service.
Paths starting with ``$$`` address the context object instead of the state's input.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from jsonpath_ng import JSONPath
from jsonpath_ng.exceptions import JsonPathParserError
from jsonpath_ng.ext import parse as _jsonpath_parse
from jsonpath_ng.ext.filter import Filter

from d2ops.asl import variables

Step = str | int

# Characters that end a dot-notation field name.
_NAME = re.compile(r"[^.\[\]'\"\s*,()@?$]+")
_INDEX = re.compile(r"\[\s*(-?\d+)\s*\]")
_QUOTED = re.compile(r"""\[\s*(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")\s*\]""")
# Jayway JsonPath (Step Functions' path engine) unescapes quoted names like a JSON string does.
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)")


def _unescape(text: str, quote: str) -> str:
    """``\\'`` ``\\"`` ``\\\\`` ``\\/`` ``\\n``... and ``\\uXXXX`` in a name quoted with ``quote``, as Jayway reads
    them, except that an escaped quote of the other kind keeps its backslash: AWS-recorded, ``$['Test\\""Name"']``
    selects the key ``Test\\""Name"`` (LocalStack's snapshot test_base_scenarios::test_escape_sequence_parsing
    [ESCAPE_SEQUENCES_JSONPATH], recorded against AWS)."""
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if len(code) == 5:
            return chr(int(code[1:], 16))
        if code in "'\"" and code != quote:
            return match.group(0)
        return _ESCAPES.get(code, code)
    return _ESCAPE.sub(one, text)


class PathError(ValueError):
    """A path that does not parse, or that matches nothing in the data it is applied to."""


def parse_reference_path(path: str) -> tuple[Step, ...] | None:
    """The steps of a reference path (without its ``$``/``$$`` root), or None if it is not one."""
    parsed = _parse_steps(path)
    return None if parsed is None else tuple(step for step, _ in parsed)


def _parse_steps(path: str) -> list[tuple[Step, str]] | None:
    """Each step of a reference path with the quote its name was written with (``'`` for dot notation)."""
    if path.startswith("$$"):
        path = path[1:]
    if not path.startswith("$"):
        return None
    steps: list[tuple[Step, str]] = []
    pos = 1
    while pos < len(path):
        if path.startswith(".[", pos):  # $.abc.['def ghi'], the guide's own example: the dot is optional
            pos += 1
            continue
        if path[pos] == ".":
            match = _NAME.match(path, pos + 1)
            if not match:
                return None
            steps.append((match.group(0), "'"))
        elif (match := _INDEX.match(path, pos)) is not None:
            steps.append((int(match.group(1)), ""))
        elif (match := _QUOTED.match(path, pos)) is not None:
            quoted = match.group(1) is not None
            quote = "'" if quoted else '"'
            steps.append((_unescape(match.group(1) if quoted else match.group(2), quote), quote))
        else:
            return None
        pos = match.end()
    return steps


class _ObjectsOnlyFilter(Filter):
    """A filter as Step Functions runs it: "The @ operator ... does not match scalar values. It only
    matches objects." (the paths page), so ``$.tags[?(@ == 'a')]`` selects nothing."""

    def find(self, datum: Any) -> Any:
        return [match for match in super().find(datum) if isinstance(match.value, dict)]


def _objects_only(node: Any, seen: set[int]) -> None:
    """Give every filter in a compiled query the service's semantics (the tree is walked, not copied)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if type(node) is Filter:
        node.__class__ = _ObjectsOnlyFilter
    for child in vars(node).values() if hasattr(node, "__dict__") else ():
        for item in child if isinstance(child, list | tuple) else (child,):
            if isinstance(item, JSONPath):
                _objects_only(item, seen)


_QUOTED_TEXT = re.compile(r"'((?:[^'\\]|\\.)*)'" + r'|"((?:[^"\\]|\\.)*)"')


def _as_jayway_reads(path: str) -> str:
    """A query path whose quoted names and strings mean what Jayway (Step Functions' path engine) reads:
    each is unescaped by Jayway's rules (``\\n`` ``\\t`` ``\\uXXXX`` ``\\/`` included, which jsonpath-ng
    would keep as two characters), then quoted again escaping only the backslash and the quote."""
    def requote(match: re.Match[str]) -> str:
        single = match.group(1) is not None
        quote = "'" if single else '"'
        text = _unescape(match.group(1) if single else match.group(2), quote)
        return quote + text.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote
    return _QUOTED_TEXT.sub(requote, path)


@functools.lru_cache(maxsize=1024)
def _compile_query(path: str) -> Any:
    try:
        query = _jsonpath_parse(_as_jayway_reads(path))
        _objects_only(query, set())
    except RecursionError as exc:  # the parser and the query tree recurse once per step
        raise PathError(f"the JSONPath {_shorten(path)} has too many steps") from exc
    except (JsonPathParserError, Exception) as exc:  # jsonpath-ng's lexer raises plain Exceptions too
        raise PathError(f"invalid JSONPath {path!r}: {exc}") from exc
    return query


def _shorten(path: str, limit: int = 80) -> str:
    return repr(path if len(path) <= limit else path[: limit - 3] + "...")


def check_path(path: str) -> None:
    """Raise PathError unless ``path`` is a valid JSONPath (reference or query); ``$name...`` reads a
    workflow variable."""
    if not isinstance(path, str) or not path.startswith("$"):
        raise PathError(f"a path must be a string starting with '$', got {path!r}")
    split = variables.split_path(path)
    if split is not None:
        path = split[1]
    if parse_reference_path(path) is None:
        _check_supported(path)
        _compile_query(path[1:] if path.startswith("$$") else path)


# What the Step Functions paths page says its JsonPath does not support.
_FUNCTION = re.compile(r"\.\s*[A-Za-z_]\w*\s*\(\s*\)\s*$")
_FILTER = re.compile(r"\[\s*\?\s*\((.*?)\)\s*\]")
_STRING_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')


def _check_supported(path: str) -> None:
    if _FUNCTION.search(path):
        raise PathError(f"{path!r}: functions such as length() are not supported in Step Functions paths "
                        "(States.ArrayLength does that)")
    for condition in _FILTER.findall(path):
        condition = _STRING_LITERAL.sub("''", condition)  # a '$' inside a quoted operand is just text
        if "=~" in condition:
            raise PathError(f"{path!r}: filtering by regular expression is not supported in Step Functions paths")
        if "$" in condition:
            raise PathError(f"{path!r}: a filter referencing another value in the JSON structure ($...) is not "
                            "supported in Step Functions paths")


def check_reference_path(path: str, *, variables_allowed: bool = True) -> None:
    """Raise PathError unless ``path`` is a reference path (it must identify a single node). A variable
    may start it (``$name.a``) except where a value is written (ResultPath)."""
    split = variables.split_path(path) if isinstance(path, str) and variables_allowed else None
    if split is not None:
        path = split[1]
    if not isinstance(path, str) or parse_reference_path(path) is None:
        raise PathError(f"{path!r} is not a reference path ($, .field, ['field'] and [index] steps only)")


def _brief(data: Any, limit: int = 200) -> str:
    text = json.dumps(data, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def get_reference(data: Any, steps: tuple[Step, ...], path: str) -> Any:
    node = data
    for step in steps:
        found_key = isinstance(step, str) and isinstance(node, dict) and step in node
        found_index = isinstance(step, int) and isinstance(node, list) and -len(node) <= step < len(node)
        if found_key or found_index:
            node = node[step]
        else:
            raise PathError(f"the JSONPath {path!r} could not be found in the input {_brief(data)}")
    return node


_NO_ROOT = object()


def no_results(path: str, root: Any = _NO_ROOT) -> str | None:
    """Jayway JsonPath's words (Step Functions' path engine) for a reference path that matches
    nothing: ``No results for path: $['a']['b'][0]``, or, when a name before the last is missing from
    an object of ``root``, ``Missing property in path $['a']`` (up to that name, as AWS records it);
    None for other paths."""
    steps = _parse_steps(path)
    if steps is None:
        return None
    # Jayway prints each name between the quote it was written with, without escaping anything
    # (PropertyPathToken.getPathFragment): $['it's'], $["x"].
    fragments = [f"[{step}]" if isinstance(step, int) else f"[{quote}{step}{quote}]" for step, quote in steps]
    node = root
    for position, (step, _) in enumerate(steps[:-1] if root is not _NO_ROOT else ()):
        if isinstance(step, str) and isinstance(node, dict) and step not in node:
            return f"Missing property in path ${''.join(fragments[:position + 1])}"
        present = (isinstance(step, str) and isinstance(node, dict)) or (
            isinstance(step, int) and isinstance(node, list) and -len(node) <= step < len(node))
        if not present:
            break
        node = node[step]
    return f"No results for path: ${''.join(fragments)}"


def select(path: str, data: Any, context: Any = None) -> Any:
    """Evaluate ``path`` against ``data`` (or ``context`` for ``$$`` paths) with Step Functions rules.

    A reference path must match exactly one node (else PathError); a query path returns the list
    of its matches.
    """
    root = data
    if path.startswith("$$"):
        root, path = context, path[1:]
    elif (split := variables.split_path(path)) is not None:
        name, path = split
        scope = variables.current()
        found, root = scope.lookup(name) if scope is not None else (False, None)
        if not found:
            raise PathError(f"the variable ${name} is not defined")
    steps = parse_reference_path(path)
    if steps is not None:
        return get_reference(root, steps, path)
    if not path.startswith("$"):
        raise PathError(f"a path must start with '$', got {path!r}")
    try:
        return [match.value for match in _compile_query(path).find(root)]
    except RecursionError as exc:  # a query with very many steps over deep data
        raise PathError(f"the JSONPath {_shorten(path)} has too many steps to evaluate") from exc


def set_reference(data: Any, steps: tuple[Step, ...], value: Any, path: str) -> Any:
    """A copy of ``data`` with ``value`` placed at the reference path (intermediate objects created).

    Raises PathError when an existing node on the way is not an object (or a list for an index).
    """
    if not steps:
        return value
    head, rest = steps[0], steps[1:]
    if isinstance(head, str):
        if not isinstance(data, dict):
            raise PathError(f"unable to apply ResultPath {path!r} to input {_brief(data)}: {head!r} needs an object")
        updated = dict(data)
        updated[head] = set_reference(data.get(head, {}) if rest else None, rest, value, path)
        return updated
    if not isinstance(data, list) or not -len(data) <= head < len(data):
        raise PathError(f"unable to apply ResultPath {path!r} to input {_brief(data)}: no element [{head}]")
    items = list(data)
    items[head] = set_reference(items[head], rest, value, path)
    return items
