"""Workflow variables (``Assign``, read as ``$name`` from JSONPath and JSONata states).

One ``VariableScope`` per execution; every Parallel branch and inline Map iteration runs in a child
scope that reads its parents' variables, while whatever it assigns stays inside it (a Distributed
Map's children are executions of their own and see nothing of the parent's). A state's ``Assign``
is evaluated against the values the variables had when the state was entered; ``commit`` makes the
new values visible once the state is done with them, so its own ``Output`` still reads the old ones.

Limits are the service's (developer guide, "Passing data between states with variables"): a name is
a Unicode identifier of at most 80 characters and never ``states`` (the reserved ``$states``); one
value is at most 256 KiB, one Assign at most 256 KiB in all, and an execution's variables together
at most 10 MiB (``States.DataLimitExceeded``).

JSONPath paths read the state's variables through ``current()``: the interpreter sets them for the
duration of each state with ``reading``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
import threading
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

from d2ops.asl.errors import DATA_LIMIT_EXCEEDED, StatesError

RESERVED = "states"
MAX_NAME_LENGTH = 80
MAX_VALUE_BYTES = 256 * 1024
MAX_ASSIGN_BYTES = 256 * 1024
MAX_EXECUTION_BYTES = 10 * 1024 * 1024
# A JSONPath that starts with a variable: ``$name`` then ``.field``/``[...]`` steps (or nothing).
_VARIABLE_PATH = re.compile(r"^\$([^\W\d]\w*)(?=$|[.\[])", re.UNICODE)


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a variable name, or None."""
    if not isinstance(name, str) or not name:
        return "a variable name must be a non-empty string"
    if len(name) > MAX_NAME_LENGTH:
        return f"variable names are at most {MAX_NAME_LENGTH} characters"
    if name == RESERVED:
        return "'states' is a reserved variable name ($states)"
    first_ok = name[0] == "_" or unicodedata.category(name[0]) in ("Lu", "Ll", "Lt", "Lm", "Lo", "Nl")
    if not first_ok or not all(c == "_" or c.isalnum() or unicodedata.category(c) in ("Mn", "Mc", "Pc")
                               for c in name[1:]):
        return f"{name!r} is not a valid variable name (a letter or _ first, then letters, digits or _)"
    return None


def split_path(path: str) -> tuple[str, str] | None:
    """``$name.a[0]`` -> ``("name", "$.a[0]")``; None when the path does not start with a variable."""
    if path.startswith("$$"):
        return None
    match = _VARIABLE_PATH.match(path)
    if match is None:
        return None
    return match.group(1), "$" + path[match.end():]


class VariableScope:
    """The variables one branch of an execution sees: its own, then its parents'."""

    def __init__(self, parent: VariableScope | None = None) -> None:
        self.parent = parent
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._bytes = 0  # the size of this scope's own values (the 10 MiB limit counts the live chain)

    def child(self) -> VariableScope:
        return VariableScope(self)

    def lookup(self, name: str) -> tuple[bool, Any]:
        scope: VariableScope | None = self
        while scope is not None:
            with scope._lock:
                if name in scope._values:
                    return True, scope._values[name]
            scope = scope.parent
        return False, None

    def snapshot(self) -> dict[str, Any]:
        """Every variable this scope reads, inner values shadowing outer ones."""
        chain = []
        scope: VariableScope | None = self
        while scope is not None:
            chain.append(scope)
            scope = scope.parent
        values: dict[str, Any] = {}
        for scope in reversed(chain):
            with scope._lock:
                values.update(scope._values)
        return values

    def commit(self, assigned: Mapping[str, Any], state: str) -> None:
        """Make a state's assignments visible (in this scope only), within the service's size limits."""
        total = 0
        for name, value in assigned.items():
            size = _size(value)
            total += size
            if size > MAX_VALUE_BYTES:
                raise StatesError(DATA_LIMIT_EXCEEDED, f"The state '{state}' assigned the variable '{name}' a value "
                                                       f"of {size} bytes, over the {MAX_VALUE_BYTES} byte limit.")
        if total > MAX_ASSIGN_BYTES:
            raise StatesError(DATA_LIMIT_EXCEEDED, f"The Assign of state '{state}' is {total} bytes in all, over the "
                                                   f"{MAX_ASSIGN_BYTES} byte limit.")
        outer = 0
        scope = self.parent
        while scope is not None:  # what the enclosing scopes hold (a finished iteration's values are gone)
            outer += scope._bytes
            scope = scope.parent
        with self._lock:
            before = sum(_size(self._values[n]) for n in assigned if n in self._values)
            if outer + self._bytes - before + total > MAX_EXECUTION_BYTES:
                raise StatesError(DATA_LIMIT_EXCEEDED, f"The state '{state}' would make the execution's variables "
                                                       f"larger than {MAX_EXECUTION_BYTES} bytes.")
            self._bytes += total - before
            self._values.update(assigned)


_CURRENT: contextvars.ContextVar[VariableScope | None] = contextvars.ContextVar("asl_variables", default=None)


def current() -> VariableScope | None:
    """The variables of the state running on this thread (None outside a state)."""
    return _CURRENT.get()


@contextlib.contextmanager
def reading(scope: VariableScope | None) -> Iterator[None]:
    token = _CURRENT.set(scope)
    try:
        yield
    finally:
        _CURRENT.reset(token)
