"""An Amazon States Language interpreter (JSONPath and JSONata, workflow variables) with the semantics
of AWS Step Functions.

The offline runtime runs ``statemachine/*.asl.json`` through it, and tests run every path of the
pipeline with Step Functions Local mock configurations. Pure Python; only a Distributed Map's
ItemReader/ResultWriter reach S3 (boto3, the standard AWS_ENDPOINT_URL* variables).

Python API::

    from d2ops.asl import StateMachine, MockConfig, TaskFailed, VirtualClock, Clock

    machine = StateMachine.from_file("statemachine/training_pipeline.asl.json",
                                     substitutions={"ValidateFunctionArn": "arn:aws:lambda:..."})
    mock = MockConfig.from_file("tests/fixtures/mock.json").test_case(machine.name, "HappyPath")
    execution = machine.run({"dataset": {...}}, mock=mock)          # virtual time by default
    execution.status        # "SUCCEEDED" | "FAILED" | "TIMED_OUT" | "ABORTED"
    execution.output, execution.error, execution.cause, execution.history  # GetExecutionHistory events

    def invoke(resource, parameters, context):                      # a TaskExecutor
        if parameters.get("bad"):
            raise TaskFailed("DatasetRejected", "no manifest.json")
        return {"Payload": {...}, "StatusCode": 200}

    running = machine.start(data, executors={"arn:aws:states:::lambda:invoke": invoke},
                            clock=Clock(), on_event=print)          # background thread, real time
    running.abort()                                                 # StopExecution

    tokens = TaskTokens()       # .waitForTaskToken tasks wait here for their token (callbacks=tokens)
    tokens.succeed(token, {...}); tokens.fail(token, "Rejected", "why"); tokens.heartbeat(token)

``StateMachine.from_definition(dict_or_json, name=...)`` builds one from memory. Definitions are
validated first: an ``AslDefinitionError`` names each problem by state and field, including the
features refused on purpose (task credentials). See
docs/asl-interpreter.md for what is supported and how it differs from the service.
"""

from d2ops.asl.callbacks import TaskTokens
from d2ops.asl.clock import Cancel, Clock, VirtualClock
from d2ops.asl.errors import AslDefinitionError, StatesError, TaskFailed, TokenRefused
from d2ops.asl.executors import ExecutorRegistry, TaskContext, TaskExecutor
from d2ops.asl.interpreter import PAYLOAD_LIMIT_BYTES, Execution, StateMachine, definition_name
from d2ops.asl.mock import MockConfig, MockTestCase
from d2ops.asl.substitution import placeholders, substitute

__all__ = [
    "PAYLOAD_LIMIT_BYTES",
    "AslDefinitionError",
    "Cancel",
    "Clock",
    "Execution",
    "ExecutorRegistry",
    "MockConfig",
    "MockTestCase",
    "StateMachine",
    "StatesError",
    "TaskContext",
    "TaskExecutor",
    "TaskFailed",
    "TaskTokens",
    "TokenRefused",
    "VirtualClock",
    "definition_name",
    "placeholders",
    "substitute",
]
