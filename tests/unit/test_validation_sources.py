"""Which S3 failures reject one file and which make the whole dataset unreadable."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from d2ops_core.validation import DatasetUnreadable
from d2ops_core.validation.errors import SourceFileError
from d2ops_core.validation.sources import s3_read_error


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "..."}}, "GetObject")


@pytest.mark.parametrize("code", ["AccessDenied", "NoSuchBucket", "ExpiredToken", "KMS.AccessDeniedException"])
def test_permission_and_bucket_errors_make_the_dataset_unreadable(code: str) -> None:
    err = s3_read_error(client_error(code), "s3://b/datasets/x/v1/manifest.json")
    assert isinstance(err, DatasetUnreadable) and code in str(err)


@pytest.mark.parametrize("code", ["NoSuchKey", "InternalError", "SlowDown"])
def test_other_errors_concern_one_file(code: str) -> None:
    err = s3_read_error(client_error(code), "s3://b/datasets/x/v1/annotations/train.json")
    assert isinstance(err, SourceFileError) and "annotations/train.json" in str(err)
