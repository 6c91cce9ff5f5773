"""``d2ops synth OUTPUT_DIR``: write a synthetic dataset version of coloured shapes."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("synth", help="write a synthetic COCO dataset version (shapes)")
    p.add_argument("output_dir", metavar="OUTPUT_DIR")
    p.add_argument("--images", type=int, default=60, help="total images, train + val (default 60)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=128, help="image side in pixels (default 128)")
    p.add_argument("--name", default="shapes")
    p.add_argument("--version", default="v1")
    p.add_argument("--brightness", type=float, default=1.0,
                   help="multiply every colour by this (0.5: half as bright; default 1): a shifted stream")
    p.add_argument("--shape-scale", type=float, default=1.0,
                   help="multiply every shape's size by this (0.25-2, default 1): a shifted stream")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d2ops import synth

    try:
        summary = synth.generate(args.output_dir, images=args.images, seed=args.seed, size=args.size,
                                 name=args.name, version=args.version, brightness=args.brightness,
                                 shape_scale=args.shape_scale)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        print(json.dumps({k: str(v) if k == "output_dir" else v for k, v in asdict(summary).items()}))
    else:
        print(f"wrote {args.name}/{args.version} to {summary.output_dir}: "
              f"train {summary.train_images} images / {summary.train_instances} instances, "
              f"val {summary.val_images} images / {summary.val_instances} instances")
    return 0
