"""What a run cost: SageMaker instance-seconds x the price of each instance type.

The one price table lives here (:data:`DEFAULT_PRICES`, with its date, region and source); an
operator sets ``D2OPS_PRICE_TABLE`` to a JSON document of the same shape (:class:`PriceTable`), or
the path of a file holding one, for their region, a newer price list or a negotiated rate. SageMaker bills training by
``BillableTimeInSeconds`` x ``InstanceCount`` at the on-demand rate; with managed spot the billable
time is shorter than ``TrainingTimeInSeconds`` and the difference is the spot saving (AWS's own
formula: ``1 - BillableTimeInSeconds / TrainingTimeInSeconds``). Processing jobs bill their run
time (``ProcessingStartTime`` to ``ProcessingEndTime``), endpoints every second they exist.

Standard library and pydantic only (the Lambda layer ships it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

PRICE_TABLE_ENV = "D2OPS_PRICE_TABLE"
HOUR = 3600.0

Usage = Literal["training", "processing", "hosting"]


class PriceTable(BaseModel):
    """On-demand USD per instance-hour, by SageMaker usage and instance type, in one region at one date."""

    as_of: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="the date the prices were read")
    region: str
    currency: Literal["USD"] = "USD"
    source: str
    training: dict[str, float] = Field(default_factory=dict)
    processing: dict[str, float] = Field(default_factory=dict)
    hosting: dict[str, float] = Field(default_factory=dict)

    def hourly(self, usage: Usage, instance_type: str) -> float | None:
        """The price of one instance-hour, or None where the table does not list the type."""
        return getattr(self, usage).get(instance_type)


class PriceTableError(ValueError):
    """The file named by D2OPS_PRICE_TABLE cannot be read as a price table."""


# SageMaker on-demand list prices, us-east-1 (Linux, USD per instance-hour), for the instance
# types the template offers by default and their usual neighbours. Not fetched at run time: no
# network in the Lambda and reproducible numbers; check them against the pricing page and
# override with D2OPS_PRICE_TABLE where they drift or the stack runs in another region.
_COMMON = {
    "ml.m5.large": 0.115, "ml.m5.xlarge": 0.23, "ml.m5.2xlarge": 0.461, "ml.m5.4xlarge": 0.922,
    "ml.c5.xlarge": 0.204, "ml.c5.2xlarge": 0.408, "ml.c5.4xlarge": 0.816,
    "ml.g4dn.xlarge": 0.736, "ml.g4dn.2xlarge": 0.94, "ml.g4dn.4xlarge": 1.505, "ml.g4dn.12xlarge": 4.89,
    "ml.g5.xlarge": 1.408, "ml.g5.2xlarge": 1.515, "ml.g5.4xlarge": 2.03, "ml.g5.12xlarge": 7.09,
    "ml.p3.2xlarge": 3.825, "ml.p3.8xlarge": 14.688, "ml.p3.16xlarge": 28.152,
}
DEFAULT_PRICES = PriceTable(
    as_of="2025-06-01", region="us-east-1",
    source="https://aws.amazon.com/sagemaker/pricing/ (on-demand; training, processing and real-time inference)",
    training={**_COMMON, "ml.p4d.24xlarge": 37.688}, processing=dict(_COMMON), hosting=dict(_COMMON))


def load_price_table(env: Mapping[str, str] | None = None) -> PriceTable:
    """The table in ``$D2OPS_PRICE_TABLE`` (a JSON file), else :data:`DEFAULT_PRICES`."""
    path = (os.environ if env is None else env).get(PRICE_TABLE_ENV, "").strip()
    if not path:
        return DEFAULT_PRICES
    try:
        # The variable holds the table itself (a Lambda environment) or the path of a JSON file.
        text = path if path.startswith("{") else Path(path).read_text("utf-8")
        return PriceTable.model_validate(json.loads(text))
    except OSError as exc:
        raise PriceTableError(f"{PRICE_TABLE_ENV}={path}: cannot read it: {exc}") from exc
    except ValueError as exc:  # JSON errors and ValidationError both
        detail = exc.errors()[0] if isinstance(exc, ValidationError) else exc
        raise PriceTableError(f"{PRICE_TABLE_ENV}={path}: not a price table: {detail}") from exc


class JobCost(BaseModel):
    """One priced resource: instances x seconds x hourly price (cost is None when the type is unpriced)."""

    name: str
    instance_type: str
    instance_count: int
    seconds: float = Field(description="billed wall-clock seconds per instance")
    instance_seconds: float
    usd_per_instance_hour: float | None
    cost_usd: float | None


class TrainingCost(JobCost):
    spot: bool
    training_seconds: float = Field(description="TrainingTimeInSeconds (wall clock, interruptions included)")
    on_demand_cost_usd: float | None = Field(description="what TrainingTimeInSeconds would cost without spot")
    spot_savings_usd: float | None
    spot_savings_percent: float | None = Field(description="1 - BillableTimeInSeconds / TrainingTimeInSeconds")


class RunCost(BaseModel):
    """A run's SageMaker cost, with the table it was priced from."""

    currency: Literal["USD"] = "USD"
    prices_as_of: str
    prices_region: str
    training: TrainingCost | None = None
    evaluation: JobCost | None = None
    endpoint: JobCost | None = Field(None, description="endpoint instance time from deployment to the run's end")
    total_usd: float | None = Field(description="the sum of the priced parts; None when nothing could be priced")
    unpriced: list[str] = Field(default_factory=list, description="instance types the price table does not list")


def _priced(table: PriceTable, usage: Usage, name: str, instance_type: str, count: int, seconds: float) -> JobCost:
    hourly = table.hourly(usage, instance_type)
    seconds = max(0.0, float(seconds))
    instance_seconds = seconds * count
    return JobCost(name=name, instance_type=instance_type, instance_count=count, seconds=seconds,
                   instance_seconds=instance_seconds, usd_per_instance_hour=hourly,
                   cost_usd=None if hourly is None else round(instance_seconds / HOUR * hourly, 6))


def training_cost(job: Mapping[str, Any], table: PriceTable) -> TrainingCost | None:
    """From a DescribeTrainingJob answer; None until SageMaker reports the job's times (it has not ended)."""
    reported = [float(job[k]) for k in ("BillableTimeInSeconds", "TrainingTimeInSeconds") if job.get(k) is not None]
    if not reported:
        return None
    # One of them alone (older records): without spot the two are equal.
    billable = float(job.get("BillableTimeInSeconds") or reported[0])
    trained = float(job.get("TrainingTimeInSeconds") or reported[-1])
    resources = job.get("ResourceConfig") or {}
    count = int(resources.get("InstanceCount") or 1)
    base = _priced(table, "training", str(job.get("TrainingJobName", "")), str(resources.get("InstanceType", "")),
                   count, billable)
    hourly = base.usd_per_instance_hour
    on_demand = None if hourly is None else round(trained * count / HOUR * hourly, 6)
    savings = None if on_demand is None or base.cost_usd is None else round(on_demand - base.cost_usd, 6)
    percent = round(100.0 * (1.0 - billable / trained), 2) if trained > 0 else None
    return TrainingCost(**base.model_dump(), spot=bool(job.get("EnableManagedSpotTraining")), training_seconds=trained,
                        on_demand_cost_usd=on_demand, spot_savings_usd=savings, spot_savings_percent=percent)


def processing_cost(job: Mapping[str, Any], table: PriceTable, now: datetime | None = None) -> JobCost | None:
    """From a DescribeProcessingJob answer: start to end (to ``now`` while it runs); None before it starts."""
    start = job.get("ProcessingStartTime")
    if not isinstance(start, datetime):
        return None
    end = job.get("ProcessingEndTime")
    if not isinstance(end, datetime):
        if now is None:
            return None
        end = now
    cluster = (job.get("ProcessingResources") or {}).get("ClusterConfig") or {}
    return _priced(table, "processing", str(job.get("ProcessingJobName", "")), str(cluster.get("InstanceType", "")),
                   int(cluster.get("InstanceCount") or 1), (end - start).total_seconds())


def endpoint_cost(name: str, instance_type: str, instance_count: int, seconds: float, table: PriceTable) -> JobCost:
    return _priced(table, "hosting", name, instance_type, instance_count, seconds)


def run_cost(table: PriceTable, training: TrainingCost | None, evaluation: JobCost | None,
             endpoint: JobCost | None) -> RunCost:
    parts = [p for p in (training, evaluation, endpoint) if p is not None]
    priced = [p.cost_usd for p in parts if p.cost_usd is not None]
    return RunCost(prices_as_of=table.as_of, prices_region=table.region, training=training, evaluation=evaluation,
                   endpoint=endpoint, total_usd=round(sum(priced), 6) if priced else None,
                   unpriced=sorted({p.instance_type for p in parts if p.cost_usd is None}))


def price_run(table: PriceTable, training_job: Mapping[str, Any] | None, evaluation_job: Mapping[str, Any] | None,
              endpoint: Mapping[str, Any] | None, deployed_at: datetime | None, until: datetime) -> RunCost | None:
    """A run's cost from its DescribeTrainingJob / DescribeProcessingJob answers and its endpoint time.

    ``endpoint`` is the run plan's endpoint settings (``instance_type``, ``instance_count``, ``name``);
    its instances are billed from ``deployed_at`` to ``until`` (the run's end, or now while it runs).
    ``deployed_at`` is the run's ``$.deployment.started_at``, when its create/update endpoint state was
    entered, which that state records only when its call succeeded: a run whose create/update failed
    is billed no endpoint time. None before any job ran. The status API and the run's notification
    both price a run through this, from that same field, so they always agree.
    """
    training = training_cost(training_job, table) if training_job else None
    evaluation = processing_cost(evaluation_job, table, now=until) if evaluation_job else None
    hosted = None
    if deployed_at is not None and endpoint and endpoint.get("instance_type"):
        hosted = endpoint_cost(str(endpoint.get("name") or "endpoint"), str(endpoint["instance_type"]),
                               int(endpoint.get("instance_count") or 1), (until - deployed_at).total_seconds(), table)
    if training is None and evaluation is None and hosted is None:
        return None
    return run_cost(table, training, evaluation, hosted)
