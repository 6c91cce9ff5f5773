"""The val images a comparison may use: those neither model was trained on, by the content of their bytes.

A champion trained on an earlier dataset version, and val files upload what their author chose, so
the same bytes can be a training image of one model and a val image of this run (a derived split
keeps its images' sides across versions, d2ops_core.validation.split; an uploaded val file need
not). Scoring a model on an image it trained on flatters it, so the gate compares both models only
on val images whose SHA-256 is in neither model's ``training_images.txt``
(model_code.artifact.TRAINING_IMAGES_FILE). Content, not file names: a training image uploaded
again under another name is still left out; two val images with the same bytes both stay.

Pure apart from reading the val images' bytes to hash them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from d2ops_core.documents.evaluation import ExcludedImages, ExclusionReason, HeldOutImages
from model_code.dataset_version import image_sha256

Model = Literal["challenger", "champion"]
# The order reasons are tried in: an image both models trained on counts once, under the first.
MODELS: tuple[Model, ...] = ("challenger", "champion")
REASONS: dict[Model, ExclusionReason] = {"challenger": "challenger_trained_on", "champion": "champion_trained_on"}
EXAMPLES = 5


class HeldOut(NamedTuple):
    """``gt`` with only the images no model trained on (and their annotations), and what was left out.

    Unpacks as ``(gt, images)``; ``images`` is the report's HeldOutImages.
    """

    gt: dict[str, Any]
    images: HeldOutImages

    @property
    def compared(self) -> int:
        return self.images.compared

    @property
    def excluded(self) -> list[ExcludedImages]:
        return self.images.excluded

    @property
    def unknown(self) -> list[Model]:
        """The models whose artifact does not list its training images (HeldOutImages.unverified)."""
        return list(self.images.unverified)


def held_out(gt: dict[str, Any], images_dir: Path, trained_on: Mapping[str, frozenset[str] | None]) -> HeldOut:
    """Leave out of ``gt`` (a COCO val document) every image whose bytes a model in ``trained_on`` trained on.

    ``trained_on``: "challenger" and, when there is one, "champion" -> the SHA-256s of its training
    images (LoadedDetector.training_images), or None when its artifact does not list them: nothing
    can be left out for it and it is named in ``unverified``. A model not in the mapping (no
    champion yet) is not a model to hold out from. Raises ValueError for another key, and
    model_code.dataset_version.DatasetError for a val image that cannot be read.
    """
    unknown_keys = sorted(set(trained_on) - set(MODELS))
    if unknown_keys:
        raise ValueError(f"trained_on names {unknown_keys}: only {list(MODELS)} are compared")
    images = [im for im in gt.get("images", []) if isinstance(im, dict)]
    names = [str(im.get("file_name", "")) for im in images]
    lists = {m: trained_on[m] for m in MODELS if m in trained_on}
    known = {m: s for m, s in lists.items() if s is not None}
    sha = image_sha256(images_dir, names) if known else {}
    left_out: dict[Model, list[str]] = {m: [] for m in MODELS}
    dropped: set[Any] = set()
    for image, name in zip(images, names, strict=True):
        for model, hashes in known.items():
            if sha[name] in hashes:
                left_out[model].append(name)
                dropped.add(image.get("id"))
                break
    kept = [im for im in images if im.get("id") not in dropped]
    filtered = {**gt, "images": kept,
                "annotations": [a for a in gt.get("annotations", [])
                                if not (isinstance(a, dict) and a.get("image_id") in dropped)]}
    excluded = [ExcludedImages(reason=REASONS[m], images=len(left_out[m]), examples=sorted(left_out[m])[:EXAMPLES])
                for m in MODELS if left_out[m]]
    report = HeldOutImages(compared=len(kept), excluded=excluded,
                           unverified=[m for m in MODELS if m in lists and lists[m] is None])
    return HeldOut(gt=filtered, images=report)
