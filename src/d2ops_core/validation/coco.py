"""Checks of one COCO instances file (a split), in bounded memory and faster than loading it with pycocotools.

A well-formed file is read by the bounded reader (``_check_bounded``, at the end of this module):
the top-level object key by key, the arrays a window at a time, the mapped file's pages dropped
as it passes them, so memory grows with the number of images, not annotations (train2017: 130 MB
peak where the whole-file decoder below takes 1 GB; docs/benchmarks.md). Anything unusual goes
to the whole-file decoder, whose findings are the reference.

How that decoder stays small and fast on train2017-sized files (450 MB, 860k instances): the file is
decoded straight from a memory map into typed msgspec Structs whose fields are ``Any``
(so a wrong type becomes an issue with its path instead of aborting the decode), while each
``segmentation`` is kept as ``msgspec.Raw`` -- a zero-copy slice of the map. Polygons are
decoded one annotation at a time, checked and dropped, so the millions of coordinates are
never alive together (materialising them is what makes json/pycocotools need 2.5-3.7 GB).

Hostile documents stay on that path too: NaN/Infinity (which Python's json writes but msgspec
rejects) and numbers too large for a float are rewritten, outside strings only, into marker
strings in one copy of the file and decoded again with msgspec (see ``_patch_non_standard``);
integers beyond 64 bits get NUMBER_OUT_OF_RANGE instead of overflowing a float conversion;
nesting deeper than MAX_NESTING levels is JSON_TOO_DEEP. Nothing in a document raises.
"""

from __future__ import annotations

import gc
import math
import mmap
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from d2ops_core.images import MAX_ASPECT_RATIO, MAX_PIXELS_ENV, max_pixels
from d2ops_core.validation.codes import Code
from d2ops_core.validation.encoding import encoding_problem, line_col, utf8_problem
from d2ops_core.validation.manifest import unsafe_relative_path
from d2ops_core.validation.report import BoxSizes, ClassStats, IssueLog, SplitStats, printable

SMALL_AREA, MEDIUM_AREA = 32.0**2, 96.0**2  # COCO's area ranges (APs / APm / APl)


@dataclass(frozen=True)
class Thresholds:
    """Tunable limits of the checks; the defaults are what docs/dataset-format.md documents."""

    bbox_tolerance: float = 1.0  # px a box may extend past the image edge (rounding in exporters)
    area_tolerance: float = 0.01  # relative slack of area over bbox area
    tiny_box_side: float = 4.0  # px: boxes narrower/shorter than this are BOX_TINY
    few_instances: int = 10  # train instances below this make CLASS_FEW_INSTANCES
    imbalance_ratio: float = 100.0  # most/least frequent train class above this make CLASS_IMBALANCE


# Lenient shapes: every field decodes as Any so a wrong type is reported with its path instead of
# failing the whole decode; only the containers (list of objects) are enforced by msgspec.
class _Image(msgspec.Struct, gc=False):
    id: Any = UNSET
    file_name: Any = UNSET
    width: Any = UNSET
    height: Any = UNSET


class _Category(msgspec.Struct, gc=False):
    id: Any = UNSET
    name: Any = UNSET


class _Annotation(msgspec.Struct, gc=False):
    id: Any = UNSET
    image_id: Any = UNSET
    category_id: Any = UNSET
    bbox: Any = UNSET
    area: Any = UNSET
    iscrowd: Any = UNSET
    segmentation: msgspec.Raw = msgspec.Raw()  # empty Raw = key absent


class _Document(msgspec.Struct, gc=False):
    images: list[_Image] | UnsetType = UNSET
    annotations: list[_Annotation] | UnsetType = UNSET
    categories: list[_Category] | UnsetType = UNSET


class _Rle(msgspec.Struct, gc=False):
    size: Any = UNSET
    counts: str | list[int] | UnsetType = UNSET  # typed: checked in C, not element by element


_SEGMENTATION = msgspec.json.Decoder(list[list[float]] | _Rle)
_POLYGONS = msgspec.json.Decoder(list[list[float]])
_NUMBER = frozenset({int, float})
_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NON_STANDARD = (b"NaN", b"Infinity", b"-Infinity")
# Integers must fit what numpy/torch hold (int64) wherever the trainer or evaluator reads them.
_INT64 = 2**63
# Numbers msgspec cannot decode into a value (a float beyond 1.8e308, an integer of thousands of
# digits) and candidates for them: exponents of 3+ digits, digit runs of 300+. Python's re needs
# about 1.5 s per 10 MB for this scan, so it only runs when msgspec has reported such a number;
# NaN and Infinity (what Python's json writes) are found with bytes.find at memory speed.
_NUMBER_CANDIDATE = re.compile(rb"[eE]\+?[0-9]{3,}|[0-9]{300,}")
_NUMBER_CHARS = frozenset(b"0123456789+-.eE")
_MAX_INT_DIGITS = 1000  # longer integer tokens become a marker: they are errors wherever they are
# Markers the patched document holds instead (JSON strings; a NUL cannot be typed by accident).
_MARKS = {"\x00NaN": math.nan, "\x00Infinity": math.inf, "\x00-Infinity": -math.inf}
_GIANT_MARK = "\x00BIG"


# What an integer token of more than _MAX_INT_DIGITS digits decodes to: out of range wherever it is.
_GIANT = 10**_MAX_INT_DIGITS
# Python's json (pycocotools, the trainers) refuses integer literals longer than this (sys.int_info).
_PY_INT_DIGITS = sys.int_info.default_max_str_digits
_DIGITS = re.compile(rb"[0-9]*")
_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")


@dataclass(slots=True)  # one per image of the split: 72 bytes each instead of about 200
class ImageRef:
    """An image entry that passed its own checks, for the image-file checks."""

    index: int
    file_name: str
    width: int
    height: int


@dataclass
class SplitResult:
    split: str
    file: str
    images: list[ImageRef] = field(default_factory=list)
    categories: dict[int, str] = field(default_factory=dict)
    category_index: dict[int, int] = field(default_factory=dict)  # category id -> position in ``categories``
    instances: Counter[int] = field(default_factory=Counter)
    stats: SplitStats | None = None


def loose_name(name: str) -> str:
    """``name`` as a person (or a normalising, case-blind file system) tells it apart: NFC, case-folded.

    macOS writes NFD, most tools NFC; macOS and Windows ignore case.
    """
    if name.isascii():
        return name.lower()
    return unicodedata.normalize("NFC", name).casefold()


def _is_int(v: Any) -> bool:
    return type(v) is int  # bool is not an id


def _is_number(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _in_int64(v: int) -> bool:
    return -_INT64 <= v < _INT64


def _show(v: Any, width: int = 40) -> str:
    """A short repr of a document value for messages: safe for huge integers and long arrays."""
    if type(v) is int and v.bit_length() > 128:
        return (f"an integer of more than {_MAX_INT_DIGITS} digits" if abs(v) >= _GIANT
                else f"an integer of {len(str(v))} digits")
    if isinstance(v, list | dict) and len(v) > 16:
        return f"an {'array' if isinstance(v, list) else 'object'} of {len(v)} items"
    try:
        text = repr(v)
    except ValueError:  # a nested integer beyond Python's digit limit
        return f"a {_type_name(v)}"
    return text if len(text) <= width else text[: width - 3] + "..."


@contextmanager
def _gc_paused() -> Iterator[None]:
    # Decoding allocates millions of containers; the cyclic GC would rescan them repeatedly.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# Deepest nesting accepted. COCO needs 6. msgspec and Python's json both count nesting against the
# interpreter's recursion limit (1000), from wherever they are called: a document nested 990 deep
# passed here and then failed json.load in training, called some 50 frames deeper than we are.
MAX_NESTING = 512


def _stack_depth() -> int:
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def _descend(frames: int, call: Callable[[], Any]) -> Any:
    return call() if frames <= 0 else _descend(frames - 1, call)


def _within_nesting(levels: int, call: Callable[[], Any]) -> Any:
    """Run ``call`` with about ``levels`` of the recursion limit left: deeper nesting is a RecursionError.

    msgspec has no depth option; it stops where the interpreter's recursion budget ends, so the
    budget is used up first by plain Python frames (microseconds). On an interpreter that keeps
    C recursion apart from Python frames (3.12+) this tightens nothing and msgspec's own limit holds.
    """
    return _descend(sys.getrecursionlimit() - _stack_depth() - levels, call)


# The decode met a token msgspec cannot read: patch the file and decode again.
_RETRY_TOKENS = "NaN/Infinity"  # found with bytes.find, cheap
_RETRY_NUMBERS = "numbers"  # out-of-range numbers: the regex scan as well


def _decode(buffer: Any, file: str, log: IssueLog) -> _Document | None:
    if len(buffer) == 0:
        log.add(Code.JSON_MALFORMED, "file is empty", file)
        return None
    problem = encoding_problem(buffer)
    if problem:
        log.add(Code.JSON_MALFORMED, f"file {problem}", file)
        return None
    # NaN/Infinity or an overflowing number: rewrite those tokens (outside strings) into marker strings
    # in one copy and stay on msgspec; Python's json would need 2x the memory and 3x the time.
    result = _decode_once(buffer, buffer, [], file, log, retry={_RETRY_TOKENS, _RETRY_NUMBERS})
    numbers = False
    while result in (_RETRY_TOKENS, _RETRY_NUMBERS):
        numbers = numbers or result == _RETRY_NUMBERS
        patched, shifts = _patch_non_standard(buffer, numbers=numbers)
        result = _decode_once(patched, buffer, shifts, file, log, retry=set() if numbers else {_RETRY_NUMBERS})
    return result if isinstance(result, _Document) else None


def _decode_once(data: Any, original: Any, shifts: list[tuple[int, int]], file: str, log: IssueLog, *,
                 retry: set[str]) -> object:
    """msgspec-decode ``data``: the document, None (the problem is logged) or a _RETRY_* in ``retry``."""
    try:
        with _gc_paused():
            return _within_nesting(MAX_NESTING, lambda: msgspec.json.decode(data, type=_Document))
    except UnicodeDecodeError:  # msgspec's offset is inside one string; find the byte in the file
        log.add(Code.JSON_MALFORMED, f"file {utf8_problem(original) or 'is not valid UTF-8'}", file)
    except RecursionError:
        log.add(Code.JSON_TOO_DEEP, f"arrays/objects nest deeper than {MAX_NESTING} levels (a "
                "COCO document needs 6); the file was not checked further", file)
    except msgspec.ValidationError as exc:
        if "out of range" not in str(exc):
            _report_structure(exc, file, log)
        elif _RETRY_NUMBERS in retry:  # e.g. 1e999, which Python's json reads as inf, or 5000 digits
            return _RETRY_NUMBERS
        else:
            match = _AT_PATH.search(str(exc))
            path = match.group("path").lstrip(".") if match else None
            log.add(Code.NUMBER_OUT_OF_RANGE, "a number is too large to decode; the rest of this file was not "
                    "checked", file, path or None)
    except msgspec.DecodeError as exc:
        match = re.search(r"\(byte (\d+)\)", str(exc))
        offset = _original_offset(int(match.group(1)), shifts) if match else -1
        if _RETRY_TOKENS in retry and offset >= 0 and bytes(original[offset:offset + 9]).startswith(_NON_STANDARD):
            return _RETRY_TOKENS
        if "truncated" in str(exc):
            log.add(Code.JSON_MALFORMED, f"not valid JSON: the file ends in the middle of the document after "
                    f"{len(original)} bytes (an incomplete upload or copy?)", file)
        else:
            where = "at line {}, column {} ".format(*line_col(original, offset)) if offset >= 0 else ""
            log.add(Code.JSON_MALFORMED, f"not valid JSON {where}({exc})", file)
    return None


def _digits_end(buffer: Any, pos: int, endpos: int) -> int:
    """Where the digits from ``pos`` on stop (at most ``endpos``)."""
    match = _DIGITS.match(buffer, pos, endpos)
    return pos if match is None else match.end()


def _run_start(buffer: Any, pos: int) -> int:
    """Where the run of digits that ``pos`` is in starts (searched backwards in C-speed chunks)."""
    while pos > 0:
        chunk = bytes(buffer[max(0, pos - 65536):pos])
        kept = len(chunk.rstrip(b"0123456789"))
        if kept:
            return pos - len(chunk) + kept
        pos -= len(chunk)
    return 0


def _long_integer(buffer: Any, limit: int = _PY_INT_DIGITS) -> tuple[int, int] | None:
    """(offset, digits) of the first integer literal outside strings longer than ``limit`` digits, or None.

    msgspec skips the values of keys the validator does not read without converting them, so a
    5000-digit integer under ``info`` passed, and then Python's json (pycocotools, training, the
    derived val split) refused the file. Any run of more than ``limit`` digits covers two bytes
    ``limit // 2`` apart, so only every (limit // 2)-th byte is looked at first (a strided copy of
    1/2150 of the file): about 0.1 s on a 450 MB file, where a regex over every byte takes 25 s.
    Whether a run is inside a string is the parity of the quotes before it, carried from one
    candidate to the next: counting from the file's start each time was quadratic (an 8 MB file
    of 4,400-digit strings took 41 s).
    """
    step = limit // 2
    size = len(buffer)
    if size <= limit or step < 1:
        return None
    samples = _strided(buffer, step).translate(_TO_ZERO)
    # Quote parity of buffer[:scanned]. ``scanned`` is 0 or the first digit of an earlier run, so a
    # run of backslashes before a quote never crosses it and _quotes sees every escape whole.
    scanned = parity = dropped = 0
    k = samples.find(b"00")
    while k >= 0:
        at = k * step
        if at - dropped > WINDOW:  # digits are everywhere in a COCO file: most pages get looked at
            release_pages(buffer, dropped, at - step)
            dropped = at - step
        end = _digits_end(buffer, at, size)
        # longer than ``limit`` only when the ``limit + 1`` bytes before the run's end are all digits
        if end - at > limit or (end - at > step and end > limit and _digits_end(buffer, end - limit - 1, at) == at):
            start = _run_start(buffer, min(at, end - limit - 1))
            before = buffer[start - 1] if start > 0 else 0x20
            after = buffer[end] if end < size else 0x20
            # a fraction or exponent (float() reads those at any length), or the digits of a string
            is_float = before in b".eE+-" and not (before == 0x2D and (start < 2 or buffer[start - 2] not in b"eE"))
            if end - start > limit and not is_float and after not in b".eE":
                parity ^= _quotes(buffer, scanned, start) % 2
                scanned = start
                if parity == 0:
                    return start, end - start
            k = samples.find(b"00", -(-end // step))  # resume after this run
        else:
            k = samples.find(b"00", k + 1)
    return None


def _strided(buffer: Any, step: int) -> bytes:
    """``buffer[::step]``, read a window at a time so that a memory map's pages are released as it goes."""
    span = step * max(1, WINDOW // step)  # a multiple of ``step``: the pieces join into the strided copy
    parts = []
    for start in range(0, len(buffer), span):
        parts.append(bytes(buffer[start:start + span:step]))
        release_pages(buffer, start, start + span)
    return b"".join(parts)


def _original_offset(offset: int, shifts: list[tuple[int, int]]) -> int:
    """Map an offset in the patched document back to the file (``shifts``: (patched end, total delta) pairs)."""
    delta = 0
    for end, total in shifts:
        if end > offset:
            break
        delta = total
    return max(0, offset - delta)


def _quotes(buffer: Any, start: int, end: int) -> int:
    """Unescaped double quotes in ``buffer[start:end]`` (a quote after an odd run of backslashes is escaped)."""
    segment = bytes(buffer[start:end])
    count = segment.count(b'"')
    at = segment.find(b'\\"')
    while at >= 0:  # backslashes are rare in COCO files: look only where one precedes a quote
        run = 1
        while at - run >= 0 and segment[at - run] == 0x5C:
            run += 1
        count -= run % 2  # an odd run escapes the quote
        at = segment.find(b'\\"', at + 2)
    return count


class _Candidates:
    """The next NaN/Infinity/-Infinity (and, with ``numbers``, number candidate) at or after a position.

    Each kind's next occurrence is cached and searched again only once the cursor passes it, so
    skipping a whole string costs one search per kind, however many candidates the string holds.
    """

    def __init__(self, buffer: Any, numbers: bool) -> None:
        self.buffer = buffer
        self.kinds: list[bytes | re.Pattern[bytes]] = [b"NaN", b"Infinity"]
        if numbers:
            self.kinds.append(_NUMBER_CANDIDATE)
        self.cached: list[tuple[int, int] | None] = [(-1, -1)] * len(self.kinds)  # (start, end); None: no more

    def _search(self, kind: bytes | re.Pattern[bytes], pos: int) -> tuple[int, int] | None:
        if isinstance(kind, bytes):
            at = self.buffer.find(kind, pos)
            return None if at < 0 else (at, at + len(kind))
        match = kind.search(self.buffer, pos)
        return None if match is None else match.span()

    def next(self, pos: int) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        for k, kind in enumerate(self.kinds):
            span = self.cached[k]
            if span is not None and span[0] < pos:
                span = self.cached[k] = self._search(kind, pos)
            if span is not None and (best is None or span[0] < best[0]):
                best = span
        if best is not None and self.buffer[best[0]:best[0] + 8] == b"Infinity" and best[0] > 0 \
                and self.buffer[best[0] - 1] == 0x2D:  # "-Infinity"
            best = (best[0] - 1, best[1])
        return best


def _string_end(buffer: Any, at: int) -> int:
    """The position of the unescaped quote that closes the string ``at`` is in; -1 when it never closes."""
    quote = buffer.find(b'"', at)
    while quote >= 0:
        run = 0
        while quote - run - 1 >= 0 and buffer[quote - run - 1] == 0x5C:
            run += 1
        if run % 2 == 0:
            return int(quote)
        quote = buffer.find(b'"', quote + 1)
    return -1


def _patch_non_standard(buffer: Any, *, numbers: bool) -> tuple[bytearray, list[tuple[int, int]]]:
    """A copy of ``buffer`` with NaN, Infinity (and, with ``numbers``, undecodable numbers) replaced by markers.

    Only tokens outside strings are replaced (quote parity up to each candidate tells; a candidate
    inside a string skips to the string's end), so a file with one NaN costs one search at memory
    speed and one extra copy, not a slow path, and a file of a million "NaN" strings a few seconds.
    """
    out = bytearray()
    view = memoryview(buffer)
    shifts: list[tuple[int, int]] = []
    done = scanned = delta = pos = 0
    candidates = _Candidates(buffer, numbers)
    try:
        while (span := candidates.next(pos)) is not None:
            start, end = span
            if _quotes(buffer, scanned, start) % 2:  # inside a string: resume after it
                close = _string_end(buffer, end)
                if close < 0:
                    break
                pos = scanned = close + 1
                continue
            scanned = pos = start
            token_start, token_end, mark = _classify(buffer, start, end, bytes(buffer[start:end]))
            pos = max(end, token_end)
            if mark is None or token_start < done:
                continue
            out += view[done:token_start]
            out += mark
            delta += len(mark) - (token_end - token_start)
            done = scanned = token_end
            shifts.append((len(out), delta))
        out += view[done:]
    finally:
        view.release()
    return out, shifts


def _classify(buffer: Any, start: int, end: int, text: bytes) -> tuple[int, int, bytes | None]:
    """The whole token around a candidate match and its marker (None: msgspec reads it fine)."""
    if text in _NON_STANDARD:
        return start, end, b'"\\u0000' + text + b'"'
    size = len(buffer)
    while start > 0 and buffer[start - 1] in _NUMBER_CHARS:
        start -= 1
    while end < size and buffer[end] in _NUMBER_CHARS:
        end += 1
    token = bytes(buffer[start:end])
    if any(c in token for c in b".eE"):
        try:
            value = float(token)
        except ValueError:
            return start, end, None
        if math.isinf(value):
            return start, end, b'"\\u0000-Infinity"' if value < 0 else b'"\\u0000Infinity"'
        return start, end, None
    digits = len(token.lstrip(b"+-"))
    return start, end, (b'"\\u0000BIG"' if digits > _MAX_INT_DIGITS else None)


def _unmarked(value: Any) -> Any:
    """The value Python's json would have read where the patched document holds a marker.

    Applied lazily, only on the detailed paths: a marker is a string, so it never passes the hot
    loop's number checks, and the fast path pays nothing for it.
    """
    if type(value) is str and value.startswith("\x00"):
        if value == _GIANT_MARK:
            return _GIANT
        return _MARKS.get(value, value)
    return value


def _report_structure(exc: msgspec.ValidationError, file: str, log: IssueLog) -> None:
    """A container of the wrong shape (e.g. ``images`` an object): one issue, the file is not checked further."""
    text = str(exc)
    match = _AT_PATH.search(text)
    path = match.group("path").lstrip(".") if match else ""
    message = text[: match.start()] if match else text
    log.add(Code.WRONG_TYPE, f"{message}; the rest of this file was not checked", file, path or None)


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(v), type(v).__name__)


class _SplitChecker:
    """Checks one split; each method appends issues to ``log`` and fills ``result``."""

    def __init__(self, split: str, file: str, log: IssueLog, task: str, limits: Thresholds) -> None:
        self.split, self.file, self.log, self.task, self.limits = split, file, log, task, limits
        self.result = SplitResult(split=split, file=file)
        self.image_index: dict[int, int] = {}  # image id -> position in ``images``

    def add(self, code: Code, message: str, path: str | None = None) -> None:
        self.log.add(code, message, self.file, path)

    def field(self, value: Any, path: str, key: str, want: str) -> bool:
        """Report KEY_MISSING / WRONG_TYPE for a required field; True when ``value`` has type ``want``."""
        if value is UNSET:
            self.add(Code.KEY_MISSING, f"required key {key!r} is missing", path)
            return False
        value = _unmarked(value)
        ok = _is_int(value) if want == "integer" else isinstance(value, str)
        if not ok:
            article = "an" if want[0] in "aeiou" else "a"
            self.add(Code.WRONG_TYPE, f"{key} must be {article} {want}, got {_type_name(value)} {_show(value)}",
                     f"{path}.{key}")
        elif want == "integer" and not _in_int64(value):
            self.add(Code.NUMBER_OUT_OF_RANGE, f"{key} is {_show(value)}: it must fit in 64 bits (what the trainer "
                     "and the evaluator hold)", f"{path}.{key}")
            return False
        return ok

    def images(self, images: list[_Image]) -> dict[int, tuple[int, int] | None]:
        sizes: dict[int, tuple[int, int] | None] = {}
        seen_names: dict[str, int] = {}
        seen_loose: dict[str, int] = {}  # loose_name -> first image with it
        limit = max_pixels()  # the operator's MAX_IMAGE_PIXELS, the same limit the image checks apply
        for i, im in enumerate(images):
            path = f"images[{i}]"
            has_id = self.field(im.id, path, "id", "integer")
            has_name = self.field(im.file_name, path, "file_name", "string")
            has_w = self.field(im.width, path, "width", "integer")
            has_h = self.field(im.height, path, "height", "integer")
            if has_id and im.id in sizes:
                self.add(Code.DUPLICATE_IMAGE_ID, f"image id {im.id} is used more than once", f"{path}.id")
                has_id = False
            dims_ok = has_w and has_h and im.width > 0 and im.height > 0
            if has_w and has_h and not dims_ok:
                self.add(Code.IMAGE_DIMENSIONS_INVALID,
                         f"width and height must be positive, got {im.width}x{im.height}", path)
            elif dims_ok and im.width * im.height > limit:
                self.add(Code.IMAGE_TOO_LARGE, f"the annotations say {im.width}x{im.height} "
                         f"({im.width * im.height:,} pixels); the limit is {limit:,} pixels ({MAX_PIXELS_ENV})", path)
                dims_ok = False
            elif dims_ok and max(im.width, im.height) > MAX_ASPECT_RATIO * min(im.width, im.height):
                self.add(Code.IMAGE_SHAPE_UNSUPPORTED, f"the annotations say {im.width}x{im.height}: the longer side "
                         f"may be at most {MAX_ASPECT_RATIO} times the shorter", path)
                dims_ok = False
            if has_id:
                sizes[im.id] = (im.width, im.height) if dims_ok else None
                self.image_index[im.id] = i
            if has_name:
                problem = unsafe_relative_path(im.file_name)
                if problem:
                    self.add(Code.FILE_NAME_UNSAFE, f"file_name {_show(im.file_name, 80)} {problem}",
                             f"{path}.file_name")
                    continue
                if im.file_name in seen_names:
                    self.log.add(Code.DUPLICATE_FILE_NAME, f"file_name {im.file_name!r} is also images"
                                 f"[{seen_names[im.file_name]}]", self.file, f"{path}.file_name")
                else:
                    seen_names[im.file_name] = i
                    loose = loose_name(im.file_name)
                    twin = seen_loose.setdefault(loose, i)
                    if twin != i:  # distinct S3 keys, but one file where names are normalised or case-blind
                        self.log.add(Code.DUPLICATE_FILE_NAME, f"file_name {im.file_name!r} differs from images"
                                     f"[{twin}]'s only in letter case or Unicode normalization: macOS and Windows "
                                     "file systems hold them as one file", self.file, f"{path}.file_name")
                    if dims_ok:
                        self.result.images.append(ImageRef(i, im.file_name, im.width, im.height))
        return sizes

    def categories(self, categories: list[_Category]) -> None:
        cats = self.result.categories
        names: dict[str, int] = {}
        for i, c in enumerate(categories):
            path = f"categories[{i}]"
            has_id = self.field(c.id, path, "id", "integer")
            has_name = self.field(c.name, path, "name", "string")
            if has_name and names.setdefault(c.name, i) != i:
                self.add(Code.DUPLICATE_CATEGORY_NAME, f"category name {printable(c.name)!r} is also "
                         f"categories[{names[c.name]}]'s", f"{path}.name")
            if has_id and c.id in cats:
                self.add(Code.DUPLICATE_CATEGORY_ID, f"category id {c.id} is used more than once", f"{path}.id")
            elif has_id:
                cats[c.id] = printable(c.name) if has_name else f"category {c.id}"
                self.result.category_index[c.id] = i

    def annotations(self, annotations: Iterable[Any], sizes: dict[int, tuple[int, int] | None]) -> SplitStats:
        # The hot loop (860k iterations on train2017): a valid annotation takes the inline fast path;
        # only a suspicious one goes through the detailed checks that build messages and paths.
        limits, add, cats = self.limits, self.add, self.result.categories
        tol, tiny, area_slack = limits.bbox_tolerance, limits.tiny_box_side, 1 + limits.area_tolerance
        need_masks = self.task == "instance_segmentation"
        seen = _IdSet()
        seen_add = seen.add
        # per annotated image: a bit per class it holds (bit = the class's position), so what grows
        # with the data is one small int per image, not a set entry per (class, image) pair
        image_classes: dict[int, int] = {}
        class_bit = {c: 1 << k for k, c in enumerate(cats)}
        instances = self.result.instances
        # per class: [small, medium, large, tiny, crowd] as plain ints (pydantic attribute writes are slow)
        class_counts: dict[int, list[int]] = {c: [0, 0, 0, 0, 0] for c in cats}
        isfinite = math.isfinite
        for i, a in enumerate(annotations):
            aid = a.id
            if type(aid) is int and -_INT64 <= aid < _INT64:
                if not seen_add(aid):
                    add(Code.DUPLICATE_ANNOTATION_ID, f"annotation id {aid} is used more than once",
                        f"annotations[{i}].id")
            else:
                self.field(aid, f"annotations[{i}]", "id", "integer")
            image_id = a.image_id
            size = None
            if type(image_id) is int and image_id in sizes:
                size = sizes[image_id]
                if image_id not in image_classes:
                    image_classes[image_id] = 0
            elif type(image_id) is int:
                add(Code.ANNOTATION_IMAGE_UNKNOWN, f"image_id {_show(image_id)} is not an image of this split",
                    f"annotations[{i}].image_id")
                image_id = None
            else:
                self.field(image_id, f"annotations[{i}]", "image_id", "integer")
                image_id = None
            cat = a.category_id
            if type(cat) is not int or cat not in cats:
                if type(cat) is int:
                    add(Code.ANNOTATION_CATEGORY_UNKNOWN, f"category_id {_show(cat)} is not a category of this split",
                        f"annotations[{i}].category_id")
                else:
                    self.field(cat, f"annotations[{i}]", "category_id", "integer")
                cat = None
            crowd = a.iscrowd
            if crowd is UNSET:
                crowd = 0
            elif type(crowd) is not int or (crowd != 0 and crowd != 1):
                add(Code.ISCROWD_INVALID, f"iscrowd must be 0 or 1, got {_show(_unmarked(crowd))}",
                    f"annotations[{i}].iscrowd")
                crowd = 0
            box = a.bbox
            box_area = None
            if type(box) is list and len(box) == 4:
                x, y, w, h = box
                try:  # integers beyond a float's range overflow here: the detailed check names them
                    if (type(x) in _NUMBER and type(y) in _NUMBER and type(w) in _NUMBER and type(h) in _NUMBER
                            and w > 0 and h > 0 and isfinite(x + y + w + h)):
                        box_area = float(w * h)
                        if size is not None and (x < -tol or y < -tol or x + w > size[0] + tol
                                                 or y + h > size[1] + tol):
                            box_area = None  # outside the image: the detailed check reports it
                except OverflowError:
                    box_area = None
            if box_area is None:
                box_area = self._bbox(box, f"annotations[{i}]", size, tol)
            area = a.area
            try:
                area_ok = type(area) in _NUMBER and area >= 0 and isfinite(area)
            except OverflowError:
                area_ok = False
            if area_ok:
                if box_area is not None and area > box_area * area_slack + 1:
                    add(Code.AREA_INCONSISTENT, f"area {area} exceeds the bbox area {box_area:g}",
                        f"annotations[{i}].area")
            else:
                self._area(area, f"annotations[{i}]")
                area = box_area
            seg = a.segmentation
            if not (len(seg) > 0 and self._polygons_fast(seg)):
                self._segmentation(seg, f"annotations[{i}]", size, need_masks)
            if cat is None:
                continue
            instances[cat] += 1
            counts = class_counts[cat]
            if image_id is not None:
                image_classes[image_id] |= class_bit[cat]
            if crowd:
                counts[4] += 1
            if box_area is not None:
                if box[2] < tiny or box[3] < tiny:
                    counts[3] += 1
                    self.log.add(Code.BOX_TINY, f"bbox {box[2]:g}x{box[3]:g} px is smaller than {tiny:g} px",
                                 self.file, f"annotations[{i}].bbox")
                counts[0 if area < SMALL_AREA else 1 if area < MEDIUM_AREA else 2] += 1

        unannotated = 0
        for image_id, index in self.image_index.items():
            if image_id not in image_classes:
                unannotated += 1
                self.log.add(Code.IMAGE_WITHOUT_ANNOTATIONS, f"image id {image_id} has no annotations",
                             self.file, f"images[{index}]")
        class_images = _images_per_class(image_classes.values(), len(cats))
        per_class = [ClassStats(id=c, name=name, images=class_images[k], instances=instances[c],
                                crowd=class_counts[c][4], box_sizes=_box_sizes(class_counts[c]))
                     for k, (c, name) in enumerate(cats.items())]
        totals = [sum(col) for col in zip(*class_counts.values(), strict=True)] if class_counts else [0] * 5
        return SplitStats(
            file=self.file, images=len(sizes), instances=sum(instances.values()), crowd=totals[4],
            categories=len(cats), images_without_annotations=unannotated, box_sizes=_box_sizes(totals),
            per_class=per_class,
        )

    def _area(self, area: Any, path: str) -> None:
        area = _unmarked(area)
        if area is UNSET:
            self.add(Code.KEY_MISSING, "required key 'area' is missing", path)
        elif type(area) not in _NUMBER:
            self.add(Code.WRONG_TYPE, f"area must be a number, got {_type_name(area)}", f"{path}.area")
        elif type(area) is int and not _in_int64(area):
            self.add(Code.NUMBER_OUT_OF_RANGE, f"area is {_show(area)}", f"{path}.area")
        elif area < 0:
            self.add(Code.AREA_NEGATIVE, f"area is negative ({area})", f"{path}.area")
        else:
            self.add(Code.AREA_INCONSISTENT, f"area is not finite ({area})", f"{path}.area")

    @staticmethod
    def _polygons_fast(raw: msgspec.Raw) -> bool:
        """True when ``raw`` is a list of well-formed polygons; anything else takes the detailed path."""
        try:
            seg = _POLYGONS.decode(raw)
        except msgspec.ValidationError:  # an RLE, null, or something malformed
            return False
        return bool(seg) and all(len(p) >= 6 and not len(p) % 2 for p in seg)

    def _bbox(self, box: Any, path: str, size: tuple[int, int] | None, tol: float) -> float | None:
        """Check a bbox; its area when it is usable for statistics, else None."""
        if box is UNSET:
            self.add(Code.KEY_MISSING, "required key 'bbox' is missing", path)
            return None
        if type(box) is list and len(box) == 4:
            box = [_unmarked(v) for v in box]
        if type(box) is not list or len(box) != 4 or not all(_is_number(v) for v in box):
            self.add(Code.BBOX_MALFORMED, f"bbox must be [x, y, width, height] numbers, got {_show(box, 60)}",
                     f"{path}.bbox")
            return None
        x, y, w, h = box
        for k in range(4):
            if type(box[k]) is int and not _in_int64(box[k]):
                self.add(Code.NUMBER_OUT_OF_RANGE, f"bbox value {_show(box[k])} is out of range", f"{path}.bbox[{k}]")
                return None
        for k in range(4):
            if not math.isfinite(box[k]):
                self.add(Code.BBOX_NOT_FINITE, f"bbox value {box[k]} is not finite", f"{path}.bbox[{k}]")
                return None
        if w <= 0 or h <= 0:
            self.add(Code.BBOX_NON_POSITIVE_SIZE, f"bbox width and height must be positive, got {w:g}x{h:g}",
                     f"{path}.bbox[{2 if w <= 0 else 3}]")
            return None
        if size is not None:
            width, height = size
            if x < -tol or y < -tol or x + w > width + tol or y + h > height + tol:
                self.add(Code.BBOX_OUTSIDE_IMAGE, f"bbox [{x:g}, {y:g}, {w:g}, {h:g}] lies outside the "
                         f"{width}x{height} image (tolerance {tol:g} px)", f"{path}.bbox")
        return float(w * h)

    def _segmentation(self, raw: msgspec.Raw, path: str, size: tuple[int, int] | None, need_masks: bool) -> None:
        if len(raw) == 0 or raw == b"null" or raw == b"[]":
            if need_masks:
                self.add(Code.SEGMENTATION_MISSING, "task is instance_segmentation but there is no segmentation", path)
            return
        try:
            seg = _SEGMENTATION.decode(raw)
        except msgspec.ValidationError as exc:
            self._segmentation_error(exc, path, marked=b"\\u0000" in bytes(raw))
            return
        if isinstance(seg, _Rle):
            self._rle(seg, path, size)
            return
        for k, poly in enumerate(seg):
            n = len(poly)
            if n % 2 or n < 6:
                self.add(Code.POLYGON_MALFORMED, f"polygon has {n} coordinates: it needs an even number, at least 6 "
                         "(3 points)", f"{path}.segmentation[{k}]")
        if not seg and need_masks:
            self.add(Code.SEGMENTATION_MISSING, "task is instance_segmentation but there is no segmentation", path)

    def _segmentation_error(self, exc: msgspec.ValidationError, path: str, *, marked: bool = False) -> None:
        text = str(exc)
        match = _AT_PATH.search(text)
        sub = match.group("path") if match else ""
        message = text[: match.start()] if match else text
        if marked and "got `str`" in message:  # a NaN/Infinity/overflowing number the patched document marked
            message = "a coordinate is NaN, infinite or too large"
        self.add(Code.SEGMENTATION_MALFORMED, f"segmentation must be a list of polygons or an RLE object: {message}",
                 f"{path}.segmentation{sub}")

    def _rle(self, rle: _Rle, path: str, size: tuple[int, int] | None) -> None:
        if rle.size is UNSET or rle.counts is UNSET:
            self.add(Code.SEGMENTATION_MALFORMED, "RLE needs both 'size' and 'counts'", f"{path}.segmentation")
            return
        counts = rle.counts
        if isinstance(counts, list) and counts and min(counts) < 0:
            self.add(Code.SEGMENTATION_MALFORMED, "RLE counts must be a string or a list of non-negative integers",
                     f"{path}.segmentation.counts")
            return
        if type(rle.size) is not list or len(rle.size) != 2 or not all(_is_int(v) for v in rle.size):
            self.add(Code.SEGMENTATION_MALFORMED, f"RLE size must be [height, width], got {_show(rle.size)}",
                     f"{path}.segmentation.size")
            return
        if size is not None and list(rle.size) != [size[1], size[0]]:
            self.add(Code.RLE_SIZE_MISMATCH, f"RLE size {rle.size} is not the image's [height, width] "
                     f"[{size[1]}, {size[0]}]", f"{path}.segmentation.size")
        elif isinstance(counts, list) and sum(counts) != rle.size[0] * rle.size[1]:
            self.add(Code.RLE_SIZE_MISMATCH, f"uncompressed RLE counts sum to {sum(counts)}, not height*width "
                     f"{rle.size[0] * rle.size[1]}", f"{path}.segmentation.counts")


def _images_per_class(masks: Iterable[int], classes: int) -> list[int]:
    """How many of the masks (one per image, a bit per class position) have each bit set."""
    counts = [0] * classes
    for mask in masks:
        while mask:
            low = mask & -mask
            counts[low.bit_length() - 1] += 1
            mask ^= low
    return counts


class _IdSet:
    """A set of int64 ids that costs a bit per id when ids are numbered densely (COCO exports number
    annotations 1..N: 860k ids take 108 KB, where a Python set takes about 60 bytes per id).

    A non-negative id below max(MIN_DENSE, 64 x the ids added so far) is a bit of a bytearray, so
    the bits never outgrow max(2 MB, 16 bytes per id); any other id (negative, or far beyond the
    rest, like train2017's 900100xxxxxx crowd ids) goes to a plain set.
    """

    MIN_DENSE = 1 << 23

    def __init__(self) -> None:
        self.bits = bytearray()
        self.sparse: set[int] = set()
        self.count = 0

    def add(self, value: int) -> bool:
        """Add ``value``; False when it was already there."""
        self.count += 1
        if 0 <= value < max(self.MIN_DENSE, self.count << 6):
            byte, bit = value >> 3, 1 << (value & 7)
            bits = self.bits
            if byte >= len(bits):
                bits.extend(bytes(max(byte + 1, 2 * len(bits)) - len(bits)))
            # the limit grows with the count: an id that came before it did is in ``sparse``
            if bits[byte] & bit or (self.sparse and value in self.sparse):
                return False
            bits[byte] |= bit
            return True
        if value in self.sparse:
            return False
        self.sparse.add(value)
        return True


def _box_sizes(counts: list[int]) -> BoxSizes:
    return BoxSizes(small=counts[0], medium=counts[1], large=counts[2], tiny=counts[3])


def check_split(buffer: Any, split: str, file: str, log: IssueLog, *, task: str = "detection",
                limits: Thresholds | None = None) -> SplitResult | None:
    """Check one COCO instances document held in ``buffer`` (bytes or an mmap).

    Returns what cross-split and image-file checks need, or None when the file could not be
    decoded at all (its issue is in ``log``). A well-formed document is read in bounded memory
    (``_check_bounded``); anything else by the whole-file decoder, whose findings are the reference.
    """
    limits = limits or Thresholds()
    try:
        return _check_bounded(buffer, split, file, log, task, limits)
    except _Fallback:
        pass
    doc = _decode(buffer, file, log)
    if doc is None:
        return None
    checker = _SplitChecker(split, file, log, task, limits)
    annotations: list[Any] = [] if doc.annotations is UNSET else doc.annotations
    total = len(annotations)
    result = _check_decoded(checker, buffer, doc.images, doc.categories, annotations,
                            has_annotations=doc.annotations is not UNSET, count=lambda: total)
    # Raw segmentations point into ``buffer``: drop them before the caller unmaps it.
    del doc, annotations
    return result


def _check_decoded(checker: _SplitChecker, buffer: Any, images: list[_Image] | UnsetType,
                   categories: list[_Category] | UnsetType, annotations: Iterable[_Annotation], *,
                   has_annotations: bool, count: Callable[[], int]) -> SplitResult:
    """The checks of a decoded document (either reader); ``annotations`` may be an iterator, ``count`` says how many."""
    log, split = checker.log, checker.split
    present = {"images": images is not UNSET, "annotations": has_annotations, "categories": categories is not UNSET}
    missing = [k for k, there in present.items() if not there]
    for key in missing:
        checker.add(Code.KEY_MISSING, f"required top-level key {key!r} is missing", None)
    image_list: list[_Image] = [] if images is UNSET else images
    out_of_range = log.counts[Code.NUMBER_OUT_OF_RANGE]
    sizes = checker.images(image_list)
    image_count = len(image_list)
    image_list.clear()  # checked: what is left of each image is in ``sizes`` and ImageRefs
    checker.categories([] if categories is UNSET else categories)
    stats = checker.annotations(annotations, sizes)
    if log.counts[Code.NUMBER_OUT_OF_RANGE] == out_of_range:  # none reported where the checks read: look elsewhere
        long_integer = _long_integer(buffer)
        if long_integer is not None:
            line, col = line_col(buffer, long_integer[0])
            checker.add(Code.NUMBER_OUT_OF_RANGE, f"an integer of {long_integer[1]} digits at line {line}, column "
                        f"{col}: Python's json, which pycocotools and training read this file with, refuses integers "
                        f"of more than {_PY_INT_DIGITS} digits")
    if not missing and (not image_count or not count()):
        checker.add(Code.SPLIT_EMPTY, f"the {split} split has {image_count} images and {count()} annotations")
    checker.result.stats = stats
    return checker.result


# --- The bounded reader ---------------------------------------------------------------------------
# What check_split reads a well-formed document with: the top-level object is walked key by key and
# the ``images``/``annotations``/``categories`` arrays are decoded a window of WINDOW bytes at a time,
# so no structure of the whole file is ever alive and, on a memory map, the file pages already read
# are dropped from the process (MADV_DONTNEED) as the reader moves on. Memory therefore grows with
# the number of images (the checks keep id -> size, file names and ImageRefs, about 0.5 KB per
# image) and with WINDOW, not with the number of annotations or the file's size. Anything unusual
# (malformed JSON, NaN/Infinity, out-of-range numbers, deep nesting, a wrong container type, a
# duplicate top-level key, invalid UTF-8) makes it give up (_Fallback) before a single finding is
# kept, and the whole-file decoder above (_decode) reads the file as it always did, so every finding
# of a hostile document -- code, message, location -- is the one that decoder gives.
WINDOW = 4 << 20
_WS = re.compile(rb"[ \t\n\r]*")
_KEY = msgspec.json.Decoder(str)
_WINDOW_DECODERS = {
    "images": msgspec.json.Decoder(list[_Image]),
    "categories": msgspec.json.Decoder(list[_Category]),
    "annotations": msgspec.json.Decoder(list[msgspec.Raw]),  # first pass: syntax and extent only
}
_ANNOTATIONS = msgspec.json.Decoder(list[_Annotation])
_MAX_MISSES = 8  # failed cuts in one window before giving up (a good cut fails only at a nested '}, {')
# A window decodes elements one level shallower than the document holds them; two levels of margin
# keep the bounded reader stricter than _decode, which decides the cases near MAX_NESTING.
_WINDOW_NESTING = MAX_NESTING - 2


class _Fallback(Exception):
    """The bounded reader met something it leaves to the whole-file decoder (which reports it exactly)."""


def release_pages(buffer: Any, start: int, end: int) -> None:
    """Drop the pages of ``buffer[start:end]`` (whole pages only) from this process's resident set.

    Only for a memory map: its clean file pages go back to the page cache (reclaimable, and not the
    process's RSS); a later read faults them in again. A ``bytes`` buffer is left alone.
    """
    advise = getattr(buffer, "madvise", None)
    if advise is None:
        return
    start = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end -= end % mmap.PAGESIZE
    if end > start:
        advise(mmap.MADV_DONTNEED, start, end - start)


class _Reader:
    """Walks a JSON document in ``buffer`` in windows, releasing what it has passed (see above)."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self.size = len(buffer)
        self.released = 0
        self.end = 0  # where the array last walked by ``elements`` ended (after its ']')

    def ws(self, pos: int) -> int:
        match = _WS.match(self.buffer, pos)
        return pos if match is None else match.end()

    def byte(self, pos: int) -> bytes:
        return bytes(self.buffer[pos:pos + 1])

    def passed(self, pos: int) -> None:
        if pos > self.released:
            release_pages(self.buffer, self.released, pos)
            self.released = pos

    def rewind(self, pos: int) -> None:
        self.released = pos

    def _decode(self, decoder: Any, data: bytes) -> Any:
        try:
            return _within_nesting(_WINDOW_NESTING, lambda: decoder.decode(data))
        except (RecursionError, UnicodeDecodeError) as exc:
            raise _Fallback from exc

    def _boundary(self, close: int) -> bool:
        """True when the '}' at ``close`` is followed by ``, {`` or ``]``: where an element may end."""
        after = self.ws(close + 1)
        following = self.byte(after)
        if following == b",":
            return self.byte(self.ws(after + 1)) == b"{"
        return following == b"]"

    def elements(self, start: int, decoder: Any) -> Iterator[list[Any]]:
        """The elements of the array of objects whose '[' is at ``start``, a window at a time.

        A window is cut after a '}' that may end an element and decoded as ``[`` + window + ``]``;
        the decode succeeds only when the cut is really between two elements (JSON parsing from an
        element's start is deterministic), so a '}' inside a string or a nested object costs one
        failed decode and the previous candidate is tried.
        """
        buf, pos = self.buffer, self.ws(start + 1)
        if self.byte(pos) == b"]":
            self.end = pos + 1
            return
        window = WINDOW
        while True:
            target = min(pos + window, self.size)
            close, misses, items, ended = buf.rfind(b"}", pos, target), 0, None, -1
            while close >= 0 and misses < _MAX_MISSES:
                if self._boundary(close):
                    items, ended = self._cut(decoder, pos, close)
                    if items is not None:
                        break
                    misses += 1
                close = buf.rfind(b"}", pos, close)
            if items is None:
                if target >= self.size or misses >= _MAX_MISSES:
                    raise _Fallback  # malformed, or elements the window's decoder refuses
                window *= 4  # an element larger than the window
                continue
            yield items
            del items
            if ended >= 0:  # the array closed inside the window
                self.end = ended
                self.passed(ended)
                return
            after = self.ws(close + 1)
            self.passed(after)
            if self.byte(after) == b"]":
                self.end = after + 1
                return
            pos, window = self.ws(after + 1), WINDOW  # after the ','

    def _cut(self, decoder: Any, pos: int, close: int) -> tuple[list[Any] | None, int]:
        """The elements from ``pos`` to the '}' at ``close`` (None: not a cut between elements), and
        where the array ends when it closes before ``close`` (-1: it does not)."""
        with memoryview(self.buffer) as view, view[pos:close + 1] as window:
            data = b"".join((b"[", window, b"]"))  # one copy of the window, not two
        try:
            return self._decode(decoder, data), -1
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            match = re.search(r"trailing characters \(byte (\d+)\)", str(exc))
            if match is None:
                return None, -1
        # The array's own ']' closed the window's '[' early: the window ends there. msgspec names the
        # byte after the first one past the value; data[k] is buffer[pos + k - 1].
        head = data[:int(match.group(1)) - 1].rstrip(b" \t\n\r")
        try:
            return self._decode(decoder, head), pos + len(head) - 1
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None, -1

    def value_end(self, pos: int) -> int:
        """Where the JSON value at ``pos`` ends (the position of the ',' or '}' after it)."""
        window = 1 << 16
        while True:
            data = bytes(self.buffer[pos:pos + window])
            try:
                self._decode(_RAW, data)
            except msgspec.DecodeError as exc:
                text = str(exc)
                match = re.search(r"trailing characters \(byte (\d+)\)", text)
                if match:  # msgspec names the byte after the first one past the value
                    end = int(match.group(1)) - 1
                    self._decode(_RAW, data[:end])  # the value alone must decode, or this was no value
                    self.passed(pos + end)
                    return pos + end
                if "truncated" not in text or pos + window >= self.size:
                    raise _Fallback from exc
                window *= 4
                continue
            except msgspec.ValidationError as exc:
                raise _Fallback from exc
            raise _Fallback  # the value runs to the end of the file: no closing '}'


_RAW = msgspec.json.Decoder(msgspec.Raw)
_ARRAYS = ("images", "annotations", "categories")


@dataclass
class _Walked:
    images: list[_Image] | UnsetType = UNSET
    categories: list[_Category] | UnsetType = UNSET
    annotations: int | None = None  # where the annotations array's '[' is


def _walk(reader: _Reader) -> _Walked:
    """The first pass: the top-level object key by key; images and categories decoded, annotations located."""
    walked, seen = _Walked(), set()
    buf = reader.buffer
    pos = reader.ws(0)
    if reader.byte(pos) != b"{":
        raise _Fallback
    pos = reader.ws(pos + 1)
    if reader.byte(pos) == b"}":
        pos += 1
    else:
        while True:
            if reader.byte(pos) != b'"':
                raise _Fallback
            close = _string_end(buf, pos + 1)
            if close < 0:
                raise _Fallback
            raw_key = bytes(buf[pos:close + 1])
            if b"\\" in raw_key:  # an escaped key: whether it names a field is _decode's call
                raise _Fallback
            try:
                key = _KEY.decode(raw_key)
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                raise _Fallback from exc
            if key in seen:  # duplicate keys: _decode's rules (the last one wins) apply
                raise _Fallback
            seen.add(key)
            pos = reader.ws(close + 1)
            if reader.byte(pos) != b":":
                raise _Fallback
            pos = reader.ws(pos + 1)
            if key in _ARRAYS:
                if reader.byte(pos) != b"[":
                    raise _Fallback  # null, an object...: _decode names the wrong type
                decoded: list[Any] = []
                for items in reader.elements(pos, _WINDOW_DECODERS[key]):
                    if key != "annotations":
                        decoded.extend(items)
                if key == "annotations":
                    walked.annotations = pos
                else:
                    setattr(walked, key, decoded)
                pos = reader.end
            else:
                pos = reader.value_end(pos)
            pos = reader.ws(pos)
            following = reader.byte(pos)
            if following == b"}":
                pos += 1
                break
            if following != b",":
                raise _Fallback
            pos = reader.ws(pos + 1)
    if reader.ws(pos) != reader.size:
        raise _Fallback  # trailing characters
    reader.passed(reader.size)
    return walked


def _annotations(reader: _Reader, start: int, counted: list[int]) -> Iterator[_Annotation]:
    """The second pass: the annotations, decoded a window at a time; ``counted[0]`` their number so far."""
    reader.rewind(start)
    for items in reader.elements(start, _ANNOTATIONS):
        counted[0] += len(items)
        yield from items
    reader.passed(reader.size)


def _check_bounded(buffer: Any, split: str, file: str, log: IssueLog, task: str,
                   limits: Thresholds) -> SplitResult:
    """check_split on the bounded reader; raises _Fallback (``log`` untouched) when it gives up."""
    if len(buffer) == 0 or encoding_problem(buffer):
        raise _Fallback
    scratch = IssueLog(log.cap)  # findings are kept only once the whole file has been read
    scratch.counts = Counter(log.counts)
    reader = _Reader(buffer)
    with _gc_paused():
        walked = _walk(reader)
        checker = _SplitChecker(split, file, scratch, task, limits)
        annotations: Iterator[_Annotation] | list[_Annotation] = []
        counted = [0]
        if walked.annotations is not None:
            annotations = _annotations(reader, walked.annotations, counted)
        result = _check_decoded(checker, buffer, walked.images, walked.categories, annotations,
                                has_annotations=walked.annotations is not None, count=lambda: counted[0])
    log.counts = scratch.counts
    log.kept.extend(scratch.kept)
    return result
