"""Checks of the image files a split references: present, non-empty, accepted by d2ops_core.images, of declared size."""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from d2ops_core.images import extension_problem
from d2ops_core.validation.coco import ImageRef, loose_name
from d2ops_core.validation.codes import Code
from d2ops_core.validation.report import ImageCheck, IssueLog
from d2ops_core.validation.sources import ImageProbe, Source

SAMPLE_SEED = 0  # the S3 sample is deterministic: a retried run checks the same images
# d2ops_core.images.ImageRejected reasons with a code of their own; every other refusal is IMAGE_UNREADABLE.
_REASON_CODES = {"unsupported_format": Code.IMAGE_FORMAT_UNSUPPORTED, "too_large": Code.IMAGE_TOO_LARGE,
                 "bad_shape": Code.IMAGE_SHAPE_UNSUPPORTED, "outside": Code.LINK_OUTSIDE_DATASET}




def check_image_files(source: Source, refs: dict[str, list[ImageRef]], files: dict[str, int], images_prefix: str,
                      log: IssueLog, *, sample: int | None, workers: int = 8,
                      progress: Callable[[str], None] | None = None) -> ImageCheck:
    """Check the images of every split (``refs``: split file -> its image entries).

    ``sample``: probe at most this many present images (deterministically chosen); None probes
    all of them. Presence and emptiness are checked for every image from the listing.
    """
    present: list[tuple[str, ImageRef]] = []
    referenced = missing = 0
    near_names: dict[str, str] | None = None  # built on the first missing image only
    for split_file, split_refs in refs.items():
        for ref in split_refs:
            referenced += 1
            size = files.get(images_prefix + ref.file_name)
            path = f"images[{ref.index}].file_name"
            if size is None:
                missing += 1
                if near_names is None:
                    near_names = {loose_name(key): key for key in files if key.startswith(images_prefix)}
                near = near_names.get(loose_name(images_prefix + ref.file_name))
                hint = f" ({near} differs only in letter case or Unicode normalization)" if near else ""
                log.add(Code.IMAGE_MISSING, f"{images_prefix}{ref.file_name} was not uploaded{hint}", split_file, path)
            elif size <= 0:
                log.add(Code.IMAGE_UNREADABLE, f"{images_prefix}{ref.file_name} is empty", split_file, path)
            else:
                present.append((split_file, ref))
    mode = "all"
    if sample is not None and len(present) > sample:
        present = random.Random(SAMPLE_SEED).sample(present, sample)
        mode = "sample" if sample else "skipped"

    def probe(item: tuple[str, ImageRef]) -> ImageProbe:
        return source.probe_image(images_prefix + item[1].file_name)

    probed = decoded = 0
    if progress and present:
        progress(f"checking {len(present)} image files ({mode})")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for n, ((split_file, ref), result) in enumerate(zip(present, pool.map(probe, present), strict=True), 1):
            path = f"images[{ref.index}]"
            if result.error is not None:
                code = _REASON_CODES.get(result.reason or "", Code.IMAGE_UNREADABLE)
                # the probe's message names the file already
                prefix = "cannot decode: " if result.reason == "corrupt" else ""
                log.add(code, f"{prefix}{result.error}", split_file, path)
                continue
            probed += 1
            decoded += result.decoded
            problem = extension_problem(ref.file_name, result.format or "")
            if problem:
                log.add(Code.IMAGE_EXTENSION_MISMATCH, f"{images_prefix}{ref.file_name} {problem}", split_file,
                        f"{path}.file_name")
            if result.size != (ref.width, ref.height):
                rotated = "" if result.size == result.stored_size else " after its EXIF orientation is applied"
                real = result.size or (0, 0)
                log.add(Code.IMAGE_SIZE_MISMATCH, f"{images_prefix}{ref.file_name} is {real[0]}x{real[1]}{rotated}, "
                        f"the annotations say {ref.width}x{ref.height}", split_file, path)
            if progress and n % 5000 == 0:
                progress(f"  {n}/{len(present)} images checked")
    return ImageCheck(mode=mode, referenced=referenced, missing=missing, probed=probed, decoded=decoded)
