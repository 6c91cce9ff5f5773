"""Which dataset version a run or a model is about: the run's upload (:class:`DatasetRef`, the execution
input's ``dataset``) and the version a model was trained on (:class:`DatasetVersion`, in its metadata)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DatasetRef(BaseModel):
    """The ``dataset`` part of the state machine input (docs/interfaces.md, Run identity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str
    prefix: str = Field(description="datasets/<name>/<version>/")
    name: str
    version: str
    manifest_key: str
    manifest_version: str = Field(description="the manifest object's version id, or its ETag when unversioned")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


class DatasetVersion(BaseModel):
    """The dataset version a model was trained on: ``dataset`` in the model artifact's
    ``metadata.json`` (docs/interfaces.md, Model artifact metadata).

    The trainers' export writes it (``model_code.training``), ``model_code.artifact`` reads it
    back. The same version as :class:`DatasetRef` names it, without the run's S3 upload
    details, which a training job does not see (it gets the name and version as hyperparameters).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    uri: str | None = Field(default=None, description="s3://<bucket>/datasets/<name>/<version>/, where the writer "
                                                      "knows it")
    inventory_digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$",
                                         description="the run's validated inventory (runs/<run_id>/inventory.jsonl) "
                                                     "the job read its snapshot by; None outside the pipeline")
