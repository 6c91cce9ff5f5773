"""d2ops.template: reading a SAM template and resolving its intrinsic functions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops.template import TemplateError, load_template, resolve

SMALL = """\
Transform: AWS::Serverless-2016-10-31
Parameters:
  Threshold:
    Type: String
    Default: "0.5"
  Count:
    Type: Number
    Default: 2
  ImageUri:
    Type: String
Conditions:
  IsProd: !Equals [!Ref Stage, prod]
Globals:
  Function:
    Runtime: python3.11
    Timeout: 30
    Layers: [!Ref CoreLayer]
    Environment:
      Variables:
        POWERTOOLS_SERVICE_NAME: d2ops
        SHARED: from-globals
Resources:
  CoreLayer:
    Type: AWS::Serverless::LayerVersion
    Properties:
      ContentUri: src/
  Bucket:
    Type: AWS::S3::Bucket
  WorkFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/do_work/
      Handler: do_work.handler.handler
      Timeout: 900
      Environment:
        Variables:
          SHARED: from-function
          BUCKET: !Ref Bucket
  Machine:
    Type: AWS::Serverless::StateMachine
    Properties:
      DefinitionUri: statemachine/p.asl.json
      DefinitionSubstitutions:
        WorkFunctionArn: !GetAtt WorkFunction.Arn
        Partition: !Ref AWS::Partition
"""


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    path = tmp_path / "template.yaml"
    path.write_text(SMALL)
    return path


def test_functions_merge_globals_like_sam(small: Path) -> None:
    fn = load_template(small).function("WorkFunction")
    assert fn.runtime == "python3.11"
    assert fn.timeout == 900  # the function's own value wins
    expected = {"POWERTOOLS_SERVICE_NAME": "d2ops", "SHARED": "from-function", "BUCKET": {"Ref": "Bucket"}}
    assert fn.environment == expected
    assert fn.layers == [{"Ref": "CoreLayer"}]
    assert (fn.handler_module, fn.handler_name) == ("do_work.handler", "handler")
    assert fn.code_dir.parts[-2:] == ("functions", "do_work")
    assert load_template(small).function_for_code_dir("do_work").logical_id == "WorkFunction"


def test_state_machine_parameters_and_layers(small: Path) -> None:
    t = load_template(small)
    sm = t.state_machine()
    assert sm.logical_id == "Machine"
    assert sm.definition_uri == "statemachine/p.asl.json"
    assert sm.definition_substitutions["WorkFunctionArn"] == {"Fn::GetAtt": ["WorkFunction", "Arn"]}
    assert t.parameter_defaults() == {"Threshold": "0.5", "Count": "2"}  # strings, as CloudFormation passes them
    assert t.parameters()["ImageUri"].default is None
    assert t.layers() == {"CoreLayer": "src/"}
    assert t.condition("IsProd", {"Stage": "prod"}) is True


def test_lookups_of_missing_things_name_them(small: Path) -> None:
    t = load_template(small)
    with pytest.raises(TemplateError, match="NopeFunction"):
        t.function("NopeFunction")
    with pytest.raises(TemplateError, match="functions/nope/"):
        t.function_for_code_dir("nope")
    with pytest.raises(TemplateError, match="Other"):
        t.state_machine("Other")


def test_load_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="not found"):
        load_template(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("Resources: [unclosed\n")
    with pytest.raises(TemplateError, match="cannot parse"):
        load_template(bad)
    notcfn = tmp_path / "list.yaml"
    notcfn.write_text("- 1\n- 2\n")
    with pytest.raises(TemplateError, match="no Resources"):
        load_template(notcfn)


def test_reload_after_the_file_changes(small: Path) -> None:
    assert "Bucket" in load_template(small).resources
    small.write_text(SMALL.replace("  Bucket:\n    Type: AWS::S3::Bucket\n", "  Pail:\n    Type: AWS::S3::Bucket\n"))
    os.utime(small, ns=(1, 1))  # a different mtime even on coarse-grained filesystems
    assert "Pail" in load_template(small).resources


def test_resolve_intrinsics() -> None:
    refs = {"Bucket": "my-bucket", "AWS::Region": "eu-west-1", "Stage": "dev"}

    def getatt(logical_id: str, attribute: str) -> str:
        return f"<{logical_id}.{attribute}>"

    assert resolve({"Ref": "Bucket"}, refs) == "my-bucket"
    assert resolve({"Fn::GetAtt": ["Fn", "Arn"]}, refs, getatt) == "<Fn.Arn>"
    assert resolve({"Fn::GetAtt": "Fn.Arn"}, refs, getatt) == "<Fn.Arn>"
    sub = {"Fn::Sub": "arn:${AWS::Partition}:s3:::${Bucket}/${Fn.Arn}/${!Literal}"}
    assert resolve(sub, refs, getatt) == "arn:aws:s3:::my-bucket/<Fn.Arn>/${Literal}"
    assert resolve({"Fn::Sub": ["${X}-${AWS::Region}", {"X": {"Ref": "Bucket"}}]}, refs) == "my-bucket-eu-west-1"
    assert resolve({"Fn::Join": ["/", ["a", {"Ref": "Bucket"}]]}, refs) == "a/my-bucket"
    assert resolve({"Fn::If": ["C", "yes", "no"]}, refs, conditions=lambda name: name == "C") == "yes"
    assert resolve({"K": [{"Ref": "Stage"}, 3]}, refs) == {"K": ["dev", 3]}


def test_resolve_refuses_what_it_cannot_answer() -> None:
    with pytest.raises(TemplateError, match="Nope"):
        resolve({"Ref": "Nope"}, {})
    with pytest.raises(TemplateError, match="Fn::FindInMap"):
        resolve({"Fn::FindInMap": ["M", "K", "V"]}, {})
    with pytest.raises(TemplateError, match="getatt"):
        resolve({"Fn::Sub": "${Fn.Arn}"}, {})


def test_the_repository_template_loads() -> None:
    t = load_template()
    assert "DataBucket" in t.resources
    assert t.layers()["CoreLayer"] == "src/"


def test_import_is_cheap() -> None:
    code = "import sys, d2ops.template; print(sorted(m for m in sys.modules if m.split('.')[0] in {'cfnlint', 'boto3', 'torch', 'yaml', 'pydantic'}))"  # noqa: E501
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
