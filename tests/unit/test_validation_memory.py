"""The validator's memory bound (1.5 GB whatever the images and documents), measured in a subprocess.

The tests run the cheap worst case that used to cost 2.7 GB: eight 9400x9400 PNGs (a dataset
of well under 2 MB whose images decode to 265 MB each); and a 100 MB annotation file, whose
check must not grow the process by more than a window's worth of memory (the bounded reader).
``python -m tests.unit.test_validation_memory`` measures every hostile case recorded in
docs/security.md (peak RSS of a fresh process running ``validate_local``), including the slower
ones: PNGs right at the 36-megapixel limit, which are decoded, deep nesting, huge numbers and NaN
in a large file.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from d2ops import synth
from d2ops.bench.cocogen import write_coco_like

BOUND_MB = 1536
# Peak growth allowed while check_split reads a memory-mapped annotation file, whatever its size:
# a few 4 MB windows, their decoded annotations, per-image state (measured: 35 MB for 100 MB).
SPLIT_GROWTH_MB = 64
REPO = Path(__file__).resolve().parents[2]
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child forked from a big test
# process would report the parent's size.
_CHILD = """
import json, re, sys, time
from d2ops_core.validation import validate_local
started = time.perf_counter()
report = validate_local(sys.argv[1])
peak_kb = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps({"peak_mb": peak_kb / 1024, "seconds": round(time.perf_counter() - started, 2),
                  "issue_counts": report.issue_counts}))
"""


_SPLIT_CHILD = """
import json, mmap, re, sys
from d2ops_core.validation.coco import check_split
from d2ops_core.validation.report import IssueLog

def peak_mb():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) / 1024

with open(sys.argv[1], "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
    before = peak_mb()
    log = IssueLog()
    result = check_split(mm, "train", "annotations/train.json", log)
    growth = peak_mb() - before
    print(json.dumps({"growth_mb": growth, "instances": result.stats.instances, "errors": log.error_count}))
    del result
"""


def measure_split(annotation_file: Path) -> dict[str, Any]:
    """check_split of a memory-mapped file in a fresh interpreter: how much its peak RSS grew (MB).

    VmHWM counts the map's resident file pages too (the conservative figure for a Lambda, see
    docs/benchmarks.md): reading the whole file costs its size even when nothing is decoded.
    """
    proc = subprocess.run([sys.executable, "-c", _SPLIT_CHILD, str(annotation_file)], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={"PYTHONPATH": f"{REPO / 'src'}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def measure(dataset: Path) -> dict[str, Any]:
    """Validate ``dataset`` in a fresh interpreter; its peak RSS (MB), wall time and issue counts."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(dataset)], capture_output=True, text=True,
                          timeout=900, cwd=REPO, env={"PYTHONPATH": f"{REPO / 'src'}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _base(root: Path, images: int = 8) -> Path:
    synth.generate(root, images=images, seed=1, size=32)
    return root


def _replace_images(root: Path, png: bytes) -> None:
    """Every image file of the dataset becomes a copy of one PNG."""
    for path in sorted((root / "images").rglob("*.jpg")):
        path.write_bytes(png)


def _black_png(width: int, height: int, mode: str = "RGB") -> bytes:
    """A valid, fully decodable black PNG, compressed row by row (no bitmap of the whole image in memory)."""
    channels, color_type = {"RGB": (3, 2), "RGBA": (4, 6)}[mode]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    row = b"\x00" * (1 + width * channels)  # filter byte "none" + the pixels
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def huge_pngs(root: Path) -> Path:
    """Eight 9400x9400 PNGs (88 megapixels each, 265 MB decoded as RGB), declared 32x32."""
    _replace_images(_base(root), _black_png(9400, 9400))
    return root


def pngs_at_the_limit(root: Path) -> Path:
    """Eight 6000x6000 RGBA PNGs: exactly 36 megapixels, so they are decoded (144 MB each)."""
    _replace_images(_base(root), _black_png(6000, 6000, "RGBA"))
    return root


def deep_nesting(root: Path) -> Path:
    """100,000 levels of arrays (200 KB) under a key the validator does not read."""
    _base(root)
    path = root / "annotations/train.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(doc)[:-1] + ', "info": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return root


def huge_numbers(root: Path) -> Path:
    """Every bbox holds a 400-digit integer, and one width a 5000-digit integer (the slow patch path)."""
    _base(root)
    path = root / "annotations/train.json"
    doc = json.loads(path.read_text())
    for ann in doc["annotations"]:
        ann["bbox"][2] = 123456.789
    doc["images"][0]["width"] = 987654.321
    text = json.dumps(doc).replace("123456.789", "1" * 400).replace("987654.321", "9" * 5000)
    path.write_text(text)
    return root


def nan_in_a_large_file(root: Path, annotations: int = 400_000) -> Path:
    """A train.json of about 160 MB (polygons) with one NaN: it must stay on the fast decoder."""
    _base(root)
    path = root / "annotations/train.json"
    doc = json.loads(path.read_text())
    template = doc["annotations"][0]
    image_ids = [im["id"] for im in doc["images"]]
    doc["annotations"] = [dict(template, id=i, image_id=image_ids[i % len(image_ids)],
                               segmentation=[[1.5, 2.5, 9.5, 2.5, 9.5, 9.5, 1.5, 9.5] * 4])
                          for i in range(annotations)]
    doc["annotations"][annotations // 2]["bbox"] = [1.0, float("nan"), 3.0, 4.0]
    path.write_text(json.dumps(doc))
    return root


CASES: dict[str, Callable[[Path], Path]] = {
    "eight 9400x9400 PNGs": huge_pngs,
    "eight 6000x6000 RGBA PNGs (at the limit, decoded)": pngs_at_the_limit,
    "100k-deep nesting under an unknown key": deep_nesting,
    "400- and 5000-digit integers": huge_numbers,
    "one NaN in a 160 MB train.json": nan_in_a_large_file,
}


def test_the_generated_png_is_a_real_image() -> None:
    import io

    from PIL import Image
    with Image.open(io.BytesIO(_black_png(300, 200, "RGBA"))) as image:
        image.load()
        assert image.size == (300, 200) and image.mode == "RGBA" and image.getextrema()[0] == (0, 0)


def test_huge_pngs_are_refused_from_their_header_within_the_bound(tmp_path: Path) -> None:
    dataset = huge_pngs(tmp_path / "ds")
    size = sum(p.stat().st_size for p in dataset.rglob("*") if p.is_file())
    assert size < 3_000_000, f"the hostile dataset should be small ({size} bytes)"
    result = measure(dataset)
    assert result["issue_counts"].get("IMAGE_TOO_LARGE") == 8, result
    # 2.7 GB before the size check came first; now no pixel is decoded (about 40 MB here).
    assert result["peak_mb"] < BOUND_MB, result


def test_a_large_annotation_file_is_checked_in_bounded_memory(tmp_path: Path) -> None:
    """200,000 annotations of 2,000 images (100 MB): the peak grows by a window's worth, not the file's size.

    Catches a return to whole-file decoding (the decoded document: +188 MB here, +980 MB at
    train2017 scale) and a reader that no longer drops the pages it has passed (the mapped file
    stays resident: +100 MB).
    """
    path = write_coco_like(tmp_path / "train.json", images=2000, instances=200_000, seed=3)
    size_mb = path.stat().st_size / 1e6
    assert size_mb > 90
    result = measure_split(path)
    assert result["instances"] == 200_000 and result["errors"] == 0, result
    assert result["growth_mb"] < SPLIT_GROWTH_MB, (result, f"file {size_mb:.0f} MB")


if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            dataset = CASES[name](Path(tmp) / "ds")
            size = sum(p.stat().st_size for p in dataset.rglob("*") if p.is_file())
            result = measure(dataset)
            codes = ", ".join(f"{k} x{v}" for k, v in sorted(result["issue_counts"].items()))
            print(f"{name}: dataset {size / 1e6:.1f} MB, peak RSS {result['peak_mb']:.0f} MB, "
                  f"{result['seconds']} s; {codes}", flush=True)
