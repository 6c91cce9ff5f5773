"""``d2ops diff A B``: what changed from dataset version A to dataset version B.

A and B are dataset version directories, ``s3://bucket/prefix/`` dataset versions, or a run's prefix
``s3://<ArtifactsBucket>/runs/<run id>/`` (its inventory and snapshot: nothing downloaded per image).
S3 is reached through boto3 with the standard ``AWS_ENDPOINT_URL*`` and credential variables.

Exit codes as diff(1): 0 the versions are the same, 1 they differ, 2 trouble (a missing manifest,
unreadable JSON, not a dataset, bad arguments), with one line naming the problem.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from d2ops_core.run_ids import RUN_ID_CHARS

_RUN_PREFIX = re.compile(rf"^(?P<root>.*?)runs/(?P<run_id>{RUN_ID_CHARS})/?$")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("diff", help="compare two dataset versions (directories, s3:// prefixes or runs)",
                              description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("a", metavar="A", help="the older version: directory, s3://bucket/prefix/ or s3://bucket/runs/<id>/")
    p.add_argument("b", metavar="B", help="the newer version")
    p.add_argument("--json", action="store_true", help="print the diff document as JSON")
    p.add_argument("--images", type=int, default=10, metavar="N", help="changed images listed (default 10)")
    p.set_defaults(func=run)


def _index(source: str) -> Any:
    from d2ops_core.dataset_diff import DiffInputError, directory_reader, index_version

    if source.startswith("s3://"):
        bucket, _, prefix = source[len("s3://"):].partition("/")
        if not bucket:
            raise DiffInputError(f"{source!r} has no bucket: use s3://BUCKET/PREFIX/")
        import boto3

        from d2ops_core.dataset_diff_s3 import index_prefix, index_run

        s3 = boto3.client("s3")
        run = _RUN_PREFIX.match(prefix)
        if run and not run["root"]:
            return index_run(s3, bucket, run["run_id"])
        return index_prefix(s3, bucket, prefix)
    if not os.path.exists(source):
        raise DiffInputError(f"{source}: does not exist")
    if not os.path.isdir(source):
        raise DiffInputError(f"{source}: not a directory (a dataset version is a directory with manifest.json)")
    read, fingerprints = directory_reader(source)
    return index_version(source.rstrip("/") + "/", "directory", read, fingerprints)


def run(args: argparse.Namespace) -> int:
    from d2ops_core.dataset_diff import DiffInputError, compare

    try:
        diff = compare(_index(args.a), _index(args.b))
    except DiffInputError as exc:
        print(f"d2ops diff: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"d2ops diff: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # botocore's errors (no credentials, endpoint unreachable, throttled): one line
        if type(exc).__module__.startswith(("botocore", "boto3")):
            print(f"d2ops diff: S3: {exc}", file=sys.stderr)
            return 2
        raise
    if args.json:
        print(diff.model_dump_json(indent=1))
    else:
        print(describe(diff, images=args.images))
    return 0 if diff.same else 1


def describe(diff: Any, *, images: int = 10) -> str:
    """The readable diff: the versions, image counts, a --stat-like table of classes, the top changed images."""
    a, b = diff.a, diff.b
    lines = [f"--- A {a.name}/{a.version} ({a.uri}, {a.source}): {a.images} images, {a.instances} instances",
             f"+++ B {b.name}/{b.version} ({b.uri}, {b.source}): {b.images} images, {b.instances} instances"]
    if diff.same:
        lines.append("same: no image and no annotation differs")
    c = diff.images
    lines.append(f"images: +{c.added} added, -{c.removed} removed, {c.renamed} renamed, {c.content_changed} "
                 f"changed bytes, {c.annotations_changed} relabelled, {c.split_moved} moved train<->val, "
                 f"{c.unchanged} unchanged")
    if c.train_to_val:
        examples = ", ".join(diff.train_to_val_examples)
        lines.append(f"warning: {c.train_to_val} images in A's train are in B's val (a model trained on A would be "
                     f"scored on them; the pipeline's comparison leaves them out): {examples}"
                     + (" ..." if c.train_to_val > len(diff.train_to_val_examples) else ""))
    for f in diff.files:
        lines.append(f"file {f.key}: {f.change}")
    changed = [k for k in diff.classes if k.status != "unchanged"]
    if changed:
        width = max(len(k.name) for k in changed)
        scale = max(max(k.instances_added + k.instances_removed for k in changed), 1)
        lines.append("classes (instances A -> B, per split train | val; +added -removed):")
        for k in changed:
            bar_len = round(40 * (k.instances_added + k.instances_removed) / scale)
            plus = round(bar_len * k.instances_added / max(k.instances_added + k.instances_removed, 1))
            rel = f"{k.relative_shift:+.0%}" if k.relative_shift is not None else "new"
            tr, va = k.splits["train"], k.splits["val"]
            lines.append(f" {k.name:<{width}} | {k.status:<8} {k.instances_a:>6} -> {k.instances_b:<6} ({rel:>5}) "
                         f"train {tr.instances_a}->{tr.instances_b} | val {va.instances_a}->{va.instances_b} "
                         f"{'+' * plus}{'-' * (bar_len - plus)}"
                         + (f" ({k.images_changed} images relabelled)" if k.images_changed else ""))
        unchanged = len(diff.classes) - len(changed)
        if unchanged:
            lines.append(f" ({unchanged} classes unchanged)")
    if diff.changed_images and images > 0:
        more = diff.changed_images_total - min(images, len(diff.changed_images))
        lines.append("changed images (most changed first):")
        for ch in diff.changed_images[:images]:
            name = f"{ch.previous_key} -> {ch.key}" if ch.previous_key else ch.key
            deltas = " ".join(f"{n}{d:+d}" for n, d in sorted(ch.class_deltas.items()))
            split = f" {ch.split_a}->{ch.split_b}" if "split" in ch.changes else ""
            lines.append(f" {','.join(ch.changes):<22} {name}{split}{'  ' + deltas if deltas else ''}")
        if more > 0:
            lines.append(f" ... and {more} more")
    for note in diff.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
