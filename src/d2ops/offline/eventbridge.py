"""EventBridge offline: the template's rules, delivered to the Lambdas they target.

No EventBridge API is served here (boto3's ``events`` calls go to moto, and the gateway has no
service for it): what the stack needs of EventBridge is its rules, and the offline runtime
delivers them itself, as EventBridge does:

- the upload trigger (S3 "Object Created" for a manifest -> the pipeline's trigger function),
  `EventBridgeRules.deliver`, for an event the caller built (`OfflineRuntime.upload_event`);
- the execution status change (an execution of the stack's state machine ended -> every other
  rule whose pattern matches: the endpoint lease release), `EventBridgeRules.status_changed`, a
  listener of the local Step Functions. Asynchronous to the execution, failures logged.

The events and the pattern matching are `d2ops.offline.events`.
"""

from __future__ import annotations

import logging
from typing import Any

from d2ops.offline import events
from d2ops.offline.lambdas import LocalLambdas
from d2ops.offline.services.stepfunctions import LocalStepFunctions
from d2ops.offline.stack import ACCOUNT_ID, REGION, OfflineStack

log = logging.getLogger(__name__)

_ENDED = {"ExecutionSucceeded", "ExecutionFailed", "ExecutionAborted", "ExecutionTimedOut"}


class EventBridgeRules:
    def __init__(self, stack: OfflineStack, lambdas: LocalLambdas, sfn: LocalStepFunctions) -> None:
        self.stack = stack
        self.lambdas = lambdas
        self.sfn = sfn

    def deliver(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The trigger rule: invoke its target if the template's pattern matches, else None."""
        if not events.matches(self.stack.trigger_pattern, event):
            return None
        result: dict[str, Any] = self.lambdas.invoke(self.stack.trigger_function, event)
        return result

    def status_changed(self, execution_name: str, history_event: dict[str, Any]) -> None:
        """EventBridge's execution status change for the stack's state machine -> the rules that match
        (the endpoint lease release). Delivered as EventBridge does: asynchronously, failures logged."""
        if history_event["type"] not in _ENDED:
            return
        arn = f"{self.stack.state_machine_arn.replace(':stateMachine:', ':execution:')}:{execution_name}"
        try:
            described = self.sfn.describe_execution({"executionArn": arn})
        except Exception:  # an execution of another state machine (tests add their own)
            return
        event = events.execution_status_change_event(described, REGION, ACCOUNT_ID)
        for rule in self.stack.rules:
            if rule.function != self.stack.trigger_function and events.matches(rule.pattern, event):
                try:
                    self.lambdas.invoke(rule.function, event)
                except Exception:
                    log.exception("EventBridge delivery of %s's status change to %s failed", execution_name,
                                  rule.function)
