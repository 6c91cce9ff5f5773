"""``${Key}`` placeholders (SAM ``DefinitionSubstitutions``) replaced before the definition is parsed.

Unlike the service, which silently leaves an unmatched placeholder in place, any placeholder left
after substitution is an error listing them all; keys are case-sensitive.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from d2ops.asl.errors import AslDefinitionError

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def placeholders(text: str) -> list[str]:
    """The distinct placeholder keys in ``text``, in order of first appearance."""
    return list(dict.fromkeys(PLACEHOLDER.findall(text)))


def substitute(text: str, substitutions: Mapping[str, object] | None, *, source: str | None = None) -> str:
    values = dict(substitutions or {})
    bad_keys = [key for key in values if not isinstance(key, str)]
    if bad_keys:
        raise AslDefinitionError(f"substitution keys must be strings: {bad_keys!r}", source=source)
    result = PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), text)
    missing = placeholders(result)
    if missing:
        hint = ""
        lowered = {key.lower(): key for key in values}
        near = [f"{m!r} (did you mean {lowered[m.lower()]!r}? keys are case-sensitive)"
                for m in missing if m.lower() in lowered]
        if near:
            hint = "; " + ", ".join(near)
        raise AslDefinitionError(
            f"unreplaced placeholders: {', '.join('${' + m + '}' for m in missing)}{hint}", source=source)
    return result
