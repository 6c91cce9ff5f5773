"""Every error and warning code the validator can emit: the one home for codes and meanings.

Codes are part of the report's contract (people grep for them, dashboards count them), so
they never change meaning; new checks get new codes. docs/dataset-format.md lists each one
and a unit test keeps that list complete.
"""

from __future__ import annotations

from enum import StrEnum


class Severity(StrEnum):
    ERROR = "error"  # rejects the dataset
    WARNING = "warning"  # reported, does not reject


class Code(StrEnum):
    # Dataset version as a whole
    MANIFEST_MISSING = "MANIFEST_MISSING"
    MANIFEST_KEY_MISSING = "MANIFEST_KEY_MISSING"
    MANIFEST_KEY_UNKNOWN = "MANIFEST_KEY_UNKNOWN"
    MANIFEST_VALUE_INVALID = "MANIFEST_VALUE_INVALID"
    MANIFEST_PATH_MISSING = "MANIFEST_PATH_MISSING"
    MANIFEST_PREFIX_MISMATCH = "MANIFEST_PREFIX_MISMATCH"
    # Manifest settings laxer than the stack allows (each names the limit it breaks)
    GATE_MIN_MAP_BELOW_STACK = "GATE_MIN_MAP_BELOW_STACK"
    GATE_MAX_REGRESSION_ABOVE_STACK = "GATE_MAX_REGRESSION_ABOVE_STACK"
    GATE_MAX_CLASS_REGRESSION_ABOVE_STACK = "GATE_MAX_CLASS_REGRESSION_ABOVE_STACK"
    GATE_MIN_CLASS_INSTANCES_ABOVE_STACK = "GATE_MIN_CLASS_INSTANCES_ABOVE_STACK"
    GATE_CONFIDENCE_BELOW_STACK = "GATE_CONFIDENCE_BELOW_STACK"
    GATE_RESAMPLES_BELOW_STACK = "GATE_RESAMPLES_BELOW_STACK"
    TRAINING_MAX_ITER_ABOVE_STACK = "TRAINING_MAX_ITER_ABOVE_STACK"
    TRAINING_IMS_PER_BATCH_ABOVE_STACK = "TRAINING_IMS_PER_BATCH_ABOVE_STACK"
    # Files
    FILE_UNREADABLE = "FILE_UNREADABLE"
    JSON_MALFORMED = "JSON_MALFORMED"
    JSON_TOO_DEEP = "JSON_TOO_DEEP"
    LINK_OUTSIDE_DATASET = "LINK_OUTSIDE_DATASET"
    CHECK_FAILED = "CHECK_FAILED"
    # COCO structure
    KEY_MISSING = "KEY_MISSING"
    WRONG_TYPE = "WRONG_TYPE"
    NUMBER_OUT_OF_RANGE = "NUMBER_OUT_OF_RANGE"
    DUPLICATE_IMAGE_ID = "DUPLICATE_IMAGE_ID"
    DUPLICATE_ANNOTATION_ID = "DUPLICATE_ANNOTATION_ID"
    DUPLICATE_CATEGORY_ID = "DUPLICATE_CATEGORY_ID"
    DUPLICATE_CATEGORY_NAME = "DUPLICATE_CATEGORY_NAME"
    IMAGE_DIMENSIONS_INVALID = "IMAGE_DIMENSIONS_INVALID"
    FILE_NAME_UNSAFE = "FILE_NAME_UNSAFE"
    ANNOTATION_IMAGE_UNKNOWN = "ANNOTATION_IMAGE_UNKNOWN"
    ANNOTATION_CATEGORY_UNKNOWN = "ANNOTATION_CATEGORY_UNKNOWN"
    BBOX_MALFORMED = "BBOX_MALFORMED"
    BBOX_NOT_FINITE = "BBOX_NOT_FINITE"
    BBOX_NON_POSITIVE_SIZE = "BBOX_NON_POSITIVE_SIZE"
    BBOX_OUTSIDE_IMAGE = "BBOX_OUTSIDE_IMAGE"
    AREA_NEGATIVE = "AREA_NEGATIVE"
    AREA_INCONSISTENT = "AREA_INCONSISTENT"
    ISCROWD_INVALID = "ISCROWD_INVALID"
    SEGMENTATION_MALFORMED = "SEGMENTATION_MALFORMED"
    SEGMENTATION_MISSING = "SEGMENTATION_MISSING"
    POLYGON_MALFORMED = "POLYGON_MALFORMED"
    RLE_SIZE_MISMATCH = "RLE_SIZE_MISMATCH"
    # Splits
    SPLIT_EMPTY = "SPLIT_EMPTY"
    CATEGORY_NOT_IN_TRAIN = "CATEGORY_NOT_IN_TRAIN"
    CATEGORY_MISMATCH = "CATEGORY_MISMATCH"
    # Image files
    IMAGE_MISSING = "IMAGE_MISSING"
    IMAGE_UNREADABLE = "IMAGE_UNREADABLE"
    IMAGE_SIZE_MISMATCH = "IMAGE_SIZE_MISMATCH"
    IMAGE_FORMAT_UNSUPPORTED = "IMAGE_FORMAT_UNSUPPORTED"
    IMAGE_TOO_LARGE = "IMAGE_TOO_LARGE"
    IMAGE_SHAPE_UNSUPPORTED = "IMAGE_SHAPE_UNSUPPORTED"
    OBJECT_CHANGED = "OBJECT_CHANGED"
    SPLIT_OVERLAP = "SPLIT_OVERLAP"
    # Warnings
    IMAGE_WITHOUT_ANNOTATIONS = "IMAGE_WITHOUT_ANNOTATIONS"
    CLASS_FEW_INSTANCES = "CLASS_FEW_INSTANCES"
    CLASS_IMBALANCE = "CLASS_IMBALANCE"
    CLASS_MISSING_IN_VAL = "CLASS_MISSING_IN_VAL"
    BOX_TINY = "BOX_TINY"
    DUPLICATE_FILE_NAME = "DUPLICATE_FILE_NAME"
    IMAGE_EXTENSION_MISMATCH = "IMAGE_EXTENSION_MISMATCH"


WARNINGS: frozenset[Code] = frozenset({
    Code.IMAGE_WITHOUT_ANNOTATIONS, Code.CLASS_FEW_INSTANCES, Code.CLASS_IMBALANCE, Code.CLASS_MISSING_IN_VAL,
    Code.BOX_TINY, Code.DUPLICATE_FILE_NAME, Code.IMAGE_EXTENSION_MISMATCH,
})

# What each code means, for docs/dataset-format.md and `d2ops validate` output.
MEANINGS: dict[Code, str] = {
    Code.MANIFEST_MISSING: "manifest.json is not in the dataset version (it is uploaded last; no manifest, no dataset)",
    Code.MANIFEST_KEY_MISSING: "a required manifest key (name, version, format, train) is absent",
    Code.MANIFEST_KEY_UNKNOWN: "the manifest has a key the schema does not define (typos are caught here)",
    Code.MANIFEST_VALUE_INVALID: "a manifest value has the wrong type, is out of bounds or is not a safe relative path",
    Code.MANIFEST_PATH_MISSING: "a file or directory the manifest names (train, val, images) was not uploaded",
    Code.MANIFEST_PREFIX_MISMATCH: "the manifest's name/version differ from the datasets/<name>/<version>/ prefix",
    Code.GATE_MIN_MAP_BELOW_STACK: "gate.min_map is below the stack's MinMap (a manifest may only raise it)",
    Code.GATE_MAX_REGRESSION_ABOVE_STACK: ("gate.max_regression is above the stack's MaxRegression (a manifest may "
                                           "only lower it)"),
    Code.GATE_MAX_CLASS_REGRESSION_ABOVE_STACK: ("gate.max_class_regression is above the stack's MaxClassRegression "
                                                 "(a manifest may only lower it)"),
    Code.GATE_MIN_CLASS_INSTANCES_ABOVE_STACK: ("gate.min_class_instances is above the stack's MinClassInstances "
                                                "(a manifest may only lower it: more classes judged)"),
    Code.GATE_CONFIDENCE_BELOW_STACK: ("gate.confidence is below the stack's GateConfidence (a manifest may only "
                                       "raise it: a wider interval, approved less readily)"),
    Code.GATE_RESAMPLES_BELOW_STACK: ("gate.resamples is below the stack's GateResamples (a manifest may only raise "
                                      "it, up to d2ops_core.gate.MAX_RESAMPLES)"),
    Code.TRAINING_MAX_ITER_ABOVE_STACK: "training.max_iter is above the stack's MaxTrainingIterations",
    Code.TRAINING_IMS_PER_BATCH_ABOVE_STACK: "training.ims_per_batch is above the stack's MaxImagesPerBatch",
    Code.FILE_UNREADABLE: "a file cannot be read (permissions, a dangling link, too large for the scratch disk)",
    Code.JSON_MALFORMED: "a file is not valid JSON (the message gives line and column)",
    Code.JSON_TOO_DEEP: ("arrays/objects nest deeper than 512 levels (COCO needs 6; Python's json, which training "
                         "reads the file with, fails near 1000 minus its caller's stack), even under a key the "
                         "validator does not read"),
    Code.LINK_OUTSIDE_DATASET: ("a file or directory of a local dataset is a symbolic link to somewhere outside the "
                                "dataset directory; it is not followed (S3 has no links)"),
    Code.CHECK_FAILED: ("a check of this file stopped on an unexpected problem (a validator bug, logged with its "
                        "trace); the file is rejected rather than passed unchecked"),
    Code.NUMBER_OUT_OF_RANGE: ("an integer (id, size, bbox, area) does not fit in 64 bits, a number is too long "
                               "to decode at all, or an integer anywhere in the file (even under a key the validator "
                               "does not read) has more digits than Python's json reads (4300)"),
    Code.KEY_MISSING: "a required COCO key is absent (top level, image, annotation or category)",
    Code.WRONG_TYPE: "a COCO value has the wrong JSON type (e.g. a string id)",
    Code.DUPLICATE_IMAGE_ID: "two images in one split share an id",
    Code.DUPLICATE_ANNOTATION_ID: "two annotations in one split share an id",
    Code.DUPLICATE_CATEGORY_ID: "two categories in one split share an id",
    Code.DUPLICATE_CATEGORY_NAME: ("two categories in one split share a name: per-class AP, the gate's per-class "
                                   "intervals and the score thresholds are keyed by class name"),
    Code.IMAGE_DIMENSIONS_INVALID: "an image's width or height is not a positive integer",
    Code.FILE_NAME_UNSAFE: ("an image file_name is empty, absolute, a URL (s3://, https://), contains `..`, `.`, "
                            "`//` or a backslash, or escapes images/"),
    Code.ANNOTATION_IMAGE_UNKNOWN: "an annotation's image_id is not an image of its split",
    Code.ANNOTATION_CATEGORY_UNKNOWN: "an annotation's category_id is not a category of its split",
    Code.BBOX_MALFORMED: "a bbox is not a list of four numbers [x, y, width, height]",
    Code.BBOX_NOT_FINITE: "a bbox value is NaN or infinite",
    Code.BBOX_NON_POSITIVE_SIZE: "a bbox width or height is zero or negative",
    Code.BBOX_OUTSIDE_IMAGE: "a bbox extends outside its image by more than the tolerance (1 px)",
    Code.AREA_NEGATIVE: "an annotation's area is negative",
    Code.AREA_INCONSISTENT: "an annotation's area is not finite or exceeds its bbox area (beyond 1% + 1 px²)",
    Code.ISCROWD_INVALID: "iscrowd is not 0 or 1",
    Code.SEGMENTATION_MALFORMED: "a segmentation is neither a list of polygons nor an RLE object",
    Code.SEGMENTATION_MISSING: "task instance_segmentation, but an annotation has no segmentation",
    Code.POLYGON_MALFORMED: "a polygon has an odd number of coordinates or fewer than 3 points",
    Code.RLE_SIZE_MISMATCH: "an RLE's size is not [height, width] of its image, or its counts do not cover it",
    Code.SPLIT_EMPTY: "a split has no images or no annotations",
    Code.CATEGORY_NOT_IN_TRAIN: "a category has instances in val but none in train",
    Code.CATEGORY_MISMATCH: "a val category id is not a train category or has a different name there",
    Code.IMAGE_MISSING: "an image's file_name is not under images/",
    Code.IMAGE_UNREADABLE: "an image file is empty or cannot be decoded",
    Code.IMAGE_SIZE_MISMATCH: "an image's real size (after EXIF rotation) differs from its width/height",
    Code.IMAGE_FORMAT_UNSUPPORTED: "an image file is not a JPEG (MPO included) or PNG, whatever its name says",
    Code.IMAGE_TOO_LARGE: ("an image has more pixels than the stack's limit (MaxImagePixels, env MAX_IMAGE_PIXELS, "
                           "d2ops_core.images.max_pixels()), in its file or in the annotations' width x height"),
    Code.IMAGE_SHAPE_UNSUPPORTED: ("an image's longer side is more than 20 times its shorter side "
                                   "(d2ops_core.images.MAX_ASPECT_RATIO): the detectors would shrink it to nothing"),
    Code.IMAGE_WITHOUT_ANNOTATIONS: "an image has no annotations (fine for negatives, often a labelling gap)",
    Code.CLASS_FEW_INSTANCES: "a category has fewer train instances than the threshold (10)",
    Code.CLASS_IMBALANCE: "the most frequent train category outnumbers the rarest by more than the ratio (100)",
    Code.CLASS_MISSING_IN_VAL: "a category with train instances has none in val, so its AP cannot be measured",
    Code.BOX_TINY: "a bbox is narrower or shorter than the threshold (4 px)",
    Code.DUPLICATE_FILE_NAME: ("two images in one split share a file_name, or their names differ only in letter "
                               "case or Unicode normalization (one file on macOS and Windows file systems)"),
    Code.SPLIT_OVERLAP: ("a val image has the same content (SHA-256 of its bytes) as a train image, under the same "
                         "or another name: evaluation would be optimistic and the gate misled"),
    Code.OBJECT_CHANGED: ("an object of the dataset version changed or was deleted after validation listed it (its "
                          "listed VersionId is gone or its ETag no longer matches); the run never reads it"),
    Code.IMAGE_EXTENSION_MISMATCH: ("an image's extension does not match its content (a JPEG named .png) or is not "
                                    ".jpg/.jpeg/.png; every reader goes by content, so it is read correctly"),
}


def severity(code: Code) -> Severity:
    return Severity.WARNING if code in WARNINGS else Severity.ERROR
