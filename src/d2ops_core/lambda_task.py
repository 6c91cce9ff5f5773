"""The pipeline Lambdas' Powertools wiring, in one place: a handler that takes a typed event.

Imported by the handlers only (functions/*/handler.py): their packages ship aws-lambda-powertools
(functions/*/requirements.txt); nothing else in the core imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.parser import event_parser
from pydantic import BaseModel

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def task_handler(model: type[BaseModel], logger: Logger, tracer: Tracer,
                 metrics: Metrics | None = None) -> Callable[[_Handler], _Handler]:
    """The handler's event parsed into ``model`` (a bad event fails the invocation with the validation
    error), its metrics flushed when ``metrics`` is given, traced, and logged with the Lambda context:
    the decorators every task handler wears, outermost first."""

    def wrap(handler: _Handler) -> _Handler:
        wrapped = event_parser(model=model)(handler)
        if metrics is not None:
            wrapped = metrics.log_metrics(wrapped)
        return cast(_Handler, logger.inject_lambda_context(tracer.capture_lambda_handler(wrapped)))

    return wrap
