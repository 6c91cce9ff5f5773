"""The dataset diff document: what changed between two dataset versions (``d2ops diff A B``, and each run's
``runs/<run id>/dataset-diff.json`` against the champion's dataset version).

One model per document, imported by the writer (d2ops_core.dataset_diff) and every reader (the CLI, the
prepare Lambda, the status API, the console through the API, the notification). :class:`DatasetDiffSummary`
is the small part that travels in the run's state (``$.plan.dataset_diff``); the full document stays in S3.

Pydantic only: Lambdas import this through the CoreLayer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
SPLITS = ("train", "val")
# Images listed one by one in the document (the most changed first); every change is counted regardless.
CHANGED_IMAGES_SHOWN = 50
# Images moved from A's train to B's val named in the document (all are counted).
TRAIN_TO_VAL_SHOWN = 5
# Classes the state summary names (new, vanished, largest shifts): the state payload stays small.
SUMMARY_CLASSES = 5

ImageChangeKind = Literal["added", "removed", "renamed", "content", "annotations", "split"]
ClassStatus = Literal["unchanged", "changed", "new", "vanished"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VersionSide(_Doc):
    """One of the two versions compared."""

    uri: str = Field(description="where it was read: a directory, s3://bucket/prefix/, or a run's snapshot")
    name: str | None = Field(None, description="the manifest's name")
    version: str | None = Field(None, description="the manifest's version")
    source: str = Field(description="what was read: 'directory', 's3 prefix', 'run snapshot', "
                                    "'dataset prefix (pinned by the run's inventory)', ...")
    run_id: str | None = Field(None, description="the run whose inventory described it, where one did")
    inventory_digest: str | None = None
    images: int = Field(ge=0, description="images the annotation files reference")
    instances: int = Field(ge=0, description="annotations over both splits")
    val_derived: bool = Field(False, description="val was derived from train (the manifest names none)")


class SplitCount(_Doc):
    images_a: int = 0
    images_b: int = 0
    instances_a: int = 0
    instances_b: int = 0


class ClassDiff(_Doc):
    """One class (by name: a renumbered category id is no change) in both versions."""

    name: str
    status: ClassStatus
    splits: dict[str, SplitCount] = Field(description="train and val: images and instances in A and B")
    instances_a: int
    instances_b: int
    instances_delta: int
    relative_shift: float | None = Field(description="instances_delta / instances_a (None: new class)")
    share_a: float = Field(description="the class's fraction of all instances in A")
    share_b: float
    images_added: int = Field(0, description="images carrying the class that are new in B")
    images_removed: int = Field(0, description="images carrying the class that B no longer has")
    images_changed: int = Field(0, description="images in both whose boxes of this class differ")
    instances_added: int = Field(0, description="instances gained, summed per image (new images included)")
    instances_removed: int = Field(0, description="instances lost, summed per image (removed images included)")


class ImageCounts(_Doc):
    a: int = Field(description="images in A")
    b: int = Field(description="images in B")
    added: int = 0
    removed: int = 0
    renamed: int = Field(0, description="same bytes (sha256) under another key: neither added nor removed")
    content_changed: int = Field(0, description="same key, other bytes")
    annotations_changed: int = Field(0, description="the image's boxes or classes differ")
    split_moved: int = Field(0, description="the image changed sides (train <-> val)")
    train_to_val: int = Field(0, description="of split_moved: in A's train and B's val. A's model (the champion) "
                                             "trained on them, so scoring it on B's val would flatter it; the "
                                             "evaluation job leaves them out of the comparison")
    unchanged: int = 0
    not_compared: int = Field(0, description="images in both whose content could not be compared (no checksum)")


class ImageChange(_Doc):
    key: str = Field(description="the image's key in B (in A for a removed one), relative to the version root")
    previous_key: str | None = Field(None, description="its key in A when it was renamed")
    changes: list[ImageChangeKind]
    split_a: str | None = None
    split_b: str | None = None
    instances_a: int = 0
    instances_b: int = 0
    class_deltas: dict[str, int] = Field(default_factory=dict, description="instances B - A per class (non-zero)")


class FileChange(_Doc):
    """A non-image file the run reads (manifest, annotation files)."""

    key: str
    change: Literal["added", "removed", "changed"]


class DatasetDiff(_Doc):
    """``d2ops diff A B --json`` and ``runs/<run id>/dataset-diff.json``."""

    schema_version: int = SCHEMA_VERSION
    a: VersionSide
    b: VersionSide
    same: bool = Field(description="no image and no annotation differs (the manifest's version is expected to: "
                                   "changed files are listed in ``files``)")
    images: ImageCounts
    classes: list[ClassDiff] = Field(description="every class of either version, the largest shift first")
    files: list[FileChange] = Field(default_factory=list)
    changed_images: list[ImageChange] = Field(
        default_factory=list, description=f"at most {CHANGED_IMAGES_SHOWN}, the most changed first")
    changed_images_total: int = 0
    train_to_val_examples: list[str] = Field(
        default_factory=list, description=f"up to {TRAIN_TO_VAL_SHOWN} keys (in B) of the images counted in "
                                          "images.train_to_val, sorted")
    notes: list[str] = Field(default_factory=list, description="what was read instead, what could not be compared")


class ClassShift(_Doc):
    name: str
    instances_a: int
    instances_b: int


class DatasetDiffSummary(_Doc):
    """``$.plan.dataset_diff``: the diff's counts in the run's state; the document is at ``uri``.

    ``error`` set: no diff was computed, and why (a failed diff never fails the run). ``against`` None and
    no error: there is no champion to compare with.
    """

    uri: str | None = None
    champion_run_id: str | None = None
    against: str | None = Field(None, description="the champion's dataset as name/version")
    same: bool | None = None
    images_a: int = 0
    images_b: int = 0
    added: int = 0
    removed: int = 0
    renamed: int = 0
    content_changed: int = 0
    annotations_changed: int = 0
    split_moved: int = 0
    train_to_val: int = Field(0, description="images the champion trained on that this run has in val")
    train_to_val_examples: list[str] = Field(default_factory=list)
    instances_delta: int = 0
    classes_new: list[str] = Field(default_factory=list)
    classes_vanished: list[str] = Field(default_factory=list)
    largest_shifts: list[ClassShift] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    error: str | None = None

    @classmethod
    def of(cls, diff: DatasetDiff, *, uri: str | None = None, champion_run_id: str | None = None) -> DatasetDiffSummary:
        against = f"{diff.a.name}/{diff.a.version}" if diff.a.name else diff.a.uri
        shifted = [c for c in diff.classes if c.instances_delta]
        return cls(uri=uri, champion_run_id=champion_run_id, against=against, same=diff.same,
                   images_a=diff.images.a, images_b=diff.images.b, added=diff.images.added,
                   removed=diff.images.removed, renamed=diff.images.renamed,
                   content_changed=diff.images.content_changed, annotations_changed=diff.images.annotations_changed,
                   split_moved=diff.images.split_moved, train_to_val=diff.images.train_to_val,
                   train_to_val_examples=diff.train_to_val_examples,
                   instances_delta=diff.b.instances - diff.a.instances,
                   classes_new=[c.name for c in diff.classes if c.status == "new"][:SUMMARY_CLASSES],
                   classes_vanished=[c.name for c in diff.classes if c.status == "vanished"][:SUMMARY_CLASSES],
                   largest_shifts=[ClassShift(name=c.name, instances_a=c.instances_a, instances_b=c.instances_b)
                                   for c in shifted[:SUMMARY_CLASSES]],
                   notes=diff.notes[:3])

    def warning(self) -> str | None:
        """A warning when images the champion trained on are in this run's val (None otherwise)."""
        if not self.train_to_val:
            return None
        examples = ", ".join(self.train_to_val_examples[:3])
        return (f"{self.train_to_val} val image(s) of this run are in the champion's training split ({self.against})"
                + (f", e.g. {examples}" if examples else "") + ": the comparison leaves them out")

    def line(self) -> str:
        """One line: ``d2ops status``, the notification, the console's heading."""
        if self.error:
            return f"data diff not computed: {self.error}"
        if self.against is None:
            return "no champion: nothing to compare the data with"
        if self.same:
            return f"same data as the champion's ({self.against})"
        parts = [f"+{self.added} -{self.removed} images"]
        for count, what in ((self.renamed, "renamed"), (self.content_changed, "changed bytes"),
                            (self.annotations_changed, "relabelled"), (self.split_moved, "moved train<->val"),
                            (self.train_to_val, "of them from the champion's train to val")):
            if count:
                parts.append(f"{count} {what}")
        parts.append(f"instances {self.instances_delta:+d}")
        if self.classes_new:
            parts.append("new classes " + ", ".join(self.classes_new))
        if self.classes_vanished:
            parts.append("vanished classes " + ", ".join(self.classes_vanished))
        return f"vs champion's {self.against}: " + "; ".join(parts)
