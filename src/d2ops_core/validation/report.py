"""The validation report: issues (bounded per code) and per-split, per-class statistics."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field, computed_field

from d2ops_core.validation.codes import Code, Severity, severity
from d2ops_core.validation.manifest import Manifest
from d2ops_core.validation.split import DerivedSplit

REPORT_VERSION = 1
# A broken 800k-annotation file must still make a report of bounded size: keep the first
# issues of each code and count the rest.
MAX_ISSUES_PER_CODE = 100


def printable(text: str) -> str:
    """``text`` encodable as UTF-8: a lone surrogate (JSON allows the escape "\\ud800") becomes its escape.

    A document can put one in any string; without this the report could not be written.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class Issue(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: Code
    severity: Severity
    message: str
    file: str | None = Field(default=None, description="dataset-relative file, e.g. annotations/train.json")
    path: str | None = Field(default=None, description="JSON path inside that file, e.g. annotations[12].bbox[2]")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def location(self) -> str:
        """``file:path``, ``file`` or ``path``: one string for logs and summaries."""
        return ":".join(p for p in (self.file, self.path) if p) or "dataset"


class IssueLog:
    """Collects issues, keeping at most ``cap`` per code but counting all of them."""

    def __init__(self, cap: int = MAX_ISSUES_PER_CODE) -> None:
        self.cap = cap
        self.counts: Counter[Code] = Counter()
        self.kept: list[Issue] = []

    def add(self, code: Code, message: str, file: str | None = None, path: str | None = None) -> None:
        self.counts[code] += 1
        if self.counts[code] <= self.cap:
            self.kept.append(Issue(code=code, severity=severity(code), message=printable(message),
                                   file=printable(file) if file else file, path=printable(path) if path else path))

    @classmethod
    def from_report(cls, report: ValidationReport, cap: int = MAX_ISSUES_PER_CODE) -> IssueLog:
        """The log a stored report was built from (its kept issues and every count), to add more issues to."""
        log = cls(cap)
        log.kept = [*report.errors, *report.warnings]
        log.counts = Counter({Code(code): n for code, n in report.issue_counts.items()})
        return log

    @property
    def error_count(self) -> int:
        return sum(n for c, n in self.counts.items() if severity(c) is Severity.ERROR)

    @property
    def warning_count(self) -> int:
        return sum(n for c, n in self.counts.items() if severity(c) is Severity.WARNING)


class BoxSizes(BaseModel):
    """Instances by COCO area range (of the annotation's ``area``), plus tiny boxes (by bbox side)."""

    small: int = 0  # area < 32²
    medium: int = 0  # 32² <= area < 96²
    large: int = 0  # area >= 96²
    tiny: int = 0  # bbox width or height under the tiny-box threshold


class ClassStats(BaseModel):
    id: int
    name: str
    images: int = 0
    instances: int = 0
    crowd: int = 0
    box_sizes: BoxSizes = Field(default_factory=BoxSizes)


class SplitStats(BaseModel):
    file: str
    images: int = 0
    instances: int = 0
    crowd: int = 0
    categories: int = 0
    images_without_annotations: int = 0
    box_sizes: BoxSizes = Field(default_factory=BoxSizes)
    per_class: list[ClassStats] = Field(default_factory=list)


class ImageCheck(BaseModel):
    mode: str = Field(description="all | pending (the Distributed Map is checking them) | skipped")
    referenced: int = Field(default=0, description="image entries with a safe, unique file_name")
    missing: int = 0
    probed: int = Field(default=0, description="image entries whose file the rule accepted (its size was read)")
    decoded: int = Field(default=0, description="image files fully decoded (every probed image but those over "
                                                 "16 MB in S3 or 25 megapixels, whose size alone is read)")


class DatasetName(BaseModel):
    """The dataset a validation report is about, as far as it could be read (None: the manifest did not say).

    The validate Lambda's summary carries the same object (validate_dataset.models); the run's full
    reference (bucket, prefix, manifest version) is :class:`d2ops_core.dataset_identity.DatasetRef`.
    """

    name: str | None = None
    version: str | None = None


class ValidationReport(BaseModel):
    report_version: int = REPORT_VERSION
    source: str
    valid: bool
    dataset: DatasetName
    manifest: Manifest | None
    error_count: int
    warning_count: int
    issue_counts: dict[str, int] = Field(description="every issue counted, including those beyond the per-code cap")
    issues_truncated: bool = Field(description="true when some codes had more issues than the report keeps")
    errors: list[Issue]
    warnings: list[Issue]
    splits: dict[str, SplitStats]
    derived_split: DerivedSplit | None = Field(
        default=None, description="set when the manifest names no val and none was uploaded: how val was derived")
    derived_split_pending: bool = Field(
        default=False, description="val is to be derived from train but the images were not read yet (the "
                                   "Distributed Map checks them, or --no-images): the split is keyed on their content")
    images: ImageCheck
    seconds: float

    @classmethod
    def build(cls, *, source: str, log: IssueLog, manifest: Manifest | None, dataset: DatasetName,
              splits: dict[str, SplitStats], images: ImageCheck, seconds: float,
              derived_split: DerivedSplit | None = None, derived_split_pending: bool = False) -> ValidationReport:
        return cls(
            source=source, valid=log.error_count == 0, dataset=dataset, manifest=manifest,
            error_count=log.error_count, warning_count=log.warning_count,
            issue_counts={str(c): n for c, n in sorted(log.counts.items())},
            issues_truncated=any(n > log.cap for n in log.counts.values()),
            errors=[i for i in log.kept if i.severity is Severity.ERROR],
            warnings=[i for i in log.kept if i.severity is Severity.WARNING],
            splits=splits, derived_split=derived_split, derived_split_pending=derived_split_pending, images=images,
            seconds=round(seconds, 3),
        )

    def has(self, code: Code) -> bool:
        return self.issue_counts.get(str(code), 0) > 0

    def counts(self) -> dict[str, int]:
        """Flat counts for small payloads (Step Functions state, CLI summary)."""
        out: dict[str, int] = {}
        for split, s in self.splits.items():
            out[f"{split}_images"] = s.images
            out[f"{split}_instances"] = s.instances
        out["categories"] = max((s.categories for s in self.splits.values()), default=0)
        return out

    def describe(self, per_code: int = 3) -> str:
        """A readable multi-line summary: counts, statistics, and the first few issues of every code."""
        name = "/".join(p for p in (self.dataset.name, self.dataset.version) if p) or self.source
        verdict = "VALID" if self.valid else "INVALID"
        lines = [f"{verdict} {name}: {self.error_count} errors, {self.warning_count} warnings ({self.source})"]
        for split, s in self.splits.items():
            lines.append(f"  {split}: {s.images} images, {s.instances} instances, {s.categories} categories "
                         f"(boxes small/medium/large {s.box_sizes.small}/{s.box_sizes.medium}/{s.box_sizes.large})")
        if self.derived_split is not None:
            d = self.derived_split
            lines.append(f"  val derived from {d.source} (keyed on {d.keyed_on!r} and each image's content): "
                         f"{d.val_images} val, {d.train_images} train images"
                         + (f"; categories without a val image: {d.unsplit_categories}"
                            if d.unsplit_categories else "")
                         + (f"; categories without a train image: {d.val_only_categories}"
                            if d.val_only_categories else ""))
        elif self.derived_split_pending:
            lines.append("  val to be derived from train once the images are read (the split is keyed on their "
                         "content)")
        lines.append(f"  image files: {self.images.mode}, {self.images.referenced} referenced, "
                     f"{self.images.missing} missing, {self.images.probed} probed, {self.images.decoded} decoded")
        for title, issues in (("errors", self.errors), ("warnings", self.warnings)):
            by_code: dict[Code, list[Issue]] = {}
            for issue in issues:
                by_code.setdefault(issue.code, []).append(issue)
            if by_code:
                lines.append(f"{title}:")
            for code, of_code in by_code.items():
                lines.extend(f"  {i.code} {i.location}: {i.message}" for i in of_code[:per_code])
                more = self.issue_counts.get(str(code), len(of_code)) - min(per_code, len(of_code))
                if more > 0:
                    lines.append(f"  ... {more} more {code} (--json lists up to {MAX_ISSUES_PER_CODE} of each code)")
        return "\n".join(lines)
