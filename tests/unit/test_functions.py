"""d2ops.functions: the handlers imported as Lambda imports them, and the pipeline's Lambdas kept in step with
template.yaml."""

from __future__ import annotations

import copy
import sys

import pytest

from d2ops import functions
from d2ops.functions import PIPELINE_LAMBDAS, import_handler, import_model, template_problems
from d2ops.template import SamTemplate, load_template


def test_import_model_imports_the_function_package_and_refuses_a_non_model() -> None:
    model = import_model("smoke_test_endpoint.models:SmokeTestResult")
    assert model.__name__ == "SmokeTestResult" and "latency_ms" in model.model_fields
    assert str(functions.FUNCTIONS_DIR / "smoke_test_endpoint") in sys.path
    assert import_model("d2ops_core.champion:ChampionRecord").__name__ == "ChampionRecord"
    with pytest.raises(TypeError, match="not a pydantic model"):
        import_model("smoke_test_endpoint.models:__name__")


def test_import_handler_puts_the_code_directory_first_once(monkeypatch: pytest.MonkeyPatch) -> None:
    code_dir = str(functions.FUNCTIONS_DIR / "describe_failure")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != code_dir])
    module = import_handler("describe_failure.handler")
    assert module.__name__ == "describe_failure.handler" and callable(module.handler)
    assert sys.path[0] == code_dir
    sys.path.insert(0, "elsewhere")
    import_handler("describe_failure.models", code_dir)
    assert sys.path[:2] == ["elsewhere", code_dir]  # already there: keeps its place


def test_every_pipeline_lambda_has_its_models() -> None:
    for fn in PIPELINE_LAMBDAS:
        assert fn.input_model().model_fields and fn.output_model().model_fields, fn.logical_id
        assert (fn.code_dir / (fn.handler.replace(".", "/") + ".py")).is_file(), fn.logical_id
    assert len({fn.logical_id for fn in PIPELINE_LAMBDAS}) == len(PIPELINE_LAMBDAS)


def test_the_template_substitutes_and_may_invoke_exactly_the_pipeline_lambdas() -> None:
    assert template_problems() == []


def test_a_lambda_missing_from_the_template_is_named() -> None:
    real = load_template()
    document = copy.deepcopy(real.document)
    machine = document["Resources"]["PipelineStateMachine"]["Properties"]
    del machine["DefinitionSubstitutions"]["PrepareTrainingFunctionArn"]
    machine["Policies"] = [p for p in machine["Policies"]
                           if p != {"LambdaInvokePolicy": {"FunctionName": {"Ref": "SmokeTestEndpointFunction"}}}]
    machine["Policies"].append({"LambdaInvokePolicy": {"FunctionName": {"Ref": "StatusApiFunction"}}})
    problems = template_problems(SamTemplate(document, real.path))
    assert problems == [
        "template.yaml: PipelineStateMachine.DefinitionSubstitutions lacks "
        "'PrepareTrainingFunctionArn: !GetAtt PrepareTrainingFunction.Arn'",
        "template.yaml: PipelineStateMachine.Policies lacks "
        "'- LambdaInvokePolicy: FunctionName: !Ref SmokeTestEndpointFunction'",
        "template.yaml: PipelineStateMachine.Policies invokes StatusApiFunction, which "
        "d2ops.functions.PIPELINE_LAMBDAS does not list",
    ]


def test_a_new_lambda_s_template_lines_are_named() -> None:
    """A table entry with nothing in template.yaml yet: each problem names the lines to paste (the walkthrough
    in docs/architecture.md relies on it)."""
    new = functions.PipelineLambda("EchoCheckFunction", "echo_check.handler", "echo_check.models:EchoEvent",
                                   "echo_check.models:EchoResult")
    assert template_problems(table=(*PIPELINE_LAMBDAS, new)) == [
        "template.yaml: no AWS::Serverless::Function EchoCheckFunction ('EchoCheckFunction: Type: "
        "AWS::Serverless::Function, Properties: CodeUri: functions/echo_check/, Handler: echo_check.handler.handler')",
        "template.yaml: PipelineStateMachine.DefinitionSubstitutions lacks "
        "'EchoCheckFunctionArn: !GetAtt EchoCheckFunction.Arn'",
        "template.yaml: PipelineStateMachine.Policies lacks "
        "'- LambdaInvokePolicy: FunctionName: !Ref EchoCheckFunction'",
    ]


def test_make_asl_and_its_check_fail_naming_what_the_template_lacks(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from d2ops.statemachine import __main__ as asl_main

    lacking = "template.yaml: PipelineStateMachine.Policies lacks '- LambdaInvokePolicy: FunctionName: !Ref X'"
    monkeypatch.setattr(asl_main, "template_problems", lambda: [lacking])
    assert asl_main.main(["--check"]) == 1
    assert lacking in capsys.readouterr().err
    monkeypatch.setattr(asl_main, "template_problems", list)
    assert asl_main.main(["--check"]) == 0
