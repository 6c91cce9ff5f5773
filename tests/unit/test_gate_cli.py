"""``d2ops gate``: two COCO results files judged on one val file as the pipeline's gate judges them.

The cases have a known truth (tests/fixtures/gate_files.py): a challenger built worse is never approved, an
equal one on enough images is, a rare class wiped out is never waved through. Bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from d2ops.cli import main
from d2ops_core import gate as gate_defaults
from tests.fixtures.gate_files import World, write_case
from tests.fixtures.pipeline import support

EQUAL = [1.0, 1.0, 1.0]


def gate(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, dict[str, Any]]:
    code = main(["gate", *map(str, args), "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1])


def case(tmp_path: Path, name: str, world: World, challenger: list[float], seed: int) -> list[str | Path]:
    val, champion, ours = write_case(tmp_path / f"{name}-{seed}", world, EQUAL, challenger, seed)
    return ["--annotations", val, "--champion", champion, "--challenger", ours, "--seed", str(seed)]


def test_a_clearly_worse_challenger_on_40_images_is_never_approved(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """About 5 points worse on every class, 40 val images (the demo's shape). Mutations: the old rule (refuse
    only when the upper end is below the tolerance) approved this most of the time; deciding on the point."""
    decisions = []
    for seed in range(6):
        code, answer = gate(capsys, *case(tmp_path, "worse", World(images=40), [0.6, 0.6, 0.6], seed))
        assert answer["difference"] < 0 and code == {"refuse": 1, "review": 3}[answer["decision"]]
        decisions.append(answer["decision"])
    assert "approve" not in decisions


def test_an_equal_challenger_on_200_images_is_approved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutations: approval asking for a challenger surely better (low >= 0), or the tolerance added not
    subtracted. In this world an equal model's interval is about +-0.015 wide at 200 images."""
    approved = 0
    for seed in range(4):
        code, answer = gate(capsys, *case(tmp_path, "equal", World(images=200), EQUAL, seed))
        approved += code == 0
        assert answer["decision"] != "refuse" and answer["images_compared"] == 200
        low, high = answer["interval"]
        assert low <= answer["difference"] <= high and high - low < 0.06
    assert approved >= 3


def test_a_rare_class_wiped_out_is_never_approved_and_is_named(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A class on 2 of 40 images falls to AP 0. Mutations: the resample's overall averaged over the classes
    present only (the class vanishes from ~e^-2 of resamples and the interval's top reached 0); only judged
    classes looked at."""
    world = World(images=40, rare={2: 2})
    for seed in range(3):
        code, answer = gate(capsys, *case(tmp_path, "rare", world, [1.0, 1.0, -8.0], seed),
                            "--max-regression", "0.3")  # a tolerance the overall drop stays within
        assert code in (1, 3) and answer["decision"] != "approve"
        rare = answer["classes"]["class2"]
        assert rare["challenger"] == 0.0 and rare["champion"] > 0.2 and rare["judged"] is False
        assert rare["dropped"] is True
        # Refused by the overall interval (the lost class weighs in every resample), or a person decides and is
        # told which class fell.
        assert answer["refused_by"] == "regressed" or (
            "class_dropped" in answer["review_because"] and "class2 0.000 vs" in answer["reason"])


def test_the_json_answer_names_the_decision_the_interval_and_the_classes(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, answer = gate(capsys, *case(tmp_path, "keys", World(images=60), EQUAL, 1), "--resamples", "300")
    assert {"decision", "interval", "difference", "classes", "reason", "images_compared", "review_because",
            "refused_by", "interval_mc_error", "verdict"} <= set(answer)
    assert answer["decision"] in ("approve", "refuse", "review") and len(answer["interval"]) == 2
    assert set(answer["classes"]) == {"class0", "class1", "class2"} and answer["resamples"] == 300
    # 60 images clear MinComparedImages (50); asking for 61 makes an approval a review.
    code, stricter = gate(capsys, *case(tmp_path, "keys", World(images=60), EQUAL, 1), "--resamples", "300",
                          "--min-compared-images", "61")
    assert stricter["decision"] in ("review", "refuse") and code in (1, 3)
    assert stricter["decision"] == "refuse" or "too_few_images" in stricter["review_because"]


def test_the_same_seed_gives_the_same_answer_and_another_seed_moves_the_ends_only_slightly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = case(tmp_path, "seed", World(images=120), [0.9, 0.9, 0.9], 3)[:-2]
    first, again = gate(capsys, *args, "--seed", "7")[1], gate(capsys, *args, "--seed", "7")[1]
    other = gate(capsys, *args, "--seed", "8")[1]
    assert first == again
    assert first["difference"] == other["difference"]  # the point estimate does not depend on the seed
    assert abs(first["interval"][0] - other["interval"][0]) < 6 * max(first["interval_mc_error"][0], 1e-3)


def test_without_a_champion_the_floor_alone_decides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    val, _, ours = write_case(tmp_path / "first", World(images=30), EQUAL, EQUAL, 0)
    code, answer = gate(capsys, "--annotations", val, "--challenger", ours, "--min-map", "0.2")
    assert (code, answer["decision"], answer["interval"]) == (0, "approve", None)
    code, answer = gate(capsys, "--annotations", val, "--challenger", ours, "--min-map", "0.99")
    assert (code, answer["decision"], answer["refused_by"]) == (1, "refuse", "below_min_map")
    assert set(answer["classes"]) == {"class0", "class1", "class2"}


def test_d2ops_gate_decides_exactly_as_the_pipeline_s_summarize_step(tmp_path: Path) -> None:
    """The same report through the summarize Lambda's service gives the same verdict. Mutation: a copy of the
    rule in the command that drifts from the pipeline's."""
    from d2ops.cli import build_parser
    from d2ops.commands.gate import judge_files

    support.function_path("summarize_evaluation")
    from summarize_evaluation.models import SummarizeEvent
    from summarize_evaluation.service import summarize

    args = build_parser().parse_args(["gate", *map(str, case(tmp_path, "same", World(images=80), [0.8, 1.0, 1.0],
                                                               2))])
    verdict, report = judge_files(args)
    event = SummarizeEvent.model_validate({
        "report_uri": "s3://b/runs/r/evaluation/evaluation.json", "dataset": {"name": "n", "version": "v"},
        "gate": {"primary_metric": "bbox_AP", "min_map": gate_defaults.DEFAULT_MIN_MAP,
                 "max_regression": gate_defaults.DEFAULT_MAX_REGRESSION,
                 "max_class_regression": gate_defaults.DEFAULT_MAX_CLASS_REGRESSION,
                 "min_class_instances": gate_defaults.DEFAULT_MIN_CLASS_INSTANCES,
                 "min_compared_images": gate_defaults.DEFAULT_MIN_COMPARED_IMAGES}})
    summary = summarize(report, event)
    assert summary.model_dump(include=set(type(verdict).model_fields)) == verdict.model_dump()


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: (d / "champion.json").unlink(), "champion.json: the champion's results file does not exist"),
    (lambda d: (d / "challenger.json").write_text("{not json"), "challenger.json: the challenger's results is not "
                                                                "a COCO detection results list: not valid JSON"),
    (lambda d: (d / "challenger.json").write_text("[" * 100_000), "not valid JSON"),
    (lambda d: (d / "challenger.json").write_text('{"image_id": 1}'), "the document: Input should be a valid array"),
    (lambda d: (d / "challenger.json").write_text(
        '[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.5},'
        ' {"image_id": 99999, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.5}]'),
     r"\[1\]\.image_id: image 99999 is not in the val annotations"),
    (lambda d: (d / "challenger.json").write_text(
        '[{"image_id": 1, "category_id": 7, "bbox": [0, 0, 5, 5], "score": 0.5}]'),
     r"\[0\]\.category_id: category 7 is not in the val annotations"),
    (lambda d: (d / "challenger.json").write_text(
        '[{"image_id": 1, "category_id": 1, "bbox": [0, 0, -5, 5], "score": 0.5}]'), r"\[0\]\.bbox: .*negative"),
    (lambda d: (d / "challenger.json").write_text(
        '[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5], "score": NaN}]'), r"\[0\]\.score"),
    (lambda d: (d / "challenger.json").write_text(
        '[{"image_id": "1", "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.5}]'), r"\[0\]\.image_id"),
    (lambda d: (d / "val.json").write_text('{"images": []}'), "val.json: not a COCO instances file"),
    (lambda d: (d / "val.json").write_text('{"images": [{"id": 1}], "categories": [], "annotations": []}'),
     "val.json: not a COCO instances file the gate can judge on at images"),
])
def test_bad_input_is_one_line_naming_the_file_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          change: Any, message: str) -> None:
    write_case(tmp_path, World(images=5), EQUAL, EQUAL, 0)
    change(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["gate", "--annotations", str(tmp_path / "val.json"), "--champion", str(tmp_path / "champion.json"),
              "--challenger", str(tmp_path / "challenger.json")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("d2ops gate: error: ") and len(err.strip().splitlines()) == 1, err
    import re

    assert re.search(message, err), err


@pytest.mark.parametrize("option", [["--max-regression", "2"], ["--confidence", "0.4"], ["--resamples", "5"],
                                    ["--seed", "-1"], ["--min-compared-images", "0"]])
def test_out_of_range_options_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               option: list[str]) -> None:
    val, champion, ours = write_case(tmp_path, World(images=5), EQUAL, EQUAL, 0)
    with pytest.raises(SystemExit) as exit_:
        main(["gate", "--annotations", str(val), "--champion", str(champion), "--challenger", str(ours), *option])
    assert exit_.value.code == 2 and option[0] in capsys.readouterr().err


def test_the_installed_command_exits_with_the_decision_s_code_and_prints_no_traceback(tmp_path: Path) -> None:
    """The console script, as a person runs it (no torch import: it answers in about a second)."""
    val, champion, ours = write_case(tmp_path, World(images=40), EQUAL, [0.5, 0.5, 0.5], 4)
    command = [sys.executable, "-m", "d2ops", "gate", "--annotations", str(val), "--champion", str(champion),
               "--challenger", str(ours)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode in (1, 3) and done.stdout.startswith("quality gate: ") and "Traceback" not in done.stderr
    broken = subprocess.run([*command[:-1], str(tmp_path / "missing.json")], capture_output=True, text=True,
                            timeout=120)
    assert broken.returncode == 2 and "missing.json" in broken.stderr and "Traceback" not in broken.stderr
    probe = subprocess.run([sys.executable, "-c", "import sys, d2ops.commands.gate as g; "
                            "import model_code.evaluation.comparison, model_code.evaluation.scoring; "
                            "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False"
