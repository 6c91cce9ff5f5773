"""The per-class thresholds in the Model Registry entry: a CustomerMetadataProperties value SageMaker accepts.

The constraint is read from botocore's model of CreateModelPackage (CustomerMetadataMap, CustomerMetadataKey,
CustomerMetadataValue), not restated; the platform table must agree with it.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import botocore.session
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d2ops_core import platform
from d2ops_core.pipeline_stages import all_states
from d2ops_core.score_thresholds import FULL_MAP_AT, REGISTRY_KEY, REGISTRY_NONE, registry_value, registry_word

_INPUT = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateModelPackage").input_shape
assert _INPUT is not None
MAP = _INPUT.members["CustomerMetadataProperties"]
KEY, VALUE = MAP.key, MAP.value  # type: ignore[attr-defined]
# botocore writes the pattern in Java's syntax, ([\p{L}\p{Z}\p{N}_.:\/=+\-@]*)${1,256}: read its parts.
_CLASS = re.fullmatch(r"\(\[((?:\\p\{[A-Z]\})+)(.*)\]\*\)\$\{1,(\d+)\}", VALUE.metadata["pattern"])
assert _CLASS, f"CustomerMetadataValue's pattern changed shape: {VALUE.metadata['pattern']!r}"
PATTERN_MAX = int(_CLASS[3])
CATEGORIES = frozenset(re.findall(r"\\p\{([A-Z])\}", _CLASS[1]))
SYMBOLS = frozenset(_CLASS[2].replace("\\", ""))


def problems(value: str) -> list[str]:
    """What SageMaker would refuse in a CustomerMetadataProperties value."""
    found = []
    units = len(value.encode("utf-16-le", "surrogatepass")) // 2
    if not 1 <= max(len(value), units) <= VALUE.metadata["max"]:
        found.append(f"{len(value)} characters ({units} UTF-16 units), not 1-{VALUE.metadata['max']}")
    bad = sorted({c for c in value if unicodedata.category(c)[0] not in CATEGORIES and c not in SYMBOLS})
    if bad:
        found.append(f"characters outside the pattern: {[hex(ord(c)) for c in bad][:5]}")
    return found


def test_the_platform_table_states_botocore_s_constraint() -> None:
    # Catches a table that drifted from the API model (e.g. a 1,024 value limit, or ',' allowed).
    assert platform.CUSTOMER_METADATA_MAX_ENTRIES == MAP.metadata["max"] == 50
    assert platform.CUSTOMER_METADATA_KEY_MAX == KEY.metadata["max"] == 128
    assert platform.CUSTOMER_METADATA_VALUE_MAX == VALUE.metadata["max"] == PATTERN_MAX == 256
    assert platform.CUSTOMER_METADATA_CATEGORIES == CATEGORIES == set("LZN")
    assert platform.CUSTOMER_METADATA_SYMBOLS == SYMBOLS == set("_.:/=+-@")
    assert problems(REGISTRY_KEY) == [] and len(REGISTRY_KEY) <= KEY.metadata["max"]


def test_known_answers() -> None:
    assert registry_value({}) == REGISTRY_NONE
    assert registry_value({"circle": 0.41234, "traffic light": 0.5, "a=b": 0.123456, "person's": 1.0}) == \
        "circle=0.4123 traffic_light=0.5 a_b=0.1235 person_s=1"
    # Cut at a word, and the rest counted (catches a cut inside a word or a silent drop).
    value = registry_value({f"class{i:02d}": 0.5 for i in range(40)}, limit=60)
    assert value == "class00=0.5 class01=0.5 +38 more in metadata.json"  # a third word would make it 61


NAMES = st.lists(st.text(st.characters(codec=None), max_size=60), min_size=1, max_size=80, unique=True)


@settings(max_examples=200, deadline=None)
@given(names=NAMES, scores=st.lists(st.floats(0, 1), min_size=80, max_size=80))
def test_any_class_names_give_a_value_sagemaker_accepts(names: list[str], scores: list[float]) -> None:
    # Catches a value over 256 characters (or UTF-16 units), a forbidden character (quotes, commas, control
    # characters, emoji), words that do not read back, and a wrong count of the classes left out.
    thresholds = dict(zip(names, scores, strict=False))
    value = registry_value(thresholds)
    assert problems(value) == [], (value, problems(value))
    words = value.split(" ")
    more = re.fullmatch(rf"\+(\d+) more in {re.escape(FULL_MAP_AT)}", " ".join(words[-4:]))
    listed = words[:-4] if more else words
    assert len(listed) + (int(more[1]) if more else 0) == len(thresholds)
    for word, (name, score) in zip(listed, thresholds.items(), strict=False):
        assert word.rsplit("=", 1) == [registry_word(name), f"{round(score, 4):g}"]


@pytest.mark.parametrize("name", ["", " ", "\u00e9t\u00e9", "\U0002070e", "a\u2028b"])
def test_words_never_split(name: str) -> None:
    word = registry_word(name)
    assert word and " " not in word and "=" not in word and problems(word) == []


# ----------------------------------------------------------------------------------- the pipeline's wiring

def test_register_model_version_carries_the_summarized_value() -> None:
    # The ASL's registry entry takes the summarize Lambda's bounded value (catches the map passed whole,
    # which is no string, or the key dropped); its properties stay within CustomerMetadataMap's limits.
    import json

    from tests.fixtures.pipeline import support

    register = all_states(json.loads(support.DEFINITION.read_text()))["Register model version"]
    properties = register["Parameters"]["CustomerMetadataProperties"]
    assert properties[REGISTRY_KEY + ".$"] == "$.evaluation.score_thresholds"
    assert len(properties) <= platform.CUSTOMER_METADATA_MAX_ENTRIES
    assert all(problems(key.removesuffix(".$")) == [] and len(key) <= KEY.metadata["max"] for key in properties)


def _summary(thresholds: dict[str, float] | None) -> dict[str, object]:
    from d2ops_core.documents.evaluation import EvaluationReport
    from tests.fixtures.pipeline import support

    support.function_path("summarize_evaluation")
    from summarize_evaluation import service
    from summarize_evaluation.models import SummarizeEvent

    document: dict[str, object] = {"primary_metric": "bbox_AP", "val_images": 40, "class_instances": {"disc": 9},
                                   "challenger": {"metrics": {"bbox_AP": 0.6}}}
    if thresholds is not None:
        document["challenger_score_thresholds"] = thresholds
    event = SummarizeEvent.model_validate({
        "report_uri": "s3://b/evaluation.json", "dataset": {"name": "shapes", "version": "v1"},
        "gate": {"primary_metric": "bbox_AP", "min_map": 0.3, "max_regression": 0.01}})
    return service.summarize(EvaluationReport.model_validate(document), event).model_dump(mode="json")


def test_summarize_gives_the_registry_value_of_the_challenger_s_thresholds() -> None:
    # Catches the Lambda passing the raw map, or reading another model's: and a report from before the field
    # (no thresholds) still summarizes, to a value SageMaker accepts.
    many = {f"class {i}": i / 100 for i in range(60)}
    assert _summary({"disc": 0.41234, "square": 0.5})["score_thresholds"] == "disc=0.4123 square=0.5"
    assert _summary(many)["score_thresholds"] == registry_value(many)
    assert str(_summary(many)["score_thresholds"]).endswith("more in metadata.json")
    assert _summary(None)["score_thresholds"] == REGISTRY_NONE


def test_the_evaluation_job_copies_the_challenger_s_thresholds_into_its_report(tmp_path: Path) -> None:
    # The real job on the serving tests' exported detector (metadata with thresholds) and a synthetic val
    # split. Catches a job that drops them, or takes the champion's.
    import json

    from d2ops import synth
    from model_code.evaluation import job
    from tests.fixtures.serving.thresholds import artifact_with_thresholds

    thresholds = {"square": 0.25, "disc": 0.4125, "triangle": 0.5}
    inputs = tmp_path / "processing" / "input"
    inputs.mkdir(parents=True)
    artifact_with_thresholds(tmp_path, thresholds).rename(inputs / "challenger")
    synth.generate(inputs / "dataset", images=8, size=64, seed=2)
    for split in ("train", "val"):  # the serving detector's category ids: 1, 2, 7
        path = inputs / "dataset" / "annotations" / f"{split}.json"
        doc = json.loads(path.read_text())
        remap = {1: 1, 2: 2, 3: 7}
        for item in (*doc["categories"], *doc["annotations"]):
            key = "id" if "supercategory" in item else "category_id"
            item[key] = remap[item[key]]
        path.write_text(json.dumps(doc))
    report = job.evaluate(tmp_path, sample_images=1)
    assert report["challenger_score_thresholds"] == thresholds
