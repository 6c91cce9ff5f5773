"""Distributed Map's S3 parts: ItemReader sources, ItemBatcher batches, ResultWriter files.

Shapes and error texts follow Step Functions (developer guide: "ItemReader (Map)", "ItemBatcher
(Map)", "ResultWriter (Map)", "Setting failure thresholds for Distributed Map states") and its
recorded behaviour. S3 goes through boto3 with the standard ``AWS_ENDPOINT_URL*`` and credential
variables, so the same definition reads and writes the offline runtime's moto server, any
S3-compatible endpoint, or AWS.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from d2ops.asl.errors import StatesError

ITEM_READER_FAILED = "States.ItemReaderFailed"
RESULT_WRITER_FAILED = "States.ResultWriterFailed"
EXCEED_TOLERATED_FAILURE_THRESHOLD = "States.ExceedToleratedFailureThreshold"
# The service's words when a Map Run fails more children than it tolerates.
EXCEED_TOLERATED_FAILURE_CAUSE = "The specified tolerated failure threshold was exceeded"
GET_OBJECT = "arn:aws:states:::s3:getObject"
LIST_OBJECTS_V2 = "arn:aws:states:::s3:listObjectsV2"
PUT_OBJECT = "arn:aws:states:::s3:putObject"
INPUT_TYPES = ("JSON", "JSONL", "CSV", "MANIFEST")
# ReaderConfig.CSVDelimiter's documented names.
CSV_DELIMITERS = {"COMMA": ",", "PIPE": "|", "SEMICOLON": ";", "SPACE": " ", "TAB": "\t"}
# ReaderConfig.MaxItems: at most 100,000,000 items are read (0: no limit, i.e. that maximum).
MAX_ITEMS = 100_000_000
# ItemBatcher.MaxInputBytesPerBatch: at most 256 KiB (the payload limit of a child's input).
MAX_INPUT_BYTES_PER_BATCH = 256 * 1024
EXPRESS_CHILD_SECONDS = 5 * 60  # an Express child workflow runs at most five minutes

def s3_client(region: str) -> Any:
    """A boto3 S3 client, endpoint and credentials from the environment as every AWS SDK reads them
    (the state machine's region when none is set). One per Map Run's read or write, never cached: a
    client made inside a test's moto mock must not outlive it."""
    import boto3

    session = boto3.session.Session()
    return session.client("s3", region_name=session.region_name or region)


def _client_error(exc: Exception) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'Error')}: {error.get('Message', '')}".rstrip(": ")
    if isinstance(exc, BotoCoreError):
        return str(exc)
    return repr(exc)


def _get_text(client: Any, bucket: Any, key: Any, what: str, **extra: Any) -> bytes:
    if not isinstance(bucket, str) or not isinstance(key, str):
        raise StatesError(ITEM_READER_FAILED, f"the ItemReader's Parameters need string Bucket and Key ({what})")
    try:
        body: bytes = client.get_object(Bucket=bucket, Key=key, **extra)["Body"].read()
    except Exception as exc:
        raise StatesError(ITEM_READER_FAILED, f"cannot read s3://{bucket}/{key}: {_client_error(exc)}") from exc
    return body


def _decode(raw: bytes, bucket: str, key: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise StatesError(ITEM_READER_FAILED, f"s3://{bucket}/{key} is not UTF-8 text: {exc}") from exc


def _csv_items(text: str, config: dict[str, Any], limit: int) -> list[dict[str, str]]:
    delimiter = CSV_DELIMITERS.get(config.get("CSVDelimiter", "COMMA"), ",")
    rows = (row for row in csv.reader(io.StringIO(text, newline=""), delimiter=delimiter) if row)
    given = config.get("CSVHeaderLocation") == "GIVEN"
    headers = list(config.get("CSVHeaders", [])) if given else next(rows, [])
    if len(set(headers)) < len(headers):
        raise StatesError(ITEM_READER_FAILED, "CSV headers cannot contain duplicates.")
    items: list[dict[str, str]] = []
    for row in rows:
        if len(items) >= limit:
            break
        # Extra fields are dropped; missing ones are empty strings (the service's recorded behaviour).
        items.append({header: row[i] if i < len(row) else "" for i, header in enumerate(headers)})
    return items


def _manifest_items(client: Any, bucket: str, key: str, text: str, limit: int) -> list[dict[str, str]]:
    """An S3 Inventory manifest.json: every CSV (gzip) file it lists, one item per row named by fileSchema."""
    try:
        manifest = json.loads(text)
        schema = [name.strip() for name in manifest["fileSchema"].split(",")]
        files = [entry["key"] for entry in manifest["files"]]
        file_bucket = manifest.get("destinationBucket", f"arn:aws:s3:::{bucket}").split(":::")[-1]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StatesError(ITEM_READER_FAILED, f"s3://{bucket}/{key} is not an S3 Inventory manifest "
                                              f"(fileSchema, files[].key): {exc}") from exc
    if str(manifest.get("fileFormat", "CSV")).upper() != "CSV":
        raise StatesError(ITEM_READER_FAILED, f"s3://{bucket}/{key}: only CSV inventory files can be read "
                                              f"(fileFormat {manifest.get('fileFormat')!r})")
    items: list[dict[str, str]] = []
    for file_key in files:
        raw = _get_text(client, file_bucket, file_key, "inventory file")
        if file_key.endswith(".gz"):
            try:
                raw = gzip.decompress(raw)
            except OSError as exc:
                raise StatesError(ITEM_READER_FAILED, f"s3://{file_bucket}/{file_key} is not gzip: {exc}") from exc
        for row in csv.reader(io.StringIO(_decode(raw, file_bucket, file_key), newline="")):
            if len(items) >= limit:
                return items
            if row:
                items.append({name: row[i] if i < len(row) else "" for i, name in enumerate(schema)})
    return items


def _listing_item(entry: dict[str, Any]) -> dict[str, Any]:
    modified = entry.get("LastModified")
    # The ItemReader page's example item gives LastModified in epoch seconds (a number).
    return {"Etag": entry.get("ETag"),
            "LastModified": int(modified.timestamp()) if isinstance(modified, datetime) else modified,
            "Key": entry["Key"], "Size": entry.get("Size"), "StorageClass": entry.get("StorageClass", "STANDARD")}


def read_items(resource: str, parameters: Any, config: dict[str, Any], limit: int, region: str) -> list[Any]:
    """The items an ItemReader yields (at most ``limit``), or StatesError(States.ItemReaderFailed, ...)."""
    client = s3_client(region)
    if not isinstance(parameters, dict):
        raise StatesError(ITEM_READER_FAILED, "the ItemReader's Parameters must be an object")
    if resource.endswith(":listObjectsV2"):
        request = {k: v for k, v in parameters.items() if k in ("Bucket", "Prefix", "Delimiter", "StartAfter",
                                                                  "RequestPayer", "ExpectedBucketOwner")}
        items: list[Any] = []
        try:
            for page in client.get_paginator("list_objects_v2").paginate(**request):
                for entry in page.get("Contents", []):
                    if len(items) >= limit:
                        return items
                    items.append(_listing_item(entry))
        except StatesError:
            raise
        except Exception as exc:
            raise StatesError(ITEM_READER_FAILED, f"cannot list s3://{parameters.get('Bucket')}/"
                                                  f"{parameters.get('Prefix', '')}: {_client_error(exc)}") from exc
        return items
    bucket, key = parameters.get("Bucket"), parameters.get("Key")
    # A versioned source is read at the version named (VersionId), as the service does.
    extra = {k: v for k, v in parameters.items() if k in ("VersionId", "ExpectedBucketOwner", "RequestPayer")}
    raw = _get_text(client, bucket, key, "getObject", **extra)
    assert isinstance(bucket, str) and isinstance(key, str)  # _get_text refused anything else
    text = _decode(raw, bucket, key)
    kind = config.get("InputType", "JSON")
    if kind == "CSV":
        return _csv_items(text, config, limit)
    if kind == "MANIFEST":
        return _manifest_items(client, bucket, key, text, limit)
    if kind == "JSONL":
        values: list[Any] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if len(values) >= limit:
                break
            if line.strip():
                try:
                    values.append(json.loads(line))
                except ValueError as exc:
                    raise StatesError(ITEM_READER_FAILED, f"s3://{bucket}/{key} line {number} is not JSON: "
                                                          f"{exc}") from exc
        return values
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise StatesError(ITEM_READER_FAILED, f"s3://{bucket}/{key} is not JSON: {exc}") from exc
    if not isinstance(document, list):
        raise StatesError(ITEM_READER_FAILED, "Attempting to map over non-iterable node.")
    return document[:limit]


def batches(items: list[Any], max_items: int | None, max_bytes: int | None,
            size: Callable[[list[Any]], int]) -> list[tuple[int, list[Any]]]:
    """Consecutive batches (first index, items) within MaxItemsPerBatch and MaxInputBytesPerBatch
    (``size`` gives a candidate batch's input size in bytes). A lone item over the byte limit still
    forms a batch of one, which the child's input limit then judges."""
    out: list[tuple[int, list[Any]]] = []
    current: list[Any] = []
    start = 0
    for index, item in enumerate(items):
        candidate = [*current, item]
        if current and ((max_items is not None and len(candidate) > max_items)
                        or (max_bytes is not None and size(candidate) > max_bytes)):
            out.append((start, current))
            current, start = [item], index
        else:
            current = candidate
    if current:
        out.append((start, current))
    return out


def write_results(region: str, bucket: Any, prefix: Any, map_run_arn: str,
                  records: dict[str, list[Any]], output_type: str = "JSON") -> dict[str, Any]:
    """Write ``<Prefix>/<MapRunId>/{SUCCEEDED,FAILED,PENDING}_0.json`` (non-empty ones; a JSON array, or
    with OutputType JSONL one entry a line in ``..._0.jsonl``) and manifest.json; return the Map's
    ResultWriterDetails. Errors: States.ResultWriterFailed."""
    if not isinstance(bucket, str) or not bucket:
        raise StatesError(RESULT_WRITER_FAILED, "the ResultWriter's Parameters need a string Bucket")
    if prefix is not None and not isinstance(prefix, str):
        raise StatesError(RESULT_WRITER_FAILED, "the ResultWriter's Prefix must be a string")
    base = prefix or ""
    if base and not base.endswith("/"):
        base += "/"
    base += map_run_arn.rsplit(":", 1)[-1] + "/"
    client = s3_client(region)
    files: dict[str, list[dict[str, Any]]] = {"FAILED": [], "PENDING": [], "SUCCEEDED": []}
    try:
        for status in ("SUCCEEDED", "FAILED", "PENDING"):
            if records.get(status):
                if output_type == "JSONL":
                    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records[status]).encode()
                    key = f"{base}{status}_0.jsonl"
                else:
                    body = json.dumps(records[status], ensure_ascii=False).encode("utf-8")
                    key = f"{base}{status}_0.json"
                client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
                files[status].append({"Key": key, "Size": len(body)})
        manifest = {"DestinationBucket": bucket, "MapRunArn": map_run_arn, "ResultFiles": files}
        client.put_object(Bucket=bucket, Key=base + "manifest.json", Body=json.dumps(manifest, indent=2).encode(),
                          ContentType="application/json")
    except Exception as exc:
        raise StatesError(RESULT_WRITER_FAILED, f"cannot write the Map Run's results to s3://{bucket}/{base}: "
                                                f"{_client_error(exc)}") from exc
    return {"Bucket": bucket, "Key": base + "manifest.json"}
