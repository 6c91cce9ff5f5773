"""cfn-lint on template.yaml, in-process, informational checks included (`make lint` runs it too)."""

from __future__ import annotations

from pathlib import Path

from cfnlint.api import ManualArgs, lint_file

from d2ops.template import TEMPLATE_PATH


def test_cfn_lint_finds_nothing_including_informational_checks() -> None:
    matches = lint_file(TEMPLATE_PATH, ManualArgs(include_checks=["I"], regions=["us-east-1", "eu-west-1"]))
    assert [str(m) for m in matches] == []


def test_cfn_lint_does_report_a_broken_template(tmp_path: Path) -> None:
    # Guards the test above against silently linting nothing: a bad property value is reported.
    broken = tmp_path / "template.yaml"
    broken.write_text(TEMPLATE_PATH.read_text().replace("SSEAlgorithm: AES256", "SSEAlgorithm: ROT13", 1))
    assert any("ROT13" in str(m) for m in lint_file(broken, ManualArgs(regions=["us-east-1"])))
