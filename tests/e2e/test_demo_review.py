"""``d2ops demo --review`` as a user runs it: a real process, real training at the stack's own gate settings.

The second version's val file reuses images the champion trained on, so fewer than MinComparedImages held-out
images are compared and the gate asks for a review; the demo notices the wait and runs ``d2ops approve`` as a
separate process through the runtime's status API; the run deploys blue/green with the decider recorded.

Slow (about 4 minutes on a quiet 2-core machine, two trainings of 250 and 500 detectron2 iterations, more
under load): left out of ``make test``, run by ``make test-all``. The dataset it builds is checked quickly in
tests/unit/test_demo_review.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]


def test_the_review_demo_is_decided_by_d2ops_approve_and_deploys(tmp_path: Path) -> None:
    work_dir = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "d2ops", "demo", "--review", "--work-dir", str(work_dir)],
                          capture_output=True, text=True, env=env, timeout=1700, cwd=tmp_path, check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, (lines[-40:], done.stderr[-3000:])
    result = json.loads(lines[-1])
    assert result["status"] == "SUCCEEDED"
    champion, reviewed = result["runs"]
    # v1: no champion, so MinMap alone decided and nobody was asked
    assert (champion["status"], champion["gate"]["decision"], champion["gate"]["champion"]) == (
        "SUCCEEDED", "approved", None)
    assert "Wait for review" not in champion["state_durations"]
    assert any(line.startswith("  no champion yet: the gate decides on MinMap alone") for line in lines)

    review, run_id = result["review"], reviewed["run_id"]
    # Why: the borrowed images (the champion's train images, same bytes) were left out, 40 of the 80 remain.
    assert (review["run_id"], review["gate_decision"]) == (run_id, "review")
    assert "too_few_images" in review["review_because"] and review["min_compared_images"] == 50
    assert (review["images_compared"], review["images_excluded"]) == (40, 40)
    assert [(e["reason"], e["images"]) for e in review["excluded"]] == [("champion_trained_on", 40)]
    # Who: the real `d2ops approve` process decided it, as a session of the offline stack's reviewer role.
    assert review["command"].startswith(f"d2ops approve {run_id} --reason ") and review["exit_code"] == 0
    assert (review["decision"], review["approval_status"]) == ("approved", "Approved")
    assert re.fullmatch(r"arn:aws:sts::\d{12}:assumed-role/[^/]+/.+", review["decided_by"]), review["decided_by"]
    assert review["reason"] == "d2ops demo --review: a person looked at the run and approves it"
    approve_at = lines.index(f"  $ {review['command']}")
    assert lines[approve_at + 1] == (f"    run {run_id} approved by {review['decided_by']} at "
                                     f"{review['decided_at']}: {review['reason']}")
    # The run really waited, then deployed as an approval by the gate would (blue/green), naming the decider.
    assert reviewed["status"] == "SUCCEEDED" and "Wait for review" in reviewed["state_durations"]
    waited = next(i for i, line in enumerate(lines) if line.endswith("-> Wait for review"))
    assert waited < approve_at < next(i for i, line in enumerate(lines) if " ok Wait for review (" in line)
    assert reviewed["gate"]["decision"] == "approved" and review["decided_by"] in reviewed["gate"]["reason"]
    assert (reviewed["deployment"], champion["deployment"]) == ("update", "create")
    assert reviewed["endpoint_config"] != champion["endpoint_config"]
    assert any(line.startswith(f"  review    approved by {review['decided_by']}") for line in lines)  # d2ops status
