"""The stack's Lambda functions as the tooling sees them: importing their code, and the pipeline's table.

- ``import_handler``: a function's module imported as Lambda imports it, its code directory first on
  ``sys.path`` (the one place that does; the generator, the offline runtime, the SDK, the docs and the
  benchmarks all call it);
- ``import_model``: a ``"module:Class"`` pydantic model, a handler package's or any importable one's;
- ``PIPELINE_LAMBDAS``: the Lambdas the state machine invokes, each with its template logical id, code
  directory, handler module and input and output models. The generator's Lambda tasks name an entry
  (``lambda_task(SUMMARIZE_EVALUATION, ...)``), never a placeholder string, and ``template_problems``
  checks template.yaml's DefinitionSubstitutions and LambdaInvokePolicy list against the table
  (``make asl``, ``make lint`` and tests/unit/test_template_hygiene.py run it).

Developer tooling: the Lambda code never imports this module (the handlers import only d2ops_core).
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from d2ops.template import REPO_ROOT

if TYPE_CHECKING:
    from pydantic import BaseModel

    from d2ops.template import SamTemplate

FUNCTIONS_DIR = REPO_ROOT / "functions"  # the house layout: functions/<package>/<package>/handler.py


def import_handler(module: str, code_dir: str | Path | None = None) -> ModuleType:
    """``module`` (``"prepare_training.service"``) of a function, imported as the Lambda runtime imports it.

    ``code_dir``: the function's code directory; by default ``functions/<package>/``, ``<package>`` being
    ``module``'s first part. It goes first on ``sys.path``, as Lambda puts the function's code (/var/task)
    before its layers: what the function ships wins over anything of the same name elsewhere. First or
    last makes no other difference: a code directory holds its package and requirements files only, and
    several functions' directories share one process (the offline runtime imports every handler; the
    generator and the docs import models of several) because each function's package name is unique (the
    house layout, tests/unit/test_template_hygiene.py), so ``<package>`` resolves to the one directory
    holding it whatever their order. A directory already on ``sys.path`` keeps its place.
    """
    directory = str(code_dir if code_dir is not None else FUNCTIONS_DIR / module.partition(".")[0])
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return importlib.import_module(module)


@functools.cache
def _function_packages() -> frozenset[str]:
    return frozenset(path.name for path in FUNCTIONS_DIR.iterdir() if (path / path.name).is_dir())


def import_model(reference: str) -> type[BaseModel]:
    """``"summarize_evaluation.models:EvaluationSummary"`` or ``"d2ops_core.champion:ChampionRecord"``: the
    pydantic model, a handler package's imported with ``import_handler`` (its code directory on ``sys.path``)."""
    from pydantic import BaseModel

    module, _, attribute = reference.partition(":")
    loaded = import_handler(module) if module.partition(".")[0] in _function_packages() \
        else importlib.import_module(module)
    model = getattr(loaded, attribute)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{reference} is not a pydantic model")
    return model


@dataclass(frozen=True)
class PipelineLambda:
    """A Lambda the state machine invokes."""

    logical_id: str  # its AWS::Serverless::Function in template.yaml
    handler: str  # the handler's module (template Handler ``<handler>.handler``), its package the code directory's
    input: str  # "module:Class": the event the handler parses
    output: str  # "module:Class": what the handler returns (the task's ``$.Payload``)

    @property
    def package(self) -> str:
        return self.handler.partition(".")[0]

    @property
    def code_dir(self) -> Path:
        return FUNCTIONS_DIR / self.package

    @property
    def substitution(self) -> str:
        """The DefinitionSubstitutions key the definition invokes it by (``${<substitution>}``)."""
        return f"{self.logical_id}Arn"

    def input_model(self) -> type[BaseModel]:
        return import_model(self.input)

    def output_model(self) -> type[BaseModel]:
        return import_model(self.output)


VALIDATE_DATASET = PipelineLambda("ValidateDatasetFunction", "validate_dataset.handler",
                                  "validate_dataset.models:ValidateDatasetEvent",
                                  "validate_dataset.models:ValidationSummary")
CHECK_IMAGES = PipelineLambda("CheckImagesFunction", "check_images.handler", "check_images.models:ImageBatchEvent",
                              "d2ops_core.validation.inventory:ImageBatchResult")
# A second task of validate_dataset's code (its own module): merges the Map's results into the same summary.
SUMMARIZE_IMAGES = PipelineLambda("SummarizeImagesFunction", "validate_dataset.summarize_images",
                                  "validate_dataset.models:SummarizeImagesEvent",
                                  "validate_dataset.models:ValidationSummary")
PREPARE_TRAINING = PipelineLambda("PrepareTrainingFunction", "prepare_training.handler",
                                  "prepare_training.models:PrepareEvent", "prepare_training.models:Plan")
SUMMARIZE_EVALUATION = PipelineLambda("SummarizeEvaluationFunction", "summarize_evaluation.handler",
                                      "summarize_evaluation.models:SummarizeEvent",
                                      "summarize_evaluation.models:EvaluationSummary")
REQUEST_REVIEW = PipelineLambda("RequestReviewFunction", "request_review.handler",
                                "request_review.models:RequestReviewEvent", "request_review.models:RequestAnswer")
READ_REVIEW_DECISION = PipelineLambda("ReadReviewDecisionFunction", "request_review.decision",
                                      "request_review.models:ReadDecisionEvent",
                                      "request_review.models:ReviewedGate")
SMOKE_TEST_ENDPOINT = PipelineLambda("SmokeTestEndpointFunction", "smoke_test_endpoint.handler",
                                     "smoke_test_endpoint.models:SmokeTestEvent",
                                     "smoke_test_endpoint.models:SmokeTestResult")
# The failed run's state document, returned with a one-line failure.cause.
DESCRIBE_FAILURE = PipelineLambda("DescribeFailureFunction", "describe_failure.handler",
                                  "describe_failure.models:FailedRunDocument",
                                  "describe_failure.models:FailedRunDocument")
COMPOSE_NOTIFICATION = PipelineLambda("ComposeNotificationFunction", "compose_notification.handler",
                                      "compose_notification.models:NotificationEvent",
                                      "compose_notification.models:Notification")

# In the order template.yaml lists their substitutions and invoke policies.
PIPELINE_LAMBDAS: tuple[PipelineLambda, ...] = (
    VALIDATE_DATASET, CHECK_IMAGES, SUMMARIZE_IMAGES, PREPARE_TRAINING, SUMMARIZE_EVALUATION, SMOKE_TEST_ENDPOINT,
    DESCRIBE_FAILURE, COMPOSE_NOTIFICATION, REQUEST_REVIEW, READ_REVIEW_DECISION,
)

STATE_MACHINE = "PipelineStateMachine"


def _invoke_policies(policies: Any) -> list[Any]:
    """The logical ids the SAM LambdaInvokePolicy templates name (``FunctionName: !Ref <id>``)."""
    found = []
    for policy in policies if isinstance(policies, list) else [policies]:
        if isinstance(policy, dict) and "LambdaInvokePolicy" in policy:
            name = (policy["LambdaInvokePolicy"] or {}).get("FunctionName")
            found.append(name["Ref"] if isinstance(name, dict) and set(name) == {"Ref"} else name)
    return found


def template_problems(template: SamTemplate | None = None,
                      table: tuple[PipelineLambda, ...] = PIPELINE_LAMBDAS) -> list[str]:
    """What template.yaml says differently from the table, one line each naming the entry and the fix; [] when
    in step. Checked, not written: template.yaml is hand-formatted, commented YAML that a round trip would
    reflow, and each missing line is one line to add."""
    from d2ops.template import load_template

    template = template or load_template()
    where = f"{template.path.name}: {STATE_MACHINE}"
    properties = template.state_machine(STATE_MACHINE).properties
    substitutions = dict(properties.get("DefinitionSubstitutions") or {})
    invoked = _invoke_policies(properties.get("Policies") or [])
    functions = template.functions()
    problems = []
    for fn in table:
        spec = functions.get(fn.logical_id)
        if spec is None:
            # The lines the table fixes; the rest (Description, Timeout, Policies, checkov skips) is the author's.
            problems.append(f"{template.path.name}: no AWS::Serverless::Function {fn.logical_id} "
                            f"('{fn.logical_id}: Type: AWS::Serverless::Function, Properties: "
                            f"CodeUri: functions/{fn.package}/, Handler: {fn.handler}.handler')")
        else:
            if spec.code_uri.rstrip("/") != f"functions/{fn.package}":
                problems.append(f"{template.path.name}: {fn.logical_id} CodeUri {spec.code_uri!r}, "
                                f"the table says functions/{fn.package}/")
            if spec.handler_module != fn.handler:
                problems.append(f"{template.path.name}: {fn.logical_id} Handler {spec.handler!r}, "
                                f"the table says {fn.handler}.handler")
        arn = {"Fn::GetAtt": [fn.logical_id, "Arn"]}
        if substitutions.get(fn.substitution) != arn:
            problems.append(f"{where}.DefinitionSubstitutions lacks "
                            f"'{fn.substitution}: !GetAtt {fn.logical_id}.Arn'")
        if fn.logical_id not in invoked:
            problems.append(f"{where}.Policies lacks '- LambdaInvokePolicy: FunctionName: !Ref {fn.logical_id}'")
    known = {fn.logical_id for fn in table}
    for key, value in substitutions.items():
        target = value.get("Fn::GetAtt") if isinstance(value, dict) else None
        if isinstance(target, list) and target[0] in functions and target[0] not in known:
            problems.append(f"{where}.DefinitionSubstitutions.{key} names {target[0]}, which "
                            "d2ops.functions.PIPELINE_LAMBDAS does not list")
    problems += [f"{where}.Policies invokes {name}, which d2ops.functions.PIPELINE_LAMBDAS does not list"
                 for name in invoked if name not in known]
    return problems
