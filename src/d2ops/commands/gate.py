"""``d2ops gate``: judge a challenger's COCO detection results against a champion's on one val file, as the
pipeline's quality gate does.

The same code as the pipeline's: the evaluation job's scoring and paired bootstrap
(model_code.evaluation.comparison.evaluation_report) and the summarize step's decision
(d2ops_core.gate_decision.judge). Every image of the annotations file is compared: the caller vouches
that neither model was trained on them (the pipeline checks it by content hash). Defaults are the stack's
(template.yaml).

Exit codes: 0 approve, 1 refuse, 3 review (a person decides), 2 bad input (one line naming the file
and the problem).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from d2ops.commands.errors import UsageError
from d2ops_core import gate as defaults

EXIT_CODES = {"approve": 0, "refuse": 1, "review": 3}
METRICS = ("bbox_AP", "segm_AP")
# Bigger than any val split's results we know of (val2017: ~100 MB with masks); stops a wrong file early.
MAX_FILE_BYTES = 2 * 1024 ** 3


def _fraction(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1]")
    return value


def _confidence(text: str) -> float:
    value = float(text)
    problem = defaults.confidence_problem(value) if math.isfinite(value) else "must be a finite number"
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return value


def _resamples(text: str) -> int:
    value = int(text)
    problem = defaults.resamples_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number from 0 to {2 ** 32 - 1}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gate", help="judge two COCO detection results files on a val file as the quality "
                                           "gate does (exit 0 approve, 1 refuse, 3 review, 2 bad input)",
                              description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--annotations", type=Path, required=True, metavar="VAL_JSON",
                   help="COCO instances file of the held-out val images both models are judged on")
    p.add_argument("--challenger", type=Path, required=True, metavar="RESULTS_JSON",
                   help="the challenger's COCO detection results on those images")
    p.add_argument("--champion", type=Path, metavar="RESULTS_JSON",
                   help="the champion's results; without it the challenger is judged against --min-map alone")
    p.add_argument("--metric", choices=METRICS, default="bbox_AP",
                   help="the primary metric (segm_AP needs every result's segmentation; default bbox_AP)")
    p.add_argument("--min-map", type=_fraction, default=defaults.DEFAULT_MIN_MAP, metavar="X",
                   help=f"the challenger's primary AP must reach this (default {defaults.DEFAULT_MIN_MAP:g})")
    p.add_argument("--max-regression", type=_fraction, default=defaults.DEFAULT_MAX_REGRESSION, metavar="X",
                   help="tolerance on the primary AP below the champion: approve when the interval's lower end is "
                        "at or above -X, refuse when its upper end is below -X, review in between "
                        f"(default {defaults.DEFAULT_MAX_REGRESSION:g})")
    p.add_argument("--max-class-regression", type=_fraction, default=defaults.DEFAULT_MAX_CLASS_REGRESSION,
                   metavar="X", help="per class: a judged class surely worse by more than X refuses; any class "
                                     "whose point AP drops by more than X makes it a review "
                                     f"(default {defaults.DEFAULT_MAX_CLASS_REGRESSION:g})")
    p.add_argument("--min-class-instances", type=_positive, default=defaults.DEFAULT_MIN_CLASS_INSTANCES,
                   metavar="N", help="instances a class needs to be judged on its own interval "
                                     f"(default {defaults.DEFAULT_MIN_CLASS_INSTANCES})")
    p.add_argument("--min-compared-images", type=_positive, default=defaults.DEFAULT_MIN_COMPARED_IMAGES,
                   metavar="N", help="val images needed to approve over a champion "
                                     f"(default {defaults.DEFAULT_MIN_COMPARED_IMAGES})")
    p.add_argument("--confidence", type=_confidence, default=defaults.DEFAULT_CONFIDENCE, metavar="X",
                   help=f"two-sided level of the interval (default {defaults.DEFAULT_CONFIDENCE:g})")
    p.add_argument("--resamples", type=_resamples, default=defaults.DEFAULT_RESAMPLES, metavar="N",
                   help=f"paired-bootstrap resamples (default {defaults.DEFAULT_RESAMPLES})")
    p.add_argument("--seed", type=_seed, default=defaults.DEFAULT_SEED, metavar="N",
                   help=f"the bootstrap's seed (default {defaults.DEFAULT_SEED})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def _read(path: Path, what: str) -> bytes:
    if not path.exists():
        raise UsageError(f"{path}: {what} file does not exist")
    if not path.is_file():
        raise UsageError(f"{path}: {what} is not a file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise UsageError(f"{path}: {what} is {path.stat().st_size} bytes, more than {MAX_FILE_BYTES}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {what} cannot be read ({exc.strerror or exc})") from None


def read_annotations(path: Path, metric: str) -> dict[str, Any]:
    """The val file, checked by the dataset validator's own rules (its first error is the message)."""
    from d2ops_core.validation.coco import check_split
    from d2ops_core.validation.codes import Severity
    from d2ops_core.validation.report import IssueLog

    raw = _read(path, "the annotations")
    log = IssueLog()
    task = "instance_segmentation" if metric == "segm_AP" else "detection"
    if check_split(raw, "val", str(path), log, task=task) is None or log.error_count:
        first = next(i for i in log.kept if i.severity is Severity.ERROR)
        where = f" at {first.path}" if first.path else ""
        raise UsageError(f"{path}: not a COCO instances file the gate can judge on{where}: {first.message} "
                         f"({first.code})")
    document = json.loads(raw)
    if not document.get("images"):
        raise UsageError(f"{path}: has no images to judge on")
    document.setdefault("annotations", [])
    return dict(document)


def read_results(path: Path, gt: dict[str, Any], what: str, metric: str) -> list[dict[str, Any]]:
    from d2ops_core.documents.coco_results import ResultsInvalid, parse_results

    try:
        results = parse_results(_read(path, what), {int(i["id"]) for i in gt["images"]},
                                {int(c["id"]) for c in gt["categories"]})
    except ResultsInvalid as exc:
        raise UsageError(f"{path}: {what} is not a COCO detection results list: {exc}") from None
    if metric == "segm_AP":
        missing = next((i for i, r in enumerate(results) if "segmentation" not in r), None)
        if missing is not None:
            raise UsageError(f"{path}: [{missing}] has no segmentation, which segm_AP needs")
    return results


def judge_files(args: argparse.Namespace) -> Any:
    """(verdict, report) of the files in ``args``, through the pipeline's own code."""
    from d2ops_core.documents.evaluation import GateThresholds
    from d2ops_core.gate import GateSettings
    from d2ops_core.gate_decision import judge
    from model_code.evaluation.comparison import evaluation_report
    from model_code.evaluation.scoring import score_results

    gt = read_annotations(args.annotations, args.metric)
    kinds = ["bbox"] + (["segm"] if args.metric == "segm_AP" else [])
    challenger = score_results(gt, read_results(args.challenger, gt, "the challenger's results", args.metric), kinds)
    champion = (score_results(gt, read_results(args.champion, gt, "the champion's results", args.metric), kinds)
                if args.champion is not None else None)
    settings = GateSettings(confidence=args.confidence, resamples=args.resamples,
                            min_class_instances=args.min_class_instances, seed=args.seed,
                            max_regression=args.max_regression, max_class_regression=args.max_class_regression)
    report = evaluation_report(gt, challenger, champion, args.metric, settings)
    thresholds = GateThresholds(primary_metric=args.metric, min_map=args.min_map, max_regression=args.max_regression,
                                max_class_regression=args.max_class_regression,
                                min_class_instances=args.min_class_instances, confidence=args.confidence,
                                resamples=args.resamples, min_compared_images=args.min_compared_images)
    return judge(report, thresholds), report


def classes_of(verdict: Any, report: Any) -> dict[str, dict[str, Any]]:
    """Every class with ground truth: its APs, and with a champion its difference and what the gate made of it."""
    comparison = report.comparison
    if comparison is None:
        return {name: {"challenger": scores.get(verdict.primary_metric), "instances": report.class_instances[name]}
                for name, scores in report.challenger.per_class.items() if report.class_instances.get(name)}
    regressed = {r.class_name for r in verdict.class_regressions}
    dropped = {d.class_name for d in verdict.class_drops}
    out = {}
    for name, c in comparison.classes.items():
        interval = comparison.per_class.get(name)
        out[name] = {"challenger": c.challenger, "champion": c.champion, "difference": c.difference,
                     "instances": c.instances, "images": c.images, "judged": interval is not None,
                     "interval": [interval.low, interval.high] if interval else None,
                     "confidence": interval.confidence if interval else None,
                     "surely_worse": name in regressed, "dropped": name in dropped}
    return out


def as_json(verdict: Any, report: Any) -> dict[str, Any]:
    interval = verdict.interval
    return {"decision": verdict.decision, "reason": verdict.gate_reason, "metric": verdict.primary_metric,
            "challenger": verdict.challenger_value, "champion": verdict.champion_value,
            "difference": interval.difference if interval else None,
            "interval": [interval.low, interval.high] if interval else None,
            "interval_mc_error": [interval.low_mc_error, interval.high_mc_error] if interval else None,
            "confidence": interval.confidence if interval else None,
            "refused_by": verdict.refused_by, "review_because": verdict.review_because,
            "images_compared": verdict.images_compared, "val_images": verdict.val_images,
            "resamples": verdict.resamples, "classes": classes_of(verdict, report),
            "verdict": verdict.model_dump(mode="json")}


def text_lines(verdict: Any, report: Any) -> list[str]:
    lines = [f"quality gate: {verdict.decision.upper()}", f"  {verdict.gate_reason}"]
    interval = verdict.interval
    if interval is not None:
        lines.append(f"  {verdict.primary_metric} challenger {interval.challenger:.4f}, champion "
                     f"{interval.champion:.4f}: difference {interval.difference:+.4f}, {interval.confidence:.0%} "
                     f"interval [{interval.low:+.4f}, {interval.high:+.4f}] (Monte-Carlo error of each end "
                     f"\u00b1{interval.low_mc_error or 0:.4f} / \u00b1{interval.high_mc_error or 0:.4f}), "
                     f"{verdict.images_compared} val images, {verdict.resamples} resamples")
    classes = classes_of(verdict, report)
    if classes:
        lines.append("  classes (challenger vs champion; instances on images):" if verdict.has_champion
                     else "  classes (challenger AP; instances):")
    width = max((len(n) for n in classes), default=0)
    for name, c in classes.items():
        if "champion" not in c:
            lines.append(f"    {name:<{width}}  {c['challenger']:.3f}  ({c['instances']} instances)")
            continue
        notes = []
        if c["judged"]:
            notes.append(f"interval [{c['interval'][0]:+.3f}, {c['interval'][1]:+.3f}] at {c['confidence']:.4g}")
        if c["surely_worse"]:
            notes.append("surely worse: refused")
        if c["dropped"]:
            notes.append(f"drops by more than {verdict.max_class_regression:g}: review")
        lines.append(f"    {name:<{width}}  {c['challenger']:.3f} vs {c['champion']:.3f}  {c['difference']:+.3f}  "
                     f"{c['instances']} on {c['images']}" + (f"  {'; '.join(notes)}" if notes else ""))
    return lines


def run(args: argparse.Namespace) -> int:
    verdict, report = judge_files(args)
    if args.json:
        print(json.dumps(as_json(verdict, report)))
    else:
        for line in text_lines(verdict, report):
            print(line)
    sys.stdout.flush()
    return EXIT_CODES[verdict.decision]
