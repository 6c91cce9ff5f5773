"""`sam validate --lint` and checkov on template.yaml, as `make lint` runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops.setup_check import tool_env_executable
from d2ops.template import REPO_ROOT, TEMPLATE_PATH

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent


def tool_env() -> dict[str, str]:
    # Offline machine: no telemetry, and the venv's python3.11 first on PATH for SAM.
    return {**os.environ, "SAM_CLI_TELEMETRY": "0", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_sam_validate_lint() -> None:
    proc = subprocess.run(
        [str(BIN / "sam"), "validate", "--lint", "--template", str(TEMPLATE_PATH), "--region", "us-east-1"],
        cwd=REPO_ROOT, env=tool_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is a valid SAM Template" in proc.stdout + proc.stderr


def test_checkov_passes_and_every_skip_is_explained() -> None:
    proc = subprocess.run(
        [str(tool_env_executable("checkov")), "--skip-download", "--framework", "cloudformation",
         "--file", str(TEMPLATE_PATH), "--output", "json"],
        cwd=REPO_ROOT, env=tool_env(), capture_output=True, text=True, timeout=300,
    )
    report = json.loads(proc.stdout)
    results = report["results"]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in results["failed_checks"]]
    assert failed == [], failed
    assert proc.returncode == 0, proc.stderr
    assert report["summary"]["passed"] >= 30, "checkov ran far fewer checks than expected"
    for check in results["skipped_checks"]:
        reason = check.get("check_result", {}).get("suppress_comment", "")
        assert len(reason.split()) >= 5, f"{check['check_id']} on {check['resource']} skipped without a reason"
