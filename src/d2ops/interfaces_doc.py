"""docs/interfaces.md, generated: the documents that cross a boundary, who writes, who reads, where.

Each entry names the one pydantic model of a document; the field tables come from that model's
JSON schema, so the page changes when a model does. ``tests/unit/test_interfaces_doc.py`` fails
while the page is stale; regenerate with

    .venv/bin/python -m d2ops.interfaces_doc --write

Developer tooling (it imports the handlers' and model_code's models): never shipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from d2ops.functions import import_model
from d2ops_core import s3_layout

# The run's S3 layout as d2ops_core.s3_layout derives it (placeholders for bucket and run id), never respelled here.
_ARTIFACTS, _RUN = "<ArtifactsBucket>", "<runId>"

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout whose docs/ this writes
DOC_PATH = REPO_ROOT / "docs" / "interfaces.md"


@dataclass(frozen=True)
class Document:
    anchor: str
    title: str
    where: str
    writer: str
    readers: str
    model: str  # "module:Class", imported by the writer and the readers
    mode: str = "validation"  # pydantic's schema mode: "validation" (what readers accept) or "serialization"


DOCUMENTS: tuple[Document, ...] = (
    Document(
        "manifest", "Dataset manifest",
        "`s3://<DataBucket>/datasets/<name>/<version>/manifest.json` (uploaded last); JSON schema: "
        "`docs/manifest.schema.json`",
        "the dataset's owner", "`start_pipeline` (the S3 event: key layout only), `validate_dataset`, "
        "`prepare_training` (overrides, gate), the training job (`model_code.dataset_version`)",
        "d2ops_core.validation.manifest:Manifest"),
    Document(
        "run-identity", "Run identity (state machine input `dataset`)",
        "Step Functions execution input; the execution name is the run id (`d2ops_core.run_ids.run_id_for`)",
        "`start_pipeline` (`d2ops_core.run_start.start_run`)", "every state (JSONPath `$.dataset`), `status_api`",
        "d2ops_core.dataset_identity:DatasetRef"),
    Document(
        "validation-report", "Validation report",
        f"`{s3_layout.s3_uri(_ARTIFACTS, s3_layout.validation_report_key(_RUN))}`",
        "`validate_dataset` (`d2ops_core.validation.validate_s3`)", "`status_api`, `d2ops validate` (prints it)",
        "d2ops_core.validation.report:ValidationReport"),
    Document(
        "inventory", "Dataset inventory (one entry a line)",
        f"`{s3_layout.s3_uri(_ARTIFACTS, s3_layout.inventory_key(_RUN))}`: JSONL sorted by key; its digest is "
        "`sha256:<hex of the file's bytes>` (`d2ops_core.validation.inventory.inventory_digest`)",
        "`validate_dataset` (inline) or its `summarize_images` handler (after the Distributed Map)",
        "the dataset diff, the model artifact's and the registry's digest, reviewers",
        "d2ops_core.validation.inventory:InventoryEntry"),
    Document(
        "dataset-diff", "Dataset diff against the champion's dataset",
        f"`{s3_layout.s3_uri(_ARTIFACTS, s3_layout.dataset_diff_key(_RUN))}`; its counts travel as "
        "`$.plan.dataset_diff` (`DatasetDiffSummary`); `d2ops diff A B --json` prints the same document",
        "`prepare_training` (`d2ops_core.dataset_diff`, from both runs' inventories and snapshots), `d2ops diff`",
        "`status_api` (`GET /runs/{id}`: the summary and its URI), the console, `d2ops status`, "
        "`compose_notification` (when the gate refuses)",
        "d2ops_core.documents.dataset_diff:DatasetDiff"),
    Document(
        "image-items", "Image check items (one item a line)",
        f"`{s3_layout.s3_uri(_ARTIFACTS, s3_layout.image_items_key(_RUN))}`: JSONL, the Distributed Map's ItemReader",
        "`validate_dataset` (when the version has more images than `InlineImageLimit`)",
        "the *Check images* Map (ItemReader, ItemBatcher `Items`), `check_images`",
        "d2ops_core.validation.inventory:ImageItem"),
    Document(
        "image-batch-result", "Image batch result",
        f"the `check_images` Lambda's return; the Map's ResultWriter stores it under "
        f"`{s3_layout.s3_uri(_ARTIFACTS, s3_layout.image_results_prefix(_RUN))}/<map run id>/` "
        "(each record's `Output`, a JSON string)",
        "`check_images`", "`validate_dataset.summarize_images` (`d2ops_core.validation.merge`)",
        "d2ops_core.validation.inventory:ImageBatchResult"),
    Document(
        "artifact-metadata", "Model artifact metadata",
        "`metadata.json` at the root of the training job's `model.tar.gz` (docs/model-artifact.md)",
        "the trainers (`model_code.training.export`, `detectron2_export`)",
        "serving (`model_code.serving.service`), the evaluation job, `load_artifact`",
        "model_code.artifact:ArtifactMetadata"),
    Document(
        "model-evaluation", "Model evaluation (in the artifact)",
        "`evaluation.json` at the root of the training job's `model.tar.gz`",
        "the trainers' export (`model_code.evaluation.documents`)", "`model_code.artifact.load_artifact`",
        "d2ops_core.documents.evaluation:ModelEvaluation"),
    Document(
        "evaluation-report", "Evaluation report (challenger and champion)",
        f"`{s3_layout.evaluation_report_uri(_ARTIFACTS, _RUN)}` (the processing job's output)",
        "the evaluation processing job (`model_code.evaluation.job`)", "`summarize_evaluation`, `status_api`",
        "d2ops_core.documents.evaluation:EvaluationReport"),
    Document(
        "error-analysis", "Error analysis (challenger and champion)",
        f"`{s3_layout.evaluation_report_uri(_ARTIFACTS, _RUN).rsplit('/', 1)[0]}/report/errors.json` (beside the "
        "report's `index.html`, `pr_curves.json` and the drawn worst images `errors/*.jpg`)",
        "the evaluation processing job (`model_code.evaluation.error_report`)",
        "`status_api` (`GET /runs/{runId}/evaluation`'s `errors`), the console",
        "d2ops_core.documents.error_analysis:ErrorAnalysis"),
    Document(
        "training-curve", "Training curve of an ended job",
        f"`{s3_layout.s3_uri(_ARTIFACTS, s3_layout.training_curve_key(_RUN))}` (written once, `IfNoneMatch`)",
        "`status_api` (`GET /runs/{id}`, once the run's training job has ended and its metrics settled)",
        "`status_api` (`GET /runs/{id}`'s `training.progress`, instead of CloudWatch)",
        "d2ops_core.documents.training_curve:TrainingCurve"),
    Document(
        "gate-thresholds", "Gate thresholds",
        "state `$.plan.gate` (small: it travels in the state, not in S3)",
        "`prepare_training` (stack parameters tightened by the manifest's `gate`)", "`summarize_evaluation`",
        "d2ops_core.documents.evaluation:GateThresholds"),
    Document(
        "run-state", "Run state document (the state machine's `$`)",
        "the Step Functions execution's state, passed from state to state; its output (or the last state's) "
        "when the run ends; each section exists once its state has run",
        "the execution input (`dataset`), `prepare_training` (`plan`), the ASL's ResultSelectors and Pass "
        "states (every other section)",
        "`compose_notification`, `status_api` (`GET /runs/{id}`, its reports), read section by section "
        "(a malformed section is left out)",
        "d2ops_core.documents.run_state:RunState"),
    Document(
        "capture-record", "Data-capture record (one invocation a line)",
        "`s3://<ArtifactsBucket>/capture/<endpoint>/<variant>/yyyy/mm/dd/hh/<file>.jsonl` (SageMaker's layout; "
        "`d2ops_core.s3_layout.capture_hour_prefix`)",
        "SageMaker's data capture (`DataCaptureConfig`); offline, the emulated InvokeEndpoint "
        "(`d2ops.offline.services.sagemaker_capture`)",
        "`d2ops_core.capture_files` for the monitor (`monitor_endpoint`) and `d2ops label select`",
        "d2ops_core.documents.capture:CaptureRecord"),
    Document(
        "monitoring-baseline", "Monitoring baseline",
        f"`{s3_layout.s3_uri(_ARTIFACTS, s3_layout.monitoring_baseline_key(_RUN))}` (the evaluation job's output)",
        "the evaluation job (`model_code.evaluation.monitoring_baseline`, features from "
        "`d2ops_core.monitoring_features`)",
        "`d2ops_core.monitoring_baseline` for the monitor (`monitor_endpoint`, once the run's model serves) and "
        "`d2ops label select`",
        "d2ops_core.documents.monitoring:MonitoringBaseline"),
    Document(
        "monitoring-window", "Monitoring window verdict",
        "`s3://<ArtifactsBucket>/monitoring/<endpoint>/windows/<YYYY-MM-DDTHH:MMZ>.json` "
        "(`d2ops_core.s3_layout.monitoring_window_key`)",
        "`monitor_endpoint` (written once per window)",
        "`status_api` (`GET /endpoint/monitoring`), the console, `d2ops monitor`",
        "d2ops_core.documents.monitoring:MonitoringWindow"),
    Document(
        "label-selection", "Label selection",
        "`<out>/selection.json` beside `<out>/images/<sha256>.<ext>` (a local directory)",
        "`d2ops label select`", "`d2ops label export` (Label Studio or COCO)",
        "d2ops.labelling.documents:LabelSelection"),
    Document(
        "champion", "Champion record",
        "`s3://<ArtifactsBucket>/champion.json`; each promotion also under `endpoint-history/`",
        "the state machine's *Promote to champion* state (S3 PutObject)",
        "`prepare_training` (the model to beat), `status_api` (`/models`, endpoint history)",
        "d2ops_core.champion:ChampionRecord"),
    Document(
        "detections", "Endpoint response (detections)",
        "body of `POST /invocations` on the SageMaker endpoint (TorchServe)",
        "`model_code.serving.response`", "`smoke_test_endpoint`, `d2ops predict`, API clients",
        "d2ops_core.documents.detections:InvocationResponse"),
)


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " or ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map to {_type(schema['additionalProperties'])}"
    return str(kind)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
    for name, prop in schema.get("properties", {}).items():
        description = prop.get("description", "")
        if "default" in prop and name not in required:
            description = f"{description} (default `{json.dumps(prop['default'])}`)".strip()
        rows.append(f"| `{name}` | {_cell(_type(prop))} | {'yes' if name in required else ''} | {_cell(description)} |")
    return rows


def model_for(document: Document) -> type[BaseModel]:
    """The document's model; a handler package's is imported as Lambda imports it (``d2ops.functions``)."""
    return import_model(document.model)


def render(documents: Sequence[Document] = DOCUMENTS) -> str:
    out = [
        "# Interfaces: the documents that cross a boundary",
        "",
        "<!-- Generated by `python -m d2ops.interfaces_doc --write` from the pydantic models; do not edit. -->",
        "",
        "Every document written in one place and read in another has one pydantic model, imported by",
        "its writer and its readers. This page lists them: where each lives, who writes it, who reads",
        "it, and its fields (from the model's JSON schema). The status API's responses are described",
        "by `docs/status-api.openapi.json`; the S3 key layout by `d2ops_core.s3_layout` and `d2ops_core.champion`.",
        "",
        "| document | where | model |",
        "| --- | --- | --- |",
    ]
    out += [f"| [{d.title}](#{d.anchor}) | {d.where.split(';')[0]} | `{d.model}` |" for d in documents]
    for d in documents:
        model = model_for(d)
        schema = model.model_json_schema(mode="validation" if d.mode == "validation" else "serialization")
        out += ["", f'<a id="{d.anchor}"></a>', f"## {d.title}", "",
                f"- **Where**: {d.where}", f"- **Written by**: {d.writer}", f"- **Read by**: {d.readers}",
                f"- **Model**: `{d.model}`", ""]
        if model.__doc__:
            out += [_cell(model.__doc__), ""]
        out += _fields(schema)
        for name, sub in sorted(schema.get("$defs", {}).items()):
            if sub.get("properties"):
                out += ["", f"`{name}`:", "", *_fields(sub)]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.interfaces_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {DOC_PATH} (default: print to stdout)")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        DOC_PATH.write_text(text)
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
