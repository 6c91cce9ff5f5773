"""``d2ops demo --loop`` as a user runs it: a real process, real training, a real Label Studio server.

The first version deploys; a stream twice as dark goes to the endpoint and is captured; the monitor's real
handler flags the window (brightness among the statistics that moved); ``d2ops label select`` picks the batch;
Label Studio gets it (pre-annotated), every task is answered with the synthetic ground truth through Label
Studio's API, and the import writes shapes/v2 = v1 + the labelled images, which runs through the gate.

Slow (two trainings of the demo's size plus Label Studio's start: 4 min 52 s at load average 3 on 2 cores,
9 min 48 s at load 6-8):
left out of ``make test``, run by ``make test-all``. Each part is covered quickly on its own:
tests/unit/test_label_selection.py (selection), tests/unit/test_demo_loop.py (the loop's bookkeeping), the
monitor's, capture's and Label Studio round trip's own tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops.labelling.studio_server import executable
from d2ops.setup_check import in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]


def test_the_loop_demo_brings_captured_images_back_as_the_next_version(tmp_path: Path) -> None:
    if executable() is None:
        reason = "Label Studio is not installed (make setup creates .venv-tools/label-studio)"
        if in_ci():
            pytest.fail(f"CI requires a real Label Studio server for the loop demo; {reason}", pytrace=False)
        pytest.skip(reason)
    work_dir = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "d2ops", "demo", "--loop", "--work-dir", str(work_dir)],
                          capture_output=True, text=True, env=env, timeout=1700, cwd=tmp_path, check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, (lines[-60:], done.stderr[-3000:])
    result = json.loads(lines[-1])
    loop = result["loop"]
    assert loop["steps"] == {"stream": "done", "monitor": "done", "select": "done", "label": "done",
                             "next run": "done"}, loop["steps"]
    # every image sent was captured (CaptureSamplingPercentage 100 for the demo)
    assert loop["stream"]["captured"] == loop["stream"]["images"] == 60
    # the stream is twice as dark: the monitor must say so (catches a monitor that never alarms)
    assert loop["monitor"]["verdict"] == "drifted" and "brightness" in loop["monitor"]["drifted"]
    assert loop["monitor"]["records"] >= 60  # with the demo's own prediction (one of v1's val images)
    # the budget filled from distinct stream images, none of v1's (the prediction's image is left out)
    selection = json.loads((Path(loop["selection"]["dir"]) / "selection.json").read_text())
    assert len(selection["images"]) == loop["selection"]["images"] == 24
    assert loop["selection"]["candidates"] == 60  # every stream image, the smoke test's and v1's left out
    v1 = work_dir / "datasets" / "shapes-v1"
    v1_hashes = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (v1 / "images").rglob("*.jpg")}
    assert not v1_hashes & {i["sha256"] for i in selection["images"]} and loop["selection"]["excluded"] >= 1
    # every selected image came back labelled, as the ground truth says, into v2 = v1 + them
    labelling = loop["labelling"]
    assert labelling["uploaded"] == labelling["answered"] == labelling["labelled"] == 24
    assert labelling["conflicts"] == 0 and labelling["version"] == "v2"
    v2 = Path(labelling["dir"])
    count = {d: sum(len(json.loads((d / "annotations" / f"{s}.json").read_text())["images"]) for s in ("train", "val"))
             for d in (v1, v2)}
    assert count[v2] == count[v1] + 24
    # the next version ran through the quality gate against v1's champion
    champion, following = result["runs"]
    assert champion["status"] == "SUCCEEDED" and champion["deployment"] == "create"
    assert following["run_id"].startswith("shapes_v2_") and following["gate"]["decision"] in (
        "approved", "rejected", "refused")
    assert following["gate"]["champion"] is not None
