"""What the console reads beside a run's summary: its graph, its full reports, the endpoint's history.

Reports are read from the URIs the run itself recorded, and only from the artifacts bucket:
a run document cannot make the API read another bucket.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from d2ops_core import run_ids, s3_layout, s3_probe, state_graph
from d2ops_core.champion import EndpointHistory, read_endpoint_history
from d2ops_core.documents.error_analysis import ERRORS_NAME, ErrorAnalysis
from d2ops_core.documents.run_state import RunState
from d2ops_core.evaluation_curves import PR_CURVES_NAME, PrCurves
from d2ops_core.validation.report import ValidationReport
from status_api import response_budget
from status_api.models import EvaluationView, GraphEdge, GraphLine, GraphNode, GraphStage, ReportLink, RunGraph
from status_api.service import NotFound, RunNotFound, execution_history, latest_document, timeline

# How long a truncated evaluation answer's links to the whole documents stay valid.
LINK_SECONDS = 15 * 60


class ReportNotFound(NotFound):
    """The run has not written this report (yet), or it is gone (a 404, like every NotFound)."""


class ReportUnreadable(ReportNotFound):
    """S3 refused the status API's role the report (AccessDenied): to the caller it is not available,
    a 404 like a missing one (never a 500), with a message that says S3 refused it, and a warning in
    the log for the operator (the role's policy in template.yaml lacks the key)."""


def _access_denied(exc: Exception) -> bool:
    response = getattr(exc, "response", None)
    return isinstance(response, dict) and response.get("Error", {}).get("Code") in {"AccessDenied", "403"}


def _execution(sfn: Any, state_machine_arn: str, run_id: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    arn = run_ids.execution_arn(state_machine_arn, run_id)
    try:
        execution = sfn.describe_execution(executionArn=arn)
    except sfn.exceptions.ExecutionDoesNotExist as exc:
        raise RunNotFound(f"no run {run_id!r}") from exc
    return arn, execution, execution_history(sfn, arn)


def run_graph(sfn: Any, state_machine_arn: str, run_id: str) -> RunGraph:
    """The state machine laid out by d2ops_core.state_graph, coloured by this run's history."""
    _, execution, events = _execution(sfn, state_machine_arn, run_id)
    definition = json.loads(sfn.describe_state_machine(stateMachineArn=state_machine_arn)["definition"])
    status, taken = state_graph.outcomes(definition, events, execution["status"])
    nodes, edges = state_graph.layout(definition, status, taken)
    steps, _ = timeline(events, execution["status"])
    durations = {s.name: s.duration_seconds for s in steps}  # a looping state keeps its last visit
    stages = [GraphStage(key=v.key, title=v.title, status=v.status, duration_seconds=v.seconds,
                         folded=v.folded, next_stages=v.next_stages,
                         lines=[GraphLine(title=line.title, status=line.status, states=line.states,
                                          rounds=line.rounds, loop=line.loop, duration_seconds=line.seconds,
                                          error=line.error, note=line.note) for line in v.lines])
              for v in state_graph.stage_view(definition, steps)]
    return RunGraph(
        run_id=run_id, width=max(n.x for n in nodes) + state_graph.BOX_W + state_graph.MARGIN,
        height=max(n.y for n in nodes) + state_graph.BOX_H + state_graph.MARGIN,
        box_width=state_graph.BOX_W, box_height=state_graph.BOX_H,
        nodes=[GraphNode(name=n.name, kind=n.kind, status=n.status, x=n.x, y=n.y,
                         duration_seconds=durations.get(n.name)) for n in nodes],
        edges=[GraphEdge(source=e.source, target=e.target, kind=e.kind, taken=e.taken)
               for e in edges], stages=stages)


def _read_json(s3: Any, artifacts_bucket: str, uri: str, what: str) -> bytes:
    """The report's bytes. Missing is asked by listing the exact key (d2ops_core.s3_probe.key_listed): S3
    answers a GET of a missing key with 403 AccessDenied, not NoSuchKey, to a role that may not list
    it, and the role lists only the keys it reads (template.yaml, MissingReportsAreNoSuchKey)."""
    bucket, key = s3_layout.parse_s3_uri(uri)
    if bucket != artifacts_bucket:
        raise ReportNotFound(f"the run's {what} is not in the artifacts bucket ({uri})")
    try:
        if not s3_probe.key_listed(s3, bucket, key):
            raise ReportNotFound(f"the run's {what} {uri} is gone")
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey as exc:  # removed between the listing and the read
        raise ReportNotFound(f"the run's {what} {uri} is gone") from exc
    except s3.exceptions.ClientError as exc:
        if not _access_denied(exc):
            raise
        raise ReportUnreadable(f"the run's {what} {uri} cannot be read: S3 refused the status API access "
                               "(AccessDenied)") from exc


def _document(sfn: Any, state_machine_arn: str, run_id: str) -> RunState:
    _, execution, events = _execution(sfn, state_machine_arn, run_id)
    return RunState.read(latest_document(events, execution))


def validation_report(sfn: Any, s3: Any, state_machine_arn: str, artifacts_bucket: str,
                      run_id: str) -> ValidationReport:
    doc = _document(sfn, state_machine_arn, run_id)
    summary = doc.validation.summary if doc.validation else None
    uri = (summary.report_uri if summary else None) or (doc.failure.report_uri if doc.failure else None)
    if not uri:
        raise ReportNotFound(f"run {run_id!r} has no validation report (yet)")
    return ValidationReport.model_validate_json(_read_json(s3, artifacts_bucket, uri, "validation report"))


def evaluation_report(sfn: Any, s3: Any, state_machine_arn: str, artifacts_bucket: str,
                      run_id: str) -> EvaluationView:
    doc = _document(sfn, state_machine_arn, run_id)
    uri = doc.evaluation.report_uri if doc.evaluation else None
    if not uri:
        raise ReportNotFound(f"run {run_id!r} has no evaluation report (yet)")
    report = json.loads(_read_json(s3, artifacts_bucket, uri, "evaluation report"))
    # The job writes report/pr_curves.json and report/errors.json beside evaluation.json
    # (model_code.evaluation.report); reports from before either was kept lack it: None.
    report_dir = uri.rsplit("/", 1)[0] + "/report/"
    try:
        curves: PrCurves | None = PrCurves.model_validate_json(
            _read_json(s3, artifacts_bucket, report_dir + PR_CURVES_NAME, "precision-recall curves"))
    except (ReportNotFound, ValidationError):
        curves = None
    try:
        errors: ErrorAnalysis | None = ErrorAnalysis.model_validate_json(
            _read_json(s3, artifacts_bucket, report_dir + ERRORS_NAME, "error analysis"))
    except (ReportNotFound, ValidationError):
        errors = None
    view = EvaluationView.model_validate({**report, "report_uri": uri, "pr_curves": curves, "errors": errors})
    answer = view.model_dump(mode="json")
    left_out = response_budget.fit(answer)
    if not left_out:
        return view
    parts = {"evaluation": uri, "pr_curves": report_dir + PR_CURVES_NAME if curves else None,
             "errors": report_dir + ERRORS_NAME if errors else None}
    links = [_link(s3, name, part) for name, part in parts.items() if part]
    return EvaluationView.model_validate({**answer, "truncated": True, "left_out": left_out, "full_report": links})


def _link(s3: Any, name: str, uri: str) -> ReportLink:
    """A presigned GET of a report the API has just read (the caller may read it through the API already)."""
    bucket, key = s3_layout.parse_s3_uri(uri)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=LINK_SECONDS)
    return ReportLink(name=name, uri=uri, url=url, expires_at=datetime.now(UTC) + timedelta(seconds=LINK_SECONDS))


def endpoint_history(s3: Any, artifacts_bucket: str, endpoint_name: str) -> EndpointHistory:
    try:
        history = read_endpoint_history(s3, artifacts_bucket, endpoint_name)
    except s3.exceptions.ClientError as exc:
        if not _access_denied(exc):
            raise
        raise ReportUnreadable(f"endpoint {endpoint_name!r}'s history cannot be read: S3 refused the status API "
                               "access (AccessDenied)") from exc
    if history is None:
        raise ReportNotFound(f"endpoint {endpoint_name!r} has no recorded deployments")
    return history
