"""The pipeline's CloudWatch metrics: one home for their namespace, names and dimensions.

The Lambda functions emit them with Powertools ``Metrics`` as embedded metric format (EMF) log
lines, which CloudWatch turns into metrics without a PutMetricData call; template.yaml's
dashboard plots them (a test reads its body against these names). The training jobs' own
metrics (loss, AP) are d2ops_core.metrics'. Standard library only (the Lambda layer ships it).
"""

from __future__ import annotations

# The handlers pass it to Powertools explicitly (template.yaml's POWERTOOLS_METRICS_NAMESPACE says the
# same, a test checks); Powertools adds the ``service`` dimension from POWERTOOLS_SERVICE_NAME.
NAMESPACE = "d2ops"
SERVICE_DIMENSION = "service"

RUNS_STARTED = "RunsStarted"  # start_pipeline: a manifest upload started a run
DUPLICATE_DELIVERIES = "DuplicateDeliveries"  # start_pipeline: the upload's run existed already
DATASETS_VALIDATED = "DatasetsValidated"  # validate_dataset: every validated version
DATASETS_REJECTED = "DatasetsRejected"  # validate_dataset: versions with errors (total)
DATASET_ERRORS = "DatasetErrors"  # validate_dataset: errors found, per ERROR_CODE dimension
IMAGES_VALIDATED = "ImagesValidated"  # validate_dataset: images in all splits
INSTANCES_VALIDATED = "InstancesValidated"  # validate_dataset: annotated instances in all splits
GATE_DECISIONS = "GateDecisions"  # summarize_evaluation: one per run, per DECISION dimension
CHALLENGER_AP = "ChallengerAP"  # summarize_evaluation: the challenger's primary metric, per PRIMARY_METRIC

ERROR_CODE = "ErrorCode"
DECISION = "Decision"
PRIMARY_METRIC = "PrimaryMetric"

# name -> the extra dimension it carries (besides ``service``), for the dashboard and the tests.
PIPELINE_METRICS: dict[str, str | None] = {
    RUNS_STARTED: None, DUPLICATE_DELIVERIES: None, DATASETS_VALIDATED: None, DATASETS_REJECTED: None,
    DATASET_ERRORS: ERROR_CODE, IMAGES_VALIDATED: None, INSTANCES_VALIDATED: None,
    GATE_DECISIONS: DECISION, CHALLENGER_AP: PRIMARY_METRIC,
}
# The gate's decisions in the order of d2ops_core.gate_decision.Decision ("approve", "refuse", "review"):
# "approved" and "rejected" as they read since the first dashboards, "review" where a person decides.
DECISIONS = ("approved", "rejected", "review")
