"""Step Functions Local's mock configuration file (``MockConfigFile.json``).

``{"StateMachines": {<name>: {"TestCases": {<case>: {<state>: <mocked response name>}}}},
"MockedResponses": {<name>: {"0": {"Return": ...}, "1-2": {"Throw": {"Error", "Cause"}}}}}``.
The keys of a mocked response are invocation numbers (0-based) or inclusive ranges; a state's
invocations are counted over the whole execution (retries and loop visits alike). An invocation
with no entry is an error rather than a silent reuse of the last one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

from d2ops.asl.errors import AslDefinitionError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class _Throw(BaseModel):
    model_config = ConfigDict(extra="forbid")
    Error: str
    Cause: str = ""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    Return: Any = None
    Throw: _Throw | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> _Entry:
        if ("Return" in self.model_fields_set) == ("Throw" in self.model_fields_set):
            raise ValueError("each mocked response entry needs exactly one of Return or Throw")
        return self


class _StateMachineCases(BaseModel):
    model_config = ConfigDict(extra="forbid")
    TestCases: dict[str, dict[str, str]]


class _MockFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    StateMachines: dict[str, _StateMachineCases] = Field(default_factory=dict)
    MockedResponses: dict[str, dict[str, _Entry]] = Field(default_factory=dict)


_MockFileRoot = RootModel[_MockFile]


@dataclass(frozen=True)
class MockOutcome:
    """One mocked invocation: a result (``returned``) or a failure (``error``/``cause``)."""

    returned: Any = None
    error: str | None = None
    cause: str = ""


@dataclass(frozen=True)
class MockedResponse:
    name: str
    entries: tuple[tuple[int, int, MockOutcome], ...]

    def outcome(self, invocation: int) -> MockOutcome | None:
        for low, high, outcome in self.entries:
            if low <= invocation <= high:
                return outcome
        return None

    def describe_keys(self) -> str:
        return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi, _ in self.entries)


@dataclass(frozen=True)
class MockTestCase:
    """The mocked responses of one test case, by Task state name."""

    state_machine: str
    name: str
    responses: dict[str, MockedResponse]


class MockConfig:
    def __init__(self, data: Any, *, source: str | None = None) -> None:
        self.source = source
        try:
            model = _MockFileRoot.model_validate(data).root
        except ValidationError as exc:
            raise AslDefinitionError([f"{'.'.join(str(p) for p in err['loc'] if p != 'root') or '(top level)'}: "
                                      f"{err['msg']}" for err in exc.errors()], source=source or "mock config") from exc
        problems: list[str] = []
        self._responses: dict[str, MockedResponse] = {}
        for name, entries in model.MockedResponses.items():
            parsed: list[tuple[int, int, MockOutcome]] = []
            for key, entry in entries.items():
                match = _RANGE.match(key)
                if not match or int(match.group(2) or match.group(1)) < int(match.group(1)):
                    problems.append(f"MockedResponses.{name}: {key!r} is not an invocation number or range like '1-2'")
                    continue
                low, high = int(match.group(1)), int(match.group(2) or match.group(1))
                if any(low <= h and l <= high for l, h, _ in parsed):  # noqa: E741
                    problems.append(f"MockedResponses.{name}: {key!r} overlaps another entry")
                if entry.Throw is not None:
                    outcome = MockOutcome(error=entry.Throw.Error, cause=entry.Throw.Cause)
                else:
                    outcome = MockOutcome(returned=entry.Return)
                parsed.append((low, high, outcome))
            self._responses[name] = MockedResponse(name, tuple(sorted(parsed, key=lambda e: e[0])))
        self._cases = {sm: cases.TestCases for sm, cases in model.StateMachines.items()}
        for sm, cases in self._cases.items():
            for case, states in cases.items():
                for state, response in states.items():
                    if response not in self._responses:
                        problems.append(f"StateMachines.{sm}.TestCases.{case}.{state}: "
                                        f"no MockedResponses entry named {response!r}")
        if problems:
            raise AslDefinitionError(problems, source=source or "mock config")

    @classmethod
    def from_file(cls, path: str | Path) -> MockConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise AslDefinitionError(f"cannot read the mock config: {exc}", source=str(path)) from exc
        except UnicodeDecodeError as exc:
            raise AslDefinitionError(f"not UTF-8 text: {exc}", source=str(path)) from exc
        except json.JSONDecodeError as exc:
            raise AslDefinitionError(f"not valid JSON: {exc}", source=str(path)) from exc
        return cls(data, source=str(path))

    @property
    def state_machines(self) -> list[str]:
        return list(self._cases)

    def resolve_state_machine(self, name: str) -> str:
        """``name`` if the config has it, else the only state machine present; an error otherwise."""
        if name in self._cases:
            return name
        if len(self._cases) == 1:
            return next(iter(self._cases))
        raise AslDefinitionError(f"no state machine named {name!r} in the mock config "
                                 f"(it has: {', '.join(self._cases) or 'none'})", source=self.source)

    def test_cases(self, state_machine_name: str) -> list[str]:
        """The test case names of a state machine (resolved like ``test_case``)."""
        return list(self._cases[self.resolve_state_machine(state_machine_name)])

    def test_case(self, state_machine_name: str, case: str) -> MockTestCase:
        machine = self.resolve_state_machine(state_machine_name)
        cases = self._cases[machine]
        if case not in cases:
            raise AslDefinitionError(f"state machine {machine!r} has no test case {case!r} "
                                     f"(it has: {', '.join(cases) or 'none'})", source=self.source)
        return MockTestCase(machine, case, {state: self._responses[resp] for state, resp in cases[case].items()})
