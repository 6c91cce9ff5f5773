"""The Step Functions definitions, generated from typed Python (``python -m d2ops.statemachine``)."""
