"""Per-class score thresholds outside the model: the fallback, and their bounded Model Registry form.

The thresholds themselves are chosen at export (model_code/evaluation/thresholds.py, the rule) and
ship in the artifact's ``metadata.json`` (``score_thresholds``: class name -> score), which the
server applies by default. The registry entry carries a copy for people browsing the Model
Registry, in the only shape CustomerMetadataProperties accepts (d2ops_core.platform): words
``name=score`` separated by spaces, at most 256 characters. Where the classes do not all fit, the
value ends with ``+N more in metadata.json``: the full map is the artifact's.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from d2ops_core import platform

# What a class without a fitted threshold gets (no ground truth or no true positive on val, or an
# artifact exported before thresholds shipped with the model): the server's default before issue 22.
DEFAULT_SCORE_THRESHOLD = 0.5
REGISTRY_KEY = "score_thresholds"
REGISTRY_NONE = "none"  # the artifact has none (CustomerMetadataValue needs at least one character)
REGISTRY_DIGITS = 4  # the scores the endpoint answers are rounded to 1e-4 too
FULL_MAP_AT = "metadata.json"


def _units(text: str) -> int:
    """Length in UTF-16 code units, what SageMaker (a Java service) counts."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def registry_word(name: str) -> str:
    """A class name as one word the registry accepts: any character outside its set, a space or '='
    becomes '_' (so each ``name=score`` word reads back unambiguously)."""
    return "".join(c if _word_character(c) else "_" for c in name) or "_"


def _word_character(c: str) -> bool:
    category = unicodedata.category(c)[0]
    if category == "Z" or c == "=":  # the separators of the value's words
        return False
    return category in platform.CUSTOMER_METADATA_CATEGORIES or c in platform.CUSTOMER_METADATA_SYMBOLS


def registry_value(thresholds: Mapping[str, float], limit: int = platform.CUSTOMER_METADATA_VALUE_MAX) -> str:
    """``thresholds`` as one CustomerMetadataProperties value: ``circle=0.4123 square=0.37 ...`` in the
    map's order, at most ``limit`` characters; the classes that do not fit are counted at the end
    (``+3 more in metadata.json``)."""
    if not thresholds:
        return REGISTRY_NONE
    words = [f"{registry_word(name)}={round(float(score), REGISTRY_DIGITS):g}" for name, score in thresholds.items()]
    text = " ".join(words)
    if _units(text) <= limit:
        return text
    for keep in range(len(words) - 1, -1, -1):
        suffix = f"+{len(words) - keep} more in {FULL_MAP_AT}"
        text = " ".join([*words[:keep], suffix])
        if _units(text) <= limit:
            return text
    return f"{len(words)} classes: see {FULL_MAP_AT}"[:limit]  # a limit too small for any word
