"""make bench-validate-scale's core at a tiny size: both paths, the same findings, and its model."""

from __future__ import annotations

import pytest

from d2ops.bench import validate_scale as bench


def test_the_map_and_the_single_lambda_find_the_same_on_the_same_version() -> None:
    """One truncated JPEG among 120 images: the single Lambda and the pipeline's Check images Map (run on
    the interpreter with the real batch and summarize code) reject the version with the same findings.

    Catches: a bench that measures a Map which does not check the images (a skipped batch, a merge that
    drops issues), or a path that is not the one that ships (the state read from the definition).
    """
    with bench.offline_s3() as s3:
        bench.upload_version(s3, 120, corrupt=1)
        single, _ = bench.run_single(s3, 120)
        mapped, _, batches = bench.run_map(s3, 4)
    assert len(batches) == 3  # 120 images, 50 a batch
    assert not single.valid and not mapped.valid
    assert single.error_codes == mapped.error_codes == {"IMAGE_UNREADABLE": 1}
    assert [(e.code, e.location) for e in single.first_errors] == [(e.code, e.location) for e in mapped.first_errors]
    assert single.image_count == mapped.image_count == 120


def test_the_cloud_model_scales_with_batches_and_concurrency() -> None:
    model = bench.extrapolate(batch_seconds=2.0, single_images_per_s=100.0, concurrency=10, images=1000)
    # 20 batches, 10 at a time: 2 waves of (2 s + the child start charge)
    assert model["map_seconds"] == pytest.approx(2 * (2.0 + bench.CHILD_START_SECONDS))
    assert model["single_seconds"] == pytest.approx(10.0)
    assert model["single_max_images"] == pytest.approx(100.0 * bench.LAMBDA_SECONDS)


def test_the_bench_refuses_a_version_smaller_than_a_batch() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--images", "10"])
