"""Reading a run's monitoring baseline (``runs/<run id>/evaluation/monitoring-baseline.json``).

One reader for the endpoint's monitor and for ``d2ops label select``; each keeps its own policy for a bad
document (the monitor judges the window ``no_baseline`` and names the problem, the command stops with it).

Standard library and pydantic only: Lambdas import this through the CoreLayer.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from d2ops_core import s3_layout
from d2ops_core.documents.monitoring import MonitoringBaseline
from d2ops_core.s3_probe import read_listed


class BaselineError(ValueError):
    """The object at a run's baseline key is not a monitoring baseline; the message is one line naming it."""


def read_monitoring_baseline(s3: Any, bucket: str, run_id: str) -> MonitoringBaseline | None:
    """The run's baseline: its model's answers on its val split. None when the run has none (evaluated before
    baselines were written); :class:`BaselineError` when the object is there but is not a baseline.

    Existence is asked by listing (:func:`d2ops_core.s3_probe.read_listed`), as roles that may only list the
    prefix can: a GET of a missing key could answer 403 rather than 404.
    """
    key = s3_layout.monitoring_baseline_key(run_id)
    body = read_listed(s3, bucket, key)
    if body is None:
        return None
    try:
        return MonitoringBaseline.model_validate_json(body)
    except ValidationError as exc:  # a JSON syntax error is one too (type json_invalid)
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "document"
        raise BaselineError(f"{s3_layout.s3_uri(bucket, key)}: not a monitoring baseline "
                            f"({where}: {first['msg']})") from None
