"""Why a JSON file is not plain UTF-8, with the byte where it stops being so.

COCO tooling (pycocotools' ``json.load(open(path))``, Detectron2) reads UTF-8 without a
byte-order mark; a BOM, UTF-16 or a Latin-1 byte makes training fail much later, so the
validator names the encoding problem instead of a generic JSON error.
"""

from __future__ import annotations

import codecs
from typing import Any

_CHUNK = 1 << 20
# UTF-32 first: its little-endian BOM begins with UTF-16's.
_BOMS = (
    (codecs.BOM_UTF8, "starts with a UTF-8 byte-order mark (BOM): save it as UTF-8 without a BOM"),
    (codecs.BOM_UTF32_LE, "is UTF-32 (it starts with a UTF-32 byte-order mark): save it as UTF-8"),
    (codecs.BOM_UTF32_BE, "is UTF-32 (it starts with a UTF-32 byte-order mark): save it as UTF-8"),
    (codecs.BOM_UTF16_LE, "is UTF-16 (it starts with a UTF-16 byte-order mark): save it as UTF-8"),
    (codecs.BOM_UTF16_BE, "is UTF-16 (it starts with a UTF-16 byte-order mark): save it as UTF-8"),
)


def line_col(buffer: Any, offset: int) -> tuple[int, int]:
    """1-based line and column of byte ``offset``."""
    head = bytes(buffer[:offset])
    return head.count(b"\n") + 1, offset - (head.rfind(b"\n") + 1) + 1


def encoding_problem(buffer: Any) -> str | None:
    """What is wrong with the file's first bytes (a BOM, UTF-16/32), or None; cheap: reads 4 bytes."""
    head = bytes(buffer[:4])
    for bom, problem in _BOMS:
        if head.startswith(bom):
            return problem
    if len(head) >= 2 and b"\x00" in head:  # JSON text starts with ASCII: NULs mean 2- or 4-byte units
        return "is not UTF-8 (it looks like UTF-16 or UTF-32 without a byte-order mark): save it as UTF-8"
    return None


def utf8_problem(buffer: Any) -> str | None:
    """Where ``buffer`` (bytes or an mmap) stops being valid UTF-8, or None; decodes it in chunks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    size = len(buffer)
    for start in range(0, max(size, 1), _CHUNK):
        pending = len(decoder.getstate()[0])  # bytes of a character split across chunks
        try:
            decoder.decode(buffer[start:start + _CHUNK], final=start + _CHUNK >= size)
        except UnicodeDecodeError as exc:
            offset = start - pending + exc.start
            line, col = line_col(buffer, offset)
            return (f"is not valid UTF-8: byte 0x{buffer[offset]:02x} at line {line}, column {col} "
                    f"(byte {offset}; {exc.reason}); save it as UTF-8")
    return None
