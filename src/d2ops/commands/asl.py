"""``d2ops asl run|validate DEFINITION``: run (or only check) a definition with the embedded ASL interpreter.

Prints the execution's output as JSON (or ``{"error", "cause"}`` when it does not succeed) on
stdout and one progress line per state on stderr. Exit codes: 0 succeeded, 1 the execution
failed / timed out / was aborted, 2 a bad definition, mock config, input or usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("asl", help="run or validate an Amazon States Language definition locally (mock configs)")
    actions = p.add_subparsers(dest="asl_command", metavar="ACTION", required=True)
    run_p = actions.add_parser("run", help="run DEFINITION once and print its output as JSON")
    _definition_arguments(run_p)
    run_p.add_argument("--input", metavar="FILE", help="execution input JSON file ('-' for stdin; default {})")
    run_p.add_argument("--mock-config", metavar="FILE", help="a Step Functions Local mock configuration file")
    run_p.add_argument("--test-case", metavar="NAME", help="the mock config test case to run")
    run_p.add_argument("--execution-name", metavar="NAME", help="execution name (default: a UUID)")
    run_p.add_argument("--real-time", action="store_true",
                       help="really wait in Wait states and retry back-offs (default: virtual time)")
    run_p.add_argument("--history", metavar="FILE", help="also write the execution history (JSON) to FILE")
    run_p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run_p.set_defaults(func=run)
    check_p = actions.add_parser("validate", help="check DEFINITION (after substitution) and a mock config")
    _definition_arguments(check_p)
    check_p.add_argument("--mock-config", metavar="FILE",
                         help="also check this mock config: its test cases must mock Task states of DEFINITION")
    check_p.set_defaults(func=validate)


def _definition_arguments(parser: argparse.ArgumentParser) -> None:
    """What names the definition, for run and validate alike."""
    parser.add_argument("definition", metavar="DEFINITION", help="the .asl.json file")
    parser.add_argument("--substitutions", metavar="FILE",
                        help="JSON object of ${Key} placeholder values (DefinitionSubstitutions)")
    parser.add_argument("--state-machine-name", metavar="NAME",
                        help="name of the state machine (default: the file name without .asl.json)")


def _read_json(path: str, what: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the {what} {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"the {what} {path} is not UTF-8 text: {exc}") from exc
    from d2ops.asl.jsonvalue import MAX_JSON_DEPTH, text_too_deep

    if text_too_deep(text):  # json.loads would recurse once per level
        raise UsageError(f"the {what} {path} is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer of over 4300 digits
        raise UsageError(f"the {what} {path} is not valid JSON: {exc}") from exc


def _progress(start: list[datetime]) -> Any:
    def show(event: dict[str, Any]) -> None:
        if not start:
            start.append(event["timestamp"])
        elapsed = (event["timestamp"] - start[0]).total_seconds()
        kind = event["type"]
        details: dict[str, Any] = next((v for k, v in event.items() if k.endswith("EventDetails")), {})
        if kind.endswith("StateEntered"):
            text = f"-> {details['name']} ({kind[: -len('StateEntered')]})"
        elif kind.endswith("Failed") or kind.endswith("TimedOut"):
            text = f"   {kind}: {details.get('error', '')} {details.get('cause', '')[:160]}".rstrip()
        elif kind.startswith("Execution") and kind != "ExecutionStarted":
            text = kind
        else:
            return
        print(f"[{elapsed:9.1f}s] {text}", file=sys.stderr, flush=True)

    return show


def _history_json(history: list[dict[str, Any]]) -> str:
    return json.dumps(history, indent=2, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v))


def _substitutions(args: argparse.Namespace) -> dict[str, Any] | None:
    substitutions = _read_json(args.substitutions, "substitutions file") if args.substitutions else None
    if substitutions is not None and not isinstance(substitutions, dict):
        raise UsageError(f"the substitutions file {args.substitutions} must hold a JSON object")
    return substitutions


def validate(args: argparse.Namespace) -> int:
    from d2ops.asl import AslDefinitionError, ExecutorRegistry, MockConfig, StateMachine
    from d2ops.asl.definition import task_states

    try:
        machine = StateMachine.from_file(args.definition, substitutions=_substitutions(args),
                                         name=args.state_machine_name)
        tasks = len(list(task_states(machine.definition)))
        cases = 0
        if args.mock_config:
            config = MockConfig.from_file(args.mock_config)
            name = config.resolve_state_machine(machine.name)
            for case in config.test_cases(name):
                machine.check_tasks(ExecutorRegistry(), config.test_case(name, case))
                cases += 1
    except AslDefinitionError as exc:
        raise UsageError(str(exc)) from exc
    checked = f"; {cases} mock test cases" if args.mock_config else ""
    print(f"{args.definition}: valid ({len(machine.definition['States'])} top-level states, "
          f"{tasks} Task states{checked})")
    return 0


def run(args: argparse.Namespace) -> int:
    from d2ops.asl import AslDefinitionError, Clock, MockConfig, StateMachine, VirtualClock

    if bool(args.mock_config) != bool(args.test_case):
        raise UsageError("--mock-config and --test-case go together")
    if args.history and not Path(args.history).parent.is_dir():
        raise UsageError(f"cannot write the history file {args.history}: its directory does not exist")
    substitutions = _substitutions(args)
    data = _read_json(args.input, "input file") if args.input else {}
    try:
        machine = StateMachine.from_file(args.definition, substitutions=substitutions, name=args.state_machine_name)
        mock = MockConfig.from_file(args.mock_config).test_case(machine.name, args.test_case) if args.mock_config \
            else None
        start: list[datetime] = []
        execution = machine.run(data, mock=mock, execution_name=args.execution_name,
                                clock=Clock() if args.real_time else VirtualClock(),
                                on_event=None if args.quiet else _progress(start))
    except AslDefinitionError as exc:
        raise UsageError(str(exc)) from exc
    except ValueError as exc:  # execution input or name refused before the run
        raise UsageError(str(exc)) from exc
    if args.history:
        target = Path(args.history)
        partial = target.with_name(target.name + ".partial")
        try:
            partial.write_text(_history_json(execution.history), encoding="utf-8")
            partial.replace(target)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise UsageError(f"cannot write the history file {target}: {exc.strerror or exc}") from exc
    if execution.status == "SUCCEEDED":
        print(json.dumps(execution.output, indent=2))
        return 0
    print(json.dumps({"error": execution.error, "cause": execution.cause}, indent=2))
    print(f"d2ops asl: execution {execution.name} {execution.status}", file=sys.stderr)
    return 1
