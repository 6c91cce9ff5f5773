"""``d2ops label select --endpoint NAME --max-images N --out DIR``: which captured images to label next.

Reads the endpoint's data capture (a deployed stack's with ``--stack``, else the offline runtime's in
``--work-dir``), leaves out images already in a dataset version (any run's inventory, by SHA-256) or under an
``--exclude`` directory, ranks the rest by the rule mix in d2ops.labelling.selection and writes the selection
directory (selection.json + images/) that ``d2ops label export`` reads. The directory appears whole or not at
all (written beside it, then renamed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from d2ops.commands import artifacts_bucket
from d2ops.commands.deployed import add_deployed_stack_arguments
from d2ops.commands.errors import UsageError


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (e.g. 2026-05-01T10:00Z)") from exc
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _weight(text: str) -> tuple[str, float]:
    from d2ops.labelling.documents import RANK_TERMS

    term, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if term not in RANK_TERMS or not number >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TERM=WEIGHT with TERM one of {', '.join(RANK_TERMS)} "
                                         "and WEIGHT >= 0")
    return term, number


def register(subparsers: argparse._SubParsersAction) -> None:
    from d2ops.labelling.selection import DEFAULT_DUPLICATE_DISTANCE, DEFAULT_MARGIN, DEFAULT_WEIGHTS

    p = subparsers.add_parser("select", help="rank captured images and write the next batch to label",
                              description=__doc__.splitlines()[0] if __doc__ else None)
    add_deployed_stack_arguments(p)
    p.add_argument("--state-dir", dest="work_dir", type=Path, default=argparse.SUPPRESS, help="the same as --work-dir")
    p.add_argument("--endpoint", metavar="NAME", help="the endpoint whose capture to read (default: the stack's)")
    p.add_argument("--variant", metavar="NAME", help="one production variant (default: all)")
    p.add_argument("--since", type=_moment, metavar="TIME", help="capture from (ISO 8601, UTC unless it says)")
    p.add_argument("--until", type=_moment, metavar="TIME", help="capture before (ISO 8601)")
    p.add_argument("--max-images", type=int, required=True, metavar="N", help="the budget: at most N images")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the selection directory (must not exist)")
    p.add_argument("--exclude", type=Path, action="append", default=[], metavar="DIR",
                   help="also leave out every file under DIR by content (labelled images, an earlier selection); "
                        "repeatable")
    p.add_argument("--weak-class", action="append", default=None, metavar="NAME",
                   help="the weak classes (default: from the serving model's evaluation report); repeatable")
    p.add_argument("--compare-with", type=Path, metavar="MODEL",
                   help="a model artifact (directory or model.tar.gz, e.g. the previous champion's) run here on "
                        "every candidate: its disagreement with the captured answer counts")
    p.add_argument("--weight", type=_weight, action="append", default=[], metavar="TERM=W",
                   help="a rule term's weight (defaults: " + ", ".join(f"{k}={v}" for k, v in DEFAULT_WEIGHTS.items())
                        + ")")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"the uncertainty term's width around each class's threshold (default {DEFAULT_MARGIN})")
    p.add_argument("--duplicate-distance", type=float, default=DEFAULT_DUPLICATE_DISTANCE, metavar="D",
                   help="thumbnail distance at or below which two images are near-duplicates (0-2) "
                        f"(default {DEFAULT_DUPLICATE_DISTANCE})")
    p.set_defaults(func=run)


def _other_answers(model: Path, images: list[Any]) -> list[list[Any]]:
    """The ``--compare-with`` model's detections on each image, at its own thresholds, as the endpoint answers."""
    import io

    from d2ops_core.documents.detections import Detection
    from d2ops_core.images import load_rgb
    from model_code.archive import ArtifactError
    from model_code.artifact import load_artifact
    from model_code.inference import image_to_tensor, predict

    try:
        detector = load_artifact(model)
    except (ArtifactError, OSError) as exc:
        raise UsageError(f"--compare-with {model}: {exc}") from exc
    thresholds = detector.metadata.score_thresholds
    names = detector.class_names
    answers = []
    for image in images:
        found = predict(detector, [image_to_tensor(load_rgb(io.BytesIO(image.body)))])[0]
        answer = []
        for box, score, label in zip(found.boxes.tolist(), found.scores.tolist(), found.labels.tolist(), strict=True):
            name = names[int(label)]
            if score >= thresholds.get(name, 0.5):
                answer.append(Detection(box=[float(v) for v in box], score=float(score), class_id=int(label),
                                        class_name=name))
        answers.append(answer)
    return answers


def check_options(args: argparse.Namespace) -> set[str]:
    """The options' problems as a UsageError; the SHA-256s under the ``--exclude`` directories."""
    from d2ops.labelling import capture_source

    if args.max_images < 1 or not 0 < args.margin <= 1 or not 0 <= args.duplicate_distance <= 2:
        raise UsageError("--max-images must be >= 1, --margin in (0, 1], --duplicate-distance in 0-2")
    if args.since and args.until and args.since >= args.until:
        raise UsageError(f"--since {args.since.isoformat()} is not before --until {args.until.isoformat()}")
    if args.out.exists():
        raise UsageError(f"--out {args.out}: already exists (a selection is written once; choose a new directory)")
    excluded: set[str] = set()
    for directory in args.exclude:
        if not directory.is_dir():
            raise UsageError(f"--exclude {directory}: not a directory")
        excluded |= capture_source.local_image_hashes(directory)
    return excluded


def make_selection(s3: Any, bucket: str, endpoint: str, args: argparse.Namespace,
                   excluded_local: set[str]) -> tuple[Any, dict[str, bytes]]:
    """(the LabelSelection, each selected image's bytes by SHA-256) from the capture in ``bucket``."""
    from d2ops.labelling import capture_source
    from d2ops.labelling.documents import (
        LabelSelection,
        SelectedImage,
        SelectionCounts,
        SelectionError,
        SelectionParameters,
        image_file_name,
    )
    from d2ops.labelling.selection import DEFAULT_WEIGHTS, Candidate, box_expectation, rank
    from d2ops_core.champion import read_champion
    from d2ops_core.monitoring_baseline import BaselineError, read_monitoring_baseline

    weights = {**DEFAULT_WEIGHTS, **dict(args.weight)}
    if args.compare_with is None:
        weights["disagreement"] = 0.0  # nothing to disagree with: the term is not part of this selection
    read = capture_source.read_captured_images(s3, bucket, endpoint, since=args.since, until=args.until,
                                               variant=args.variant)
    excluded = capture_source.dataset_image_hashes(s3, bucket) | excluded_local
    champion = read_champion(s3, bucket)
    report = capture_source.read_evaluation_report(s3, champion.evaluation_uri) if champion else None
    weak = sorted(args.weak_class) if args.weak_class is not None else (
        capture_source.weak_classes(report) if report else [])
    fresh = [image for image in read.images if image.sha256 not in excluded]
    others: list[Any] = _other_answers(args.compare_with, fresh) if args.compare_with else [None] * len(fresh)
    candidates = [Candidate(sha256=i.sha256, thumb=i.thumb, detections=i.detections, thresholds=i.thresholds,
                            other=other, payload=i) for i, other in zip(fresh, others, strict=True)]
    try:
        baseline = read_monitoring_baseline(s3, bucket, champion.run_id) if champion else None
    except BaselineError as exc:
        raise SelectionError(str(exc)) from None
    outcome = rank(candidates, max_images=args.max_images, weights=weights, margin=args.margin, weak=weak,
                   duplicate_distance=args.duplicate_distance, expectation=box_expectation(baseline, report))
    # the serving model's classes in label order (its report's); without one, the classes its answers named
    class_names = list(report.class_instances) if report else sorted(
        {d.class_name for i in read.images for d in i.detections})
    selected, bodies = [], {}
    for ranked in outcome.ranked:
        image = ranked.candidate.payload
        assert isinstance(image, capture_source.CapturedImage)
        bodies[image.sha256] = image.body
        selected.append(SelectedImage(
            rank=ranked.rank, sha256=image.sha256, file=image_file_name(image.sha256, image.content_type),
            content_type=image.content_type, width=image.width, height=image.height, source=image.source,
            detections=image.detections, score=ranked.score, reasons=ranked.reasons))
    selection = LabelSelection(
        created_at=datetime.now(UTC), model_run_id=champion.run_id if champion else None, class_names=class_names,
        parameters=SelectionParameters(
            endpoint=endpoint, variant=args.variant, since=args.since, until=args.until, max_images=args.max_images,
            weights=weights, threshold_margin=args.margin, weak_classes=weak,
            duplicate_distance=args.duplicate_distance,
            compare_with=str(args.compare_with) if args.compare_with else None),
        counts=SelectionCounts(records=read.records, unreadable=read.unreadable, duplicates=read.duplicates,
                               excluded=len(read.images) - len(fresh), near_duplicates=outcome.near_duplicates,
                               candidates=len(fresh)),
        problems=read.problems, images=selected)
    return selection, bodies


def write_selection(out: Path, selection: Any, bodies: dict[str, bytes]) -> None:
    """The selection directory, whole or not at all: written beside ``out``, then renamed."""
    from d2ops.labelling.documents import IMAGES_DIR, SELECTION_FILE

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (staging / IMAGES_DIR).mkdir()
        for item in selection.images:
            (staging / item.file).write_bytes(bodies[item.sha256])
        (staging / SELECTION_FILE).write_text(selection.model_dump_json(indent=1), encoding="utf-8")
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def summary_lines(selection: Any, out: Path, shown: int = 10) -> list[str]:
    """What the command prints: the counts, the rule's settings and the first ``shown`` images with why."""
    from d2ops.labelling.documents import SELECTION_FILE

    c, p = selection.counts, selection.parameters
    lines = [f"selected {len(selection.images)} of {c.candidates} candidate images from {c.records} captured records "
             f"of {p.endpoint} ({c.duplicates} repeated, {c.excluded} already in a dataset version or excluded, "
             f"{c.near_duplicates} near-duplicates dropped, {c.unreadable} unreadable) -> {out}",
             f"weak classes: {', '.join(p.weak_classes) or 'none'}; weights: "
             + ", ".join(f"{k}={v:g}" for k, v in p.weights.items())]
    for item in selection.images[:shown]:
        why = "; ".join(f"{r.term} {r.weight:g}x{r.value:.2f} ({r.detail})" for r in item.reasons) or "no rule term"
        lines.append(f"  {item.rank:>3} {item.score:6.3f} {item.sha256[:12]} {item.source.key}:{item.source.line}: "
                     f"{why}")
    if len(selection.images) > shown:
        lines.append(f"  ... {len(selection.images) - shown} more in {out / SELECTION_FILE}")
    return lines


def run(args: argparse.Namespace) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    from d2ops.labelling.documents import SelectionError

    excluded_local = check_options(args)
    where = artifacts_bucket.opened(args)
    bucket = "the artifacts bucket"
    try:
        with where as (s3, bucket, stack_endpoint):
            selection, bodies = make_selection(s3, bucket, args.endpoint or stack_endpoint, args, excluded_local)
    except (ClientError, BotoCoreError) as exc:
        print(f"d2ops label select: error: reading {bucket}: {exc}", file=sys.stderr)
        return 1
    except SelectionError as exc:  # the serving run's report or baseline is not what it should be
        print(f"d2ops label select: error: {exc}", file=sys.stderr)
        return 1
    write_selection(args.out, selection, bodies)
    for problem in selection.problems:
        print(f"skipped {problem}", file=sys.stderr)
    for line in summary_lines(selection, args.out):
        print(line)
    return 0
