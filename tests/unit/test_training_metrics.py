"""Metric lines: what the trainer prints is what SageMaker's regexes and the local runner read."""

from __future__ import annotations

import re

import pytest

from d2ops_core import metrics


def test_every_definition_extracts_exactly_its_own_metric() -> None:
    lines = [metrics.format_metric_line(name, 0.5 + i / 100, 40, 250 if name.startswith("train:") else None)
             for i, name in enumerate(metrics.METRIC_NAMES)]
    log = "\n".join(["[algo-1] some other output", *lines])
    for i, definition in enumerate(metrics.METRIC_DEFINITIONS[:len(metrics.METRIC_NAMES)]):
        found = re.findall(definition["Regex"], log)  # SageMaker takes the first group of each match
        assert [float(v) for v in found] == [pytest.approx(0.5 + i / 100)], definition["Name"]


def test_the_progress_definitions_read_the_iteration_and_total_of_the_loss_lines_only() -> None:
    """Catches: a progress regex whose group 1 is the loss value (SageMaker keeps group 1), one that
    reads other metrics' lines (each iteration would count several times), a total read from a line
    without one."""
    by_name = {d["Name"]: re.compile(d["Regex"]) for d in metrics.PROGRESS_DEFINITIONS}
    assert set(by_name) <= {d["Name"] for d in metrics.METRIC_DEFINITIONS}
    assert not set(by_name) & set(metrics.METRIC_NAMES)  # no trainer prints them
    log = "\n".join(["[algo-1] " + metrics.format_metric_line(name, 0.75, 120, 250)
                      for name in metrics.TRAIN_METRICS] + ["[algo-1] d2ops-metric train:loss=0.5 iter=7"])
    assert [int(v) for v in by_name["train:iteration"].findall(log)] == [120, 7]
    assert [int(v) for v in by_name["train:total_iterations"].findall(log)] == [250]
    for definition in metrics.METRIC_DEFINITIONS:  # CreateTrainingJob's limits on a definition
        assert 1 <= len(definition["Name"]) <= 255 and 1 <= len(definition["Regex"]) <= 500
    assert len(metrics.METRIC_DEFINITIONS) <= 40  # MetricDefinitions: at most 40 a job


def test_round_trip_and_rejections() -> None:
    line = metrics.format_metric_line("val:bbox_AP50", 0.9731, 150)
    assert line == "d2ops-metric val:bbox_AP50=0.973100 iter=150"
    assert metrics.parse_metric_line(line) == ("val:bbox_AP50", pytest.approx(0.9731), 150)
    assert metrics.parse_metric_line("d2ops-metric train:loss=1e-3") == ("train:loss", 0.001, None)
    assert metrics.parse_metric_line("d2ops-metric made:up=1") is None
    assert metrics.parse_metric_line("loss=0.3") is None
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.format_metric_line("val:bbox_mAP", 0.1)
    with pytest.raises(ValueError, match="finite"):
        metrics.format_metric_line("train:loss", float("nan"))


def test_training_lines_carry_the_total_and_a_throughput_for_progress() -> None:
    line = metrics.format_metric_line("train:images_per_second", 10.4, 120, 250)
    assert line == "d2ops-metric train:images_per_second=10.400000 iter=120/250"
    assert metrics.parse_metric(line) == ("train:images_per_second", pytest.approx(10.4), 120, 250)
    assert metrics.parse_metric_line(line) == ("train:images_per_second", pytest.approx(10.4), 120)
    assert metrics.parse_metric("d2ops-metric train:loss=0.5 iter=7") == ("train:loss", 0.5, 7, None)
    with pytest.raises(ValueError, match="total"):
        metrics.format_metric_line("train:loss", 0.5, None, 250)
    with pytest.raises(ValueError, match="total"):
        metrics.format_metric_line("train:loss", 0.5, 3, 0)
    # a hostile iteration count is not a metric line (int() refuses over 4300 digits: no traceback)
    assert metrics.parse_metric("d2ops-metric train:loss=0.5 iter=" + "9" * 5000) is None
    assert metrics.parse_metric("d2ops-metric train:loss=0.5 iter=1/" + "9" * 5000) is None
