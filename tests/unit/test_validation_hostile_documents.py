"""Hostile COCO documents: numbers and nesting Python's json (what training reads the file with) refuses, wherever
they are, reject the file; names that are one file on macOS or Windows are a warning.

msgspec skips the values of keys the validator does not read without converting them, so a
5000-digit integer under ``info`` used to pass validation; pycocotools and the trainers (Python's
json, at most sys.int_info.default_max_str_digits digits) then failed on the accepted file.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from d2ops_core.validation import Code
from d2ops_core.validation.coco import _long_integer, check_split
from d2ops_core.validation.report import IssueLog

LIMIT = sys.int_info.default_max_str_digits


def coco(info: str) -> bytes:
    return ('{"info": ' + info + ', "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 64}], '
            '"annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 20, 20], "area": 400, '
            '"iscrowd": 0}], "categories": [{"id": 1, "name": "c"}]}').encode()


def codes(document: bytes) -> list[tuple[Code, str]]:
    log = IssueLog()
    assert check_split(document, "train", "train.json", log) is not None
    return [(issue.code, issue.message) for issue in log.kept]


def test_a_long_integer_under_an_unread_key_is_out_of_range_with_line_and_column() -> None:
    found = codes(coco('{"year": 2026,\n "seed": -' + "9" * (LIMIT + 1) + "}"))
    assert found == [(Code.NUMBER_OUT_OF_RANGE, f"an integer of {LIMIT + 1} digits at line 2, column 11: Python's "
                      f"json, which pycocotools and training read this file with, refuses integers of more than "
                      f"{LIMIT} digits")]


def test_what_python_reads_is_not_refused() -> None:
    for info in ("9" * LIMIT, '"' + "9" * 3 * LIMIT + '"', "0." + "9" * 3 * LIMIT, "1e" + "9" * 3 * LIMIT,
                 "1E-" + "9" * 3 * LIMIT):
        json.loads(coco(info))
        assert codes(coco(info)) == [], info[:8]


_PARTS = st.tuples(st.sampled_from([1, LIMIT // 2, LIMIT // 2 + 1, LIMIT, LIMIT + 1, 2 * LIMIT + 3]),
                   # escaped quotes and escaped backslashes before a quote: the carried quote parity must hold
                   st.sampled_from(["{}", "-{}", '"{}"', "0.{}", "1e{}", "1E-{}", '"\\"{}"', r'"a\\", {}',
                                    r'"\\\"{}"']))


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(_PARTS, min_size=1, max_size=5), pad=st.integers(0, LIMIT))
def test_the_scan_refuses_exactly_what_python_json_refuses(parts: list[tuple[int, str]], pad: int) -> None:
    document = (" " * pad + "[" + ",".join(form.format("7" * n) for n, form in parts) + "]").encode()
    try:
        json.loads(document)
        refused = False
    except ValueError:
        refused = True
    assert (_long_integer(document) is not None) == refused


def test_many_long_digit_strings_scan_in_about_the_time_json_reads_them() -> None:
    """Each long-digit run inside a string counted the quotes from the file's start: 8 MB of 4,400-digit
    strings under ``info`` took 41 s. As a ratio to json.loads of the same bytes (best of three each),
    so a loaded machine slows both; linear is about 5x, the quadratic scan was over 1000x."""
    text = '"' + "7" * 4400 + '"'
    document = coco("[" + ",".join([text] * (8_000_000 // len(text))) + "]")

    def best(call: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return min(times)

    assert codes(document) == []
    ratio = best(lambda: codes(document)) / best(lambda: json.loads(document))
    assert ratio < 50, ratio


def test_nesting_python_json_could_not_read_from_a_trainer_stack_is_too_deep() -> None:
    """990 levels under ``info`` passed: msgspec stops near the recursion limit counted from the validator's
    stack, Python's json in training from a stack some 50 frames deeper."""
    from d2ops_core.validation.coco import MAX_NESTING

    for levels in (MAX_NESTING - 10, MAX_NESTING + 10, 990):
        log = IssueLog()
        checked = check_split(coco("[" * levels + "]" * levels), "train", "train.json", log)
        assert (checked is None) == (levels > MAX_NESTING), levels
        assert [(i.code, f"deeper than {MAX_NESTING} levels" in i.message) for i in log.kept] == (
            [(Code.JSON_TOO_DEEP, True)] if levels > MAX_NESTING else [])


def test_names_one_file_on_macos_or_windows_are_a_duplicate_file_name_warning() -> None:
    """'café.jpg' in NFC and NFD, or 'A.jpg' and 'a.jpg', are two S3 keys but one file on APFS and NTFS."""
    names = ["caf\u00e9.jpg", "cafe\u0301.jpg", "Shapes/A.jpg", "shapes/a.jpg", "b.jpg"]
    images = [{"id": k + 1, "file_name": n, "width": 64, "height": 64} for k, n in enumerate(names)]
    document = json.dumps({"images": images, "annotations": [
        {"id": k + 1, "image_id": k + 1, "category_id": 1, "bbox": [1, 1, 20, 20], "area": 400, "iscrowd": 0}
        for k in range(len(names))], "categories": [{"id": 1, "name": "c"}]}).encode()
    log = IssueLog()
    check_split(document, "train", "train.json", log)
    assert [(i.code, i.path, "images[0]'s only" in i.message or "images[2]'s only" in i.message)
            for i in log.kept] == [(Code.DUPLICATE_FILE_NAME, "images[1].file_name", True),
                                   (Code.DUPLICATE_FILE_NAME, "images[3].file_name", True)]
