"""``d2ops demo --loop``'s own bookkeeping, quickly: the ground truth it answers Label Studio's tasks with reads
back (through the import's own region reader) as the same COCO boxes, and a step "not yet" is no failure while
a failed step fails the loop. The loop itself: tests/e2e/test_demo_loop.py."""

from __future__ import annotations

import pytest

from d2ops.commands.demo_loop import LoopResult, truth_regions
from d2ops.labelling.labelstudio import BoxControl, boxes_of


def test_truth_regions_read_back_as_the_same_coco_boxes() -> None:
    control = BoxControl(from_name="label", to_name="image", data_key="image")
    item = {"width": 128, "height": 96, "boxes": [{"class_name": "disc", "bbox": [10.5, 20.0, 30.25, 12.0]},
                                                  {"class_name": "square", "bbox": [0.0, 0.0, 128.0, 96.0]}]}
    boxes = boxes_of(truth_regions(item, control), control, ["square", "disc", "triangle"], 128, 96, "task 1")
    # catches width/height swapped in the percent conversion, or x/y taken as the box centre
    assert [(b.class_name, b.bbox) for b in boxes] == [
        ("disc", pytest.approx((10.5, 20.0, 30.25, 12.0))), ("square", pytest.approx((0.0, 0.0, 128.0, 96.0)))]


def test_a_step_not_yet_there_is_no_failure_but_a_failed_one_is() -> None:
    assert LoopResult(steps={"stream": "done", "monitor": "not yet: the stack has no MonitorEndpointFunction"}).ok
    assert not LoopResult(steps={"stream": "done", "label": "failed: LabellingError: boom"}).ok
