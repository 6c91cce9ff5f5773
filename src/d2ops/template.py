"""Read the SAM application (``template.yaml``): the one home of resource names and settings.

Tests and the offline runtime learn which functions exist, where their code lives, their
handlers and environment, the state machine's definition file and substitutions, and the
stack parameters from here instead of repeating them. The template is parsed with
cfn-lint's YAML loader (it understands ``!Ref``/``!Sub``/``!GetAtt``), imported lazily so
importing this module stays cheap.

``resolve`` evaluates the few intrinsic functions the template uses in environment
variables and substitutions (Ref, Fn::GetAtt, Fn::Sub, Fn::Join, Fn::Split, Fn::Select, Fn::If, Fn::Not,
Fn::Equals) against values the caller supplies, and refuses anything else by name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = REPO_ROOT / "template.yaml"

FUNCTION_TYPE = "AWS::Serverless::Function"
STATE_MACHINE_TYPE = "AWS::Serverless::StateMachine"
LAYER_TYPE = "AWS::Serverless::LayerVersion"
# Where the template writes once a value it reads in several places (the endpoint's name): read by GetAtt .Value.
PARAMETER_TYPE = "AWS::SSM::Parameter"

# Pseudo parameters a template may reference; callers override them through `refs`.
PSEUDO_PARAMETERS: dict[str, str] = {
    "AWS::Partition": "aws",
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::StackName": "d2ops",
    "AWS::StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/d2ops/6c2d3e1a-7b4f-4e0a-9d5c-2f1e0b3a4c5d",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::NoValue": "",
}


class TemplateError(Exception):
    """The template is missing, unreadable, or lacks what the caller asked for."""


@dataclass(frozen=True)
class FunctionSpec:
    """One ``AWS::Serverless::Function`` with the Globals already merged in."""

    logical_id: str
    code_uri: str
    handler: str
    runtime: str
    timeout: int | None
    memory_size: int | None
    environment: dict[str, Any]  # raw values: strings or intrinsic dicts (see `resolve`)
    layers: list[Any]
    properties: dict[str, Any] = field(repr=False)

    @property
    def code_dir(self) -> Path:
        return REPO_ROOT / self.code_uri

    @property
    def handler_module(self) -> str:
        """``validate_dataset.handler`` for ``validate_dataset.handler.handler``."""
        return self.handler.rpartition(".")[0]

    @property
    def handler_name(self) -> str:
        return self.handler.rpartition(".")[2]


@dataclass(frozen=True)
class StateMachineSpec:
    logical_id: str
    definition_uri: str
    definition_substitutions: dict[str, Any]  # raw values (see `resolve`)
    properties: dict[str, Any] = field(repr=False)

    @property
    def definition_path(self) -> Path:
        return REPO_ROOT / self.definition_uri


@dataclass(frozen=True)
class ParameterSpec:
    name: str
    type: str
    default: str | None  # CloudFormation passes every parameter value as a string
    allowed_values: list[str] | None
    description: str
    min_value: float | None = None  # MinValue/MaxValue of a Number parameter
    max_value: float | None = None


class SamTemplate:
    """A parsed template. Build one with `load_template`."""

    def __init__(self, document: dict[str, Any], path: Path) -> None:
        self.document = document
        self.path = path

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return dict(self.document.get("Resources") or {})

    def resource(self, logical_id: str) -> dict[str, Any]:
        try:
            return dict(self.resources[logical_id])
        except KeyError:
            raise TemplateError(f"{self.path}: no resource named {logical_id!r}") from None

    def resources_of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.resources.items() if v.get("Type") == resource_type}

    def _function_globals(self) -> dict[str, Any]:
        return dict((self.document.get("Globals") or {}).get("Function") or {})

    def functions(self) -> dict[str, FunctionSpec]:
        glob = self._function_globals()
        glob_env = dict((glob.get("Environment") or {}).get("Variables") or {})
        specs: dict[str, FunctionSpec] = {}
        for logical_id, res in self.resources_of_type(FUNCTION_TYPE).items():
            props = {**glob, **(res.get("Properties") or {})}
            env = {**glob_env, **((res.get("Properties") or {}).get("Environment") or {}).get("Variables", {})}
            # SAM concatenates list-valued Globals (Layers) with the function's own list.
            layers = list(glob.get("Layers") or []) + list((res.get("Properties") or {}).get("Layers") or [])
            for key in ("CodeUri", "Handler", "Runtime"):
                if not isinstance(props.get(key), str):
                    raise TemplateError(f"{self.path}: Resources.{logical_id}.Properties.{key} must be a string")
            specs[logical_id] = FunctionSpec(
                logical_id=logical_id,
                code_uri=props["CodeUri"],
                handler=props["Handler"],
                runtime=props["Runtime"],
                timeout=props.get("Timeout"),
                memory_size=props.get("MemorySize"),
                environment=env,
                layers=layers,
                properties=props,
            )
        return specs

    def function(self, logical_id: str) -> FunctionSpec:
        try:
            return self.functions()[logical_id]
        except KeyError:
            raise TemplateError(f"{self.path}: no {FUNCTION_TYPE} named {logical_id!r}") from None

    def function_for_code_dir(self, name: str) -> FunctionSpec:
        """The function whose CodeUri is ``functions/<name>/`` (``name`` as in the ASL)."""
        for spec in self.functions().values():
            if spec.code_uri.rstrip("/") == f"functions/{name}":
                return spec
        raise TemplateError(f"{self.path}: no function with CodeUri functions/{name}/")

    def layers(self) -> dict[str, str]:
        """Layer logical id -> ContentUri."""
        layers = self.resources_of_type(LAYER_TYPE)
        return {k: str((v.get("Properties") or {}).get("ContentUri")) for k, v in layers.items()}

    def state_machines(self) -> dict[str, StateMachineSpec]:
        specs: dict[str, StateMachineSpec] = {}
        for logical_id, res in self.resources_of_type(STATE_MACHINE_TYPE).items():
            props = dict(res.get("Properties") or {})
            uri = props.get("DefinitionUri")
            if not isinstance(uri, str):
                where = f"{self.path}: Resources.{logical_id}.Properties.DefinitionUri"
                raise TemplateError(f"{where} must be a local path")
            specs[logical_id] = StateMachineSpec(
                logical_id=logical_id,
                definition_uri=uri,
                definition_substitutions=dict(props.get("DefinitionSubstitutions") or {}),
                properties=props,
            )
        return specs

    def state_machine(self, logical_id: str | None = None) -> StateMachineSpec:
        machines = self.state_machines()
        if logical_id is None:
            if len(machines) != 1:
                raise TemplateError(f"{self.path}: expected one {STATE_MACHINE_TYPE}, found {sorted(machines)}")
            return next(iter(machines.values()))
        try:
            return machines[logical_id]
        except KeyError:
            raise TemplateError(f"{self.path}: no {STATE_MACHINE_TYPE} named {logical_id!r}") from None

    def parameters(self) -> dict[str, ParameterSpec]:
        specs: dict[str, ParameterSpec] = {}
        for name, p in (self.document.get("Parameters") or {}).items():
            default = p.get("Default")
            allowed = p.get("AllowedValues")
            specs[name] = ParameterSpec(
                name=name,
                type=str(p.get("Type")),
                default=None if default is None else str(default),
                allowed_values=None if allowed is None else [str(v) for v in allowed],
                description=str(p.get("Description", "")),
                min_value=None if p.get("MinValue") is None else float(p["MinValue"]),
                max_value=None if p.get("MaxValue") is None else float(p["MaxValue"]),
            )
        return specs

    def parameter_defaults(self) -> dict[str, str]:
        """Parameters that have a default, as CloudFormation would pass them (strings)."""
        return {n: p.default for n, p in self.parameters().items() if p.default is not None}

    def resolve(self, value: Any, refs: Mapping[str, Any], getatt: Callable[[str, str], Any] | None = None,
                conditions: Callable[[str], bool] | None = None) -> Any:
        """:func:`resolve` that also answers ``Fn::GetAtt <an AWS::SSM::Parameter>.Value`` from the template
        itself (the parameter's own Value, resolved alike); other attributes go to ``getatt``."""

        def held(logical_id: str, attribute: str) -> Any:
            resource = self.resources.get(logical_id) or {}
            if resource.get("Type") == PARAMETER_TYPE and attribute == "Value":
                return self.resolve((resource.get("Properties") or {}).get("Value"), refs, getatt, conditions)
            if getatt is None:
                raise TemplateError(f"Fn::GetAtt {logical_id}.{attribute}: no getatt resolver supplied")
            return getatt(logical_id, attribute)

        return resolve(value, refs, getatt=held, conditions=conditions)

    def condition(self, name: str, refs: Mapping[str, Any]) -> bool:
        try:
            expr = (self.document.get("Conditions") or {})[name]
        except KeyError:
            raise TemplateError(f"{self.path}: no condition named {name!r}") from None
        return bool(resolve(expr, refs, conditions=lambda n: self.condition(n, refs)))


def _plain(node: Any) -> Any:
    """cfn-lint's node subclasses (with line marks) -> plain dicts, lists and strings."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, str):
        return str(node)
    return node


@functools.lru_cache(maxsize=8)
def _load_cached(path: Path, mtime_ns: int) -> SamTemplate:
    from cfnlint.decode import cfn_yaml  # dev-only dependency, and slow to import

    try:
        document = cfn_yaml.load(str(path))
    except FileNotFoundError:
        raise TemplateError(f"{path}: template not found") from None
    except Exception as exc:  # cfn-lint raises its own parse error types
        raise TemplateError(f"{path}: cannot parse the template: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise TemplateError(f"{path}: not a CloudFormation template (no Resources mapping)")
    return SamTemplate(_plain(document), path)


def load_template(path: str | Path | None = None) -> SamTemplate:
    """Parse ``template.yaml`` (the repository's by default); cached until the file changes."""
    p = Path(path) if path is not None else TEMPLATE_PATH
    try:
        mtime = p.stat().st_mtime_ns
    except FileNotFoundError:
        raise TemplateError(f"{p}: template not found") from None
    return _load_cached(p.resolve(), mtime)


_SUB_VAR = re.compile(r"\$\{([^}!]+)\}")


def resolve(
    value: Any,
    refs: Mapping[str, Any],
    getatt: Callable[[str, str], Any] | None = None,
    conditions: Callable[[str], bool] | None = None,
) -> Any:
    """Evaluate intrinsic functions in ``value``.

    ``refs`` maps parameter and resource logical ids to what ``Ref`` returns (pseudo
    parameters default to `PSEUDO_PARAMETERS`); ``getatt(logical_id, attribute)`` answers
    ``Fn::GetAtt`` (and ``${Res.Attr}`` in ``Fn::Sub``). Unknown names raise `TemplateError`.
    """
    scope = {**PSEUDO_PARAMETERS, **refs}

    def ref(name: str) -> Any:
        if name in scope:
            return scope[name]
        raise TemplateError(f"Ref to {name!r}: no value supplied")

    def att(logical_id: str, attribute: str) -> Any:
        if getatt is None:
            raise TemplateError(f"Fn::GetAtt {logical_id}.{attribute}: no getatt resolver supplied")
        return getatt(logical_id, attribute)

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) != 1:
            return {k: walk(x) for k, x in v.items()}
        (key, arg), = v.items()
        if key == "Ref":
            return ref(str(arg))
        if key == "Fn::GetAtt":
            logical_id, _, attribute = arg.partition(".") if isinstance(arg, str) else (arg[0], ".", arg[1])
            return att(logical_id, attribute)
        if key == "Fn::Sub":
            text, local = (arg, {}) if isinstance(arg, str) else (arg[0], {k: walk(x) for k, x in arg[1].items()})

            def sub(m: re.Match[str]) -> str:
                name = m.group(1)
                if name in local:
                    return str(local[name])
                if "." in name and name not in scope:
                    logical_id, _, attribute = name.partition(".")
                    return str(att(logical_id, attribute))
                return str(ref(name))

            # ${!Literal} is an escaped ${Literal} in Fn::Sub.
            return _SUB_VAR.sub(sub, text).replace("${!", "${")
        if key == "Fn::Join":
            sep, items = arg
            return str(sep).join(str(x) for x in walk(items))
        if key == "Fn::Split":
            sep, text = arg
            return str(walk(text)).split(str(sep))
        if key == "Fn::Select":
            index, items = arg
            return walk(items)[int(walk(index))]
        if key == "Fn::If":
            name, when_true, when_false = arg
            if conditions is None:
                raise TemplateError(f"Fn::If on {name!r}: no condition resolver supplied")
            return walk(when_true if conditions(name) else when_false)
        if key == "Fn::Equals":
            left, right = walk(arg)
            return str(left) == str(right)
        if key == "Fn::Not":
            return not walk(arg[0])
        if key == "Condition":
            if conditions is None:
                raise TemplateError(f"Condition {arg!r}: no condition resolver supplied")
            return conditions(str(arg))
        if key.startswith("Fn::"):
            raise TemplateError(f"intrinsic function {key} is not supported by d2ops.template.resolve")
        return {key: walk(arg)}

    return walk(value)
