"""Training metrics as log lines: the one home of their names, line format and regexes.

The trainer prints one line per metric value, e.g.::

    d2ops-metric train:loss=0.734211 iter=120/250
    d2ops-metric train:images_per_second=10.400000 iter=120/250
    d2ops-metric val:bbox_AP=0.512300 iter=500

Training lines carry the iteration and the run's total (``iter=N/TOTAL``): with
``train:iter_seconds`` (mean seconds per iteration since the previous line) they are what a
follower needs for progress and time left (``d2ops.offline.log_progress``).

SageMaker scrapes these lines from the job's logs with ``METRIC_DEFINITIONS`` (the
prepare_training Lambda puts them into CreateTrainingJob's MetricDefinitions) and publishes each
value to CloudWatch (``TRAINING_METRICS_NAMESPACE``, dimension ``TrainingJobName``), where the
status API reads the job's progress; the offline SageMaker applies the same definitions to the
local job's log and publishes to moto's CloudWatch. The offline runner parses the same lines with
:func:`parse_metric_line`. AP values are fractions in
[0, 1], as in the evaluation report. Standard library only (the Lambda layer and the
training image both import it).
"""

from __future__ import annotations

import math
import re
from typing import Literal, NamedTuple

LINE_PREFIX = "d2ops-metric"

TRAIN_METRICS: tuple[str, ...] = ("train:loss", "train:lr", "train:grad_norm", "train:iter_seconds",
                                  "train:images_per_second")
AP_SUFFIXES: tuple[str, ...] = ("AP", "AP50", "AP75", "APs", "APm", "APl")
VAL_METRICS: tuple[str, ...] = tuple(f"val:{kind}_{s}" for kind in ("bbox", "segm") for s in AP_SUFFIXES)
METRIC_NAMES: tuple[str, ...] = TRAIN_METRICS + VAL_METRICS

_VALUE = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER = rf"({_VALUE})"
# At most 15 digits: a hostile line's 5000-digit iteration would otherwise make int() raise.
_LINE = re.compile(rf"^{re.escape(LINE_PREFIX)} (?P<name>[A-Za-z0-9_:]+)={_NUMBER}"
                   r"(?: iter=(?P<iter>\d{1,15})(?:/(?P<total>\d{1,15}))?)?\s*$")


def metric_regex(name: str) -> str:
    """The regex SageMaker applies to log lines; group 1 is the value."""
    return rf"{re.escape(LINE_PREFIX)} {re.escape(name)}={_NUMBER}"


# Where the job is, read from its train:loss lines (``iter=N/TOTAL``): SageMaker keeps only group 1 of a
# definition, so the iteration and the run's total are metrics of their own. No trainer prints these names
# (they are not METRIC_NAMES); they are what the status API pairs the loss curve with in CloudWatch. At most
# 15 digits and not followed by another: a hostile line's 5000-digit count is no iteration.
PROGRESS_DEFINITIONS: tuple[dict[str, str], ...] = (
    {"Name": "train:iteration", "Regex": rf"{re.escape(LINE_PREFIX)} train:loss={_VALUE} iter=(\d{{1,15}})(?!\d)"},
    {"Name": "train:total_iterations",
     "Regex": rf"{re.escape(LINE_PREFIX)} train:loss={_VALUE} iter=\d{{1,15}}/(\d{{1,15}})(?!\d)"},
)
METRIC_DEFINITIONS: tuple[dict[str, str], ...] = (
    tuple({"Name": n, "Regex": metric_regex(n)} for n in METRIC_NAMES) + PROGRESS_DEFINITIONS)

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


class MetricLine(NamedTuple):
    name: str
    value: float
    iteration: int | None
    total: int | None  # the run's iterations (``iter=N/TOTAL``), where the line says


def format_metric_line(name: str, value: float, iteration: int | None = None, total: int | None = None) -> str:
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRIC_NAMES)}")
    if not math.isfinite(value):
        raise ValueError(f"metric {name} must be finite, got {value}")
    if total is not None and (iteration is None or total < 1):
        raise ValueError(f"metric {name}: a total ({total}) needs an iteration and must be at least 1")
    line = f"{LINE_PREFIX} {name}={value:.6f}"
    if iteration is None:
        return line
    return f"{line} iter={iteration}" if total is None else f"{line} iter={iteration}/{total}"


def parse_metric(line: str) -> MetricLine | None:
    """The metric a log line carries (name, value, iteration, total), or None for any other line."""
    match = _LINE.match(line)
    if not match or match["name"] not in METRIC_NAMES:
        return None
    return MetricLine(match["name"], float(match.group(2)), int(match["iter"]) if match["iter"] else None,
                      int(match["total"]) if match["total"] else None)


def parse_metric_line(line: str) -> tuple[str, float, int | None] | None:
    """(name, value, iteration) of a metric line, or None for any other log line."""
    parsed = parse_metric(line)
    return None if parsed is None else (parsed.name, parsed.value, parsed.iteration)
