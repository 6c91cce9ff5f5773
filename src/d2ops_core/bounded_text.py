"""Text cut to what an AWS field accepts, saying that it was cut.

AWS services written in Java count a string's length in UTF-16 code units (an emoji is two), so the
bounds here count those too, never fewer than Python's characters. A cut text ends with an ellipsis
and how many characters were left out, so a reader knows it is not whole and by how much; the whole
text stays where it came from (the run's state, the notification).

Standard library only: the Lambda layer ships it.
"""

from __future__ import annotations

import bisect
import itertools
import unicodedata

# SNS Publish: a Subject must be "less than 100 characters long", with no line breaks or control
# characters (botocore's model); it is kept ASCII for mail clients.
MAX_SNS_SUBJECT = 99


def utf16_units(text: str) -> int:
    """Length in UTF-16 code units: what a Java service counts."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def bounded(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (and UTF-16 units), ending with an ellipsis and how
    many characters were left out."""
    if utf16_units(text) <= limit:
        return text
    ends = list(itertools.accumulate(utf16_units(c) for c in text))  # ends[i]: units of text[:i + 1]
    keep = bisect.bisect_right(ends, limit)  # the most characters that fit without a suffix
    while True:  # the suffix's length depends on the count it names: give back characters until it fits
        suffix = f"\u2026 ({len(text) - keep} more characters)"
        if (ends[keep - 1] if keep else 0) + utf16_units(suffix) <= limit or keep == 0:
            return text[:keep] + suffix
        keep -= 1


def sns_subject(text: str) -> str:
    """An SNS Subject: ASCII (accents dropped, other characters left out), one line, at most
    MAX_SNS_SUBJECT characters, a longer one ending in ``...``."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    flat = " ".join("".join(c if c.isprintable() else " " for c in ascii_text).split())
    return flat if len(flat) <= MAX_SNS_SUBJECT else flat[:MAX_SNS_SUBJECT - 3].rstrip() + "..."
