"""Training metrics as log lines: the one home of their names, line format and regexes.

The trainer prints one line per metric value, e.g.::

    d2ops-metric train:loss=0.734211 iter=120
    d2ops-metric val:bbox_AP=0.512300 iter=500

SageMaker scrapes these lines from the job's logs with ``METRIC_DEFINITIONS`` (the
prepare_training Lambda puts them into CreateTrainingJob's MetricDefinitions); the offline
runner parses the same lines with :func:`parse_metric_line`. AP values are fractions in
[0, 1], as in the evaluation report. Standard library only (the Lambda layer and the
training image both import it).
"""

from __future__ import annotations

import math
import re
from typing import Literal

LINE_PREFIX = "d2ops-metric"

TRAIN_METRICS: tuple[str, ...] = ("train:loss", "train:lr", "train:grad_norm", "train:iter_seconds")
AP_SUFFIXES: tuple[str, ...] = ("AP", "AP50", "AP75", "APs", "APm", "APl")
VAL_METRICS: tuple[str, ...] = tuple(f"val:{kind}_{s}" for kind in ("bbox", "segm") for s in AP_SUFFIXES)
METRIC_NAMES: tuple[str, ...] = TRAIN_METRICS + VAL_METRICS

_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_LINE = re.compile(rf"^{re.escape(LINE_PREFIX)} (?P<name>[A-Za-z0-9_:]+)={_NUMBER}(?: iter=(?P<iter>\d+))?\s*$")


def metric_regex(name: str) -> str:
    """The regex SageMaker applies to log lines; group 1 is the value."""
    return rf"{re.escape(LINE_PREFIX)} {re.escape(name)}={_NUMBER}"


METRIC_DEFINITIONS: tuple[dict[str, str], ...] = tuple({"Name": n, "Regex": metric_regex(n)} for n in METRIC_NAMES)

# The metric the quality gate compares, by the manifest's task (masks are judged by mask AP).
PrimaryMetric = Literal["bbox_AP", "segm_AP"]
PRIMARY_METRIC_BY_TASK: dict[str, PrimaryMetric] = {"detection": "bbox_AP", "instance_segmentation": "segm_AP"}


def primary_metric(task: str) -> PrimaryMetric:
    """``bbox_AP`` for detection, ``segm_AP`` for instance segmentation (evaluation report names).

    The one home of this rule: the prepare Lambda (the gate's metric) and the trainers and
    evaluation job (the reports' ``primary_metric``) all call it; an unknown task raises.
    """
    try:
        return PRIMARY_METRIC_BY_TASK[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(PRIMARY_METRIC_BY_TASK)}") from None


def format_metric_line(name: str, value: float, iteration: int | None = None) -> str:
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRIC_NAMES)}")
    if not math.isfinite(value):
        raise ValueError(f"metric {name} must be finite, got {value}")
    line = f"{LINE_PREFIX} {name}={value:.6f}"
    return line if iteration is None else f"{line} iter={iteration}"


def parse_metric_line(line: str) -> tuple[str, float, int | None] | None:
    """(name, value, iteration) of a metric line, or None for any other log line."""
    match = _LINE.match(line)
    if not match or match["name"] not in METRIC_NAMES:
        return None
    return match["name"], float(match.group(2)), int(match["iter"]) if match["iter"] else None
