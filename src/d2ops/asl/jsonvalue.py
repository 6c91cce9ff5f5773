"""What may travel between states: JSON the service's own parser would accept.

Step Functions parses payloads with Jackson, which refuses documents nested more than 1000 levels
deep (``StreamReadConstraints``) and has no JSON spelling for infinities or NaN. Python's ``json``
writes ``Infinity`` (invalid JSON) and hits the interpreter's recursion limit (a ``RecursionError``)
well before 1000 levels when it runs a few frames deep, so the interpreter checks values itself,
without recursing, and refuses them by name.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Below Jackson's 1000: json.dumps/loads and the path code recurse once per level, and they share
# Python's recursion limit (1000 frames in all) with the interpreter's own frames.
MAX_JSON_DEPTH = 500
# json.loads accepts "\ud800" alone; such a string cannot be encoded as UTF-8 (the payload size is
# counted in UTF-8 bytes, and the service stores UTF-8).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a Step Functions payload (too deep, a number JSON cannot write), or None."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list | tuple):
            if depth > MAX_JSON_DEPTH:
                return f"it is nested more than {MAX_JSON_DEPTH} levels deep"
            if isinstance(node, dict):
                stack.extend((key, depth) for key in node)  # keys are strings too
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(node, float) and not math.isfinite(node):
            return f"it holds {node}, a number JSON cannot represent"
        elif isinstance(node, str) and (surrogate := _LONE_SURROGATE.search(node)) is not None:
            return (f"it holds a lone UTF-16 surrogate (\\u{ord(surrogate.group()):04x}), which is not Unicode text "
                    "and has no UTF-8 form")
    return None


def text_too_deep(text: str) -> bool:
    """Whether a JSON text opens more than MAX_JSON_DEPTH brackets at once (checked before parsing,
    which would recurse that deep)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest > MAX_JSON_DEPTH
