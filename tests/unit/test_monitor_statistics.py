"""monitor_endpoint.statistics on streams whose truth is known (issue 32's "Measured by"): a class that
disappears and images twice as dark are flagged by the statistics that describe them; an unshifted stream
raises no alarm in 20 windows. Synthetic features (tests/fixtures/monitoring_synthetic.py): fast, seeded."""

from __future__ import annotations

import pytest

from d2ops_core.documents.monitoring import CLASS_RATE_PREFIX, DISTRIBUTIONS, LOW_CONFIDENCE, MonitoringBaseline
from d2ops_core.monitoring_features import build_baseline, sample_features
from tests.fixtures.monitoring_synthetic import CLASSES, THRESHOLDS, stream
from tests.fixtures.pipeline import support

support.function_path("monitor_endpoint")
from monitor_endpoint.statistics import Thresholds, judge, psi  # noqa: E402

WINDOW = 200  # records in a window: an hour of a quiet endpoint at 10% capture


@pytest.fixture(scope="module")
def baseline() -> MonitoringBaseline:
    return build_baseline(stream(2000, seed=1), run_id="r1", class_names=CLASSES, score_thresholds=THRESHOLDS)


def drifted(baseline: MonitoringBaseline, **shift: object) -> set[str]:
    verdict, statistics = judge(baseline, sample_features(stream(WINDOW, seed=77, **shift), CLASSES), Thresholds())
    assert (verdict == "drifted") == any(s.drifted for s in statistics)
    return {s.statistic for s in statistics if s.drifted}


@pytest.mark.parametrize("gone", ["person", "bicycle"])  # a common class (1 a picture) and a rare one (0.4)
def test_a_class_disappearing_is_flagged_by_its_class_rate_and_not_by_brightness(baseline: MonitoringBaseline,
                                                                                   gone: str) -> None:
    # Mutation caught: PSI bins cut so that all-zero counts share a bin with ones, or class rates not compared.
    moved = drifted(baseline, drop_class=gone)
    assert f"{CLASS_RATE_PREFIX}{gone}" in moved
    others = {f"{CLASS_RATE_PREFIX}{name}" for name in CLASSES if name != gone}
    assert not moved & {"brightness", "image_width", "image_height", *others}


def test_images_twice_as_dark_are_flagged_by_brightness_only(baseline: MonitoringBaseline) -> None:
    # Mutation caught: brightness missing from the compared distributions, or the KS threshold ignored.
    assert drifted(baseline, darken=0.5) == {"brightness"}


def test_an_unshifted_stream_raises_no_alarm_in_20_windows(baseline: MonitoringBaseline) -> None:
    # Mutation caught: the significance guard dropped (KS D or PSI noise alone would alarm), or PSI computed
    # with unsmoothed proportions (an empty bin alone passes the threshold).
    verdicts = [judge(baseline, sample_features(stream(WINDOW, seed=1000 + i), CLASSES), Thresholds())
                for i in range(20)]
    assert [v for v, _ in verdicts] == ["ok"] * 20
    names = {s.statistic for s in verdicts[0][1]}
    assert names == {*DISTRIBUTIONS, LOW_CONFIDENCE, *(CLASS_RATE_PREFIX + c for c in CLASSES)}


def test_a_small_window_and_a_missing_baseline_are_not_judged(baseline: MonitoringBaseline) -> None:
    # Mutation caught: MonitorMinRecords not applied (statistics of 5 records would be noise).
    few = sample_features(stream(5, seed=2, darken=0.5), CLASSES)
    assert judge(baseline, few, Thresholds(min_records=20)) == ("too_few_records", [])
    assert judge(None, few, Thresholds()) == ("no_baseline", [])
    assert judge(baseline, few, Thresholds(min_records=5))[0] == "drifted"


def test_psi_is_zero_for_the_same_sample_and_grows_with_the_shift() -> None:
    base = [0.0] * 50 + [1.0] * 30 + [2.0] * 20
    assert psi(base, base)[0] == pytest.approx(0.0, abs=1e-12)
    small, large = psi(base, [0.0] * 60 + [1.0] * 25 + [2.0] * 15)[0], psi(base, [0.0] * 100)[0]
    assert 0 < small < 0.1 < 0.25 < large
