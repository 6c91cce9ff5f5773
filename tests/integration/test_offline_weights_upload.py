"""`d2ops weights upload` against the offline stack when no runtime holds the work directory: it starts
one for the upload, and the file is in the local S3 the next runtime restores."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from d2ops import cli
from d2ops.offline.runtime import OfflineRuntime

pytestmark = pytest.mark.integration


def test_an_offline_upload_outlives_the_runtime_it_started(tmp_path: Path) -> None:
    weights = tmp_path / "model_final.pkl"
    weights.write_bytes(pickle.dumps({"model": {"w": np.ones((2, 2), np.float32)}, "__author__": "tests"}))
    work = tmp_path / "work"
    assert cli.main(["weights", "upload", str(weights), "--work-dir", str(work)]) == 0
    with OfflineRuntime(work) as rt:
        key = rt.stack.parameters["PretrainedWeightsKey"]
        stored = rt.client("s3").get_object(Bucket=rt.stack.data_bucket, Key=key)
        assert stored["Body"].read() == weights.read_bytes()
