"""Checks of the image files the splits reference: present, non-empty, accepted by d2ops_core.images, of declared size.

One rule, one place: :func:`check_image` judges one image file (read pinned, hashed, checked by the
rule, copied into the run's snapshot) for every path that checks images: the local validator, the
validate Lambda's inline fast path and the Distributed Map's batch Lambda (:func:`check_image_batch`).
Their issues are merged into the report in one canonical order (:func:`merge_image_issues`), so the
same bad dataset gives the same codes and locations whichever path checked it.

Each image file is one :class:`ImageItem` (a file named by train and by val is checked once and
answers for both entries).
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import count

from d2ops_core.images import extension_problem, max_pixels
from d2ops_core.validation.coco import ImageRef, loose_name
from d2ops_core.validation.codes import Code, severity
from d2ops_core.validation.errors import ObjectChanged
from d2ops_core.validation.inventory import (
    CheckedImage,
    ImageBatchResult,
    ImageItem,
    ImageLocation,
    InventoryEntry,
    capped,
)
from d2ops_core.validation.report import Issue, IssueLog, printable
from d2ops_core.validation.sources import ImageProbe, Source

# d2ops_core.images.ImageRejected reasons with a code of their own; every other refusal is IMAGE_UNREADABLE.
_REASON_CODES = {"unsupported_format": Code.IMAGE_FORMAT_UNSUPPORTED, "too_large": Code.IMAGE_TOO_LARGE,
                 "bad_shape": Code.IMAGE_SHAPE_UNSUPPORTED, "outside": Code.LINK_OUTSIDE_DATASET,
                 "changed": Code.OBJECT_CHANGED}
_INDEX = re.compile(r"^images\[(\d+)\]")

Add = Callable[[Code, str, "str | None", "str | None"], None]


class ImageItems:
    """The image files to check, one :class:`ImageItem` per file in key order, built as they are iterated.

    Held compactly (a tuple per entry): 118,000 pydantic items took 256 MB; this holds them in about 40.
    """

    def __init__(self, source: Source, grouped: dict[str, list[tuple[str, str, int, int, int]]]) -> None:
        self.source = source
        self.grouped = grouped  # key -> [(file, split, index, width, height)]

    def __len__(self) -> int:
        return len(self.grouped)

    def __iter__(self) -> Iterator[ImageItem]:
        for key in sorted(self.grouped):
            entry = self.source.entry(key)
            locations = [ImageLocation(file=f, split=side, index=i, width=w, height=h)
                         for f, side, i, w, h in self.grouped[key]]
            yield ImageItem(key=key, version_id=entry.version_id, etag=entry.etag, size=entry.size,
                            locations=locations)


def image_items(source: Source, refs: dict[str, list[ImageRef]], files: dict[str, int], images_prefix: str,
                log: IssueLog) -> ImageItems:
    """The present, non-empty image files the splits reference, one item per file, sorted by key.

    Missing and empty files are reported here, from the listing alone (nothing is read).
    ``refs``: annotation file -> its entries; the first file is train, the second val. A derived val
    split's entries are all on the train side here: its split is keyed on the images' content, which
    these checks compute, and puts identical bytes on one side (no overlap to find).
    """
    grouped: dict[str, list[tuple[str, str, int, int, int]]] = {}
    near_names: dict[str, str] | None = None  # built on the first missing image only
    for n, (split_file, split_refs) in enumerate(refs.items()):
        for ref in split_refs:
            key = images_prefix + ref.file_name
            size = files.get(key)
            path = f"images[{ref.index}].file_name"
            if size is None:
                if near_names is None:
                    near_names = {loose_name(k): k for k in files if k.startswith(images_prefix)}
                near = near_names.get(loose_name(key))
                hint = f" ({near} differs only in letter case or Unicode normalization)" if near else ""
                log.add(Code.IMAGE_MISSING, f"{key} was not uploaded{hint}", split_file, path)
            elif size <= 0:
                log.add(Code.IMAGE_UNREADABLE, f"{key} is empty", split_file, path)
            else:
                side = "val" if n > 0 else "train"
                grouped.setdefault(key, []).append((split_file, side, ref.index, ref.width, ref.height))
    return ImageItems(source, grouped)


def judge_image(key: str, probe: ImageProbe, locations: Sequence[ImageLocation], add: Add) -> bool:
    """The rule's verdict on one image file, reported at every entry that names it; True when it has no error."""
    if probe.error is not None:
        code = _REASON_CODES.get(probe.reason or "", Code.IMAGE_UNREADABLE)
        if code is Code.OBJECT_CHANGED:
            add(code, probe.error, key, None)
            return False
        prefix = "cannot decode: " if probe.reason == "corrupt" else ""  # the probe's message names the file
        for loc in locations:
            add(code, f"{prefix}{probe.error}", loc.file, f"images[{loc.index}]")
        return False
    ok = True
    problem = extension_problem(key, probe.format or "")
    for loc in locations:
        if problem:
            add(Code.IMAGE_EXTENSION_MISMATCH, f"{key} {problem}", loc.file, f"images[{loc.index}].file_name")
        if probe.size != (loc.width, loc.height):
            rotated = "" if probe.size == probe.stored_size else " after its EXIF orientation is applied"
            real = probe.size or (0, 0)
            add(Code.IMAGE_SIZE_MISMATCH, f"{key} is {real[0]}x{real[1]}{rotated}, the annotations say "
                f"{loc.width}x{loc.height}", loc.file, f"images[{loc.index}]")
            ok = False
    return ok


def check_image(source: Source, item: ImageItem, *, snapshot: bool) -> tuple[CheckedImage, list[Issue]]:
    """Read ``item`` pinned, judge it by the rule, and (``snapshot``, when it passed) copy it into the run's snapshot.

    The one per-image function of every checking path. Never raises for the file's content or a
    changed object (those are issues); DatasetUnreadable (access denied) propagates.
    """
    issues: list[Issue] = []

    def add(code: Code, message: str, file: str | None, path: str | None) -> None:
        issues.append(capped(Issue(code=code, severity=severity(code), message=printable(message),
                                   file=printable(file) if file else file, path=path)))

    probe = source.probe_image(item.key)
    ok = judge_image(item.key, probe, item.locations, add)
    copied = False
    if ok and snapshot:
        try:
            copied = source.copy_to_snapshot(item.key)
        except ObjectChanged as exc:
            add(Code.OBJECT_CHANGED, str(exc), item.key, None)
    entry = InventoryEntry(key=item.key, version_id=item.version_id, etag=item.etag, size=item.size,
                           sha256=probe.sha256)
    return CheckedImage(entry=entry, decoded=probe.decoded, passed=probe.error is None, copied=copied,
                        locations=item.locations), issues


def check_items(source: Source, items: Iterable[ImageItem], *, snapshot: bool, workers: int = 8,
                progress: Callable[[str], None] | None = None) -> Iterator[tuple[CheckedImage, list[Issue]]]:
    """:func:`check_image` over ``items`` on ``workers`` threads, yielded in item order as they finish.

    At most ``4 * workers`` items are in flight, so checking a million images holds a few dozen results,
    not a million.
    """
    total = len(items) if isinstance(items, Sized) else None
    if progress and total:
        progress(f"checking {total} image files")
    window = max(1, workers) * 4
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        in_flight: deque[Future[tuple[CheckedImage, list[Issue]]]] = deque()
        done = 0

        def next_result() -> tuple[CheckedImage, list[Issue]]:
            nonlocal done
            result = in_flight.popleft().result()
            done += 1
            if progress and done % 5000 == 0:
                progress(f"  {done}/{total or '?'} images checked")
            return result

        for item in items:
            in_flight.append(pool.submit(check_image, source, item, snapshot=snapshot))
            if len(in_flight) >= window:
                yield next_result()
        while in_flight:
            yield next_result()


def check_image_batch(source: Source, items: Sequence[ImageItem], *, snapshot: bool = True,
                      workers: int = 4) -> ImageBatchResult:
    """One Distributed Map batch: every item checked and copied; the result the Map's ResultWriter stores.

    A bad MAX_IMAGE_PIXELS raises PixelLimitError first: the batch fails (and with it the Map), naming the
    variable, instead of every image being refused for it.
    """
    max_pixels()
    checked: list[CheckedImage] = []
    issues: list[Issue] = []
    for image, found in check_items(source, items, snapshot=snapshot, workers=workers):
        checked.append(image)
        issues.extend(found)
    return ImageBatchResult(images=checked, issues=sorted(issues, key=issue_order))


def issue_order(issue: Issue) -> tuple[str, int, str, str]:
    """The canonical order of image issues: by annotation file, then entry index (OBJECT_CHANGED: by key)."""
    match = _INDEX.match(issue.path or "")
    return (issue.file or "", int(match.group(1)) if match else -1, issue.path or "", str(issue.code))


def merge_image_issues(log: IssueLog, issues: Iterable[Issue]) -> None:
    """Add image issues to ``log`` in canonical order, holding at most the log's cap per code at once.

    Every issue is counted; of each code the first ``cap`` in :func:`issue_order` are kept, whatever
    order the batches finished in, so the local validator and the Distributed Map keep the same ones.
    """
    kept: dict[Code, list[tuple[_Last, Issue]]] = {}  # per code: a max-heap (by order) of the smallest
    dropped: dict[Code, int] = {}
    seq = count()
    for issue in issues:
        heap = kept.setdefault(issue.code, [])
        entry = (_Last((*issue_order(issue), next(seq))), issue)
        if len(heap) < log.cap:
            heapq.heappush(heap, entry)
        else:
            heapq.heappushpop(heap, entry)
            dropped[issue.code] = dropped.get(issue.code, 0) + 1
    for _, issue in sorted((e for heap in kept.values() for e in heap), key=lambda e: e[0].order):
        log.add(issue.code, issue.message, issue.file, issue.path)
    for code, n in dropped.items():
        log.counts[code] += n


class _Last:
    """Compares in reverse of ``order``: a min-heap of these pops the issue that sorts last."""

    __slots__ = ("order",)

    def __init__(self, order: tuple[str, int, str, str, int]) -> None:
        self.order = order

    def __lt__(self, other: _Last) -> bool:
        return self.order > other.order


class OverlapIndex:
    """Train/val overlap by content, fed one checked image at a time (the summarize step streams millions).

    Identity is the SHA-256 of the bytes (the key where they were not read): the same name with
    different content is not overlap, different names with the same bytes are. Holds one short
    string per train image and the val images' locations, never the CheckedImage objects.
    """

    def __init__(self) -> None:
        self.train: dict[bytes, str] = {}  # identity -> the first train key with it
        self.val: list[tuple[bytes, str, list[tuple[str, int]]]] = []  # (identity, key, [(file, index)])

    def add(self, image: CheckedImage) -> None:
        # the raw 32-byte digest (a third of its hex): the summarize step holds one per image
        sha = image.entry.sha256
        identity = bytes.fromhex(sha) if sha else f"key:{image.entry.key}".encode()
        if any(loc.split == "train" for loc in image.locations):
            self.train.setdefault(identity, image.entry.key)
        on_val = [(loc.file, loc.index) for loc in image.locations if loc.split == "val"]
        if on_val:
            self.val.append((identity, image.entry.key, on_val))

    def report(self, add: Add) -> None:
        """SPLIT_OVERLAP (an error) at every val entry whose file has the bytes of a train image, in canonical order."""
        found: list[tuple[str, int, str]] = []
        for identity, key, on_val in self.val:
            twin = self.train.get(identity)
            if twin is None:
                continue
            message = (f"{key} is in train too" if twin == key else
                       f"{key} has the same content as train's {twin} (sha256 {identity.hex()[:16]}...)")
            found.extend((file, index, message) for file, index in on_val)
        for file, index, message in sorted(found):
            add(Code.SPLIT_OVERLAP, message, file, f"images[{index}].file_name")
