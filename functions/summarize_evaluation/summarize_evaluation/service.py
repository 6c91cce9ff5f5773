"""Read evaluation.json, judge it (d2ops_core.gate_decision) and bound the texts the Model Registry keeps."""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from pydantic import ValidationError

from d2ops_core import pipeline_metrics as pm
from d2ops_core import platform
from d2ops_core.bounded_text import bounded
from d2ops_core.documents.evaluation import EvaluationReport
from d2ops_core.gate_decision import GateReportInvalid, judge
from d2ops_core.s3_layout import parse_s3_uri
from d2ops_core.s3_probe import key_listed
from d2ops_core.score_thresholds import registry_value
from summarize_evaluation.models import EvaluationSummary, SummarizeEvent

MAX_REPORT_BYTES = 10 * 1024 * 1024
# The floor is compared with numbers read from JSON; rounding keeps 0.5 - 0.01 at 0.49.
FLOOR_DIGITS = 9
# The Model Registry description is "<dataset name> <version>: <gate reason>" (the ASL's "Register model
# version"). The name and version come from the dataset's S3 key (any characters but '/', up to S3's
# 1,024-byte keys), the class names from its annotations: neither is bounded, so both shares are
# bounded here. The numeric gate reasons (a metric name and four numbers) fit in what is left.
DESCRIPTION_HEAD_MAX = 200  # "<name> <version>: "
CLASS_GATE_DESCRIPTION_MAX = platform.MODEL_PACKAGE_DESCRIPTION_MAX - DESCRIPTION_HEAD_MAX
# Control characters that separate words become spaces; anything else outside the allowed categories
# becomes U+FFFD (a symbol, so allowed), keeping the count of characters and where one was.
_SPACES = frozenset("\t\n\v\f\r\x1c\x1d\x1e\x1f\x85")


class EvaluationReportNotFound(Exception):
    """The evaluation job finished but its report is not where the plan says."""


class EvaluationReportInvalid(Exception):
    """The report is malformed or lacks the primary metric."""


def read_report(s3: Any, uri: str) -> EvaluationReport:
    bucket, key = parse_s3_uri(uri)
    # Listed first (d2ops_core.s3_probe.key_listed): a GET of a missing report may answer 403 here.
    if not key_listed(s3, bucket, key):
        raise EvaluationReportNotFound(f"{uri} does not exist")
    try:
        obj = s3.get_object(Bucket=bucket, Key=key)
    except s3.exceptions.NoSuchKey as exc:
        raise EvaluationReportNotFound(f"{uri} does not exist") from exc
    if obj["ContentLength"] > MAX_REPORT_BYTES:
        raise EvaluationReportInvalid(f"{uri} is {obj['ContentLength']} bytes, more than {MAX_REPORT_BYTES}")
    try:
        return EvaluationReport.model_validate_json(obj["Body"].read())
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise EvaluationReportInvalid(f"{uri}: {where}: {first['msg']}") from exc


def registry_text(text: str) -> str:
    """``text`` with every character SageMaker's description pattern refuses replaced (platform table)."""
    allowed = platform.MODEL_PACKAGE_DESCRIPTION_CATEGORIES
    return "".join(c if unicodedata.category(c)[0] in allowed else " " if c in _SPACES else "\ufffd" for c in text)


def description_head(name: str, version: str) -> str:
    """``"<name> <version>: "``, cleaned and bounded to DESCRIPTION_HEAD_MAX characters."""
    return bounded(registry_text(f"{name} {version}"), DESCRIPTION_HEAD_MAX - 2) + ": "


def metric_decision(summary: EvaluationSummary) -> str:
    """The GateDecisions metric's Decision dimension (d2ops_core.pipeline_metrics.DECISIONS)."""
    return pm.DECISIONS[("approve", "refuse", "review").index(summary.decision)]


def summarize(report: EvaluationReport, event: SummarizeEvent) -> EvaluationSummary:
    """The gate's verdict (d2ops_core.gate_decision.judge, made once here: the "Quality gate" Choice state
    branches on its ``decision``) with the registry's bounded texts."""
    try:
        verdict = judge(report, event.gate)
    except GateReportInvalid as exc:
        raise EvaluationReportInvalid(str(exc)) from None
    champion = verdict.champion_value
    floor = round(max(0.0, champion - verdict.max_regression), FLOOR_DIGITS) if champion is not None else 0.0
    limit = CLASS_GATE_DESCRIPTION_MAX
    return EvaluationSummary(
        **verdict.model_dump(), report_uri=event.report_uri,
        challenger_metrics={k: v for k, v in report.challenger.metrics.items() if math.isfinite(v)},
        champion_floor=floor,
        class_gate_description=bounded(registry_text(verdict.class_gate_reason), limit),
        description_head=description_head(event.dataset.name, event.dataset.version),
        gate_description=bounded(registry_text(verdict.gate_reason), limit),
        score_thresholds=registry_value(report.challenger_score_thresholds))
