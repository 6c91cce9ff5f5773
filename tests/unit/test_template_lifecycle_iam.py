"""Issue 31, item 4: the versioned buckets shed their expired delete markers, and the state machine may read the
model packages it deploys from (CreateModel with a ModelPackageName)."""

from __future__ import annotations

import pytest

from d2ops.template import load_template
from tests.unit.test_template_hygiene import BUCKETS, _resolved_statements, allows, as_list, props

STATE_MACHINE = "PipelineStateMachine"


@pytest.mark.parametrize("bucket", BUCKETS)
def test_each_versioned_bucket_removes_expired_delete_markers(bucket: str) -> None:
    """Current versions expire into delete markers and the noncurrent-version rule deletes the bytes, which leaves
    each marker alone for ever unless a rule removes it. S3 refuses ExpiredObjectDeleteMarker beside Days or Date,
    and a marker carries no tags, so the rule stands alone and covers the whole bucket.
    Mutations caught: the rule dropped, disabled, merged into a rule with ExpirationInDays, narrowed to a tag or
    prefix (the snapshot's markers would stay)."""
    rules = props(bucket)["LifecycleConfiguration"]["Rules"]
    assert any("NoncurrentVersionExpiration" in r for r in rules)  # what turns markers into expired ones
    markers = [r for r in rules if r.get("ExpiredObjectDeleteMarker") is True]
    assert len(markers) == 1, f"{bucket}: no (or more than one) ExpiredObjectDeleteMarker rule"
    (rule,) = markers
    assert rule["Status"] == "Enabled"
    forbidden = {"ExpirationInDays", "ExpirationDate", "TagFilters", "Prefix", "ObjectSizeGreaterThan",
                 "ObjectSizeLessThan"}
    assert not forbidden & set(rule), f"{bucket}: {sorted(forbidden & set(rule))} beside ExpiredObjectDeleteMarker"


def test_the_snapshot_retention_is_documented_with_its_noncurrent_days() -> None:
    """docs/operations.md says how long a snapshot's bytes really stay: the tag rule's days, then the noncurrent
    days of the artifacts bucket. Mutation caught: either number changed in the template and not in the docs."""
    from d2ops.template import REPO_ROOT

    rules = {r["Id"]: r for r in props("ArtifactsBucket")["LifecycleConfiguration"]["Rules"]}
    noncurrent = rules["expire-replaced-versions"]["NoncurrentVersionExpiration"]["NoncurrentDays"]
    default = load_template().document["Parameters"]["SnapshotRetentionDays"]["Default"]
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    assert f"SnapshotRetentionDays` (default {default})" in text
    assert f"{noncurrent} days later" in text
    data_days = props("DataBucket")["LifecycleConfiguration"]["Rules"][0]["NoncurrentVersionExpiration"]
    assert f"after {data_days['NoncurrentDays']} days" in text


def _package_patterns() -> list[str]:
    """The model-package ARNs the state machine may CreateModel from (DeployModels)."""
    return [resource for st in _resolved_statements(STATE_MACHINE) if st["Effect"] == "Allow"
            and "sagemaker:CreateModel" in as_list(st["Action"])
            for resource in as_list(st["Resource"]) if ":model-package/" in resource]


def test_the_state_machine_may_read_the_packages_it_deploys() -> None:
    """CreateModel with PrimaryContainer.ModelPackageName resolves the package's image and artifact, a read of the
    package. Mutations caught: sagemaker:DescribeModelPackage dropped from the role, or granted on every package
    of the account (another stack's group)."""
    (pattern,) = _package_patterns()
    package = pattern.replace("*", "7")
    assert allows(STATE_MACHINE, "sagemaker:DescribeModelPackage", package)
    group = package.rsplit("/", 2)[1]
    assert not allows(STATE_MACHINE, "sagemaker:DescribeModelPackage", package.replace(group, "another-group"))
